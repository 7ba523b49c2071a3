"""The CSPRNG-driven noise samplers match their target distributions (fixed keys: deterministic)."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dp import samplers
from dp.samplers import CryptoRandom, discrete_gaussian, gaussian, poisson, skellam


def _key(i: int) -> bytes:
    return bytes([i]) * 32


def _chi_square_pvalue(samples: np.ndarray, pmf, lo: int, hi: int) -> float:
    """GOF on the bins lo..hi plus the two tails merged into the edge bins."""
    ks = np.arange(lo, hi + 1)
    clipped = np.clip(samples, lo, hi)
    observed = np.array([(clipped == k).sum() for k in ks], dtype=float)
    p = pmf(ks)
    p[0] += pmf(np.arange(lo - 2000, lo)).sum()
    p[-1] += pmf(np.arange(hi + 1, hi + 2000)).sum()
    expected = p / p.sum() * samples.size
    return stats.chisquare(observed, expected).pvalue


LAMS = [0.7, 4.0, 15.0, 250.0, 8000.0]


# `poisson` (a table inversion for these means), and PTRS directly (defined for lam >= 10; `poisson`
# uses it for means beyond samplers.TABLE_MAX's tables)
@pytest.mark.parametrize("lam,draw", [(lam, "poisson") for lam in LAMS]
                         + [(lam, "_poisson_ptrs") for lam in LAMS if lam >= 10])
def test_poisson_matches_pmf(lam, draw):
    x = getattr(samplers, draw)(lam, 200_000, CryptoRandom(_key(1)))
    sd = math.sqrt(lam)
    lo, hi = max(0, int(lam - 4 * sd)), int(lam + 4 * sd) + 1
    assert _chi_square_pvalue(x, lambda k: stats.poisson.pmf(k, lam), lo, hi) > 1e-3


@pytest.mark.parametrize("lam", [1e6, 1e8, 2.5e9, 1e10, 1.7e15])  # tables (up to ~2.7e9), then PTRS
def test_poisson_moments_for_huge_means(lam):
    x = poisson(lam, 200_000, CryptoRandom(_key(2)))
    assert abs(x.mean() - lam) < 5 * math.sqrt(lam / x.size)
    assert x.var() / lam == pytest.approx(1.0, abs=0.02)


def test_skellam_is_centred_with_variance_two_lambda():
    lam = 1234.5
    x = skellam(lam, 400_000, CryptoRandom(_key(3)))
    assert abs(x.mean()) < 5 * math.sqrt(2 * lam / x.size)
    assert x.var() / (2 * lam) == pytest.approx(1.0, abs=0.015)
    assert x.dtype == np.int64


@pytest.mark.parametrize("lam", [0.3, 4.0, 250.0, 8000.0])
def test_skellam_matches_its_pmf(lam):
    """Drawn from its own table: the chi-square against scipy's Skellam pmf."""
    x = skellam(lam, 200_000, CryptoRandom(_key(6)))
    sd = math.sqrt(2 * lam)
    lo, hi = int(-4 * sd) - 1, int(4 * sd) + 1
    assert _chi_square_pvalue(x, lambda k: stats.skellam.pmf(k, lam, lam), lo, hi) > 1e-3


@pytest.mark.parametrize("lam", [0.3, 50.0, 3000.0, 2e5])
def test_the_skellam_table_is_the_difference_of_two_poisson_tables(lam):
    """Its pmf (the Bessel form) against the exact convolution of two Poisson tables: within 1e-12 in
    total variation, so a table draw and a two-Poisson draw are the same distribution to float rounding."""
    lo, cdf, _ = samplers._poisson_table(lam)
    p = np.diff(cdf, prepend=0.0)
    conv = np.convolve(p, p[::-1])  # P(K1 - K2 = d), d from -(len - 1) to len - 1
    slo, scdf, _ = samplers._build_skellam_table(lam)
    mine = np.diff(scdf, prepend=0.0)
    ref = np.zeros_like(mine)
    d = np.arange(-(len(p) - 1), len(p))
    keep = (d >= slo) & (d < slo + len(mine))
    ref[d[keep] - slo] = conv[keep]
    assert 0.5 * np.abs(mine - ref).sum() < 1e-12


