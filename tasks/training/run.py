"""Running a training job: load data and model, step the trainer, checkpoint, resume.

``run_training`` is what the Prefect train task (``tasks.training.task``) and a multi-rank
``dapo train`` call. It works in a ``RunDir``: the directory's resume rule (continue from the
latest complete checkpoint; record no step twice) is the one this function follows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from dapo_core.config import Config
from dapo_core.config_checks import doubtful_settings
from dapo_core.errors import PipelineError
from dapo_core.problem import Problem
from tasks.data.splits import splits
from tasks.models.loading import HandedPolicy, load_policy, save_model_dir
from tasks.models.resolve import resolve_model_path
from tasks.orchestration import run_logger
from tasks.rollout.factory import make_generator
from tasks.rundir import ResumePoint, RunDir
from tasks.runtime import configure_torch, env_world_size
from tasks.training import checkpoint, probe
from tasks.training.distributed import (
    all_gather_objects,
    all_ranks_true,
    barrier,
    init_distributed,
    is_rollout_rank,
    sampling_ranks,
)
from tasks.training.rollout_process import RolloutSpec, serve_rollout_rank
from tasks.training.trainer import DAPOTrainer, MetricsSink, StepResult


@dataclasses.dataclass
class TrainResult:
    run_dir: RunDir
    steps: int
    history: list[dict[str, float]]
    wall_time_s: float
    start: ResumePoint  # where this attempt started

    @property
    def final_model(self) -> Path:
        return self.run_dir.final


def weights_dtype(cfg: Config, world: int) -> str:
    """The dtype the policy's weights are loaded in for training (``model.dtype``). On one
    process bf16 weights train through float32 master copies (``tasks.training.precision``);
    several ranks load float32 and DeepSpeed's bf16 mode keeps its own master copies. float16
    would need loss scaling, which this trainer does not do: it trains float32 weights (float16
    still applies to evaluation)."""
    if world > 1 or cfg.model.dtype == "float16":
        return "float32"
    return cfg.model.dtype


def recording_sink(run_dir: RunDir, after: int, forward: MetricsSink | None) -> MetricsSink:
    """Append each step's metrics to the run directory, then pass them on; steps <= ``after``
    were recorded by an earlier attempt and are skipped (the run directory's resume rule)."""

    def sink(metrics: dict[str, float], step: int) -> None:
        if step <= after:
            return
        run_dir.append_metrics(step, metrics)
        if forward:
            forward(metrics, step)

    return sink


def run_training(
    cfg: Config,
    run_dir: RunDir,
    resume: bool = False,
    sink: MetricsSink | None = None,
    max_steps: int | None = None,
    progress: bool = True,
    on_step: Callable[[DAPOTrainer, StepResult], None] | None = None,
    problems: list[Problem] | None = None,
    policy: HandedPolicy | None = None,
) -> TrainResult:
    """Train for ``train.steps`` steps (or stop after ``max_steps`` more, e.g. nightly).

    ``sink(metrics, step)`` receives each step's metrics once (MLflow); ``on_step(trainer,
    result)`` runs after every step, after that step's checkpoint if any (validation, samples).
    ``resume``: continue the run already in ``run_dir``; without it a used directory is refused.
    ``problems``: the training split, when the caller has read it already; ``policy``: the
    starting policy, when the caller has loaded it already (the preflight).
    The run directory is held as its one writer throughout (rank 0 holds it for all ranks).
    """
    t0 = time.perf_counter()
    device = configure_torch(cfg.train.cpu_threads)
    rollout_ranks = sampling_ranks(cfg.train.rollout_ranks)
    if rollout_ranks and env_world_size() - rollout_ranks > 1 and cfg.train.zero_stage == 3:
        raise PipelineError(  # every rank says so, before any group is formed
            "train.zero_stage=3 with rollout ranks: DeepSpeed's ZeRO-3 waits at barriers of the "
            "whole world, which the rollout ranks never reach; set train.zero_stage=2 (or 1)"
        )
    rank, world = init_distributed(device, rollout_ranks)  # several ranks under a launcher
    if rollout_ranks and is_rollout_rank(rollout_ranks):  # this rank samples for the trainers
        serve_rollout_rank(device)
        return TrainResult(run_dir, 0, [], time.perf_counter() - t0, ResumePoint(0, None, 0))
    probe.check_world(cfg.tracking.switch_probe, world)  # before anything is written
    with _writer(run_dir, rank, world):
        run_dir.refuse_unless(resume)
        barrier(world)  # every rank has checked before rank 0 writes
        trainer, start = _start(cfg, run_dir, device, (rank, world), sink, problems, policy)
        try:
            end = cfg.train.steps if max_steps is None else trainer.step + max_steps
            _steps(trainer, run_dir, min(end, cfg.train.steps), progress and rank == 0, on_step)
            checkpoint.save_checkpoint(trainer, run_dir)
            _save_final(trainer, run_dir)
        finally:
            trainer.close()  # the rollout process, if any, ends with the run whatever ended it
        history = run_dir.read_metrics() if rank == 0 else []
    return TrainResult(run_dir, trainer.step, history, time.perf_counter() - t0, start)


@contextlib.contextmanager
def _writer(run_dir: RunDir, rank: int, world: int) -> Iterator[None]:
    """Hold ``run_dir`` as its one writer: rank 0 takes the lock and every rank learns whether
    it did, so that no rank waits at a barrier for one that gave up."""
    with contextlib.ExitStack() as stack:
        refused: PipelineError | None = None
        if rank == 0:
            try:
                stack.enter_context(run_dir.writer())
            except PipelineError as e:
                refused = e
        if not all_ranks_true(refused is None, world):
            raise refused or PipelineError(f"rank 0 could not take {run_dir}: see its message")
        yield


def _start(
    cfg: Config,
    run_dir: RunDir,
    device: str,
    ranks: tuple[int, int],
    sink: MetricsSink | None,
    problems: list[Problem] | None,
    policy: HandedPolicy | None = None,
) -> tuple[DAPOTrainer, ResumePoint]:
    """Write the config, load the policy and restore the latest intact checkpoint, if any."""
    rank, world = ranks
    if rank == 0:
        run_dir.write_config(cfg.to_dict())
        resolve_model_path(cfg)  # may build the embedded model: one rank does it
    barrier(world)
    start = _resume_point(run_dir, rank, world)
    model_path = resolve_model_path(cfg)
    # a checkpoint's weights replace the starting ones below: the handed policy serves either way
    model, tokenizer = load_policy(model_path, weights_dtype(cfg, world), device, policy)
    if cfg.model.gradient_checkpointing:
        model.activation_checkpointing_enable()
    generator = make_generator(cfg, model, tokenizer, model_path)
    record = recording_sink(run_dir, start.logged_through, sink)
    train = problems if problems is not None else splits(cfg).train  # read once per task
    if rank == 0:
        for line in doubtful_settings(cfg, len(train)):
            run_logger().warning("train: %s", line)
    spec = RolloutSpec(cfg, model_path, weights_dtype(cfg, world), device, train)
    trainer = DAPOTrainer(cfg, model, tokenizer, generator, train, record, rollout_spec=spec)
    if start.checkpoint:
        checkpoint.load_checkpoint(trainer, start.checkpoint)
    return trainer, start


def _resume_point(run_dir: RunDir, rank: int, world: int) -> ResumePoint:
    """Rank 0 checks the checkpoints' files (reading each once) and sets damaged ones aside;
    every rank resumes from the checkpoint it chose."""
    start = run_dir.resume_point() if rank == 0 else None
    if rank == 0 and start.damaged:
        run_dir.set_aside(start.damaged)
    return all_gather_objects(start, world)[0]


def _steps(
    trainer: DAPOTrainer,
    run_dir: RunDir,
    end: int,
    progress: bool,
    on_step: Callable[[DAPOTrainer, StepResult], None] | None,
) -> None:
    """Train up to step ``end``, with a checkpoint every ``train.checkpoint_every`` steps."""
    cfg = trainer.cfg
    with _progress_bar(progress) as bar:
        task = bar.add_task("", total=cfg.train.steps, completed=trainer.step)
        while trainer.step < end:
            result = trainer.train_step()
            bar.update(task, completed=trainer.step, description=_describe_step(result.metrics))
            every = cfg.train.checkpoint_every
            if every and trainer.step % every == 0 and trainer.step < cfg.train.steps:
                checkpoint.save_checkpoint(trainer, run_dir)
            if on_step:
                on_step(trainer, result)


def _save_final(trainer: DAPOTrainer, run_dir: RunDir) -> None:
    """``final/``: the trained model, once all ``train.steps`` are done."""
    weights = trainer.engine.full_state_dict()  # a collective under ZeRO-3: all ranks call it
    if trainer.step >= trainer.cfg.train.steps and trainer.rank == 0:
        save_model_dir(trainer.model, trainer.tokenizer, run_dir.final, weights)
    barrier(trainer.world)


def _progress_bar(enabled: bool) -> Progress:
    return Progress(
        TextColumn("[bold]train"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        disable=not enabled,
    )


def _describe_step(m: dict[str, float]) -> str:
    return (
        f"acc {m['train/acc_mean']:.2f} kept {m['train/kept_group_frac']:.2f} "
        f"{m['perf/step_time_s']:.2f}s/step"
    )
