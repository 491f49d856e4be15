import functools
import logging

import pytest
import torch

from tasks.rollout import sampling
from tasks.rollout.sampling import (
    nucleus_floor,
    sample_blocked,
    sample_flat,
    sample_next,
    sampler_for,
)


def test_flat_sampler_draws_the_exact_samplers_tokens_from_the_same_uniforms():
    """Both locate the same uniform in the same (vocabulary-order) CDF: over 4,000 rows of random
    logits at two temperatures they agree on every token but rounding ties (<0.1%), and give the
    log-softmax of the drawn token."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4000, 500, generator=g) * 3
    u = torch.rand(4000, 1, generator=g)
    for temperature in (1.0, 0.6):
        a, la = sample_next(logits, temperature, 1.0, u)
        b, lb = sample_flat(logits, temperature, 1.0, u)
        assert (a == b).float().mean() > 0.999
        expected = torch.log_softmax(logits / temperature, dim=-1).gather(-1, b[:, None])[:, 0]
        torch.testing.assert_close(lb, expected, rtol=1e-5, atol=1e-5)


def test_flat_sampler_follows_the_tempered_distribution_and_top_p_takes_the_nucleus():
    """Frequencies match softmax(logits / T); -inf is never drawn; below top-p 1 the flat
    sampler is the exact one (the nucleus needs the sort)."""
    torch.manual_seed(0)
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, float("-inf"), -1.0])
    probs = torch.softmax(logits / 0.8, dim=-1)
    tokens, logp = sample_flat(logits.expand(40_000, -1), 0.8, 1.0)
    freq = torch.bincount(tokens, minlength=6).float() / len(tokens)
    assert 4 not in tokens.tolist()
    torch.testing.assert_close(freq, probs, atol=0.01, rtol=0)
    torch.testing.assert_close(logp, probs.log()[tokens])
    u = torch.rand(1000, 1)
    nucleus = sample_flat(logits.expand(1000, -1), 0.8, 0.9, u)
    assert torch.equal(nucleus[0], sample_next(logits.expand(1000, -1), 0.8, 0.9, u)[0])


@pytest.mark.parametrize("vocab,block", [(500, 64), (1024, 256), (3001, 1024)])
def test_blocked_sampler_draws_the_exact_samplers_tokens_from_the_same_uniforms(vocab, block):
    """Locating the uniform first among blocks, then inside one, is the same inverse CDF: over
    4,000 rows of random logits (vocabularies that blocks divide and that they do not, masked
    tokens) both samplers agree on every token but rounding ties, a masked token is never drawn,
    and the log-prob is the log-softmax of the drawn token."""
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(4000, vocab, generator=g) * 3
    logits[:, [0, 7, vocab - 1]] = float("-inf")  # masked tokens, one in the last block
    logits[:10, :block] = float("-inf")  # a whole block masked
    u = torch.rand(4000, 1, generator=g)
    u[:3] = torch.tensor([[0.0], [1.0 - 1e-7], [1.0]])  # the ends of the distribution
    for temperature in (1.0, 0.6):
        a, _ = sample_next(logits, temperature, 1.0, u)
        b, lb = sample_blocked(logits, temperature, 1.0, u, block=block)
        assert (a == b).float().mean() > 0.999
        assert not torch.isin(b, torch.tensor([0, 7, vocab - 1])).any()
        assert not (b[:10] < block).any()
        expected = torch.log_softmax(logits / temperature, dim=-1).gather(-1, b[:, None])[:, 0]
        torch.testing.assert_close(lb, expected, rtol=1e-5, atol=1e-5)


def test_blocked_sampler_never_draws_a_masked_token_of_a_light_block():
    """A block whose tokens all underflow against the whole vocabulary's mass, chosen by a
    uniform of 0: the draw is the block's first token that is not masked (its probability is
    tiny, not zero; the exact sampler's float32 probabilities underflow there to 0)."""
    logits = torch.zeros(1, 4096)
    logits[0, :1024] = -96.3
    logits[0, 0] = float("-inf")
    token, logp = sample_blocked(logits, 1.0, 1.0, torch.zeros(1, 1), block=1024)
    assert token.item() == 1
    assert torch.isfinite(logp).all()


