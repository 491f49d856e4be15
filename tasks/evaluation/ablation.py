"""The ablation tables: per-variant scores and signals, and each rung against the one before (or
each algorithm against a baseline).

Input is one result per (variant, seed) run: its status, evaluation metrics, per-problem accuracy
(``problem_id``, ``accuracy``), per-run signals (``dapo_core.ablation_stats.run_signals``), steps
and wall times. Two tables come out, both in the paper's Table 1 order:

- ``ablation_table``: one row per variant: avg@k over seeds with a bootstrap CI over problems, the
  paired difference to the previous rung (over seeds and problems) and whether its 95% CI excludes
  zero, the mean of every signal over seeds, and the paper's AIME 2024 number. Given a
  ``baseline``, rows come in the order of ``variants`` and each difference is to the baseline
  (``delta_vs`` names what each row is compared with).
- ``mechanism_table``: one row per rung after the first and signal its switch should move: the
  paired difference to the previous rung with its CI, and whether it moved in the paper's direction
  distinguishably from zero. A probe's signal (``PROBES``) is instead the difference the switch
  makes within each step of the rung's own runs (``probes``: per-step on/off readings).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from dapo_core import metric_names as metric
from dapo_core.ablation import ABLATION_LADDER, PAPER_TABLE1_AIME24
from dapo_core.ablation_stats import (
    MECHANISM_SIGNALS,
    PROBES,
    SIGNALS,
    Paired,
    nested_bootstrap,
    paired_bootstrap,
)
from dapo_core.metrics import bootstrap_ci

SIGNAL_NAMES = [s.name for s in SIGNALS]
TABLE_COLUMNS = [
    "variant",
    "seeds",
    "avg_at_k",
    "ci_low",
    "ci_high",
    "avg_at_k_seed_std",
    "delta",
    "delta_ci_low",
    "delta_ci_high",
    "distinguishable",
    "delta_vs",
    *SIGNAL_NAMES,
    "steps",
    "train_wall_s",
    "eval_wall_s",
    "paper_aime24",
    "status",
]
_DIRECTIONS = {1: "up", -1: "down", 0: "none claimed"}  # a signal's direction in the paper
MECHANISM_COLUMNS = [
    "variant",
    "signal",
    "paper_direction",
    "previous",
    "value",
    "delta",
    "ci_low",
    "ci_high",
    "distinguishable",
    "as_paper",
]


def _ok(results: list[dict[str, Any]], variant: str) -> dict[int, dict[str, Any]]:
    return {r["seed"]: r for r in results if r["variant"] == variant and r["status"] == "ok"}


def _mean_of_logged(values: list[float]) -> float:
    """Mean over the runs that logged a signal (NaN, quietly, when none did)."""
    logged = [v for v in values if not np.isnan(v)]
    return float(np.mean(logged)) if logged else float("nan")


def accuracy_matrix(runs: dict[int, dict[str, Any]], seeds: list[int]) -> pd.DataFrame:
    """(seeds x problems) per-problem accuracy, problems aligned by id."""
    return pd.DataFrame(
        {s: runs[s]["per_problem"].set_index("problem_id")["accuracy"] for s in seeds}
    ).T.sort_index(axis=1)


def ablation_table(
    results: list[dict[str, Any]],
    n_boot: int = 1000,
    seed: int = 0,
    variants: list[str] | None = None,
    baseline: str | None = None,
) -> pd.DataFrame:
    """One row per variant that has results, in Table 1 order, each against the rung before; or
    in the order of ``variants``, each against ``baseline`` (see the module docstring)."""
    rows, previous, before = [], None, None
    reference = (_ok(results, baseline) or None) if baseline is not None else None
    for variant in ABLATION_LADDER if baseline is None else (variants or [baseline]):
        mine = [r for r in results if r["variant"] == variant]
        if not mine:
            continue
        ok = _ok(results, variant)
        row: dict[str, Any] = {
            "variant": variant,
            "seeds": ",".join(str(r["seed"]) for r in sorted(mine, key=lambda r: r["seed"])),
            "paper_aime24": PAPER_TABLE1_AIME24.get(variant, float("nan")),
            "status": "ok" if len(ok) == len(mine) else "; ".join(r["status"] for r in mine),
        }
        if ok:
            seeds = sorted(ok)
            acc = accuracy_matrix(ok, seeds)
            avgs = [ok[s]["metrics"][metric.AVG_AT_K] for s in seeds]
            # a bootstrap over problems of the seed-averaged per-problem accuracy
            low, high = bootstrap_ci(acc.mean(axis=0).to_numpy(), n_boot, seed=seed)
            row.update(
                avg_at_k=float(np.mean(avgs)),
                ci_low=low,
                ci_high=high,
                avg_at_k_seed_std=float(np.std(avgs, ddof=1)) if len(avgs) > 1 else float("nan"),
                steps=int(np.mean([ok[s]["steps"] for s in seeds])),
                train_wall_s=float(np.mean([ok[s]["train_wall_s"] for s in seeds])),
                eval_wall_s=float(np.mean([ok[s]["eval_wall_s"] for s in seeds])),
                **{n: _mean_of_logged([ok[s]["signals"][n] for s in seeds]) for n in SIGNAL_NAMES},
            )
            against, other = (before, previous) if baseline is None else (baseline, reference)
            if other is not None and variant != against:
                row.update(_paired_delta(ok, other, against, n_boot, seed))
        rows.append(row)
        previous, before = ok or None, variant
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def _paired_delta(ok, other, against: str, n_boot: int, seed: int) -> dict[str, Any]:
    """avg@k of ``ok`` minus ``other``'s (variant ``against``), paired over their common seeds
    and problems; nothing when they share no seed."""
    common = sorted(set(ok) & set(other))
    if not common:
        return {}
    d = accuracy_matrix(ok, common) - accuracy_matrix(other, common)
    p = paired_bootstrap(d.to_numpy(), n_boot, seed=seed)
    return {
        "delta": p.diff,
        "delta_ci_low": p.low,
        "delta_ci_high": p.high,
        "distinguishable": p.distinguishable,
        "delta_vs": against,
    }


def mechanism_table(
    results: list[dict[str, Any]], n_boot: int = 1000, seed: int = 0
) -> pd.DataFrame:
    """Each rung's own signals against the previous rung's, paired by seed."""
    rows = []
    rungs = [v for v in ABLATION_LADDER if _ok(results, v)]
    for before, variant in zip(rungs, rungs[1:], strict=False):
        if list(ABLATION_LADDER).index(variant) != list(ABLATION_LADDER).index(before) + 1:
            continue  # not adjacent rungs: more than one switch differs
        now, prev = _ok(results, variant), _ok(results, before)
        common = sorted(set(now) & set(prev))
        for name, direction in MECHANISM_SIGNALS[variant]:
            if name in PROBES:
                rows.append(_probe_signal(variant, name, direction, now, n_boot, seed))
            else:
                rows.append(
                    _paired_signal(variant, name, direction, now, prev, common, n_boot, seed)
                )
    return pd.DataFrame(rows, columns=MECHANISM_COLUMNS)


def _paired_signal(variant, name, direction, now, prev, common, n_boot, seed) -> dict[str, Any]:
    x = np.array([now[s]["signals"][name] for s in common])
    y = np.array([prev[s]["signals"][name] for s in common])
    p = paired_bootstrap((x - y)[:, None], n_boot, seed=seed)
    return {
        "variant": variant,
        "signal": name,
        "paper_direction": _DIRECTIONS[direction],
        "previous": float(np.mean(y)),
        "value": float(np.mean(x)),
        "delta": p.diff,
        "ci_low": p.low,
        "ci_high": p.high,
        "distinguishable": p.distinguishable,
        "as_paper": _verdict(direction, p),
    }


def _probe_signal(variant, name, direction, now, n_boot, seed) -> dict[str, Any]:
    """A probe's signal: on minus off at every step of the rung's own runs, paired within the
    step (``nested_bootstrap``: runs, then steps within them); ``previous`` and ``value`` are the
    readings with the switch off and on."""
    runs = [now[s].get("probes", {}).get(name) for s in sorted(now)]
    runs = [r for r in runs if r is not None and len(r)]
    row = {"variant": variant, "signal": name, "paper_direction": _DIRECTIONS[direction]}
    if not runs:  # the runs were trained without tracking.switch_probe
        nan = float("nan")
        return (
            row
            | dict.fromkeys(("previous", "value", "delta", "ci_low", "ci_high"), nan)
            | {
                "distinguishable": False,
                "as_paper": "not probed",
            }
        )
    p = nested_bootstrap([r[:, 0] - r[:, 1] for r in runs], n_boot, seed=seed)
    return row | {
        "previous": float(np.mean([r[:, 1].mean() for r in runs])),
        "value": float(np.mean([r[:, 0].mean() for r in runs])),
        "delta": p.diff,
        "ci_low": p.low,
        "ci_high": p.high,
        "distinguishable": p.distinguishable,
        "as_paper": _verdict(direction, p),
    }


def _verdict(direction: int, p: Paired) -> str:
    """Whether a signal moved as the paper says: distinguishably, in its direction."""
    if direction == 0:
        return "n/a"
    if np.isnan(p.low):
        return "needs 2+ seeds"
    return "yes" if p.distinguishable and np.sign(p.diff) == direction else "no"
