"""Aggregations (dapo_core.algos.aggregations): by hand, and invariance to micro-batching."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_core.algos import AGGREGATIONS, aggregate
from dapo_core.algos.aggregations import SumNormParams

F64 = torch.float64

# Row 0: 3 valid tokens of loss 1; row 1: 1 valid token of loss 5; row 2: overlong-filtered (all
# masked, inf where masked must not leak). Masked positions hold garbage.
LOSS = torch.tensor([[1.0, 1.0, 1.0, 9.0], [5.0, 9.0, 9.0, 9.0], [math.inf] * 4], dtype=F64)
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]]).bool()

PARAMS = {
    "token_mean": {},
    "seq_mean_token_mean": {},
    "seq_mean_token_sum_norm": {"max_len": 4},
}


def _run(name, loss=LOSS, mask=MASK):
    entry = AGGREGATIONS.get(name)
    return entry.fn(loss, mask, AGGREGATIONS.make_params(name, PARAMS[name]))


def test_numerators_and_counts_by_hand():
    # token_mean: (1 + 1 + 1 + 5) / 4 valid tokens = 2
    # seq_mean_token_mean: (3/3 + 5/1) / 2 non-empty rows = 3
    # seq_mean_token_sum_norm: (3 + 5) / (3 rows x max_len 4) = 8 / 12 (the empty row counts)
    for name, (num, count) in {
        "token_mean": (8.0, 4.0),
        "seq_mean_token_mean": (6.0, 2.0),
        "seq_mean_token_sum_norm": (8.0, 12.0),
    }.items():
        got_num, got_count = _run(name)
        assert (got_num.item(), got_count.item()) == (num, count), name
        p = AGGREGATIONS.make_params(name, PARAMS[name])
        assert aggregate(name, p, LOSS, MASK).item() == pytest.approx(num / count)
        # a global count divides instead of the batch's own
        assert aggregate(name, p, LOSS, MASK, global_count=16.0).item() == num / 16


def test_gradients_by_hand():
    # d/dl_it: token_mean 1/4 on each valid token; seq_mean_token_mean 1/(2 x 3) on row 0's
    # tokens and 1/(2 x 1) on row 1's; sum_norm 1/12 on each valid token; 0 where masked.
    m = MASK.to(F64)
    want = {
        "token_mean": m / 4,
        "seq_mean_token_mean": torch.tensor(
            [[1 / 6] * 3 + [0], [0.5, 0, 0, 0], [0] * 4], dtype=F64
        ),
        "seq_mean_token_sum_norm": m / 12,
    }
    for name, grad in want.items():
        loss = torch.where(MASK, LOSS, 0.0).requires_grad_()
        p = AGGREGATIONS.make_params(name, PARAMS[name])
        aggregate(AGGREGATIONS.get(name), p, loss, MASK).backward()
        torch.testing.assert_close(loss.grad, grad, msg=name)


def test_token_mean_and_seq_mean_weigh_long_responses_differently():
    # Eq. 12 vs GRPO: one long response of loss 1 (3 tokens), one short of loss 5 (1 token)
    p = AGGREGATIONS.make_params("token_mean", {})
    assert aggregate("token_mean", p, LOSS[:2], MASK[:2]).item() == 2.0
    assert aggregate("seq_mean_token_mean", p, LOSS[:2], MASK[:2]).item() == 3.0


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_empty_batch_gives_zero_not_nan(name):
    p = AGGREGATIONS.make_params(name, PARAMS[name])
    out = aggregate(name, p, LOSS[2:], MASK[2:])
    assert out.item() == 0.0


def test_sum_norm_needs_max_len():
    with pytest.raises(ValueError, match="missing parameter 'max_len'"):
        AGGREGATIONS.make_params("seq_mean_token_sum_norm", {})
    assert SumNormParams(max_len=7).max_len == 7


@settings(max_examples=80, deadline=None)
@given(
    name=st.sampled_from(sorted(PARAMS)),
    b=st.integers(2, 8),
    t=st.integers(1, 10),
    cuts=st.lists(st.integers(1, 7), max_size=3),
    seed=st.integers(0, 10_000),
)
def test_micro_batches_sum_to_the_full_batch(name, b, t, cuts, seed):
    """sum_k numerator_k / global_count == the full batch's value, gradients included."""
    g = torch.Generator().manual_seed(seed)
    loss = torch.randn(b, t, generator=g, dtype=F64)
    mask = torch.rand(b, t, generator=g) > 0.3
    entry = AGGREGATIONS.get(name)
    p = AGGREGATIONS.make_params(name, PARAMS[name])

    full_in = loss.clone().requires_grad_()
    full = aggregate(entry, p, full_in, mask)
    full.backward()

    bounds = [0, *sorted({c for c in cuts if c < b}), b]
    parts = [slice(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
    # the trainer's two passes: first the global count, then each micro-batch's loss
    global_count = sum(entry.fn(loss[s], mask[s], p)[1] for s in parts)
    split_in = loss.clone().requires_grad_()
    total = torch.zeros((), dtype=F64)
    for s in parts:
        part = aggregate(entry, p, split_in[s], mask[s], global_count=global_count)
        part.backward()
        total = total + part.detach()
    torch.testing.assert_close(total, full.detach())
    torch.testing.assert_close(split_in.grad, full_in.grad)


def test_per_micro_batch_mean_is_not_eq12():
    """Why the count must be global: averaging per-micro-batch token means is not Eq. 12."""
    p = AGGREGATIONS.make_params("token_mean", {})
    eq12 = aggregate("token_mean", p, LOSS[:2], MASK[:2]).item()  # (3 + 5) / 4 = 2
    local = [aggregate("token_mean", p, LOSS[i : i + 1], MASK[i : i + 1]) for i in range(2)]
    assert eq12 == 2.0 and (sum(local) / 2).item() == 3.0  # (1 + 5) / 2
