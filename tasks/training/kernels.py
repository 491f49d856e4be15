"""Two drop-in speed-ups for the policy in training, same arithmetic as transformers.

1. RMSNorm with a hand-written backward, installed on the model's norm modules.
2. On CPU, SDPA attention with grouped-query heads broadcast by the kernel (``enable_gqa``)
   instead of copied. transformers copies them whenever there is a mask, because CUDA kernels
   fall back to the slow path with both. The CPU flash kernel does not, and skips the copies
   (docs/benchmarks.md has the measured gain).

RMSNorm details:

transformers' RMSNorm is written as six tensor operations, and autograd differentiates each one:
about a dozen operations in backward, with the intermediates saved. The closed-form gradient
needs five, and saves only the normalised input and the inverse RMS. A training forward has 2
norms per layer plus the final one. The arithmetic is the model's:
statistics in float32, the normalised input cast back to the input dtype, then scaled by the
weight. A test holds outputs and gradients to the original module.

On GPU, fused Triton kernels (e.g. Liger) do better still; this one needs nothing beyond torch.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F


class _RMSNorm(torch.autograd.Function):
    """y = w * (x / rms(x)), rms(x) = sqrt(mean(x^2) + eps), statistics in float32."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.float()
        inv_rms = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        normed = (xf * inv_rms).to(x.dtype)
        ctx.save_for_backward(normed, weight, inv_rms)
        return weight * normed

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        normed, weight, inv_rms = ctx.saved_tensors
        grad_weight = (grad * normed).reshape(-1, normed.shape[-1]).sum(0)
        g = (grad * weight).float()  # d loss / d normed
        n = normed.float()
        # d normed_i / d x_j = inv_rms * (delta_ij - n_i n_j / H)
        grad_x = inv_rms * (g - n * (g * n).mean(-1, keepdim=True))
        return grad_x.to(normed.dtype), grad_weight.to(weight.dtype), None


def _forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    return _RMSNorm.apply(hidden_states, self.weight, self.variance_epsilon)


# Norm classes known to compute exactly weight * (x / rms(x)).to(dtype) with these attributes
# (Gemma's, for one, scales by 1 + weight and is left alone).
SUPPORTED = ("Qwen2RMSNorm", "Qwen3RMSNorm", "LlamaRMSNorm", "MistralRMSNorm")


def install_rms_norm(model) -> int:
    """Route the model's RMSNorm modules of a :data:`SUPPORTED` class through
    :class:`_RMSNorm`; returns how many were changed."""
    changed = 0
    for module in model.modules():
        if type(module).__name__ in SUPPORTED:
            module.forward = types.MethodType(_forward, module)
            changed += 1
    return changed


CPU_SDPA = "dapo_cpu_sdpa"


def _cpu_sdpa_attention(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs
):
    """transformers' SDPA attention contract ((B, heads, q, d) in, (B, q, heads, d) out), with
    grouped-query heads broadcast by the kernel rather than repeated."""
    causal = module.is_causal if is_causal is None else is_causal
    out = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=query.shape[2] > 1 and attention_mask is None and causal,
        enable_gqa=key.shape[1] != query.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None


def use_cpu_sdpa(model) -> bool:
    """Switch a CPU model on SDPA to :func:`_cpu_sdpa_attention` (masks are built as for SDPA);
    True when switched."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    if model.device.type != "cpu" or model.config._attn_implementation != "sdpa":
        return False
    AttentionInterface.register(CPU_SDPA, _cpu_sdpa_attention)
    AttentionMaskInterface.register(CPU_SDPA, sdpa_mask)
    model.set_attn_implementation(CPU_SDPA)
    return True
