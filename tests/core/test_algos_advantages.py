"""Advantage estimators (dapo_core.algos.advantages): by hand, and the identities between them."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_core.algos import ADVANTAGES, AdvantageInput, Advantages, reduce_metrics
from dapo_core.algos.advantages import discounted_returns, whiten
from dapo_core.config import ConfigError

F64 = torch.float64

# One prompt, G = 4: rewards [1, -1, -1, -1]; response lengths 2, 1, 3, 0 (the last one
# overlong-filtered) over T = 3.
REWARDS = torch.tensor([[1.0, -1.0, -1.0, -1.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]]).bool()


def _run(name, inp, **params):
    out, metrics = ADVANTAGES.get(name).fn(inp, ADVANTAGES.make_params(name, params))
    assert isinstance(out, Advantages)
    return out, reduce_metrics([metrics])


def _spread(per_seq):
    """(N,) per-sequence values over MASK's valid tokens."""
    return torch.where(MASK, torch.tensor(per_seq)[:, None], 0.0)


def test_grpo_by_hand():
    # mean -0.5; unbiased std = sqrt((1.5^2 + 3 x 0.5^2) / 3) = sqrt(3 / 3) = 1
    out, m = _run("grpo", AdvantageInput(REWARDS, MASK))
    want = _spread([1.5, -0.5, -0.5, -0.5]) / (1 + 1e-6)
    torch.testing.assert_close(out.advantages, want)
    torch.testing.assert_close(out.returns, _spread([1.0, -1.0, -1.0, -1.0]))
    # token-weighted mean over the 6 valid tokens: (2 x 1.5 - 0.5 - 3 x 0.5) / 6 = 1 / 6
    assert m["adv_mean"].item() == pytest.approx(1 / 6 / (1 + 1e-6))


def test_grpo_constant_group_is_exactly_zero():
    out, _ = _run("grpo", AdvantageInput(torch.full((1, 4), 0.3), MASK))
    assert torch.equal(out.advantages, torch.zeros(4, 3))


def test_dr_grpo_by_hand():
    out, _ = _run("dr_grpo", AdvantageInput(REWARDS, MASK))  # R - mean(R), mean -0.5
    torch.testing.assert_close(out.advantages, _spread([1.5, -0.5, -0.5, -0.5]))


def test_rloo_by_hand():
    # R_0 - mean(-1, -1, -1) = 2; R_1 - mean(1, -1, -1) = -1 + 1/3 = -2/3
    out, _ = _run("rloo", AdvantageInput(REWARDS, MASK))
    torch.testing.assert_close(out.advantages, _spread([2.0, -2 / 3, -2 / 3, -2 / 3]))


@pytest.mark.parametrize("name", ["grpo", "rloo"])
def test_group_estimators_need_two_responses(name):
    with pytest.raises(ValueError, match="G >= 2"):
        _run(name, AdvantageInput(torch.ones(3, 1), torch.ones(3, 2).bool()))


def _random_input(p, g, t, seed, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    # rewards on a coarse grid, so that constant groups and ties occur
    rewards = torch.randint(-2, 3, (p, g), generator=gen).to(dtype) / 2
    mask = torch.rand(p * g, t, generator=gen) > 0.3
    return AdvantageInput(rewards, mask)


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 4), g=st.integers(2, 6), t=st.integers(1, 6), seed=st.integers(0, 9999))
def test_grpo_gives_every_valid_token_its_responses_advantage(p, g, t, seed):
    """Sequence-level: the (P, G) advantages of one-token responses, spread over each response's
    valid tokens (tests/core/test_advantages.py checks those advantages themselves)."""
    inp = _random_input(p, g, t, seed)
    out, _ = _run("grpo", inp)
    one_token = AdvantageInput(inp.rewards, torch.ones(p * g, 1, dtype=torch.bool))
    per_response, _ = _run("grpo", one_token)
    assert torch.equal(out.advantages, torch.where(inp.mask, per_response.advantages, 0.0))


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 4), g=st.integers(2, 6), t=st.integers(1, 6), seed=st.integers(0, 9999))
def test_rloo_is_dr_grpo_times_g_over_g_minus_1(p, g, t, seed):
    inp = _random_input(p, g, t, seed, F64)
    rloo, _ = _run("rloo", inp)
    dr, _ = _run("dr_grpo", inp)
    torch.testing.assert_close(rloo.advantages, dr.advantages * g / (g - 1))