def test_blocked_sampler_follows_the_tempered_distribution():
    torch.manual_seed(0)
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, float("-inf"), -1.0, 0.3])
    probs = torch.softmax(logits / 0.8, dim=-1)
    tokens, logp = sample_blocked(logits.expand(40_000, -1), 0.8, 1.0, block=3)
    freq = torch.bincount(tokens, minlength=7).float() / len(tokens)
    assert 4 not in tokens.tolist()
    torch.testing.assert_close(freq, probs, atol=0.01, rtol=0)
    torch.testing.assert_close(logp, probs.log()[tokens])


def test_nucleus_floor_by_hand():
    """softmax([2, 1, 0.5, 0, -inf, -1]) = .563 .207 .126 .076 0 .028; the mass before each
    token in that order 0, .563, .770, .896, .972: top-p .9 keeps tokens 0-3 (floor 0), .75
    tokens 0-1 (floor 1), .5 token 0 (floor 2), .999 every finite token (floor -1)."""
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, float("-inf"), -1.0]])
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for top_p, floor in ((0.9, 0.0), (0.75, 1.0), (0.5, 2.0), (0.999, -1.0)):
            found = nucleus_floor(logits.to(dtype), 1.0, top_p, lse)
            assert found.dtype == dtype and found.item() == floor


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_keys_order_as_the_floats_and_invert_back(dtype):
    """Every 16-bit pattern but NaNs: sorted by key, the floats come out in order (-inf first,
    -0 before +0), and each key gives back its float's bits."""
    x = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)
    x = x[~x.isnan()]
    keys = sampling._key_of_float(x)
    ordered = x[keys.argsort()].float()
    assert (ordered.diff() >= 0).all() and ordered[0] == float("-inf")
    assert torch.equal(sampling._float_of_key(keys, dtype).view(torch.int16), x.view(torch.int16))
    assert sampling._POS_INF_KEY[dtype] == keys.max() == -keys.min() - 1


def test_nucleus_floor_at_the_edges():
    """Top-p 0 keeps the likeliest token (as the sort does); a row whose mass rounds under top-p
    keeps every finite token (floor -inf); other dtypes are refused with a clear message."""
    logits = torch.tensor([[0.5, 2.0, -1.0], [0.0, 0.0, 0.0]])
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)
    assert nucleus_floor(logits, 1.0, 0.0, lse).flatten().tolist() == [2.0, 0.0]
    low = lse + 1e-6  # the probabilities sum to a little under 1, under this top-p
    assert nucleus_floor(logits, 1.0, 1.0 - 1e-9, low).isneginf().all()
    with pytest.raises(TypeError, match="bf16, fp16 or fp32"):
        nucleus_floor(logits.double(), 1.0, 0.7, lse.double())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_nucleus_floor_is_the_same_whatever_the_bits_per_pass(dtype):
    """Settling several key bits a pass finds the bisection's floor exactly: on random rows
    (peaked, flat, partly masked, tied), at the edges (top-p 0, a mass that rounds under top-p)
    and at every pass width, including ones that do not divide the key's bits."""
    g = torch.Generator().manual_seed(2)
    scale = torch.tensor([0.3, 1.0, 4.0]).repeat_interleave(20)[:, None]
    logits = (torch.randn(60, 500, generator=g) * scale).to(dtype)
    logits[::7, :50] = float("-inf")
    logits[1::7, :] = logits[1::7, :1]  # a row of one value: every token tied
    for top_p, temperature, shift in ((0.0, 1.0, 0), (0.7, 0.6, 0), (0.95, 1.3, 0), (1.0, 1, 1e-6)):
        lse = torch.logsumexp(logits.float() / temperature, dim=-1, keepdim=True) + shift
        bisection = nucleus_floor(logits, temperature, top_p, lse, bits_per_pass=1)
        for bits in (2, 3, 4, 5):
            found = nucleus_floor(logits, temperature, top_p, lse, bits_per_pass=bits)
            assert torch.equal(found, bisection), (top_p, bits)
    assert bisection.isneginf().all()  # the last case: every row's mass rounds under top-p


