"""The Prefect task of the evaluation stage: one model on one eval set, tracked in MLflow.

The evaluation is logged to the training run it belongs to (``run_id``, at the last training
step: the pipeline and the ablation do this) or to a new run of its own.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from dapo_core import metric_names as metric
from dapo_core.config import Config
from dapo_core.errors import TrainingInterrupted
from tasks.data.eval_sets import SYNTHETIC_TEST
from tasks.data.version import pairs_digest
from tasks.evaluation.evaluate import evaluate_model
from tasks.orchestration import interrupts, run_logger, stage_task
from tasks.rundir import RunDir
from tasks.signals import deferred_signals
from tasks.tracking.provenance import data_source, run_tags
from tasks.tracking.tracker import Tracker


@dataclasses.dataclass
class EvalSummary:
    eval_set: str
    metrics: dict[str, float]
    per_problem: Any  # pandas DataFrame
    wall_time_s: float
    mlflow_run_id: str | None
    scoring: dict[str, str]  # eval/answer_format, eval/equivalence: how answers were judged
    samples: list[dict[str, Any]]  # a few samples with what was read from them


@stage_task("evaluate", retries=1, retry_delay_seconds=2)
def evaluate_task(
    cfg: Config,
    model_path: str | None = None,
    eval_set: str | None = None,
    kind: str = "evaluate",
    run_id: str | None = None,
    step: int = 0,
    run_dir: str | None = None,
    progress: bool = True,
    extra_tags: dict[str, str] | None = None,
    track: bool = True,
    artifact_dir: str = "eval",
    before: dict[str, float] | None = None,
) -> EvalSummary:
    """Evaluate a model and log metrics (at ``step``), the per-problem table, sample responses and
    the evaluation curve: to run ``run_id`` (the training run it belongs to) or to a new run.
    ``before``: the same evaluation's metrics at step 0, drawn on the curve too."""
    log = run_logger()
    t0 = time.perf_counter()
    tracker = Tracker(cfg, kind)
    try:
        name, result = evaluate_model(cfg, model_path, eval_set, progress=progress)
        wall = time.perf_counter() - t0
        # Untracked, the tracker never opens a run and every call below is a no-op.
        if track and (run_id is None or tracker.resume_run(run_id) is None):
            model_name = (
                "/".join(Path(model_path).parts[-2:]) if model_path else cfg.model.name_or_path
            )
            tracker.start_run(f"eval {name} {model_name}", run_tags(cfg, kind))
        with tracker:
            args = (model_path, step, run_dir, artifact_dir, extra_tags, before)
            _log_evaluation(tracker, cfg, name, result, wall, *args)
    except interrupts():
        stopped = _stopped(tracker, run_id if track else None)
        raise TrainingInterrupted(stopped) from None
    m = result.metrics
    log.info(
        "evaluate: %s (%d problems) avg@%d %.4f (95%% CI %.4f-%.4f) in %.1fs; answers read as %s, "
        "judged by %s",
        name,
        len(result.per_problem),
        cfg.eval.n_samples,
        m[metric.AVG_AT_K],
        m[metric.AVG_AT_K_CI_LOW],
        m[metric.AVG_AT_K_CI_HIGH],
        wall,
        result.scoring["eval/answer_format"],
        result.scoring["eval/equivalence"],
    )
    return EvalSummary(
        name,
        result.metrics,
        result.per_problem,
        wall,
        tracker.run_id,
        result.scoring,
        result.samples,
    )


def _evaluated_model(tracker: Tracker, model_path: str | None, step: int) -> str | None:
    """The MLflow LoggedModel an evaluation's metrics belong to (the Models page): the registered
    one a ``models:/`` URI names, or the evaluated directory's (this run logs it, once)."""
    from tasks.tracking.registry import is_model_uri

    if model_path and is_model_uri(model_path):
        return tracker.registered_model(model_path)
    return tracker.log_model(model_path, step) if model_path and Path(model_path).is_dir() else None


def _log_evaluation(
    tracker: Tracker,
    cfg: Config,
    name: str,
    result: Any,
    wall: float,
    model_path: str | None,
    step: int,
    run_dir: str | None,
    artifact_dir: str,
    extra_tags: dict[str, str] | None,
    before: dict[str, float] | None,
) -> None:
    """The evaluation's tags, metrics (at ``step``), tables and curve, to the tracker's run."""
    pp = result.per_problem
    digest = pairs_digest(zip(pp["problem_id"], pp["answer"], strict=True))
    source = {**data_source(cfg), "split": "test"} if name == SYNTHETIC_TEST else {"eval_set": name}
    tracker.log_datasets([(name, digest, "evaluation", source)])
    tracker.set_tags(
        {
            "eval.set": name,
            "eval.model": model_path or cfg.model.name_or_path,
            "data.eval_digest": digest,
            "eval.answer_format": result.scoring["eval/answer_format"],
            "eval.equivalence": result.scoring["eval/equivalence"],
            **(extra_tags or {}),
        }
    )
    model_id = _evaluated_model(tracker, model_path, step)
    tracker.log_metrics({**result.metrics, metric.EVAL_TIME: wall}, step, model_id, (name, digest))
    tracker.log_frame(pp, f"{artifact_dir}/{name}/per_problem.csv")
    tracker.log_table(result.samples, f"{artifact_dir}/{name}/samples.json")
    from tasks.tracking.plots import eval_curve, save_figures  # matplotlib: not at start-up

    rd = RunDir(run_dir) if run_dir else None
    start = {"step": 0, **before} if before else None
    figure = eval_curve(rd.read_validation() if rd else [], {"step": step, **result.metrics}, start)
    if rd:
        save_figures({"eval_curve.png": figure}, rd.plots)
    tracker.log_figure(figure, "plots/eval_curve.png")


def _stopped(tracker: Tracker, run_id: str | None) -> str:
    """An evaluation stopped by a signal ends its run KILLED: the training run it belongs to
    (``run_id``), as it would have had training been stopped, or its own."""
    with deferred_signals():  # the repeated signal of a terminal or a worker waits
        if tracker.active or (run_id and tracker.resume_run(run_id) is not None):
            tracker.end("KILLED")
    return "the evaluation was stopped before it finished"
