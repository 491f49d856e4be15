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
