"""A local Prefect cluster for a sweep: a Prefect server, a process work pool and N workers.

``dapo ablate --workers N`` runs each (variant, seed) of the sweep as its own flow run of the
``ablate-run`` deployment; the workers started here pick them up, one at a time each, so N runs
train concurrently on this machine. The server keeps its database in the project's Prefect home
(``.prefect/``, as the embedded ephemeral server does), so the UI (``prefect server start``)
shows the sweep's flow runs afterwards. Everything started here runs in its own process group
and is stopped when the sweep ends, however it ends.

Each cluster makes its own work queue on the pool (``sweep_queue``) and its workers poll only
that queue, so a sweep never runs another sweep's runs (say one left queued by a sweep that was
killed). On the way out, after the sweep has cancelled its runs (``flows.ablate``), the runs
still unfinished in the queue are ended, their processes gone (``close_queue``), the queue is
deleted, and then the workers and the server stop.

To spread a sweep over several machines instead, run a Prefect server they can all reach, start
``prefect worker start --pool <pool>`` on each (a GPU node, say) and pass ``--pool <pool>``: the
sweep then submits to that pool and starts nothing itself.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager, suppress
from contextvars import ContextVar
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dapo_core.errors import PipelineError
from flows.server import (
    SERVER_START_TIMEOUT_S,
    SERVER_STOP_GRACE_S,
    flush_to_server,
    free_port,
    prefect_cli,
    spawn,
    wait_until_healthy,
)
from tasks.lifetime import stop_helper
from tasks.tracking.store import end_abandoned_run

log = logging.getLogger(__name__)

LOCAL_POOL = "dapo-local"
RUN_STOP_GRACE_S = 5.0
"""How long a cancelled flow run's process has to exit (its MLflow run ended KILLED) before it
is killed."""
WORKER_STOP_GRACE_S = 1.0
"""An idle Prefect 3.8 worker was seen to ignore SIGTERM and SIGINT for 15 s and more (its signal
forwarding only cancels its main task); it holds no run by the time it is stopped, so it gets a
second before SIGKILL."""
STOPPED = "the sweep stopped this run"
UNFINISHED = ("SCHEDULED", "PENDING", "RUNNING", "CANCELLING", "PAUSED")
"""Flow run state types of a run that may still start or still runs."""

_QUEUE: ContextVar[tuple[str, str] | None] = ContextVar("dapo_sweep_queue", default=None)
"""(pool, queue) of the local cluster this process runs, while it runs."""


def sweep_queue(pool: str) -> str | None:
    """The work queue the workers of this process's local cluster poll on ``pool``, if any: a
    sweep submits its runs there. None for a user's pool (their workers poll what they chose)."""
    current = _QUEUE.get()
    return current[1] if current and current[0] == pool else None


@contextmanager
def local_cluster(workers: int, log_dir: Path, pool: str = LOCAL_POOL) -> Iterator[str]:
    """Start a Prefect server and ``workers`` process workers on ``pool``; yield the API URL,
    with this process's Prefect settings pointing at it. Logs go to ``log_dir``."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    log_dir.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{free_port()}/api"
    queue = f"sweep-{uuid.uuid4().hex[:8]}"
    # Workers poll every 2 s rather than Prefect's 10: a sweep's runs start without a lull.
    env = {**os.environ, "PREFECT_API_URL": url, "PREFECT_WORKER_QUERY_SECONDS": "2"}
    with ExitStack() as stack:
        procs: list[subprocess.Popen] = []  # server first, then the workers
        stack.callback(stop_all, procs)  # last on the way out
        procs.append(
            spawn(
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
        )
        wait_until_healthy(url, procs[0], log_dir / "prefect-server.log")
        stack.enter_context(temporary_settings(updates={PREFECT_API_URL: url}))
        ensure_process_pool(pool)
        create_queue(pool, queue)
        stack.callback(close_queue, pool, queue)  # while server and workers still run
        stack.callback(_QUEUE.reset, _QUEUE.set((pool, queue)))
        started = datetime.now(timezone.utc)
        for i in range(workers):
            procs.append(
                spawn(
                    [
                        *prefect_cli(),
                        "worker",
                        "start",
                        "--pool",
                        pool,
                        "--work-queue",
                        queue,
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
            )
        wait_for_workers(pool, workers, started, log_dir)  # so runs spread over all of them
        stack.callback(flush_to_server)  # first on the way out, while the server still runs
        yield url


def stop_all(procs: list[subprocess.Popen]) -> None:
    """Stop the server and the workers (``procs[1:]``) at once, so their grace periods do not add
    up; they hold no flow run by now (``close_queue``)."""
    graces = [SERVER_STOP_GRACE_S] + [WORKER_STOP_GRACE_S] * (len(procs) - 1)
    with ThreadPoolExecutor(max_workers=max(1, len(procs))) as pool:
        list(pool.map(stop_helper, procs, graces))


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


def create_queue(pool: str, queue: str) -> None:
    """The sweep's own work queue on ``pool``."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        client.create_work_queue(
            queue, description="runs of one `dapo ablate` sweep", work_pool_name=pool
        )


