"""Prefect flows: ``curate``, ``train``, ``evaluate``, ``preflight``, ``pipeline`` (curate -> train
-> evaluate).

Flow parameters are plain values (params file, overlay presets, ``section.key=value`` overrides,
variant, run name), so the same flows can be deployed on a schedule (``flows/schedule.py``). They
use Prefect's embedded server by default and any Prefect API when ``PREFECT_API_URL`` is set.
``train``, ``preflight`` and ``evaluate`` run the functions of ``flows/stages.py``, which a
command without a Prefect server calls directly.

Run directories are fixed by the flow before its train task starts (``train.out_dir/<run name>``):
a retried train task, or a later flow run given the same ``run_name``, continues from the last
checkpoint there. The pipeline logs training and the evaluation after it to the same MLflow run
(experiment ``<prefix>-pipeline``); the final evaluation is logged at the last training step.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from dapo_core import metric_names as metric
from dapo_core.config import Config
from dapo_core.errors import TrainingInterrupted
from flows import stages
from flows.stages import default_run_name, load_config, preflight_if_new, run_dir_for
from tasks.data.task import curate_task
from tasks.evaluation.task import EvalSummary, evaluate_task
from tasks.orchestration import (
    cancelled_when_interrupted,
    crashed_when_killed,
    publish_markdown,
)
from tasks.rundir import RunDir
from tasks.training.task import TrainSummary, train_task


def _stage_flow(name: str, fn: Any) -> Any:
    """``fn`` (of flows/stages.py) as the Prefect flow ``name``, known to Prefect as
    ``flows.pipeline.<name>_flow``: the entrypoint a scheduled deployment imports it by."""
    wrapped = cancelled_when_interrupted(fn)
    wrapped.__module__ = __name__
    wrapped.__name__ = wrapped.__qualname__ = f"{name}_flow"
    return flow(name=name)(wrapped)


train_flow = _stage_flow("train", stages.train)
preflight_flow = _stage_flow("preflight", stages.preflight)
evaluate_flow = _stage_flow("evaluate", stages.evaluate)


@flow(name="curate")
@crashed_when_killed  # its own interrupt handling; a SIGKILL ends it CRASHED
def curate_flow(
    params: str | None = None,
    config: list[str] | None = None,
    overrides: list[str] | None = None,
    stages: list[str] | None = None,
) -> dict:
    """Build the curated data and eval sets with the DVC stages (``dvc repro``)."""
    return curate_task(load_config(params, config, overrides), stages)


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
                f"{e}; the training is kept: `dapo pipeline --run-name {name}` with the same -c "
                "and -S evaluates it"
            ) from None
        _publish(name, trained, evaluated, before)
        return {"curate": data, "train": trained, "evaluate": evaluated, "baseline": before}


def _publish(name: str, trained: TrainSummary, after: EvalSummary, before: EvalSummary | None):
    """The evaluation summary as the flow run's Prefect artifact, linking to its MLflow run."""
    rows = [("trained", trained.steps, after)] + ([("start", 0, before)] if before else [])
    lines = ["| policy | step | avg@k (95% CI) |", "|---|---|---|"]
    for what, step, ev in rows:
        m = ev.metrics
        ci = f"{m[metric.AVG_AT_K_CI_LOW]:.3f}-{m[metric.AVG_AT_K_CI_HIGH]:.3f}"
        lines.append(f"| {what} | {step} | {m[metric.AVG_AT_K]:.3f} ({ci}) |")
    link = f"\n\n[The MLflow run]({trained.mlflow_url})" if trained.mlflow_url else ""
    text = f"# Pipeline {name}: {after.eval_set}\n\n" + "\n".join(lines) + link + "\n"
    publish_markdown(f"pipeline-{name}", text, f"dapo pipeline {name}: the evaluation")


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
        before=before.metrics if before else None,
    )
    return before, evaluated