def _sorted_nucleus(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """(B, V) -> (B, V) bool: the tokens ``sample_next``'s sort keeps (a prefix of the sorted
    order: the mass before a token under top-p)."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    sorted_p, order = probs.sort(dim=-1, descending=True)
    kept_sorted = (sorted_p.cumsum(dim=-1) - sorted_p) < top_p
    return torch.zeros_like(kept_sorted).scatter(-1, order, kept_sorted)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nucleus_floor_keeps_the_sorted_nucleus(dtype):
    """Over 600 rows of random logits (peaked and flat, some masked) at several top-p: the floor's
    tokens hold at least top-p of the mass and those above it less (what makes it the nucleus);
    they are the sort's nucleus but for tokens as likely as the floor's, where the sort keeps an
    arbitrary few of the tied (bf16 logits tie often; float32 ones can round to one probability)."""
    g = torch.Generator().manual_seed(1)
    scale = torch.tensor([0.3, 1.0, 4.0]).repeat_interleave(200)[:, None]
    logits = (torch.randn(600, 2000, generator=g) * scale).to(dtype)
    logits[::7, :50] = float("-inf")
    ties = 0
    for top_p, temperature in ((0.1, 1.0), (0.7, 1.0), (0.7, 0.6), (0.95, 1.3)):
        lse = torch.logsumexp(logits.float() / temperature, dim=-1, keepdim=True)
        floor = nucleus_floor(logits, temperature, top_p, lse)
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        ours = logits >= floor
        assert ((probs * ours).sum(-1) >= top_p - 1e-5).all()
        assert ((probs * (logits > floor)).sum(-1) < top_p + 1e-5).all()
        differ = ours ^ _sorted_nucleus(logits, temperature, top_p)
        floor_p = (floor.float() / temperature - lse).exp().expand_as(probs)
        torch.testing.assert_close(probs[differ], floor_p[differ], rtol=1e-5, atol=0)
        ties += int(differ.any(dim=-1).sum())
    assert ties > 10 if dtype == torch.bfloat16 else ties < 10


@pytest.mark.parametrize("block", [3, 4, 1024])
def test_blocked_nucleus_is_the_inverse_cdf_of_the_nucleus(block):
    """Below top-p 1, uniforms on a fine grid land on each token of the nucleus in proportion to
    its renormalised probability (to the grid's step) and never outside it; the log-prob is the
    unrestricted log-softmax, as the exact sampler's."""
    logits = torch.tensor([0.5, 2.0, float("-inf"), 1.0, 0.0, -1.0, 0.3])
    probs = torch.softmax(logits / 0.8, dim=-1)
    n = 20_000
    u = ((torch.arange(n) + 0.5) / n)[:, None]
    for top_p, keep in ((0.9, [0, 1, 3, 6]), (0.7, [1, 3]), (0.3, [1]), (1.0, [0, 1, 3, 4, 5, 6])):
        nucleus = torch.zeros_like(probs)
        nucleus[keep] = probs[keep]
        tokens, logp = sample_blocked(logits.expand(n, -1), 0.8, top_p, u, block=block)
        freq = torch.bincount(tokens, minlength=7).float() / n
        torch.testing.assert_close(freq, nucleus / nucleus.sum(), atol=2 / n, rtol=0)
        torch.testing.assert_close(logp, probs.log()[tokens])
        # the same nucleus as the sort's, drawn by another order: the same distribution
        exact, _ = sample_next(logits.expand(n, -1), 0.8, top_p, u)
        assert torch.equal(torch.bincount(exact, minlength=7), torch.bincount(tokens, minlength=7))


def test_blocked_nucleus_over_a_flat_distribution_keeps_every_tied_token():
    """All logits equal (a model that has learnt nothing): every token ties at the floor and
    stays in; the sort would keep an arbitrary 70%."""
    logits = torch.zeros(2000, 10, dtype=torch.bfloat16)
    tokens, logp = sample_blocked(logits, 1.0, 0.7, block=4)
    assert set(tokens.tolist()) == set(range(10))
    torch.testing.assert_close(logp, torch.full((2000,), -torch.log(torch.tensor(10.0))))


def test_sampler_choice_by_device_and_bad_names():
    cpu = torch.device("cpu")
    assert sampler_for("auto", cpu) is sample_next  # CPU runs keep the rounding a seed reproduces
    assert sampler_for("exact", cpu) is sample_next
    assert sampler_for("flat", cpu).func is sample_flat
    assert sampler_for("blocked", cpu) is sample_blocked
    # on CUDA the blocked sampler is compiled (lazily: nothing compiles until a call)
    assert sampler_for("auto", torch.device("cuda")) is sampling.sample_blocked_cuda
    with pytest.raises(ValueError, match="sampler must be auto or one of exact, flat, blocked"):
        sampler_for("fast", cpu)


def test_the_cuda_sampler_compiles_without_breaks_or_vocabulary_sized_buffers(monkeypatch):
    """What CUDA compiles (Inductor's CPU code here): at top-p 1 the blocked sampler whole,
    below it the block masses and the nucleus floor apart (compiled whole, the bisection ran
    several times slower on an H100). Each traces without a break (a break leaves host work
    inside the recorded step), the draws are the eager maths', and no buffer the size of the
    logits is allocated (it would be written and read every step)."""
    import re

    from torch._inductor.utils import run_and_get_code

    compiled, code = [], []

    def record(fn):
        compiled.append(fn.__name__)
        whole = torch.compile(fn, fullgraph=True)

        def call(*args):
            out, source = run_and_get_code(whole, *args)
            code.extend(source)
            return out

        return call

    monkeypatch.setattr(sampling, "_compiled", record)
    g = torch.Generator().manual_seed(0)
    B, V = 8, 3001
    logits = (torch.randn(B, V, generator=g) * 3).to(torch.bfloat16)
    u = torch.rand(B, 1, generator=g)
    torch._dynamo.reset()
    parts = ["block_log_masses", "nucleus_floor"]
    for top_p, names in ((1.0, ["sample_blocked_whole"]), (0.7, parts)):
        compiled.clear(), code.clear()
        tokens, logp = sampling.sample_blocked_cuda(logits, 0.8, top_p, u)
        assert compiled == names
        expected = sample_blocked(logits, 0.8, top_p, u)
        assert torch.equal(tokens, expected[0])
        torch.testing.assert_close(logp, expected[1])
        sizes = re.findall(r"empty_strided_\w+\(\((\d+), (\d+)\)", "\n".join(code))
        assert sizes and max(int(n) for _, n in sizes) < V


def test_compiled_probabilities_fall_back_to_eager_once_when_compiling_fails(caplog):
    """A compiler failure (an Inductor bug) is reported once; the eager maths is used from then on
    and gives the same result."""
    probs = sampling._Compiled(sampling.tempered_probs)
    calls = []

    def broken(logits, temperature):
        calls.append(1)
        raise RuntimeError("inductor codegen failed")

    probs.fn = broken
    logits = torch.randn(3, 7)
    with caplog.at_level(logging.WARNING, logger="tasks.rollout.sampling"):
        for _ in range(3):
            p, lse = probs(logits, 0.7)
    assert len(calls) == 1 and caplog.text.count("compiled sampling failed") == 1
    torch.testing.assert_close(p, torch.softmax(logits / 0.7, dim=-1))
    torch.testing.assert_close(lse, torch.logsumexp(logits / 0.7, dim=-1, keepdim=True))


@pytest.mark.parametrize("top_p", [1.0, 0.7])
def test_the_cuda_samplers_functions_compile_once_over_every_batch_size(top_p):
    """What CUDA compiles over rows (``compile_over_rows``: the batch symbolic from the first
    call) fixes no batch size: one compilation serves them all (a fixed size would make
    ``mark_dynamic`` fail, and the sampler fall back to eager), and draws what the eager maths
    draws."""
    from torch._dynamo.testing import CompileCounter

    from dapo_core.compiled_rows import compile_over_rows

    g = torch.Generator().manual_seed(0)
    wide_floor = functools.partial(sampling.nucleus_floor, bits_per_pass=4)
    functions = (
        sampling.sample_blocked_whole,
        sampling.nucleus_floor,
        wide_floor,
        sampling.block_log_masses,
    )
    for fn in functions:
        torch._dynamo.reset()
        counter = CompileCounter()
        compiled = compile_over_rows(fn, 256, backend=counter)
        for rows in (8, 5, 16):
            logits = (torch.randn(rows, 3001, generator=g) * 3).to(torch.bfloat16)
            if fn is sampling.sample_blocked_whole:
                args = (logits, 0.8, top_p, torch.rand(rows, 1, generator=g))
            elif fn in (sampling.nucleus_floor, wide_floor):
                args = (logits, 0.8, top_p, torch.zeros(rows, 1))
            else:
                args = (logits, 0.8, 1024, torch.zeros(rows, 1, dtype=logits.dtype))
            for got, want in zip(compiled(*args), fn(*args), strict=True):
                assert torch.equal(got, want)
        assert counter.frame_count == 1, fn
