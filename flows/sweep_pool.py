"""An ablation sweep on a Prefect work pool: its children submitted as runs of one deployment,
followed to their end (a crashed or failed one submitted once more), and, when the sweep stops,
cancelled.

Every flow run of sweep ``name`` carries the tag ``sweep:<name>`` (``sweep_tag``): what tells
its runs apart on a shared pool, and what finds them to cancel (``cancel_sweep``). The sweep
itself is ``flows.ablate``; the local server and workers of ``dapo ablate --workers N`` are
``flows.cluster``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, NamedTuple

from dapo_core.config import ConfigError
from flows.cluster import UNFINISHED, settle_cancelled, sweep_queue
from tasks.orchestration import run_logger

CHILD_DEPLOYMENT = "ablate-run"
POLL_S = 2.0
MAX_SUBMISSIONS = 2  # a child whose flow run fails or crashes is submitted once more
CANCEL_WAIT_S = 6.0
"""How long a stopped sweep waits for its running children's workers to stop them (a worker
checks every 3 s that the process it signalled has gone before it marks the run CANCELLED)."""


class Stopped(NamedTuple):
    """What cancelling a sweep's flow runs did."""

    queued: int  # CANCELLED at once
    running: int  # CANCELLING: their workers stop them
    stopping: int  # of those, not ended yet when the sweep stopped waiting


def describe(cancelled: Stopped) -> str:
    said = f"cancelled its {cancelled.queued} queued and {cancelled.running} running flow runs"
    if cancelled.stopping:
        said += f" ({cancelled.stopping} still being stopped by their workers)"
    return said


def stop_runs(name: str, pool: str) -> Stopped | None:
    """``cancel_sweep``, or None (said in the log) where the server cannot be reached: the stop
    goes on, and the sweep's outcome is not hidden behind this one. On a local cluster it does
    not wait for the running runs: the cluster ends them before it stops (``close_queue``)."""
    try:
        if sweep_queue(pool):
            return cancel_sweep(name, wait_s=0.0)._replace(stopping=0)
        return cancel_sweep(name)
    except Exception as e:  # noqa: BLE001 - a clean-up failure must not replace the cause
        run_logger().warning("ablate: could not cancel the flow runs of sweep %s: %s", name, e)
        return None


def check_pool(pool: str) -> None:
    """A ConfigError that says what to do unless the Prefect server has a work pool ``pool``."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(pool)
        except ObjectNotFound:
            raise ConfigError(
                f"no work pool named {pool!r} on this Prefect server; create it with "
                f"`prefect work-pool create {pool} --type process` and start workers on it"
            ) from None


def sweep_tag(name: str) -> str:
    """The tag on every flow run of sweep ``name``: what tells its runs apart on a shared pool,
    and what finds them to cancel."""
    return f"sweep:{name}"


def on_pool(run_flow: Any, children: Sequence[Any], parent_id, eval_set, pool: str, sweep: str):
    """Submit every child to ``pool`` as a run of the ``ablate-run`` deployment, then yield
    (child, status) as each finishes, in whatever order. On a local cluster the runs go to its
    sweep's own queue (``flows.cluster``); every run is tagged with the sweep (``sweep_tag``)."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.deployments.runner import EntrypointType

    deployment = run_flow.to_deployment(
        name=CHILD_DEPLOYMENT,
        entrypoint_type=EntrypointType.MODULE_PATH,
        tags=["dapo", "ablate"],
        description="One (variant, seed) of an ablation sweep: train, then evaluate.",
    )
    deployment.apply(work_pool_name=pool)
    # A sweep of this name stopped without cleaning up (killed) may have left runs that would
    # train into the same directories as ours: end them first.
    if any(left := cancel_sweep(sweep)):
        run_logger().warning("ablate: sweep %s had runs left unfinished: %s", sweep, describe(left))
    queue = sweep_queue(pool)

    def submit(c: Any) -> Any:
        return run_deployment(
            f"ablate-run/{CHILD_DEPLOYMENT}",
            parameters={
                "config": c.cfg.to_dict(),
                "variant": c.variant,
                "seed": c.seed,
                "run_dir": c.run_dir,
                "parent_run_id": parent_id,
                "eval_set": eval_set,
                "progress": False,
            },
            flow_run_name=c.label,
            timeout=0,  # submit, do not wait
            as_subflow=True,
            tags=[sweep_tag(sweep)],
            work_queue_name=queue,
        ).id

    pending = {submit(c): c for c in children}
    where = f"work pool {pool!r}" + (f", queue {queue!r}" if queue else "")
    run_logger().info("ablate: %d runs submitted to %s", len(children), where)
    attempts = dict.fromkeys((c.label for c in children), 1)
    with get_client(sync_client=True) as client:
        while pending:
            for run_id in list(pending):
                state = client.read_flow_run(run_id).state
                if state is None or not state.is_final():
                    continue
                child = pending.pop(run_id)
                if state.is_completed():
                    yield child, "ok"
                elif state.is_cancelled():  # stopped on purpose (the UI, the sweep): not again
                    yield child, f"cancelled: {state.message or ''}".strip(": ")
                elif attempts[child.label] < MAX_SUBMISSIONS:  # crashed or failed: again,
                    attempts[child.label] += 1  # from the run's last checkpoint
                    pending[submit(child)] = child
                else:
                    yield child, f"failed: {state.name}: {state.message or ''}".strip(": ")
            time.sleep(POLL_S if pending else 0)


def cancel_sweep(name: str, wait_s: float = CANCEL_WAIT_S) -> Stopped:
    """Cancel the unfinished flow runs of sweep ``name``. A queued run is CANCELLED at once (the
    server does so for a run no worker has started); a running one is set CANCELLING, and its
    worker stops the process and marks it CANCELLED, which this waits up to ``wait_s`` for (a
    run whose process took the stop for a crash is marked CANCELLED here)."""
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelling

    with get_client(sync_client=True) as client:
        runs = sweep_runs(client, name)
        queued = sum(1 for run in runs if run.state and run.state.is_scheduled())
        for run in runs:
            client.set_flow_run_state(run.id, Cancelling(message=f"sweep {name} was stopped"))
        stopping, deadline = len(runs) - queued, time.monotonic() + wait_s
        while stopping and time.monotonic() < deadline:
            time.sleep(0.5)
            stopping = len(sweep_runs(client, name))
        for run in runs:
            settle_cancelled(client, run.id)
    return Stopped(queued, len(runs) - queued, stopping)


def sweep_runs(client: Any, name: str) -> list[Any]:
    """The unfinished flow runs of sweep ``name`` (its tag) on this Prefect server."""
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterName,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
        FlowRunFilterTags,
    )

    return client.read_flow_runs(
        flow_run_filter=FlowRunFilter(
            tags=FlowRunFilterTags(all_=[sweep_tag(name)]),
            state=FlowRunFilterState(type=FlowRunFilterStateType(any_=list(UNFINISHED))),
        ),
        deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[CHILD_DEPLOYMENT])),
    )
