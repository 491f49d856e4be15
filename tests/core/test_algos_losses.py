"""Policy-loss entries (dapo_core.algos.losses): values and gradients by hand, and properties."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_core.algos import POLICY_LOSSES, TokenBatch, reduce_metrics
from dapo_core.algos.losses import CispoParams, ClipParams, GspoParams, cispo, clip, gspo

F64 = torch.float64


def _batch(log_ratio, adv, mask=None, old=None):
    """A batch whose logp = old + log_ratio (a leaf that requires grad)."""
    log_ratio = torch.as_tensor(log_ratio, dtype=F64)
    old = torch.zeros_like(log_ratio) if old is None else torch.as_tensor(old, dtype=F64)
    logp = (old + log_ratio).requires_grad_()
    mask = torch.ones_like(log_ratio, dtype=torch.bool) if mask is None else torch.tensor(mask)
    return TokenBatch(logp, old, torch.as_tensor(adv, dtype=F64), mask.bool())


def _loss_and_grad(fn, batch, p):
    loss_t, metrics = fn(batch, p)
    loss_t.sum().backward()
    return loss_t.detach(), batch.logp.grad, reduce_metrics([metrics])


def test_clip_by_hand():
    # r = 1.5, A = +1: clipped at 1.28, l = max(-1.5, -1.28) = -1.28, no gradient
    # r = 0.5, A = -1: l = max(0.5, 0.8) = 0.8 (clipped at 1 - 0.2), no gradient
    # r = 1.1, A = +2: inside, l = -2.2, dl/dlogp = -A r = -2.2
    # r = 1.5, A = -1: l = max(1.5, 1.28) = 1.5 (PPO pessimism), dl/dlogp = -A r = 1.5
    ratios = [1.5, 0.5, 1.1, 1.5]
    old = [[math.log(q) for q in (0.2, 0.4, 0.5, 0.1)]]
    batch = _batch([[math.log(r) for r in ratios]], [[1.0, -1.0, 2.0, -1.0]], old=old)
    loss, grad, m = _loss_and_grad(clip, batch, ClipParams())
    torch.testing.assert_close(loss, torch.tensor([[-1.28, 0.8, -2.2, 1.5]], dtype=F64))
    torch.testing.assert_close(grad, torch.tensor([[0.0, 0.0, -2.2, 1.5]], dtype=F64))
    assert m["clip_frac_high"].item() == pytest.approx(1 / 4)  # token 0
    assert m["clip_frac_low"].item() == pytest.approx(1 / 4)  # token 1
    assert m["clip_high_old_prob"].item() == pytest.approx(0.2)  # pi_old of token 0
    assert m["ratio_mean"].item() == pytest.approx(4.6 / 4)


def test_clip_dual_clip_by_hand():
    # c = 3. r = 20, A = -1: min(max(20, 1.28), 3) = 3, capped: no gradient
    # r = 20, A = +1: -1.28 (upper clip, dual clip ignores A > 0), no gradient
    # r = 2, A = -1: min(max(2, 1.28), 3) = 2, dl/dlogp = -A r = 2
    batch = _batch([[math.log(20.0), math.log(20.0), math.log(2.0)]], [[-1.0, 1.0, -1.0]])
    loss, grad, _ = _loss_and_grad(clip, batch, ClipParams(dual_clip_c=3.0))
    torch.testing.assert_close(loss, torch.tensor([[3.0, -1.28, 2.0]], dtype=F64))
    torch.testing.assert_close(grad, torch.tensor([[0.0, 0.0, 2.0]], dtype=F64))


def test_gspo_by_hand():
    # eps 3e-4 / 4e-4. Row 0: log r = [ln 2, 0], padding; s = exp(ln 2 / 2) = sqrt 2, A = -1:
    #   l = max(sqrt 2, 1.0004) = sqrt 2 on both tokens; dl_t/dlogp_t = -A s = sqrt 2.
    # Row 1: log r = [0.1, -0.1, 0]: s = 1, A = 2: l = -2, dl/dlogp = -2 on each.
    # Row 2: log r = [-ln 2, 0], padding; s = 1/sqrt 2 < 0.9997, A = -1:
    #   l = max(0.7071, 0.9997) = 0.9997 (clipped below: no gradient).
    log_ratio = [[math.log(2), 0.0, 0.0], [0.1, -0.1, 0.0], [-math.log(2), 0.0, 0.0]]
    adv = [[-1.0] * 3, [2.0] * 3, [-1.0] * 3]
    mask = [[1, 1, 0], [1, 1, 1], [1, 1, 0]]
    loss, grad, m = _loss_and_grad(gspo, _batch(log_ratio, adv, mask), GspoParams())
    r2 = math.sqrt(2)
    want = torch.tensor([[r2, r2, 0], [-2, -2, -2], [0.9997, 0.9997, 0]], dtype=F64)
    torch.testing.assert_close(loss, want)
    torch.testing.assert_close(
        grad, torch.tensor([[r2, r2, 0], [-2, -2, -2], [0, 0, 0]], dtype=F64)
    )
    assert m["clip_frac_low"].item() == pytest.approx(2 / 7)  # row 2's two tokens
    assert m["clip_frac_high"].item() == 0.0
    assert m["ratio_mean"].item() == pytest.approx((2 * r2 + 3 + 2 / r2) / 7)


def test_gspo_gradient_of_a_token_stays_on_that_token():
    # l_t depends on logp_t only through the token factor: d l_0 / d logp_1 = 0
    batch = _batch([[0.0, 0.0]], [[1.0, 1.0]])
    loss_t, _ = gspo(batch, GspoParams())
    (g,) = torch.autograd.grad(loss_t[0, 0], batch.logp)
    torch.testing.assert_close(g, torch.tensor([[-1.0, 0.0]], dtype=F64))


def test_cispo_by_hand():
    # eps_low 0.5, eps_high 0.2: weight = clip(r, 0.5, 1.2), constant; l = -w A logp.
    # token 0: pi 0.5, pi_old 0.25, r = 2 -> w = 1.2, A = 1: l = -1.2 ln 0.5 = 0.831777;
    #          dl/dlogp = -w A = -1.2 (PPO's clip would give 0 here)
    # token 1: r = 1 -> w = 1, A = -2: l = 2 ln 0.5 = -1.386294, dl/dlogp = 2
    # token 2: pi 0.1, pi_old 0.4, r = 0.25 -> w = 0.5, A = 1: l = -0.5 ln 0.1 = 1.151293,
    #          dl/dlogp = -0.5
    logp = torch.log(torch.tensor([[0.5, 0.5, 0.1]], dtype=F64))
    old = torch.log(torch.tensor([[0.25, 0.5, 0.4]], dtype=F64))
    batch = _batch(logp - old, [[1.0, -2.0, 1.0]], old=old)
    loss, grad, m = _loss_and_grad(cispo, batch, CispoParams(eps_low=0.5, eps_high=0.2))
    want = torch.tensor([[0.831777, -1.386294, 1.151293]], dtype=F64)
    torch.testing.assert_close(loss, want, atol=1e-6, rtol=0)
    torch.testing.assert_close(grad, torch.tensor([[-1.2, 2.0, -0.5]], dtype=F64))
    assert m["clip_frac_high"].item() == pytest.approx(1 / 3)
    assert m["clip_frac_low"].item() == pytest.approx(1 / 3)


def test_cispo_default_caps_the_weight_at_five():
    # r = 8 > 1 + 4: w = 5, A = 1, dl/dlogp = -5; r = 0.01: no lower bound (eps_low 1), w = 0.01
    batch = _batch([[math.log(8.0), math.log(0.01)]], [[1.0, 1.0]])
    _, grad, _ = _loss_and_grad(cispo, batch, CispoParams())
    torch.testing.assert_close(grad, torch.tensor([[-5.0, -0.01]], dtype=F64))


@pytest.mark.parametrize("name", ["clip", "gspo", "cispo"])
def test_padding_with_inf_and_nan_stays_finite_and_silent(name):
    entry = POLICY_LOSSES.get(name)
    # a range wide enough that no valid token is clipped (r = e^0.1), so all have gradient
    wide = {"eps_low": 0.2, "eps_high": 0.28} if name == "gspo" else {}
    p = POLICY_LOSSES.make_params(name, wide)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    logp = torch.tensor([[-0.5, -1.0, -math.inf], [-0.2, -math.inf, -math.inf]], dtype=F64)
    old = torch.where(mask, logp - 0.1, logp)  # equal to logp on padding, as the contract says
    adv = torch.tensor([[1.0, 1.0, math.nan], [-1.0, math.nan, math.nan]], dtype=F64)
    logp.requires_grad_()
    loss_t, metrics = entry.fn(TokenBatch(logp, old, adv, mask), p)
    loss_t.sum().backward()
    assert torch.isfinite(loss_t).all() and (loss_t[~mask] == 0).all()
    assert torch.isfinite(logp.grad).all() and (logp.grad[~mask] == 0).all()
    assert (logp.grad[mask] != 0).all()
    assert all(torch.isfinite(v).all() for v in reduce_metrics([metrics]).values())


@settings(max_examples=60, deadline=None)
@given(
    b=st.integers(1, 5),
    t=st.integers(1, 8),
    seed=st.integers(0, 10_000),
    eps_low=st.floats(0.05, 0.5),
    eps_high=st.floats(0.05, 0.5),
    dual=st.sampled_from([None, 2.0, 10.0]),
)
def test_clip_equals_eq10_written_out(b, t, seed, eps_low, eps_high, dual):
    """Values and gradients against DAPO Eq. 10 (and the dual clip) written out with plain ops."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g, dtype=F64) * 3
    logp = old + torch.randn(b, t, generator=g, dtype=F64) * 0.5
    adv = torch.randn(b, t, generator=g, dtype=F64)
    ours = logp.clone().requires_grad_()
    loss_t, _ = clip(
        TokenBatch(ours, old, adv, torch.ones(b, t)), ClipParams(eps_low, eps_high, dual)
    )
    loss_t.sum().backward()
    theirs = logp.clone().requires_grad_()
    r = torch.exp(theirs - old)
    want = torch.maximum(-adv * r, -adv * torch.clamp(r, 1 - eps_low, 1 + eps_high))
    if dual is not None:
        want = torch.where(adv < 0, torch.minimum(want, -adv * dual), want)
    want.sum().backward()
    torch.testing.assert_close(loss_t, want)
    torch.testing.assert_close(ours.grad, theirs.grad)


