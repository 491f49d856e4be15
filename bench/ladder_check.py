"""Check the README's chain-ladder table from scratch: ``python -m bench.ladder_check``.

Runs the README's sweep (``dapo ablate -c configs/chain.yaml --seeds 0,1,2,3,4``) as a new user
would on a fresh clone: the embedded model built anew, in a scratch directory with its own MLflow
store, run directory and Prefect home, so nothing cached here (a model, queued runs) takes part.
Then it prints each rung's avg@8 beside the README's and says whether the README's value lies in
the sweep's 95% CI. Takes the sweep's time (about half an hour on 2 cores); ``--keep`` keeps the
scratch directory.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from tasks.models.build import dir_digest

ROOT = Path(__file__).resolve().parents[1]
README_ROW = re.compile(r"^\| `([+\w]+)` \| ([0-9.]+) \(([0-9.]+)-([0-9.]+)\) \|")
README_DIGEST = re.compile(r"chain model's digest[^`]*`((?:sha256|size):[0-9a-f]+)`")


def readme_ladder(readme: Path = ROOT / "README.md") -> dict[str, float]:
    """The chain ladder's avg@8 per variant, as the README's table gives it (the table with rows
    of the form ``| `variant` | 0.802 (0.772-0.834) |`` whose variants are the Table 1 rungs; the
    algorithms' table has the same form)."""
    from dapo_core.ablation import ABLATION_LADDER

    tables: list[dict[str, float]] = [{}]
    for line in readme.read_text().splitlines():
        m = README_ROW.match(line)
        if m:
            tables[-1][m.group(1)] = float(m.group(2))
        elif tables[-1]:
            tables.append({})
    for rows in tables:
        if list(rows) == list(ABLATION_LADDER):
            return rows
    raise SystemExit(f"no ladder table found in {readme}")


def readme_digest(readme: Path = ROOT / "README.md") -> str | None:
    """The digest of the chain model the README's table was measured from."""
    m = README_DIGEST.search(readme.read_text())
    return m.group(1) if m else None


def run_sweep(scratch: Path, seeds: str, workers: int) -> Path:
    """The README's sweep in ``scratch``; returns the sweep's directory (ablation.csv)."""
    env = {
        **os.environ,
        "PREFECT_HOME": str(scratch / "prefect"),  # the rest of dapo's defaults: flows.environment
        "HF_HUB_OFFLINE": "1",
    }
    cmd = [
        str(Path(sys.executable).with_name("dapo")),
        "ablate",
        "-c",
        str(ROOT / "configs" / "chain.yaml"),
        "--seeds",
        seeds,
        "--workers",
        str(workers),
        "--run-name",
        "ladder-check",
        "-S",
        f"tiny.path={scratch / 'models' / 'tiny-chain'}",
        "-S",
        f"tracking.tracking_uri=sqlite:///{scratch / 'mlflow.db'}",
        "-S",
        f"train.out_dir={scratch / 'runs'}",
    ]
    print("running:", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, env=env, check=True)
    return scratch / "runs" / "ladder-check"


def compare(table: pd.DataFrame, readme: dict[str, float]) -> int:
    """Print the sweep against the README; the number of README values outside the sweep's CI."""
    misses = 0
    print(f"{'variant':22} {'README':>8} {'this sweep [95% CI]':>26}  within")
    for row in table.to_dict("records"):
        want = readme.get(row["variant"])
        inside = want is not None and row["ci_low"] <= want <= row["ci_high"]
        misses += not inside
        ci = f"{row['avg_at_k']:.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}]"
        shown = "-" if want is None else f"{want:.3f}"
        print(f"{row['variant']:22} {shown:>8} {ci:>26}  {'yes' if inside else 'NO'}")
    return misses


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = ap.parse_args()
    readme, digest = readme_ladder(), readme_digest()
    scratch = Path(tempfile.mkdtemp(prefix="dapo-ladder-"))
    t0 = time.perf_counter()
    try:
        sweep = run_sweep(scratch, args.seeds, args.workers)
        table = pd.read_csv(sweep / "ablation.csv")
        built = dir_digest(scratch / "models" / "tiny-chain")
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"sweep with the model build: {(time.perf_counter() - t0) / 60:.1f} min")
    print(f"chain model built here: {built}; the README's: {digest}")
    if built != digest:
        print(
            "this machine built another chain model than the README's table came from: the "
            "build is sensitive to rounding (README, 'Ranking the rungs'), so expect other numbers"
        )
    misses = compare(table, readme)
    print("the README's table holds" if not misses else f"{misses} README values outside the CI")
    sys.exit(1 if misses else 0)


if __name__ == "__main__":
    main()
