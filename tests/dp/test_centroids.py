"""DP centroid descriptors: the sensitivity claim, utility, refusal, verification and the ledger entry."""
from __future__ import annotations

import dataclasses

import dp_accounting
import numpy as np
import pytest
from dp_accounting import rdp
from hypothesis import given, settings
from hypothesis import strategies as st

from dp.admission import admit
from dp.centroids import (SENSITIVITY, CentroidConfig, DescriptorRefused, DPCentroids, cluster_statistics,
                          initial_centres, rectified_linear_score)
from dp.ledger import Ledger, Observer, PrivacyUnit


def _unit_rows(rng, n, d):
    x = rng.normal(size=(n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 30), k=st.integers(1, 5), d=st.integers(1, 6),
       index=st.integers(0, 29))
def test_one_step_moves_by_at_most_the_sensitivity(seed, n, k, d, index):
    rng = np.random.default_rng(seed)
    x, centres = _unit_rows(rng, n, d), _unit_rows(rng, k, d)
    neighbour = x.copy()
    neighbour[index % n] = _unit_rows(rng, 1, d)[0]
    gap = np.linalg.norm(cluster_statistics(x, centres) - cluster_statistics(neighbour, centres))
    assert gap <= SENSITIVITY + 1e-9


def test_statistics_are_sums_and_counts():
    x = np.array([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])
    stats = cluster_statistics(x, np.eye(2))
    assert np.allclose(stats, [1.8, 0.6, 0.0, 1.0, 2, 1])


def test_public_parts_are_deterministic_and_seeded():
    a, b = DPCentroids(CentroidConfig(), dim=16), DPCentroids(CentroidConfig(), dim=16)
    c = DPCentroids(CentroidConfig(projection_seed=1), dim=16)
    assert np.array_equal(a.projection, b.projection) and np.array_equal(a.initial, b.initial)
    assert not np.array_equal(a.projection, c.projection) and not np.array_equal(a.initial, c.initial)
    assert np.allclose(np.linalg.norm(initial_centres(seed=0, centres=3, dim=5), axis=1), 1)


def test_utility_on_separated_clusters():
    rng = np.random.default_rng(0)
    dim, k = 64, 3
    directions = _unit_rows(rng, k, dim)
    docs = np.concatenate([directions[j] + 0.05 * rng.normal(size=(1500, dim)) for j in range(k)])
    config = CentroidConfig(epsilon=4.0, centres=k, iterations=3, projection_dim=16)
    mechanism = DPCentroids(config, dim=dim)
    released = mechanism.release(client_id=1, ledger=Ledger(), documents=docs)
    centres, counts = mechanism.unpack(released.payload)
    assert np.allclose(np.linalg.norm(centres, axis=1), 1)
    truth = directions @ mechanism.projection.T
    truth /= np.linalg.norm(truth, axis=1, keepdims=True)
    # every centre that holds documents points at a true cluster, and the noisy counts add up
    for centre, count in zip(centres, counts):
        if count > 100:
            assert np.max(truth @ centre) > 0.9
    assert abs(counts.sum() - len(docs)) < 100


def test_refusal_names_the_numbers():
    mechanism = DPCentroids(CentroidConfig(epsilon=1.0, centres=4, iterations=3), dim=8)
    with pytest.raises(DescriptorRefused, match=r"n=20 documents"):
        mechanism.release(client_id=1, ledger=(ledger := Ledger()), documents=np.ones((20, 8)))
    assert ledger.clients() == []                                    # nothing charged


