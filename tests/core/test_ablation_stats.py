"""Per-run mechanism signals, the long-response weight share and the paired bootstrap."""

import math

import numpy as np
import pytest

from dapo_core.ablation import ABLATION_LADDER
from dapo_core.ablation_stats import (
    MECHANISM_SIGNALS,
    PROBES,
    SIGNALS,
    nested_bootstrap,
    paired_bootstrap,
    probe_steps,
    probed_switch,
    run_signals,
)
from dapo_core.algorithm import long_weight_share
from dapo_core.config import UPDATE_SWITCHES


def test_long_weight_share_by_hand():
    # median of (1, 2, 3, 10) is 2.5: the long half is (3, 10)
    assert long_weight_share([1, 2, 3, 10], token_level=True) == pytest.approx(13 / 16)
    assert long_weight_share([1, 2, 3, 10], token_level=False) == pytest.approx(2 / 4)
    assert long_weight_share([5, 5, 5], token_level=True) == 0.0  # nothing above the median
    assert long_weight_share([], token_level=True) == 0.0
    assert long_weight_share([0, 0, 4, 8], token_level=True) == pytest.approx(
        8 / 12
    )  # empty: no weight


@pytest.mark.parametrize("seed", range(5))
def test_token_level_never_weighs_long_responses_less(seed):
    lengths = np.random.default_rng(seed).integers(1, 100, size=32)
    assert long_weight_share(lengths, True) >= long_weight_share(lengths, False)


def test_run_signals_windows_by_hand():
    history = [
        {"train/entropy": e, "train/truncated_frac": t, "train/response_len_mean": n}
        for e, t, n in [(1.0, 0.4, 10), (0.8, 0.3, 12), (0.6, 0.2, 14), (0.4, 0.1, 20)]
    ]
    s = run_signals(history)
    assert s["entropy"] == pytest.approx(0.7)  # mean over all steps
    assert s["truncated_frac"] == pytest.approx(0.15)  # the late half
    assert s["response_len"] == pytest.approx(17.0)
    assert s["len_growth"] == pytest.approx(10.0)  # last quarter minus first quarter
    assert math.isnan(s["kept_group_frac"])  # never logged
    assert set(s) == {sig.name for sig in SIGNALS}


def test_every_rung_after_grpo_has_a_signal():
    assert set(MECHANISM_SIGNALS) == set(list(ABLATION_LADDER)[1:])
    named = {name for signals in MECHANISM_SIGNALS.values() for name, _ in signals}
    assert named <= {s.name for s in SIGNALS} | set(PROBES)


def test_a_rung_probes_the_switch_it_adds_where_a_probe_reads_its_signal():
    assert probed_switch("+clip_higher") == "clip_higher"
    assert probed_switch("+overlong_shaping") is None  # its signals are read across runs
    assert probed_switch("grpo") is None
    for variant in MECHANISM_SIGNALS:  # every probed switch is one a probe can flip
        assert probed_switch(variant) in (None, *UPDATE_SWITCHES)


def test_probe_steps_reads_the_steps_that_logged_both_sides():
    p = PROBES["entropy_probe"]
    history = [{p.on: 0.5, p.off: 0.4}, {"train/entropy": 1.0}, {p.on: 0.3, p.off: 0.3}]
    assert probe_steps(history, p).tolist() == [[0.5, 0.4], [0.3, 0.3]]
    assert probe_steps([], p).shape == (0, 2)


def test_paired_bootstrap_constant_difference_is_exact():
    p = paired_bootstrap(np.full((3, 5), 0.25), n_boot=200)
    assert (p.diff, p.low, p.high) == pytest.approx((0.25, 0.25, 0.25))
    assert p.distinguishable


def test_paired_bootstrap_of_noise_spans_zero_and_of_a_shift_does_not():
    rng = np.random.default_rng(0)
    noise = rng.normal(0.0, 1.0, size=(5, 200))
    assert not paired_bootstrap(noise - noise.mean(), n_boot=500).distinguishable
    shifted = paired_bootstrap(noise - noise.mean() + 0.5, n_boot=500)
    assert shifted.distinguishable and shifted.low > 0
    assert shifted.low <= shifted.diff <= shifted.high


def test_paired_bootstrap_resamples_seeds_too():
    # Every problem agrees within a seed, but the seeds disagree in sign: the per-problem spread
    # alone would call this certain; over seeds it is not.
    d = np.array([[1.0] * 50, [-0.8] * 50, [0.9] * 50, [-1.0] * 50])
    p = paired_bootstrap(d, n_boot=1000)
    assert p.low < 0 < p.high
    one_seed = paired_bootstrap(d[:1], n_boot=200)
    assert one_seed.low == one_seed.high == 1.0


def test_one_pair_has_no_interval_and_is_never_distinguishable():
    p = paired_bootstrap(np.array([[0.3]]), n_boot=100)
    assert p.diff == pytest.approx(0.3) and math.isnan(p.low) and math.isnan(p.high)
    assert not p.distinguishable


def test_nested_bootstrap_by_hand():
    constant = nested_bootstrap([np.full(4, 0.5), np.full(7, 0.5)], n_boot=200)
    assert (constant.diff, constant.low, constant.high) == (0.5, 0.5, 0.5)
    # every run weighs the same whatever its length: (1 + 3) / 2, not (4 * 1 + 3) / 5
    assert nested_bootstrap([np.ones(4), np.array([3.0])], n_boot=200).diff == pytest.approx(2.0)
    one_step = nested_bootstrap([np.array([0.2])])
    assert one_step.diff == 0.2 and math.isnan(one_step.low) and not one_step.distinguishable
    assert math.isnan(nested_bootstrap([np.array([])]).diff)


@pytest.mark.parametrize("seed", range(3))
def test_nested_bootstrap_of_noise_spans_zero_and_of_a_shift_does_not(seed):
    rng = np.random.default_rng(seed)
    noise = [rng.normal(0.0, 1.0, size=n) for n in (60, 80, 70)]
    assert not nested_bootstrap(noise, n_boot=500).distinguishable
    shifted = nested_bootstrap([x + 1.0 for x in noise], n_boot=500)
    assert shifted.low > 0 and shifted.low <= shifted.diff <= shifted.high


def test_one_run_gets_an_interval_over_its_steps():
    p = nested_bootstrap([np.array([0.0, 1.0, 0.0, 1.0, 1.0, 0.0])], n_boot=500)
    assert p.low < p.diff == 0.5 < p.high
