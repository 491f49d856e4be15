"""The metrics one training step logs (``train/*``), from its rollout log, its dynamic-sampling
statistics and its updates (``tasks.training.records``). Names are the ones
``dapo_core.metric_names`` documents (``dapo metrics`` lists them)."""

from __future__ import annotations

import logging
import math

import numpy as np
import torch

from dapo_core import metric_names as metric
from dapo_core.algorithm import rewards
from dapo_core.algos import Metrics
from dapo_core.config import Config
from dapo_core.errors import TrainingStopped
from dapo_core.sampling import BatchStats
from dapo_core.signal import diagnose, group_signal
from tasks.training.distributed import all_reduce_max, all_reduce_sum
from tasks.training.records import RolloutLog, UpdateResult

log = logging.getLogger(__name__)


def rollout_metrics(rollout: RolloutLog, cfg: Config) -> dict[str, float]:
    """What the policy did this step, over every sample generated (kept or not)."""
    acc = torch.tensor(rollout.acc, dtype=torch.bool)
    lengths = torch.tensor(rollout.lengths)
    finished = torch.tensor(rollout.finished, dtype=torch.bool)
    learned = torch.tensor(rollout.scores) if rollout.scores else None
    reward = rewards(cfg.algo, acc, lengths, cfg.rollout.max_response_len, learned)
    signal = group_signal(*rollout.group_tensors(cfg.rollout.group_size))
    return {
        metric.REWARD_MEAN: reward.mean().item(),
        metric.ACC_MEAN: acc.float().mean().item(),
        metric.RESPONSE_LEN_MEAN: lengths.float().mean().item(),
        metric.TRUNCATED_FRAC: (~finished).float().mean().item(),
        metric.SAMPLES_GENERATED: float(acc.numel()),
        metric.MIXED_GROUP_FRAC: signal.mixed_group_frac,
        metric.PARSED_FRAC: signal.parsed_frac,
        metric.PROMPTS_TRUNCATED: rollout.prompts_truncated,
    }


def dynamic_sampling_metrics(ds: BatchStats) -> dict[str, float]:
    return {
        metric.KEPT_GROUP_FRAC: ds.kept_group_frac,
        metric.NUM_GEN_BATCHES: float(ds.num_gen_batches),
        metric.GROUPS_GENERATED: float(ds.groups_generated),
        metric.GROUPS_IN_BATCH: float(ds.groups_in_batch),
        metric.CARRIED_GROUPS: float(ds.carried_over),
        metric.CARRIED_AGE_MEAN: ds.mean_age,
        metric.SAMPLES_PER_KEPT: ds.samples_per_kept if ds.groups_kept else 0.0,
        metric.HIT_GEN_CAP: float(ds.hit_cap),
        metric.DROPPED_GROUPS: float(ds.dropped),
    }


class UpdateSums:
    """One update's statistics, summed over its micro-batches (then over ranks) and turned into
    the per-update values ``update_metrics`` reads. The entropy (a token mean) is weighted by
    each micro-batch's tokens; the mismatch sums count only freshly sampled tokens; the
    algorithm entries' metrics are (numerator, denominator) pairs, summed apart and divided once
    (``dapo_core.algos.reduce_metrics``), whatever entries emitted them."""

    TOKEN_MEANS = ("entropy",)
    TOTALS = ("loss", "tokens")
    MISMATCH = ("mismatch_abs_diff", "mismatch_kl", "mismatch_tokens")

    def __init__(self) -> None:
        self.sums = dict.fromkeys(self.TOKEN_MEANS + self.TOTALS + self.MISMATCH, 0.0)
        self.max_ratio = 0.0
        self.entries: dict[str, list[float]] = {}  # name -> [numerator, denominator]
        self._pending: list[tuple[list[str], list[str], torch.Tensor, bool]] = []

    def add_micro(
        self, stats: dict[str, torch.Tensor], entries: Metrics, real: bool = True
    ) -> None:
        """One micro-batch: its statistics and its entries' metrics, kept on the device until
        the update's end (:meth:`_flush`: one host transfer for all micro-batches, so the host
        queues the next micro-batch while the device still runs this one's backward). A
        padding micro-batch (``real`` false) adds nothing but its metric names, so that every
        rank all-reduces the same list."""
        values = [v.detach().float() for v in stats.values()]
        names = sorted(entries)
        values += [entries[k][i].detach().float() for k in names for i in (0, 1)]
        self._pending.append((list(stats), names, torch.stack(values), real))

    def _flush(self) -> None:
        """Add the pending micro-batches, in their order (the sums are those of adding each
        as it came)."""
        if not self._pending:
            return
        rows = torch.cat([flat for _, _, flat, _ in self._pending]).tolist()
        for keys, names, flat, real in self._pending:
            values, rows = rows[: len(flat)], rows[len(flat) :]
            for k in names:
                self.entries.setdefault(k, [0.0, 0.0])
            if not real:
                continue
            self.add(dict(zip(keys, values, strict=False)))
            pairs = values[len(keys) :]
            for j, k in enumerate(names):
                self.entries[k][0] += pairs[2 * j]
                self.entries[k][1] += pairs[2 * j + 1]
        self._pending = []

    def add(self, micro: dict[str, float]) -> None:
        """One micro-batch's statistics (its entropy, loss, tokens, mismatch sums)."""
        for k in self.TOKEN_MEANS:
            self.sums[k] += micro[k] * micro["tokens"]
        for k in self.TOTALS:
            self.sums[k] += micro[k]
        if micro.get("mismatch_tokens"):
            for k in self.MISMATCH:
                self.sums[k] += micro[k]
            self.max_ratio = max(self.max_ratio, micro["mismatch_max_ratio"])

    def all_reduce(self, world: int) -> None:
        self._flush()
        keys = list(self.sums)
        names = sorted(self.entries)
        flat = [self.sums[k] for k in keys] + [x for k in names for x in self.entries[k]]
        flat = all_reduce_sum(flat, world)
        self.sums = dict(zip(keys, flat[: len(keys)], strict=True))
        pairs = flat[len(keys) :]
        self.entries = {k: [pairs[2 * j], pairs[2 * j + 1]] for j, k in enumerate(names)}
        self.max_ratio = all_reduce_max(self.max_ratio, world)

    def result(self, grad_norm: float, applied: bool, padding_frac: float) -> UpdateResult:
        """Token means, the loss and token count, the mismatch means when any were measured,
        and each entry metric's summed (numerator, denominator); with the optimizer step's
        gradient norm and whether it was applied, and the update's padding share."""
        s, n = self.sums, self.sums["tokens"]
        mismatch = None
        if n_mis := s["mismatch_tokens"]:
            mismatch = {
                "abs_diff": s["mismatch_abs_diff"] / n_mis,
                "kl": s["mismatch_kl"] / n_mis,
                "max_ratio": self.max_ratio,
            }
        entropy = s["entropy"] / n if n else 0.0
        return UpdateResult(
            loss=s["loss"],
            tokens=n,
            entropy=entropy,
            entries=dict(self.entries),
            mismatch=mismatch,
            grad_norm=grad_norm,
            applied=applied,
            padding_frac=padding_frac,
        )


