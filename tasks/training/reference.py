"""The frozen reference policy pi_ref of the KL term (``algo.kl``; DAPO removes it, section 2.3).

pi_ref is the initial policy (GRPO, Shao et al. 2024: "the reference model is the initial
policy"): a copy of the model the trainer is given, made before any update, in eval mode, with no
gradient, in the policy's dtype and on its device. It exists only while a KL term is on (a beta of
0 is off): without one nothing is copied and no reference forward runs.

Exact resume: the copy is made from the model ``run_training`` loads from the config's model path
(the run's starting model) before the checkpoint's weights are loaded into the policy, so a
resumed run has the reference an uninterrupted run has, and checkpoints need not store it. It
must not come from the checkpoint: those are the trained policy's weights, so the KL term would
restart at 0 and pull toward a policy the run never started from.

Data parallelism: every rank holds a whole copy, a plain module beside the DeepSpeed engine (it
has no gradient or optimizer state to partition; under ZeRO-3 that is a full copy of the weights
per rank). It is copied before DeepSpeed partitions the policy's parameters, then cast to the
dtype the engine gave the policy (DeepSpeed's bf16 mode casts the policy to bf16).
"""

from __future__ import annotations

import copy

import torch

from tasks.training.batches import Sample
from tasks.training.forward import PolicyForward
from tasks.training.kernels import install_rms_norm, use_cpu_sdpa


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` that never trains: eval mode, no parameter requires grad."""
    ref = copy.deepcopy(model)
    ref.eval()
    ref.requires_grad_(False)
    return ref


class ReferencePolicy:
    """``ref(batch) -> (b, R)`` log-probs of the response tokens under pi_ref, computed as the
    policy's are (same forward, temperature, kernels and autocast), so that pi_ref == pi_theta
    gives exactly equal log-probs and a KL of exactly 0 at the first update."""

    def __init__(self, copy_: torch.nn.Module, policy: torch.nn.Module, forward: PolicyForward):
        self.model = copy_.to(next(policy.parameters()).dtype)
        install_rms_norm(self.model)  # the drop-ins the trainer installs on the policy
        use_cpu_sdpa(self.model)
        self.forward = PolicyForward(
            self.model, forward.pad_id, forward.temperature, forward.autocast
        )

    @torch.no_grad()
    def __call__(self, batch: list[Sample]) -> tuple[torch.Tensor, torch.Tensor]:
        """(b, R) log-probs and the (b, R) response mask."""
        logp, _, mask = self.forward(batch)
        return logp, mask
