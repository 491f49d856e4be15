"""The critic of PPO: its clipped value loss, its parameters, and how well it explains the returns.

A critic (``algo.critic``) is a value model V(s_t) trained beside the policy, read by the
advantage estimators whose parameters say ``needs_critic`` (``gae``). ``{name: none}`` is off
(every critic-free algorithm); ``{name: value, ...}`` is the one entry, whose function is the
per-token clipped value loss (PPO, Schulman et al. 2017; verl ``compute_value_loss``, from TRL):

    V_clip = clip(V, V_old - eps, V_old + eps)
    l_t    = 0.5 * max((V - R)^2, (V_clip - R)^2)

with V the critic's value of token t now, V_old its value when the rollout's advantages were
computed (a no-grad pass before the step's first update), R the return (``Advantages.returns``:
A + V_old for ``gae``, before whitening) and eps ``cliprange_value``. The trainer aggregates it as
a token mean over the mini-batch with a global count (verl's default ``token-mean``; Eq. 12's
normaliser), so micro-batches and ranks add up to the whole mini-batch's loss.

Metrics, as (numerator, denominator) pairs: ``value_loss`` (the mean of l_t over the update's
tokens), ``value_clip_frac`` (share of tokens whose clipped term is the larger, verl's
``vf_clipfrac``); and, once per step before the updates, over the tokens the critic learns
from (the trainer leaves out overlong-filtered responses, as the value loss does),
``explained_variance`` = 1 - Var(R - V_old) / Var(R) (verl ``vf_explained_var``; 1 is a perfect
critic, 0 one no better than the mean return, negative worse), written as the pair
(Var(R) - Var(R - V_old), Var(R)): 0 when the returns are constant.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dapo_core.algos.registry import CRITICS, Params
from dapo_core.algos.types import Metric, Metrics, masked, mean_over, metric_dtype, share


@dataclass(frozen=True)
class ValueParams(Params):
    """The critic: a value model, its optimizer and its loss's clip."""

    cliprange_value: float = 0.5  # verl's critic.cliprange_value
    lr: float | None = None  # AdamW learning rate; null: train.lr (verl's critic: 1e-5)
    weight_decay: float | None = None  # null: train.weight_decay (verl's critic: 0.01)
    grad_clip: float | None = None  # gradient-norm clip; null: train.grad_clip (verl's: 1.0)
    model: str = "policy"
    """``policy``: the policy's transformer (the run's starting model) with a scalar head; else
    a model directory or hub id (e.g. a smaller model) whose tokenizer is the policy's."""

    def __post_init__(self) -> None:
        self.require(self.cliprange_value > 0, "cliprange_value", "must be > 0")
        self.require(self.lr is None or self.lr > 0, "lr", "must be null or > 0")
        wd = self.weight_decay
        self.require(wd is None or wd >= 0, "weight_decay", "must be null or >= 0")
        gc = self.grad_clip
        self.require(gc is None or gc > 0, "grad_clip", "must be null or > 0")
        self.require(bool(self.model), "model", "must be 'policy' or a model path")


@CRITICS.register("value", ValueParams)
def value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, p: ValueParams
) -> tuple[Tensor, Metrics]:
    """(B, T) l_t = 0.5 max((V - R)^2, (clip(V, V_old - eps, V_old + eps) - R)^2), 0 where
    ``mask`` is 0; gradient through ``values`` only.
    Source: Schulman et al. 2017 (PPO); verl ``core_algos.compute_value_loss`` (from TRL)."""
    mask = mask.bool()
    old, ret = old_values.detach(), returns.detach()
    eps = p.cliprange_value
    clipped = torch.clamp(values, old - eps, old + eps)
    unclipped_loss = (values - ret) ** 2
    clipped_loss = (clipped - ret) ** 2
    loss_t = masked(0.5 * torch.maximum(unclipped_loss, clipped_loss), mask)
    metrics = {
        "value_loss": mean_over(loss_t, mask),
        "value_clip_frac": share(clipped_loss > unclipped_loss, mask),
    }
    return loss_t, metrics


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> Metrics:
    """``{"explained_variance": (Var(R) - Var(R - V), Var(R))}`` over the valid tokens (population
    variances; the ratio is the same with unbiased ones)."""
    return {"explained_variance": _explained(values, returns, mask.bool())}


def _explained(values: Tensor, returns: Tensor, mask: Tensor) -> Metric:
    dtype = metric_dtype(returns)
    v, r = values.detach().to(dtype), returns.detach().to(dtype)
    n = mask.sum().to(dtype).clamp(min=1)

    def var(x: Tensor) -> Tensor:
        mean = masked(x, mask).sum() / n
        return (masked(x - mean, mask) ** 2).sum() / n

    var_r = var(r)
    return var_r - var(r - v), var_r
