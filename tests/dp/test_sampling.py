"""Cohort samplers: what each draws, from which randomness, and the amplification it justifies."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dp.sampling import (AmplificationNotJustified, EveryoneSampler, FixedSizeSampler, PoissonSampler,
                         SamplingRecord, SeededSampler, check_amplification, make_sampler)

IDS = list(range(1, 201))


def test_poisson_draws_each_client_independently_at_its_rate():
    sampler = PoissonSampler(0.1)
    counts = {c: 0 for c in IDS}
    sizes = []
    for _ in range(200):
        cohort = sampler.sample(IDS)
        assert cohort == sorted(set(cohort)) and set(cohort) <= set(IDS)
        sizes.append(len(cohort))
        for c in cohort:
            counts[c] += 1
    # total draws ~ Binomial(200 * 200, 0.1); each client's ~ Binomial(200, 0.1)
    assert stats.binomtest(sum(sizes), 200 * len(IDS), 0.1).pvalue > 1e-4
    assert len(set(sizes)) > 5  # the cohort size varies, as Poisson sampling does
    low, high = stats.binom.ppf([1e-6, 1 - 1e-6], 200, 0.1)
    assert all(low <= k <= high for k in counts.values())


def test_csprng_samplers_cannot_be_replayed_but_the_seeded_one_can():
    assert len({tuple(PoissonSampler(0.5).sample(IDS)) for _ in range(5)}) == 5
    assert len({tuple(FixedSizeSampler(20).sample(IDS)) for _ in range(5)}) == 5
    a, b = SeededSampler(size=20, seed=7), SeededSampler(size=20, seed=7)
    assert [a.sample(IDS) for _ in range(3)] == [b.sample(IDS) for _ in range(3)]


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 50), st.lists(st.integers(1, 10_000), min_size=1, max_size=60, unique=True))
def test_fixed_size_and_seeded_draw_exactly_min_size_population(size, ids):
    for sampler in (FixedSizeSampler(size), SeededSampler(size=size, seed=size)):
        cohort = sampler.sample(ids)
        assert len(cohort) == min(size, len(ids)) and set(cohort) <= set(ids) and cohort == sorted(cohort)
    assert EveryoneSampler().sample(ids) == sorted(ids)


def test_records_state_the_scheme_and_only_poisson_amplifies():
    assert PoissonSampler(0.05).record(200) == SamplingRecord("poisson", 200, 0.05)
    assert PoissonSampler(0.05).record(200).amplification_rate == 0.05
    for sampler in (FixedSizeSampler(10), SeededSampler(size=10, seed=0)):
        rec = sampler.record(200)
        assert rec.rate == 0.05 and rec.amplification_rate == 1.0
    assert EveryoneSampler().record(200).amplification_rate == 1.0
    rec = SeededSampler(size=10, seed=0).record(200)
    assert SamplingRecord.from_dict(rec.to_dict()) == rec
    with pytest.raises(ValueError, match="a sampling record has scheme, population, rate and min_cohort"):
        SamplingRecord.from_dict({**rec.to_dict(), "extra": 1})
    with pytest.raises(ValueError, match="sampling scheme is one of .*got 'bernoulli'"):
        SamplingRecord("bernoulli", 10, 0.5)


def test_the_accountant_refuses_amplification_the_sampler_does_not_give():
    check_amplification(1.0, None)                                       # no claim: always fine
    check_amplification(0.05, PoissonSampler(0.05).record(200))
    with pytest.raises(AmplificationNotJustified, match="no sampler"):
        check_amplification(0.05, None)
    with pytest.raises(AmplificationNotJustified, match="'seeded' sampler"):
        check_amplification(0.05, SeededSampler(size=10, seed=0).record(200))
    with pytest.raises(AmplificationNotJustified, match="'fixed_size' sampler"):
        check_amplification(0.05, FixedSizeSampler(10).record(200))
    with pytest.raises(AmplificationNotJustified, match="q=0.1"):
        check_amplification(0.05, PoissonSampler(0.1).record(200))


def test_make_sampler_from_a_run_config():
    assert make_sampler("poisson", cohort=10, population=200) == PoissonSampler(0.05)
    assert make_sampler("fixed_size", cohort=10, population=200) == FixedSizeSampler(10)
    assert isinstance(make_sampler("seeded", cohort=10, population=200, seed=3), SeededSampler)
    assert make_sampler("poisson", cohort=None, population=200) == EveryoneSampler()
    assert make_sampler("poisson", cohort=500, population=200) == EveryoneSampler()
    with pytest.raises(ValueError, match="sampler is one of"):
        make_sampler("uniform", cohort=10, population=200)
    assert math.isclose(make_sampler("poisson", cohort=7, population=9).record(9).rate, 7 / 9)


# ---- rounds that release nothing: the boundary delta ----------------------------------------------

def _round_distribution(*, others: int, q: float, floor: int, with_x: bool, noise: list[float], skip: bool) -> dict:
    """Exact output distribution of one round over a population of `others` zero-valued clients (plus the
    target x, value 1, when `with_x`): Poisson cohort at rate q; below `floor` members the round outputs
    'skip' (if `skip`), else (cohort sum + Z) mod K with Z drawn from `noise` on Z_K (shift invariant)."""
    k = len(noise)
    out: dict = {}
    for n in range(others + 1):
        p_n = stats.binom.pmf(n, others, q)
        for x_in, p_x in ((False, 1 - q), (True, q)) if with_x else ((False, 1.0),):
            size, total = n + x_in, int(x_in)
            if skip and size < floor:
                out["skip"] = out.get("skip", 0.0) + p_n * p_x
                continue
            for z, p_z in enumerate(noise):
                y = (total + z) % k
                out[y] = out.get(y, 0.0) + p_n * p_x * p_z
    return out


def _hockey_stick(p: dict, r: dict, eps: float) -> float:
    return sum(max(0.0, p.get(o, 0.0) - math.exp(eps) * r.get(o, 0.0)) for o in set(p) | set(r))


@settings(max_examples=60, deadline=None)
@given(others=st.integers(2, 12), q=st.floats(0.05, 0.95), floor=st.integers(1, 6),
       weights=st.lists(st.floats(0.05, 1.0), min_size=3, max_size=6), eps=st.floats(0.0, 2.0))
def test_skipping_small_cohorts_costs_at_most_the_boundary_delta(others, q, floor, weights, eps):
    """The argument of dp.sampling, checked exactly: skipping cohorts below the floor adds at most
    P[Bin(others, q) = floor - 1] to the delta of the sampled mechanism that never skips, both ways."""
    noise = [w / sum(weights) for w in weights]
    record = SamplingRecord("poisson", others + 1, q, min_cohort=floor)
    assert record.boundary_delta == pytest.approx(stats.binom.pmf(floor - 1, others, q))
    kw = dict(others=others, q=q, floor=floor, noise=noise)
    d_with, d_without = (_round_distribution(with_x=True, skip=True, **kw),
                         _round_distribution(with_x=False, skip=True, **kw))
    m_with, m_without = (_round_distribution(with_x=True, skip=False, **kw),
                         _round_distribution(with_x=False, skip=False, **kw))
    for a, b, ma, mb in ((d_with, d_without, m_with, m_without), (d_without, d_with, m_without, m_with)):
        # the no-skip mechanism's worst case over fixed cohorts: shift invariance makes it the S-free pair
        fixed_a = _round_distribution(others=0, q=q, floor=0, with_x=a is d_with, noise=noise, skip=False)
        fixed_b = _round_distribution(others=0, q=q, floor=0, with_x=b is d_with, noise=noise, skip=False)
        sampled = _hockey_stick(fixed_a, fixed_b, eps)
        assert _hockey_stick(a, b, eps) <= sampled + record.boundary_delta + 1e-12
        assert _hockey_stick(ma, mb, eps) <= sampled + 1e-12


def test_the_boundary_term_is_needed():
    """With noise that hides the sum completely (uniform on Z_K), the never-skipping round leaks nothing,
    but skipping does: x's absence makes a skip likelier by q x P[Bin(others, q) = floor - 1]."""
    kw = dict(others=5, q=0.5, floor=3, noise=[0.25] * 4)
    plain = _hockey_stick(_round_distribution(with_x=False, skip=False, **kw),
                          _round_distribution(with_x=True, skip=False, **kw), 0.0)
    skip = _hockey_stick(_round_distribution(with_x=False, skip=True, **kw),
                         _round_distribution(with_x=True, skip=True, **kw), 0.0)
    boundary = SamplingRecord("poisson", 6, 0.5, min_cohort=3).boundary_delta
    assert plain == pytest.approx(0.0, abs=1e-12)
    assert skip == pytest.approx(0.5 * boundary)


def test_boundary_delta_only_for_amplified_records_with_a_floor():
    assert SamplingRecord("poisson", 100, 0.2).boundary_delta == 0.0  # min_cohort 0: empty samples release
    assert SamplingRecord("seeded", 100, 0.2, min_cohort=5).boundary_delta == 0.0  # no amplification claimed
    assert SamplingRecord("everyone", 100, 1.0, min_cohort=5).boundary_delta == 0.0
    assert SamplingRecord("poisson", 100, 0.2, min_cohort=5).boundary_delta == pytest.approx(
        stats.binom.pmf(4, 99, 0.2))
    assert SamplingRecord.from_dict(SamplingRecord("poisson", 100, 0.2, 5).to_dict()).min_cohort == 5
    assert SamplingRecord.from_dict({"scheme": "poisson", "population": 9, "rate": 0.5}).min_cohort == 0
    with pytest.raises(ValueError, match="min_cohort is a non-negative int"):
        SamplingRecord("poisson", 100, 0.2, min_cohort=-1)
