"""Token log-probabilities and entropies from hidden states, in chunks.

The policy loss needs log pi(y_t | y_<t) only at response tokens. Projecting every position of a
(B, T, H) batch onto a vocabulary of 150k entries would materialise B*T*V logits (tens of GB for a
paper-scale batch), and most positions are prompt or padding. Instead the caller selects the N
positions that count, and this module projects them ``chunk`` rows at a time; with gradients on,
each chunk runs under activation checkpointing, so backward recomputes its logits instead of
keeping them, and peak memory is O(chunk * V) rather than O(N * V).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint

from dapo_core.compiled_rows import compile_over_rows

CHUNK = 4096  # rows of logits formed at a time (chunk x V floats at most)

Head = Callable[[torch.Tensor], torch.Tensor]
"""(n, H) hidden states -> (n, V) logits: the model's output layer, called as a module so that
sharded-parameter engines (DeepSpeed ZeRO-3) can gather its weight."""


def _chunk_logp_entropy(
    hidden: torch.Tensor, head: Head, targets: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, H) hidden, (n,) targets -> (n,) log-probs and (n,) entropies."""
    logits = head(hidden).float()  # (n, V)
    if temperature != 1.0:
        logits = logits / temperature
    # One log-softmax serves both: ~25% faster forward and backward than logsumexp + softmax.
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    with torch.no_grad():
        entropy = -(logp_all.exp() * logp_all).sum(dim=-1)
    return logp, entropy