def test_the_skellam_algorithm_is_chosen_by_the_mean_alone(monkeypatch):
    """At the limit the table still sums to 1 (scipy's ive holds there); above it both Poisson draws are
    taken, whatever tables this process holds."""
    lo, cdf, _ = samplers._build_skellam_table(samplers.SKELLAM_TABLE_MAX)
    assert abs(cdf[-1] - 1.0) < 1e-9 and len(cdf) <= samplers.TABLE_MAX
    calls = []
    real = samplers.poisson
    monkeypatch.setattr(samplers, "poisson", lambda lam, size, rng: calls.append(lam) or real(lam, size, rng))
    skellam(samplers.SKELLAM_TABLE_MAX * 2, 10, CryptoRandom(_key(7)))
    skellam(5.0, 10, CryptoRandom(_key(7)))
    assert calls == [samplers.SKELLAM_TABLE_MAX * 2] * 2


@pytest.mark.parametrize("sigma", [0.8, 3.0, 20.0])
def test_discrete_gaussian_matches_pmf(sigma):
    x = discrete_gaussian(sigma, 200_000, CryptoRandom(_key(4)))
    support = np.arange(-int(12 * sigma) - 5, int(12 * sigma) + 6)
    norm = np.exp(-support.astype(float) ** 2 / (2 * sigma**2)).sum()

    def pmf(k):
        return np.exp(-np.asarray(k, dtype=float) ** 2 / (2 * sigma**2)) / norm

    lim = int(4 * sigma) + 1
    assert _chi_square_pvalue(x, pmf, -lim, lim) > 1e-3


def test_float_gaussian_moments():
    x = gaussian(2.5, 200_000, CryptoRandom(_key(5)))
    assert abs(x.mean()) < 0.03
    assert x.std() == pytest.approx(2.5, rel=0.01)


def test_default_streams_are_fresh_and_fixed_keys_reproduce():
    assert not np.array_equal(CryptoRandom().uniform(8), CryptoRandom().uniform(8))
    assert np.array_equal(CryptoRandom(_key(6)).uniform(8), CryptoRandom(_key(6)).uniform(8))
    u = CryptoRandom().uniform(10_000)
    assert u.min() >= 0 and u.max() < 1


def test_invalid_parameters_raise():
    with pytest.raises(ValueError, match="Poisson mean must be finite and non-negative"):
        poisson(-1.0, 3, CryptoRandom())
    with pytest.raises(ValueError, match="sigma must be positive"):
        discrete_gaussian(0.0, 3, CryptoRandom())
    with pytest.raises(ValueError, match="keys are 32 bytes"):
        CryptoRandom(b"short")


class _Given:
    """A CryptoRandom stand-in that returns the given uniforms."""

    def __init__(self, u: np.ndarray) -> None:
        self.u = u

    def uniform(self, n: int) -> np.ndarray:
        assert n == self.u.size
        return self.u.copy()


@settings(max_examples=60, deadline=None)
@given(lam=st.floats(0.1, 4e7), us=st.lists(st.floats(0.0, 1.0, exclude_max=True), max_size=40),
       edges=st.lists(st.integers(0, 1 << 17), max_size=10))
def test_the_guide_table_finds_the_first_value_above_u(lam, us, edges):
    """Inversion through the guide table answers exactly what a binary search over the CDF does, also
    for uniforms on and just below a bucket's edge and in the tails (where the search takes over)."""
    lo, cdf, _ = samplers._poisson_table(lam)
    m = len(cdf)
    at = [b / m for b in edges if b < m]
    u = np.array(us + at + [np.nextafter(x, 0.0) for x in at if x > 0] + [0.0, np.nextafter(1.0, 0.0)])
    want = lo + np.minimum(np.searchsorted(cdf, u, side="right"), m - 1)
    assert np.array_equal(samplers._poisson_inversion(lam, u.size, _Given(u)), want)


