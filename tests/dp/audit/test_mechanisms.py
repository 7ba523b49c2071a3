"""dp.audit.mechanisms: each mechanism releases the mean of its members' (clipped) vectors through the
project's own code, refuses sums below its floor, and reports its accountant's claim."""
import math

import numpy as np
import pytest

from dp.audit.mechanisms import ReleaseRefused, make_mechanism

DIM = 64


def _members(n, rng, norm=3.0):
    out = []
    for c in range(1, n + 1):
        g = rng.standard_normal(DIM)
        out.append((c, norm * g / np.linalg.norm(g)))
    return out


@pytest.mark.parametrize("kind", ["ddp_skellam", "ddp_dgauss", "central"])
def test_dp_mechanisms_release_the_mean_of_clipped_vectors_plus_noise(kind):
    rng = np.random.default_rng(0)
    mech = make_mechanism(kind, dim=DIM, noise_multiplier=1e-3, min_clients=2, expected_clients=4)
    members = _members(3, rng)
    clipped = np.mean([x / np.linalg.norm(x) for _, x in members], axis=0)  # clip C = 1
    released = mech.release(members, trial=0, round=1)
    np.testing.assert_allclose(released, clipped, atol=5e-3)


def test_noise_free_sums_are_exact_up_to_fixed_point():
    rng = np.random.default_rng(1)
    for kind in ("plaintext", "secagg"):
        mech = make_mechanism(kind, dim=DIM, min_clients=2, expected_clients=8)
        members = _members(5, rng, norm=1.0)
        np.testing.assert_allclose(mech.release(members, trial=0, round=1), np.mean([x for _, x in members], axis=0),
                                   atol=1e-6)
        assert mech.claimed_epsilon(rounds=3, delta=1e-5) == math.inf


def test_sums_below_the_floor_are_refused():
    rng = np.random.default_rng(2)
    for kind in ("ddp_skellam", "central", "secagg"):
        mech = make_mechanism(kind, dim=DIM, noise_multiplier=1.0, min_clients=3, expected_clients=4)
        with pytest.raises(ReleaseRefused, match="floor|min_release_group"):
            mech.release(_members(2, rng), trial=0, round=1)
    ddp = make_mechanism("ddp_skellam", dim=DIM, noise_multiplier=1.0, min_clients=2, expected_clients=3)
    with pytest.raises(ReleaseRefused, match="expected_clients=3"):
        ddp.release(_members(4, rng), trial=0, round=1)


def test_claims_are_the_accountants():
    ddp = make_mechanism("ddp_skellam", dim=DIM, noise_multiplier=0.5, min_clients=2, expected_clients=4)
    assert ddp.claimed_epsilon(rounds=2, delta=0.1) == pytest.approx(
        ddp.encoder.plan.epsilon(observer="outsider", rounds=2, delta=0.1))
    central = make_mechanism("central", dim=DIM, noise_multiplier=0.5)
    from dp.ledger import GaussianMechanism, compose_epsilon

    assert central.claimed_epsilon(rounds=1, delta=0.1) == pytest.approx(
        compose_epsilon([(GaussianMechanism(noise_multiplier=0.5), 1)], delta=0.1))
    assert ddp.claimed_epsilon(rounds=1, delta=0.1) == pytest.approx(central.claimed_epsilon(rounds=1, delta=0.1), rel=0.01)
    target = make_mechanism("ddp_dgauss", dim=DIM, target_epsilon=2.0, rounds=3, min_clients=2, expected_clients=4)
    assert target.claimed_epsilon(rounds=3, delta=1e-5) == pytest.approx(2.0, abs=1e-3)
    with pytest.raises(ValueError, match="mechanism is one of"):
        make_mechanism("laplace", dim=DIM)


def test_the_exact_noise_mechanism_releases_the_target_noise_whatever_the_member_count():
    """XNoise through the audit's DDP mechanism: the released mean's error has the target variance at
    every member count from the floor up (floor-sized noise would grow with the count)."""
    import dataclasses

    from dp.audit.mechanisms import DistributedDP
    from dp.distributed import DistributedDPConfig

    dim, n_min = 4096, 4
    config = DistributedDPConfig(l2_clip=1.0, noise_multiplier=1.0, expected_clients=8, min_clients=n_min, bits=20,
                                 exact_noise=True)
    rng = np.random.default_rng(2)
    for exact in (True, False):
        mech = DistributedDP(config=dataclasses.replace(config, exact_noise=exact), dim=dim, noise_seed=5)
        for n in (4, 6, 8):
            members = [(c, 0.01 * rng.standard_normal(dim)) for c in range(1, n + 1)]
            err = (mech.release(members, trial=0, round=n) - np.mean([x for _, x in members], axis=0)) * n
            expected = 1.0 if exact else n / n_min  # (z C)^2 = 1 over the sum
            assert err.var() == pytest.approx(expected, rel=0.1)  # 4,096 coordinates: 2.2% relative stddev
