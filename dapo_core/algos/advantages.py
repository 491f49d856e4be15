"""Advantage estimators: group-relative (GRPO, Dr.GRPO, RLOO), REINFORCE++ and GAE.

Every entry is ``fn(inp: AdvantageInput, p) -> (Advantages, metrics)``; ``Advantages`` holds the
(N, T) advantages and the (N, T) returns (a critic's target; only ``gae``'s are read by a critic),
both 0 on invalid tokens. R_i is response i's sequence reward (plus the sum of its per-token
rewards, if any), row p * G + g of the mask is response g of prompt p.

Sequence-level estimators give every valid token of response i the same A_i:

- ``grpo`` (DAPO Eq. 9): A_i = (R_i - mean(R)) / (std(R) + 1e-6), unbiased std; a constant group
  gives exactly 0.
- ``dr_grpo`` (Liu et al. 2025): A_i = R_i - mean(R), no std.
- ``rloo`` (Ahmadian et al. 2024): A_i = R_i - mean of the other G - 1 = G / (G - 1) (R_i - mean).

Per-token estimators place R_i on the last valid token, r_t (plus per-token rewards), and
discount backwards:

- ``reinforce_pp`` (REINFORCE++, Hu 2025, arXiv 2501.03262): G_t = r_t + gamma G_{t+1}, then
  whitened over all valid tokens of the batch; ``reinforce_pp_baseline`` subtracts the group mean
  of R first (verl ``compute_reinforce_plus_plus[_baseline]_outcome_advantage``).
- ``gae`` (Schulman et al. 2016): delta_t = r_t + gamma V_{t+1} - V_t (V after the last valid
  token = 0), A_t = delta_t + gamma lam A_{t+1}, returns = A + V, then A whitened (verl
  ``compute_gae_advantage_return``; gamma = lam = 1 as verl's defaults).

The per-token recurrences skip invalid tokens (the carry passes through them, as verl's do), so
the mask need not be a prefix. Whitening (verl ``masked_whiten``): (x - mean) / sqrt(var + 1e-8)
over valid tokens, unbiased var; fewer than two valid tokens leave x - mean.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from dapo_core.algos.registry import ADVANTAGES, NoParams, Params
from dapo_core.algos.types import AdvantageInput, Advantages, Metrics, masked, mean_over
from dapo_core.config import ConfigError

STD_EPS = 1e-6  # DAPO Eq. 9
WHITEN_EPS = 1e-8  # verl masked_whiten


@dataclass(frozen=True)
class ReturnParams(Params):
    gamma: float = 1.0  # discount; 1 as in verl and the REINFORCE++ paper's outcome-reward runs

    def __post_init__(self) -> None:
        self.require(0 <= self.gamma <= 1, "gamma", "must be in [0, 1]")


@dataclass(frozen=True)
class BaselineReturnParams(ReturnParams):
    """``reinforce_pp_baseline``'s (its own class, so messages name it)."""


@dataclass(frozen=True)
class GaeParams(Params):
    needs_critic: ClassVar[bool] = True  # reads AdvantageInput.values: algo.critic must be on
    gamma: float = 1.0  # verl's defaults
    lam: float = 1.0
    whiten: bool = True

    def __post_init__(self) -> None:
        self.require(0 <= self.gamma <= 1, "gamma", "must be in [0, 1]")
        self.require(0 <= self.lam <= 1, "lam", "must be in [0, 1]")


# ---------------------------------------------------------------------------------------------
# Shared pieces
# ---------------------------------------------------------------------------------------------


def _float(x: Tensor) -> Tensor:
    return x.to(torch.promote_types(x.dtype, torch.float32))


def sequence_rewards(inp: AdvantageInput) -> Tensor:
    """(P, G) R: the sequence rewards plus each response's summed per-token rewards."""
    rewards = _float(inp.rewards)
    if inp.token_rewards is None:
        return rewards
    extra = masked(_float(inp.token_rewards), inp.mask).sum(dim=1)  # (P*G,)
    return rewards + extra.view_as(rewards).to(rewards.dtype)


def broadcast(per_seq: Tensor, mask: Tensor) -> Tensor:
    """(P, G) or (N,) per-sequence values -> (N, T) on valid tokens, 0 elsewhere."""
    return masked(per_seq.reshape(-1, 1).expand(mask.shape), mask)


