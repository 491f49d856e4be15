import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dapo_core.sampling import (
    GenerationCapReached,
    GroupAccumulator,
    fill_batch,
    keep_groups,
    sized_gen_batch,
)


def test_keep_groups_on_raw_accuracy():
    acc = torch.tensor([[1, 1, 1], [0, 0, 0], [1, 0, 0], [0, 1, 1]], dtype=torch.bool)
    assert keep_groups(acc).tolist() == [False, False, True, True]


class FakeGenerator:
    """Yields groups named by a counter; group i is 'mixed' when mixed(i)."""

    def __init__(self, mixed):
        self.mixed = mixed
        self.next = 0
        self.calls = []

    def __call__(self, n):
        self.calls.append(n)
        ids = list(range(self.next, self.next + n))
        self.next += n
        acc = torch.tensor([[True, False] if self.mixed(i) else [True, True] for i in ids])
        return ids, acc


def test_dynamic_sampling_fills_batch_and_carries_surplus():
    gen = FakeGenerator(lambda i: i % 2 == 0)  # half the groups are mixed
    buf = GroupAccumulator()
    batch, stats = fill_batch(
        gen,
        buf,
        step=1,
        prompt_batch=4,
        gen_batch=6,
        max_gen_batches=5,
        on_gen_cap="error",
        dynamic_sampling=True,
    )
    # gen batch 1 keeps 0,2,4 (3 < 4) -> gen batch 2 keeps 6,8,10 -> 6 kept; take 4, carry 2
    assert batch == [0, 2, 4, 6]
    assert stats.num_gen_batches == 2 and stats.groups_generated == 12 and stats.groups_kept == 6
    assert (
        stats.carried_over == 2 and stats.kept_group_frac == 0.5 and stats.samples_per_kept == 2.0
    )
    # next step starts from the carried groups, which are one step old
    batch2, stats2 = fill_batch(
        gen,
        buf,
        step=2,
        prompt_batch=4,
        gen_batch=6,
        max_gen_batches=5,
        on_gen_cap="error",
        dynamic_sampling=True,
    )
    assert batch2 == [8, 10, 12, 14]
    assert stats2.num_gen_batches == 1 and stats2.mean_age == 0.5  # ages [1, 1, 0, 0]


def test_always_generates_and_caps_the_carry():
    gen = FakeGenerator(lambda i: True)  # every group kept: surplus would pile up
    buf = GroupAccumulator()
    kwargs = dict(
        prompt_batch=2, gen_batch=5, max_gen_batches=3, on_gen_cap="error", dynamic_sampling=True
    )
    batch, stats = fill_batch(gen, buf, step=0, **kwargs)
    # 0..4 kept; 0, 1 trained; of the surplus 2, 3, 4 the first (oldest-first order) is dropped
    assert batch == [0, 1] and stats.carried_over == 2 and stats.dropped == 1
    batch, stats = fill_batch(gen, buf, step=1, **kwargs)
    assert gen.calls == [5, 5]  # fresh rollouts even though the buffer could fill the batch
    assert batch == [3, 4] and stats.mean_age == 1.0  # the carried groups go first
    assert stats.carried_over == 2 and stats.dropped == 3


def test_cap_error_explains():
    gen = FakeGenerator(lambda i: i == 0)
    with pytest.raises(GenerationCapReached, match="max_gen_batches"):
        fill_batch(
            gen,
            GroupAccumulator(),
            step=0,
            prompt_batch=4,
            gen_batch=2,
            max_gen_batches=3,
            on_gen_cap="error",
            dynamic_sampling=True,
        )
    assert gen.calls == [2, 2, 2]


def test_cap_partial_trains_on_what_it_has():
    gen = FakeGenerator(lambda i: i in (0, 3))
    batch, stats = fill_batch(
        gen,
        GroupAccumulator(),
        step=0,
        prompt_batch=4,
        gen_batch=2,
        max_gen_batches=3,
        on_gen_cap="partial",
        dynamic_sampling=True,
    )
    assert batch == [0, 3] and stats.hit_cap and stats.groups_in_batch == 2


