"""Rollout corrections: the sampler's policy is not pi_old (docs/design.md section 5; verl
``rollout_corr_helper.py``).

The sampler (bf16 weights, other kernels, vLLM) draws responses from pi_rollout, slightly off the
pi_old that the loss's ratio assumes (``dapo_core.mismatch``). With the per-token log weight
log w_t = old_logp_t - rollout_logp_t on valid tokens, every entry is
``fn(batch: TokenBatch, p) -> (weights (B, T), keep_mask (B, T) bool, metrics)``:

- ``none``: weights 1, keeps every valid token (the identity, so a trainer calls a correction
  whether or not one is configured);
- ``token_tis``: w_t = min(exp(log w_t), cap), truncated importance sampling per token (Yao et
  al. 2025; also slime, SkyRL; ``dapo_core.mismatch.tis_weights``), keeps every token;
- ``seq_tis``: w_i = min(exp(sum_t log w_t), cap) per sequence, the sequence-level importance
  weight, truncated, broadcast to its tokens;
- ``token_mask`` (masked IS / IcePop): keeps only tokens with exp(log w_t) in [lo, hi], weight 1;
- ``seq_mask``: drops whole sequences whose geometric-mean weight exp(mean_t log w_t) is outside
  [lo, hi] (verl's geometric rejection: a per-token scale, so long and short responses are held
  to the same bound; the product of thousands of weights would reject almost any long one).

[lo, hi] = [0.5, 5] is verl's preset, cap = 2 the TIS papers' and verl's default.

Where we differ from verl (``rollout_corr_helper.py``), on purpose:
- direction: ``lo``/``hi`` bound w = pi_old / pi_rollout. verl's rejection criteria ``token_k1``
  and ``seq_mean_k1`` read their "lo_hi" threshold as bounds on the inverse, pi_rollout / pi_old.
  To keep the tokens verl's "0.5_5.0" keeps, type lo = 1/5 = 0.2 and hi = 1/0.5 = 2 here;
- ``seq_mask`` averages the raw log weights; verl clamps each to [-20, 20] first. One token with
  w = e^-100 in a 100-token sequence gives a geometric mean of e^-1 = 0.37 here (dropped at lo =
  0.5) and e^-0.2 = 0.82 in verl (kept): we take a token the sampler and the trainer disagree
  about by e^100 as evidence against the whole sequence rather than cap its say;
- no overflow anywhere: the truncated weights are exponentiated after their cap, the masks compare
  in log space. The weights are
constants (no gradient) and 1 on invalid tokens; ``keep_mask`` is a subset of ``batch.mask``. The
trainer multiplies the per-token policy loss by ``weights`` and aggregates with ``keep_mask`` as
the mask, the global count included (a dropped token is in neither numerator nor denominator).

Metrics: ``is_weight_mean`` (mean applied weight over kept tokens), ``is_capped_frac`` (share of
valid tokens, or sequences, whose weight was truncated), ``is_dropped_token_frac`` and
``is_dropped_seq_frac`` (share of valid tokens / non-empty sequences dropped).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from dapo_core.algos.registry import CORRECTIONS, NoParams, Params
from dapo_core.algos.types import Metrics, TokenBatch, masked, mean_over, share
from dapo_core.config import ConfigError


@dataclass(frozen=True)
class TisParams(Params):
    cap: float = 2.0

    def __post_init__(self) -> None:
        # below 1 even on-policy tokens (w = 1) would be scaled down: a learning-rate change
        self.require(self.cap >= 1, "cap", "must be >= 1")


@dataclass(frozen=True)
class SeqTisParams(TisParams):
    """``seq_tis``'s (its own class, so messages name it)."""


@dataclass(frozen=True)
class MaskParams(Params):
    lo: float = 0.5  # verl's preset
    hi: float = 5.0

    def __post_init__(self) -> None:
        # the bounds must keep the on-policy weight 1, or an exact rollout would be dropped
        self.require(0 < self.lo <= 1, "lo", "must be in (0, 1]")
        self.require(self.hi >= 1, "hi", "must be >= 1")


@dataclass(frozen=True)
class SeqMaskParams(MaskParams):
    """``seq_mask``'s (its own class, so messages name it)."""


def log_weights(batch: TokenBatch, entry: str) -> Tensor:
    """(B, T) log w = old_logp - rollout_logp on valid tokens, 0 elsewhere; detached."""
    if batch.rollout_logp is None:
        raise ConfigError(f"{entry}: needs the sampler's log-probs (TokenBatch.rollout_logp)")
    mask = batch.mask
    return masked(batch.old_logp.detach(), mask) - masked(batch.rollout_logp.detach(), mask)


