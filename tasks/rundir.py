"""A run directory: everything one training run writes, and where an interrupted run picks up.

::

    <run>/config.json            the resolved config (``dapo train --resume`` reads it back)
    <run>/metrics.jsonl          one row per training step: {"step": N, "train/...": ...}
    <run>/validation.jsonl       one row per validation: {"step": N, "val/...": ...}
    <run>/checkpoints/step_N/    model/, optimizer_rank*.pt, trainer.pt, then COMPLETE (last)
    <run>/final/                 the trained model, once ``train.steps`` steps are done
    <run>/mlflow_run.json        the MLflow run this directory logs to (every attempt uses it)
    <run>/plots/                 the run's figures

The resume rule, in one place: an attempt continues from the latest *complete* checkpoint and
redoes the steps after it. Steps up to :attr:`ResumePoint.logged_through` were already recorded
by an earlier attempt (in ``metrics.jsonl``, in MLflow, in ``validation.jsonl``), so no sink
records them again; exact resume makes the redone steps' values the same anyway.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dapo_core.errors import PipelineError

CHECKPOINT_PREFIX = "step_"
COMPLETE = "COMPLETE"  # written last into a checkpoint: a directory without it is half-written


@dataclass(frozen=True)
class ResumePoint:
    """Where an attempt starts: the checkpoint it loads and the last step already recorded."""

    step: int  # the checkpoint's step (0: from scratch)
    checkpoint: Path | None
    logged_through: int  # steps <= this are in the metrics file already: record none again


class RunDir:
    """One run directory (see the module docstring for its layout)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def __str__(self) -> str:
        return str(self.path)

    @property
    def name(self) -> str:
        return self.path.name

    config_file = property(lambda self: self.path / "config.json")
    metrics_file = property(lambda self: self.path / "metrics.jsonl")
    validation_file = property(lambda self: self.path / "validation.jsonl")
    checkpoints_dir = property(lambda self: self.path / "checkpoints")
    final = property(lambda self: self.path / "final")
    plots = property(lambda self: self.path / "plots")
    mlflow_file = property(lambda self: self.path / "mlflow_run.json")

    # -- starting an attempt -------------------------------------------------------------------

    def used(self) -> bool:
        """True once a run has written here (its config, a metric or a checkpoint)."""
        return any(p.exists() for p in (self.config_file, self.metrics_file, self.checkpoints_dir))

    def resume_point(self) -> ResumePoint:
        ckpt = self.latest_checkpoint()
        logged = max((row["step"] for row in self.read_metrics()), default=0)
        return ResumePoint(checkpoint_step(ckpt) if ckpt else 0, ckpt, logged)

    def refuse_unless(self, resume: bool) -> None:
        """A used directory is continued only on request (every rank checks, before any writes)."""
        if not resume and self.used():
            raise FileExistsError(
                f"{self.path} already holds a run: continue it with --resume {self.path}, "
                "or pick another --run-dir"
            )

    def check_writable(self) -> None:
        """A one-line error now, rather than a traceback after a run has been opened."""
        probe = self.path / ".write-test"
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            probe.write_text("")
            probe.unlink()
        except OSError as e:
            raise PipelineError(
                f"cannot write to the run directory {self.path} ({e.strerror or e}); pick a "
                "writable one with --run-dir, or set train.out_dir"
            ) from None

    def describe_stop(self, steps: int, resume_hint: str) -> str:
        """Where a stopped run stands and how to continue it."""
        ckpt = self.latest_checkpoint()
        done = max((row["step"] for row in self.read_metrics()), default=0)
        saved = f"step {checkpoint_step(ckpt)} ({ckpt})" if ckpt else "none yet"
        redo = f"; steps after {checkpoint_step(ckpt) if ckpt else 0} are redone" if done else ""
        return (
            f"stopped after step {done} of {steps}; last checkpoint: {saved}. "
            f"Continue with: {resume_hint}{redo}"
        )

    def write_config(self, config: dict[str, Any]) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(json.dumps(config, indent=2))

    def read_config(self) -> dict[str, Any]:
        if not self.config_file.exists():
            raise FileNotFoundError(f"{self.path} is not a run directory (no config.json)")
        return json.loads(self.config_file.read_text())

    # -- per-step records ----------------------------------------------------------------------

    def append_metrics(self, step: int, metrics: dict[str, float]) -> None:
        _append_row(self.metrics_file, {"step": step, **metrics})

    def read_metrics(self) -> list[dict[str, Any]]:
        return _read_rows(self.metrics_file)

    def append_validation(self, step: int, metrics: dict[str, float]) -> None:
        _append_row(self.validation_file, {"step": step, **metrics})

    def read_validation(self) -> list[dict[str, Any]]:
        return _read_rows(self.validation_file)

    # -- checkpoints ---------------------------------------------------------------------------

    def checkpoints(self) -> list[Path]:
        """Complete checkpoints, oldest first."""
        if not self.checkpoints_dir.exists():
            return []
        found = self.checkpoints_dir.glob(CHECKPOINT_PREFIX + "*")
        return sorted(p for p in found if (p / COMPLETE).exists())

    def latest_checkpoint(self) -> Path | None:
        found = self.checkpoints()
        return found[-1] if found else None

    def staging_checkpoint(self, step: int) -> Path:
        """The temporary directory a checkpoint is written into before :meth:`commit_checkpoint`."""
        return self.checkpoints_dir / f".tmp-{CHECKPOINT_PREFIX}{step:06d}"

    def commit_checkpoint(self, step: int, keep: int) -> Path:
        """Mark the staged checkpoint complete, move it into place and keep the last ``keep``."""
        staged, final = self.staging_checkpoint(step), self.checkpoints_dir / _ckpt_name(step)
        (staged / COMPLETE).write_text(json.dumps({"step": step}))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(staged, final)
        for old in self.checkpoints()[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
        return final

    # -- the MLflow run ------------------------------------------------------------------------

    def mlflow_run(self) -> dict[str, str] | None:
        """``{"run_id", "tracking_uri"}`` of the MLflow run an earlier attempt logged to."""
        if not self.mlflow_file.exists():
            return None
        return json.loads(self.mlflow_file.read_text())

    def record_mlflow_run(self, run_id: str, uri: str) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        self.mlflow_file.write_text(json.dumps({"run_id": run_id, "tracking_uri": uri}))


def checkpoint_step(path: Path) -> int:
    """The step of a checkpoint directory (``step_000012`` -> 12)."""
    return int(Path(path).name.removeprefix(CHECKPOINT_PREFIX))


def _ckpt_name(step: int) -> str:
    return f"{CHECKPOINT_PREFIX}{step:06d}"


def _append_row(path: Path, row: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")


def _read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSONL record, one per step (a later row for a step replaces an earlier one)."""
    if not path.exists():
        return []
    rows = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            rows[row["step"]] = row
    return [rows[s] for s in sorted(rows)]
