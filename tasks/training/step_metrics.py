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


def update_metrics(updates: list[dict[str, float]], lr: float) -> dict[str, float]:
    """The step's loss-side metrics: means over its updates."""

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