@settings(max_examples=60, deadline=None)
@given(b=st.integers(1, 5), t=st.integers(1, 8), seed=st.integers(0, 10_000))
def test_gspo_equals_clip_when_a_sequence_has_one_ratio(b, t, seed):
    """Same ratio on every token of a row -> s_i = r: GSPO's loss and gradient are clip's."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g, dtype=F64) * 3
    rho = torch.randn(b, 1, generator=g, dtype=F64) * 0.4  # one log ratio per row
    adv = torch.randn(b, t, generator=g, dtype=F64)
    mask = torch.rand(b, t, generator=g) > 0.3
    eps = {"eps_low": 0.2, "eps_high": 0.28}
    out = []
    for fn, p in ((clip, ClipParams(**eps)), (gspo, GspoParams(**eps))):
        logp = (old + rho).requires_grad_()
        loss_t, _ = fn(TokenBatch(logp, torch.where(mask, old, logp.detach()), adv, mask), p)
        loss_t.sum().backward()
        out.append((loss_t.detach(), logp.grad))
    torch.testing.assert_close(out[1][0], out[0][0])
    torch.testing.assert_close(out[1][1], out[0][1])


def test_gspo_differs_from_clip_when_ratios_differ():
    """The property above is not vacuous: unequal ratios in a row give another loss."""
    batch = _batch([[0.5, -0.5]], [[1.0, 1.0]])
    eps = {"eps_low": 0.2, "eps_high": 0.28}
    a, _ = clip(batch, ClipParams(**eps))
    b, _ = gspo(batch, GspoParams(**eps))
    assert not torch.allclose(a, b)
