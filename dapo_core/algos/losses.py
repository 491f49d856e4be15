"""Policy losses: per-token surrogate losses, before aggregation (DAPO section 3, and peers).

Every entry is ``fn(batch: TokenBatch, p) -> (loss_t (B, T), metrics)``: the per-token loss, 0
where ``batch.mask`` is 0 (and never NaN there, even with -inf log-probs on padding), to be reduced
by an aggregation (``dapo_core.algos.aggregations``). With r = exp(logp - old_logp), A the advantage
and sg[] stop-gradient:

- ``clip`` (DAPO Eq. 10): l = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)), with the
  decoupled clip range of section 3.1 (eps_high = eps_low is the PPO/GRPO clip) and an optional
  dual clip c for A < 0: l = min(l, -A c) (Ye et al. 2020, off by default).
- ``gspo`` (GSPO, Zheng et al. 2025, arXiv 2507.18071; verl ``compute_policy_loss_gspo``): the
  same clipped form on the sequence ratio s_i = exp(mean_t (logp - old_logp)), written per token
  as r_it = exp(sg[log s_i] + logp_t - sg[logp_t]) (value s_i, gradient s_i * d logp_t).
- ``cispo`` (MiniMax-M1, 2025, arXiv 2506.13585):
  l = -sg[clip(r, 1 - eps_low, 1 + eps_high)] A logp, a REINFORCE loss weighted by a clipped,
  constant importance weight: no token loses its gradient.

Where an entry exponentiates a log-ratio it first clamps it to [-LOG_RATIO_BOUND,
LOG_RATIO_BOUND] = [-20, 20], as verl's ``compute_policy_loss_vanilla`` does: one stale or corrupted
log-prob (log r = 90) would otherwise make r, the loss and its gradient inf in float32 and bf16 and
poison the whole micro-batch. Inside the bound nothing changes; beyond it the token's loss is
that of r = e^20 (finite) and its gradient 0. Differences from verl, by entry: ``gspo`` clamps the
sequence log-ratio to the same two-sided bound where verl caps it above at 10 (here the loss stays
equal to ``clip`` for equal ratios up to e^20); ``cispo`` clamps before its weight, which any cap
below e^20 makes no difference to.

Metrics are (sum, count) pairs (``dapo_core.algos.types``): ``clip_frac_high`` = share of valid
tokens with A > 0 and r > 1 + eps_high, ``clip_frac_low`` = share with A < 0 and r < 1 - eps_low
(docs/design.md section 2), ``clip_high_old_prob`` = mean pi_old of the tokens clipped above
(whether the upper clip binds on low-probability tokens, as section 3.1 argues), ``ratio_mean``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dapo_core.algos.registry import POLICY_LOSSES, Params
from dapo_core.algos.types import Metrics, TokenBatch, masked, mean_over, share

LOG_RATIO_BOUND = 20.0  # verl's clamp on log(pi / pi_old) before exp (module docstring)


@dataclass(frozen=True)
class ClipParams(Params):
    eps_low: float = 0.2  # DAPO section 3.1 (Clip-Higher)
    eps_high: float = 0.28
    dual_clip_c: float | None = None  # off by default (docs/design.md section 2); e.g. 3 or 10

    def __post_init__(self) -> None:
        self.require(0 < self.eps_low < 1, "eps_low", "must be in (0, 1)")
        self.require(self.eps_high > 0, "eps_high", "must be > 0")
        c = self.dual_clip_c
        self.require(c is None or c > 1, "dual_clip_c", "must be null or > 1")


@dataclass(frozen=True)
class GspoParams(Params):
    eps_low: float = 3e-4  # the GSPO paper's experiments; verl's GSPO recipe
    eps_high: float = 4e-4

    def __post_init__(self) -> None:
        self.require(0 < self.eps_low < 1, "eps_low", "must be in (0, 1)")
        self.require(self.eps_high > 0, "eps_high", "must be > 0")


@dataclass(frozen=True)
class CispoParams(Params):
    """Bounds relative to 1, as the MiniMax-M1 paper writes them and verl reads them: the weight
    is clip(r, 1 - eps_low, 1 + eps_high), so eps_low/eps_high mean what they mean for ``clip``.
    The peers' absolute conventions map onto it: TRL's cap epsilon_high = 5 and SkyRL's [0, 5] are
    eps_low = 1, eps_high = 4 (the defaults); NeMo-RL's [0, 6] is eps_high = 5; verl's example
    (eps_low 10, eps_high 0.2) is a cap of 1.2. The paper imposes no lower bound (eps_low >= 1
    does that, since r > 0). Defaults: a cap of 5, the value the two peers that recommend one for
    general use agree on (verl's 1.2 comes from one 0.5B GSM8K example script, and a cap that low
    makes CISPO's weight nearly PPO's clip while keeping the clipped tokens' gradient)."""

    eps_low: float = 1.0
    eps_high: float = 4.0

    def __post_init__(self) -> None:
        self.require(self.eps_low >= 0, "eps_low", "must be >= 0")
        self.require(self.eps_high > 0, "eps_high", "must be > 0")


def _inputs(batch: TokenBatch) -> tuple[Tensor, Tensor, Tensor]:
    """logp (B, T), log r = logp - old_logp (B, T), clamped to +-LOG_RATIO_BOUND, and A (B, T),
    each 0 where the mask is 0.

    Zeroing before any arithmetic keeps padding finite: with -inf on both sides, logp - old_logp
    would be NaN, and exp() of a garbage ratio can overflow; ``where`` passes no gradient there."""
    mask = batch.mask
    logp = masked(batch.logp, mask)  # (B, T)
    log_ratio = logp - masked(batch.old_logp, mask).detach()  # (B, T)
    log_ratio = log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    return logp, log_ratio, masked(batch.advantages, mask)


def clipped_surrogate(ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float) -> Tensor:
    """(B, T) max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)), DAPO Eq. 10."""
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    return torch.maximum(unclipped, clipped)


def clip_metrics(
    ratio: Tensor, adv: Tensor, old_logp: Tensor, mask: Tensor, eps_low: float, eps_high: float
) -> Metrics:
    """Clip fractions (docs/design.md section 2), mean pi_old of clipped-above tokens, mean r."""
    ratio = ratio.detach()
    high = (adv > 0) & (ratio > 1.0 + eps_high)  # (B, T)
    low = (adv < 0) & (ratio < 1.0 - eps_low)
    old_prob = masked(old_logp.detach(), mask).exp()  # (B, T); garbage on padding never exp'd
    return {
        "clip_frac_high": share(high, mask),
        "clip_frac_low": share(low, mask),
        "clip_high_old_prob": mean_over(old_prob, high & mask),
        "ratio_mean": mean_over(ratio, mask),
    }


@POLICY_LOSSES.register("clip", ClipParams)
def clip(batch: TokenBatch, p: ClipParams) -> tuple[Tensor, Metrics]:
    """PPO clip with DAPO's decoupled range (Eq. 10), optional dual clip for A < 0:
    l = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)); if A < 0 and c: l = min(l, -A c).
    Source: DAPO section 3.1; dual clip: Ye et al. 2020 (verl ``compute_policy_loss_vanilla``)."""
    _, log_ratio, adv = _inputs(batch)
    ratio = torch.exp(log_ratio)  # (B, T), 1 on padding
    loss = clipped_surrogate(ratio, adv, p.eps_low, p.eps_high)  # (B, T)
    if p.dual_clip_c is not None:
        # For A < 0 the clipped loss still grows with r without bound; cap it at -A c.
        loss = torch.where(adv < 0, torch.minimum(loss, -adv * p.dual_clip_c), loss)
    metrics = clip_metrics(ratio, adv, batch.old_logp, batch.mask, p.eps_low, p.eps_high)
    return masked(loss, batch.mask), metrics


def sequence_log_ratio(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """(B,) log s_i = mean over the valid tokens of log r (0 for an empty row), as in GSPO."""
    lengths = mask.sum(dim=1).clamp(min=1)  # (B,)
    return log_ratio.sum(dim=1) / lengths


@POLICY_LOSSES.register("gspo", GspoParams)
def gspo(batch: TokenBatch, p: GspoParams) -> tuple[Tensor, Metrics]:
    """GSPO: the clip of Eq. 10 on the sequence ratio s_i = exp(mean_t (logp - old_logp)), as
    r_it = exp(sg[log s_i] + logp_t - sg[logp_t]) (value s_i, per-token gradient s_i d logp_t);
    l = max(-A r_it, -A clip(r_it, 1 - eps_low, 1 + eps_high)).
    Source: Zheng et al. 2025, the GSPO-token form; verl ``compute_policy_loss_gspo``, which
    also pins the aggregation to seq_mean_token_mean (here the aggregation is the config's)."""
    logp, log_ratio, adv = _inputs(batch)
    log_s = sequence_log_ratio(log_ratio, batch.mask).detach()  # (B,), within +-LOG_RATIO_BOUND
    # verl caps log s_i at 10; here the tokens' clamp bounds it, so the loss equals ``clip``'s
    # for equal ratios up to e^20.
    ratio = torch.exp(log_s[:, None] + logp - logp.detach())  # (B, T), value s_i
    loss = clipped_surrogate(ratio, adv, p.eps_low, p.eps_high)
    metrics = clip_metrics(ratio, adv, batch.old_logp, batch.mask, p.eps_low, p.eps_high)
    return masked(loss, batch.mask), metrics


@POLICY_LOSSES.register("cispo", CispoParams)
def cispo(batch: TokenBatch, p: CispoParams) -> tuple[Tensor, Metrics]:
    """CISPO: l = -sg[clip(r, 1 - eps_low, 1 + eps_high)] A logp; gradient -w A d logp for every
    token, the clipped ones included (PPO's clip zeroes theirs).
    Source: MiniMax-M1 (2025) section 3.1; verl ``compute_policy_loss_cispo``.
    Metrics: ``clip_frac_high``/``clip_frac_low`` count tokens whose weight is capped from above
    / below whatever the sign of A (the weight is capped for both signs; TRL counts A > 0 only)."""
    logp, log_ratio, adv = _inputs(batch)
    ratio = torch.exp(log_ratio).detach()  # (B, T)
    weight = torch.clamp(ratio, 1.0 - p.eps_low, 1.0 + p.eps_high)  # constant
    loss = -weight * adv * logp  # (B, T)
    mask = batch.mask
    metrics = {
        "clip_frac_high": share(ratio > 1.0 + p.eps_high, mask),
        "clip_frac_low": share(ratio < 1.0 - p.eps_low, mask),
        "ratio_mean": mean_over(ratio, mask),
    }
    return masked(loss, mask), metrics
