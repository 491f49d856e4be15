"""The metrics one training step logs (``train/*``), from its rollout log, its dynamic-sampling
statistics and its updates. Names are the ones the README documents."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from dapo_core.config import Config
from dapo_core.overlong import shaped_rewards
from dapo_core.sampling import BatchStats


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
    return {
        "train/reward_mean": rewards.mean().item(),
        "train/acc_mean": acc.float().mean().item(),
        "train/response_len_mean": lengths.float().mean().item(),
        "train/truncated_frac": (~finished).float().mean().item(),
    }


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
    return {
        "train/entropy": mean("entropy"),
        "train/clip_frac_low": mean("clip_frac_low"),
        "train/clip_frac_high": mean("clip_frac_high"),
        "train/grad_norm": float(np.nanmean(norms)) if any(map(math.isfinite, norms)) else 0.0,
        "train/loss": mean("loss"),
        "train/lr": lr,
        "train/skipped_updates": float(sum(not u["finite"] for u in updates)),
    }
