"""A local Prefect cluster for a sweep: a Prefect server, a process work pool and N workers.

``dapo ablate --workers N`` runs each (variant, seed) of the sweep as its own flow run of the
``ablate-run`` deployment; the workers started here pick them up, one at a time each, so N runs
train concurrently on this machine. The server keeps its database in the project's Prefect home
(``.prefect/``, as the embedded ephemeral server does), so the UI (``prefect server start``)
shows the sweep's flow runs afterwards. Everything started here runs in its own process group
and is stopped when the sweep ends, however it ends.

To spread a sweep over several machines instead, run a Prefect server they can all reach, start
``prefect worker start --pool <pool>`` on each (a GPU node, say) and pass ``--pool <pool>``: the
sweep then submits to that pool and starts nothing itself.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dapo_core.errors import PipelineError
from tasks.tracking.store import stop_group

log = logging.getLogger(__name__)

LOCAL_POOL = "dapo-local"
SERVER_START_TIMEOUT_S = 120.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prefect_cli() -> list[str]:
    """The ``prefect`` command of this interpreter (works inside a virtualenv not on PATH)."""
    return [sys.executable, "-m", "prefect"]


@contextmanager
def local_cluster(workers: int, log_dir: Path, pool: str = LOCAL_POOL) -> Iterator[str]:
    """Start a Prefect server and ``workers`` process workers on ``pool``; yield the API URL,
    with this process's Prefect settings pointing at it. Logs go to ``log_dir``."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    log_dir.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{free_port()}/api"
    # Workers poll every 2 s rather than Prefect's 10: a sweep's runs start without a lull.
    env = {**os.environ, "PREFECT_API_URL": url, "PREFECT_WORKER_QUERY_SECONDS": "2"}
    with ExitStack() as stack:
        server = _start(
            [
                *prefect_cli(),
                "server",
                "start",
                "--host",
                "127.0.0.1",
                "--port",
                url.rsplit(":", 1)[1].removesuffix("/api"),
            ],
            {k: v for k, v in env.items() if k != "PREFECT_API_URL"},
            log_dir / "prefect-server.log",
            stack,
        )
        wait_until_healthy(url, server, log_dir / "prefect-server.log")
        stack.enter_context(temporary_settings(updates={PREFECT_API_URL: url}))
        ensure_process_pool(pool)
        started = datetime.now(timezone.utc)
        for i in range(workers):
            _start(
                [
                    *prefect_cli(),
                    "worker",
                    "start",
                    "--pool",
                    pool,
                    "--type",
                    "process",
                    "--limit",
                    "1",
                    "--name",
                    f"dapo-worker-{i}",
                ],
                env,
                log_dir / f"worker-{i}.log",
                stack,
            )
        wait_for_workers(pool, workers, started, log_dir)  # so runs spread over all of them
        stack.callback(flush_to_server)  # first on the way out, while the server still runs
        yield url


def flush_to_server() -> None:
    """Send this process's queued Prefect logs and events now. At exit Prefect would send them
    to the server this module has stopped by then, retrying for over a minute before printing
    "Error logging to API"."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for service in (APILogWorker, EventsWorker):
        try:
            service.drain_all(timeout=10)
        except Exception as e:  # never hide the sweep's own outcome behind a logging failure
            log.warning("could not flush Prefect %s before stopping the server: %s", service, e)


def _start(cmd: list[str], env: dict[str, str], log: Path, stack: ExitStack) -> subprocess.Popen:
    out = stack.enter_context(log.open("ab"))
    proc = subprocess.Popen(
        cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )
    stack.callback(stop_group, proc)
    return proc


def wait_until_healthy(url: str, server: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise PipelineError(f"the local Prefect server exited at start; see {log}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:  # not listening yet (URLError, connection refused, timeout)
            pass
        time.sleep(0.5)
    raise PipelineError(
        f"the local Prefect server did not answer within {SERVER_START_TIMEOUT_S:.0f}s; see {log}"
    )


def wait_for_workers(pool: str, count: int, since: datetime, log_dir: Path) -> None:
    """Block until ``count`` workers have polled ``pool`` since ``since`` (the server's database
    may remember workers of earlier sweeps, under the same names)."""
    from prefect.client.orchestration import get_client

    deadline = time.monotonic() + SERVER_START_TIMEOUT_S

    def fresh(worker: Any) -> bool:
        return worker.last_heartbeat_time is not None and worker.last_heartbeat_time >= since

    with get_client(sync_client=True) as client:
        while sum(map(fresh, client.read_workers_for_work_pool(pool))) < count:
            if time.monotonic() > deadline:
                raise PipelineError(
                    f"{count} local Prefect workers did not start within "
                    f"{SERVER_START_TIMEOUT_S:.0f}s; see {log_dir}/worker-*.log"
                )
            time.sleep(0.5)


def ensure_process_pool(pool: str) -> None:
    """Create the process work pool ``pool`` unless it exists."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists

    with get_client(sync_client=True) as client, suppress(ObjectAlreadyExists):
        client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
