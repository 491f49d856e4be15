"""Serving deployments in this process (``dapo schedule``): Prefect's runner runs each
scheduled flow run in a child process. A stop (Ctrl-C, SIGTERM) lets the runs at work stop
themselves first, then says which were cut off and how each goes on; a flow-run process ends
with this one, even when this one is killed outright (``tasks.orchestration.RUNS_END_WITH``),
and so do the schedules: the runner pauses them when it stops, this process's reaper when it is
killed (``PAUSE_ORPHANED``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prefect.deployments.runner import RunnerDeployment

from tasks import lifetime
from tasks.lifetime import alive, children, is_reaper
from tasks.orchestration import RUNS_END_WITH
from tasks.signals import replaced_handlers


def api_url() -> str | None:
    """The Prefect API in use (None: the embedded ephemeral server)."""
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or os.environ.get("PREFECT_API_URL") or None


def serve_deployments(deployments: list[RunnerDeployment]) -> list[str]:
    """Register the deployments and run their scheduled flow runs here (blocks until Ctrl-C or
    SIGTERM); returns one line for each scheduled run the stop cut off, saying where it stopped.

    Prefect's runner, stopped, kills its flow runs' processes outright (SIGKILL): a nightly run
    ended CRASHED, as if out of memory, without its own line on where it stopped. So a stop
    first waits, up to ``RUNS_STOP_S``, for the runs to stop the way a command's run does
    (flow run CANCELLED with that line, MLflow run KILLED); only then does the runner stop."""
    import datetime

    from prefect.runner import Runner

    began = datetime.datetime.now(datetime.timezone.utc)
    stopped: list[datetime.datetime] = []
    runner = Runner(pause_on_shutdown=True)  # what prefect.serve() makes
    with (
        _paused_if_killed() as schedules,
        _environment(RUNS_END_WITH, str(os.getpid())),  # the runs end with this process
        replaced_handlers(lambda previous: _runs_first(previous, stopped)),
        _cancelled_callbacks_quiet(),
        contextlib.suppress(KeyboardInterrupt),
    ):
        for deployment in deployments:
            schedules.registered(str(runner.add_deployment(deployment)))
        # Runner.start() makes its handle_sigterm SIGTERM's handler (it stops the runner at once)
        runner.handle_sigterm = signal.getsignal(signal.SIGTERM)
        schedules.served = True  # from here the runner pauses them when it stops
        asyncio.run(runner.start())
    return cut_off_runs([d.name for d in deployments], began, stopped[0] if stopped else None)


PAUSE_ORPHANED = "import sys; from flows.serve import pause_deployments as p; p(*sys.argv[1:])"
"""What the reaper runs (``python -I -c PAUSE_ORPHANED API_URL ID...``) when ``dapo schedule``
is killed outright (SIGKILL, the OOM killer): the deployments it served are paused, as the
runner pauses them when it stops. Left unpaused, the server went on scheduling runs that nobody
served. Isolated (``-I``), as the reaper: a ``flows`` package where the command was started
cannot shadow the project's."""
PAUSE_TIMEOUT_S = 40.0
"""All the deployments' pauses together, within the reaper's time for last words."""


class _Schedules:
    """The deployments registered so far, and whether the runner serves them (it then pauses
    them itself when it stops)."""

    def __init__(self) -> None:
        self.key, self.ids, self.served = f"prefect-deployments:{os.getpid()}", [], False

    def registered(self, deployment_id: str) -> None:
        """Said again to the reaper with each, so that a kill between two registrations leaves
        none active."""
        self.ids.append(deployment_id)
        argv = [sys.executable, "-I", "-c", PAUSE_ORPHANED, str(api_url()), *self.ids]
        lifetime.last_words(self.key, argv)


@contextmanager
def _paused_if_killed() -> Iterator[_Schedules]:
    """The deployments registered in the block are paused by this process's reaper should it be
    killed during the block, and here at its end if the runner never served them (a stop while
    they were registered); a runner that served them paused them when it stopped."""
    schedules = _Schedules()
    try:
        yield schedules
    finally:
        if schedules.ids and not schedules.served:
            paused = pause_deployments(str(api_url()), *schedules.ids)
            if paused < len(schedules.ids):  # the server away or too slow to answer
                sys.stderr.write(
                    f"warning: {len(schedules.ids) - paused} of the deployments registered "
                    f"(ids {', '.join(schedules.ids)}) could not be paused and keep their "
                    "schedules: pause them in the Prefect UI's Deployments page or with "
                    "`prefect deployment schedule pause FLOW/DEPLOYMENT --all`\n"
                )
        lifetime.take_back(schedules.key)


