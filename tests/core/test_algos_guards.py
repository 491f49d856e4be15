"""No entry turns one wild log-probability into an infinite loss (issue 42): every entry that
exponentiates gets a log-ratio of +-90 in bf16, float32 and float64 and returns finite losses,
gradients and metrics; where it clamps as verl does, the clamped value by hand."""

import math

import pytest
import torch

from dapo_core.algos import CORRECTIONS, KL_ESTIMATORS, POLICY_LOSSES, TokenBatch, reduce_metrics
from dapo_core.algos.kl import k3
from dapo_core.algos.losses import LOG_RATIO_BOUND, ClipParams, clip

DTYPES = [torch.bfloat16, torch.float32, torch.float64]
WILD = 90.0


def _batch(dtype, shift: float, adv: float):
    """Two sequences of three tokens: in the first the middle token has log pi - log pi_old =
    ``shift``, in the second every token has (a sequence ratio of e^shift, for GSPO); the
    sampler's log-probs are off from pi_old by as much."""
    old = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -2.0, -0.5]], dtype=dtype)
    gaps = torch.tensor([[0.1, shift, -0.1], [shift, shift, shift]], dtype=dtype)
    logp = (old + gaps).requires_grad_()
    adv_t = torch.full((2, 3), adv, dtype=dtype)
    mask = torch.ones(2, 3, dtype=torch.bool)
    return TokenBatch(logp, old, adv_t, mask, rollout_logp=old - gaps)


def _finite_metrics(metrics) -> bool:
    return all(
        torch.isfinite(torch.as_tensor(v, dtype=torch.float64)).all() for v in metrics.values()
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shift", [WILD, -WILD])
@pytest.mark.parametrize("adv", [1.0, -1.0])
@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_policy_losses_stay_finite_for_a_wild_log_ratio(name, dtype, shift, adv):
    entry = POLICY_LOSSES.get(name)
    batch = _batch(dtype, shift, adv)
    loss_t, metrics = entry.fn(batch, entry.params_cls())
    loss_t.sum().backward()
    assert torch.isfinite(loss_t).all(), loss_t
    assert torch.isfinite(batch.logp.grad).all(), batch.logp.grad
    assert _finite_metrics(reduce_metrics([metrics]))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shift", [WILD, -WILD])
@pytest.mark.parametrize("name", CORRECTIONS.names())
def test_corrections_stay_finite_for_a_wild_log_weight(name, dtype, shift):
    entry = CORRECTIONS.get(name)
    weights, keep, metrics = entry.fn(_batch(dtype, shift, 1.0), entry.params_cls())
    assert torch.isfinite(weights).all() and keep.dtype == torch.bool
    assert _finite_metrics(reduce_metrics([metrics]))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("gap", [30.0, WILD, -WILD])
@pytest.mark.parametrize("name", KL_ESTIMATORS.names())
def test_kl_estimators_stay_finite_for_a_wild_gap(name, dtype, gap):
    logp = torch.tensor([[-1.0, -2.0]], dtype=dtype, requires_grad=True)
    ref = logp.detach() + torch.tensor([[0.0, gap]], dtype=dtype)
    kl = KL_ESTIMATORS.get(name).fn(logp, ref)
    kl.sum().backward()
    assert torch.isfinite(kl).all() and torch.isfinite(logp.grad).all()


def test_clip_clamps_the_log_ratio_as_verl_does_by_hand():
    """log r = 25, A = -1 (float64): r is read as e^20, so l = -A e^20 = 4.85e8 with no
    gradient (the clamp passes none); log r = 0.1 is untouched: l = e^0.1, gradient e^0.1."""
    assert LOG_RATIO_BOUND == 20.0
    old = torch.zeros(1, 2, dtype=torch.float64)
    logp = torch.tensor([[25.0, 0.1]], dtype=torch.float64, requires_grad=True)
    batch = TokenBatch(logp, old, -torch.ones(1, 2, dtype=torch.float64), torch.ones(1, 2))
    loss_t, _ = clip(batch, ClipParams())
    loss_t.sum().backward()
    torch.testing.assert_close(
        loss_t, torch.tensor([[math.exp(20.0), math.exp(0.1)]], dtype=torch.float64)
    )
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, math.exp(0.1)]], dtype=torch.float64))


def test_k3_clamps_as_verl_does_by_hand():
    """ref - logp clamped to [-20, 20], then k3 to at most 10: a gap of 30 gives 10, a gap of
    -30 gives e^-20 + 20 - 1 capped at 10 too; a gap of 1 is untouched: e - 2."""
    logp = torch.zeros(1, 3, dtype=torch.float64)
    ref = torch.tensor([[30.0, -30.0, 1.0]], dtype=torch.float64)
    torch.testing.assert_close(
        k3(logp, ref), torch.tensor([[10.0, 10.0, math.e - 2.0]], dtype=torch.float64)
    )
