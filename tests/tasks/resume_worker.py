"""Train 4 steps straight, then 2 steps, stop, and resume for the last 2; under torchrun.

Used by test_distributed.py: a resumed multi-rank run (ZeRO-2 or ZeRO-3) must reproduce the
uninterrupted one. Each run writes its run directory (metrics.jsonl, final/) as usual.
"""

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

from dapo_core.config_loader import resolve
from tasks.rundir import RunDir
from tasks.training.distributed import shutdown_distributed
from tasks.training.run import run_training


def main(params_json: str, out: str) -> None:
    cfg = resolve(json.loads(Path(params_json).read_text()))
    if os.environ.get("PARITY_REWARD"):  # mixed groups from step 1, whatever the model writes
        from tasks.training import trainer

        parity = SimpleNamespace(acc=True), SimpleNamespace(acc=False)
        trainer.score = lambda response, _: parity[len(response) % 2]
    root = Path(out)
    run_training(cfg, RunDir(root / "full"), progress=False)
    run_training(cfg, RunDir(root / "cut"), progress=False, max_steps=2)
    run_training(cfg, RunDir(root / "cut"), resume=True, progress=False)
    shutdown_distributed()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
