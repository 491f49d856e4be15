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
    chunk: int = 4096,
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