POOLED_OVER_STEP = ("clip_high_old_prob",)
"""Entry metrics over a subset of tokens that many updates lack (the tokens clipped above): pooled
over the step's updates, and logged only when some update had such tokens. Every other entry
metric is the mean over the step's updates of each update's value, as the loss is."""


def entry_metrics(updates: list[UpdateResult], names: list[str] = ()) -> dict[str, float]:
    """``train/<name>`` of every metric the algorithm entries emitted, and of ``names`` (the
    entries' metrics: an update without tokens counts 0 for them, as a share of no tokens)."""
    parts = [u.entries for u in updates]
    out = {}
    for name in sorted({*names, *(k for p in parts for k in p)}):
        pairs = [p.get(name, (0.0, 0.0)) for p in parts]
        if name in POOLED_OVER_STEP:
            num, den = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
            if den:
                out[f"train/{name}"] = num / den
        else:
            values = [num / den if den else 0.0 for num, den in pairs]
            out[f"train/{name}"] = float(np.mean(values)) if values else 0.0
    return out


def update_metrics(
    updates: list[UpdateResult], lr: float, names: list[str] = ()
) -> dict[str, float]:
    """The step's loss-side metrics: means over its updates, and the entries' metrics
    (:func:`entry_metrics`)."""

    def mean(values: list[float]) -> float:
        return float(np.mean(values)) if values else 0.0

    norms = [u.grad_norm for u in updates]
    mismatch = [u.mismatch for u in updates if u.mismatch]  # when the sampler gave log-probs
    extra = {}
    if mismatch:
        extra = {
            metric.MISMATCH_ABS_LOGP: mean([m["abs_diff"] for m in mismatch]),
            metric.MISMATCH_KL: mean([m["kl"] for m in mismatch]),
            metric.MISMATCH_MAX_RATIO: max(m["max_ratio"] for m in mismatch),
        }
    return (
        extra
        | entry_metrics(updates, names)
        | {
            metric.ENTROPY: mean([u.entropy for u in updates]),
            metric.GRAD_NORM: float(np.nanmean(norms)) if any(map(math.isfinite, norms)) else 0.0,
            metric.LOSS: mean([u.loss for u in updates]),
            metric.LR: lr,
            metric.SKIPPED_UPDATES: float(sum(not u.applied for u in updates)),
            metric.PADDING_FRAC: mean([u.padding_frac for u in updates]),
        }
    )


class StallWatch:
    """Counts steps in a row whose groups carry no learning signal (not one mixed group, or not
    one parseable answer; under a learned reward, not one group of unequal scores): each is
    warned about, and ``limit`` of them stop the run (0: never)."""

    def __init__(self, limit: int, group_size: int):
        self.limit, self.group_size = limit, group_size
        self.count = 0

    def observe(self, rollout: RolloutLog, step: int) -> None:
        if rollout.scores:  # a learned reward: a group of unequal scores carries signal
            scores = torch.tensor(rollout.scores).view(-1, self.group_size)
            spread = bool((scores.max(1).values > scores.min(1).values).any())
            why = None if spread else "every group's reward-model scores are equal"
        else:
            signal = group_signal(*rollout.group_tensors(self.group_size))
            why = diagnose(signal, min_mixed=1e-9)  # below any real share: not one mixed group
            if why is None and signal.parsed_frac == 0:
                why = "no response had a parseable answer"
        if why is None:
            self.count = 0
            return
        self.count += 1
        log.warning("step %d: nothing to learn from (%d in a row): %s", step, self.count, why)
        if self.limit and self.count >= self.limit:
            raise TrainingStopped(
                f"{self.count} steps in a row had nothing to learn from: {why} "
                "(train.max_stalled_steps sets how many such steps a run tolerates)"
            )
