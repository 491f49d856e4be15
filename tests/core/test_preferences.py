"""Pair mining, the Bradley-Terry loss and the DPO loss (dapo_core.preferences), by hand."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_core.preferences import (
    Pair,
    bradley_terry_loss,
    calibration_curve,
    dpo_loss,
    mine_pairs,
    sequence_logp,
)


def test_pairs_take_the_best_over_the_worst_and_skip_equal_groups():
    rewards = torch.tensor(
        [
            [1.0, -1.0, -1.0, 1.0],  # mixed
            [1.0, 1.0, 1.0, 1.0],  # all right: nothing to prefer
            [-1.0, -1.0, -1.0, -1.0],  # all wrong
            [-1.0, 0.5, -0.2, -1.0],  # shaped rewards: 0.5 over -1.0 only
        ]
    )
    pairs = mine_pairs(rewards, per_group=1, seed=0)
    assert [p.group for p in pairs] == [0, 3]
    assert pairs[0].chosen in (0, 3) and pairs[0].rejected in (1, 2)
    assert pairs[1] in (Pair(3, 1, 0), Pair(3, 1, 3))
    every = mine_pairs(rewards, per_group=100)
    assert sorted((p.chosen, p.rejected) for p in every if p.group == 0) == [
        (0, 1),
        (0, 2),
        (3, 1),
        (3, 2),
    ]
    assert mine_pairs(rewards, per_group=2, seed=1) == mine_pairs(rewards, per_group=2, seed=1)


REWARDS = st.sampled_from([-1.0, -0.5, 0.0, 1.0])  # the rule's, and shaped ones


@settings(max_examples=200, deadline=None)
@given(
    st.integers(2, 6).flatmap(
        lambda g: st.lists(st.lists(REWARDS, min_size=g, max_size=g), min_size=1, max_size=5)
    ),
    st.integers(1, 4),
    st.integers(0, 10),
)
def test_a_pair_never_joins_equal_rewards_and_prefers_the_higher(rows, per_group, seed):
    rewards = torch.tensor(rows)
    pairs = mine_pairs(rewards, per_group, seed)
    for p in pairs:
        assert rewards[p.group, p.chosen] > rewards[p.group, p.rejected]
    per = [sum(p.group == g for p in pairs) for g in range(len(rows))]
    for g, row in enumerate(rows):
        assert per[g] == (0 if len(set(row)) == 1 else min(per_group, _n_extreme_pairs(row)))
    assert len(set(pairs)) == len(pairs)  # distinct


def _n_extreme_pairs(row):
    return row.count(max(row)) * row.count(min(row))


def test_mining_refuses_a_wrong_shape_or_count():
    with pytest.raises(ValueError, match="must be \\(groups, group_size\\)"):
        mine_pairs(torch.zeros(4))
    with pytest.raises(ValueError, match="per_group must be >= 1"):
        mine_pairs(torch.zeros(1, 2), per_group=0)


def test_sequence_logp_sums_the_response_tokens():
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    assert sequence_logp(logp, mask).tolist() == [-6.0, -1.0]


def test_bradley_terry_value_and_gradient_by_hand():
    r_c = torch.tensor([2.0, 0.0, -1.0], requires_grad=True)
    r_r = torch.tensor([1.0, 0.0, 1.0], requires_grad=True)
    loss, m = bradley_terry_loss(r_c, r_r)
    # margins 1, 0, -2: -log sigmoid(m) = log(1 + e^-m)
    expected = (math.log1p(math.exp(-1)) + math.log(2) + math.log1p(math.exp(2))) / 3
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    loss.backward()
    # dL/dm_i = -sigmoid(-m_i) / n; r+ gets it, r- its negative
    grads = [-1 / (1 + math.exp(m)) / 3 for m in (1.0, 0.0, -2.0)]
    assert r_c.grad.tolist() == pytest.approx(grads, rel=1e-6)
    assert r_r.grad.tolist() == pytest.approx([-g for g in grads], rel=1e-6)
    assert (m["pair_accuracy"][0] / m["pair_accuracy"][1]).item() == pytest.approx(1 / 3)  # tie
    assert (m["reward_margin"][0] / m["reward_margin"][1]).item() == pytest.approx(-1 / 3)


def test_dpo_at_the_reference_is_log_2_with_the_gradient_beta_over_2():
    logp = torch.tensor([-5.0, -7.0], requires_grad=True)  # chosen, rejected of one pair
    ref = torch.tensor([-5.0, -7.0])
    loss, m = dpo_loss(logp[:1], logp[1:], ref[:1], ref[1:], beta=0.1)
    assert loss.item() == pytest.approx(math.log(2))
    loss.backward()
    assert logp.grad.tolist() == pytest.approx([-0.05, 0.05])  # -/+ beta * sigmoid(0)
    assert m["pair_accuracy"][0].item() == 0.0  # h = 0 is not a win


def test_dpo_value_and_gradient_by_hand():
    beta = 0.5
    lc = torch.tensor([-3.0, -4.0], requires_grad=True)
    lr = torch.tensor([-6.0, -2.0], requires_grad=True)
    rc, rr = torch.tensor([-4.0, -4.0]), torch.tensor([-5.0, -3.0])
    loss, m = dpo_loss(lc, lr, rc, rr, beta)
    # pair 1: h = 0.5 * ((-3 + 4) - (-6 + 5)) = 1; pair 2: h = 0.5 * (0 - 1) = -0.5
    hs = [1.0, -0.5]
    assert loss.item() == pytest.approx(sum(math.log1p(math.exp(-h)) for h in hs) / 2, rel=1e-6)
    loss.backward()
    g = [-beta / (1 + math.exp(h)) / 2 for h in hs]
    assert lc.grad.tolist() == pytest.approx(g, rel=1e-6)
    assert lr.grad.tolist() == pytest.approx([-x for x in g], rel=1e-6)
    assert m["pair_accuracy"][0].item() == 1.0 and m["pair_accuracy"][1].item() == 2.0
    assert m["reward_chosen"][0].item() == pytest.approx(0.5 * (1.0 + 0.0))
    with pytest.raises(ValueError, match="beta must be > 0"):
        dpo_loss(lc, lr, rc, rr, 0.0)


@settings(max_examples=100, deadline=None)
@given(st.floats(-20, 20), st.floats(0.01, 2.0))
def test_dpo_is_bradley_terry_on_the_implicit_rewards(delta, beta):
    """DPO's loss is Bradley-Terry's with r = beta * (log pi - log pi_ref) (section 4)."""
    lc, lr = torch.tensor([delta]), torch.tensor([0.0])
    ref = torch.tensor([0.0])
    dpo, _ = dpo_loss(lc, lr, ref, ref, beta)
    bt, _ = bradley_terry_loss(beta * lc, beta * lr)
    assert dpo.item() == pytest.approx(bt.item(), rel=1e-6, abs=1e-9)


def test_calibration_reads_each_pair_in_both_orders_by_hand():
    # margins 0 and ln 4: sigmoid = 0.5 and 0.8 (and 0.5, 0.2 the other way round)
    bins, ece = calibration_curve(torch.tensor([0.0, math.log(4.0)]), bins=4)
    got = {(b.lo, b.hi): (round(b.predicted, 6), b.observed, b.count) for b in bins}
    assert got == {
        (0.0, 0.25): (0.2, 0.0, 1),  # sigmoid(-ln 4), outcome 0
        (0.5, 0.75): (0.5, 0.5, 2),  # margin 0 read both ways: outcomes 1 and 0
        (0.75, 1.0): (0.8, 1.0, 1),
    }
    # |0.2 - 0| + 2 * |0.5 - 0.5| + |0.8 - 1|, over 4 predictions
    assert ece == pytest.approx(0.1)


def test_calibration_is_symmetric_and_counts_every_prediction():
    g = torch.Generator().manual_seed(0)
    margins = torch.randn(50, generator=g) * 3
    bins, ece = calibration_curve(margins, bins=10)
    assert sum(b.count for b in bins) == 100
    by_lo = {round(b.lo, 1): b for b in bins}
    for b in bins:  # the bin mirrored around 0.5 holds the same predictions, outcomes flipped
        twin = by_lo[round(1 - b.hi, 1)]
        assert twin.count == b.count
        assert twin.observed == pytest.approx(1 - b.observed)
    assert 0 <= ece <= 1
