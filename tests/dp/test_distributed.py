"""Distributed DP: planning, the noise of the summed encodings, decoding, accounting, dropouts."""
import math

import dp_accounting
import numpy as np
import pytest

from dp.sampling import AmplificationNotJustified, SamplingRecord
from dp_accounting import rdp
from hypothesis import given, settings
from hypothesis import strategies as st

from dp.distributed import (DistributedDPConfig, DistributedDPEncoder, InsufficientNoiseError, PlanningError,
                            TooManyClientsError, plan_distributed_dp)
from dp.ledger import Ledger, LedgerConfig, Observer
from dp.released import Released
from dp.samplers import CryptoRandom
from secagg.ring import FIELD_P31, RING_2_32


def seeded_factory(start: int = 0):
    """Reproducible per-call streams (tests only; production keys come from os.urandom)."""
    counter = iter(range(start, start + 10**6))
    return lambda: CryptoRandom(next(counter).to_bytes(32, "big"))


def ring_sum(ring, vectors):
    acc = np.zeros_like(vectors[0])
    for v in vectors:
        ring.add_(acc, v)
    return acc


@pytest.mark.parametrize("n,bits,beta,scale,eps", [
    (100, 12, 0.0, 524, 19.0), (100, 14, math.exp(-0.5), 2096, 5.40), (100, 16, math.exp(-0.5), 8383, 5.23),
    (1000, 16, math.exp(-0.5), 6026, 5.25), (1000, 20, 0.0, 96411, 5.29)])
def test_plan_reproduces_the_reference_table(n, bits, beta, scale, eps):
    """research/dp_leakage.md Sec. 2.2: d = 2^20, z = 1, delta = 1e-6, one release."""
    config = DistributedDPConfig(l2_clip=1.0, noise_multiplier=1.0, expected_clients=n, bits=bits, beta=beta,
                                 delta=1e-6)
    plan = plan_distributed_dp(config, dim=2**20)
    assert plan.scale == pytest.approx(scale, abs=1)
    assert plan.epsilon(observer="server", rounds=1) == pytest.approx(eps, rel=0.005)


@pytest.mark.parametrize("ring,mechanism", [(RING_2_32, "skellam"), (RING_2_32, "discrete_gaussian"),
                                            (FIELD_P31, "skellam"), (FIELD_P31, "discrete_gaussian")])
def test_summed_noise_has_the_calibrated_variance_and_decodes(ring, mechanism):
    n, dim, z, clip = 20, 4000, 1.0, 1.0
    config = DistributedDPConfig(l2_clip=clip, noise_multiplier=z, expected_clients=n, bits=16, mechanism=mechanism)
    encoder = DistributedDPEncoder(plan_distributed_dp(config, dim=dim, ring=ring), rng_factory=seeded_factory())
    xs = np.random.default_rng(1).normal(size=(n, dim))
    xs *= 0.8 / np.linalg.norm(xs, axis=1, keepdims=True)
    uploads = [encoder.encode(x, round_seed=b"round-5") for x in xs]
    assert all(u.dtype == np.uint32 and u.shape == (encoder.length,) for u in uploads)
    total = ring_sum(ring, uploads)
    mean = encoder.decode(total, round_seed=b"round-5", n_clients=n)
    error_of_sum = (mean - xs.mean(axis=0)) * n
    # n clients x sigma_local^2 = (z C)^2; rounding adds at most n / (4 s^2), negligible here.
    expected_var = (z * clip) ** 2 + n / (4 * encoder.plan.scale**2)
    assert error_of_sum.var() / expected_var == pytest.approx(1.0, abs=0.1)
    assert abs(error_of_sum.mean()) < 5 * math.sqrt(expected_var / dim)
    assert np.max(np.abs(mean - xs.mean(axis=0))) < 5.5 * z * clip / n


def test_reduction_mod_2_to_the_bits_is_consistent_with_sums_mod_2_to_the_32():
    config = DistributedDPConfig(l2_clip=1.0, noise_multiplier=0.5, expected_clients=8, bits=12)
    encoder = DistributedDPEncoder(plan_distributed_dp(config, dim=100), rng_factory=seeded_factory(50))
    xs = np.random.default_rng(2).normal(size=(8, 100)) * 0.05
    uploads = [encoder.encode(x, round_seed=3) for x in xs]
    assert max(int(u.max()) for u in uploads) < 2**12
    total = ring_sum(RING_2_32, uploads)  # entries grow past 2^12: decoding reduces mod 2^12
    assert int(total.max()) >= 2**12
    mean = encoder.decode(total, round_seed=3, n_clients=8)
    assert np.max(np.abs(mean - xs.mean(axis=0))) < 6 * 0.5 / 8


@settings(max_examples=20, deadline=None)
@given(n=st.integers(2, 12), dim=st.integers(1, 300), seed=st.integers(0, 2**32),
       weight=st.floats(0.1, 1.0), prime=st.booleans())
