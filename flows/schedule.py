"""Cron schedules: a nightly ``train`` that continues one run from its latest checkpoint, and a
weekly ``ablate`` sweep, served as Prefect deployments (``dapo schedule``).

``build_deployments`` only builds ``RunnerDeployment`` objects (no server needed: ``--dry-run``
prints them); ``flows.serve.serve_deployments`` registers them with the Prefect API and runs
them in this process when their schedule fires (it blocks). The scheduler is a service of a
real Prefect server (``prefect server start``; the embedded ephemeral one creates no scheduled
runs), and it needs SQLAlchemy < 2.1 (constrained in pyproject.toml).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prefect.deployments.runner import EntrypointType, RunnerDeployment
from prefect.schedules import Cron, validate_cron_string

from dapo_core.ablation import ordered_variants
from dapo_core.config import ConfigError
from flows.ablate import ablate_flow
from flows.pipeline import train_flow
from tasks.rundir import check_run_name

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