def test_switch_off_is_identity_one_batch_of_prompt_batch():
    gen = FakeGenerator(lambda i: False)  # nothing mixed: dynamic sampling would reject all
    batch, stats = fill_batch(
        gen,
        GroupAccumulator(),
        step=0,
        prompt_batch=4,
        gen_batch=8,
        max_gen_batches=3,
        on_gen_cap="error",
        dynamic_sampling=False,
    )
    assert batch == [0, 1, 2, 3] and gen.calls == [4] and stats.kept_group_frac == 1.0


def test_accumulator_state_roundtrip():
    buf = GroupAccumulator()
    buf.add(["a", "b"], step=3)
    clone = GroupAccumulator()
    clone.load_state_dict(buf.state_dict())
    assert clone.take(5, step=5) == (["a", "b"], [2, 2])
    assert len(clone) == 0 and len(buf) == 2


def test_sized_gen_batch_hand_computed():
    # 64 needed at f = 0.8: (64 + 2 * sqrt(64 * 0.2)) / 0.8 = (64 + 7.155) / 0.8 = 88.9 -> 89
    assert sized_gen_batch(64, 0.8, 200) == 89
    assert sized_gen_batch(64, 0.8, 80) == 80  # bounded by gen_batch
    assert sized_gen_batch(64, None, 96) == 96  # no estimate yet: the configured batch
    assert sized_gen_batch(64, 0.0, 96) == 96  # nothing kept lately: as many as allowed
    assert sized_gen_batch(0, 0.5, 96) == 1  # the buffer is full: one fresh prompt still
    assert sized_gen_batch(10, 1.0, 96) == 10  # every group kept: exactly what is needed


@given(st.integers(0, 500), st.floats(0.01, 1.0), st.integers(1, 1000))
def test_sized_gen_batch_bounds(needed, f, gen_batch):
    n = sized_gen_batch(needed, f, gen_batch)
    assert 1 <= n <= gen_batch
    if n < gen_batch:
        assert n * f >= needed  # the expected kept count covers the need


def test_sized_batches_follow_the_kept_fraction_and_waste_less():
    """Half the groups are kept. Fixed batches of 12 for a batch of 4 keep 6 every step; the carry
    cap (4) drops 2 of them each step. Sized batches generate about 4 / 0.5 plus a margin."""
    kwargs = dict(prompt_batch=4, gen_batch=12, max_gen_batches=4, on_gen_cap="error")
    totals = {}
    for sized in (False, True):
        gen = FakeGenerator(lambda i: i % 2 == 0)
        buf = GroupAccumulator()
        dropped = trained = 0
        for step in range(20):
            batch, stats = fill_batch(
                gen, buf, step=step, dynamic_sampling=True, sized=sized, **kwargs
            )
            dropped += stats.dropped
            trained += len(batch)
        totals[sized] = (gen.next, trained, dropped)
        if sized:
            assert gen.calls[0] == 12 and max(gen.calls[1:]) < 12  # the first batch has no estimate
            assert buf.kept_frac == pytest.approx(0.5, abs=0.05)
    assert totals[False][1] == totals[True][1] == 80  # both train full batches
    assert totals[False][2] > 0 and totals[True][2] == 0
    assert totals[True][0] < 0.75 * totals[False][0]  # generated


def test_accumulator_state_keeps_the_kept_fraction():
    buf = GroupAccumulator()
    buf.observe(3, 4)
    clone = GroupAccumulator()
    clone.load_state_dict(buf.state_dict())
    assert clone.kept_frac == 0.75
    old = {"groups": []}  # a checkpoint written before the estimate existed
    clone.load_state_dict(old)
    assert clone.kept_frac is None