def token_rewards(inp: AdvantageInput, last_token: Tensor) -> Tensor:
    """(N, T) r_t: ``last_token`` (P, G) on the last valid token of each row, plus the per-token
    rewards. ``last_token`` is the sequence reward alone (not ``sequence_rewards``, which
    already holds the per-token rewards' sum)."""
    mask = inp.mask
    t = torch.arange(mask.shape[1], device=mask.device)
    last = torch.where(mask, t, -1).amax(dim=1)  # (N,); -1 for an empty row
    r = torch.where(t == last[:, None], last_token.reshape(-1, 1), 0.0)  # (N, T)
    if inp.token_rewards is not None:
        r = r + _float(inp.token_rewards)
    return masked(r, mask)


def discounted_returns(r: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """(N, T) G_t = r_t + gamma G_{t'} with t' the next valid token (0 after the last), on valid
    tokens; 0 elsewhere. ``r`` must be 0 on invalid tokens."""
    if gamma == 1.0:  # a reversed cumulative sum: one kernel instead of T steps
        return masked(r.flip(1).cumsum(1).flip(1), mask)
    out = torch.zeros_like(r)
    carry = torch.zeros_like(r[:, 0])  # (N,)
    for t in reversed(range(r.shape[1])):
        carry = torch.where(mask[:, t], r[:, t] + gamma * carry, carry)
        out[:, t] = carry
    return masked(out, mask)


def whiten(x: Tensor, mask: Tensor) -> Tensor:
    """(x - mean) / sqrt(var + 1e-8) over valid tokens, unbiased var; 0 on invalid tokens."""
    n = mask.sum()
    mean = masked(x, mask).sum() / n.clamp(min=1)
    centred = masked(x - mean, mask)
    var = (centred**2).sum() / (n - 1).clamp(min=1)
    scale = torch.where(n > 1, torch.rsqrt(var + WHITEN_EPS), torch.ones_like(var))
    return centred * scale


def _metrics(adv: Tensor, returns: Tensor, mask: Tensor) -> Metrics:
    return {
        "adv_mean": mean_over(adv, mask),
        "adv_abs_mean": mean_over(adv.abs(), mask),
        "return_mean": mean_over(returns, mask),
    }


def _sequence_level(inp: AdvantageInput, adv: Tensor, rewards: Tensor):
    """Broadcast (P, G) advantages; the returns are R on every valid token (gamma = 1)."""
    a, ret = broadcast(adv, inp.mask), broadcast(rewards, inp.mask)
    return Advantages(a, ret), _metrics(a, ret, inp.mask)


def _need_groups(inp: AdvantageInput, name: str) -> None:
    if inp.group_size < 2:
        raise ValueError(f"{name} needs groups of G >= 2 responses, got G = {inp.group_size}")


# ---------------------------------------------------------------------------------------------
# Sequence-level, group-relative
# ---------------------------------------------------------------------------------------------


@ADVANTAGES.register("grpo", NoParams)
def grpo(inp: AdvantageInput, p: NoParams) -> tuple[Advantages, Metrics]:
    """A_i = (R_i - mean(R)) / (std(R) + 1e-6), unbiased std; exactly 0 for a constant group.
    Source: DAPO Eq. 9 (GRPO, Shao et al. 2024)."""
    _need_groups(inp, "grpo")
    rewards = sequence_rewards(inp)  # (P, G)
    mean = rewards.mean(dim=1, keepdim=True)  # (P, 1)
    std = rewards.std(dim=1, unbiased=True, keepdim=True)  # (P, 1)
    # Exact zero for constant groups, rather than (tiny float error) / 1e-6.
    constant = (rewards == rewards[:, :1]).all(dim=1, keepdim=True)
    adv = torch.where(constant, 0.0, (rewards - mean) / (std + STD_EPS))  # (P, G)
    return _sequence_level(inp, adv, rewards)


@ADVANTAGES.register("dr_grpo", NoParams)
def dr_grpo(inp: AdvantageInput, p: NoParams) -> tuple[Advantages, Metrics]:
    """A_i = R_i - mean(R): no division by the std, which favours groups of low variance.
    Source: Liu et al. 2025 ("Understanding R1-Zero-Like Training", Dr.GRPO)."""
    rewards = sequence_rewards(inp)
    return _sequence_level(inp, rewards - rewards.mean(dim=1, keepdim=True), rewards)


@ADVANTAGES.register("rloo", NoParams)
def rloo(inp: AdvantageInput, p: NoParams) -> tuple[Advantages, Metrics]:
    """A_i = R_i - (1/(G-1)) sum_{j != i} R_j = G/(G-1) (R_i - mean(R)), leave-one-out baseline.
    Source: Ahmadian et al. 2024 ("Back to Basics"); verl ``compute_rloo_outcome_advantage``."""
    _need_groups(inp, "rloo")
    rewards = sequence_rewards(inp)
    g = inp.group_size
    adv = (rewards - rewards.mean(dim=1, keepdim=True)) * (g / (g - 1))
    return _sequence_level(inp, adv, rewards)


# ---------------------------------------------------------------------------------------------
# Per-token: REINFORCE++ and GAE
# ---------------------------------------------------------------------------------------------


def _reinforce_pp(inp: AdvantageInput, last_token: Tensor, gamma: float):
    returns = discounted_returns(token_rewards(inp, last_token), inp.mask, gamma)  # (N, T)
    adv = whiten(returns, inp.mask)
    return Advantages(adv, returns), _metrics(adv, returns, inp.mask)


@ADVANTAGES.register("reinforce_pp", ReturnParams)
def reinforce_pp(inp: AdvantageInput, p: ReturnParams) -> tuple[Advantages, Metrics]:
    """G_t = r_t + gamma G_{t+1} (R on the last valid token), A = whiten(G) over the batch's
    valid tokens. Source: Hu 2025 (REINFORCE++); verl ``reinforce_plus_plus``."""
    return _reinforce_pp(inp, _float(inp.rewards), p.gamma)


@ADVANTAGES.register("reinforce_pp_baseline", BaselineReturnParams)
def reinforce_pp_baseline(
    inp: AdvantageInput, p: BaselineReturnParams
) -> tuple[Advantages, Metrics]:
    """As ``reinforce_pp`` with the group mean of R subtracted from the sequence reward first,
    then whitened over the batch (R includes the per-token rewards' sum, as verl's score does).
    Source: Hu 2025; verl ``reinforce_plus_plus_baseline`` (which has gamma = 1)."""
    baseline = sequence_rewards(inp).mean(dim=1, keepdim=True)  # (P, 1)
    return _reinforce_pp(inp, _float(inp.rewards) - baseline, p.gamma)


def gae_advantages(
    r: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """(N, T) raw GAE advantages and returns = A + V, 0 on invalid tokens.

    delta_t = r_t + gamma V_{t'} - V_t, A_t = delta_t + gamma lam A_{t'}, with t' the next valid
    token (V = A = 0 after the last)."""
    next_value = torch.zeros_like(r[:, 0])  # (N,)
    next_adv = torch.zeros_like(r[:, 0])
    adv = torch.zeros_like(r)
    for t in reversed(range(r.shape[1])):
        valid = mask[:, t]
        delta = r[:, t] + gamma * next_value - values[:, t]
        a = delta + gamma * lam * next_adv
        # invalid tokens pass the carry through unchanged (verl: observation tokens)
        next_adv = torch.where(valid, a, next_adv)
        next_value = torch.where(valid, values[:, t], next_value)
        adv[:, t] = next_adv
    adv = masked(adv, mask)
    return adv, masked(adv + values, mask)


@ADVANTAGES.register("gae", GaeParams)
def gae(inp: AdvantageInput, p: GaeParams) -> tuple[Advantages, Metrics]:
    """delta_t = r_t + gamma V_{t+1} - V_t, A_t = delta_t + gamma lam A_{t+1}, returns = A + V
    (before whitening); A whitened over the batch's valid tokens when ``whiten``.
    Source: Schulman et al. 2016 (GAE); verl ``compute_gae_advantage_return``."""
    if inp.values is None:
        raise ConfigError(f"{p.entry}: needs critic values (AdvantageInput.values), got None")
    values = masked(_float(inp.values).detach(), inp.mask)
    r = token_rewards(inp, _float(inp.rewards))
    adv, returns = gae_advantages(r, values, inp.mask, p.gamma, p.lam)
    if p.whiten:
        adv = whiten(adv, inp.mask)
    metrics = _metrics(adv, returns, inp.mask) | {"value_mean": mean_over(values, inp.mask)}
    return Advantages(adv, returns), metrics
