import torch

from dapo_core.logprobs import token_logprobs
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
