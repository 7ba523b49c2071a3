"""dp.audit.bounds: the estimators on synthetic Gaussian scores, where the true epsilon is known exactly."""
import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import pld
from scipy import stats

from dp.audit.bounds import (clopper_pearson_bound, clopper_pearson_lower, clopper_pearson_upper, default_guess_grid,
                             epsilon_from_rates, gaussian_fit_epsilon, gaussian_pair_delta, gaussian_pair_epsilon,
                             max_lower_bound, one_run_bound, one_run_epsilon, one_run_p_value)


def true_gaussian_epsilon(mu: float, delta: float) -> float:
    """The exact epsilon at delta of the Gaussian mechanism with sensitivity / sigma = mu (PLD, dp_accounting)."""
    accountant = pld.PLDAccountant(value_discretization_interval=1e-4)
    accountant.compose(dp_accounting.GaussianDpEvent(1.0 / mu))
    return accountant.get_epsilon(delta)


def split_bound(ins, outs, *, delta, rng, confidence=0.95):
    """The Clopper-Pearson bound with half of each score set choosing the threshold."""
    ins, outs = rng.permutation(ins), rng.permutation(outs)
    a, b = len(ins) // 2, len(outs) // 2
    return clopper_pearson_bound(selection={"s": (ins[:a], outs[:b])}, evaluation={"s": (ins[a:], outs[b:])},
                                 delta=delta, confidence=confidence)


# ---- Clopper-Pearson ---------------------------------------------------------------------------

def test_clopper_pearson_intervals_match_scipys_exact_binomial_interval():
    for k, n in ((0, 50), (3, 50), (50, 50), (17, 400)):
        ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")  # two-sided 95% = one-sided 97.5%
        assert float(clopper_pearson_lower(k, n, 0.025)) == pytest.approx(ci.low, abs=1e-9)
        assert float(clopper_pearson_upper(k, n, 0.025)) == pytest.approx(ci.high, abs=1e-9)


def test_epsilon_from_rates_is_log_of_the_ratio_and_never_negative():
    assert float(epsilon_from_rates(tpr_lower=0.5, fpr_upper=0.01, delta=0.0)) == pytest.approx(math.log(50))
    assert float(epsilon_from_rates(tpr_lower=0.5, fpr_upper=0.01, delta=0.1)) == pytest.approx(math.log(40))
    assert float(epsilon_from_rates(tpr_lower=0.05, fpr_upper=0.01, delta=0.1)) == 0.0  # TPR below delta
    assert float(epsilon_from_rates(tpr_lower=0.2, fpr_upper=0.4, delta=0.0)) == 0.0


def test_perfect_separation_reaches_exactly_the_largest_bound_the_counts_allow():
    rng = np.random.default_rng(0)
    b = split_bound(rng.normal(10, 1, 400), rng.normal(0, 1, 4000), delta=1e-5, rng=rng)
    assert b.true_positives == 200 and b.false_positives == 0
    assert b.epsilon == pytest.approx(b.max_epsilon) == pytest.approx(max_lower_bound(n_in=200, n_out=2000, delta=1e-5))
    # ln(((0.025)^(1/200) - delta) / (1 - 0.025^(1/2000)))
    expected = math.log((0.025 ** (1 / 200) - 1e-5) / (1 - 0.025 ** (1 / 2000)))
    assert b.max_epsilon == pytest.approx(expected, rel=1e-9)


def test_the_bound_never_exceeds_the_true_epsilon_of_a_correct_gaussian_mechanism():
    """False alarms of the bound on an exact Gaussian mechanism (scores N(mu, 1) in, N(0, 1) out) over
    many seeds: measured, and zero (the 95% guarantee allows 5%; the bound's slack leaves far fewer)."""
    cases = [(1.5, 0.1), (2.0, 0.05), (1.0, 1e-5)]
    rng = np.random.default_rng(1)
    alarms, runs, closest = 0, 0, 0.0
    for mu, delta in cases:
        truth = true_gaussian_epsilon(mu, delta)
        for _ in range(60):
            b = split_bound(rng.normal(mu, 1, 1000), rng.normal(0, 1, 20_000), delta=delta, rng=rng)
            alarms += b.epsilon > truth
            runs += 1
            closest = max(closest, b.epsilon / truth)
    assert runs == 180
    assert alarms == 0, f"false-alarm rate {alarms}/{runs}"
    assert 0.5 < closest < 1.0  # the bound has power: it gets within a factor two of the truth


def test_clopper_pearson_refuses_bad_input():
    with pytest.raises(ValueError, match="same .non-empty. statistics"):
        clopper_pearson_bound(selection={"a": ([1.0], [0.0])}, evaluation={"b": ([1.0], [0.0])}, delta=1e-5)
    with pytest.raises(ValueError, match="needs inserted and held-out"):
        clopper_pearson_bound(selection={"a": ([], [0.0])}, evaluation={"a": ([1.0], [0.0])}, delta=1e-5)
    with pytest.raises(ValueError, match="confidence must be in"):
        max_lower_bound(n_in=10, n_out=10, delta=0.0, confidence=1.5)
    with pytest.raises(ValueError, match="delta must be in"):
        clopper_pearson_bound(selection={"a": ([1.0], [0.0])}, evaluation={"a": ([1.0], [0.0])}, delta=1.5)


# ---- the one-run bound (Steinke, Nasr, Jagielski) -----------------------------------------------

def _paper_p_value(m, r, v, eps, delta):
    """Appendix D of Steinke et al., written as there (a loop), to pin the vectorised version."""
    q = 1 / (1 + math.exp(-eps))
    beta = stats.binom.sf(v - 1, r, q)
    alpha, total = 0.0, 0.0
    for i in range(1, v + 1):
        total += stats.binom.pmf(v - i, r, q)
        if total > i * alpha:
            alpha = total / i
    return min(beta + alpha * delta * 2 * m, 1.0)