def close_queue(pool: str, queue: str) -> None:
    """Before the workers and the server stop: end every unfinished run in ``queue`` and delete
    it, so that neither a process nor a run that looks alive outlives the sweep.

    The sweep has asked for its runs to be cancelled already (``flows.ablate``), unless it died
    first: a queued run is CANCELLED then, a running one CANCELLING. Its worker would stop its
    process with SIGTERM once it notices, but stopping the worker would not reach that process,
    which runs in a session of its own: this sends the SIGTERM itself, gives the process
    ``RUN_STOP_GRACE_S`` to end its MLflow run KILLED and exit, kills it after that, and marks
    its flow run CANCELLED rather than waiting for the worker (also where the run's engine took
    the SIGTERM for a crash: ``settle_cancelled``). An MLflow run a killed process left RUNNING
    is ended KILLED here (``end_abandoned_run``)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound
    from prefect.states import Cancelled, Cancelling

    try:
        with get_client(sync_client=True) as client:
            stopping = unfinished_runs(client, pool, queue)
            for run in stopping:
                if run.state is None or not run.state.is_cancelling():
                    message = "the sweep stopped before this run ended"
                    client.set_flow_run_state(run.id, Cancelling(message=message))
                # What the worker will send once it sees CANCELLING; sent now, the process has
                # the whole grace period to end its MLflow run, however slowly the worker polls.
                _signal_run(run, signal.SIGTERM)
            deadline = time.monotonic() + RUN_STOP_GRACE_S

            def every() -> list[Any]:  # the runs stopped here, and any a worker started since
                return [*stopping, *unfinished_runs(client, pool, queue)]

            while time.monotonic() < deadline and any(flow_run_pid(r) for r in every()):
                time.sleep(0.2)
            for run in every():
                _signal_run(run, signal.SIGKILL)
            for run in unfinished_runs(client, pool, queue):
                client.set_flow_run_state(run.id, Cancelled(message=STOPPED), force=True)
            for run in stopping:  # every process is gone now: nothing can overwrite this
                settle_cancelled(client, run.id)
            for run in stopping:  # a process killed, or stopped before it could end its run
                if run_dir := (run.parameters or {}).get("run_dir"):
                    end_abandoned_run(Path(run_dir), "KILLED")
            with suppress(ObjectNotFound):
                found = client.read_work_queue_by_name(queue, work_pool_name=pool)
                client.delete_work_queue_by_id(found.id)
    except Exception as e:  # never hide the sweep's own outcome behind a clean-up failure
        log.warning("could not close the sweep's work queue %r: %s", queue, e)


def settle_cancelled(client: Any, run_id: Any) -> None:
    """End CANCELLED a flow run the sweep stopped that reported itself CRASHED. Prefect's flow
    engine reports a SIGTERM as a crash, forced over whatever state the run is in, unless its
    worker announced a cancellation first (its own control channel), which ours cannot; the
    run did not crash, the sweep stopped it."""
    from prefect.states import Cancelled

    state = client.read_flow_run(run_id).state
    if state is not None and state.is_crashed():
        client.set_flow_run_state(run_id, Cancelled(message=STOPPED), force=True)


def _signal_run(run: Any, sig: signal.Signals) -> None:
    """Send ``sig`` to the process group of ``run``'s live process, if it has one here."""
    if pid := flow_run_pid(run):
        with suppress(OSError):
            os.killpg(pid, sig)


def unfinished_runs(client: Any, pool: str, queue: str) -> list[Any]:
    """The flow runs in ``queue`` that may still start or still run."""
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
        WorkPoolFilter,
        WorkPoolFilterName,
        WorkQueueFilter,
        WorkQueueFilterName,
    )

    return client.read_flow_runs(
        flow_run_filter=FlowRunFilter(
            state=FlowRunFilterState(type=FlowRunFilterStateType(any_=list(UNFINISHED)))
        ),
        work_pool_filter=WorkPoolFilter(name=WorkPoolFilterName(any_=[pool])),
        work_queue_filter=WorkQueueFilter(name=WorkQueueFilterName(any_=[queue])),
    )


def flow_run_pid(run: Any) -> int | None:
    """The pid of ``run``'s live process (the leader of its own process group), or None. Only
    where /proc shows that pid still belongs to that flow run: pids are reused, and an exited
    process not yet reaped has an empty environment. Elsewhere (no /proc) always None: the
    workers' own cancellation is then all there is."""
    if not run.infrastructure_pid:
        return None
    with suppress(OSError, ValueError):  # gone, no /proc, or not a pid
        pid = int(str(run.infrastructure_pid).rsplit(":", 1)[-1])
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if f"PREFECT__FLOW_RUN_ID={run.id}".encode() in environ:
            return pid
    return None