def test_ledger_entry_recomputes_and_is_near_the_target():
    config = CentroidConfig(epsilon=2.0, iterations=3)
    mechanism = DPCentroids(config, dim=8)
    ledger = Ledger()
    released = mechanism.release(client_id=7, ledger=ledger, documents=np.random.default_rng(1).normal(size=(500, 8)),
                                 round_id=3, summary_key="descriptor0")
    z_eff = released.mechanism["noise_multiplier"]
    assert released.mechanism["sigma"] == pytest.approx(2 * z_eff * np.sqrt(3))
    # independent: one Gaussian at z_eff, replace-one sensitivity 2 (the multiplier is per that sensitivity)
    accountant = rdp.RdpAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(z_eff))
    independent = accountant.get_epsilon(1e-5)
    got = ledger.epsilon(7, unit="example", observer="server")
    assert got == pytest.approx(independent, rel=1e-6)
    assert 2.0 <= got <= 3.0                                         # RDP is a little looser than the analytic 2.0
    assert ledger.epsilon(7, unit="example", observer="outsider") == pytest.approx(got)


def test_verify_and_admission():
    mechanism = DPCentroids(CentroidConfig(), dim=8)
    released = mechanism.release(client_id=2, ledger=Ledger(), documents=np.random.default_rng(2).normal(size=(400, 8)),
                                 round_id=1, summary_key="descriptor1")
    record = released.record()
    server = Ledger()
    admitted = admit({"descriptor1": record}, specs={"descriptor1": mechanism}, client_id=2, round_id=1, ledger=server)
    assert np.array_equal(admitted["descriptor1"].payload, record.payload)
    assert server.epsilon(2, unit="example", observer="server") > 0
    tampered = {
        "epsilon": dict(record.mechanism, epsilon=8.0), "sigma": dict(record.mechanism, sigma=0.1),
        "name": dict(record.mechanism, name="jl_sketch_gaussian"), "count": dict(record.mechanism, n_documents=5),
        "missing count": dict(record.mechanism, n_documents=None),
    }
    # (the charge does not depend on the count; a count this run would have refused is refused)
    for what, mech in tampered.items():
        with pytest.raises(ValueError):
            mechanism.verify(dataclasses.replace(record, mechanism=mech))
    with pytest.raises(ValueError):
        mechanism.verify(dataclasses.replace(record, payload=record.payload[:-1]))
    with pytest.raises(ValueError):
        mechanism.verify(dataclasses.replace(record, unit=PrivacyUnit.CLIENT))
    other = DPCentroids(CentroidConfig(centres=3), dim=8)
    with pytest.raises(ValueError):
        other.verify(record)
    assert set(mechanism.verify(record)) == {Observer.SERVER, Observer.OUTSIDER}


def test_rectified_linear_score():
    a = np.array([[1.0, 0.0], [0.0, 1.0]])
    b = np.array([[1.0, 0.0], [np.cos(0.5), np.sin(0.5)], [-1.0, 0.0]])
    # cosines above 0.7: (a0,b0)=1, (a0,b1)=cos .5=.878; (a1,b1)=sin .5=.479 no; others <= 0
    assert rectified_linear_score(a, b) == pytest.approx((1 + np.cos(0.5)) / 6)
    assert rectified_linear_score(a, b, threshold=0.4) == pytest.approx((1 + np.cos(0.5) + np.sin(0.5)) / 6)
    assert rectified_linear_score(np.zeros((2, 2)), b) == 0.0
    with pytest.raises(ValueError):
        rectified_linear_score(a, np.ones((2, 3)))


@pytest.mark.parametrize("bad", [dict(unit="client"), dict(centres=0), dict(iterations=0), dict(projection_dim=0),
                                 dict(epsilon=0), dict(delta=1), dict(max_centroid_noise=0), dict(centres=2.0)])
def test_config_validation(bad):
    with pytest.raises(ValueError):
        CentroidConfig(**bad)


def test_documents_validation():
    mechanism = DPCentroids(CentroidConfig(), dim=4)
    for docs in (np.ones((3, 5)), np.full((300, 4), np.nan), np.zeros((300, 4)), np.ones(4)):
        with pytest.raises(ValueError):
            mechanism.release(client_id=1, ledger=Ledger(), documents=docs)
