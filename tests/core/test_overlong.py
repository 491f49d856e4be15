import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_core.overlong import overlong_filter_mask, overlong_penalty, shaped_rewards


def test_eq13_hand_computed_paper_values():
    # L_max = 20480, L_cache = 4096 -> expected length 16384
    lengths = torch.tensor([100, 16384, 16385, 18432, 20480, 20481])
    got = overlong_penalty(lengths, max_len=20480, cache_len=4096)
    want = torch.tensor([0.0, 0.0, -1 / 4096, -0.5, -1.0, -1.0])
    torch.testing.assert_close(got, want)


def test_factor_scales():
    got = overlong_penalty(torch.tensor([18432]), 20480, 4096, factor=0.5)
    torch.testing.assert_close(got, torch.tensor([-0.25]))


def test_zero_buffer_is_a_step():
    got = overlong_penalty(torch.tensor([9, 10, 11]), max_len=10, cache_len=0)
    torch.testing.assert_close(got, torch.tensor([0.0, 0.0, -1.0]))


@settings(max_examples=200, deadline=None)
@given(max_len=st.integers(2, 5000), frac=st.floats(0.01, 0.99), length=st.integers(0, 6000))
def test_penalty_continuous_monotone_bounded(max_len, frac, length):
    cache = max(1, int(max_len * frac))
    if cache >= max_len:
        cache = max_len - 1
    p = overlong_penalty(torch.tensor([length, length + 1]), max_len, cache)
    assert -1.0 <= p[1] <= p[0] <= 0.0  # bounded and non-increasing in length
    if length + 1 <= max_len:  # continuous: one extra token moves it by at most 1 / cache
        assert p[0] - p[1] <= 1.0 / cache + 1e-6


def test_shaped_rewards_switch():
    acc = torch.tensor([True, False, True])
    lengths = torch.tensor([5, 5, 10])
    off = shaped_rewards(acc, lengths, overlong_shaping=False, max_len=10, cache_len=4, factor=1.0)
    on = shaped_rewards(acc, lengths, overlong_shaping=True, max_len=10, cache_len=4, factor=1.0)
    torch.testing.assert_close(off, torch.tensor([1.0, -1.0, 1.0]))
    torch.testing.assert_close(on, torch.tensor([1.0, -1.0, 0.0]))


def test_overlong_filter_mask_switch():
    mask = torch.ones(3, 4)
    truncated = torch.tensor([False, True, False])
    on = overlong_filter_mask(mask, truncated, overlong_filtering=True)
    assert on.sum(dim=1).tolist() == [4, 0, 4]
    off = overlong_filter_mask(mask, truncated, overlong_filtering=False)
    assert torch.equal(off, mask)


def test_a_learned_reward_replaces_the_rule_and_keeps_the_length_penalty():
    acc = torch.tensor([True, False, True])
    lengths = torch.tensor([5, 5, 9])  # max 10, buffer 4: lengths 7..10 pay up to -1
    learned = torch.tensor([0.3, -2.0, 1.5])
    kw = dict(max_len=10, cache_len=4, factor=1.0)
    off = shaped_rewards(acc, lengths, overlong_shaping=False, learned=learned, **kw)
    assert torch.equal(off, learned)  # the rule's +1/-1 play no part
    on = shaped_rewards(acc, lengths, overlong_shaping=True, learned=learned, **kw)
    # Eq. 13 at |y| = 9: (10 - 4 - 9) / 4 = -0.75
    assert torch.allclose(on, torch.tensor([0.3, -2.0, 0.75]))
