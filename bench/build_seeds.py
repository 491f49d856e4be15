"""Where the embedded model's build lands for several build seeds: ``python -m bench.build_seeds
-c configs/chain.yaml --seeds 0,1,2,3,4``.

Builds the preset's embedded model once per build seed (``tiny.seed``) in a scratch directory,
as ``dapo model build`` does, and prints each build's warm-start steps, digest and starting avg@k
on the test split, then the spread between the seeds: a warm start that lands in the same place
for every seed has a small one. ``-S`` overrides try another build setting; ``--jobs 2`` builds
two seeds at once (one thread each).
"""

from __future__ import annotations

import bench
from tasks.determinism import pin_kernels

pin_kernels()  # as the dapo command does, before torch is imported (here and in the workers)

import argparse  # noqa: E402
import multiprocessing  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ProcessPoolExecutor  # noqa: E402
from pathlib import Path  # noqa: E402


def build_one(config: list[str], overrides: list[str], seed: int, scratch: str) -> dict:
    """One seed's build and its starting score (in a worker process)."""
    from flows.models import build_and_compare
    from tasks.params import load_params

    t0 = time.perf_counter()
    path = Path(scratch) / f"seed-{seed}"
    cfg = load_params(None, config, [*overrides, f"tiny.seed={seed}", f"tiny.path={path}"])
    r = build_and_compare(cfg)
    return {
        "seed": seed,
        "steps": r.warm_start.get("steps"),
        "digest": r.built.digest,
        "avg": r.built.avg_at_k,
        "ci": r.built.ci,
        "minutes": (time.perf_counter() - t0) / 60,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-c", "--config", action="append", default=[])
    ap.add_argument("-S", "--set", dest="overrides", action="append", default=[])
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    scratch = tempfile.mkdtemp(prefix="dapo-build-seeds-")
    spawn = multiprocessing.get_context("spawn")  # a fresh interpreter: torch reads the pins
    try:
        with ProcessPoolExecutor(args.jobs, mp_context=spawn) as pool:
            jobs = [pool.submit(build_one, args.config, args.overrides, s, scratch) for s in seeds]
            rows = [j.result() for j in jobs]
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"{'seed':>4} {'steps':>6} {'digest':>24} {'start avg@k (95% CI)':>24} {'min':>5}")
    for r in rows:
        ci = f"{r['avg']:.3f} ({r['ci'][0]:.3f}-{r['ci'][1]:.3f})"
        print(f"{r['seed']:>4} {r['steps']:>6} {r['digest']:>24} {ci:>24} {r['minutes']:5.1f}")
    starts = [r["avg"] for r in rows]
    print(f"spread of the starting avg@k over {len(rows)} seeds: {max(starts) - min(starts):.3f}")


if __name__ == "__main__":
    bench.run(main)
