"""The metrics one training step logs (``train/*``), from its rollout log, its dynamic-sampling
statistics and its updates. Names are the ones the README documents."""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import torch

from dapo_core.config import Config
from dapo_core.errors import TrainingStopped
from dapo_core.overlong import shaped_rewards
from dapo_core.sampling import BatchStats
from dapo_core.signal import diagnose, group_signal
from tasks.training.distributed import all_reduce_max, all_reduce_sum

log = logging.getLogger(__name__)


def rollout_metrics(gen_log: dict[str, Any], cfg: Config) -> dict[str, float]:
    """What the policy did this step, over every sample generated (kept or not)."""
    a = cfg.algo
    acc = torch.tensor(gen_log["acc"], dtype=torch.bool)
    lengths = torch.tensor(gen_log["lengths"])
    finished = torch.tensor(gen_log["finished"], dtype=torch.bool)
    rewards = shaped_rewards(
        acc,
        lengths,
        overlong_shaping=a.overlong_shaping,
        max_len=cfg.rollout.max_response_len,
        cache_len=a.cache_len,
        factor=a.overlong_penalty_factor,
    )
    signal = group_signal(*group_tensors(gen_log, cfg.rollout.group_size))
    return {
        "train/reward_mean": rewards.mean().item(),
        "train/acc_mean": acc.float().mean().item(),
        "train/response_len_mean": lengths.float().mean().item(),
        "train/truncated_frac": (~finished).float().mean().item(),
        "train/samples_generated": float(acc.numel()),
        "train/mixed_group_frac": signal.mixed_group_frac,
        "train/parsed_frac": signal.parsed_frac,
    }


def group_tensors(
    gen_log: dict[str, Any], group_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(P, G) correctness, answer-found and finished flags of every group the step generated."""
    return tuple(
        torch.tensor(gen_log[k], dtype=torch.bool).view(-1, group_size)
        for k in ("acc", "parsed", "finished")
    )


def dynamic_sampling_metrics(ds: BatchStats) -> dict[str, float]:
    return {
        "train/kept_group_frac": ds.kept_group_frac,
        "train/num_gen_batches": float(ds.num_gen_batches),
        "train/groups_generated": float(ds.groups_generated),
        "train/groups_in_batch": float(ds.groups_in_batch),
        "train/carried_groups": float(ds.carried_over),
        "train/carried_age_mean": ds.mean_age,
        "train/samples_per_kept": ds.samples_per_kept if ds.groups_kept else 0.0,
        "train/hit_gen_cap": float(ds.hit_cap),
        "train/dropped_groups": float(ds.dropped),
    }


class UpdateSums:
    """One update's statistics, summed over its micro-batches (then over ranks) and turned into
    the per-update values ``update_metrics`` reads. A micro-batch's token means (clip shares,
    entropy) are weighted by its tokens; the mismatch sums count only freshly sampled tokens."""

    # summed as mean x tokens: clip_frac_high's sum is the count of tokens clipped above
    TOKEN_MEANS = ("clip_frac_high", "clip_frac_low", "entropy")
    TOTALS = ("loss", "tokens", "clip_high_old_prob_sum")
    MISMATCH = ("mismatch_abs_diff", "mismatch_kl", "mismatch_tokens")

    def __init__(self) -> None:
        self.sums = dict.fromkeys(self.TOKEN_MEANS + self.TOTALS + self.MISMATCH, 0.0)
        self.max_ratio = 0.0

    def add(self, micro: dict[str, float]) -> None:
        """One micro-batch's statistics (``policy_loss`` metrics, its entropy, loss, tokens)."""
        for k in self.TOKEN_MEANS:
            self.sums[k] += micro[k] * micro["tokens"]
        for k in self.TOTALS:
            self.sums[k] += micro[k]
        if micro.get("mismatch_tokens"):
            for k in self.MISMATCH:
                self.sums[k] += micro[k]
            self.max_ratio = max(self.max_ratio, micro["mismatch_max_ratio"])

    def all_reduce(self, world: int) -> None:
        keys = list(self.sums)
        self.sums = dict(
            zip(keys, all_reduce_sum([self.sums[k] for k in keys], world), strict=True)
        )
        self.max_ratio = all_reduce_max(self.max_ratio, world)

    def result(self) -> dict[str, float]:
        """Token means, the loss and token count, the tokens clipped above (shares x tokens are
        counts) with their summed pi_old, and the mismatch means when any were measured."""
        s, n = self.sums, self.sums["tokens"]
        out = {k: s[k] / n if n else 0.0 for k in self.TOKEN_MEANS}
        out |= {"loss": s["loss"], "tokens": n, "clip_high_tokens": s["clip_frac_high"]}
        out["clip_high_old_prob_sum"] = s["clip_high_old_prob_sum"]
        if n_mis := s["mismatch_tokens"]:
            out["mismatch_abs_diff"] = s["mismatch_abs_diff"] / n_mis
            out["mismatch_kl"] = s["mismatch_kl"] / n_mis
            out["mismatch_max_ratio"] = self.max_ratio
        return out


