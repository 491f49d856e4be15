"""Crash consistency under SIGKILL: ``python -m bench.crash_consistency [--kills 20]``.

Trains the embedded default once without interruption, then trains the same config in another
run directory in a process that is killed with SIGKILL at a random moment (start-up, a step, a
checkpoint being written), resumed, killed again, ``--kills`` times, and finally left to finish.
A SIGKILL cannot be caught: whatever the run directory holds at that instant is what the next
attempt resumes from. Prints each kill (when, which step the resume starts from) and whether the
final weights and every ``train/*`` metric equal the uninterrupted run's, bit for bit.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import bench

ROOT = Path(__file__).resolve().parents[1]
WORKER = """
import json, sys
from dapo_core.config_loader import resolve
from tasks.rundir import RunDir
from tasks.training.run import run_training
cfg = resolve(json.loads(open(sys.argv[1]).read()))
run_training(cfg, RunDir(sys.argv[2]), resume=True, progress=False)
"""


@dataclass(frozen=True)
class Kill:
    after_s: float  # since the attempt started
    resumed_from: int  # the checkpoint step this attempt started from (0: none)


def _attempt(params: Path, run_dir: Path, kill_when: Callable[[float], bool] | None) -> bool:
    """One training process on ``run_dir``, SIGKILLed as soon as ``kill_when(seconds since it
    started)`` holds (None: left to finish). True when it was killed."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(params), str(run_dir)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    while proc.poll() is None:
        if kill_when is not None and kill_when(time.monotonic() - t0):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return True
        time.sleep(0.02)
    if proc.returncode != 0:
        raise RuntimeError(f"training failed ({proc.returncode}): {proc.stderr.read()[-2000:]}")
    return False


def after_seconds(s: float) -> Callable[[float], bool]:
    return lambda elapsed: elapsed >= s


def at_step(run_dir: Path, step: int) -> Callable[[float], bool]:
    """Once the run has logged ``step`` (a kill in the next step, or in its checkpoint)."""
    from tasks.rundir import RunDir

    def logged(_: float) -> bool:
        rows = RunDir(run_dir).read_metrics() if run_dir.exists() else []
        return bool(rows) and rows[-1]["step"] >= step

    return logged


def latest_step(run_dir: Path) -> int:
    from tasks.rundir import RunDir, checkpoint_step

    latest = RunDir(run_dir).latest_checkpoint() if run_dir.exists() else None
    return checkpoint_step(latest) if latest else 0


def killed_run(params: Path, run_dir: Path, kills: int, span_s: float, seed: int) -> list[Kill]:
    """Train in ``run_dir`` with ``kills`` SIGKILLs, each at a uniform random moment within
    ``span_s`` of its attempt's start; then to the end. The kills that landed."""
    rng = random.Random(seed)
    landed: list[Kill] = []
    while len(landed) < kills:
        start = latest_step(run_dir)
        after = rng.uniform(0.5, span_s)
        if not _attempt(params, run_dir, after_seconds(after)):
            break  # finished before the kill: no more to interrupt
        landed.append(Kill(after, start))
    _attempt(params, run_dir, None)
    return landed


def compare(full: Path, cut: Path) -> list[str]:
    """What differs between two finished run directories: final weights, ``train/*`` metrics."""
    import torch
    from safetensors.torch import load_file

    from tasks.rundir import RunDir

    diffs = []
    a, b = (load_file(str(d / "final" / "model.safetensors")) for d in (full, cut))
    if a.keys() != b.keys() or any(not torch.equal(a[k], b[k]) for k in a):
        diffs.append("final weights differ")
    rows = [
        [{k: v for k, v in r.items() if k.startswith("train/") or k == "step"} for r in rd]
        for rd in (RunDir(full).read_metrics(), RunDir(cut).read_metrics())
    ]
    if rows[0] != rows[1]:
        diffs.append(f"train/* metrics differ ({len(rows[0])} vs {len(rows[1])} steps)")
    return diffs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0, help="of the kill times")
    parser.add_argument("--span", type=float, default=20.0, help="seconds: kills land within")
    args = parser.parse_args(argv)
    from tasks.models.resolve import resolve_model_path
    from tasks.params import load_params

    cfg = load_params(
        overrides=[f"train.steps={args.steps}", "train.checkpoint_every=2", "eval.every_n_steps=0"]
    )
    resolve_model_path(cfg)  # built once here, not inside an attempt
    scratch = Path(tempfile.mkdtemp(prefix="dapo-crash-"))
    params = scratch / "params.json"
    params.write_text(json.dumps(cfg.to_dict()))
    t0 = time.monotonic()
    _attempt(params, scratch / "full", None)
    print(f"uninterrupted: {args.steps} steps in {time.monotonic() - t0:.0f}s", flush=True)
    landed = killed_run(params, scratch / "cut", args.kills, args.span, args.seed)
    for i, k in enumerate(landed, 1):
        print(f"kill {i:2d}: {k.after_s:5.1f}s into an attempt resumed from step {k.resumed_from}")
    diffs = compare(scratch / "full", scratch / "cut")
    left = subprocess.run(["pgrep", "-f", str(scratch)], capture_output=True, text=True).stdout
    print(
        f"{len(landed)} SIGKILLs, resumed from steps {sorted({k.resumed_from for k in landed})}: "
        + ("identical weights and train/* metrics" if not diffs else "; ".join(diffs))
        + ("" if not left.strip() else f"; processes left: {left.split()}")
    )
    return 1 if diffs or left.strip() else 0


if __name__ == "__main__":
    bench.run(main)
