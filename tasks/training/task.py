"""The Prefect task of the training stage: a whole training run, tracked in MLflow.

Each attempt opens (or re-attaches to) the MLflow run recorded in the run directory, so a retried
task, or a later flow run continuing the same run name (the nightly schedule), logs to one run.
A failed attempt is retried by Prefect and resumes from the last checkpoint (the flow fixes the
run directory before the first attempt); no step is recorded twice (``tasks.rundir``).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from dapo_core import metric_names as metric
from dapo_core.config import Config
from dapo_core.errors import TrainingInterrupted
from tasks.data.splits import Splits, splits
from tasks.data.version import problems_digest
from tasks.evaluation.evaluate import evaluate_policy
from tasks.models import shipped
from tasks.models.build import model_dir_digest
from tasks.models.resolve import resolve_model_path
from tasks.orchestration import (
    concurrency_slot,
    interrupts,
    run_logger,
    stage_task,
)
from tasks.rundir import ResumePoint, RunDir
from tasks.runtime import configure_torch
from tasks.signals import deferred_signals
from tasks.tracking.provenance import data_source, run_tags
from tasks.tracking.tracker import Tracker
from tasks.training.preflight import PreflightResult
from tasks.training.run import TrainResult, run_training

MAX_SAMPLE_ROWS = 2000  # sample generations kept for the run's table


def resume_hint(kind: str, rd: RunDir, tags: dict[str, str] | None = None) -> str:
    """The command that continues a stopped run of this kind (``tags``: the run's extra tags;
    a reproduction is continued by the command that reads the original's config)."""
    if (tags or {}).get("reproduces"):
        return f"dapo reproduce {tags['reproduces']} --run-name {rd.name}"
    if kind == "pipeline":  # the run's own settings, which a bare --run-name would not give
        return f"dapo pipeline --run-name {rd.name} with the same -c and -S"
    if kind == "ablate":
        return "dapo ablate with the same --run-name (finished variants are kept)"
    if kind == "compare":
        return "dapo compare with the same --run-name (finished runs are kept)"
    return f"dapo train --resume {rd}"


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
    mlflow_url: str | None = None  # the run's page in the MLflow UI (training view)


class TrainingMonitor:
    """The ``on_step`` hook of ``run_training``: validation every ``eval.every_n_steps`` steps
    (logged at the training step as ``val/...``), the sample generations of each step, and a
    flush of buffered metrics at each checkpoint (so MLflow is never behind a checkpoint)."""

    def __init__(
        self, cfg: Config, tracker: Tracker, run_dir: RunDir, logged_through: int, problems: list
    ):
        self.cfg, self.tracker, self.run_dir = cfg, tracker, run_dir
        self.logged_through = logged_through
        self.problems = problems  # the validation split
        self.samples: list[dict[str, Any]] = []

    def __call__(self, trainer: Any, result: Any) -> None:
        step = trainer.step
        ckpt_every = self.cfg.train.checkpoint_every
        if ckpt_every and step % ckpt_every == 0:
            self.tracker.flush()
        if step <= self.logged_through:  # recorded by an earlier attempt
            return
        if len(self.samples) < MAX_SAMPLE_ROWS:
            self.samples += result.samples[: MAX_SAMPLE_ROWS - len(self.samples)]
        every = self.cfg.eval.every_n_steps
        if every > 0 and step % every == 0 and self.problems:
            self.validate(trainer, step)

    def validate(self, trainer: Any, step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        r = evaluate_policy(
            trainer.sampler(), trainer.tokenizer, self.problems, self.cfg, progress=False
        )
        metrics = r.as_validation
        metrics[metric.VAL_TIME] = time.perf_counter() - t0
        self.tracker.log_metrics(metrics, step)
        self.run_dir.append_validation(step, metrics)
        return metrics


@stage_task("train", retries=1, retry_delay_seconds=2)
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
    resume: bool = True,
    track: bool = True,
    preflight: PreflightResult | None = None,
) -> TrainSummary:
    """Train in ``run_dir``, continuing from its last checkpoint if it has one (a retry, or a
    scheduled run that trains a few more steps each night), and track it in MLflow.
    ``resume=False`` refuses a directory that already holds a run; ``track=False`` opens no
    MLflow run (every tracker call is then a no-op). A directory another live process writes
    is refused before anything is written or tracked."""
    rd = RunDir(run_dir)
    with rd.writer():  # the one writer: first, so a refused attempt opens no MLflow run
        return _train(
            cfg,
            rd,
            kind=kind,
            run_name=run_name,
            variant=variant,
            parent_run_id=parent_run_id,
            max_steps=max_steps,
            progress=progress,
            extra_tags=extra_tags,
            resume=resume,
            track=track,
            preflight=preflight,
        )


def _train(
    cfg: Config,
    rd: RunDir,
    *,
    kind: str,
    run_name: str | None,
    variant: str | None,
    parent_run_id: str | None,
    max_steps: int | None,
    progress: bool,
    extra_tags: dict[str, str] | None,
    resume: bool,
    track: bool,
    preflight: PreflightResult | None,
) -> TrainSummary:
    rd.refuse_unless(resume)  # before an MLflow run is opened
    rd.refuse_other_settings(cfg)
    rd.check_writable()
    rd.record_tracking(track)
    start = rd.resume_point()
    _say_where_it_continues(rd, start)
    tracker = Tracker(cfg, kind)
    data = splits(cfg)
    digests = _starting_digests(cfg, data)
    tags = {**run_tags(cfg, kind, variant, run_dir=str(rd)), **digests, **(extra_tags or {})}
    try:  # every way out of here ends the MLflow run: FINISHED, KILLED or FAILED
        if track:
            _open_run(tracker, cfg, rd, run_name or rd.name, tags, parent_run_id)
        if preflight is not None:  # what the starting policy could learn from, at step 0
            _log_preflight(tracker, preflight)
        monitor = TrainingMonitor(cfg, tracker, rd, start.logged_through, data.val)
        result = _run_in_slot(cfg, rd, tracker, monitor, data, max_steps, progress, preflight)
        complete = result.steps >= cfg.train.steps
        _log_outcome(tracker, rd, result, monitor, complete)
    except interrupts():
        with deferred_signals():  # the repeated signal of a terminal or a worker waits
            tracker.end("KILLED")
        raise TrainingInterrupted(
            rd.describe_stop(cfg.train.steps, resume_hint(kind, rd, extra_tags))
        ) from None
    except BaseException:
        tracker.end("FAILED")
        raise
    tracker.end("FINISHED")
    return _summary(cfg, rd, tracker, result, complete, start.step)


def _say_where_it_continues(rd: RunDir, start: ResumePoint) -> None:
    if start.checkpoint is None and start.logged_through:  # stopped before its first checkpoint
        run_logger().warning(
            "train: %s has no complete checkpoint: it starts again from step 0 (steps 1-%d "
            "are redone)",
            rd,
            start.logged_through,
        )
    if start.checkpoint:
        redo = start.logged_through - start.step
        run_logger().info(
            "train: continuing %s from its checkpoint at step %d%s",
            rd,
            start.step,
            f"; steps {start.step + 1}-{start.logged_through} are redone" if redo > 0 else "",
        )


def _starting_digests(cfg: Config, data: Splits) -> dict[str, str]:
    """The tags that say what the run starts from: its data splits and its model (built first
    if need be: a fresh clone's first run too)."""
    digests = {
        "data.train_digest": problems_digest(data.train),
        "data.val_digest": problems_digest(data.val),
    }
    # with the run's thread count: a build on every core beside a sweep's other workers crawls
    configure_torch(cfg.train.cpu_threads)
    model_path = resolve_model_path(cfg)
    model_digest = model_dir_digest(model_path)
    if model_digest:  # None for a hub id
        digests["model.digest"] = model_digest
    if shipped.is_shipped(model_path):  # the project's released starting checkpoint
        digests["model.shipped"] = Path(model_path).name
    return digests


def _open_run(
    tracker: Tracker,
    cfg: Config,
    rd: RunDir,
    name: str,
    tags: dict[str, str],
    parent_run_id: str | None,
) -> None:
    tracker.start_or_resume(rd, name, tags, parent_run_id)
    tracker.start_system_metrics(cfg.tracking.system_metrics_s)
    source = data_source(cfg)
    tracker.log_datasets(
        [
            (f"{cfg.data.source} train", tags["data.train_digest"], "training", source),
            (f"{cfg.data.source} val", tags["data.val_digest"], "validation", source),
        ]
    )


def _log_preflight(tracker: Tracker, preflight: PreflightResult) -> None:
    tracker.log_metrics(preflight.metrics(), 0)
    tracker.log_table(preflight.samples, "preflight/samples.json")
    if preflight.problem:
        tracker.set_tags({"preflight.warning": preflight.problem})


def _run_in_slot(
    cfg: Config,
    rd: RunDir,
    tracker: Tracker,
    monitor: TrainingMonitor,
    data: Splits,
    max_steps: int | None,
    progress: bool,
    preflight: PreflightResult | None,
) -> TrainResult:
    """The training itself, once the run's concurrency slot is free (e.g. one run per GPU), on
    the policy the preflight loaded when there was one."""
    handed = preflight.policy if preflight is not None else None
    try:
        with concurrency_slot(cfg.train.concurrency_limit):
            return run_training(
                cfg,
                rd,
                resume=True,
                sink=tracker.log_metrics,
                max_steps=max_steps,
                progress=progress,
                on_step=monitor,
                problems=data.train,
                policy=handed,
            )
    finally:
        if handed is not None:  # taken by the training, or never to be: held no longer
            handed.drop()


def _log_outcome(
    tracker: Tracker, rd: RunDir, result: TrainResult, monitor: TrainingMonitor, complete: bool
) -> None:
    _log_run_artifacts(tracker, rd, result.history, monitor.samples)
    if complete:  # the policy to use, on the Models page (evaluations link their metrics)
        tracker.log_model(rd.final, result.steps)
    tracker.set_tags(
        {
            "train.steps_done": result.steps,
            "train.complete": str(complete).lower(),
            "train.wall_s": f"{result.wall_time_s:.2f}",
        }
    )


def _summary(
    cfg: Config,
    rd: RunDir,
    tracker: Tracker,
    result: TrainResult,
    complete: bool,
    resumed_from: int,
) -> TrainSummary:
    model = rd.final if complete else rd.latest_checkpoint() / "model"
    last = {k: v for k, v in (result.history[-1] if result.history else {}).items() if k != "step"}
    run_logger().info(
        "train: %d steps in %.1fs (%s); model %s%s",
        result.steps,
        result.wall_time_s,
        "complete" if complete else f"{cfg.train.steps - result.steps} to go",
        model,
        f"; MLflow run {tracker.run_id}" if tracker.run_id else " (not tracked)",
    )
    return TrainSummary(
        str(rd),
        str(model),
        result.steps,
        complete,
        result.wall_time_s,
        tracker.run_id,
        last,
        resumed_from,
        tracker.run_url(),
    )


def _log_run_artifacts(
    tracker: Tracker, rd: RunDir, history: list[dict[str, Any]], samples: list[dict[str, Any]]
) -> None:
    """The run's figures (also saved under ``plots/``) and its table of sample generations."""
    # matplotlib is imported here, not at start-up: only the end of a run draws
    from tasks.tracking.plots import eval_curve, save_figures, training_figures

    figures = training_figures(history)
    validation = rd.read_validation()
    if validation:
        figures["eval_curve.png"] = eval_curve(validation)
    save_figures(figures, rd.plots)
    tracker.log_artifacts(rd.plots, "plots")
    tracker.log_table(samples, "samples/train_samples.json")
