"""What the algorithm entries take and give back: typed inputs, and metrics as (sum, count) pairs.

- :class:`TokenBatch`: one (micro-)batch of right-padded responses, the input of every policy loss
  and rollout correction.
- :class:`AdvantageInput` and :class:`Advantages`: the input and the output of every advantage
  estimator (all of them return the same type, so the trainer calls them all the same way).
- Metrics: every entry returns ``dict[str, (numerator, denominator)]`` of 0-dim detached tensors.
  Micro-batches and data-parallel ranks are then reduced generically, by summing numerators and
  denominators apart and dividing once at the end (:func:`reduce_metrics`), which is the exact
  mean over the whole mini-batch; a mean of per-micro-batch means is not (the reason DAPO's
  Eq. 12 needs a global token count, docs/design.md section 2).

Masks are bool; a mask of another dtype is converted on construction. Nothing here syncs with
the device: metrics stay tensors until the caller logs them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

Metric = tuple[Tensor, Tensor]  # (numerator, denominator), 0-dim, detached
Metrics = dict[str, Metric]


def _as_bool(obj: object, name: str) -> None:
    """Convert a mask field of a frozen dataclass to bool in place (a 0/1 float mask is common)."""
    value = getattr(obj, name)
    if value is not None and value.dtype != torch.bool:
        object.__setattr__(obj, name, value.bool())


def _check_shape(name: str, value: Tensor | None, shape: torch.Size) -> None:
    if value is not None and value.shape != shape:
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(value.shape)}")


@dataclass(frozen=True)
class TokenBatch:
    """One (micro-)batch of responses, right-padded to T."""

    logp: Tensor  # (B, T) current policy log-probs of the response tokens (requires grad)
    old_logp: Tensor  # (B, T) pi_old, detached (equal to logp.detach() where mask is 0)
    advantages: Tensor  # (B, T) per-token advantages
    mask: Tensor  # (B, T) bool: tokens that count (response, not padding, not overlong-filtered)
    rollout_logp: Tensor | None = None  # (B, T) the sampler's log-probs, for rollout correction
    ref_logp: Tensor | None = None  # (B, T) a frozen reference policy's, for KL

    def __post_init__(self) -> None:
        if self.logp.dim() != 2:
            raise ValueError(f"logp must be (B, T), got {tuple(self.logp.shape)}")
        for name in ("old_logp", "advantages", "mask", "rollout_logp", "ref_logp"):
            _check_shape(name, getattr(self, name), self.logp.shape)
        _as_bool(self, "mask")


@dataclass(frozen=True)
class AdvantageInput:
    """Rewards of P prompts x G responses; response row p * G + g is response g of prompt p."""

    rewards: Tensor  # (P, G) sequence rewards (group g of prompt p)
    mask: Tensor  # (P*G, T) bool response mask, row p*G+g
    values: Tensor | None = None  # (P*G, T) critic values, for gae
    token_rewards: Tensor | None = None
    """(P*G, T) per-token rewards added to the sequence reward, e.g. a KL penalty -beta * kl
    (``dapo_core.algos.kl.kl_reward_penalty``). Sequence-level estimators add their sum over the
    valid tokens to R (as verl sums token-level rewards into the score); per-token estimators
    add them token by token. None = no per-token rewards."""

    def __post_init__(self) -> None:
        if self.rewards.dim() != 2:
            raise ValueError(f"rewards must be (P, G), got {tuple(self.rewards.shape)}")
        p, g = self.rewards.shape
        if self.mask.dim() != 2 or self.mask.shape[0] != p * g:
            raise ValueError(f"mask must be (P*G, T) = ({p * g}, T), got {tuple(self.mask.shape)}")
        _check_shape("values", self.values, self.mask.shape)
        _check_shape("token_rewards", self.token_rewards, self.mask.shape)
        _as_bool(self, "mask")

    @property
    def group_size(self) -> int:
        return self.rewards.shape[1]


@dataclass(frozen=True)
class Advantages:
    """What every advantage estimator returns (with its metrics); 0 on invalid tokens."""

    advantages: Tensor  # (N, T) what the policy loss weighs each token by
    returns: Tensor
    """(N, T) the regression target of a critic: A + V for gae (before whitening, as in verl);
    the discounted return G_t for reinforce_pp (of R - group mean for its baseline variant);
    R on every valid token for the sequence-level estimators. Only a critic reads it; a
    critic-free trainer may ignore it."""


def masked(x: Tensor, mask: Tensor) -> Tensor:
    """``x`` where ``mask``, else 0. ``where``, not a product: inf * 0 would be NaN, and a NaN
    left at a masked position would reach the gradient through the backward of the product."""
    return torch.where(mask, x, torch.zeros_like(x))


def metric_dtype(x: Tensor) -> torch.dtype:
    """Sums in at least float32 (bf16 counts stop being exact at 256)."""
    return torch.promote_types(x.dtype, torch.float32)


def share(flags: Tensor, over: Tensor) -> Metric:
    """(number of positions where ``flags`` and ``over``, number where ``over``)."""
    return (flags & over).sum().detach().float(), over.sum().detach().float()


def mean_over(values: Tensor, over: Tensor) -> Metric:
    """(sum of ``values`` where ``over``, number of such positions)."""
    values = values.detach().to(metric_dtype(values))
    return masked(values, over).sum(), over.sum().to(values.dtype)


def reduce_metrics(parts: Iterable[Mapping[str, Metric]]) -> dict[str, Tensor]:
    """Sum numerators and denominators over micro-batches (or ranks), then divide; 0/0 -> 0.

    A key missing from some parts is reduced over the parts that have it."""
    sums: dict[str, list[Tensor]] = {}
    for part in parts:
        for key, (num, den) in part.items():
            if key in sums:
                sums[key][0] = sums[key][0] + num
                sums[key][1] = sums[key][1] + den
            else:
                sums[key] = [num, den]
    return {
        key: torch.where(den != 0, num / torch.where(den != 0, den, 1), torch.zeros_like(num))
        for key, (num, den) in sums.items()
    }
