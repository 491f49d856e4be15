"""The fused decode step's work around attention, as the two functions CUDA compiles.

Why: between its matrix products a layer of the step does pointwise work (norms, rotary, the
residual adds, SwiGLU) that eagerly costs a kernel launch per operator. Compiled, each region
fuses into a few kernels around the products. The same two functions serve every layer (the
weights are their inputs) and every decoder, so they compile once (per batch size, with fixed
sizes). Keys and values are written and attended to outside them: the compiled code never
mutates the buffers that CUDA graphs hold.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from tasks.rollout.decode import split_rotated


def attention_inputs(x, norm_w, eps: float, qkv_w, qkv_b, cos, sin, n_kv: int, head_dim: int):
    """(B, 1, H) residual stream -> queries (B, kv, g, d), key and value of the new token: norm,
    one q/k/v product (weights laid out per kv head, ``LeanDecoder._fuse_qkv``), rotary on queries
    and key at once. The key and value come stacked, (B, kv, 2, 1, d): the step writes the pair
    into its buffer with one kernel."""
    h = F.rms_norm(x, x.shape[-1:], norm_w, eps)
    qkv = F.linear(h, qkv_w, qkv_b).view(x.shape[0], n_kv, -1, head_dim)
    q, k, v = split_rotated(qkv, cos, sin)
    return q, torch.stack((k, v), dim=2)


def after_attention(x, attended, o_w, o_b, norm_w, eps: float, gate_up_w, down_w):
    """The rest of the layer: output projection and residual, norm, SwiGLU MLP and residual."""
    x = x + F.linear(attended.reshape(x.shape), o_w, o_b)
    h = F.rms_norm(x, x.shape[-1:], norm_w, eps)
    gate, up = F.linear(h, gate_up_w).chunk(2, dim=-1)
    return x + F.linear(F.silu(gate) * up, down_w)


COMPILE_BACKEND = "inductor"  # torch.compile's; the CPU tests trace with a cheaper one


STATIC_RECOMPILES = 64  # compilations torch may make of one function compiled with fixed sizes


# Inductor's own defaults print every product's table of timed candidates and a JSON line of
# stats to stderr, and log an error for each candidate needing more shared memory than a block
# may have (skipped anyway): hundreds of lines in a run's output. Settings a torch version
# lacks are left out (torch.compile refuses unknown ones).
QUIET_AUTOTUNE = {
    "autotune_num_choices_displayed": 0,
    "max_autotune_report_choices_stats": False,
    "max_autotune_prune_choices_based_on_shared_mem": True,
}


def autotune_options() -> dict:
    """Inductor's settings for ``autotune``: its max-autotune mode without its own CUDA graphs
    (the decoder records its own), choosing by timing even where every ``dapo`` command asks
    Inductor to choose by rule (``TORCHINDUCTOR_DETERMINISTIC``, docs/determinism.md), under
    which max-autotune keeps cuBLAS for every product; and quietly (``QUIET_AUTOTUNE``)."""
    quiet = {k: v for k, v in QUIET_AUTOTUNE.items() if hasattr(torch._inductor.config, k)}
    return (
        torch._inductor.list_mode_options("max-autotune-no-cudagraphs")
        | quiet
        | {"deterministic": False}
    )


@functools.cache
def compiled(fn, dynamic: bool, autotune: bool = False):
    """One compiled function per region (or FlexAttention's), shared by every layer and decoder;
    with ``dynamic``, compaction's smaller batches and another model's widths do not compile it
    again. Without, each batch size (buffer length, model) is a compilation, and past torch's
    default of eight a function runs uncompiled (FlexAttention unfused, over every block): the
    limit is raised.

    ``autotune``: Inductor times Triton templates against cuBLAS for each matrix product at its
    sizes and keeps the fastest (a decode step's products have few rows: cuBLAS's choice leaves
    SMs idle), fusing the pointwise work after a product into it, and FlexAttention's block
    sizes and key/value splits likewise; compiling takes longer. A
    choice by timing can differ between two processes on cold compiler caches, and with it the
    rounding of what is sampled (docs/determinism.md). Only Inductor has these settings: another
    backend (the CPU tests') compiles as without them."""
    if not dynamic:
        limit = torch._dynamo.config.recompile_limit
        torch._dynamo.config.recompile_limit = max(limit, STATIC_RECOMPILES)
    options = autotune_options() if autotune and COMPILE_BACKEND == "inductor" else None
    return torch.compile(fn, dynamic=dynamic, backend=COMPILE_BACKEND, options=options)
