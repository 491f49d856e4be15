"""The method comparison's records, table and chart (``dapo compare``; the statistics are
``dapo_core.comparison``).

Every run of the comparison, RL or DPO, leaves the same two logs in its directory (``RunDir``):
``metrics.jsonl`` (per step: gradient norm, tokens trained on, responses generated, advantage
variance where there are advantages) and ``validation.jsonl`` (held-out avg@k on the validation
split at some steps). ``run_record`` reads them into one record, whatever the method; the table
and the chart are built from records alone.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from dapo_core import metric_names as metric
from dapo_core.comparison import (
    ACCURACY,
    coefficient_of_variation,
    collapsed,
    cumulative,
    mean_curve,
    seed_spread,
)
from tasks.rundir import RunDir


@dataclass(frozen=True)
class Keys:
    """Where a method's logs keep what the comparison reads."""

    grad_norm: str
    tokens: str
    responses: str | None  # per-step responses generated; None: all generated before training
    advantage_var: str | None  # None: the method has no advantages (DPO)


RL_KEYS = Keys(metric.GRAD_NORM, metric.TOKENS_TRAINED, metric.SAMPLES_GENERATED, metric.ADV_VAR)
DPO_KEYS = Keys("dpo/grad_norm", "dpo/tokens_trained", None, None)


