"""Train/rollout mismatch: the sampler's token log-probs against the trainer's, and the truncated
importance-sampling (TIS) correction.

The sampler and the trainer evaluate log pi of the same tokens under the same weights, but with
different arithmetic (bf16 rollout weights against fp32 training, other kernels, vLLM), so the
responses come from a policy pi_rollout slightly off the pi_old that the loss's ratio assumes. With
log r = log pi_old - log pi_rollout per response token (samples drawn from pi_rollout):

- ``abs_diff`` = mean |log r|;
- ``kl`` = mean (r - 1 - log r), the k3 estimator of KL(pi_rollout || pi_old): unbiased under
  samples from pi_rollout and never negative (Schulman, "Approximating KL divergence", 2020);
- ``max_ratio`` = max r.

TIS (Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training")
weights each token's loss by w = min(r, C), a truncated importance weight that moves the gradient
from pi_rollout's samples back to pi_old's; the weight is a constant (no gradient flows through it).
"""

from __future__ import annotations

import torch


def log_ratio(old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor):
    """(B, T) log r = log pi_old - log pi_rollout; 0 where ``mask`` is 0 (padding holds any)."""
    return torch.where(mask.bool(), old_logp.detach() - rollout_logp, torch.zeros_like(old_logp))


def tis_weights(
    old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor, cap: float
) -> torch.Tensor:
    """(B, T) truncated importance weights min(pi_old / pi_rollout, cap), 1 on padding."""
    return log_ratio(old_logp, rollout_logp, mask).exp().clamp(max=cap)


def mismatch_sums(
    old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Sums over valid tokens (so micro-batches and ranks add up): ``abs_diff`` and ``kl`` (divide
    by ``tokens`` for the means of the module docstring), ``max_ratio`` (combine by max)."""
    valid = mask.bool()
    lr = log_ratio(old_logp, rollout_logp, mask)
    lr = lr.to(torch.promote_types(lr.dtype, torch.float32))  # sums in at least fp32
    zero = torch.zeros_like(lr)
    return {
        "abs_diff": torch.where(valid, lr.abs(), zero).sum(),
        # r - 1 - log r as expm1(log r) - log r: exact near r = 1, where the gaps live
        "kl": torch.where(valid, torch.expm1(lr) - lr, zero).sum(),
        "max_ratio": torch.where(valid, lr.exp(), zero).amax(),  # 0 when nothing is valid
        "tokens": valid.sum().float(),
    }
