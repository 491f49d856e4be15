"""The statistics of the method comparison (``dapo compare``): what several seeds of each method
say about its stability, the variance of its updates and its sample efficiency.

The claims this tests are the ones texts on RL from preferences end with ("DPO: high sample
efficiency, low variance"; "GRPO: more stable than PPO, no critic"; "PPO: high variance,
sensitive to reward noise"). Each is read here as a number with its spread over seeds:

- stability: the seed standard deviation of the final held-out avg@k, and how many runs
  collapsed (ended below ``COLLAPSE_SHARE`` of the warm start's avg@k);
- variance: the coefficient of variation of the gradient norm over a run's steps (sd / mean: the
  losses differ in scale between methods, so a raw variance would compare their units), and the
  mean over steps of the variance of the batch's advantages;
- sample efficiency: held-out avg@k against responses generated and against tokens trained on,
  as curves whose points are averaged over seeds (``mean_curve``).

The methods themselves (:data:`METHODS`) and each RL method's config (:func:`method_configs`)
are here too, so that the command checks them before Prefect starts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import t as student_t

from dapo_core.ablation import apply_variant, split_sweep_overrides
from dapo_core.config import Config, ConfigError
from dapo_core.config_loader import resolve

ACCURACY = (0.0, 1.0)
"""Where an avg@k lies, and so its interval over seeds."""
COLLAPSE_SHARE = 0.5
"""A run collapsed when its final held-out avg@k is below this share of the warm start's."""


@dataclass(frozen=True)
class Spread:
    """A mean over seeds, the seeds' standard deviation and a Student-t CI of the mean over seeds
    (NaN where one seed cannot give them)."""

    mean: float
    sd: float
    low: float
    high: float
    n: int


def seed_spread(
    values: Sequence[float], level: float = 0.95, bounds: tuple[float, float] | None = None
) -> Spread:
    """mean +/- t(n - 1) * sd / sqrt(n), cut to ``bounds`` (an accuracy's [0, 1]). A comparison
    has 2-5 seeds, and a percentile bootstrap of so few values under-covers: with two it spans at
    most the two, and a 95% interval for a mean of two normal draws needs 12.7 standard errors
    each side."""
    x = np.asarray([v for v in values if np.isfinite(v)], dtype=np.float64)
    if x.size == 0:
        return Spread(float("nan"), float("nan"), float("nan"), float("nan"), 0)
    if x.size == 1:
        return Spread(float(x[0]), float("nan"), float("nan"), float("nan"), 1)
    mean, sd = float(x.mean()), float(x.std(ddof=1))
    half = float(student_t.ppf((1 + level) / 2, x.size - 1)) * sd / math.sqrt(x.size)
    low, high = mean - half, mean + half
    if bounds is not None:
        low, high = max(low, bounds[0]), min(high, bounds[1])
    return Spread(mean, sd, low, high, int(x.size))


def collapsed(final: float, start: float, share: float = COLLAPSE_SHARE) -> bool:
    """Whether a run ended below ``share`` of the warm start's held-out avg@k."""
    return bool(final < share * start)


def coefficient_of_variation(values: Sequence[float]) -> float:
    """sd / mean over a run's steps (sample sd); NaN for fewer than two finite values or a mean
    of zero."""
    x = np.asarray([v for v in values if np.isfinite(v)], dtype=np.float64)
    if x.size < 2 or x.mean() == 0:
        return float("nan")
    return float(x.std(ddof=1) / abs(x.mean()))


@dataclass(frozen=True)
class CurvePoint:
    """One point of a method's curve: the seeds' mean x, mean avg@k and its CI over seeds."""

    x: float
    y: float
    low: float
    high: float


def mean_curve(curves: Sequence[Sequence[tuple[float, float]]]) -> list[CurvePoint]:
    """The seeds' (x, y) curves averaged point by point: the i-th point of each (the same
    validation, e.g. after step 20), up to the shortest curve. x is averaged too (responses
    generated differ between seeds under dynamic sampling)."""
    n = min((len(c) for c in curves), default=0)
    points = []
    for i in range(n):
        xs = [c[i][0] for c in curves]
        s = seed_spread([c[i][1] for c in curves], bounds=ACCURACY)
        points.append(CurvePoint(float(np.mean(xs)), s.mean, s.low, s.high))
    return points


def cumulative(values: Sequence[float]) -> list[float]:
    """Running totals (responses generated, tokens trained on) of per-step counts."""
    return [float(v) for v in np.cumsum(np.asarray(values, dtype=np.float64))]


# The methods `dapo compare` runs; their configs are checked before anything starts.

RL_METHODS = {"ppo_rm": "ppo", "grpo": "grpo", "dapo": "dapo"}  # method -> variant
METHODS = ("ppo_rm", "dpo", "grpo", "dapo")
PREFERENCE_METHODS = {"ppo_rm", "dpo"}


def check_methods(methods: list[str] | None) -> list[str]:
    """The methods asked for, in the order given, each once; a one-line error for others."""
    names = list(dict.fromkeys(methods or METHODS))
    unknown = [m for m in names if m not in METHODS]
    if unknown:
        raise ConfigError(
            f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(METHODS)}"
        )
    return names


def split_methods_overrides(overrides: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """``-S`` as (for the config every method starts from, each preset's tuning of its own
    entries), as ``dapo ablate`` reads them: ``-S algo.critic.lr=1e-5`` sets ppo_rm's critic."""
    return split_sweep_overrides(list(RL_METHODS.values()), overrides)


def method_configs(cfg: Config, tuned: dict[str, list[str]], seed: int) -> dict[str, Config]:
    """Each RL method's config for ``seed`` (``ppo_rm``'s reward model is set once trained)."""
    seeded = resolve(cfg.to_dict(), overrides=[f"train.seed={seed}"])
    return {m: apply_variant(seeded, v, tuned[v]) for m, v in RL_METHODS.items()}
