"""The environment every ``dapo`` command runs in: defaults set before any library is imported
(a value already in the environment wins). Telemetry and MLflow's download bars off; time for
an embedded Prefect server to start on a busy machine; a Prefect home of this project's own
(``.prefect/``: its flow runs, not every clone's in ``~/.prefect``); and CPU kernels pinned so
that every x86-64 machine with AVX2 and FMA computes the same bits (``tasks.determinism``).

Standard library only: the ``dapo`` entry point applies these before it looks for a warm process
(``flows.warm``), whose fingerprint includes them, so a command started by ``make`` and one typed
in a terminal see the same environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from tasks.determinism import kernel_pins, pin_kernels

ROOT = Path(__file__).resolve().parents[1]
DEFAULTS = {
    "PREFECT_HOME": str(ROOT / ".prefect"),
    "DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    # MLflow's artifact bars (tqdm) around a one-line answer (`dapo reproduce`): the command says
    # what it does itself
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DVC_NO_ANALYTICS": "1",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
}


def apply_defaults() -> None:
    for key, value in DEFAULTS.items():
        os.environ.setdefault(key, value)
    pin_kernels()


def with_defaults(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` as :func:`apply_defaults` would leave it (a value already there wins): what a
    command's environment will be, whether or not its process applied them yet."""
    return {**DEFAULTS, **kernel_pins(env), **env}
