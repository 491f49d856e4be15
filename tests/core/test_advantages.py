"""DAPO Eq. 9 (``ADVANTAGES["grpo"]``): a hand-computed group, constant groups, and the
standardisation's properties over random groups."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_core.algos import ADVANTAGES, AdvantageInput


def group_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """(P, G) rewards -> (P, G) advantages: ``grpo`` on one-token responses."""
    inp = AdvantageInput(rewards, torch.ones(rewards.numel(), 1, dtype=torch.bool))
    out, _ = ADVANTAGES.get("grpo").fn(inp, ADVANTAGES.make_params("grpo", {}))
    return out.advantages.reshape(rewards.shape)


def test_hand_computed_group():
    # rewards [1, -1, -1, -1]: mean -0.5, unbiased std = sqrt((2.25 + 3 * 0.25) / 3) = 1
    adv = group_advantages(torch.tensor([[1.0, -1.0, -1.0, -1.0]]))
    expected = torch.tensor([[1.5, -0.5, -0.5, -0.5]]) / (1.0 + 1e-6)
    torch.testing.assert_close(adv, expected)


def test_constant_groups_give_exact_zero():
    adv = group_advantages(torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0], [0.3, 0.3, 0.3]]))
    assert torch.equal(adv, torch.zeros(3, 3))


def test_a_group_of_one_is_refused():
    with pytest.raises(ValueError, match="G >= 2"):
        group_advantages(torch.zeros(3, 1))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.floats(-5, 5), min_size=4, max_size=4), min_size=1, max_size=6))
def test_zero_mean_unit_std_per_group(rows):
    r = torch.tensor(rows, dtype=torch.float32)
    adv = group_advantages(r)
    assert torch.allclose(adv.mean(dim=1), torch.zeros(len(rows)), atol=1e-4)
    std = r.std(dim=1)
    for i in range(len(rows)):
        if std[i] > 1e-2:
            assert math.isclose(adv[i].std().item(), 1.0, rel_tol=1e-3)
        # ordering within a group is preserved (weakly: float32 may merge near-ties)
        for j in range(4):
            for k in range(4):
                if r[i, j] < r[i, k]:
                    assert adv[i, j] <= adv[i, k]
