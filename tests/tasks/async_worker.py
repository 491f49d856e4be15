"""Train with a rollout process for many steps (test_async_rollouts.py kills this process)."""

import json
import sys
from pathlib import Path

from dapo_core.config_loader import resolve
from tasks.rundir import RunDir
from tasks.training.run import run_training

if __name__ == "__main__":  # the rollout process is spawned: it imports this file
    cfg = resolve(json.loads(Path(sys.argv[1]).read_text()))
    run_training(cfg, RunDir(Path(sys.argv[2])), progress=False)
