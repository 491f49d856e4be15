"""Runs under torchrun with train.rollout_ranks=k: the world's last k ranks sample, the rest train.

Used by test_async_rollouts.py. For each (params, run directory, max steps) triple of the command
line in turn: train (max steps 0: to the end), continuing a run already there.
"""

import json
import sys
from pathlib import Path

from dapo_core.config_loader import resolve
from tasks.rundir import RunDir
from tasks.training.distributed import shutdown_distributed
from tasks.training.run import run_training


def main(params_json: str, run_dir: str, max_steps: int) -> None:
    cfg = resolve(json.loads(Path(params_json).read_text()))
    run = RunDir(run_dir)
    resume = (run.path / "config.json").exists()
    run_training(cfg, run, resume=resume, progress=False, max_steps=max_steps or None)


if __name__ == "__main__":
    args = sys.argv[1:]
    for i in range(0, len(args), 3):
        main(args[i], args[i + 1], int(args[i + 2]))
    shutdown_distributed()
