import pytest
import torch

from dapo_core.logprobs import linear_logprobs, token_logprobs
from dapo_core.metrics import token_entropy


def _reference(hidden, weight, targets, temperature):
    logits = hidden @ weight.T / temperature
    logp = torch.log_softmax(logits, -1).gather(-1, targets[:, None]).squeeze(-1)
    return logp, token_entropy(logits)


def test_matches_full_log_softmax_in_any_chunking():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(37, 8, generator=g, dtype=torch.float64)
    weight = torch.randn(50, 8, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 50, (37,), generator=g)
    ref_lp, ref_ent = _reference(hidden, weight, targets, 0.7)
    for chunk in (1, 5, 37, 1000):
        lp, ent = token_logprobs(
            hidden, lambda h: h @ weight.T, targets, temperature=0.7, chunk=chunk
        )
        torch.testing.assert_close(lp, ref_lp.float(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ent, ref_ent.float(), rtol=1e-5, atol=1e-5)


def test_gradients_match_unchunked():
    g = torch.Generator().manual_seed(1)
    h0 = torch.randn(20, 6, generator=g)
    w0 = torch.randn(30, 6, generator=g)
    targets = torch.randint(0, 30, (20,), generator=g)
    coef = torch.randn(20, generator=g)

    h1, w1 = h0.clone().requires_grad_(), w0.clone().requires_grad_()
    (_reference(h1, w1, targets, 1.0)[0] * coef).sum().backward()
    h2, w2 = h0.clone().requires_grad_(), w0.clone().requires_grad_()
    lp, ent = token_logprobs(h2, lambda h: h @ w2.T, targets, chunk=7)
    (lp * coef).sum().backward()
    assert not ent.requires_grad
    torch.testing.assert_close(h2.grad, h1.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(w2.grad, w1.grad, rtol=1e-4, atol=1e-5)


def test_empty_selection():
    lp, ent = token_logprobs(
        torch.zeros(0, 4), lambda h: h @ torch.zeros(9, 4).T, torch.zeros(0, dtype=torch.long)
    )
    assert lp.shape == (0,) and ent.shape == (0,)


@pytest.mark.parametrize("chunk", [1, 6, 20, 1000])
def test_fused_linear_head_matches_log_softmax_values_and_gradients(chunk):
    """The fused head (saves only a logsumexp per row, recomputes logits in backward) gives the
    log-softmax's log-probs, entropies and gradients in hidden and weight, at any chunking and
    temperature; float64 so that only the algebra is compared."""
    g = torch.Generator().manual_seed(2)
    h0 = torch.randn(20, 6, generator=g, dtype=torch.float64)
    w0 = torch.randn(30, 6, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 30, (20,), generator=g)
    coef = torch.randn(20, generator=g, dtype=torch.float64)

    h1, w1 = h0.clone().requires_grad_(), w0.clone().requires_grad_()
    ref_lp, ref_ent = _reference(h1, w1, targets, 0.7)
    (ref_lp * coef).sum().backward()
    h2, w2 = h0.clone().requires_grad_(), w0.clone().requires_grad_()
    lp, ent = linear_logprobs(h2, w2, targets, temperature=0.7, chunk=chunk)
    (lp * coef.float()).sum().backward()
    assert lp.dtype == torch.float32 and not ent.requires_grad
    torch.testing.assert_close(lp, ref_lp.float(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ent, ref_ent.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h2.grad, h1.grad, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(w2.grad, w1.grad, rtol=1e-6, atol=1e-6)


def test_fused_linear_head_gradient_by_hand():
    """One row, V = 2: d log p(y=0) / d z = (1 - p0, -p1); z = h w^T, so dh = dz @ w and
    dw = dz^T h."""
    h = torch.tensor([[1.0, 0.0]], requires_grad=True)
    w = torch.tensor([[2.0, 0.0], [0.0, 0.0]], requires_grad=True)  # z = (2, 0)
    lp, _ = linear_logprobs(h, w, torch.tensor([0]))
    lp.sum().backward()
    p0 = torch.sigmoid(torch.tensor(2.0))
    assert torch.isclose(lp[0], torch.log(p0))
    dz = torch.tensor([1 - p0, -(1 - p0)])
    torch.testing.assert_close(h.grad[0], dz @ w.detach())
    torch.testing.assert_close(w.grad, dz[:, None] * h.detach())


def test_fused_linear_head_empty_selection():
    lp, ent = linear_logprobs(
        torch.zeros(0, 4), torch.zeros(5, 4), torch.zeros(0, dtype=torch.long)
    )
    assert lp.shape == ent.shape == (0,)


DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_compiled_chunk_kernels_equal_the_log_softmax_on_wide_bf16_logits(device):
    """The fused head's two kernels, compiled as CUDA runs them, on bf16 logits of a wide
    vocabulary with large values (the one-pass entropy needs its max shift): lse, log-probs and
    entropies against float64 log-softmax, and d logits against (onehot - softmax) * g, for two
    row counts (the last chunk's differs, which turns the rows symbolic)."""
    from dapo_core.logprobs import _chunk_grad_logits, _chunk_stats

    stats, grad_logits = (
        torch.compile(f, dynamic=None) for f in (_chunk_stats, _chunk_grad_logits)
    )
    g = torch.Generator().manual_seed(3)
    for rows in (64, 37):
        z = (torch.randn(rows, 5000, generator=g) * 30).to(device, torch.bfloat16)
        targets = torch.randint(0, 5000, (rows,), generator=g).to(device)
        coef = torch.randn(rows, generator=g).to(device)
        lse, logp, ent = stats(z, targets, 0.7)
        exact = z.double() * 0.7
        ref = torch.log_softmax(exact, -1)
        torch.testing.assert_close(lse, torch.logsumexp(exact, -1).float(), rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(
            logp, ref.gather(-1, targets[:, None])[:, 0].float(), rtol=1e-5, atol=1e-4
        )
        torch.testing.assert_close(ent, -(ref.exp() * ref).sum(-1).float(), rtol=1e-4, atol=1e-4)
        d = grad_logits(z, targets, lse, coef, 0.7)
        onehot = torch.nn.functional.one_hot(targets, 5000).double()
        want = (onehot - ref.exp()) * (coef.double()[:, None] * 0.7)
        assert d.dtype == torch.bfloat16
        torch.testing.assert_close(d.double(), want, rtol=1e-2, atol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("keep", [False, True])
def test_fused_linear_head_on_cuda_matches_float64(keep):
    """The whole fused head on CUDA (compiled kernels, several chunks and a ragged last one):
    log-probs, entropies and both gradients against float64 on the host."""
    g = torch.Generator().manual_seed(4)
    h0 = torch.randn(300, 64, generator=g) / 4
    w0 = torch.randn(3000, 64, generator=g) / 4
    targets = torch.randint(0, 3000, (300,), generator=g)
    coef = torch.randn(300, generator=g)
    h1, w1 = h0.double().requires_grad_(), w0.double().requires_grad_()
    ref_lp, ref_ent = _reference(h1, w1, targets, 0.7)
    (ref_lp * coef.double()).sum().backward()
    h2, w2 = h0.cuda().requires_grad_(), w0.cuda().requires_grad_()
    lp, ent = linear_logprobs(h2, w2, targets.cuda(), 0.7, chunk=128, keep_logits=keep)
    (lp * coef.cuda()).sum().backward()
    torch.testing.assert_close(lp.cpu(), ref_lp.float(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ent.cpu(), ref_ent.float(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(h2.grad.cpu(), h1.grad.float(), rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(w2.grad.cpu(), w1.grad.float(), rtol=1e-3, atol=1e-4)


def test_kept_logits_give_the_recomputed_gradients_bit_for_bit_and_are_freed():
    """keep_logits holds each chunk's logits for backward instead of recomputing them: the same
    products, so the same gradients exactly; backward drops each chunk once used; without
    gradients nothing is kept."""
    g = torch.Generator().manual_seed(5)
    h0, w0 = torch.randn(23, 8, generator=g), torch.randn(40, 8, generator=g)
    targets, coef = torch.randint(0, 40, (23,), generator=g), torch.randn(23, generator=g)
    grads = []
    for keep in (False, True):
        h, w = h0.clone().requires_grad_(), w0.clone().requires_grad_()
        lp, _ = linear_logprobs(h, w, targets, 0.7, chunk=5, keep_logits=keep)
        kept = lp.grad_fn.kept
        assert [z is not None for z in kept] == [keep] * 5  # 23 rows in chunks of 5
        (lp * coef).sum().backward()
        assert kept == [None] * 5
        grads.append((h.grad, w.grad))
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))
    with torch.no_grad():
        lp, _ = linear_logprobs(h0, w0, targets, chunk=5, keep_logits=True)
    assert lp.grad_fn is None


def test_the_chunk_kernels_compile_once_over_every_chunk_length():
    """CUDA compiles the chunk kernels over rows (``compile_over_rows``): no chunk length gets
    fixed (the last chunk's differs), one compilation serves them all, the same values."""
    from torch._dynamo.testing import CompileCounter

    from dapo_core import logprobs
    from dapo_core.compiled_rows import compile_over_rows

    g = torch.Generator().manual_seed(0)
    for fn in (logprobs._chunk_stats, logprobs._chunk_grad_logits):
        torch._dynamo.reset()
        counter = CompileCounter()
        compiled = compile_over_rows(fn, logprobs.CHUNK, backend=counter)
        for rows in (8, 5, 16):
            logits = torch.randn(rows, 301, generator=g)
            targets = torch.randint(301, (rows,), generator=g)
            extra = () if fn is logprobs._chunk_stats else (torch.randn(rows), torch.randn(rows))
            got, want = compiled(logits, targets, *extra, 0.9), fn(logits, targets, *extra, 0.9)
            got, want = (x if isinstance(x, tuple) else (x,) for x in (got, want))
            assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
        assert counter.frame_count == 1, fn.__name__
