"""The environment every ``dapo`` command runs in: defaults set before any library is imported
(a value already in the environment wins). Telemetry off, as the Makefile exports it; time for
an embedded Prefect server to start on a busy machine; a Prefect home of this project's own
(``.prefect/``: its flow runs, not every clone's in ``~/.prefect``); and CPU kernels pinned so
that every x86-64 machine with AVX2 computes the same bits (``tasks.determinism``).

Standard library only: the ``dapo`` entry point applies these before it looks for a warm process
(``flows.warm``), whose fingerprint includes them, so a command started by ``make`` and one typed
in a terminal see the same environment."""

from __future__ import annotations

import os
from pathlib import Path

from tasks.determinism import pin_kernels

ROOT = Path(__file__).resolve().parents[1]
DEFAULTS = {
    "PREFECT_HOME": str(ROOT / ".prefect"),
    "DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DVC_NO_ANALYTICS": "1",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
}


def apply_defaults() -> None:
    for key, value in DEFAULTS.items():
        os.environ.setdefault(key, value)
    pin_kernels()
