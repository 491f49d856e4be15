"""Running a training job: load data and model, step the trainer, checkpoint, resume.

``run_training`` is what ``dapo train`` and the Prefect train task call. A run lives in a run
directory (``train.out_dir/<run name>``) holding its resolved config, per-step metrics
(``metrics.jsonl``), checkpoints and the final model; ``resume=True`` continues from the latest
complete checkpoint so that the continued run matches an uninterrupted one step for step.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from dapo_core.config import Config
from dapo_core.problem import Problem
from tasks.models.loading import load_policy, resolve_model_path
from tasks.params import repo_path
from tasks.rollout.generators import HFGenerator, VLLMGenerator
from tasks.runtime import configure_torch
from tasks.training.distributed import barrier, init_distributed
from tasks.training.trainer import DAPOTrainer, MetricsSink, StepResult, list_checkpoints


@dataclasses.dataclass
class TrainResult:
    run_dir: Path
    final_model: Path
    steps: int
    history: list[dict[str, float]]
    wall_time_s: float


def training_problems(cfg: Config) -> list[Problem]:
    """The training split named by ``data.source``."""
    if cfg.data.source.startswith("synthetic:"):
        from tasks.data.problems import synthetic_splits

        return synthetic_splits(cfg)[0]
    from tasks.data.problems import load_problems

    return load_problems(repo_path(cfg.data.out_dir) / "train.parquet")


def make_generator(cfg: Config, model, tokenizer, model_path: str):
    if cfg.rollout.backend == "vllm":
        return VLLMGenerator(
            model_path,
            tokenizer,
            cfg.rollout.max_prompt_len,
            cfg.rollout.max_prompt_len + cfg.rollout.max_response_len,
            gpu_memory=cfg.rollout.vllm_gpu_memory,
        )
    return HFGenerator(model, tokenizer, cfg.rollout.max_prompt_len)


class JsonlSink:
    """Per-step metrics appended to ``metrics.jsonl`` (then forwarded to another sink, if any)."""

    def __init__(self, path: Path, forward: MetricsSink | None = None):
        self.path, self.forward = path, forward
        self.history: list[dict[str, float]] = []

    def __call__(self, metrics: dict[str, float], step: int) -> None:
        row = {"step": step, **metrics}
        self.history.append(row)
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self.forward:
            self.forward(metrics, step)


def run_training(
    cfg: Config,
    run_dir: Path,
    resume: bool = False,
    sink: MetricsSink | None = None,
    max_steps: int | None = None,
    progress: bool = True,
    on_step: Callable[[DAPOTrainer, StepResult], None] | None = None,
) -> TrainResult:
    """Train for ``train.steps`` steps (or stop after ``max_steps`` more, e.g. to test resume).

    ``on_step(trainer, result)`` runs after every step (after that step's checkpoint, if any):
    the flows use it for validation every ``eval.every_n_steps`` and to collect sample generations.
    """
    t0 = time.perf_counter()
    run_dir = Path(run_dir)
    device = configure_torch(cfg.train.cpu_threads)
    rank, world = init_distributed(device)  # several ranks under the deepspeed launcher
    ckpts = list_checkpoints(run_dir)
    if not resume and ckpts:
        raise FileExistsError(
            f"{run_dir} already holds checkpoints; pass --resume to continue it or pick a new run"
        )
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
        model_path = resolve_model_path(cfg)  # may build the embedded model: one rank does it
    barrier(world)
    model_path = resolve_model_path(cfg)
    model, tokenizer = load_policy(model_path, "float32", device)
    if cfg.model.gradient_checkpointing:
        model.activation_checkpointing_enable()
    metrics_path = run_dir / "metrics.jsonl"
    jsonl = JsonlSink(metrics_path, sink)
    trainer = DAPOTrainer(
        cfg,
        model,
        tokenizer,
        make_generator(cfg, model, tokenizer, model_path),
        training_problems(cfg),
        run_dir,
        jsonl,
    )
    if resume and ckpts:
        trainer.load_checkpoint(ckpts[-1])
        if rank == 0:
            _truncate_metrics(metrics_path, trainer.step)
    elif metrics_path.exists() and rank == 0:
        metrics_path.unlink()
    end = cfg.train.steps if max_steps is None else min(cfg.train.steps, trainer.step + max_steps)
    every = cfg.train.checkpoint_every
    with Progress(
        TextColumn("[bold]train"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        disable=not progress,
    ) as bar:
        task = bar.add_task("", total=cfg.train.steps, completed=trainer.step)
        while trainer.step < end:
            result = trainer.train_step()
            m = result.metrics
            bar.update(
                task,
                completed=trainer.step,
                description=(
                    f"acc {m['train/acc_mean']:.2f} "
                    f"kept {m['train/kept_group_frac']:.2f} {m['perf/step_time_s']:.2f}s/step"
                ),
            )
            if every and trainer.step % every == 0 and trainer.step < cfg.train.steps:
                trainer.save_checkpoint()
            if on_step:
                on_step(trainer, result)
    trainer.save_checkpoint()
    final = run_dir / "final"
    weights = trainer.engine.full_state_dict()  # a collective under ZeRO-3: all ranks call it
    if trainer.step >= cfg.train.steps and rank == 0:
        model.save_pretrained(final, state_dict=weights)
        tokenizer.save_pretrained(final)
    barrier(world)
    history = [json.loads(x) for x in metrics_path.read_text().splitlines()] if rank == 0 else []
    return TrainResult(run_dir, final, trainer.step, history, time.perf_counter() - t0)


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop metric rows logged after the checkpoint we resume from (they will be redone)."""
    if not path.exists():
        return
    rows = [r for r in path.read_text().splitlines() if json.loads(r)["step"] <= step]
    path.write_text("".join(r + "\n" for r in rows))
