"""What the single-stage flows run (``train``, ``preflight``, ``evaluate``), and the helpers every
flow shares (configs, run names, run directories). Prefect is not imported here: without a
Prefect server (``tasks.orchestration.without_prefect``) a command calls these functions through
``flows.cli``, seconds sooner than importing Prefect for flows it would not run as such;
``flows/pipeline.py`` wraps the same functions as the Prefect flows ``train``, ``preflight`` and
``evaluate``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from dapo_core.ablation import apply_variant, split_overrides
from dapo_core.config import Config
from tasks.orchestration import run_logger, running_directly
from tasks.params import load_params, repo_path
from tasks.rundir import RunDir, check_run_name
from tasks.training.distributed import shutdown_distributed
from tasks.training.preflight import PreflightResult, preflight_task
from tasks.training.run import TrainResult, run_training
from tasks.training.task import TrainSummary, train_task

if TYPE_CHECKING:  # imported by evaluate(): a training command does not load pandas for it
    from tasks.evaluation.task import EvalSummary


def load_config(
    params: str | None = None,
    config: list[str] | None = None,
    overrides: list[str] | None = None,
    variant: str | None = None,
) -> Config:
    """params.yaml (or ``params``), overlay presets, overrides, then a Table 1 variant."""
    base, tuned = split_overrides(variant, overrides or ())
    cfg = load_params(params, config or (), base)
    return apply_variant(cfg, variant, tuned) if variant else cfg


def default_run_name(kind: str) -> str:
    """``<kind>-<date>-<time>-<flow run id prefix>``: unique, and fixed for the flow run."""
    suffix = ""
    if not running_directly():  # in a Prefect flow run: its id
        from prefect.runtime import flow_run

        suffix = f"-{str(flow_run.id)[:8]}" if flow_run.id else ""
    return f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}{suffix}"


def run_dir_for(cfg: Config, run_name: str) -> Path:
    check_run_name(run_name)
    return repo_path(cfg.train.out_dir) / run_name


def keep_sweep_settings(
    cfg: Config, tuned: dict[str, list[str]], run_name: str, record: bool = True
) -> None:
    """A sweep (ablate, compare) continued under its --run-name runs with the settings it began
    with: the config every run starts from and each variant's own tuning
    (``RunDir.keep_sweep_settings``). ``record=False``: only the check (a command's, before it
    starts servers and workers)."""
    settings = {"config": cfg.to_dict(), "tuned": tuned}
    RunDir(run_dir_for(cfg, run_name)).keep_sweep_settings(settings, record)


def train(
    params: str | None = None,
    config: list[str] | None = None,
    overrides: list[str] | None = None,
    variant: str | None = None,
    run_name: str | None = None,
    max_steps: int | None = None,
    progress: bool = True,
    run_dir: str | None = None,
    resume: bool = True,
    track: bool = True,
    promote: str | None = None,
) -> TrainSummary:
    """Train with DAPO (or a Table 1 variant) in ``run_dir`` (default: ``train.out_dir/<run
    name>``). With ``resume`` a run already there continues from its latest checkpoint
    (``max_steps`` more steps at most, e.g. nightly); without it such a directory is refused.
    ``track=False`` logs nothing to MLflow (the run directory still has every metric).
    ``promote``: a registered model name the completed run's policy is promoted to (alias
    ``champion``) when it beats the champion (``registry.promote_if_better``)."""
    cfg = load_config(params, config, overrides, variant)
    name = run_name or (Path(run_dir).name if run_dir else default_run_name("train"))
    target = run_dir or str(run_dir_for(cfg, name))
    summary = train_config(cfg, target, name, variant, max_steps, progress, resume, track)
    if promote:
        promote_run(cfg, summary, promote)
    return summary


def promote_run(cfg: Config, summary: TrainSummary, name: str) -> None:
    """Promote a completed run's policy to ``models:/NAME@champion`` if it beats the champion;
    say what was decided. A registry that cannot be reached is a warning: the training stands."""
    from tasks.tracking.registry import DEFAULT_ALIAS, promote_if_better
    from tasks.tracking.store import tracking_uri

    log = run_logger()
    if not summary.mlflow_run_id:
        log.warning("promote: nothing to promote: the run is not tracked in MLflow")
        return
    if not summary.complete:
        log.info("promote: not yet: the run's policy is logged once it reaches train.steps")
        return
    try:
        decided = promote_if_better(summary.mlflow_run_id, name, uri=tracking_uri(cfg))
    except Exception as e:  # noqa: BLE001 - the run is trained and kept either way
        log.warning(
            "promote: could not reach the Model Registry (%s); promote later with "
            "`dapo register %s --name %s`",
            e,
            summary.mlflow_run_id,
            name,
        )
        return
    log.info("promote: %s", decided.describe(name, DEFAULT_ALIAS))


def train_config(
    cfg: Config,
    target: str,
    name: str,
    variant: str | None = None,
    max_steps: int | None = None,
    progress: bool = True,
    resume: bool = True,
    track: bool = True,
) -> TrainSummary:
    """:func:`train` for a resolved config, in the run directory ``target``."""
    if cfg.rollout.reward == "model":  # refused before the preflight samples or a file is written
        from tasks.models.learned_reward import reward_model_record

        reward_model_record(cfg.rollout.reward_model)
    with RunDir(target).writer():  # the one writer, across the task's retries too
        return train_task(
            cfg,
            target,
            kind="train",
            run_name=name,
            variant=variant,
            max_steps=max_steps,
            progress=progress,
            resume=resume,
            track=track,
            preflight=preflight_if_new(cfg, target),
        )


def preflight_if_new(cfg: Config, run_dir: str) -> PreflightResult | None:
    """The preflight, for a run that starts from scratch (``train.preflight_prompts`` > 0): a
    continued run has already shown what it can learn."""
    if cfg.train.preflight_prompts == 0 or RunDir(run_dir).latest_checkpoint() is not None:
        return None
    return preflight_task(cfg)


def preflight(
    params: str | None = None,
    config: list[str] | None = None,
    overrides: list[str] | None = None,
    prompts: int | None = None,
    strict: bool = False,
    said: bool = True,
) -> PreflightResult:
    """Sample the starting policy on a few training prompts: is there anything to learn from?
    ``said``: log the report (`dapo preflight` prints it itself, on stdout)."""
    cfg = load_config(params, config, overrides)
    return preflight_task(cfg, strict=strict, prompts=prompts, said=said)


def train_on_ranks(cfg: Config, run_dir: str, resume: bool) -> TrainResult:
    """Training under a multi-rank launcher (deepspeed, torchrun): every rank runs this, without
    Prefect or MLflow (one flow run per rank would be N runs); rank 0 writes the run directory.
    ``dapo pipeline`` is the tracked path."""
    result = run_training(cfg, RunDir(run_dir), resume=resume)
    shutdown_distributed()  # on success only: after an error the other ranks may never arrive
    return result


def evaluate(
    params: str | None = None,
    config: list[str] | None = None,
    overrides: list[str] | None = None,
    model: str | None = None,
    eval_set: str | None = None,
    progress: bool = True,
    tags: dict[str, str] | None = None,
    track: bool = True,
) -> EvalSummary:
    """Evaluate a model (default: model.name_or_path) on an eval set; tracked in MLflow unless
    ``track=False``."""
    from tasks.evaluation.task import evaluate_task

    cfg = load_config(params, config, overrides)
    return evaluate_task(
        cfg, model, eval_set, kind="evaluate", progress=progress, extra_tags=tags, track=track
    )
