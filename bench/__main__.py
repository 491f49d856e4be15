"""All benchmarks in one command: ``python -m bench [--quick]`` (``make bench``).

Each section compares against a baseline measured in the same run and prints its own table:

1. reward throughput: ``dapo_core.reward.score`` against a bare regex extractor (``bench.reward``);
2. generation tokens/s: our HF backend against transformers ``generate`` (``bench.generation``);
3. dynamic-sampling waste on the embedded default (``bench.dynamic_sampling``);
4. RL step time against TRL's GRPOTrainer (``bench.rl_step``; needs the ``bench`` extra:
   ``pip install -e '.[bench]'``);
5. GPU train-step MFU for a Qwen2.5-0.5B-shaped model (``bench.mfu``; on CPU, a tiny smoke run);
6. micro-batch packing: tokens fed to the update against whole-group packing (``bench.packing``);
7. rollout decode with finished sequences dropped from the batch, against decoding the whole
   batch to the end, on the chain task's model (``bench.compaction``);
8. start-up: ``dapo train`` to its first step with a temporary Prefect server and with the
   project's running one (``bench.startup``);
9. rollouts that overlap training (``train.rollout_ranks=1``) against the synchronous step:
   steps per minute, waits and held-out avg@8 (``bench.async``);
10. the portable kernels every command pins against each library's own choice for this CPU
    (``bench.kernels``).

Not here, for their length: ``bench.ladder_check`` (a docs/results.md table from a fresh sweep) and
``bench.build_seeds`` (where the embedded model's build lands for several build seeds).

``--quick`` runs fewer repeats (for a smoke check, not for figures to quote).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util

import torch

import bench

# Section -> arguments for --quick (the defaults give the figures quoted in docs/benchmarks.md).
QUICK_ARGS = {
    "reward": ["--n", "1000", "--repeats", "3"],
    "generation": ["--repeats", "2"],
    "dynamic_sampling": ["--steps", "3"],
    "rl_step": ["--rounds", "1", "--steps", "3"],
    "mfu": ["--steps", "2"],
    "packing": ["--trials", "3"],
    "compaction": ["--repeats", "1", "-P", "8"],
    "startup": ["--trials", "1"],
    "async": ["--steps", "5", "--settings", "sync,s1"],
    "kernels": ["--trials", "1"],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats: a smoke check")
    ap.add_argument("--skip", nargs="*", default=[], choices=list(QUICK_ARGS), help="sections")
    args = ap.parse_args()
    for name, quick_args in QUICK_ARGS.items():
        if name in args.skip:
            continue
        print(f"\n== {name} " + "=" * (60 - len(name)), flush=True)
        if name == "rl_step" and importlib.util.find_spec("trl") is None:
            print("skipped: TRL is not installed (pip install -e '.[bench]')")
            continue
        importlib.import_module(f"bench.{name}").main(quick_args if args.quick else [])
    if not torch.cuda.is_available():
        print("\n(no CUDA device: GPU figures were not measured; the mfu section ran on CPU)")


if __name__ == "__main__":
    bench.run(main)
