import pytest
import torch

from dapo_core.sampling import GenerationCapReached, GroupAccumulator, fill_batch, keep_groups


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
