import logging

import pytest
import torch

from tasks.rollout import sampling
from tasks.rollout.sampling import sample_blocked, sample_flat, sample_next, sampler_for


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


def test_sampler_choice_by_device_and_bad_names():
    cpu = torch.device("cpu")
    assert sampler_for("auto", cpu) is sample_next  # CPU runs keep the rounding a seed reproduces
    assert sampler_for("exact", cpu) is sample_next
    assert sampler_for("flat", cpu).func is sample_flat
    assert sampler_for("blocked", cpu).func is sample_blocked
    with pytest.raises(ValueError, match="sampler must be auto or one of exact, flat, blocked"):
        sampler_for("fast", cpu)


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
