"""Cron schedules: a nightly ``train`` that continues one run from its latest checkpoint, and a
weekly ``ablate`` sweep, served as Prefect deployments (``dapo schedule``).

``build_deployments`` only builds ``RunnerDeployment`` objects (no server needed: ``--dry-run``
prints them); ``serve_deployments`` registers them with the Prefect API and runs them in this
process when their schedule fires (it blocks). The scheduler is a service of a real Prefect server
(``prefect server start``; the embedded ephemeral one creates no scheduled runs), and it needs
SQLAlchemy < 2.1 (constrained in pyproject.toml).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from prefect.deployments.runner import EntrypointType, RunnerDeployment
from prefect.schedules import Cron, validate_cron_string

from dapo_core.ablation import ordered_variants
from dapo_core.config import ConfigError
from flows.ablate import ablate_flow
from flows.pipeline import train_flow
from tasks.lifetime import alive, children, is_reaper
from tasks.orchestration import RUNS_END_WITH
from tasks.rundir import check_run_name
from tasks.signals import replaced_handlers

NIGHTLY_TRAIN_CRON = "0 2 * * *"  # 02:00 every day
WEEKLY_ABLATE_CRON = "0 4 * * 0"  # 04:00 every Sunday
NIGHTLY_RUN_NAME = "nightly"


@dataclass(frozen=True)
class ScheduleSpec:
    """What ``dapo schedule`` registers (plain values, printable with ``--dry-run``)."""

    name: str
    flow: str
    cron: str
    timezone: str
    parameters: dict[str, Any]
    description: str


def schedule_specs(
    train_cron: str | None = NIGHTLY_TRAIN_CRON,
    ablate_cron: str | None = WEEKLY_ABLATE_CRON,
    params: str | None = None,
    config: list[str] | None = None,
    overrides: list[str] | None = None,
    nightly_steps: int | None = None,
    run_name: str = NIGHTLY_RUN_NAME,
    variants: list[str] | None = None,
    seeds: list[int] | None = None,
    timezone: str = "UTC",
    promote: str | None = None,
) -> list[ScheduleSpec]:
    """The deployments to register; an empty cron leaves that one out."""
    common = {"params": params, "config": config or [], "overrides": overrides or []}
    _check_timezone(timezone)
    check_run_name(run_name)
    if nightly_steps is not None and nightly_steps < 1:
        raise ConfigError(
            f"--nightly-steps must be >= 1, got {nightly_steps}; leave it out to train each "
            "night until train.steps"
        )
    if promote is not None:
        from tasks.tracking.registry import DEFAULT_ALIAS, check_names

        check_names(promote, DEFAULT_ALIAS, "--promote")
    specs = []
    if train_cron:
        _check_cron(train_cron, "--train-cron")
        specs.append(
            ScheduleSpec(
                name="dapo-nightly-train",
                flow="train",
                cron=train_cron,
                timezone=timezone,
                parameters={
                    **common,
                    "run_name": run_name,
                    "max_steps": nightly_steps,
                    "progress": False,
                    **({"promote": promote} if promote else {}),
                },
                description=(
                    f"Continue the run '{run_name}' from its latest checkpoint"
                    + (f", {nightly_steps} steps per night" if nightly_steps else "")
                    + " (until train.steps)"
                    + (
                        f"; once complete, its policy becomes models:/{promote}@champion if "
                        "its validation avg@k beats the champion's"
                        if promote
                        else ""
                    )
                    + "."
                ),
            )
        )
    if ablate_cron:
        _check_cron(ablate_cron, "--ablate-cron")
        specs.append(
            ScheduleSpec(
                name="dapo-weekly-ablate",
                flow="ablate",
                cron=ablate_cron,
                timezone=timezone,
                parameters={
                    **common,
                    "variants": ordered_variants(variants),
                    "seeds": seeds,
                    "progress": False,
                },
                description="The DAPO Table 1 ladder, each variant trained and evaluated.",
            )
        )
    return specs


def _check_cron(expr: str, option: str) -> None:
    """A cron expression Prefect takes and that fires (31 February parses, and never does)."""
    import datetime

    # what Prefect's scheduler computes the runs with
    from prefect._vendor.croniter import CroniterBadDateError, croniter

    try:
        validate_cron_string(expr)
    except ValueError:
        raise ConfigError(
            f"{option} {expr!r} is not a cron expression (e.g. '0 2 * * *')"
        ) from None
    try:
        croniter(expr, datetime.datetime.now(datetime.timezone.utc)).get_next(datetime.datetime)
    except CroniterBadDateError:
        raise ConfigError(
            f"{option} {expr!r} never fires (a date no month has); give one that does"
        ) from None


def _check_timezone(name: str) -> None:
    """An IANA time zone (Prefect would take any name and fail when the schedule first fires)."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError(
            f"--timezone {name!r} is not a time zone (e.g. 'UTC', 'Europe/Paris')"
        ) from None


def build_deployments(specs: list[ScheduleSpec]) -> list[RunnerDeployment]:
    """``RunnerDeployment`` objects for the specs (loaded by module path, not file path, so a
    scheduled run finds the flows from any working directory). One run of each at a time: a
    night's train that fires while the last one still trains (the same run directory, which
    refused it with an error) is cancelled by the server, and so is a second weekly sweep."""
    from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy

    flows = {"train": train_flow, "ablate": ablate_flow}
    one_at_a_time = ConcurrencyLimitConfig(
        limit=1, collision_strategy=ConcurrencyLimitStrategy.CANCEL_NEW
    )
    return [
        flows[s.flow].to_deployment(
            name=s.name,
            schedules=[Cron(s.cron, timezone=s.timezone)],
            parameters=s.parameters,
            description=s.description,
            tags=["dapo", s.flow],
            entrypoint_type=EntrypointType.MODULE_PATH,
            concurrency_limit=one_at_a_time,
        )
        for s in specs
    ]


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
    for deployment in deployments:
        runner.add_deployment(deployment)
    with (
        _environment(RUNS_END_WITH, str(os.getpid())),  # the runs end with this process
        replaced_handlers(lambda previous: _runs_first(previous, stopped)),
        _cancelled_callbacks_quiet(),
        contextlib.suppress(KeyboardInterrupt),
    ):
        # Runner.start() makes its handle_sigterm SIGTERM's handler (it stops the runner at once)
        runner.handle_sigterm = signal.getsignal(signal.SIGTERM)
        asyncio.run(runner.start())
    return cut_off_runs([d.name for d in deployments], began, stopped[0] if stopped else None)


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
