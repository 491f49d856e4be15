"""KL to a frozen reference policy: the estimators k1, k2, k3 and the KL term (off in DAPO).

Per token, with d = logp - ref_logp under samples from pi (Schulman, "Approximating KL
divergence", 2020):

- ``k1`` = d: unbiased for KL(pi || ref), high variance, can be negative;
- ``k2`` = d^2 / 2: biased, low variance, never negative; its gradient is the KL's;
- ``k3`` = exp(-d) + d - 1 = (ref/pi) - 1 - log(ref/pi): unbiased, low variance, never negative
  (GRPO's choice); clamped as verl clamps it (its docstring). k1 and k2 exponentiate nothing and
  are left unclamped, as in verl.

Every estimator is ``fn(logp (B, T), ref_logp (B, T)) -> (B, T)``, unmasked (the helpers mask).
The KL term (:class:`KLParams`) is used in one of two places (the trainer dispatches on
``where``):

- ``"loss"`` (GRPO, Shao et al. 2024, beta ~ 1e-3): :func:`kl_loss` gives beta * kl per token, to
  be added to the policy's per-token loss and aggregated with it;
- ``"reward"`` (PPO-RLHF, Ouyang et al. 2022): :func:`kl_reward_penalty` gives -beta * kl per
  token, detached, computed from the rollout-time (old) log-probs, as the per-token rewards of
  ``AdvantageInput.token_rewards``.

DAPO removes the KL term (section 2.3); this is for the peers' variants.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from dapo_core.algos.registry import KL_ESTIMATORS, NoParams, Params, build_params
from dapo_core.algos.types import Metrics, masked, mean_over


@KL_ESTIMATORS.register("k1", NoParams)
def k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k1 = logp - ref_logp. Source: Schulman 2020."""
    return logp - ref_logp


@KL_ESTIMATORS.register("k2", NoParams)
def k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k2 = 0.5 (logp - ref_logp)^2. Source: Schulman 2020."""
    return 0.5 * (logp - ref_logp) ** 2


# verl's clamps in its k3 ("low_var_kl"): ref - logp to [-20, 20], then k3 to at most 10.
K3_LOG_RATIO_BOUND = 20.0
K3_MAX = 10.0


@KL_ESTIMATORS.register("k3", NoParams)
def k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 = exp(ref - logp) - (ref - logp) - 1, with ref - logp clamped to [-20, 20] and k3 to at
    most 10, as verl clamps it: a log-prob gap of 30 or 90 would give 1e13 or inf (and one token
    would own the loss). Beyond the clamps the token's KL is 10 with no gradient. k3 >= 0, so
    verl's lower clamp at -10 never binds and is left out.
    Source: Schulman 2020; GRPO (Shao et al. 2024); verl ``kl_penalty_forward``."""
    log_ratio = (ref_logp - logp).clamp(-K3_LOG_RATIO_BOUND, K3_LOG_RATIO_BOUND)
    # expm1(x) - x rather than exp(x) - x - 1: exact near x = 0, where policies agree
    return (torch.expm1(log_ratio) - log_ratio).clamp(max=K3_MAX)


@dataclass(frozen=True)
class KLParams(Params):
    """The KL term: which estimator, its weight, and where it enters."""

    entry = "algo.kl"
    estimator: str = "k3"
    beta: float = 1e-3  # GRPO's order of magnitude
    where: Literal["loss", "reward"] = "loss"

    def __post_init__(self) -> None:
        known = ", ".join(KL_ESTIMATORS.names())
        self.require(self.estimator in KL_ESTIMATORS, "estimator", f"must be one of {known}")
        self.require(self.beta >= 0, "beta", "must be >= 0")
        self.require(self.where in ("loss", "reward"), "where", "must be 'loss' or 'reward'")


def make_kl_params(values: Mapping[str, Any]) -> KLParams:
    """:class:`KLParams` from a mapping, checked as the registries check entries' parameters."""
    return build_params(KLParams, values, KLParams.entry)


def kl_per_token(p: KLParams, logp: Tensor, ref_logp: Tensor, mask: Tensor):
    """(B, T) the estimator's KL, 0 where ``mask`` is 0, and its mean over valid tokens."""
    mask = mask.bool()
    # masked before the estimator: -inf on both sides of padding would give NaN
    kl = KL_ESTIMATORS.get(p.estimator).fn(masked(logp, mask), masked(ref_logp, mask))
    kl = masked(kl, mask)
    return kl, {"kl_mean": mean_over(kl, mask)}


def kl_loss(p: KLParams, logp: Tensor, ref_logp: Tensor, mask: Tensor) -> tuple[Tensor, Metrics]:
    """(B, T) beta * kl, with gradient through ``logp``: add to the per-token policy loss."""
    kl, metrics = kl_per_token(p, logp, ref_logp.detach(), mask)
    return p.beta * kl, metrics


def kl_reward_penalty(
    p: KLParams, old_logp: Tensor, ref_logp: Tensor, mask: Tensor
) -> tuple[Tensor, Metrics]:
    """(B, T) -beta * kl, detached: per-token rewards (``AdvantageInput.token_rewards``)."""
    kl, metrics = kl_per_token(p, old_logp.detach(), ref_logp.detach(), mask)
    return -p.beta * kl, metrics
