"""Drawing the next token: softmax(logits / T), restricted to the top-p nucleus, by inverse CDF.

Inverse-CDF sampling draws one uniform per sequence and locates it in the cumulative distribution,
where ``torch.multinomial`` draws B x V random numbers. The caller draws the uniforms for the
whole batch every step, so dropping finished sequences changes no sample.

Two ways to compute it (``SAMPLERS``), the same distribution:
- ``exact``: ``sample_next``, one log-softmax over the vocabulary, its exponent, the cumulative sum.
  CPU runs use it: its rounding is part of what a seed reproduces there;
- ``flat``: the tempered probabilities from one log-sum-exp (``tempered_probs``), compiled on CUDA
  into a reduction and one write, then the cumulative sum. On a GPU sampling is bandwidth-bound at
  large batches (a (512, 151936) float32 array is 311 MB), and ``exact`` reads and writes such
  arrays about eight times, ``flat`` about three. Its log-probs are x - logsumexp(x) at the drawn
  tokens, which equals the log-softmax up to rounding. Top-p below 1 takes ``exact`` (the nucleus
  needs the sort).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)
SAMPLERS = ("exact", "flat")


def sample_next(
    logits: torch.Tensor, temperature: float, top_p: float, uniforms: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, V) logits -> (B,) tokens drawn from softmax(logits / T) restricted to the top-p nucleus,
    and their log-probabilities under the temperature-scaled (unrestricted) distribution.
    ``uniforms`` (B, 1) in [0, 1) are the draws when the caller makes them (default: here)."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)  # (B, V)
    probs = logp.exp()
    order = None
    if top_p < 1.0:
        probs, order = probs.sort(dim=-1, descending=True)
        # Keep a token while the mass before it is < top_p (the first token is always kept).
        probs = probs.masked_fill((probs.cumsum(dim=-1) - probs) >= top_p, 0.0)
    idx = _inverse_cdf(probs, uniforms)
    if order is not None:
        idx = order.gather(-1, idx)
    return idx.squeeze(-1), logp.gather(-1, idx).squeeze(-1)


def _inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor | None) -> torch.Tensor:
    """(B, V) non-negative weights -> (B, 1) index of the first token whose cumulative weight
    exceeds u * total, never one of weight zero at the end."""
    cdf = probs.cumsum(dim=-1)  # (B, V), unnormalised
    total = cdf[:, -1:].contiguous()
    if uniforms is None:
        uniforms = torch.rand(total.shape, device=cdf.device, dtype=cdf.dtype)
    u = uniforms.to(cdf.dtype) * total
    idx = torch.searchsorted(cdf, u, right=True)  # first token whose cdf exceeds u
    # Rounding can put u at the total: stay on the last token with non-zero probability.
    return torch.minimum(idx, torch.searchsorted(cdf, total))


def tempered_probs(logits: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, V) logits -> softmax(logits / T) in float32 and its log-normaliser (B, 1)."""
    x = logits.float() / temperature
    lse = torch.logsumexp(x, dim=-1, keepdim=True)
    return (x - lse).exp(), lse


def sample_flat(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    uniforms: torch.Tensor | None = None,
    probs_fn: Callable = tempered_probs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``sample_next``'s draw with fewer passes over the vocabulary (module docstring)."""
    if top_p < 1.0:
        return sample_next(logits, temperature, top_p, uniforms)
    probs, lse = probs_fn(logits, temperature)
    idx = _inverse_cdf(probs, uniforms)
    logp = logits.gather(-1, idx).float() / temperature - lse
    return idx.squeeze(-1), logp.squeeze(-1)


class _CompiledProbs:
    """``tempered_probs`` through ``torch.compile``; if compiling fails (an Inductor bug on
    some torch versions), says so once and computes it eagerly from then on."""

    def __init__(self):
        self.fn = torch.compile(tempered_probs, dynamic=None)

    def __call__(self, logits: torch.Tensor, temperature: float):
        if self.fn is not tempered_probs:
            try:
                return self.fn(logits, temperature)
            except torch.OutOfMemoryError:
                raise
            except Exception as e:  # a compiler failure: the eager function is the same maths
                log.warning("compiled sampling failed (%s); sampling eagerly", type(e).__name__)
                self.fn = tempered_probs
        return tempered_probs(logits, temperature)


@functools.cache
def _compiled_probs() -> _CompiledProbs:
    return _CompiledProbs()


def sampler_for(name: str, device: torch.device) -> Callable:
    """The sampling function ``name`` picks (``auto``: ``flat``, compiled, on CUDA; else
    ``exact``)."""
    if name == "auto":
        name = "flat" if device.type == "cuda" else "exact"
    if name not in SAMPLERS:
        raise ValueError(f"sampler must be auto or one of {', '.join(SAMPLERS)}, not {name!r}")
    if name == "exact":
        return sample_next
    probs = _compiled_probs() if device.type == "cuda" else tempered_probs
    return functools.partial(sample_flat, probs_fn=probs)
