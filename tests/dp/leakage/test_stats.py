"""dp.leakage.stats: advantage over chance and Student-t intervals over seeds."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp.leakage.stats import advantage_over_chance, mean_ci

unit = st.floats(0.0, 1.0, allow_nan=False)
finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)


def test_mean_ci_matches_the_student_t_formula():
    m, lo, hi = mean_ci([1.0, 2.0, 3.0])
    half = 4.302652729911275 * 1.0 / math.sqrt(3)  # t_{0.975, 2} * s / sqrt(n), s = 1
    assert m == pytest.approx(2.0)
    assert (lo, hi) == (pytest.approx(2.0 - half), pytest.approx(2.0 + half))
    m90, lo90, hi90 = mean_ci([1.0, 2.0, 3.0], level=0.90)
    assert hi90 - lo90 == pytest.approx(2 * 2.919985580355516 / math.sqrt(3))


def test_single_value_has_no_interval_and_identical_values_a_zero_width_one():
    m, lo, hi = mean_ci([0.7])
    assert m == 0.7 and math.isnan(lo) and math.isnan(hi)
    assert mean_ci([0.25, 0.25, 0.25]) == pytest.approx((0.25, 0.25, 0.25))


@pytest.mark.parametrize("bad", [[], [1.0, math.nan], [math.inf, 1.0]])
def test_mean_ci_rejects_empty_and_non_finite_input(bad):
    with pytest.raises(ValueError, match="needs at least one value|NaN or infinity"):
        mean_ci(bad)


@pytest.mark.parametrize("level", [0.0, 1.0, -0.5, 1.5])
def test_mean_ci_rejects_levels_outside_the_open_unit_interval(level):
    with pytest.raises(ValueError, match="level"):
        mean_ci([1.0, 2.0], level=level)


def test_mean_ci_covers_the_true_mean_at_the_nominal_rate():
    rng = np.random.default_rng(0)
    trials = 2000
    hits = 0
    for _ in range(trials):
        _, lo, hi = mean_ci(rng.normal(3.0, 2.0, size=5))
        hits += lo <= 3.0 <= hi
    assert abs(hits / trials - 0.95) < 0.02


@settings(max_examples=60, deadline=None)
@given(st.lists(finite, min_size=2, max_size=12), finite, st.floats(0.5, 0.99))
def test_mean_ci_properties(values, shift, level):
    m, lo, hi = mean_ci(values, level=level)
    assert lo <= m + 1e-9 * (1 + abs(m)) and m <= hi + 1e-9 * (1 + abs(m))
    assert (hi - m) == pytest.approx(m - lo, rel=1e-6, abs=1e-6)  # symmetric
    m2, lo2, hi2 = mean_ci([v + shift for v in values], level=level)  # shift-equivariant
    assert m2 == pytest.approx(m + shift, rel=1e-9, abs=1e-6)
    assert hi2 - lo2 == pytest.approx(hi - lo, rel=1e-6, abs=1e-4)
    _, wlo, whi = mean_ci(values, level=min(0.999, level + 0.005))  # a higher level is never narrower
    assert whi - wlo >= (hi - lo) * (1 - 1e-9) - 1e-9


def test_advantage_over_chance_known_values():
    assert advantage_over_chance(1.0, 0.2) == pytest.approx(1.0)
    assert advantage_over_chance(0.2, 0.2) == pytest.approx(0.0)
    assert advantage_over_chance(0.6, 0.2) == pytest.approx(0.5)
    assert advantage_over_chance(0.0, 0.5) == pytest.approx(-1.0)  # worse than guessing is negative
    assert advantage_over_chance(0.5, None) == pytest.approx(0.5)
    assert advantage_over_chance(1.0, 1.0) == 0.0


@pytest.mark.parametrize("f1, chance", [(1.5, 0.1), (-0.1, 0.1), (0.5, 1.2), (math.nan, 0.1), (0.5, math.inf)])
def test_advantage_over_chance_rejects_numbers_outside_the_unit_interval(f1, chance):
    with pytest.raises(ValueError, match=r"(f1|chance) must be in \[0, 1\]"):
        advantage_over_chance(f1, chance)


@given(unit, unit, st.floats(0.0, 0.99))
def test_advantage_over_chance_properties(a, b, chance):
    lo, hi = sorted((a, b))
    assert advantage_over_chance(lo, chance) <= advantage_over_chance(hi, chance) + 1e-12  # monotone in F1
    assert advantage_over_chance(chance, chance) == pytest.approx(0.0, abs=1e-12)
    assert advantage_over_chance(1.0, chance) == pytest.approx(1.0)
    assert advantage_over_chance(hi, chance) <= 1.0 + 1e-12


def test_old_import_path_still_works():
    from dp.leakage import token_advantage as from_package
    from dp.leakage.pipeline import token_advantage

    assert token_advantage is advantage_over_chance and from_package is advantage_over_chance
