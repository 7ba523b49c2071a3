"""Central DP (trusted aggregator): clip, noise once on the sum; the server's view is non-private."""
import math

import dp_accounting
import numpy as np
import pytest

from dp.sampling import AmplificationNotJustified, SamplingRecord
from dp_accounting import rdp

from dp.central import CentralDPAggregator, CentralDPConfig
from dp.ledger import Ledger


def test_clip_bounds_norm_and_keeps_small_vectors():
    agg = CentralDPAggregator(CentralDPConfig(l2_clip=2.0, noise_multiplier=1.0))
    assert np.linalg.norm(agg.clip(np.full(100, 1.0))) == pytest.approx(2.0)
    small = np.full(4, 0.1)
    assert np.array_equal(agg.clip(small), small)
    assert np.linalg.norm(agg.clip(np.full(100, 1.0), weight=0.5)) == pytest.approx(2.0)


def test_target_epsilon_calibration_matches_dp_accounting():
    config = CentralDPConfig(l2_clip=1.0, target_epsilon=3.0, rounds=500, sampling_rate=0.01, delta=1e-6,
                             population=10_000)
    agg = CentralDPAggregator(config)
    acc = rdp.RdpAccountant()
    acc.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(agg.noise_multiplier)), 500))
    assert acc.get_epsilon(1e-6) == pytest.approx(3.0, abs=0.01)


def test_release_is_labelled_non_private_against_the_server():
    agg = CentralDPAggregator(CentralDPConfig(l2_clip=1.0, noise_multiplier=1.5, sampling_rate=0.5, population=8))
    ledger = Ledger()
    d, cohort = 20_000, [1, 2, 3, 4]
    xs = [agg.clip(np.random.default_rng(c).normal(size=d)) for c in cohort]
    with pytest.raises(AmplificationNotJustified,  # q = 0.5 claimed, no Poisson sampler recorded
                       match="claims Poisson amplification at q=0.5 but no sampler was recorded"):
        agg.release(np.sum(xs, axis=0), round_id=0, contributors=cohort, ledger=Ledger(), population=range(1, 9))
    released = agg.release(np.sum(xs, axis=0), round_id=0, contributors=cohort, ledger=ledger, population=range(1, 9),
                           sampling=SamplingRecord("poisson", 8, 0.5))
    assert released.mechanism["trusted_aggregator"] is True
    err = released.payload * 4 - np.sum(xs, axis=0)
    assert err.std() == pytest.approx(1.5, rel=0.03)
    assert ledger.epsilon(1, unit="client", observer="server") == math.inf
    assert ledger.epsilon(1, unit="client", observer="outsider") == pytest.approx(
        ledger.epsilon(8, unit="client", observer="outsider"))
    assert 0 < ledger.epsilon(8, unit="client", observer="outsider") < math.inf


def test_fixed_size_cohorts_calibrate_and_charge_the_without_replacement_bound():
    config = CentralDPConfig(l2_clip=1.0, target_epsilon=4.0, rounds=50, sampling_rate=0.1, population=200,
                             sampler="fixed_size", delta=1e-5)
    agg = CentralDPAggregator(config)
    assert config.sample_size == 20 and config.boundary_delta == 0.0
    acc = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.SampledWithoutReplacementDpEvent(
        200, 20, dp_accounting.GaussianDpEvent(agg.noise_multiplier / 2)), 50))  # replace-one: sensitivity 2C
    assert acc.get_epsilon(1e-5) == pytest.approx(4.0, abs=0.02)
    unamplified = CentralDPAggregator(CentralDPConfig(l2_clip=1.0, target_epsilon=4.0, rounds=50))
    assert agg.noise_multiplier < unamplified.noise_multiplier
    ledger, cohort, record = Ledger(), list(range(1, 21)), SamplingRecord("fixed_size", 200, 0.1)
    with pytest.raises(AmplificationNotJustified,  # a Poisson draw does not justify this bound
                       match=r"without replacement \(20 of 200\), but the cohort was drawn by the 'poisson'"):
        agg.charge_round(Ledger(), round_id=0, participants=cohort, population=range(1, 201),
                         sampling=SamplingRecord("poisson", 200, 0.1))
    for t in range(50):
        agg.charge_round(ledger, round_id=t, participants=cohort, population=range(1, 201), sampling=record)
    for c in (1, 150):
        assert ledger.epsilon(c, unit="client", observer="outsider") == pytest.approx(4.0, abs=0.02)
    assert ledger.epsilon(1, unit="client", observer="server") == math.inf


def test_invalid_central_configs_are_refused():
    one_of = "give exactly one of noise_multiplier and target_epsilon"
    for bad, message in ((dict(), one_of), (dict(noise_multiplier=1.0, target_epsilon=1.0), one_of),
                         (dict(noise_multiplier=1.0, sampling_rate=0.1), "sampling_rate < 1 needs the population"),
                         (dict(noise_multiplier=1.0, sampler="seeded"), "sampler is 'poisson' or 'fixed_size'"),
                         (dict(noise_multiplier=1.0, sampling_rate=0.1, population=205, sampler="fixed_size"),
                          "a fixed-size cohort is a whole number of clients: 0.1 x 205"),
                         (dict(noise_multiplier=1.0, l2_clip=0.0), "l2_clip must be positive")):
        with pytest.raises(ValueError, match=message):
            CentralDPConfig(**{"l2_clip": 1.0, **bad})
