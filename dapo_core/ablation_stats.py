"""What each Table 1 switch is supposed to move, measured per run, and a paired comparison of
each rung with the one before it.

DAPO (arXiv 2503.14476) motivates each component by a quantity it changes, not only by the final
score: clip-higher keeps the policy's entropy from collapsing (section 3.1, Fig. 2), dynamic
sampling keeps every group in the batch informative (3.2), token-level loss lets long responses
weigh in proportion to their tokens (3.3, Fig. 4), and overlong shaping penalises responses that
run into the length limit (3.4, Fig. 5). ``run_signals`` reduces one run's per-step ``train/*``
metrics to those quantities; ``paired_bootstrap`` compares two rungs run on the same seeds and
problems. A switch whose effect is too small to see across runs is also read within each step of
its rung's runs by a probe (``PROBES``, ``probed_switch``, ``probe_steps``): the same update made
with the switch on and off.

Rungs are compared pairwise with the rung before them because the ladder is cumulative: the
difference between adjacent rungs is the effect of the one switch that differs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from dapo_core import metric_names as metric
from dapo_core.ablation import ABLATION_LADDER


@dataclass(frozen=True)
class Signal:
    """One per-run quantity: how it is reduced from the per-step history, and its meaning."""

    name: str
    metric: str  # the per-step metric it reads
    window: str  # "all" steps, the "late" half, or "growth" (last quarter minus first quarter)
    label: str


SIGNALS: tuple[Signal, ...] = (
    Signal("entropy", metric.ENTROPY, "all", "mean token entropy of the policy (nats)"),
    Signal("clip_frac_high", metric.CLIP_FRAC_HIGH, "all", "share of tokens clipped above"),
    Signal(
        "clip_high_prob",
        metric.CLIP_HIGH_OLD_PROB,
        "all",
        "mean probability (before the step) of the tokens clipped above",
    ),
    Signal("truncated_frac", metric.TRUNCATED_FRAC, "late", "share of responses truncated"),
    Signal("response_len", metric.RESPONSE_LEN_MEAN, "late", "mean response length (tokens)"),
    Signal("len_growth", metric.RESPONSE_LEN_MEAN, "growth", "response length growth (tokens)"),
    Signal(
        "long_weight_share",
        metric.LONG_WEIGHT_SHARE,
        "all",
        "loss weight on the longer half of responses",
    ),
    Signal("kept_group_frac", metric.KEPT_GROUP_FRAC, "all", "share of groups kept"),
    Signal("samples_per_step", metric.SAMPLES_GENERATED, "all", "responses generated per step"),
    Signal("train_acc", metric.ACC_MEAN, "late", "training accuracy, late half"),
)
"""Every per-run signal the ablation table reports (the ``train/*`` metric each reads)."""


@dataclass(frozen=True)
class Probe:
    """A signal read inside each run by a switch probe (``tracking.switch_probe``): every step
    makes the same update with the rung's switch on and off and reads ``on`` and ``off`` after
    each. Paired within the step, it is free of the trajectory noise that separates two runs."""

    name: str
    on: str  # the per-step metric after the update with the switch on
    off: str  # and with it off
    label: str


PROBES: dict[str, Probe] = {
    "entropy_probe": Probe(
        "entropy_probe",
        metric.ENTROPY_ON,
        metric.ENTROPY_OFF,
        "entropy after the same update, switch on against off",
    ),
}
"""Every probe signal the mechanism table reports, by name."""

MECHANISM_SIGNALS: dict[str, tuple[tuple[str, int], ...]] = {
    "+overlong_filtering": (("truncated_frac", 0),),
    "+clip_higher": (("entropy", +1), ("entropy_probe", +1), ("clip_frac_high", -1)),
    "+overlong_shaping": (("truncated_frac", -1), ("response_len", -1)),
    "+token_level_loss": (("long_weight_share", +1), ("len_growth", +1)),
    "+dynamic_sampling": (("train_acc", +1), ("samples_per_step", +1)),
}
"""Rung -> the signals its switch should move, each with the paper's direction (+1 up, -1 down,
0 none claimed), the first the headline one:

- overlong filtering stops punishing truncated responses (3.4): the paper claims stability, not a
  direction of the truncated share, so it is reported without one;
- clip-higher (3.1) keeps entropy up by letting low-probability tokens grow: across runs, and
  within each step by a probe (the same update with the switch off); mechanically, fewer tokens
  reach the raised upper clip;
- overlong shaping (3.4) penalises the buffer before the limit: fewer truncated, shorter responses;
- token-level loss (3.3) weighs long responses by their tokens, and the paper reports healthier
  length growth under it (Fig. 4);
- dynamic sampling (3.2) trains only on mixed groups, so at the same step training accuracy (over
  every response generated) is higher, for more responses generated per step (Fig. 6)."""


def run_signals(history: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """One run's per-step metrics (in step order) -> each ``SIGNALS`` value (NaN when the run
    never logged the metric)."""
    out = {}
    for s in SIGNALS:
        x = np.array([h[s.metric] for h in history if s.metric in h], dtype=np.float64)
        out[s.name] = _reduce(x, s.window)
    return out


def probed_switch(variant: str) -> str | None:
    """The switch a rung's runs probe: the one it adds to the rung before, when one of its
    signals is a probe's (``PROBES``); None otherwise."""
    if not any(name in PROBES for name, _ in MECHANISM_SIGNALS.get(variant, ())):
        return None
    rungs = list(ABLATION_LADDER)
    before = ABLATION_LADDER[rungs[rungs.index(variant) - 1]]
    (added,) = (k for k, on in ABLATION_LADDER[variant].items() if on and not before[k])
    return added


def probe_steps(history: Sequence[Mapping[str, float]], probe: Probe) -> np.ndarray:
    """One run's per-step (on, off) readings of a probe, as an (steps, 2) array."""
    rows = [(h[probe.on], h[probe.off]) for h in history if probe.on in h and probe.off in h]
    return np.array(rows, dtype=np.float64).reshape(-1, 2)


def _reduce(x: np.ndarray, window: str) -> float:
    if x.size == 0:
        return float("nan")
    if window == "all":
        return float(x.mean())
    if window == "late":
        return float(x[x.size // 2 :].mean())
    q = max(1, x.size // 4)  # "growth": last quarter minus first quarter
    return float(x[-q:].mean() - x[:q].mean())


@dataclass(frozen=True)
class Paired:
    """A paired difference (this rung minus the one before) with its percentile bootstrap CI."""

    diff: float
    low: float
    high: float

    @property
    def distinguishable(self) -> bool:
        """Whether the 95% CI excludes zero."""
        return self.low > 0 or self.high < 0


def paired_bootstrap(
    diffs: np.ndarray, n_boot: int = 2000, alpha: float = 0.05, seed: int = 0
) -> Paired:
    """Mean of paired differences over (seeds, problems) with a two-level percentile bootstrap.

    ``diffs`` is (S, P): seed s, problem p, this rung minus the previous one on the same seed
    and problem (P = 1 for a per-run signal). Seeds and problems are resampled independently,
    with replacement: both are sources of variance (a seed's trajectory, a problem's
    difficulty), and pairing removes what the two rungs share."""
    d = np.asarray(diffs, dtype=np.float64)
    if d.ndim == 1:
        d = d[:, None]
    if d.size == 0:
        return Paired(float("nan"), float("nan"), float("nan"))
    if d.size == 1:  # one pair: no spread to resample, so no interval (and never distinguishable)
        return Paired(float(d.mean()), float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    S, P = d.shape
    si = rng.integers(0, S, size=(n_boot, S))  # resampled seeds
    pi = rng.integers(0, P, size=(n_boot, P))  # resampled problems
    # mean over the resampled grid = mean over resampled seeds of the row means at resampled
    # problems; computed per replicate without building (n_boot, S, P).
    means = np.array([d[np.ix_(si[b], pi[b])].mean() for b in range(n_boot)])
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return Paired(float(d.mean()), float(low), float(high))


def nested_bootstrap(
    runs: Sequence[np.ndarray], n_boot: int = 2000, alpha: float = 0.05, seed: int = 0
) -> Paired:
    """Mean of per-step paired differences over runs, with a two-stage percentile bootstrap.

    ``runs`` holds one array per run (seed): its per-step differences, switch on minus off (a
    probe's). Unlike problems, steps are not shared between runs (step 5 of one seed has nothing
    in common with step 5 of another), so they are nested in runs, not crossed with them: each
    replicate resamples runs, then steps within each resampled run. Every run weighs the same,
    whatever its length; one run still gets an interval (over its steps), but one step does not."""
    kept = [np.asarray(r, dtype=np.float64) for r in runs if len(r)]
    if not kept:
        return Paired(float("nan"), float("nan"), float("nan"))
    diff = float(np.mean([r.mean() for r in kept]))
    if sum(r.size for r in kept) == 1:
        return Paired(diff, float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    means = np.empty(n_boot)
    for b in range(n_boot):
        picked = (kept[i] for i in rng.integers(0, len(kept), size=len(kept)))
        means[b] = np.mean([r[rng.integers(0, r.size, size=r.size)].mean() for r in picked])
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return Paired(diff, float(low), float(high))
