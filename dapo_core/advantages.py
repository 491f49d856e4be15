"""Group-relative advantages (DAPO Eq. 9, as in GRPO).

For each prompt, G responses form a group; each response's advantage is its reward standardised
within the group: A_i = (R_i - mean(R)) / (std(R) + 1e-6), with the unbiased std (as ``torch.std``).
A group whose rewards are all equal has no learning signal and gets A = 0 (dynamic sampling exists
to keep such groups out of the batch). The advantage is shared by every token of the response.
"""

from __future__ import annotations

import torch

EPS = 1e-6


def group_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """(P, G) rewards -> (P, G) advantages, Eq. 9."""
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must be (P, G) with G >= 2, got {tuple(rewards.shape)}")
    rewards = rewards.to(torch.float32)
    mean = rewards.mean(dim=1, keepdim=True)  # (P, 1)
    std = rewards.std(dim=1, unbiased=True, keepdim=True)  # (P, 1)
    # Exact zero for constant groups, rather than (tiny float error) / 1e-6.
    constant = (rewards == rewards[:, :1]).all(dim=1, keepdim=True)
    adv = (rewards - mean) / (std + EPS)
    return torch.where(constant, torch.zeros_like(adv), adv)
