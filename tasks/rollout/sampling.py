"""Drawing the next token: softmax(logits / T), restricted to the top-p nucleus, by inverse CDF.

Inverse-CDF sampling draws one uniform per sequence and locates it in the cumulative distribution,
where ``torch.multinomial`` draws B x V random numbers. The caller draws the uniforms for the
whole batch every step, so dropping finished sequences changes no sample.

Three ways to compute it (``SAMPLERS``), the same distribution:
- ``exact``: ``sample_next``, one log-softmax over the vocabulary, its exponent, the cumulative sum;
  below top-p 1 the probabilities sorted first, the nucleus a prefix of the sorted order. CPU runs
  use it: its rounding is part of what a seed reproduces there;
- ``flat``: the tempered probabilities from one log-sum-exp (``tempered_probs``), then the
  cumulative sum over the vocabulary (below top-p 1, ``exact``);
- ``blocked`` (the CUDA default, compiled there: ``sample_blocked_cuda``): the vocabulary in
  blocks of ``BLOCK`` tokens. One pass over the logits gives each block's mass
  (``block_log_masses``); the uniform is located among the blocks, then inside the one block it
  fell in. On a GPU
  sampling is bandwidth-bound at large batches (a (512, 151936) float32 array is 311 MB): ``exact``
  reads and writes such arrays about eight times, ``flat`` three, ``blocked`` reads the bf16
  logits once and writes nothing of that size. Below top-p 1 it takes no sort either: the nucleus
  is every token whose logit reaches a floor (``nucleus_floor``, a search over the logits' bit
  patterns: by bisection, one reduction per bit), and the block masses count those tokens only:
  18 reads of the bf16 logits (a sort reads and writes its float32 keys and their indices
  several times).
At top-p 1, ``flat`` and ``blocked`` locate the same uniform in the same vocabulary-order CDF as
``exact``, so they agree on the token but for rounding ties. Below it ``blocked`` keeps the same
nucleus (and every token tied with its least likely one, where the sort keeps an arbitrary few of
them) but orders it by vocabulary, not by probability: the same distribution, another token for the
same uniform. The log-probs of ``flat`` and ``blocked`` are x - logsumexp(x) at the drawn tokens,
the log-softmax up to rounding, under the unrestricted tempered distribution as ``exact``'s.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F

from dapo_core.compiled_rows import compile_over_rows

log = logging.getLogger(__name__)
SAMPLERS = ("exact", "flat", "blocked")
BLOCK = 1024  # tokens per block of the blocked sampler


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
    # Rounding can put u at the total: stay on the last token with non-zero probability.
    return _first_exceeding(cdf, u)


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


def block_log_masses(
    logits: torch.Tensor, temperature: float, block: int, floor: torch.Tensor | None = None
) -> torch.Tensor:
    """(B, V) logits -> (B, ceil(V / block)) log of each block's unnormalised mass,
    log sum exp(logits / T) over its tokens (-inf for a block of -inf logits only); with ``floor``
    (B, 1), over its tokens whose logit is at least the floor."""
    B, V = logits.shape
    blocks = -(-V // block)
    # The logits padded, not their tempered copy: compiled, a padded float32 copy shared by the
    # sampler's two calls was written whole (as large as the logits, twice their bytes).
    raw = F.pad(logits, (0, blocks * block - V), value=float("-inf")).view(B, blocks, block)
    x = raw.float() / temperature
    if floor is not None:
        x = torch.where(raw >= floor[..., None], x, float("-inf"))
    top = x.amax(dim=-1, keepdim=True)
    top = torch.where(top.isfinite(), top, 0.0)  # a block of -inf only: mass 0, not NaN
    return top.squeeze(-1) + (x - top).exp().sum(dim=-1).log()


_SIGNED = {2: torch.int16, 4: torch.int32}  # the integer type of a float's width in bytes


def _key_of_float(x: torch.Tensor) -> torch.Tensor:
    """Floats -> integer keys that order as they do: the bit pattern read as a signed integer,
    with a negative one's magnitude bits flipped (sign-magnitude to two's complement order)."""
    bits = torch.finfo(x.dtype).bits
    signed = x.view(_SIGNED[bits // 8]).long()
    return torch.where(signed < 0, signed ^ ((1 << (bits - 1)) - 1), signed)


def _float_of_key(key: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``_key_of_float``'s inverse (the flip is its own inverse)."""
    bits = torch.finfo(dtype).bits
    flipped = torch.where(key < 0, key ^ ((1 << (bits - 1)) - 1), key)
    return flipped.to(_SIGNED[bits // 8]).view(dtype)


# +inf's key for each float type nucleus_floor takes (-inf's is -key - 1)
_POS_INF_KEY = {
    dtype: int(_key_of_float(torch.tensor(float("inf"), dtype=dtype)))
    for dtype in (torch.bfloat16, torch.float16, torch.float32)
}


NUCLEUS_BITS_PER_PASS = 1  # key bits nucleus_floor settles per pass over the logits


def nucleus_floor(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    lse: torch.Tensor,
    bits_per_pass: int = NUCLEUS_BITS_PER_PASS,
) -> torch.Tensor:
    """(B, V) logits, (B, 1) log-normaliser of softmax(logits / T) -> (B, 1) the least logit of
    the top-p nucleus: the highest floor whose tokens (logit >= floor) hold at least ``top_p`` of
    the probability. The sort's nucleus is those tokens, ties at the floor aside.

    A search over the keys that order the logits' floats (``_key_of_float``), from -inf's to
    past +inf's. Each pass over the vocabulary sums the mass above 2 ** ``bits_per_pass`` - 1
    evenly spaced floors at once (compiled: one kernel with that many sums) and keeps the stretch
    of keys where the mass falls below top-p, so the span shrinks that many times a pass: a
    bisection at 1, four passes instead of sixteen for bf16 at 4. The same count whatever the
    logits, so a CUDA graph can record it; the floor found is the same at every
    ``bits_per_pass`` (the mass above a floor only falls as the floor rises). It is one of the
    row's logits (the mass above a floor only changes at one), or -inf where rounding leaves the
    whole row's mass under top-p (every token kept, as the sort would)."""
    if logits.dtype not in _POS_INF_KEY:
        raise TypeError(f"nucleus_floor takes bf16, fp16 or fp32 logits, not {logits.dtype}")
    top_p = max(top_p, torch.finfo(torch.float32).tiny)  # top-p 0 keeps the likeliest, as a sort
    bits, pos_inf = torch.finfo(logits.dtype).bits, _POS_INF_KEY[logits.dtype]
    parts = 1 << bits_per_pass
    lo = torch.full_like(lse, -pos_inf - 1, dtype=torch.long)  # -inf: every token, mass 1
    hi = torch.full_like(lo, pos_inf + 1)  # past +inf: no token, mass 0
    for _ in range(-(-bits // bits_per_pass)):  # the span, under 2 ** bits keys, shrinks by parts
        span = hi - lo
        # The tempered probabilities recomputed in each pass: compiled, each pass reads the
        # logits once and writes nothing of their size.
        probs = (logits.float() / temperature - lse).exp()
        next_lo, next_hi = lo, hi
        for j in range(1, parts):  # rising floors, falling masses
            mid = lo + span * j // parts
            floor = _float_of_key(mid, logits.dtype)
            mass = torch.where(logits >= floor, probs, 0.0).sum(dim=-1, keepdim=True)
            holds = mass >= top_p
            next_lo = torch.where(holds, mid, next_lo)
            next_hi = torch.minimum(next_hi, torch.where(holds, hi, mid))
        lo, hi = next_lo, next_hi
    return _float_of_key(lo, logits.dtype)


def sample_blocked(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    uniforms: torch.Tensor | None = None,
    masses_fn: Callable = block_log_masses,
    block: int = BLOCK,
    floor_fn: Callable = nucleus_floor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``sample_next``'s draw in two levels: which block, then which token of it (module
    docstring). Only the block masses (and below top-p 1 the nucleus's floor) read the whole
    vocabulary."""
    B, V = logits.shape
    log_mass = masses_fn(logits, temperature, block)  # (B, blocks)
    lse = torch.logsumexp(log_mass, dim=-1, keepdim=True)  # (B, 1)
    floor = None
    if top_p < 1.0:  # the blocks' masses inside the nucleus, still relative to the whole
        floor = floor_fn(logits, temperature, top_p, lse)
        log_mass = masses_fn(logits, temperature, block, floor)
    mass = (log_mass - lse).exp()  # each block's probability (inside the nucleus)
    if uniforms is None:
        uniforms = torch.rand(B, 1, device=logits.device)
    cdf = mass.cumsum(dim=-1)
    u = uniforms.float() * cdf[:, -1:]
    j = _first_exceeding(cdf, u)  # (B, 1) the block the uniform falls in
    cols = j * block + torch.arange(block, device=logits.device)  # (B, block) its tokens
    raw = logits.gather(-1, cols.clamp(max=V - 1))
    x = raw.float() / temperature
    # Inside the block, each token's share of the block's mass: relative to the block, so no
    # token of a light block underflows to nothing (and a -inf one stays at exactly 0).
    inside = cols < V if floor is None else (cols < V) & (raw >= floor)
    share = torch.where(inside, (x - log_mass.gather(-1, j)).exp(), 0.0)
    block_mass = mass.gather(-1, j)
    # The uniform's place inside the block; rounding can put it a little outside: the block's
    # ends absorb it.
    left = ((u - (cdf.gather(-1, j) - block_mass)) / block_mass).clamp(min=0.0)
    token = j * block + _first_exceeding(share.cumsum(dim=-1), left)
    logp = logits.gather(-1, token).float() / temperature - lse
    return token.squeeze(-1), logp.squeeze(-1)


def sample_blocked_whole(
    logits: torch.Tensor, temperature: float, top_p: float, uniforms: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``sample_blocked`` as one function for CUDA to compile whole: Inductor fuses its dozen
    small operators (the block choice, the gathers, the scans over blocks and inside one) into
    a few kernels, and the block masses with them."""
    return sample_blocked(logits, temperature, top_p, uniforms)


def sample_blocked_cuda(
    logits: torch.Tensor, temperature: float, top_p: float, uniforms: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The blocked sampler as CUDA runs it: compiled whole at top-p 1; below, its block masses
    and nucleus floor compiled apart and the rest eager (compiled whole, the floor's bisection
    ran several times slower: docs/benchmarks.md, session 27)."""
    if top_p >= 1.0:
        return _compiled(sample_blocked_whole)(logits, temperature, top_p, uniforms)
    parts = {"masses_fn": _compiled(block_log_masses), "floor_fn": _compiled(nucleus_floor)}
    return sample_blocked(logits, temperature, top_p, uniforms, **parts)


def _first_exceeding(cdf: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """(B, n) non-decreasing cumulative weights, (B, 1) targets -> (B, 1) index of the first
    cumulative weight above the target, never one past the last non-zero weight."""
    idx = torch.searchsorted(cdf, u, right=True)
    return torch.minimum(idx, torch.searchsorted(cdf, cdf[:, -1:].contiguous()))


ROWS_HINT = 256  # the batch the compiled samplers are tuned for (a rollout's 64 to 512 rows)


class _Compiled:
    """``fn`` through ``torch.compile``; if compiling fails (an Inductor bug on some torch
    versions), says so once and computes it eagerly from then on."""

    def __init__(self, fn: Callable):
        self.eager = fn
        self.fn = compile_over_rows(fn, ROWS_HINT)  # the batch size symbolic, the vocabulary not

    def __call__(self, *args):
        if self.fn is not self.eager:
            try:
                return self.fn(*args)
            except torch.OutOfMemoryError:
                raise
            except Exception as e:  # a compiler failure: the eager function is the same maths
                log.warning("compiled sampling failed (%s); sampling eagerly", type(e).__name__)
                self.fn = self.eager
        return self.eager(*args)


@functools.cache
def _compiled(fn: Callable) -> _Compiled:
    return _Compiled(fn)


def sampler_for(name: str, device: torch.device) -> Callable:
    """The sampling function ``name`` picks (``auto``: ``blocked``, compiled, on CUDA; else
    ``exact``)."""
    if name == "auto":
        name = "blocked" if device.type == "cuda" else "exact"
    if name not in SAMPLERS:
        raise ValueError(f"sampler must be auto or one of {', '.join(SAMPLERS)}, not {name!r}")
    cuda = device.type == "cuda"
    if name == "flat":
        return functools.partial(
            sample_flat, probs_fn=_compiled(tempered_probs) if cuda else tempered_probs
        )
    if name == "blocked":
        return sample_blocked_cuda if cuda else sample_blocked
    return sample_next