def pause_deployments(api: str, *ids: str) -> int:
    """Pause deployments ``ids`` through the Prefect API at ``api`` (``PATCH /deployments/ID``,
    with the credentials Prefect's own client sends); how many the server accepted. Errors are
    not raised: a killed ``dapo schedule``'s last words run in a process of their own."""
    from tasks.orchestration import prefect_api

    timeout = PAUSE_TIMEOUT_S / max(len(ids), 1)
    said = [prefect_api("PATCH", api, f"deployments/{i}", {"paused": True}, timeout) for i in ids]
    return sum(answer is not None for answer in said)


RUNS_STOP_S = 30.0
"""How long a stop waits for the scheduled runs in progress to stop themselves (a run takes
seconds; the command's own clean-up deadline, ``tasks.signals.CLEANUP_DEADLINE_S``, starts
after it)."""


def _runs_first(previous: Any, stopped: list) -> Any:
    """A handler for Ctrl-C or SIGTERM that lets the flow runs at work stop themselves first
    (a SIGTERM is passed on to them; a terminal's Ctrl-C reaches them itself), then runs
    ``previous``, the command's handler, which stops the runner. A second signal does not
    wait. ``stopped`` gets the time of each signal."""
    import datetime

    if not callable(previous):
        return previous

    def handler(signum: int, frame: Any) -> Any:
        runs = [] if stopped else flow_run_processes()
        stopped.append(datetime.datetime.now(datetime.timezone.utc))
        if not runs:
            return previous(signum, frame)
        if signum == signal.SIGTERM:
            for pid in runs:
                with contextlib.suppress(OSError):  # gone already
                    os.kill(pid, signum)
        threading.Thread(target=_then_stop, args=(runs, signum, stopped), daemon=True).start()
        return None

    return handler


def _then_stop(runs: list[int], signum: int, stopped: list) -> None:
    """Wait until ``runs`` have ended (or ``RUNS_STOP_S``), then send ``signum`` again, unless
    a second signal came meanwhile."""
    deadline = time.monotonic() + RUNS_STOP_S
    while alive(runs) and time.monotonic() < deadline and len(stopped) == 1:
        time.sleep(0.2)
    if len(stopped) == 1:
        os.kill(os.getpid(), signum)


@contextmanager
def _environment(name: str, value: str) -> Iterator[None]:
    """``os.environ[name]`` is ``value`` during the block (what processes started in it get)."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def flow_run_processes() -> list[int]:
    """The processes Prefect's runner started here for its flow runs: this process's children,
    less its reaper (``tasks.lifetime``)."""
    return [pid for pid in children(os.getpid()) if not is_reaper(pid)]


@contextmanager
def _cancelled_callbacks_quiet() -> Iterator[None]:
    """Keep asyncio from logging a cancelled task as an error with two call stacks. When the
    runner stops, Python 3.11's stream server asks its cancelled connection task for its
    exception, which raises CancelledError inside a callback (3.12 checks first)."""
    quiet = _DropCancelled()
    logger = logging.getLogger("asyncio")
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


class _DropCancelled(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, asyncio.CancelledError)


def cut_off_runs(deployments: list[str], began: Any, stopped: Any) -> list[str]:
    """One line for each run of ``deployments`` that started after ``began`` and was still at
    work when the stop came at ``stopped`` (None: no stop, nothing cut off), with the message
    it ended with (where it stopped and how it goes on); [] where the server cannot say."""
    if stopped is None:
        return []
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterName,
        FlowRunFilter,
        FlowRunFilterStartTime,
    )

    try:
        with get_client(sync_client=True) as client:
            runs = client.read_flow_runs(
                flow_run_filter=FlowRunFilter(start_time=FlowRunFilterStartTime(after_=began)),
                deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=deployments)),
            )
    except Exception:  # noqa: BLE001 - the stop is said either way; this only adds detail
        return []
    return [
        f"the scheduled run {r.name!r} was cut off ({r.state.name.lower()}): "
        + _as_scheduled(r.state.message or "it left no line on where it stopped")
        for r in runs
        if r.state is not None
        and r.state.type.value in _CUT_OFF
        and (r.end_time is None or r.end_time >= stopped)
    ]


_CUT_OFF = {"RUNNING", "CANCELLING", "CANCELLED", "CRASHED", "PENDING"}


def _as_scheduled(message: str) -> str:
    """A sweep's stop advises "the same command" (``flows.ablate.stopped_message``): for a
    scheduled one, that is ``dapo ablate`` under the schedule's settings, not ``dapo schedule``."""
    return message.replace(
        "run the same command with", "run dapo ablate with the schedule's -c and -S and"
    )