@dataclass
class RunRecord:
    """One (method, seed): its final held-out score and what its logs say."""

    method: str
    seed: int
    status: str = "ok"
    avg_at_k: float = float("nan")  # final, on the evaluation set
    ci_low: float = float("nan")
    ci_high: float = float("nan")
    wall_s: float = float("nan")  # its own training and evaluation plus what it needed first
    responses: float = float("nan")  # generated, in all (mined pairs included)
    tokens: float = float("nan")  # trained on, in all
    grad_norm_cv: float = float("nan")
    advantage_var: float = float("nan")
    # (responses generated, tokens trained on, validation avg@k), from the warm start on
    curve: list[tuple[float, float, float]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_record(
    method: str,
    seed: int,
    run_dir: str,
    keys: Keys,
    warm_val: float,
    responses_before: float = 0.0,
) -> RunRecord:
    """A run's record from its logs (the final score and wall time are set by the caller).
    ``warm_val``: the warm start's validation avg@k, the curve's first point;
    ``responses_before``: responses generated before training (the mined pairs')."""
    rd = RunDir(run_dir)
    steps = sorted(rd.read_metrics(), key=lambda r: r["step"])
    per_step = [r for r in steps if keys.grad_norm in r]
    tokens = cumulative([r.get(keys.tokens, 0.0) for r in per_step])
    made = (
        [r.get(keys.responses, 0.0) for r in per_step] if keys.responses else [0.0] * len(per_step)
    )
    responses = [responses_before + c for c in cumulative(made)]
    at_step = {r["step"]: i for i, r in enumerate(per_step)}
    curve = [(responses_before, 0.0, warm_val)]
    for v in sorted(rd.read_validation(), key=lambda r: r["step"]):
        i = at_step.get(v["step"])
        if i is not None:
            curve.append((responses[i], tokens[i], v[metric.VAL_AVG_AT_K]))
    adv = [r[keys.advantage_var] for r in per_step if keys.advantage_var in r]
    return RunRecord(
        method,
        seed,
        responses=responses[-1] if responses else responses_before,
        tokens=tokens[-1] if tokens else 0.0,
        grad_norm_cv=coefficient_of_variation([r[keys.grad_norm] for r in per_step]),
        advantage_var=float(np.mean(adv)) if adv else float("nan"),
        curve=curve,
    )


TABLE_COLUMNS = [
    "method",
    "runs",
    "avg_at_k",
    "ci_low",
    "ci_high",
    "seed_sd",
    "collapsed",
    "grad_norm_cv",
    "advantage_var",
    "responses",
    "tokens",
    "wall_min",
]


def comparison_table(records: list[RunRecord], methods: list[str], warm: float) -> pd.DataFrame:
    """One row per method: the final held-out avg@k over seeds (mean, t-interval over seeds,
    seed sd), runs that collapsed below ``dapo_core.comparison.COLLAPSE_SHARE`` of the warm
    start's ``warm`` avg@k, the update statistics and the cost, each averaged over seeds."""
    rows = []
    for m in methods:
        mine = [r for r in records if r.method == m]
        ok = [r for r in mine if r.status == "ok"]
        final = seed_spread([r.avg_at_k for r in ok], bounds=ACCURACY)

        def mean(attr: str, ok=ok) -> float:
            values = [getattr(r, attr) for r in ok if np.isfinite(getattr(r, attr))]
            return float(np.mean(values)) if values else float("nan")

        rows.append(
            {
                "method": m,
                "runs": f"{len(ok)}/{len(mine)}",
                "avg_at_k": final.mean,
                "ci_low": final.low,
                "ci_high": final.high,
                "seed_sd": final.sd,
                "collapsed": sum(collapsed(r.avg_at_k, warm) for r in ok),
                "grad_norm_cv": mean("grad_norm_cv"),
                "advantage_var": mean("advantage_var"),
                "responses": mean("responses"),
                "tokens": mean("tokens"),
                "wall_min": mean("wall_s") / 60,
            }
        )
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def terminal_table(table: pd.DataFrame, k: int) -> str:
    """The table in under 80 columns: numbers rounded to what the seeds support."""

    def num(x: float, fmt: str = ".3f") -> str:
        return "-" if not np.isfinite(x) else format(x, fmt)

    def count(x: float) -> str:
        if not np.isfinite(x):
            return "-"
        return f"{x / 1e6:.1f}M" if x >= 1e6 else f"{x / 1e3:.0f}k" if x >= 1e3 else f"{x:.0f}"

    head = f"{'method':<7} {f'avg@{k}':>6} {'95% CI':>13} {'sd':>5} {'coll':>4} "
    head += f"{'gnCV':>5} {'advVar':>6} {'resp':>6} {'tokens':>6} {'min':>5}"
    lines = [head]
    for r in table.itertuples():
        ci = f"[{num(r.ci_low, '.2f')},{num(r.ci_high, '.2f')}]" if np.isfinite(r.ci_low) else "-"
        runs = int(r.runs.split("/")[0])
        lines.append(
            f"{r.method:<7} {num(r.avg_at_k):>6} {ci:>13} {num(r.seed_sd):>5} "
            f"{f'{r.collapsed}/{runs}':>4} {num(r.grad_norm_cv, '.2f'):>5} "
            f"{num(r.advantage_var, '.2f'):>6} {count(r.responses):>6} {count(r.tokens):>6} "
            f"{num(r.wall_min, '.1f'):>5}"
        )
    return "\n".join(lines)


def curves_figure(records: list[RunRecord], methods: list[str], k: int):
    """Held-out avg@k against responses generated and against tokens trained on: each method's
    seeds averaged point by point, with the CI over seeds as a band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for m in methods:
        runs = [r.curve for r in records if r.method == m and r.status == "ok" and r.curve]
        for ax, col, label in (
            (axes[0], 0, "responses generated"),
            (axes[1], 1, "tokens trained on"),
        ):
            points = mean_curve([[(p[col], p[2]) for p in c] for c in runs])
            if not points:
                continue
            x = [p.x for p in points]
            line = ax.plot(x, [p.y for p in points], marker="o", ms=3, label=m)[0]
            low, high = [p.low for p in points], [p.high for p in points]
            if all(np.isfinite(low)):
                ax.fill_between(x, low, high, alpha=0.15, color=line.get_color())
            ax.set_xlabel(label)
    axes[0].set_ylabel(f"validation avg@{k}")
    axes[0].legend()
    fig.suptitle("Sample efficiency: mean over seeds, 95% CI over seeds")
    fig.tight_layout()
    return fig
