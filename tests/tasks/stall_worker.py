"""A real training run that stops at a step and waits to be killed (test_run_lock.py).

``python stall_worker.py PARAMS_JSON RUN_DIR STEP``: trains in RUN_DIR, prints ``at step STEP``
once that step (and its checkpoint) is done, then sleeps while it holds the run directory.
"""

import json
import sys
import time
from pathlib import Path

from dapo_core.config_loader import resolve
from tasks.rundir import RunDir
from tasks.training.run import run_training


def main(params_json: str, run_dir: str, stop_at: str) -> None:
    cfg = resolve(json.loads(Path(params_json).read_text()))

    def stall(trainer, result) -> None:
        if trainer.step == int(stop_at):
            print(f"at step {trainer.step}", flush=True)
            time.sleep(600)

    run_training(cfg, RunDir(run_dir), progress=False, on_step=stall)


if __name__ == "__main__":
    main(*sys.argv[1:])