@pytest.mark.parametrize("m,r,v,eps,delta", [(1000, 100, 90, 1.0, 1e-5), (1000, 100, 100, 3.0, 1e-6),
                                             (200, 50, 30, 0.5, 0.0), (5000, 400, 350, 2.0, 1e-6)])
def test_one_run_p_value_is_the_papers(m, r, v, eps, delta):
    assert one_run_p_value(canaries=m, guesses=r, correct=v, epsilon=eps, delta=delta) == pytest.approx(
        _paper_p_value(m, r, v, eps, delta), rel=1e-9, abs=1e-12)


def test_one_run_epsilon_with_every_guess_right_and_no_delta_is_the_binomial_tail():
    eps = one_run_epsilon(canaries=1000, guesses=100, correct=100, delta=0.0)
    q = 0.05 ** (1 / 100)  # P[Bin(100, q) >= 100] = q^100 = alpha
    assert eps == pytest.approx(math.log(q / (1 - q)), abs=1e-5)
    assert one_run_epsilon(canaries=1000, guesses=100, correct=50, delta=0.0) == 0.0  # chance level
    # the delta term 2 m delta swamps any evidence when m delta is not small
    assert one_run_epsilon(canaries=1000, guesses=100, correct=100, delta=0.1) == 0.0


def test_one_run_bound_sees_separation_and_not_noise():
    rng = np.random.default_rng(2)
    included = rng.random(2000) < 0.5
    separated = one_run_bound(np.where(included, 5.0, 0.0) + rng.normal(0, 1, 2000), included, delta=1e-6)
    assert separated.epsilon > 3 and separated.correct >= 0.95 * separated.guesses
    assert separated.grid == len(default_guess_grid(2000))
    blind = [one_run_bound(rng.normal(0, 1, 2000), rng.random(2000) < 0.5, delta=1e-6).epsilon for _ in range(20)]
    assert max(blind) < 0.5 and sum(b > 0 for b in blind) <= 2


def test_one_run_bound_stays_below_a_gaussian_mechanisms_epsilon():
    rng = np.random.default_rng(3)
    truth = true_gaussian_epsilon(2.0, 1e-6)
    for _ in range(20):
        included = rng.random(2000) < 0.5
        b = one_run_bound(np.where(included, 2.0, 0.0) + rng.normal(0, 1, 2000), included, delta=1e-6)
        assert 0 < b.epsilon < truth


def test_one_run_refuses_impossible_counts():
    with pytest.raises(ValueError, match="need 0 <= correct <= guesses <= canaries"):
        one_run_p_value(canaries=10, guesses=20, correct=5, epsilon=1.0, delta=0.0)
    with pytest.raises(ValueError, match="k\\+ \\+ k- <= the number of canaries"):
        one_run_bound(np.zeros(4), np.zeros(4, dtype=bool), delta=0.0, grid=[(3, 3)])
    with pytest.raises(ValueError, match="same length"):
        one_run_bound(np.zeros(4), np.zeros(5, dtype=bool), delta=0.0)


# ---- the Gaussian fit (Andrew et al.) ----------------------------------------------------------

@pytest.mark.parametrize("mu,delta", [(0.5, 1e-5), (1.0, 1e-5), (2.0, 1e-3), (1.5, 0.1)])
def test_the_pair_of_equal_variance_gaussians_is_the_gaussian_mechanism(mu, delta):
    eps = gaussian_pair_epsilon(mean_in=mu, std_in=1.0, mean_out=0.0, std_out=1.0, delta=delta)
    assert eps == pytest.approx(true_gaussian_epsilon(mu, delta), rel=2e-3, abs=2e-3)
    assert gaussian_pair_delta(eps, mean_in=mu, std_in=1.0, mean_out=0.0, std_out=1.0) == pytest.approx(delta, rel=1e-4)


def test_unequal_variances_cost_more_than_the_mean_shift_alone():
    base = gaussian_pair_epsilon(mean_in=1.0, std_in=1.0, mean_out=0.0, std_out=1.0, delta=1e-5)
    wider = gaussian_pair_epsilon(mean_in=1.0, std_in=1.3, mean_out=0.0, std_out=1.0, delta=1e-5)
    assert math.isfinite(wider) and wider > base
    assert gaussian_pair_epsilon(mean_in=0.0, std_in=1.0, mean_out=0.0, std_out=1.0, delta=1e-5) == 0.0
    assert gaussian_pair_epsilon(mean_in=1.0, std_in=0.0, mean_out=0.0, std_out=1.0, delta=1e-5) == math.inf


@pytest.mark.parametrize("mu,delta", [(1.0, 1e-5), (2.0, 1e-5), (1.5, 0.1)])
def test_gaussian_fit_recovers_a_known_epsilon(mu, delta):
    rng = np.random.default_rng(4)
    fit = gaussian_fit_epsilon(rng.normal(mu, 1, 20_000), rng.normal(0, 1, 20_000), delta=delta)
    assert fit.epsilon == pytest.approx(true_gaussian_epsilon(mu, delta), rel=0.05)
    assert fit.mean_in == pytest.approx(mu, abs=0.03) and fit.std_out == pytest.approx(1.0, abs=0.03)


def test_gaussian_fit_needs_two_scores_a_side():
    with pytest.raises(ValueError, match="at least two inserted and two held-out"):
        gaussian_fit_epsilon([1.0], [0.0, 0.1], delta=1e-5)
