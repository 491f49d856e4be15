"""Train 4 steps straight, then 2 steps, stop, and resume for the last 2; under torchrun, for
each (params, out, parity) triple of the command line in turn.

Used by test_distributed.py: a resumed multi-rank run (ZeRO-2 or ZeRO-3) must reproduce the
uninterrupted one. Each run writes its run directory (metrics.jsonl, final/) as usual.
"""

import json
import sys
from pathlib import Path

from dapo_core.config_loader import resolve
from tasks.rundir import RunDir
from tasks.training import rollouts
from tasks.training.distributed import shutdown_distributed
from tasks.training.run import run_training

rule = rollouts.rule_correctness


def main(params_json: str, out: str, parity_reward: bool) -> None:
    cfg = resolve(json.loads(Path(params_json).read_text()))
    rollouts.rule_correctness = parity_score if parity_reward else rule
    root = Path(out)
    run_training(cfg, RunDir(root / "full"), progress=False)
    run_training(cfg, RunDir(root / "cut"), progress=False, max_steps=2)
    run_training(cfg, RunDir(root / "cut"), resume=True, progress=False)


def parity_score(response, _):
    """Mixed groups from step 1, whatever the model writes."""
    return float(len(response) % 2 == 0)


if __name__ == "__main__":
    args = sys.argv[1:]
    for i in range(0, len(args), 3):
        main(args[i], args[i + 1], args[i + 2] == "1")
    shutdown_distributed()