# Per-token estimators: one prompt, G = 2; row 0 has 2 valid tokens, row 1 has 3.
R2 = torch.tensor([[1.0, -1.0]], dtype=F64)
M2 = torch.tensor([[1, 1, 0], [1, 1, 1]]).bool()


def test_reinforce_pp_by_hand():
    # gamma 0.5. Row 0: r = [0, 1, -] -> G = [0.5, 1]; row 1: r = [0, 0, -1] ->
    # G = [-0.25, -0.5, -1]. Over the 5 valid tokens: mean = -0.25 / 5 = -0.05, centred
    # [0.55, 1.05, -0.2, -0.45, -0.95], sum of squares 2.55, unbiased var 2.55 / 4 = 0.6375.
    out, _ = _run("reinforce_pp", AdvantageInput(R2, M2), gamma=0.5)
    returns = torch.tensor([[0.5, 1.0, 0.0], [-0.25, -0.5, -1.0]], dtype=F64)
    torch.testing.assert_close(out.returns, returns)
    centred = torch.tensor([[0.55, 1.05, 0.0], [-0.2, -0.45, -0.95]], dtype=F64)
    torch.testing.assert_close(out.advantages, centred / math.sqrt(0.6375 + 1e-8))


def test_reinforce_pp_baseline_subtracts_the_group_mean_first():
    # rewards [2, 0]: group mean 1, so R - mean = [1, -1]: the numbers of the test above.
    base, _ = _run("reinforce_pp_baseline", AdvantageInput(R2 + 1, M2), gamma=0.5)
    plain, _ = _run("reinforce_pp", AdvantageInput(R2, M2), gamma=0.5)
    torch.testing.assert_close(base.advantages, plain.advantages)
    torch.testing.assert_close(base.returns, plain.returns)
    # without the baseline, rewards [2, 0] give other returns: [1, 2] on row 0, zeros on row 1
    shifted, _ = _run("reinforce_pp", AdvantageInput(R2 + 1, M2), gamma=0.5)
    torch.testing.assert_close(shifted.returns[0, :2], torch.tensor([1.0, 2.0], dtype=F64))


def test_discounted_returns_fast_path_matches_the_loop():
    r = torch.tensor([[0.0, 2.0, 0.0, 1.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 0, 1]]).bool()  # a hole: the carry passes through it
    # gamma 1: [3, 3, -, 1]; gamma 0.5 (next valid token, skipping the hole): [1.25, 2.5, -, 1]
    torch.testing.assert_close(
        discounted_returns(r, mask, 1.0), torch.tensor([[3.0, 3.0, 0.0, 1.0]], dtype=F64)
    )
    torch.testing.assert_close(
        discounted_returns(r, mask, 0.5), torch.tensor([[1.25, 2.5, 0.0, 1.0]], dtype=F64)
    )
    near_one = discounted_returns(r, mask, 1.0 - 1e-12)  # the loop, at gamma ~ 1
    torch.testing.assert_close(near_one, discounted_returns(r, mask, 1.0))


def test_whiten_by_hand():
    x = torch.tensor([[1.0, 3.0, 100.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 0]]).bool()
    # mean 2, unbiased var ((-1)^2 + 1^2) / 1 = 2
    want = torch.tensor([[-1.0, 1.0, 0.0]], dtype=F64) / math.sqrt(2 + 1e-8)
    torch.testing.assert_close(whiten(x, mask), want)
    one = torch.tensor([[1, 0, 0]]).bool()
    assert torch.equal(whiten(x, one), torch.zeros(1, 3, dtype=F64))  # x - mean, no NaN


def _gae_input(values, mask=M2):
    return AdvantageInput(R2, mask, values=torch.tensor(values, dtype=F64))


def test_gae_by_hand():
    # gamma 0.9, lam 0.5, no whitening.
    # Row 0: r = [0, 1], V = [0.5, 0.8] (9 is padding):
    #   t=1: delta = 1 + 0.9 x 0 - 0.8 = 0.2, A = 0.2
    #   t=0: delta = 0 + 0.9 x 0.8 - 0.5 = 0.22, A = 0.22 + 0.45 x 0.2 = 0.31
    #   returns = A + V = [0.81, 1.0]
    # Row 1: r = [0, 0, -1], V = 0: A = [-1 x 0.45^2, -0.45, -1] = [-0.2025, -0.45, -1]
    inp = _gae_input([[0.5, 0.8, 9.0], [0.0, 0.0, 0.0]])
    out, m = _run("gae", inp, gamma=0.9, lam=0.5, whiten=False)
    adv = torch.tensor([[0.31, 0.2, 0.0], [-0.2025, -0.45, -1.0]], dtype=F64)
    torch.testing.assert_close(out.advantages, adv)
    torch.testing.assert_close(out.returns, torch.tensor([[0.81, 1.0, 0], [*adv[1]]], dtype=F64))
    assert m["value_mean"].item() == pytest.approx(1.3 / 5)
    # whitened: the same advantages, standardised over the 5 valid tokens; returns unchanged
    white, _ = _run("gae", inp, gamma=0.9, lam=0.5, whiten=True)
    torch.testing.assert_close(white.advantages, whiten(adv, M2))
    torch.testing.assert_close(white.returns, out.returns)


