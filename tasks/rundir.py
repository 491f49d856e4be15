"""A run directory: everything one training run writes, and where an interrupted run picks up.

::

    <run>/config.json            the resolved config (``dapo train --resume`` reads it back)
    <run>/metrics.jsonl          one row per training step: {"step": N, "train/...": ...}
    <run>/validation.jsonl       one row per validation: {"step": N, "val/...": ...}
    <run>/checkpoints/step_N/    model/, optimizer_rank*.pt, trainer.pt, then COMPLETE (last:
                                 every file's size and CRC-32, checked before a resume)
    <run>/final/                 the trained model, once ``train.steps`` steps are done
    <run>/mlflow_run.json        the MLflow run this directory logs to (every attempt uses it)
    <run>/plots/                 the run's figures
    <run>/.lock                  flock'ed by the one process that writes here; names its pid

The resume rule, in one place: an attempt continues from the latest *complete* checkpoint and
redoes the steps after it. Steps up to :attr:`ResumePoint.logged_through` were already recorded
by an earlier attempt (in ``metrics.jsonl``, in MLflow, in ``validation.jsonl``), so no sink
records them again; exact resume makes the redone steps' values the same anyway. A checkpoint
whose files no longer match its record (truncated, corrupt) is passed over, with a warning, for
the one before it.

One writer per directory: :meth:`RunDir.writer` holds an advisory lock on ``.lock`` for as long
as a process writes here, and refuses a second one (``tasks/run_lock.py``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dapo_core.config import Config, flat_settings
from dapo_core.errors import PipelineError
from tasks.durable import (
    FOLDER_NAME_RULE,
    append_row,
    check_sealed,
    fsync_dir,
    is_folder_name,
    publish_dir,
    read_rows,
    relative,
    replace_atomically,
    seal_files,
    write_synced,
)
from tasks.run_lock import LOCK_FILE, acquire, release

log = logging.getLogger(__name__)

CHECKPOINT_PREFIX = "step_"
COMPLETE = "COMPLETE"  # written last into a checkpoint: a directory without it is half-written
DAMAGED_PREFIX = ".damaged-"  # a checkpoint set aside: never resumed from, never pruned
REPRODUCED_CONFIG = "logged_config.json"  # what `dapo reproduce` puts in a run's folder first
# What a folder may hold before its run writes config.json (a first attempt's early files).
_BEFORE_CONFIG = {LOCK_FILE, ".write-test", REPRODUCED_CONFIG, "untracked", "mlflow_run.json"}


def check_run_name(name: str | None) -> None:
    """A run name is one folder under ``train.out_dir`` (``../x``, ``/abs``, ``a/b``: refused)."""
    if name is not None and not is_folder_name(name):
        raise PipelineError(
            f"--run-name {name!r}: a run name is {FOLDER_NAME_RULE}, under train.out_dir "
            "(elsewhere: dapo train --run-dir DIR, -S train.out_dir=DIR)"
        )


@dataclass(frozen=True)
class ResumePoint:
    """Where an attempt starts: the checkpoint it loads and the last step already recorded."""

    step: int  # the checkpoint's step (0: from scratch)
    checkpoint: Path | None
    logged_through: int  # steps <= this are in the metrics file already: record none again
    damaged: tuple[Path, ...] = ()  # later checkpoints passed over: their files are damaged


class RunDir:
    """One run directory (see the module docstring for its layout)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._checked: dict[tuple[Path, int], str | None] = {}  # checksums are read once
        self._warned: set[Path] = set()

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def __str__(self) -> str:
        return str(self.path)

    name = property(lambda self: self.path.name)
    config_file = property(lambda self: self.path / "config.json")
    metrics_file = property(lambda self: self.path / "metrics.jsonl")
    validation_file = property(lambda self: self.path / "validation.jsonl")
    checkpoints_dir = property(lambda self: self.path / "checkpoints")
    final = property(lambda self: self.path / "final")
    plots = property(lambda self: self.path / "plots")
    mlflow_file = property(lambda self: self.path / "mlflow_run.json")
    lock_file = property(lambda self: self.path / LOCK_FILE)
    untracked_file = property(lambda self: self.path / "untracked")
    sweep_settings_file = property(lambda self: self.path / "sweep_settings.json")

    # -- the one writer ------------------------------------------------------------------------

    @contextlib.contextmanager
    def writer(self) -> Iterator[None]:
        """Hold this directory as its one writer until the block ends; a directory that another
        live process holds is refused (``tasks.run_lock.RunDirBusy``). Re-entrant within a
        process."""
        self.refuse_model_dir()
        try:
            key = acquire(self)
        except OSError as e:
            raise self._unwritable(e) from None
        try:
            yield
        finally:
            release(key)

    def refuse_model_dir(self) -> None:
        """A model directory (weights at its top, where no run writes them) is no run's: a
        lock there would change its digest (a shipped checkpoint's too)."""
        if any(self.path.glob("*.safetensors")) or any(self.path.glob("pytorch_model*.bin")):
            raise PipelineError(
                f"{self.path} is a model directory, not a run directory: pick another "
                f"--run-dir (to train from this model: -S model.name_or_path={self.path})"
            )

    def _unwritable(self, e: OSError) -> PipelineError:
        return PipelineError(
            f"cannot write to the run directory {self.path} ({e.strerror or e}); pick a "
            "writable one with --run-dir, or set train.out_dir"
        )

    # -- starting an attempt -------------------------------------------------------------------

    def used(self) -> bool:
        return bool(self.written())

    def written(self) -> list[int]:
        """The modification times of what a run wrote here (config, metrics, checkpoints)."""
        run = (self.config_file, self.metrics_file, self.checkpoints_dir)
        return [p.stat().st_mtime_ns for p in run if p.exists()]

    def resume_point(self) -> ResumePoint:
        """The latest checkpoint whose files are intact; each later one is named in a warning."""
        logged = max((row["step"] for row in self.read_metrics()), default=0)
        damaged: list[Path] = []
        for ckpt in reversed(self.checkpoints()):
            if self.check_checkpoint(ckpt) is None:
                self._warn_damaged(damaged, f"its checkpoint at step {checkpoint_step(ckpt)}")
                return ResumePoint(checkpoint_step(ckpt), ckpt, logged, tuple(damaged))
            damaged.append(ckpt)
        self._warn_damaged(damaged, "step 0")
        return ResumePoint(0, None, logged, tuple(damaged))

    def _warn_damaged(self, damaged: list[Path], instead: str) -> None:
        for ckpt in damaged:
            if ckpt not in self._warned:  # once per directory, however often it is asked
                self._warned.add(ckpt)
                problem = self.check_checkpoint(ckpt)
                log.warning(
                    "checkpoint %s is damaged (%s); the run continues from %s",
                    ckpt,
                    problem,
                    instead,
                )

    def refuse_unless(self, resume: bool) -> None:
        """A used directory is continued only on request, and a new run starts in a folder that
        holds nothing a run does not put there first (every rank checks, before any writes)."""
        if self.config_file.exists():
            if resume:  # a compare's or a sweep's folder holds no config.json: refused below
                return
            raise FileExistsError(
                f"{self.path} already holds a run: continue it with --resume {self.path}, "
                "or pick another --run-dir"
            )
        if foreign := sorted(set(_entries(self.path)) - _BEFORE_CONFIG):  # e.g. data/curated
            raise FileExistsError(
                f"{self.path} holds files not a run's ({', '.join(foreign[:3])}): pick another "
                "--run-dir (a new or empty folder)"
            )

    def refuse_other_settings(self, config: Config) -> None:
        """A run continues with the settings it began with (exact resume): ``dapo pipeline
        --run-name NAME`` without the first command's -S went on under params.yaml's and
        rewrote the run's config.json; a torn config.json was rewritten too. A PipelineError
        naming what differs, before anything is written."""
        _refuse_changed(self.config_file, self.path, flat_settings(config))

    def keep_sweep_settings(self, settings: dict[str, Any], record: bool = True) -> None:
        """The same for a sweep (``dapo ablate``, ``dapo compare``) continued under its
        --run-name: its first attempt records ``settings`` here, a later one with others is
        refused before anything starts (a changed -S failed every run, and the finished sweep's
        table was written over with the failures). ``record=False``: only the check."""
        _refuse_changed(self.sweep_settings_file, self.path, flat_settings(settings))
        if record and not self.sweep_settings_file.exists():
            self.path.mkdir(parents=True, exist_ok=True)
            text = json.dumps(settings, indent=2)
            replace_atomically(self.sweep_settings_file, lambda tmp: tmp.write_text(text))

    def check_writable(self) -> None:
        """A one-line error now, rather than a traceback after a run has been opened."""
        probe = self.path / ".write-test"
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            probe.write_text("")
            probe.unlink()
        except OSError as e:
            raise self._unwritable(e) from None

    def describe_stop(self, steps: int, resume_hint: str) -> str:
        """Where a stopped run stands and how to continue it."""
        if not self.used():  # its directory goes with its lock (``_remove_if_unused``)
            return f"stopped before its first step of {steps}: nothing to continue, run it again"
        ckpt = self.latest_checkpoint()
        done = max((row["step"] for row in self.read_metrics()), default=0)
        saved = f"step {checkpoint_step(ckpt)} ({ckpt})" if ckpt else "none yet"
        redo = _redone(checkpoint_step(ckpt) if ckpt else 0, done)
        where = f"step {done} of {steps}"
        if done >= steps and not self.final.exists():  # stopped while saving its final model
            where = f"its last step ({done} of {steps}), before its final model was saved"
        saved = f"last checkpoint: {saved}"
        return f"stopped after {where}; {saved}. Continue with: {resume_hint}{redo}"

    def write_config(self, config: dict[str, Any]) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(json.dumps(config, indent=2))

    def read_config(self) -> dict[str, Any]:
        if not self.config_file.exists():
            raise FileNotFoundError(f"{self.path} is not a run directory (no config.json)")
        return json.loads(self.config_file.read_text())

    # -- per-step records ----------------------------------------------------------------------

    def append_metrics(self, step: int, metrics: dict[str, float]) -> None:
        append_row(self.metrics_file, {"step": step, **metrics})

    def read_metrics(self) -> list[dict[str, Any]]:
        return read_rows(self.metrics_file)

    def append_validation(self, step: int, metrics: dict[str, float]) -> None:
        append_row(self.validation_file, {"step": step, **metrics})

    def read_validation(self) -> list[dict[str, Any]]:
        return read_rows(self.validation_file)

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
        return self.checkpoints_dir / f".tmp-{_ckpt_name(step)}"

    def commit_checkpoint(self, step: int, keep: int, sealed: dict | None = None) -> Path:
        """Publish the staged checkpoint and keep the last ``keep``.

        Every file reaches the disk (fsync) and is recorded in COMPLETE (size, CRC-32) before
        one rename publishes the directory, so a crash at any point leaves either the previous
        checkpoints or this one complete. ``sealed``: records of files other ranks wrote and
        sealed (:func:`seal_files`); the rest are sealed here."""
        staged, final = self.staging_checkpoint(step), self.checkpoints_dir / _ckpt_name(step)
        files = {**(sealed or {})}
        rest = [p for p in staged.rglob("*") if p.is_file() and relative(p, staged) not in files]
        files.update(seal_files(staged, rest))
        write_synced(staged / COMPLETE, json.dumps({"step": step, "files": files}))
        for d in sorted((p for p in staged.rglob("*") if p.is_dir()), reverse=True):
            fsync_dir(d)  # their entries (the files' names) reach the disk too
        fsync_dir(staged)
        _publish(staged, final)
        for old in self.checkpoints()[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def check_checkpoint(self, ckpt: Path) -> str | None:
        """What is wrong with a complete checkpoint's files (None: they match its record).
        Checkpoints written before records were kept are taken as they are."""
        key = (ckpt, (ckpt / COMPLETE).stat().st_mtime_ns)
        if key not in self._checked:
            self._checked[key] = _check_files(ckpt)
        return self._checked[key]

    def set_aside(self, damaged: Iterable[Path]) -> None:
        """Rename damaged checkpoints to ``.damaged-step_N`` (kept to inspect, never resumed
        from, never counted when pruning); only the writer calls it."""
        for ckpt in damaged:
            aside = ckpt.with_name(DAMAGED_PREFIX + ckpt.name)
            shutil.rmtree(aside, ignore_errors=True)
            os.replace(ckpt, aside)

    # -- the MLflow run ------------------------------------------------------------------------

    def mlflow_run(self) -> dict[str, str] | None:
        """``{"run_id", "tracking_uri"}`` of the MLflow run an earlier attempt logged to."""
        if not self.mlflow_file.exists():
            return None
        try:
            record = json.loads(self.mlflow_file.read_text())
        except ValueError:
            record = None
        if not isinstance(record, dict) or not {"run_id", "tracking_uri"} <= set(record):
            raise PipelineError(
                f"{self.mlflow_file} is damaged: delete it to log the rest of the run to a new "
                "MLflow run, then resume again"
            )
        return record

    def untracked(self) -> bool:
        """The last attempt did not log to MLflow (``--no-track``): a resume keeps to that."""
        return self.untracked_file.exists()

    def record_tracking(self, track: bool) -> None:
        if track:
            self.untracked_file.unlink(missing_ok=True)
        else:
            self.untracked_file.write_text("trained with --no-track: resumes stay untracked\n")

    def record_mlflow_run(self, run_id: str, uri: str) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        record = json.dumps({"run_id": run_id, "tracking_uri": uri})
        replace_atomically(self.mlflow_file, lambda tmp: tmp.write_text(record))  # never torn


def checkpoint_step(path: Path) -> int:
    """The step of a checkpoint directory (``step_000012`` -> 12)."""
    return int(Path(path).name.removeprefix(CHECKPOINT_PREFIX))


def _ckpt_name(step: int) -> str:
    return f"{CHECKPOINT_PREFIX}{step:06d}"


# -- durable files -----------------------------------------------------------------------------


def _check_files(ckpt: Path) -> str | None:
    try:
        files = json.loads((ckpt / COMPLETE).read_text()).get("files")
    except (ValueError, AttributeError):  # its record is torn or is not one: nothing to trust
        return f"its {COMPLETE} record is not readable"
    return check_sealed(ckpt, files or {})


def _publish(staged: Path, final: Path) -> None:
    """Rename ``staged`` to ``final``; a checkpoint already there (the same step saved again) is
    moved aside first, so a complete one exists at every moment."""
    publish_dir(staged, final, final.with_name(f".old-{final.name}"))
    fsync_dir(final.parent.parent)  # the run directory, when checkpoints/ is new


def _refuse_changed(recorded: Path, path: Path, now: dict[str, str]) -> None:
    """A PipelineError naming the settings that differ between ``recorded`` (a config.json,
    absent: nothing to compare) and ``now``."""
    if not recorded.exists():
        return
    try:
        before = flat_settings(json.loads(recorded.read_text()))
    except (OSError, ValueError, AttributeError):
        raise PipelineError(
            f"{recorded} is not valid JSON (a write cut short): the run cannot be continued; "
            "start a new one under another name"
        ) from None
    # a setting this version added (or dropped) is no difference: runs resume across versions
    changed = sorted(k for k in before.keys() & now.keys() if before[k] != now[k])
    if changed:
        shown = ", ".join(f"{k} {before[k]} -> {now[k]}" for k in changed[:3])
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        raise PipelineError(
            f"{path} began with other settings ({shown}{more}): continue it with the ones it "
            "began with (the same -c and -S), or start a new run under another name"
        )


def _redone(saved: int, done: int) -> str:
    """What a resume does again: the steps after the last checkpoint (none: nothing said)."""
    if done <= saved:
        return ""
    if done == saved + 1:
        return f"; step {done} is redone"
    return f"; steps {saved + 1}-{done} are redone"


def _entries(path: Path) -> list[str]:
    return [p.name for p in path.iterdir()] if path.is_dir() else []
