"""KL estimators and the KL term (dapo_core.algos.kl): values and gradients by hand."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dapo_core.algos import (
    KL_ESTIMATORS,
    KLParams,
    TokenBatch,
    aggregate,
    kl_loss,
    kl_reward_penalty,
    make_kl_params,
)
from dapo_core.config import ConfigError

F64 = torch.float64
LN2 = math.log(2)

# token 0: pi 0.5, ref 0.25 (d = logp - ref = ln 2); token 1: pi 0.25, ref 0.5 (d = -ln 2)
LOGP = torch.log(torch.tensor([[0.5, 0.25]], dtype=F64))
REF = torch.log(torch.tensor([[0.25, 0.5]], dtype=F64))


def _value_and_grad(name):
    logp = LOGP.clone().requires_grad_()
    kl = KL_ESTIMATORS.get(name).fn(logp, REF)
    kl.sum().backward()
    return kl.detach(), logp.grad


def test_estimators_by_hand():
    # k1 = d: [ln 2, -ln 2], d/dlogp = 1
    # k2 = d^2 / 2: [ln2^2 / 2] x 2 = 0.240227, d/dlogp = d
    # k3 = exp(-d) + d - 1: [0.5 + ln 2 - 1, 2 - ln 2 - 1] = [0.193147, 0.306853],
    #      d/dlogp = 1 - exp(-d) = [0.5, -1]
    want = {
        "k1": ([LN2, -LN2], [1.0, 1.0]),
        "k2": ([LN2**2 / 2, LN2**2 / 2], [LN2, -LN2]),
        "k3": ([0.5 + LN2 - 1, 1 - LN2], [0.5, -1.0]),
    }
    for name, (value, grad) in want.items():
        got, g = _value_and_grad(name)
        torch.testing.assert_close(got, torch.tensor([value], dtype=F64), msg=name)
        torch.testing.assert_close(g, torch.tensor([grad], dtype=F64), msg=name)


@given(st.lists(st.floats(-20, 0), min_size=1, max_size=8), st.floats(-3, 3))
def test_k2_and_k3_are_never_negative_and_zero_when_equal(logps, shift):
    logp = torch.tensor([logps], dtype=F64)
    for name in ("k2", "k3"):
        fn = KL_ESTIMATORS.get(name).fn
        assert (fn(logp, logp - shift) >= 0).all()
        assert (fn(logp, logp.clone()) == 0).all()


def test_kl_loss_and_reward_penalty_by_hand():
    # k3 on the two tokens above, beta 0.1, second token masked: 0.1 x 0.193147 on token 0
    p = KLParams(estimator="k3", beta=0.1)
    mask = torch.tensor([[True, False]])
    logp = LOGP.clone().requires_grad_()
    term, metrics = kl_loss(p, logp, REF, mask)
    torch.testing.assert_close(term, torch.tensor([[0.1 * (LN2 - 0.5), 0.0]], dtype=F64))
    term.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.1 * 0.5, 0.0]], dtype=F64))
    num, den = metrics["kl_mean"]
    assert (num.item(), den.item()) == (pytest.approx(LN2 - 0.5), 1.0)
    penalty, _ = kl_reward_penalty(p, logp, REF, mask)
    torch.testing.assert_close(penalty, -term.detach())
    assert not penalty.requires_grad


def test_kl_term_is_finite_on_inf_padding():
    logp = torch.tensor([[-1.0, -math.inf]], dtype=F64, requires_grad=True)
    ref = torch.tensor([[-1.5, -math.inf]], dtype=F64)
    term, _ = kl_loss(KLParams(), logp, ref, torch.tensor([[True, False]]))
    term.sum().backward()
    assert torch.isfinite(term).all() and term[0, 1] == 0
    assert torch.isfinite(logp.grad).all() and logp.grad[0, 1] == 0


def test_kl_params_are_validated():
    assert make_kl_params({"beta": 0}) == KLParams(estimator="k3", beta=0.0, where="loss")
    with pytest.raises(ConfigError, match=r"^algo.kl: estimator must be one of k1, k2, k3"):
        make_kl_params({"estimator": "k4"})
    with pytest.raises(ConfigError, match=r"^algo.kl: beta must be >= 0, got -0.1$"):
        make_kl_params({"beta": -0.1})
    with pytest.raises(ConfigError, match=r"^algo.kl: where must be one of 'loss', 'reward'"):
        make_kl_params({"where": "advantage"})
    with pytest.raises(ConfigError, match="unknown parameter 'coef'"):
        make_kl_params({"coef": 0.1})


def _grpo_kl(**kl):
    from dapo_core.algorithm import Algorithm, choose

    return Algorithm(
        advantage=choose("advantage", "grpo", {}),
        correction=choose("correction", "none", {}),
        loss=choose("loss", "clip", {"eps_low": 0.2, "eps_high": 0.2}),
        aggregation=choose("aggregation", "seq_mean_token_mean", {}),
        kl=KLParams(**kl) if kl else None,
    )


def test_kl_in_the_loss_is_added_per_token_then_aggregated_by_hand():
    """GRPO's objective (Shao et al. 2024, Eq. 3) on one response of two tokens at ratio 1, A = 1:
    l_t = -A r_t + beta k3_t; k3 = [ln 2 - 1/2, 1 - ln 2] (above), beta = 0.1; the sample-level
    mean is (-2 + 0.1 x 1/2) / 2 = -0.975; d l_t / d logp_t = -1 + 0.1 (1 - exp(-d_t)) = [-0.95,
    -1.1], halved by the mean over the response's 2 tokens."""
    from dapo_core.algorithm import token_losses

    alg = _grpo_kl(estimator="k3", beta=0.1)
    logp = LOGP.clone().requires_grad_()
    ones = torch.ones(1, 2, dtype=F64)
    batch = TokenBatch(logp, LOGP, ones, torch.ones(1, 2, dtype=torch.bool), ref_logp=REF)
    loss_t, keep, metrics = token_losses(alg, batch)
    loss = aggregate(alg.aggregation.entry, alg.aggregation.params, loss_t, keep)
    assert loss.item() == pytest.approx(-0.975)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.475, -0.55]], dtype=F64))
    num, den = metrics["kl_mean"]
    assert (num.item(), den.item()) == (pytest.approx(0.5), 2.0)  # (ln2 - 1/2 + 1 - ln2) / 2
    assert "clip_frac_high" in metrics  # the loss's own metrics are still there
    # without the KL term the same batch gives the clip loss alone: -1, gradient -1/2 per token
    logp.grad = None
    plain_t, keep, plain_metrics = token_losses(_grpo_kl(), batch)
    aggregate(alg.aggregation.entry, alg.aggregation.params, plain_t, keep).backward()
    torch.testing.assert_close(logp.grad, torch.full((1, 2), -0.5, dtype=F64))
    assert "kl_mean" not in plain_metrics


