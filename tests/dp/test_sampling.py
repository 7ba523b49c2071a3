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
    with pytest.raises(ValueError):
        SamplingRecord.from_dict({**rec.to_dict(), "extra": 1})
    with pytest.raises(ValueError):
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