def update_metrics(updates: list[dict[str, float]], lr: float) -> dict[str, float]:
    """The step's loss-side metrics: means over its updates, except ``clip_high_old_prob``,
    pooled over every token the step clipped above."""

    def mean(key: str) -> float:
        return float(np.mean([u[key] for u in updates])) if updates else 0.0

    norms = [u["grad_norm"] for u in updates]
    mismatch = [u for u in updates if "mismatch_kl" in u]  # when the sampler gave log-probs
    if mismatch:
        extra = {
            "train/mismatch_abs_logp": float(np.mean([u["mismatch_abs_diff"] for u in mismatch])),
            "train/mismatch_kl": float(np.mean([u["mismatch_kl"] for u in mismatch])),
            "train/mismatch_max_ratio": max(u["mismatch_max_ratio"] for u in mismatch),
        }
    else:
        extra = {}
    clipped_above = sum(u.get("clip_high_tokens", 0.0) for u in updates)
    if clipped_above:  # the mean pi_old of the step's tokens clipped above
        prob = sum(u["clip_high_old_prob_sum"] for u in updates) / clipped_above
        extra["train/clip_high_old_prob"] = prob
    return extra | {
        "train/entropy": mean("entropy"),
        "train/clip_frac_low": mean("clip_frac_low"),
        "train/clip_frac_high": mean("clip_frac_high"),
        "train/grad_norm": float(np.nanmean(norms)) if any(map(math.isfinite, norms)) else 0.0,
        "train/loss": mean("loss"),
        "train/lr": lr,
        "train/skipped_updates": float(sum(not u["finite"] for u in updates)),
        "perf/padding_frac": mean("padding_frac"),
    }


class StallWatch:
    """Counts steps in a row whose groups carry no learning signal (not one mixed group, or not
    one parseable answer): each is warned about, and ``limit`` of them stop the run (0: never)."""

    def __init__(self, limit: int, group_size: int):
        self.limit, self.group_size = limit, group_size
        self.count = 0

    def observe(self, gen_log: dict[str, Any], step: int) -> None:
        signal = group_signal(*group_tensors(gen_log, self.group_size))
        why = diagnose(signal, min_mixed=1e-9)  # below any real share: not one mixed group
        if why is None and signal.parsed_frac > 0:
            self.count = 0
            return
        self.count += 1
        why = why or "no response had a parseable answer"
        log.warning("step %d: nothing to learn from (%d in a row): %s", step, self.count, why)
        if self.limit and self.count >= self.limit:
            raise TrainingStopped(
                f"{self.count} steps in a row had nothing to learn from: {why} "
                "(train.max_stalled_steps sets how many such steps a run tolerates)"
            )
