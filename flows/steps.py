"""The Prefect tasks of the pipeline: one coarse task per big step (curate, train, evaluate).

A Prefect task costs 12-33 ms here (DESIGN section 6), so a task is a whole training run or a whole
evaluation, never a training step. Each task opens (or re-attaches to) its MLflow run through
``tasks.tracking.tracker.Tracker`` and closes it, so every retry of a task logs to the same run.

Retries: a failed train task is retried by Prefect and *resumes* from the last checkpoint in its
run directory (which the flow fixes before the first attempt), so no finished step is redone and
no metric is logged twice. Errors a retry cannot fix (a bad config, missing data, a run stopped on
purpose) are not retried.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from dapo_core.config import Config
from tasks.orchestration import retry_unless_user_error, run_logger
from tasks.params import repo_path

MAX_SAMPLE_ROWS = 2000  # sample generations kept for the run's table
VALIDATION_FILE = "validation.jsonl"


@dataclasses.dataclass
class TrainSummary:
    run_dir: str
    model_path: str  # the final model, or the latest checkpoint's if the run is not complete
    steps: int
    complete: bool
    wall_time_s: float
    mlflow_run_id: str | None
    last_metrics: dict[str, float]
    resumed_from: int  # the checkpoint step this attempt started from (0 = from scratch)


def validation_problems(cfg: Config) -> list:
    """The validation set for in-training evaluation (empty when there is none).

    Curated data: ``<data.out_dir>/val.parquet``; the synthetic task: its validation split, carved
    out of the training problems (never trained on, disjoint from the test split)."""
    from tasks.data.problems import load_problems, synthetic_splits

    if cfg.data.val_size <= 0:
        return []
    if cfg.data.source.startswith("synthetic:"):
        return synthetic_splits(cfg)[1]
    path = repo_path(cfg.data.out_dir) / "val.parquet"
    return load_problems(path)[: cfg.data.val_size] if path.exists() else []


class TrainingMonitor:
    """The ``on_step`` hook of ``run_training``: validation every ``eval.every_n_steps`` steps
    (logged at the training step as ``val/...``) and the sample generations of each step."""

    def __init__(self, cfg: Config, tracker: Any, run_dir: Path, after_step: int, problems: list):
        self.cfg, self.tracker, self.after_step = cfg, tracker, after_step
        self.problems = problems
        self.path = Path(run_dir) / VALIDATION_FILE
        self.samples: list[dict[str, Any]] = []

    def __call__(self, trainer: Any, result: Any) -> None:
        step = trainer.step
        if step <= self.after_step:  # already done by an earlier attempt
            return
        if len(self.samples) < MAX_SAMPLE_ROWS:
            self.samples += result.samples[: MAX_SAMPLE_ROWS - len(self.samples)]
        every = self.cfg.eval.every_n_steps
        if every > 0 and step % every == 0 and self.problems:
            self.validate(trainer, step)

    def validate(self, trainer: Any, step: int) -> dict[str, float]:
        from tasks.evaluation.evaluate import evaluate_policy

        t0 = time.perf_counter()
        r = evaluate_policy(
            trainer.generator, trainer.tokenizer, self.problems, self.cfg, progress=False
        )
        metrics = {"val/" + k.split("/", 1)[-1]: v for k, v in r.metrics.items()}
        metrics["perf/val_time_s"] = time.perf_counter() - t0
        self.tracker.log_metrics(metrics, step)
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")
        return metrics


def read_validation(run_dir: str | Path) -> list[dict[str, Any]]:
    """Validation rows of a run directory, one per step (the latest attempt's)."""
    path = Path(run_dir) / VALIDATION_FILE
    if not path.exists():
        return []
    rows = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        rows[row["step"]] = row
    return [rows[s] for s in sorted(rows)]


@task(
    name="train",
    retries=1,
    retry_delay_seconds=2,
    retry_condition_fn=retry_unless_user_error,
    cache_policy=NO_CACHE,
    persist_result=False,
)
def train_task(
    cfg: Config,
    run_dir: str,
    kind: str = "train",
    run_name: str | None = None,
    variant: str | None = None,
    parent_run_id: str | None = None,
    max_steps: int | None = None,
    progress: bool = True,
    extra_tags: dict[str, str] | None = None,
) -> TrainSummary:
    """Train in ``run_dir``, continuing from its last checkpoint if it has one (a retry, or a
    scheduled run that trains a few more steps each night), and track it in MLflow."""
    from tasks.tracking.plots import save_figures, training_figures
    from tasks.tracking.tracker import Tracker, run_tags
    from tasks.training.run import run_training
    from tasks.training.trainer import list_checkpoints

    log = run_logger()
    path = Path(run_dir)
    ckpts = list_checkpoints(path)
    start = int(ckpts[-1].name.split("_")[-1]) if ckpts else 0
    if ckpts:
        log.info("train: continuing %s from its checkpoint at step %d", path, start)
    tracker = Tracker(cfg, kind)
    tags = {**run_tags(cfg, kind, variant, run_dir=str(path)), **(extra_tags or {})}
    tracker.start_or_resume(path, run_name or path.name, tags, parent_run_id)
    # Steps already in the MLflow run (an attempt that failed after its last checkpoint).
    logged = tracker.last_step("train/acc_mean")
    monitor = TrainingMonitor(cfg, tracker, path, logged, validation_problems(cfg))
    try:
        result = run_training(
            cfg,
            path,
            resume=bool(ckpts),
            sink=tracker.metrics_sink(after_step=logged),
            max_steps=max_steps,
            progress=progress,
            on_step=monitor,
        )
    except BaseException:
        tracker.end("FAILED")
        raise
    complete = result.steps >= cfg.train.steps
    figures = training_figures(result.history)
    validation = read_validation(path)
    if validation:
        from tasks.tracking.plots import eval_curve

        figures["eval_curve.png"] = eval_curve(validation)
    save_figures(figures, path / "plots")
    tracker.log_artifacts(path / "plots", "plots")
    tracker.log_table(monitor.samples, "samples/train_samples.json")
    tracker.set_tags({"train.steps_done": result.steps, "train.complete": str(complete).lower()})
    tracker.end("FINISHED")
    model = result.final_model if complete else list_checkpoints(path)[-1] / "model"
    last = {k: v for k, v in (result.history[-1] if result.history else {}).items() if k != "step"}
    log.info(
        "train: %d steps in %.1fs (%s); model %s; MLflow run %s",
        result.steps,
        result.wall_time_s,
        "complete" if complete else f"{cfg.train.steps - result.steps} to go",
        model,
        tracker.run_id,
    )
    return TrainSummary(
        str(path),
        str(model),
        result.steps,
        complete,
        result.wall_time_s,
        tracker.run_id,
        last,
        start,
    )


# ---------------------------------------------------------------------------------------------
# Evaluate
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class EvalSummary:
    eval_set: str
    metrics: dict[str, float]
    per_problem: Any  # pandas DataFrame
    wall_time_s: float
    mlflow_run_id: str | None


@task(
    name="evaluate",
    retries=1,
    retry_delay_seconds=2,
    retry_condition_fn=retry_unless_user_error,
    cache_policy=NO_CACHE,
    persist_result=False,
)
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
) -> EvalSummary:
    """Evaluate a model and log metrics (at ``step``), the per-problem table, sample responses and
    the evaluation curve: to run ``run_id`` (the training run it belongs to) or to a new run."""
    from tasks.evaluation.evaluate import evaluate_model
    from tasks.tracking.plots import eval_curve, save_figures
    from tasks.tracking.tracker import Tracker, run_tags

    log = run_logger()
    t0 = time.perf_counter()
    name, result = evaluate_model(cfg, model_path, eval_set, progress=progress)
    wall = time.perf_counter() - t0
    tracker = Tracker(cfg, kind)
    if run_id is None or tracker.resume_run(run_id) is None:
        model_name = "/".join(Path(model_path).parts[-2:]) if model_path else cfg.model.name_or_path
        tracker.start_run(f"eval {name} {model_name}", run_tags(cfg, kind))
    with tracker:
        model_tag = model_path or cfg.model.name_or_path
        tracker.set_tags({"eval.set": name, "eval.model": model_tag, **(extra_tags or {})})
        tracker.log_metrics({**result.metrics, "perf/eval_time_s": wall}, step)
        tracker.log_frame(result.per_problem, f"eval/{name}/per_problem.csv")
        tracker.log_table(result.samples, f"eval/{name}/samples.json")
        figure = eval_curve(
            read_validation(run_dir) if run_dir else [], {"step": step, **result.metrics}
        )
        if run_dir:
            save_figures({"eval_curve.png": figure}, Path(run_dir) / "plots")
        tracker.log_figure(figure, "plots/eval_curve.png")
    m = result.metrics
    log.info(
        "evaluate: %s avg@%d %.4f (95%% CI %.4f-%.4f) in %.1fs",
        name,
        cfg.eval.n_samples,
        m["eval/avg_at_k"],
        m["eval/avg_at_k_ci_low"],
        m["eval/avg_at_k_ci_high"],
        wall,
    )
    return EvalSummary(name, result.metrics, result.per_problem, wall, tracker.run_id)
