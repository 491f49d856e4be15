"""What the preference trainers (reward model, DPO) share: their checks before any work, the
held-out split of a pairs table, and writing a model directory whole or not at all."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from dapo_core.config import Config
from dapo_core.errors import PipelineError, TrainingInterrupted, first_line
from tasks.durable import replace_atomically, unwritable
from tasks.models.loading import save_model_dir as save_hf_dir
from tasks.orchestration import interrupts, run_logger
from tasks.preferences.pairs import PairTable, read_pairs


def check_settings(
    command: str, out_dir: Path, checks: list[tuple[str, object, bool, str]]
) -> None:
    """One-line errors, before anything loads: an output directory that holds files, or a
    setting (name, value, whether it is in range, the range) out of range."""
    if why := unwritable(out_dir):
        raise PipelineError(f"--out {out_dir}: {why}; name a directory to write")
    if (out_dir / "config.json").is_file():  # a finished one (a stop after its save included)
        raise PipelineError(
            f"{out_dir} already holds a trained model: use it, or choose another --out (or "
            "remove it to train again)"
        )
    if out_dir.exists() and any(out_dir.iterdir()):
        raise PipelineError(f"{out_dir} already holds files: choose another --out, or remove it")
    for name, value, ok, allowed in checks:
        if not ok:
            raise PipelineError(
                f"{name} {value} is out of range: it must be {allowed} "
                f"(see `dapo {command} --help`)"
            )


def loop_checks(epochs: int, lr: float, batch_size: int, heldout: float) -> list[tuple]:
    """The settings both trainers' loops share, as :func:`check_settings` reads them."""
    return [
        ("--epochs", epochs, epochs >= 1, ">= 1"),
        ("--lr", lr, math.isfinite(lr) and lr > 0, "a number > 0"),
        ("--batch-size", batch_size, batch_size >= 1, ">= 1"),
        ("--heldout", heldout, 0 < heldout < 1, "in (0, 1)"),
    ]