def test_kl_in_the_reward_lowers_the_return_of_the_response_that_drifted_by_hand():
    """PPO-RLHF's penalty through Dr.GRPO advantages: response 0 (R = 1, two tokens, d = +-ln 2)
    loses beta x sum k2 = 1 x ln2^2 of reward, response 1 (R = 0, d = 0) nothing; A = R' - mean:
    +-(1 - ln2^2) / 2 instead of +-1/2."""
    from dapo_core.algorithm import choose, reward_kl, token_advantages

    old = torch.cat([LOGP, torch.tensor([[math.log(0.5), 0.0]], dtype=F64)]).float()
    ref = torch.cat([REF, torch.tensor([[math.log(0.5), -7.0]], dtype=F64)]).float()
    lengths = torch.tensor([[2, 1]])
    penalty, metrics = reward_kl(KLParams(estimator="k2", beta=1.0), old, ref, lengths)
    half = LN2**2 / 2
    torch.testing.assert_close(penalty, torch.tensor([[-half, -half], [0.0, 0.0]]))
    assert metrics["kl_mean"][0].item() == pytest.approx(2 * half)  # the padding's -7 unread
    dr = choose("advantage", "dr_grpo", {})
    adv, _ = token_advantages(dr, torch.tensor([[1.0, 0.0]]), lengths, penalty)
    a = (1 - LN2**2) / 2
    torch.testing.assert_close(adv, torch.tensor([[a, a], [-a, 0.0]]))
