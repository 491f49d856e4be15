"""Prefect flows: ``curate``, ``train``, ``evaluate``, ``pipeline`` (curate -> train -> evaluate).

Flow parameters are plain values (params file, overlay presets, ``section.key=value`` overrides,
variant, run name), so the same flows can be deployed on a schedule (``flows/schedule.py``). They
use Prefect's embedded server by default and any Prefect API when ``PREFECT_API_URL`` is set.

Run directories are fixed by the flow before its train task starts (``train.out_dir/<run name>``):
a retried train task, or a later flow run given the same ``run_name``, continues from the last
checkpoint there. The pipeline logs training and the evaluation after it to the same MLflow run
(experiment ``<prefix>-pipeline``); the final evaluation is logged at the last training step.
"""

from __future__ import annotations

import time
from pathlib import Path

from prefect import flow

from dapo_core.ablation import apply_variant, split_overrides
from dapo_core.config import Config
from dapo_core.errors import TrainingInterrupted
from tasks.data.task import curate_task
from tasks.evaluation.task import EvalSummary, evaluate_task
from tasks.orchestration import cancelled_when_interrupted
from tasks.params import load_params, repo_path
from tasks.rundir import RunDir
from tasks.training.distributed import shutdown_distributed
from tasks.training.preflight import PreflightResult, preflight_task
from tasks.training.run import TrainResult, run_training
from tasks.training.task import TrainSummary, train_task


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
    from prefect.runtime import flow_run

    suffix = f"-{str(flow_run.id)[:8]}" if flow_run.id else ""
    return f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}{suffix}"


def run_dir_for(cfg: Config, run_name: str) -> Path:
    return repo_path(cfg.train.out_dir) / run_name


@flow(name="curate")
def curate_flow(
    params: str | None = None,
    config: list[str] | None = None,
    overrides: list[str] | None = None,
    stages: list[str] | None = None,
) -> dict:
    """Build the curated data and eval sets with the DVC stages (``dvc repro``)."""
    return curate_task(load_config(params, config, overrides), stages)


@flow(name="train")
@cancelled_when_interrupted
def train_flow(
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
) -> TrainSummary:
    """Train with DAPO (or a Table 1 variant) in ``run_dir`` (default: ``train.out_dir/<run
    name>``). With ``resume`` a run already there continues from its latest checkpoint
    (``max_steps`` more steps at most, e.g. nightly); without it such a directory is refused.
    ``track=False`` logs nothing to MLflow (the run directory still has every metric)."""
    cfg = load_config(params, config, overrides, variant)
    name = run_name or (Path(run_dir).name if run_dir else default_run_name("train"))
    target = run_dir or str(run_dir_for(cfg, name))
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


@flow(name="preflight")
@cancelled_when_interrupted
def preflight_flow(
    params: str | None = None,
    config: list[str] | None = None,
    overrides: list[str] | None = None,
    prompts: int | None = None,
    strict: bool = False,
) -> PreflightResult:
    """Sample the starting policy on a few training prompts: is there anything to learn from?"""
    return preflight_task(load_config(params, config, overrides), strict=strict, prompts=prompts)


def train_on_ranks(cfg: Config, run_dir: str, resume: bool) -> TrainResult:
    """Training under a multi-rank launcher (deepspeed, torchrun): every rank runs this, without
    Prefect or MLflow (one flow run per rank would be N runs); rank 0 writes the run directory.
    ``dapo pipeline`` is the tracked path."""
    result = run_training(cfg, RunDir(run_dir), resume=resume)
    shutdown_distributed()  # on success only: after an error the other ranks may never arrive
    return result


@flow(name="evaluate")
@cancelled_when_interrupted
def evaluate_flow(
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
    cfg = load_config(params, config, overrides)
    return evaluate_task(
        cfg, model, eval_set, kind="evaluate", progress=progress, extra_tags=tags, track=track
    )


@flow(name="pipeline")
@cancelled_when_interrupted
def pipeline_flow(
    params: str | None = None,
    config: list[str] | None = None,
    overrides: list[str] | None = None,
    variant: str | None = None,
    run_name: str | None = None,
    eval_set: str | None = None,
    max_steps: int | None = None,
    curate: bool = True,
    progress: bool = True,
    tags: dict[str, str] | None = None,
    baseline: bool = True,
) -> dict:
    """curate -> train -> evaluate, all in one MLflow run of the ``-pipeline`` experiment.

    ``baseline``: a run that starts from scratch also evaluates the starting policy on the same
    set, logged at step 0 of the same run, so ``eval/avg_at_k`` charts the lift."""
    cfg = load_config(params, config, overrides, variant)
    name = run_name or default_run_name("pipeline")
    target = str(run_dir_for(cfg, name))
    # The one writer of the run directory from before its training (and the task's retries)
    # until its evaluation is written there too.
    with RunDir(target).writer():
        data = curate_task(cfg) if curate else {"status": "not requested"}
        checked = preflight_if_new(cfg, target)
        trained = train_task.with_options(task_run_name=f"train {name}")(
            cfg,
            target,
            kind="pipeline",
            run_name=name,
            variant=variant,
            max_steps=max_steps,
            progress=progress,
            extra_tags=tags,
            preflight=checked,
        )
        try:
            before, evaluated = _evaluate(cfg, name, trained, eval_set, progress, tags, baseline)
        except TrainingInterrupted as e:
            raise TrainingInterrupted(
                f"{e}; the training is kept: `dapo pipeline --run-name {name}` evaluates it"
            ) from None
        return {"curate": data, "train": trained, "evaluate": evaluated, "baseline": before}


def _evaluate(
    cfg: Config,
    name: str,
    trained: TrainSummary,
    eval_set: str | None,
    progress: bool,
    tags: dict[str, str] | None,
    baseline: bool,
) -> tuple[EvalSummary | None, EvalSummary]:
    """The pipeline's evaluations, both logged to its training run: the starting policy at step
    0 (``baseline``, for a run that started from scratch) and the trained model."""
    before = None
    if baseline and trained.resumed_from == 0:
        before = evaluate_task.with_options(task_run_name=f"evaluate {name} at step 0")(
            cfg,
            None,  # the configured policy, before any RL step
            eval_set,
            kind="pipeline",
            run_id=trained.mlflow_run_id,
            step=0,
            progress=progress,
            artifact_dir="eval-step0",
        )
    evaluated = evaluate_task.with_options(task_run_name=f"evaluate {name}")(
        cfg,
        trained.model_path,
        eval_set,
        kind="pipeline",
        run_id=trained.mlflow_run_id,
        step=trained.steps,
        run_dir=trained.run_dir,
        progress=progress,
        extra_tags=tags,
    )
    return before, evaluated