def token_logprobs(
    hidden: torch.Tensor,
    head: Head,
    targets: torch.Tensor,
    temperature: float = 1.0,
    chunk: int = CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs (differentiable) and entropies (detached) of ``targets`` under ``head``.

    ``hidden`` (N, H) are the states that predict ``targets`` (N,). Logits are divided by the
    sampling temperature, so the log-probs are those of the distribution the rollout sampled from.
    """
    logps, entropies = [], []
    # One chunk holds everything: checkpointing would only recompute it, saving no memory.
    use_ckpt = torch.is_grad_enabled() and hidden.shape[0] > chunk
    for start in range(0, hidden.shape[0], chunk):
        h, t = hidden[start : start + chunk], targets[start : start + chunk]
        if use_ckpt:
            lp, ent = checkpoint(_chunk_logp_entropy, h, head, t, temperature, use_reentrant=False)
        else:
            lp, ent = _chunk_logp_entropy(h, head, t, temperature)
        logps.append(lp)
        entropies.append(ent)
    if not logps:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty
    return torch.cat(logps), torch.cat(entropies)


def _chunk_stats(logits: torch.Tensor, targets: torch.Tensor, scale: float):
    """(c, V) logits -> (c,) logsumexp, target log-probs and entropies of softmax(scale * logits),
    in float32 at least, whatever the logits' dtype.

    Written as two sums under one row maximum, S0 = sum e and S1 = sum e z with e = exp(z - max),
    so that lse = max + log S0 and entropy = lse - S1 / S0: a compiler fuses both sums into one
    pass over the logits (the entropy as sum(exp(z - lse) z) would need lse first: one more)."""
    z = logits.to(torch.promote_types(logits.dtype, torch.float32)) * scale
    top = z.amax(dim=-1, keepdim=True)
    e = torch.exp(z - top)
    s0, s1 = e.sum(-1), (e * z).sum(-1)
    lse = top.squeeze(-1) + torch.log(s0)
    logp = z.gather(-1, targets[:, None]).squeeze(-1) - lse
    return lse, logp, lse - s1 / s0


def _chunk_grad_logits(
    logits: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor, grad: torch.Tensor, scale: float
) -> torch.Tensor:
    """d loss / d logits for log p(target) = scale * z_t - lse: scale * g * (onehot - softmax),
    in the logits' dtype. The one-hot is a comparison with the column index (elementwise, so it
    fuses into the same pass), not a scatter into a (c, V) buffer of zeros."""
    p = torch.exp(logits.to(lse.dtype) * scale - lse[:, None])
    columns = torch.arange(logits.shape[-1], device=logits.device)
    onehot = (columns[None, :] == targets[:, None]).to(p.dtype)
    return ((onehot - p) * (grad[:, None] * scale)).to(logits.dtype)


_kernels: dict[str, tuple] = {}


def _fused(device: torch.device) -> tuple:
    """The two elementwise-and-reduction steps, compiled into a few kernels on CUDA (each would
    otherwise be ~6 launches over a (chunk x V) float32 copy); eager elsewhere."""
    if device.type != "cuda":
        return _chunk_stats, _chunk_grad_logits
    if "cuda" not in _kernels:
        _kernels["cuda"] = tuple(
            # The row count (the last chunk's differs) symbolic from the first call and tuned
            # for a whole chunk, the vocabulary a constant the reduction is tuned for.
            compile_over_rows(f, rows_hint=CHUNK)
            for f in (_chunk_stats, _chunk_grad_logits)
        )
    return _kernels["cuda"]


class _LinearLogProbs(torch.autograd.Function):
    """Log-probs and entropies of ``targets`` under softmax(scale * hidden @ weight^T), chunk by
    chunk, saving each row's logsumexp; backward forms d logits in one pass per chunk, from the
    chunk's logits kept by the forward (``keep``) or recomputed (one matrix product). No
    float32 copy of a chunk's logits is kept. Under autocast the products run in its dtype, as
    the model's head would; a kept chunk is bit for bit the one a recompute would produce."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, scale: float, chunk: int, keep: bool):
        dev = hidden.device
        dt = torch.get_autocast_dtype(dev.type) if torch.is_autocast_enabled(dev.type) else None
        h, w = (hidden.to(dt), weight.to(dt)) if dt else (hidden, weight)
        stats, _ = _fused(dev)
        n, acc = h.shape[0], torch.promote_types(h.dtype, torch.float32)
        lse, logp, entropy = (torch.empty(n, device=dev, dtype=acc) for _ in range(3))
        ctx.kept = []  # each chunk's logits, freed one by one as backward uses them
        with torch.autocast(dev.type, enabled=False):
            for s in range(0, n, chunk):
                e = min(n, s + chunk)
                z = h[s:e] @ w.T
                lse[s:e], logp[s:e], entropy[s:e] = stats(z, targets[s:e], scale)
                ctx.kept.append(z if keep else None)
        ctx.save_for_backward(h, w, targets, lse)
        ctx.scale, ctx.chunk, ctx.dtypes = scale, chunk, (hidden.dtype, weight.dtype)
        logp, entropy = logp.float(), entropy.float()  # as token_logprobs returns them
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, _grad_entropy):
        h, w, targets, lse = ctx.saved_tensors
        _, grad_logits = _fused(h.device)
        grad_h = torch.empty_like(h)
        grad_w = torch.zeros_like(w)  # accumulated in place by each chunk's product
        grad_logp = grad_logp.to(lse.dtype)
        for i, s in enumerate(range(0, h.shape[0], ctx.chunk)):
            e = min(h.shape[0], s + ctx.chunk)
            z, ctx.kept[i] = ctx.kept[i], None
            z = h[s:e] @ w.T if z is None else z
            d = grad_logits(z, targets[s:e], lse[s:e], grad_logp[s:e], ctx.scale)
            del z
            torch.mm(d, w, out=grad_h[s:e])  # straight into its rows: no copy
            grad_w.addmm_(d.T, h[s:e])
        h_dtype, w_dtype = ctx.dtypes
        return grad_h.to(h_dtype), grad_w.to(w_dtype), None, None, None, None


def linear_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    chunk: int = CHUNK,
    keep_logits: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`token_logprobs` for a bias-free linear head given by its ``weight`` (V, H), fused:
    log-probs (differentiable, also in ``weight``) and entropies (detached). ``keep_logits``:
    hold every chunk's logits (rows x V in the product's dtype) until backward instead of
    recomputing them there: one matrix product less per chunk, for that much memory."""
    if hidden.shape[0] == 0:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty
    keep = (
        keep_logits and torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    )
    return _LinearLogProbs.apply(hidden, weight, targets, 1.0 / temperature, chunk, keep)