def test_low_noise_round_trip_recovers_the_weighted_mean(n, dim, seed, weight, prime):
    ring = FIELD_P31 if prime else RING_2_32
    config = DistributedDPConfig(l2_clip=2.0, noise_multiplier=0.01, expected_clients=n, bits=24)
    encoder = DistributedDPEncoder(plan_distributed_dp(config, dim=dim, ring=ring), rng_factory=seeded_factory(seed))
    xs = np.random.default_rng(seed).normal(size=(n, dim))
    xs /= np.maximum(1.0, np.linalg.norm(xs, axis=1, keepdims=True))  # inside the clip: no clipping bias
    total = ring_sum(ring, [encoder.encode(x, round_seed=seed, weight=weight) for x in xs])
    mean = encoder.decode(total, round_seed=seed, n_clients=n, total_weight=n * weight)
    assert np.max(np.abs(mean - xs.mean(axis=0))) < 6 * 0.01 * 2.0 / (n * weight) + 1e-6


def test_clipping_and_conditional_rounding_bound():
    config = DistributedDPConfig(l2_clip=0.5, noise_multiplier=1.0, expected_clients=10, bits=16)
    encoder = DistributedDPEncoder.from_config(config, dim=1000)
    x = np.full(1000, 3.0)
    _, report = encoder.encode_with_report(x, round_seed=1)
    assert report.clipped and report.norm == pytest.approx(3.0 * math.sqrt(1000))
    assert report.rounding_attempts >= 1 and report.wrapped == 0
    y = np.random.default_rng(0).normal(size=encoder.length)
    y *= 0.5 * encoder.plan.scale / np.linalg.norm(y)
    r, _ = encoder._conditional_round(y, CryptoRandom())
    assert np.linalg.norm(r) <= encoder.plan.rounding_threshold
    assert np.all(np.abs(r - y) < 1)


def test_target_epsilon_is_met_tightly():
    # Poisson cohorts of mean 100 out of 2,000; noise calibrated to a floor of 40 (the boundary delta of
    # 200 rounds, P[Bin(1999, 0.05) = 39] each, is ~1e-9: negligible next to delta).
    config = DistributedDPConfig(l2_clip=1.0, target_epsilon=6.0, expected_clients=100, min_clients=40, bits=16,
                                 rounds=200, sampling_rate=0.05, population=2000, delta=1e-5)
    plan = plan_distributed_dp(config, dim=10_000)
    eps = plan.epsilon(observer="outsider", rounds=200)
    assert 5.9 < eps <= 6.0
    # The continuous Gaussian at the same z is better, mostly because subsampling is accounted with
    # Zhu-Wang's general bound (dp_accounting's exact Gaussian analysis does not apply to Skellam).
    acc = rdp.RdpAccountant()
    acc.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.05, dp_accounting.GaussianDpEvent(plan.noise_multiplier)), 200))
    assert acc.get_epsilon(1e-5) < eps < 1.35 * acc.get_epsilon(1e-5)


def test_unreachable_targets_and_small_rings_are_refused():
    with pytest.raises(PlanningError, match=r"bits=8 < log2\(expected_clients=1000\)"):
        plan_distributed_dp(DistributedDPConfig(l2_clip=1.0, noise_multiplier=1.0, expected_clients=1000, bits=8),
                            dim=100)
    with pytest.raises(PlanningError, match="unreachable"):
        plan_distributed_dp(DistributedDPConfig(l2_clip=1.0, target_epsilon=0.01, expected_clients=100, bits=8),
                            dim=2**16)


def test_dropout_margin_calibrates_to_survivors_and_refuses_fewer():
    config = DistributedDPConfig(l2_clip=1.0, noise_multiplier=1.0, expected_clients=10, min_clients=8, bits=16)
    encoder = DistributedDPEncoder.from_config(config, dim=64)
    assert encoder.plan.local_stddev == pytest.approx(1.0 / math.sqrt(8))
    uploads = [encoder.encode(np.zeros(64), round_seed=0) for _ in range(7)]
    with pytest.raises(InsufficientNoiseError, match="7 contributors < min_clients=8"):
        encoder.decode(ring_sum(RING_2_32, uploads), round_seed=0, n_clients=7)


def test_the_protocol_floor_is_the_calibrated_survivor_count():
    config = DistributedDPConfig(l2_clip=1.0, noise_multiplier=1.0, expected_clients=10, min_clients=8, bits=16)
    assert config.protocol_floor() == 8
    assert DistributedDPConfig(l2_clip=1.0, noise_multiplier=1.0, expected_clients=10).protocol_floor() == 10
    assert DistributedDPConfig(l2_clip=1.0, noise_multiplier=1.0, expected_clients=3,
                               min_clients=1).protocol_floor() == 2  # a secure sum has two members at least
    for n in (1, 8, 10):
        config.check_cohort(n)
    with pytest.raises(TooManyClientsError, match="11 members exceeds distributed_dp expected_clients=10"):
        config.check_cohort(11)


