"""The DAPO policy-gradient loss: decoupled clip (Eq. 10) with token- or sample-level aggregation.

Per token, with r = exp(logp - old_logp) and advantage A (Eq. 10):

    l = max(-A * r, -A * clip(r, 1 - eps_low, 1 + eps_high))

``clip_higher=False`` gives the symmetric PPO/GRPO clip (eps_high = eps_low). An optional dual clip
(c > 1) bounds the loss of negative-advantage tokens at -A * c (an extra, off by default).

Aggregation (section 3.3):

- token-level (Eq. 12): sum of l over all valid tokens / the number of valid tokens in the whole
  mini-batch, so a long response weighs in proportion to its length;
- sample-level (GRPO): mean over sequences of each sequence's token mean.

The denominator must be global across gradient-accumulation micro-batches and data-parallel ranks
(verl's per-micro-batch token mean is a known bug): the trainer passes ``normalizer``, the count
over the whole mini-batch, and then the sum of micro-batch losses equals the full-batch loss.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from dapo_core.config import LossConfig
from dapo_core.mismatch import tis_weights


def effective_eps_high(cfg: LossConfig) -> float:
    """The upper clip range: decoupled when ``clip_higher``, else equal to eps_low (section 3.1)."""
    return cfg.eps_high if cfg.clip_higher else cfg.eps_low


def per_token_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip_c: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) clipped surrogate loss of Eq. 10 and the (B, T) importance ratio r."""
    ratio = torch.exp(logp - old_logp)  # (B, T)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    loss = torch.maximum(unclipped, clipped)  # (B, T)
    if dual_clip_c is not None:
        # Dual clip: for A < 0 the loss grows with r without bound; cap it at -A * c.
        capped = torch.minimum(loss, -advantages * dual_clip_c)
        loss = torch.where(advantages < 0, capped, loss)
    return loss, ratio


def aggregate(
    loss: torch.Tensor,
    mask: torch.Tensor,
    token_level_loss: bool,
    normalizer: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce (B, T) per-token losses to a scalar: Eq. 12 (token-level) or the GRPO sample mean.

    token-level: sum(l * mask) / normalizer, default normalizer = number of valid tokens.
    sample-level: sum_i mean_t(l_i) / normalizer, default = number of non-empty sequences.
    """
    # where, not multiply: an inf at a masked position would give inf * 0 = NaN.
    masked = torch.where(mask.bool(), loss, torch.zeros_like(loss))
    mask = mask.to(loss.dtype)
    if token_level_loss:
        total = masked.sum()
        denom = mask.sum() if normalizer is None else normalizer
    else:
        lengths = mask.sum(dim=1)  # (B,)
        seq_mean = masked.sum(dim=1) / lengths.clamp(min=1)  # (B,); empty rows are 0
        total = seq_mean.sum()
        denom = (lengths > 0).sum() if normalizer is None else normalizer
    # An empty batch (everything masked) contributes nothing instead of 0/0 = NaN.
    denom = torch.as_tensor(denom, dtype=loss.dtype, device=loss.device).clamp(min=1)
    return total / denom


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    cfg: LossConfig,
    normalizer: float | torch.Tensor | None = None,
    rollout_logp: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The DAPO loss of one (micro-)batch and its metrics.

    Shapes: ``logp``, ``old_logp``, ``response_mask`` (B, T); ``advantages`` (B,) or (B, T).
    ``response_mask`` is 1 on response tokens that count (0 on padding, prompt, and
    overlong-filtered responses). Metrics are detached 0-dim tensors (no host sync in the hot path):
    ``clip_frac_high`` = share of valid tokens with A > 0 and r > 1 + eps_high, ``clip_frac_low`` =
    share with A < 0 and r < 1 - eps_low, ``clip_high_old_prob_sum`` = the sum of pi_old over the
    tokens clipped above (whether the upper clip binds on low-probability tokens, as DAPO section
    3.1 argues it does), plus ``ratio_mean`` and ``num_tokens``.

    ``rollout_logp`` (B, T), the sampler's log-probs of the same tokens: when ``cfg.tis_cap`` is
    set, each token's loss is weighted by the truncated importance weight
    min(pi_old / pi_rollout, C) (``dapo_core.mismatch``).
    """
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(logp)  # (B, T)
    valid = response_mask.bool()
    # Padding may hold any log-prob; pin the ratio to 1 there so exp() cannot overflow into NaN
    # gradients (a masked inf still poisons backward through exp).
    old_logp = torch.where(valid, old_logp, logp.detach())
    eps_high = effective_eps_high(cfg)
    loss_t, ratio = per_token_loss(
        logp, old_logp, advantages, cfg.eps_low, eps_high, cfg.dual_clip_c
    )
    if cfg.tis_cap is not None:
        if rollout_logp is None:
            raise ValueError("tis_cap is set but no rollout log-probs were given")
        loss_t = loss_t * tis_weights(old_logp, rollout_logp, response_mask, cfg.tis_cap)
    loss = aggregate(loss_t, response_mask, cfg.token_level_loss, normalizer)

    with torch.no_grad():
        mask = response_mask.to(torch.float32)
        n = mask.sum().clamp(min=1)
        high = ((advantages > 0) & (ratio > 1.0 + eps_high)).to(torch.float32)
        low = ((advantages < 0) & (ratio < 1.0 - cfg.eps_low)).to(torch.float32)
        metrics = {
            "clip_frac_high": (high * mask).sum() / n,
            "clip_high_old_prob_sum": (high * mask * old_logp.exp()).sum(),
            "clip_frac_low": (low * mask).sum() / n,
            "ratio_mean": (ratio.detach() * mask).sum() / n,
            "num_tokens": mask.sum(),
        }
    return loss, metrics


def long_weight_share(
    lengths: Sequence[int], token_level: bool = True, weights: Sequence[float] | None = None
) -> float:
    """Share of a batch's loss weight carried by its responses longer than the median length.

    Under the token-level loss (Eq. 12) each token weighs the same, so a response weighs in
    proportion to its length; under the sample-level loss (GRPO) each response weighs the same
    whatever its length. ``weights``, when given, are each response's weight as the configured
    aggregation gives it (``dapo_core.algorithm.response_weights``) and ``token_level`` is
    ignored. 0.0 for an empty batch."""
    n = np.asarray(lengths, dtype=np.float64)
    if weights is None:
        weight = n if token_level else np.ones_like(n)
    else:
        weight = np.asarray(weights, dtype=np.float64)
    weight = weight[n > 0]
    n = n[n > 0]
    if n.size == 0:
        return 0.0
    return float(weight[n > np.median(n)].sum() / weight.sum())
