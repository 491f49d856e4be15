"""Which conclusions of a sweep hold from every starting model: ``python -m bench.across_starts
SWEEP_DIR SWEEP_DIR ...`` (the directories of ``dapo ablate`` runs of the same variants, one per
starting checkpoint, e.g. ``-S tiny.seed=1 -S tiny.shipped=false``).

For each variant: its avg@8 from each start and its paired difference with the row it is compared
with (``delta_vs``), and whether that difference has the same sign from every start, and is
distinguishable from zero from every start. For each mechanism signal (``mechanisms.csv``):
whether it moved as the paper says from every start. Prints markdown tables for docs/results.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

import bench


def _sign(x: float) -> str:
    return "+" if x > 0 else "-" if x < 0 else "0"


def score_rows(tables: list[pd.DataFrame]) -> list[str]:
    """Markdown rows: variant, avg@8 per start, the deltas per start, and the verdict."""
    out = []
    for variant in tables[0]["variant"]:
        rows = [t.set_index("variant").loc[variant] for t in tables]
        scores = " / ".join(f"{r['avg_at_k']:.3f}" for r in rows)
        deltas = [r["delta"] for r in rows]
        if any(pd.isna(d) for d in deltas):
            out.append(f"| `{variant}` | {scores} | | |")
            continue
        shown = " / ".join(f"{d:+.3f}" for d in deltas)
        clear = [bool(r["distinguishable"]) for r in rows]
        signs = {_sign(d) for d in deltas}
        if not any(clear):
            verdict = "CI spans 0 from every start"
        elif len(signs) > 1:
            verdict = "flips with the start"
        elif all(clear):
            verdict = f"**{signs.pop()} from every start**"
        else:
            verdict = f"same sign ({signs.pop()}), clear of 0 from {sum(clear)} of {len(clear)}"
        out.append(f"| `{variant}` | {scores} | {shown} | {verdict} |")
    return out


def mechanism_rows(tables: list[pd.DataFrame]) -> list[str]:
    out = []
    key = ["variant", "signal"]
    for _, row in tables[0].iterrows():
        found = [t.set_index(key).loc[tuple(row[key])] for t in tables]
        verdicts = [str(f["as_paper"]) for f in found]
        deltas = " / ".join(f"{f['delta']:+.4g}" for f in found)
        same = len(set(verdicts)) == 1
        holds = f"{verdicts[0]} from every start" if same else "varies: " + " / ".join(verdicts)
        out.append(f"| {row['variant']} | {row['signal']} | {deltas} | {holds} |")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweeps", nargs="+", type=Path)
    args = ap.parse_args(argv)
    tables = [pd.read_csv(s / "ablation.csv") for s in args.sweeps]
    print("| variant | avg@8 per start | vs the row compared with, per start | holds? |")
    print("|---|---|---|---|")
    print("\n".join(score_rows(tables)))
    mechanisms = [s / "mechanisms.csv" for s in args.sweeps]
    if all(m.exists() for m in mechanisms):
        print("\n| rung | signal | change per start | as the paper says? |")
        print("|---|---|---|---|")
        frames = [pd.read_csv(m, keep_default_na=False) for m in mechanisms]  # "n/a" verdicts
        print("\n".join(mechanism_rows(frames)))


if __name__ == "__main__":
    bench.run(main)