def test_tables_are_kept_within_an_entry_budget_not_a_table_count(monkeypatch):
    """XNoise draws from ~40 means per client: all their tables stay kept while they fit the budget, and
    the least recently used go first once they do not (the total never exceeds it)."""
    monkeypatch.setattr(samplers, "_TABLES", type(samplers._TABLES)())
    monkeypatch.setattr(samplers, "_KEPT_ENTRIES", 0)
    means = [1000.0 + 7.5 * i for i in range(64)]
    rng = CryptoRandom(key=bytes(32))
    for lam in means:
        samplers._poisson_inversion(lam, 4, rng)
    assert list(samplers._TABLES) == means
    sizes = {lam: samplers._table_size(lam) for lam in means}
    assert samplers._KEPT_ENTRIES == sum(sizes.values())
    budget = sum(sizes[lam] for lam in means[-10:])
    monkeypatch.setattr(samplers, "TABLE_ENTRIES_KEPT", budget)
    samplers._poisson_inversion(means[0], 4, rng)  # kept already: used again, nothing built
    assert list(samplers._TABLES)[-1] == means[0] and len(samplers._TABLES) == len(means)
    samplers._poisson_inversion(5000.0, 4, rng)  # a new table: the least recently used go
    sizes[5000.0] = samplers._table_size(5000.0)
    kept = list(samplers._TABLES)
    assert kept[-1] == 5000.0 and samplers._KEPT_ENTRIES == sum(sizes[lam] for lam in kept) <= budget
    assert kept[:-1] == ([*means[1:], means[0]])[-(len(kept) - 1):]


def test_the_largest_tables_draw_poisson_like_its_normal_limit():
    """lam 2.5e9: a table of about 1e6 entries (the largest TABLE_MAX allows), drawn by inversion. At this
    mean Poisson is normal to within its skewness 2e-5: standardised draws fall in normal deciles."""
    lam = 2.5e9
    assert samplers._table_size(lam) <= samplers.TABLE_MAX < samplers._table_size(2.8e9)
    x = samplers._poisson_inversion(lam, 200_000, CryptoRandom(_key(5)))
    z = (x - lam) / math.sqrt(lam)
    edges = stats.norm.ppf(np.linspace(0, 1, 11)[1:-1])
    counts = np.bincount(np.searchsorted(edges, z), minlength=10)
    assert stats.chisquare(counts).pvalue > 1e-3
    assert abs(z.mean()) < 5 / math.sqrt(z.size) and z.var() == pytest.approx(1.0, abs=0.02)


@pytest.mark.parametrize("lam", [3.0, 5e3, 2e9, 1e10])
def test_a_draw_depends_on_its_key_and_mean_only_not_on_what_the_process_drew_before(monkeypatch, lam):
    """XNoise's server regenerates a client's noise layer from its key: the same key, mean and size must
    give the same values whatever tables this process has kept (a fresh process keeps none)."""
    key = _key(9)
    first = poisson(lam, 300, CryptoRandom(key))     # kept tables as the module has them
    monkeypatch.setattr(samplers, "_TABLES", type(samplers._TABLES)())
    monkeypatch.setattr(samplers, "_KEPT_ENTRIES", 0)
    fresh = poisson(lam, 300, CryptoRandom(key))     # as in a process that never drew from lam
    again = poisson(lam, 300, CryptoRandom(key))     # now with its table kept (where it has one)
    assert np.array_equal(first, fresh) and np.array_equal(fresh, again)
    assert np.array_equal(skellam(lam, 300, CryptoRandom(key)), skellam(lam, 300, CryptoRandom(key)))