def _nonempty(mask: Tensor) -> Tensor:
    return mask.any(dim=1)  # (B,)


def _metrics(weights: Tensor, keep: Tensor, mask: Tensor) -> Metrics:
    seq_valid = _nonempty(mask)
    return {
        "is_weight_mean": mean_over(weights, keep),
        "is_dropped_token_frac": share(~keep, mask),
        "is_dropped_seq_frac": share(~_nonempty(keep), seq_valid),
    }


@CORRECTIONS.register("token_tis", TisParams)
def token_tis(batch: TokenBatch, p: TisParams) -> tuple[Tensor, Tensor, Metrics]:
    """w_t = min(pi_old / pi_rollout, cap) per token; keeps every token.
    Source: Yao et al. 2025 ("Your Efficient RL Framework Secretly Brings You Off-Policy RL
    Training"); verl ``rollout_is="token"``."""
    log_w = log_weights(batch, p.entry)  # (B, T), 0 on padding -> weight 1
    capped = log_w > math.log(p.cap)
    weights = torch.exp(torch.clamp(log_w, max=math.log(p.cap)))  # no overflow to inf
    metrics = _metrics(weights, batch.mask, batch.mask)
    metrics["is_capped_frac"] = share(capped, batch.mask)
    return weights, batch.mask, metrics


@CORRECTIONS.register("seq_tis", SeqTisParams)
def seq_tis(batch: TokenBatch, p: SeqTisParams) -> tuple[Tensor, Tensor, Metrics]:
    """w_i = min(prod_t pi_old / pi_rollout, cap) = min(exp(sum_t log w_t), cap), broadcast to
    the sequence's tokens; keeps every token. Source: verl ``rollout_is="sequence"``."""
    mask = batch.mask
    log_w_seq = log_weights(batch, p.entry).sum(dim=1)  # (B,)
    capped = log_w_seq > math.log(p.cap)
    w_seq = torch.exp(torch.clamp(log_w_seq, max=math.log(p.cap)))  # (B,)
    weights = torch.where(mask, w_seq[:, None], torch.ones_like(w_seq[:, None]))  # (B, T)
    metrics = _metrics(weights, mask, mask)
    metrics["is_capped_frac"] = share(capped, _nonempty(mask))  # a share of sequences
    return weights, mask, metrics


@CORRECTIONS.register("none", NoParams)
def none(batch: TokenBatch, p: NoParams) -> tuple[Tensor, Tensor, Metrics]:
    """No correction: weights 1, every valid token kept, no metrics.
    Source: DAPO (its loss assumes the sampler is pi_old)."""
    return _ones(batch), batch.mask, {}


def _ones(batch: TokenBatch) -> Tensor:
    dtype = torch.promote_types(batch.old_logp.dtype, torch.float32)
    return torch.ones(batch.mask.shape, dtype=dtype, device=batch.mask.device)  # (B, T)


def _in_bounds(log_w: Tensor, p: MaskParams) -> Tensor:
    # compared in log space, as verl does: exp() of a large log weight overflows
    return (log_w >= math.log(p.lo)) & (log_w <= math.log(p.hi))


@CORRECTIONS.register("token_mask", MaskParams)
def token_mask(batch: TokenBatch, p: MaskParams) -> tuple[Tensor, Tensor, Metrics]:
    """Keep token t iff lo <= pi_old / pi_rollout <= hi; weights 1 (masked IS).
    Source: IcePop (Ling team, Ring-1T, 2025: [0.5, 5]); verl's token-level rejection."""
    keep = batch.mask & _in_bounds(log_weights(batch, p.entry), p)  # (B, T)
    weights = _ones(batch)
    return weights, keep, _metrics(weights, keep, batch.mask)


@CORRECTIONS.register("seq_mask", SeqMaskParams)
def seq_mask(batch: TokenBatch, p: SeqMaskParams) -> tuple[Tensor, Tensor, Metrics]:
    """Keep sequence i iff lo <= exp(mean_t log w_t) <= hi (the geometric mean of its token
    weights); weights 1. Source: verl's geometric (sequence-mean) rejection."""
    mask = batch.mask
    lengths = mask.sum(dim=1).clamp(min=1)  # (B,)
    log_w_mean = log_weights(batch, p.entry).sum(dim=1) / lengths  # (B,)
    keep = mask & _in_bounds(log_w_mean, p)[:, None]  # (B, T)
    weights = _ones(batch)
    return weights, keep, _metrics(weights, keep, mask)
