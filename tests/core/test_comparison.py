"""The method comparison's statistics, by hand."""

import math

import numpy as np
import pytest

from dapo_core.comparison import (
    COLLAPSE_SHARE,
    coefficient_of_variation,
    collapsed,
    cumulative,
    mean_curve,
    seed_spread,
)


def test_seed_spread_is_the_mean_the_sample_sd_and_a_t_interval_around_the_mean():
    s = seed_spread([0.2, 0.4, 0.6])
    assert s.mean == pytest.approx(0.4) and s.n == 3
    assert s.sd == pytest.approx(0.2)  # sqrt(((-0.2)^2 + 0 + 0.2^2) / 2)
    # t(0.975, 2 df) = 4.3027 (tables); standard error 0.2 / sqrt(3)
    assert s.high - s.mean == pytest.approx(4.3027 * 0.2 / math.sqrt(3), abs=1e-4)
    assert s.mean - s.low == pytest.approx(s.high - s.mean)
    two = seed_spread([0.5, 0.7])  # t(0.975, 1 df) = 12.706, standard error 0.1
    assert (two.low, two.high) == pytest.approx((0.6 - 1.2706, 0.6 + 1.2706), abs=1e-4)
    assert two.low < 0.5 and two.high > 0.7  # wider than the seeds' range, as two seeds need
    same = seed_spread([0.3, 0.3, 0.3])
    assert same.sd == 0 and same.low == same.high == pytest.approx(0.3)


def test_the_t_interval_covers_the_mean_95_times_in_100_with_few_seeds():
    """Coverage over many draws of 3 normal seeds: the percentile bootstrap it replaced covered
    far less (its interval stays inside the seeds' range)."""
    rng = np.random.default_rng(0)
    hits = [
        (s := seed_spread(rng.normal(0.5, 0.1, size=3))).low <= 0.5 <= s.high for _ in range(2000)
    ]
    assert 0.93 <= np.mean(hits) <= 0.97


def test_one_seed_has_no_spread_and_missing_values_are_left_out():
    one = seed_spread([0.5, float("nan")])
    assert one.mean == 0.5 and one.n == 1
    assert math.isnan(one.sd) and math.isnan(one.low) and math.isnan(one.high)
    assert seed_spread([]).n == 0 and math.isnan(seed_spread([]).mean)


def test_a_run_collapsed_below_the_share_of_the_warm_start():
    assert COLLAPSE_SHARE == 0.5
    assert collapsed(0.14, 0.30) and not collapsed(0.15, 0.30) and not collapsed(0.6, 0.3)


def test_coefficient_of_variation_is_sd_over_mean():
    assert coefficient_of_variation([1.0, 3.0]) == pytest.approx(math.sqrt(2) / 2)
    assert coefficient_of_variation([2.0, 2.0, 2.0]) == 0
    # scale-free: a loss ten times larger has the same CV
    x = [0.5, 1.5, 1.0, 2.0]
    assert coefficient_of_variation([10 * v for v in x]) == pytest.approx(
        coefficient_of_variation(x)
    )
    assert math.isnan(coefficient_of_variation([1.0]))
    assert math.isnan(coefficient_of_variation([1.0, -1.0]))  # mean 0


def test_curves_are_averaged_point_by_point_up_to_the_shortest():
    a = [(0, 0.2), (100, 0.4), (200, 0.5)]
    b = [(0, 0.4), (120, 0.6)]
    points = mean_curve([a, b])
    assert len(points) == 2
    assert (points[0].x, points[0].y) == (0, pytest.approx(0.3))
    assert (points[1].x, points[1].y) == (110, pytest.approx(0.5))
    assert points[1].low <= 0.5 <= points[1].high
    solo = mean_curve([a])
    assert [p.y for p in solo] == [0.2, 0.4, 0.5] and all(math.isnan(p.low) for p in solo)
    assert mean_curve([]) == []


def test_cumulative_counts():
    assert cumulative([3, 0, 2]) == [3.0, 3.0, 5.0]
    assert cumulative([]) == []
    rng = np.random.default_rng(0)
    x = rng.integers(0, 100, size=20)
    assert cumulative(x)[-1] == x.sum()


def test_an_accuracys_interval_stays_within_0_and_1():
    """Two seeds far apart: the t-interval (12.7 standard errors) reaches past both ends."""
    wide = seed_spread([0.1, 0.9])
    assert wide.low < 0 and wide.high > 1
    cut = seed_spread([0.1, 0.9], bounds=(0.0, 1.0))
    assert (cut.low, cut.mean, cut.high) == (0.0, pytest.approx(0.5), 1.0)
    (point,) = mean_curve([[(10, 0.1)], [(12, 0.9)]])
    assert (point.low, point.high) == (0.0, 1.0) and point.x == 11
