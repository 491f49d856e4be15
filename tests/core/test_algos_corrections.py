"""Rollout corrections (dapo_core.algos.corrections): weights, kept tokens and metrics by hand."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_core.algos import CORRECTIONS, TokenBatch, reduce_metrics
from dapo_core.config import ConfigError
from dapo_core.mismatch import tis_weights

F64 = torch.float64

# pi_old / pi_rollout per token (padding holds garbage: -inf and a huge log-prob):
#   row 0: 0.5/0.4 = 1.25, 0.2/0.25 = 0.8, 0.9/0.1 = 9, padding
#   row 1: 0.5/0.4 = 1.25, 0.5/0.5 = 1, padding x 2
#   row 2: 0.01/0.1 = 0.1, 0.1/0.15 = 2/3, padding x 2
OLD = torch.log(torch.tensor([[0.5, 0.2, 0.9, 0.3], [0.5, 0.5, 0.3, 0.3], [0.01, 0.1, 0.3, 0.3]]))
ROLLOUT = torch.log(torch.tensor([[0.4, 0.25, 0.1, 0], [0.4, 0.5, 1e30, 0], [0.1, 0.15, 0, 0]]))
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 0, 0]]).bool()


def _run(name, **params):
    batch = TokenBatch(OLD.to(F64), OLD.to(F64), torch.ones(3, 4), MASK, rollout_logp=ROLLOUT)
    entry = CORRECTIONS.get(name)
    weights, keep, metrics = entry.fn(batch, CORRECTIONS.make_params(name, params))
    assert keep.dtype == torch.bool and not (keep & ~MASK).any()
    assert torch.isfinite(weights).all() and not weights.requires_grad
    return weights, keep, reduce_metrics([metrics])


def test_token_tis_by_hand():
    # cap 2: 9 -> 2; 1 on padding; every valid token kept
    w, keep, m = _run("token_tis", cap=2.0)
    want = torch.tensor([[1.25, 0.8, 2, 1], [1.25, 1, 1, 1], [0.1, 2 / 3, 1, 1]], dtype=F64)
    torch.testing.assert_close(w, want)
    assert torch.equal(keep, MASK)
    assert m["is_capped_frac"].item() == pytest.approx(1 / 7)
    assert m["is_weight_mean"].item() == pytest.approx(
        (1.25 + 0.8 + 2 + 1.25 + 1 + 0.1 + 2 / 3) / 7
    )
    assert m["is_dropped_token_frac"].item() == 0.0


@settings(max_examples=40, deadline=None)
@given(b=st.integers(1, 4), t=st.integers(1, 6), seed=st.integers(0, 9999), cap=st.floats(1, 5))
def test_token_tis_equals_todays_tis_weights(b, t, seed, cap):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g, dtype=F64) * 4
    rollout = old + torch.randn(b, t, generator=g, dtype=F64)
    mask = torch.rand(b, t, generator=g) > 0.3
    batch = TokenBatch(old, old, torch.ones(b, t), mask, rollout_logp=rollout)
    w, _, _ = CORRECTIONS.get("token_tis").fn(
        batch, CORRECTIONS.make_params("token_tis", {"cap": cap})
    )
    torch.testing.assert_close(w, tis_weights(old, rollout, mask, cap))


def test_seq_tis_by_hand():
    # products: row 0 1.25 x 0.8 x 9 = 9 -> capped at 2; row 1 1.25; row 2 0.1 x 2/3 = 1/15
    w, keep, m = _run("seq_tis", cap=2.0)
    want = torch.tensor([[2, 2, 2, 1], [1.25, 1.25, 1, 1], [1 / 15, 1 / 15, 1, 1]], dtype=F64)
    torch.testing.assert_close(w, want)
    assert torch.equal(keep, MASK)
    assert m["is_capped_frac"].item() == pytest.approx(1 / 3)  # a share of sequences


def test_token_mask_by_hand():
    # [0.5, 5]: drops 9 (row 0) and 0.1 (row 2); weights 1
    w, keep, m = _run("token_mask")
    assert torch.equal(w, torch.ones(3, 4, dtype=F64))
    want = torch.tensor([[1, 1, 0, 0], [1, 1, 0, 0], [0, 1, 0, 0]]).bool()
    assert torch.equal(keep, want)
    assert m["is_dropped_token_frac"].item() == pytest.approx(2 / 7)
    assert m["is_dropped_seq_frac"].item() == 0.0  # every row keeps a token


def test_seq_mask_by_hand():
    # geometric means: row 0 9^(1/3) = 2.08, row 1 sqrt(1.25) = 1.12 (kept);
    # row 2 sqrt(1/15) = 0.258 < 0.5 (dropped, with its 2 tokens)
    w, keep, m = _run("seq_mask")
    assert torch.equal(w, torch.ones(3, 4, dtype=F64))
    assert torch.equal(keep, MASK & torch.tensor([[True], [True], [False]]))
    assert m["is_dropped_seq_frac"].item() == pytest.approx(1 / 3)
    assert m["is_dropped_token_frac"].item() == pytest.approx(2 / 7)
    # a tighter upper bound now drops row 0 too (2.08 > 2), so 1.12 alone survives
    _, keep, _ = _run("seq_mask", hi=2.0)
    assert keep.any(dim=1).tolist() == [False, True, False]


def test_seq_mask_uses_the_geometric_mean_not_the_product():
    # row 0's product is 9 (> 5) but its per-token scale 2.08 is inside [0.5, 5]
    _, keep, _ = _run("seq_mask")
    assert keep[0].any() and math.prod([1.25, 0.8, 9]) > 5


@pytest.mark.parametrize("name", ["token_tis", "seq_tis", "token_mask", "seq_mask"])
def test_needs_rollout_logp(name):
    batch = TokenBatch(OLD, OLD, torch.ones(3, 4), MASK)
    with pytest.raises(ConfigError, match=f"algo.correction {name}: needs the sampler"):
        CORRECTIONS.get(name).fn(batch, CORRECTIONS.make_params(name, {}))
