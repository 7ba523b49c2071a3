"""dp.audit.faults: each deliberate fault breaks what it says, only inside its context, and the audit flags
it (lower bound above the claimed epsilon, 95%) in the configuration of the self-test (`dp.audit.selftest`)."""
import dataclasses
import math

import numpy as np
import pytest

from dp.audit.faults import FAULTS
from dp.audit.selftest import FAULT_TRIALS, Case, run_case
import dp.central as central
from dp.central import CentralDPConfig
from dp.distributed import DistributedDPConfig, DistributedDPEncoder
from dp.sampling import EveryoneSampler, PoissonSampler
from secagg.prg import CryptoRandom


def _encoder(mechanism="skellam", z=0.5, dim=256, min_clients=2):
    return DistributedDPEncoder.from_config(DistributedDPConfig(l2_clip=1.0, noise_multiplier=z, min_clients=min_clients,
                                                                expected_clients=4, mechanism=mechanism), dim=dim)


@pytest.mark.parametrize("mechanism", ["skellam", "discrete_gaussian"])
def test_noise_halved_quarters_each_shares_variance(mechanism):
    enc = _encoder(mechanism, dim=4096)
    rng = CryptoRandom(b"\x01" * 32)
    full = np.var(enc._noise(rng))
    with FAULTS["ddp_noise_halved"].patch():
        halved = np.var(enc._noise(rng))
    assert halved / full == pytest.approx(0.25, rel=0.1)
    assert np.var(enc._noise(rng)) / full == pytest.approx(1.0, rel=0.1)  # undone on exit


def test_a_missing_share_is_the_first_of_every_sum():
    enc = _encoder()
    rng = CryptoRandom(b"\x02" * 32)
    with FAULTS["noise_share_missing"].patch():
        assert not enc._noise(rng).any()  # the first member of the sum adds nothing
        assert enc._noise(rng).any()
        ring_sum = np.add.reduce(np.stack([enc.encode(np.zeros(256), round_seed=1) for _ in range(2)]), axis=0,
                                 dtype=np.uint32)
        enc.decode(ring_sum, round_seed=1, n_clients=2)  # the sum is opened: the next sum starts again
        assert not enc._noise(rng).any()
    assert enc._noise(rng).any()


def test_skipped_clipping_lets_an_update_beyond_the_clip_through():
    enc = _encoder(z=1e-4, min_clients=1)
    x = np.zeros(256)
    x[0] = 4.0  # 4 C
    with FAULTS["clipping_skipped"].patch():
        out = enc.decode(enc.encode(x, round_seed=3), round_seed=3, n_clients=1)
        assert np.linalg.norm(central.clip_l2(x, l2_clip=1.0)) == pytest.approx(4.0)  # central DP's client clip too
    assert out[0] == pytest.approx(4.0, abs=0.01)
    assert enc.decode(enc.encode(x, round_seed=3), round_seed=3, n_clients=1)[0] == pytest.approx(1.0, abs=0.01)
    assert np.linalg.norm(central.clip_l2(x, l2_clip=1.0)) == pytest.approx(1.0)


def test_a_client_counted_twice_is_listed_twice_by_every_sampler():
    with FAULTS["client_counted_twice"].patch():
        assert EveryoneSampler().sample([3, 1, 2]) == [1, 2, 3, 1]
        assert PoissonSampler(1.0).sample([5, 6]) == [5, 6, 5]
    assert EveryoneSampler().sample([3, 1, 2]) == [1, 2, 3]


def test_an_understated_sampling_rate_lowers_only_the_outsiders_claim():
    plan = _encoder().plan
    outsider, server = plan.epsilon(observer="outsider", rounds=1, delta=0.1), plan.epsilon(observer="server", rounds=1,
                                                                                           delta=0.1)
    trusted = CentralDPConfig(l2_clip=1.0, noise_multiplier=0.5)
    with FAULTS["sampling_rate_understated"].patch():
        assert plan.mechanism("outsider").sampling_rate == pytest.approx(0.1)
        assert plan.epsilon(observer="server", rounds=1, delta=0.1) == pytest.approx(server)
        assert plan.epsilon(observer="outsider", rounds=1, delta=0.1) < outsider / 3
        assert trusted.outsider_mechanism(0.5).sampling_rate == pytest.approx(0.1)
    assert plan.epsilon(observer="outsider", rounds=1, delta=0.1) == pytest.approx(outsider)
    assert dataclasses.is_dataclass(plan) and math.isfinite(outsider)


# The audit flags each fault (fewer trials than the self-test where the margin allows; the missing share,
# the subtlest fault, needs the self-test's 4000 trials and is in the slow test below).
SMALL_TRIALS = {"ddp_noise_halved": 300, "clipping_skipped": 100, "client_counted_twice": 600,
                "sampling_rate_understated": 300}


@pytest.mark.parametrize("fault", sorted(SMALL_TRIALS))
def test_each_fault_is_flagged(fault):
    result = run_case(Case(f"fault:{fault}", "ddp_skellam", fault, SMALL_TRIALS[fault], seed=11, noise_seed=11))
    assert result.flagged and result.epsilon_lower_bound > result.claimed_epsilon, result


def test_the_same_configuration_without_a_fault_is_not_flagged():
    result = run_case(Case("correct", "ddp_skellam", None, 300, seed=11, noise_seed=11))
    assert 0 < result.epsilon_lower_bound < result.claimed_epsilon and not result.flagged


@pytest.mark.slow
def test_a_missing_noise_share_is_flagged_with_the_self_tests_trials():
    result = run_case(Case("fault:noise_share_missing", "ddp_skellam", "noise_share_missing",
                           FAULT_TRIALS["noise_share_missing"], seed=12, noise_seed=12))
    assert result.flagged, result


def test_every_fault_of_the_suite_exists():
    assert set(FAULT_TRIALS) == set(FAULTS) and len(FAULTS) == 5
    with pytest.raises(KeyError, match="not_a_fault"):
        FAULTS["not_a_fault"]