def test_gae_skips_a_hole_as_if_the_token_were_absent():
    # Row 0 with a hole at t=1: valid tokens 0 and 2 with V = [0.5, 0.8], R on t=2: the
    # numbers of row 0 above, at positions 0 and 2.
    mask = torch.tensor([[1, 0, 1], [1, 1, 1]]).bool()
    inp = _gae_input([[0.5, 7.0, 0.8], [0.0, 0.0, 0.0]], mask)
    out, _ = _run("gae", inp, gamma=0.9, lam=0.5, whiten=False)
    torch.testing.assert_close(out.advantages[0], torch.tensor([0.31, 0.0, 0.2], dtype=F64))


@settings(max_examples=40, deadline=None)
@given(p=st.integers(1, 3), g=st.integers(1, 4), t=st.integers(1, 6), seed=st.integers(0, 9999))
def test_gae_with_unit_discounts_and_no_critic_is_the_return(p, g, t, seed):
    """gamma = lam = 1, V = 0, no whitening: A_t = R on every valid token of the response."""
    inp = _random_input(p, g, t, seed, F64)
    inp = AdvantageInput(inp.rewards, inp.mask, values=torch.zeros(p * g, t, dtype=F64))
    out, _ = _run("gae", inp, whiten=False)
    want = torch.where(inp.mask, inp.rewards.reshape(-1, 1), 0.0)
    torch.testing.assert_close(out.advantages, want)
    torch.testing.assert_close(out.returns, want)


def test_gae_needs_values():
    with pytest.raises(ConfigError, match="algo.advantage gae: needs critic values"):
        _run("gae", AdvantageInput(R2, M2))


def test_token_rewards_add_to_the_sequence_reward():
    # Row 0: R = 1 plus per-token rewards [-0.5, -0.5] (9 is padding): 0, like row 1's 0 + 0.
    tok = torch.tensor([[-0.5, -0.5, 9.0], [0.0, 0.0, 0.0]], dtype=F64)
    inp = AdvantageInput(torch.tensor([[1.0, 0.0]], dtype=F64), M2, token_rewards=tok)
    out, _ = _run("grpo", inp)
    assert torch.equal(out.advantages, torch.zeros(2, 3, dtype=F64))  # a constant group
    # per token, gamma 1: row 0 r = [-0.5, -0.5 + 1] -> G = [0, 0.5]
    out, _ = _run("reinforce_pp", inp)
    torch.testing.assert_close(out.returns[0], torch.tensor([0.0, 0.5, 0.0], dtype=F64))
    # gae with V = 0 and unit discounts: the same returns, counted once
    inp = AdvantageInput(inp.rewards, M2, values=torch.zeros(2, 3, dtype=F64), token_rewards=tok)
    out, _ = _run("gae", inp, whiten=False)
    torch.testing.assert_close(out.advantages[0], torch.tensor([0.0, 0.5, 0.0], dtype=F64))


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_pp", "gae"])
def test_every_estimator_returns_zero_off_the_mask(name):
    inp = _random_input(2, 3, 5, seed=1, dtype=F64)
    inp = AdvantageInput(inp.rewards, inp.mask, values=torch.randn(6, 5, dtype=F64))
    out, _ = _run(name, inp)
    assert out.advantages.shape == out.returns.shape == (6, 5)
    assert (out.advantages[~inp.mask] == 0).all() and (out.returns[~inp.mask] == 0).all()
    assert (out.advantages[inp.mask] != 0).any()


def test_input_shapes_are_checked():
    with pytest.raises(ValueError, match="mask must be"):
        AdvantageInput(torch.zeros(2, 3), torch.ones(5, 4))
    with pytest.raises(ValueError, match="values must have shape"):
        AdvantageInput(torch.zeros(2, 3), torch.ones(6, 4), values=torch.zeros(6, 5))
    assert AdvantageInput(torch.zeros(1, 2), torch.ones(2, 3)).mask.dtype == torch.bool