def test_more_contributors_than_the_ring_was_sized_for_are_refused_before_any_charge():
    config = DistributedDPConfig(l2_clip=1.0, noise_multiplier=1.0, expected_clients=4, bits=16)
    encoder = DistributedDPEncoder.from_config(config, dim=16)
    total = ring_sum(RING_2_32, [encoder.encode(np.zeros(16), round_seed=0) for _ in range(5)])
    with pytest.raises(TooManyClientsError, match="5 contributors > expected_clients=4"):
        encoder.decode(total, round_seed=0, n_clients=5)
    ledger = Ledger()
    with pytest.raises(TooManyClientsError, match="5 contributors > expected_clients=4"):
        encoder.release(total, round_seed=0, round_id=0, contributors=range(1, 6), ledger=ledger)
    with pytest.raises(InsufficientNoiseError, match="3 contributors < min_clients=4"):
        encoder.release(total, round_seed=0, round_id=0, contributors=range(1, 4), ledger=ledger)
    assert ledger.state_dict() == Ledger().state_dict()  # nothing charged for a refused release


def test_release_charges_server_and_outsiders():
    # A population of 10 at q = 0.5 with a floor of 2: each round adds P[Bin(9, 0.5) = 1] = 0.018 to
    # delta (dp.sampling), so this toy runs at delta = 0.1; realistic populations make the term negligible.
    config = DistributedDPConfig(l2_clip=1.0, noise_multiplier=1.2, expected_clients=5, min_clients=2, bits=16,
                                 sampling_rate=0.5, population=10, delta=0.1)
    encoder = DistributedDPEncoder.from_config(config, dim=32)
    ledger = Ledger(LedgerConfig(delta=0.1))
    population = range(1, 11)
    for round_id, cohort in enumerate([(1, 2, 3, 4, 5), (1, 2, 6, 7, 8), (1, 3, 6, 9, 10)]):
        total = ring_sum(RING_2_32, [encoder.encode(np.ones(32) * 0.1, round_seed=round_id) for _ in cohort])
        released = encoder.release(total, round_seed=round_id, round_id=round_id, contributors=cohort,
                                   ledger=ledger, population=population,
                                   sampling=SamplingRecord("poisson", 10, 0.5, min_cohort=2))
        assert isinstance(released, Released) and released.contributors == frozenset(cohort)
        assert not released.payload.flags.writeable
    plan = encoder.plan
    assert ledger.epsilon(1, unit="client", observer="server") == pytest.approx(
        plan.epsilon(observer=Observer.SERVER, rounds=3))
    assert ledger.epsilon(4, unit="client", observer="server") == pytest.approx(
        plan.epsilon(observer=Observer.SERVER, rounds=1))
    # Everyone in the population pays the amplified price every round, sampled or not.
    outsider = [ledger.epsilon(c, unit="client", observer="outsider") for c in population]
    assert outsider == pytest.approx([plan.epsilon(observer=Observer.OUTSIDER, rounds=3)] * 10)
    assert outsider[0] < ledger.epsilon(1, unit="client", observer="server")
    with pytest.raises(ValueError, match="population"):
        encoder.charge_round(ledger, round_id=9, participants=[1, 2, 3, 4, 5])
    for record in (None, SamplingRecord("seeded", 10, 0.5)):  # amplification the sampler does not give
        with pytest.raises(AmplificationNotJustified, match="claims Poisson amplification at q=0.5(,| but no sampler was recorded)"):
            encoder.charge_round(Ledger(), round_id=9, participants=[1, 2], population=population, sampling=record)


def test_malformed_inputs_are_rejected():
    encoder = DistributedDPEncoder.from_config(
        DistributedDPConfig(l2_clip=1.0, noise_multiplier=1.0, expected_clients=4, bits=16), dim=10)
    with pytest.raises(ValueError, match="expected a flat vector of length 10"):
        encoder.encode(np.zeros(11), round_seed=0)
    with pytest.raises(ValueError, match="NaN or infinity"):
        encoder.encode(np.full(10, np.nan), round_seed=0)
    with pytest.raises(ValueError, match=r"weight must be in \[0, 1\]"):
        encoder.encode(np.zeros(10), round_seed=0, weight=1.5)
    with pytest.raises(ValueError, match="ring vectors are one-dimensional uint32 arrays"):
        encoder.decode(np.zeros(16, dtype=np.int64), round_seed=0, n_clients=4)
    with pytest.raises(ValueError, match="give exactly one of noise_multiplier and target_epsilon"):
        DistributedDPConfig(l2_clip=1.0, expected_clients=4)  # neither z nor a target


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([1 << 8, 1 << 16, 1 << 31, 1 << 32, FIELD_P31.modulus, 12289]),
       st.lists(st.integers(min_value=-(1 << 62), max_value=(1 << 62)), min_size=1, max_size=40))
def test_reduction_into_the_ring_equals_the_true_residue(modulus, values):
    """The encoder's reduction (a mask for powers of two, np.mod otherwise), with or without `out`."""
    from types import SimpleNamespace

    encoder = SimpleNamespace(plan=SimpleNamespace(modulus=modulus))
    r = np.array(values, dtype=np.int64)
    want = np.array([v % modulus for v in values], dtype=np.uint32)
    assert np.array_equal(DistributedDPEncoder._reduce(encoder, r), want)
    out = np.full(r.shape, 7, dtype=np.uint32)
    assert DistributedDPEncoder._reduce(encoder, r, out=out) is out and np.array_equal(out, want)