def split_by_prompt(rows: list[dict], heldout: float, seed: int) -> tuple[list[dict], list[dict]]:
    """(train, held-out) rows: a prompt goes to the held-out set when the hash of (seed, prompt)
    falls in the first ``heldout`` of its range, so a prompt's pairs stay together."""

    def unit(prompt: str) -> float:
        digest = hashlib.sha256(f"{seed}\0{prompt}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64

    held = [r for r in rows if unit(r["prompt"]) < heldout]
    train = [r for r in rows if unit(r["prompt"]) >= heldout]
    return train, held


def read_split(
    cfg: Config, pairs_path: str, heldout: float, seed: int
) -> tuple[PairTable, list[dict], list[dict]]:
    """The usable pairs (validation and test prompts set aside) and their split by prompt."""
    from tasks.data.splits import splits

    s = splits(cfg)
    held_prompts = [p.prompt for p in s.val] + [p.prompt for p in s.read_test()]
    table = read_pairs(pairs_path, held_out=held_prompts)
    if table.quarantined:  # a torn line, a pair with an empty side: said, not dropped unseen
        run_logger().warning("pairs: %s: %s", pairs_path, table.summary())
    train, held = split_by_prompt(table.rows, heldout, seed)
    if not train or not held:
        raise PipelineError(
            f"{pairs_path}: {len(table.rows)} pairs are too few to hold some out by prompt; "
            "mine more (`dapo pairs mine --prompts N`)"
        )
    return table, train, held


def save_model_dir(model, tokenizer, record_name: str, record: dict, out_dir: Path) -> None:
    """The model, its tokenizer and ``record`` as ``out_dir``, whole or not at all: written in
    a staging directory beside it, then renamed into place."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.with_name(f".{out_dir.name}.{os.getpid()}.partial")
    try:
        save_hf_dir(model, tokenizer, staging)
        (staging / record_name).write_text(json.dumps(record, indent=2))
        if out_dir.exists():  # empty: check_settings refused one with files
            out_dir.rmdir()
        os.replace(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


_SAID = {"pairs_digest": "the pairs' content"}  # a setting's name in a message, where not its key


class Resume:
    """A trainer's resumable state, beside its output directory (``.<name>.resume/``): the
    settings it was started with and, every few steps, the model, optimizer and schedule state,
    the step and the MLflow run. Running the same command again continues from it, exactly: the
    pair order of each epoch is a function of (seed, epoch), so the steps replayed after the
    checkpoint are the ones the interrupted run would have taken. Removed once the output
    directory is written."""

    def __init__(self, out_dir: Path, settings: dict):
        self.dir = out_dir.with_name(f".{out_dir.name}.resume")
        self.settings = json.loads(json.dumps(settings))  # as read back from JSON

    def load(self) -> dict | None:
        """The saved state, or None; a state saved under other settings is refused."""
        import torch

        state_file, settings_file = self.dir / "state.pt", self.dir / "settings.json"
        if not state_file.exists():
            return None
        try:
            settings = json.loads(settings_file.read_text())
            state = torch.load(state_file, weights_only=True)
        except Exception as e:  # noqa: BLE001 - truncated, corrupt or missing: one line either way
            said = first_line(e, 160)
            raise PipelineError(
                f"{self.dir} holds an interrupted run's state that cannot be read ({said}): "
                "remove that directory to start over"
            ) from None
        if "pairs_digest" in self.settings and "pairs_digest" not in settings:
            settings["pairs_digest"] = self.settings["pairs_digest"]  # saved before it was kept
        if settings != self.settings:
            keys = sorted(k for k in settings.keys() | self.settings.keys())
            changed = [_SAID.get(k, k) for k in keys if settings.get(k) != self.settings.get(k)]
            raise PipelineError(
                f"{self.dir} holds an interrupted run with other settings ({', '.join(changed)}): "
                "run the same command on the same pairs as before to continue it, or remove that "
                "directory to start over"
            )
        return state

    def save(self, state: dict) -> None:
        """Write ``state`` whole (temporary file, then rename)."""
        import torch

        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "settings.json").write_text(json.dumps(self.settings))
        replace_atomically(self.dir / "state.pt", lambda tmp: torch.save(state, tmp))

    def run_id(self) -> str | None:
        """The MLflow run the interrupted attempt logged to."""
        f = self.dir / "run.json"
        return json.loads(f.read_text())["run_id"] if f.exists() else None

    def record_run(self, run_id: str | None) -> None:
        if run_id:
            self.dir.mkdir(parents=True, exist_ok=True)
            (self.dir / "run.json").write_text(json.dumps({"run_id": run_id}))

    def done(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def continued_by_the_same_command(resume: Resume) -> Iterator[None]:
    """An interrupt of a preference training is a TrainingInterrupted that says how it goes on:
    from its saved state, by the same command (it said "run the same command to start again",
    as for a command that keeps nothing)."""
    try:
        yield
    except interrupts():
        if (resume.dir / "state.pt").exists():
            how = f"run the same command to continue from its last saved state ({resume.dir})"
        else:
            how = "run the same command to start again (no state was saved yet)"
        raise TrainingInterrupted(f"stopped; {how}") from None


def start_tracking(
    tracker, resume: Resume, track: bool, name: str, tags: dict, parent_run_id: str | None = None
) -> bool:
    """Attach to the interrupted attempt's MLflow run, or start one (nested under
    ``parent_run_id`` when given; recorded for a later attempt); True when a new run was started
    (its parameters are to be logged)."""
    if not track:
        return False
    old = resume.run_id()
    if old and tracker.resume_run(old):
        return False
    resume.record_run(tracker.start_run(name, tags, parent_run_id))
    return True


def decaying_adamw(params, lr: float, epochs: int, n_train: int, batch_size: int):
    """(AdamW, its schedule): the learning rate decays linearly to 0 over the run's batches, so
    the last epochs settle instead of swinging."""
    import torch

    optimizer = torch.optim.AdamW(params, lr=lr)
    total = epochs * math.ceil(n_train / batch_size)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: 1 - k / total)


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    """The order of the training pairs in ``epoch``: a function of (seed, epoch) only."""
    import random

    order = list(range(n))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return order


def _check_finite(metrics: dict, step: int) -> None:
    """A loss that is no longer a number has diverged: every step after it would train NaN
    weights into the model written at the end, so the run stops here, before the update."""
    bad = [k for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v)]
    if bad:
        raise PipelineError(
            f"training diverged at step {step}: {', '.join(bad)} not finite; nothing was written. "
            "Lower --lr and run again"
        )


def fit(
    *,
    model,
    optimizer,
    schedule,
    n_train: int,
    batch_size: int,
    epochs: int,
    seed: int,
    learn,
    evaluate,
    tracker,
    resume: Resume,
    on_step,
    checkpoint_every: int = 50,
) -> tuple[int, dict]:
    """The preference trainers' loop: ``learn(pair indices) -> metrics`` per mini-batch (one
    optimizer step, taken here), ``evaluate() -> metrics`` on the held-out pairs after each
    epoch; metrics to ``tracker`` and ``on_step(step, total, metrics)``; state saved to
    ``resume`` every ``checkpoint_every`` steps and at each epoch's end, and restored from it
    when a run was interrupted. Returns the steps and the last held-out metrics."""
    per_epoch = math.ceil(n_train / batch_size)
    total = epochs * per_epoch
    step, state = 0, resume.load()
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        step = state["step"]

    def save() -> None:
        resume.save(
            {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "schedule": schedule.state_dict(),
                "step": step,
            }
        )

    evaluation = None
    for epoch in range(step // per_epoch, epochs):
        order = epoch_order(n_train, seed, epoch)
        model.train()
        for b in range(step - epoch * per_epoch, per_epoch):
            metrics = learn(order[b * batch_size : (b + 1) * batch_size])
            _check_finite(metrics, step + 1)
            optimizer.step()
            schedule.step()
            step += 1
            tracker.log_metrics(metrics, step)
            on_step(step, total, metrics)
            if step % checkpoint_every == 0 and step % per_epoch:
                save()
        model.eval()
        evaluation = evaluate()
        tracker.log_metrics({k: v for k, v in evaluation.items() if k != "bins"}, step)
        on_step(step, total, evaluation)
        save()
    if evaluation is None:  # resumed after the last epoch: only the directory was missing
        model.eval()
        evaluation = evaluate()
    return step, evaluation
