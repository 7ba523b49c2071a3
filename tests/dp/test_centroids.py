"""DP centroid descriptors: sensitivity, utility, refusal, verification, the ledger entry, the SIT score."""
import dataclasses
import json
import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import pld, rdp
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from dp.admission import ReleaseRejected, admit
from dp.centroids import (MECHANISM_NAME, SENSITIVITY, CentroidConfig, DescriptorRefused, DPCentroids,
                          centres_from_statistics, cluster_statistics, initial_centres, rectified_linear_score)
from dp.ledger import GaussianMechanism, Ledger, Observer, PrivacyUnit
from dp.sketches import projection_matrix


def unit_rows(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    x = rng.normal(size=(n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


# ---- config ------------------------------------------------------------------------------------

def test_client_level_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="example-level only.*whole data"):
        CentroidConfig(unit=PrivacyUnit.CLIENT)
    with pytest.raises(ValueError, match="example-level only"):
        CentroidConfig(unit="client")


RANGES = "need epsilon > 0, 0 < delta < 1 and max_centroid_noise > 0"


@pytest.mark.parametrize(("bad", "message"), [
    (dict(centres=0), "centres must be a positive int"), (dict(centres=2.0), "centres must be a positive int"),
    (dict(centres=True), "centres must be a positive int"), (dict(iterations=0), "iterations must be a positive int"),
    (dict(iterations=-1), "iterations must be a positive int"),
    (dict(projection_dim=0), "projection_dim must be a positive int"),
    (dict(projection_dim="8"), "projection_dim must be a positive int"), (dict(epsilon=0), RANGES),
    (dict(epsilon=-1.0), RANGES), (dict(epsilon=math.inf), "epsilon must be a finite real number"),
    (dict(epsilon=math.nan), "epsilon must be a finite real number"),
    (dict(epsilon="2"), "epsilon must be a finite real number"), (dict(delta=0), RANGES), (dict(delta=1), RANGES),
    (dict(delta=1.5), RANGES), (dict(max_centroid_noise=0), RANGES), (dict(max_centroid_noise=-0.1), RANGES),
    (dict(projection_seed=-1), "projection_seed: round seeds are bytes or non-negative ints"),
    (dict(projection_seed="seed"), "projection_seed: round seeds are bytes or non-negative ints"),
    (dict(unit="user"), "'user' is not a valid PrivacyUnit"),
])
def test_config_validation(bad, message):
    with pytest.raises(ValueError, match=message):
        CentroidConfig(**bad)


def test_config_defaults_and_normalisation():
    c = CentroidConfig()
    assert (c.epsilon, c.delta, c.centres, c.iterations, c.projection_dim, c.max_centroid_noise, c.unit) == (
        4.0, 1e-5, 2, 2, 32, 0.5, PrivacyUnit.EXAMPLE)
    c = CentroidConfig(epsilon=3, centres=np.int64(2))
    assert type(c.epsilon) is float and type(c.centres) is int
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'epsilon'"):
        c.epsilon = 1.0
    for dim in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="dim must be a positive int"):
            DPCentroids(CentroidConfig(epsilon=2.0, centres=4, iterations=3), dim=dim)


# ---- public parts ------------------------------------------------------------------------------

def test_public_projection_and_initial_centres_are_deterministic_and_seeded():
    a, b = DPCentroids(CentroidConfig(epsilon=2.0, centres=4, iterations=3), dim=16), DPCentroids(CentroidConfig(epsilon=2.0, centres=4, iterations=3), dim=16)
    c = DPCentroids(CentroidConfig(projection_seed=1), dim=16)
    assert np.array_equal(a.projection, b.projection) and np.array_equal(a.initial, b.initial)
    assert not np.array_equal(a.projection, c.projection) and not np.array_equal(a.initial, c.initial)
    assert np.array_equal(a.projection, projection_matrix(seed=0, sketch_dim=32, dim=16))
    assert a.projection.shape == (32, 16) and a.initial.shape == (4, 32)
    assert np.allclose(np.linalg.norm(a.initial, axis=1), 1.0)
    assert np.array_equal(a.initial, initial_centres(seed=0, centres=4, dim=32))
    assert np.array_equal(initial_centres(seed=b"\x07", centres=3, dim=5), initial_centres(seed=7, centres=3, dim=5))
    assert not a.projection.flags.writeable and not a.initial.flags.writeable
    # the initial centres come from their own domain string, not from the projection's stream
    projection_stream = projection_matrix(seed=0, sketch_dim=1, dim=4 * 32).reshape(4, 32)
    projection_stream /= np.linalg.norm(projection_stream, axis=1, keepdims=True)
    assert not np.allclose(a.initial, projection_stream)


def test_describe_is_json_and_public():
    d = DPCentroids(CentroidConfig(epsilon=2.0, centres=4, iterations=3, projection_seed=258), dim=16).describe()
    assert json.loads(json.dumps(d)) == d
    assert d == {"mechanism": MECHANISM_NAME, "epsilon": 2.0, "delta": 1e-5, "unit": "example", "centres": 4,
                 "iterations": 3, "projection_dim": 32, "dim": 16, "max_centroid_noise": 0.5,
                 "projection_seed": "0102"}


# ---- one step: statistics and sensitivity ------------------------------------------------------

def test_statistics_are_sums_and_counts():
    x = np.array([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])
    assert np.allclose(cluster_statistics(x, np.eye(2)), [1.8, 0.6, 0.0, 1.0, 2, 1])
    assert np.allclose(cluster_statistics(x, np.eye(2)[:1]), [1.8, 1.6, 3])
    with pytest.raises(ValueError, match=r"need rows \(n, p\) and centres \(k, p\)"):
        cluster_statistics(x, np.eye(3))


unit_vectors = arrays(np.float64, 4, elements=st.floats(-1, 1, allow_nan=False)).filter(
    lambda v: np.linalg.norm(v) > 1e-3).map(lambda v: v / np.linalg.norm(v))


@settings(max_examples=150, deadline=None)
@given(rows=st.lists(unit_vectors, min_size=1, max_size=12), centres=st.lists(unit_vectors, min_size=1, max_size=4),
       replacement=unit_vectors, index=st.integers(0, 11))
def test_replacing_one_row_moves_the_statistics_by_at_most_2(rows, centres, replacement, index):
    x, mu = np.array(rows), np.array(centres)
    neighbour = x.copy()
    neighbour[index % len(rows)] = replacement
    gap = np.linalg.norm(cluster_statistics(x, mu) - cluster_statistics(neighbour, mu))
    assert gap <= SENSITIVITY + 1e-9


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 40), k=st.integers(2, 6), p=st.integers(2, 16))
def test_sensitivity_is_attained_by_an_opposite_row_in_another_cluster(seed, n, k, p):
    rng = np.random.default_rng(seed)
    x, mu = unit_rows(rng, n, p), unit_rows(rng, k, p)
    neighbour = x.copy()
    neighbour[0] = -x[0]
    a, b = np.argmax(mu @ x[0]), np.argmax(mu @ -x[0])
    assume(a != b)
    gap = np.linalg.norm(cluster_statistics(x, mu) - cluster_statistics(neighbour, mu))
    assert gap == pytest.approx(SENSITIVITY)


def test_centres_from_statistics_normalises_and_keeps_a_centre_whose_noisy_sum_vanishes():
    previous = np.array([[1.0, 0.0], [0.0, 1.0]])
    centres, counts = centres_from_statistics(np.array([3.0, 4.0, 0.0, 0.0, 5.2, -0.3]), previous)
    assert np.allclose(centres, [[0.6, 0.8], [0.0, 1.0]]) and np.allclose(counts, [5.2, -0.3])
    with pytest.raises(ValueError, match="expected 6 statistics for 2 centres in 2 dimensions"):
        centres_from_statistics(np.zeros(5), previous)


# ---- releases ----------------------------------------------------------------------------------

def separated_documents(mechanism: DPCentroids, per_cluster: int, seed: int,
                        noise_seed: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Documents around k well-separated directions in R^dim, and the labels.

    Lloyd steps from a data-independent start find only clusters that the start separates, so each
    true direction is built to project at cosine 0.6 to a different public initial centre (and ~0.1
    to the others): the steps must move each centre from cosine 0.6 to its cluster."""
    rng = np.random.default_rng(seed)
    mu0 = np.array(mechanism.initial)
    k, p = mu0.shape
    basis = np.linalg.qr(mu0.T)[0]                                   # span of the initial centres
    r = rng.normal(size=(k, p))
    r -= r @ basis @ basis.T                                         # orthogonal to every initial centre
    r /= np.linalg.norm(r, axis=1, keepdims=True)
    targets = 0.6 * mu0 + 0.8 * r                                    # unit rows in R^p
    directions = targets @ np.linalg.pinv(mechanism.projection).T    # P d_j = t_j exactly
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    noise_rng = rng if noise_seed is None else np.random.default_rng(noise_seed)
    noise = 0.05 * noise_rng.normal(size=(k, per_cluster, mechanism.dim))
    docs = (directions[:, None, :] + noise).reshape(k * per_cluster, mechanism.dim)
    return docs, np.repeat(np.arange(k), per_cluster)


def test_payload_shape_unit_centres_and_description():
    mechanism = DPCentroids(CentroidConfig(epsilon=2.0, centres=4, iterations=3), dim=24)
    docs = np.random.default_rng(3).normal(size=(600, 24))
    released = mechanism.release(client_id=5, ledger=Ledger(), documents=docs, round_id=2)
    payload = released.payload
    assert payload.shape == (4 * 32 + 4,) and payload.dtype == np.float64 and np.all(np.isfinite(payload))
    centres, counts = mechanism.unpack(payload)
    assert centres.shape == (4, 32) and counts.shape == (4,)
    assert np.allclose(np.linalg.norm(centres, axis=1), 1.0)
    assert abs(counts.sum() - 600) < 8 * 2 * released.mechanism["sigma"]
    m = dict(released.mechanism)
    assert set(m) == {"name", "epsilon", "delta", "centres", "iterations", "projection_dim", "sigma",
                      "noise_multiplier", "sensitivity", "n_documents"}
    assert m["name"] == MECHANISM_NAME and m["n_documents"] == 600 and m["sensitivity"] == 2.0
    assert all(type(m[key]) is float for key in ("epsilon", "delta", "sigma", "noise_multiplier", "sensitivity"))
    assert all(type(m[key]) is int for key in ("centres", "iterations", "projection_dim", "n_documents"))
    z_eff = dp_accounting.get_sigma_gaussian(2.0, 1e-5)
    assert m["noise_multiplier"] == pytest.approx(z_eff) and m["sigma"] == pytest.approx(2 * z_eff * math.sqrt(3))
    assert released.unit is PrivacyUnit.EXAMPLE and released.contributors == {5} and released.round_id == 2
    assert released.summary_key == "descriptor"
    with pytest.raises(ValueError, match="a descriptor is a vector of 132 values"):
        mechanism.unpack(payload[:-1])


def test_utility_on_well_separated_clusters():
    dim, k = 64, 4
    mechanism = DPCentroids(CentroidConfig(epsilon=4.0, centres=k, iterations=3, projection_dim=32), dim=dim)
    docs, labels = separated_documents(mechanism, 1000, seed=0)
    x = mechanism.project(docs)
    truth = np.array([x[labels == j].mean(axis=0) for j in range(k)])
    truth /= np.linalg.norm(truth, axis=1, keepdims=True)
    assert np.max(truth @ mechanism.initial.T) < 0.7                  # the start is not already there
    released = mechanism.release(client_id=1, ledger=Ledger(), documents=docs)
    centres, counts = mechanism.unpack(released.payload)
    cosines = centres @ truth.T
    assert np.all(cosines.max(axis=1) > 0.9), cosines
    assert sorted(cosines.argmax(axis=1)) == list(range(k))           # one centre per cluster
    assert np.allclose(counts, 1000, atol=60)                          # noisy counts near n / k


def test_noise_on_the_counts_has_the_calibrated_scale():
    mechanism = DPCentroids(CentroidConfig(centres=2, projection_dim=8), dim=8)
    docs = np.tile(np.arange(1.0, 9.0), (400, 1))                     # all documents equal: n at one centre
    e = mechanism.project(docs[:1])[0]
    deviations = []
    for _ in range(60):
        released = mechanism.release(client_id=1, ledger=Ledger(), documents=docs)
        centres, counts = mechanism.unpack(released.payload)
        holder = np.argmax(centres @ e)
        assert centres[holder] @ e > 0.99
        deviations.append(counts - 400 * (np.arange(2) == holder))
    sigma = released.mechanism["sigma"]
    assert np.std(deviations) == pytest.approx(sigma, rel=0.25)
    assert abs(np.mean(deviations)) < 4 * sigma / np.sqrt(120)


def test_documents_are_validated():
    mechanism = DPCentroids(CentroidConfig(epsilon=2.0, centres=4, iterations=3), dim=64)
    docs = np.random.default_rng(0).normal(size=(400, 64))
    null = np.random.default_rng(1).normal(size=64)
    null -= np.linalg.pinv(mechanism.projection) @ (mechanism.projection @ null)   # P null ~ 0
    shape = r"documents must be an \(n, 64\) array with n >= 1"
    bad = [(np.ones((400, 63)), shape), (np.ones(64), shape), (np.ones((0, 64)), shape),
           (np.ones((400, 64, 1)), shape), (np.vstack([docs[:-1], np.full(64, np.nan)]), "documents must be finite"),
           (np.vstack([docs[:-1], np.full(64, np.inf)]), "documents must be finite"),
           (np.vstack([docs[:-1], np.zeros(64)]), "documents must be non-zero rows"),
           (np.vstack([docs[:-1], null]), "a document projects to zero")]
    ledger = Ledger()
    for documents, message in bad:
        with pytest.raises(ValueError, match=message):
            mechanism.release(client_id=1, ledger=ledger, documents=documents)
    assert ledger.clients() == []                                      # nothing charged


def test_small_collections_are_refused_with_the_numbers_before_the_documents_are_used():
    mechanism = DPCentroids(CentroidConfig(epsilon=1.0, centres=4, iterations=3), dim=8)
    plan_sigma = 2 * dp_accounting.get_sigma_gaussian(1.0, 1e-5) * math.sqrt(3)
    expected = plan_sigma * math.sqrt(32) * 4 / 20
    ledger = Ledger()
    with pytest.raises(DescriptorRefused, match="refusing the descriptor") as info:
        mechanism.release(client_id=1, ledger=ledger, documents=np.full((20, 8), np.nan))  # refused on n alone
    message = str(info.value)
    for part in ("epsilon=1.0", "n=20 documents", "k=4", "p=32", "T=3", f"sigma={plan_sigma:.4g}",
                 f"about {expected:.4g} > max_centroid_noise=0.5"):
        assert part in message, (part, message)
    assert ledger.clients() == []
    assert isinstance(info.value, ValueError)
    plan = mechanism.plan(n_documents=5000)
    assert plan.centroid_noise == pytest.approx(plan_sigma * math.sqrt(32) * 4 / 5000)
    assert plan.sensitivity == 2.0 and plan.sigma == pytest.approx(2 * plan.per_iteration_multiplier)
    assert plan.per_iteration_multiplier == pytest.approx(plan.noise_multiplier * math.sqrt(3))
    for n in (0, -1, 2.0, True, None):
        with pytest.raises(ValueError, match="need a positive int document count"):
            mechanism.plan(n_documents=n)


# ---- the ledger --------------------------------------------------------------------------------

def test_ledger_entry_recomputes_independently_and_is_near_the_target():
    mechanism = DPCentroids(CentroidConfig(epsilon=2.0, iterations=3), dim=8)
    ledger = Ledger()
    released = mechanism.release(client_id=7, ledger=ledger, documents=np.random.default_rng(1).normal(size=(500, 8)),
                                 round_id=3, summary_key="descriptor-0")
    z_eff = released.mechanism["noise_multiplier"]
    z = released.mechanism["sigma"] / released.mechanism["sensitivity"]
    entries = ledger.entries(7)
    assert len(entries) == 2 and {e.observer for e in entries} == {Observer.SERVER, Observer.OUTSIDER}
    for e in entries:
        assert e.mechanism == GaussianMechanism(noise_multiplier=z_eff, sensitivity=2.0, neighbouring="replace_one")
        assert (e.unit, e.summary_key, e.count, e.rounds) == (PrivacyUnit.EXAMPLE, "descriptor-0", 1, (3,))
    assert {(c.observer, c.round_id) for c in released.charges} == {(Observer.SERVER, 3), (Observer.OUTSIDER, 3)}
    # independent: RDP of one Gaussian at z_eff ...
    accountant = rdp.RdpAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(z_eff))
    independent = accountant.get_epsilon(1e-5)
    got = ledger.epsilon(7, unit="example", observer="server")
    assert got == pytest.approx(independent, rel=1e-9)
    assert ledger.epsilon(7, unit="example", observer="outsider") == pytest.approx(got, rel=1e-12)
    # ... is exactly the T steps at z each ...
    steps = rdp.RdpAccountant()
    steps.compose(dp_accounting.GaussianDpEvent(z), 3)
    assert steps.get_epsilon(1e-5) == pytest.approx(independent, rel=1e-9)
    # ... and the analytic target is met exactly by PLD; RDP's conversion is a little looser
    exact = pld.PLDAccountant(value_discretization_interval=1e-3)
    exact.compose(dp_accounting.GaussianDpEvent(z), 3)
    assert exact.get_epsilon(1e-5) == pytest.approx(2.0, rel=1e-3)
    assert 2.0 <= got <= 1.25 * 2.0
    assert ledger.epsilon(7, unit="client", observer="server") == 0.0


def test_admission_verifies_and_charges_the_server_with_the_same_mechanism():
    mechanism = DPCentroids(CentroidConfig(epsilon=2.0, centres=4, iterations=3), dim=8)
    client_ledger, server = Ledger(), Ledger()
    released = mechanism.release(client_id=2, ledger=client_ledger, round_id=1, summary_key="descriptor",
                                 documents=np.random.default_rng(2).normal(size=(400, 8)))
    record = released.record()
    assert set(mechanism.verify(record)) == {Observer.SERVER, Observer.OUTSIDER}
    admitted = admit({"descriptor": record}, specs={"descriptor": mechanism}, client_id=2, round_id=1, ledger=server)
    assert np.array_equal(admitted["descriptor"].payload, record.payload)
    assert [(e.mechanism, e.unit, e.observer) for e in server.entries(2)] == \
        [(e.mechanism, e.unit, e.observer) for e in client_ledger.entries(2)]
    for obs in ("server", "outsider"):
        assert server.epsilon(2, unit="example", observer=obs) == client_ledger.epsilon(2, unit="example", observer=obs)
    other = Ledger()
    with pytest.raises(ReleaseRejected, match="descriptor released under example-level .*'epsilon': 20.0"):
        admit({"descriptor": dataclasses.replace(record, mechanism=dict(record.mechanism, epsilon=20.0))},
              specs={"descriptor": mechanism}, client_id=2, round_id=1, ledger=other)
    assert other.clients() == []


def test_verify_rejects_tampered_records():
    mechanism = DPCentroids(CentroidConfig(epsilon=2.0, centres=4, iterations=3), dim=8)
    record = mechanism.release(client_id=2, ledger=Ledger(), round_id=1,
                               documents=np.random.default_rng(4).normal(size=(400, 8))).record()
    m = dict(record.mechanism)
    tampered = {
        "epsilon": dict(m, epsilon=8.0), "epsilon as int": dict(m, epsilon=2),
        "delta": dict(m, delta=1e-3), "centres": dict(m, centres=3), "iterations": dict(m, iterations=1),
        "iterations as bool": dict(m, iterations=True),
        "projection_dim": dict(m, projection_dim=16), "sigma": dict(m, sigma=m["sigma"] / 2),
        "sigma as str": dict(m, sigma=str(m["sigma"])), "noise_multiplier": dict(m, noise_multiplier=5.0),
        "sensitivity": dict(m, sensitivity=1.0), "name": dict(m, name="jl_sketch_gaussian"),
        "n_documents too small": dict(m, n_documents=5), "n_documents missing": dict(m, n_documents=None),
        "n_documents float": dict(m, n_documents=400.0), "n_documents zero": dict(m, n_documents=0),
    }
    declared, count = "descriptor released under example-level", "needs its document count"
    reasons = {"sigma": "claimed sigma", "sigma as str": "claimed sigma",
               "noise_multiplier": "claimed noise_multiplier", "sensitivity": "claimed sensitivity", "name": "expected a dp_spherical_kmeans_gaussian release",
               "n_documents too small": "refusing the descriptor", "n_documents missing": count,
               "n_documents float": count, "n_documents zero": count}  # the rest: a declared parameter differs
    for what, mech in tampered.items():
        with pytest.raises(ValueError, match=reasons.get(what, declared)):
            mechanism.verify(dataclasses.replace(record, mechanism=mech))
            pytest.fail(what)
    with pytest.raises(DescriptorRefused, match="refusing the descriptor.*n=5 documents"):
        mechanism.verify(dataclasses.replace(record, mechanism=dict(m, n_documents=5)))
    with pytest.raises(ValueError, match="shape"):
        mechanism.verify(dataclasses.replace(record, payload=record.payload[:-1]))
    with pytest.raises(ValueError, match="client-level"):
        mechanism.verify(dataclasses.replace(record, unit=PrivacyUnit.CLIENT))
    for config in (CentroidConfig(centres=3), CentroidConfig(epsilon=3.0), CentroidConfig(projection_dim=16)):
        with pytest.raises(ValueError, match="descriptor released under example-level .* this run declares"):
            DPCentroids(config, dim=8).verify(record)
    # the charge does not depend on a (non-refused) count, so another count only changes the metadata
    assert mechanism.verify(dataclasses.replace(record, mechanism=dict(m, n_documents=10_000))) == \
        mechanism.verify(record)


# ---- the SIT score -----------------------------------------------------------------------------

def test_rectified_linear_score_by_hand():
    a = np.array([[1.0, 0.0], [0.0, 1.0]])
    b = np.array([[2.0, 0.0], [np.cos(0.5), np.sin(0.5)], [-1.0, 0.0]])
    # cosines: (a0,b0)=1, (a0,b1)=cos .5=.878, (a0,b2)=-1, (a1,b0)=0, (a1,b1)=sin .5=.479, (a1,b2)=0
    assert rectified_linear_score(a, b) == pytest.approx((1 + np.cos(0.5)) / 6)
    assert rectified_linear_score(b, a) == pytest.approx((1 + np.cos(0.5)) / 6)
    assert rectified_linear_score(a, b, threshold=0.4) == pytest.approx((1 + np.cos(0.5) + np.sin(0.5)) / 6)
    assert rectified_linear_score(a, b, threshold=0.9) == pytest.approx(1 / 6)
    assert rectified_linear_score(a, b, threshold=1.0) == 0.0               # strictly above the threshold
    assert rectified_linear_score(a, b, threshold=-2.0) == pytest.approx((1 + np.cos(0.5) - 1 + np.sin(0.5)) / 6)
    assert rectified_linear_score(a, a) == pytest.approx(2 / 4)


def test_rectified_linear_score_zero_rows_and_shapes():
    b = np.array([[1.0, 0.0], [0.0, 1.0]])
    assert rectified_linear_score(np.zeros((2, 2)), b) == 0.0
    assert rectified_linear_score(np.zeros((2, 2)), b, threshold=-0.5) == 0.0  # zero rows: cosine 0, not NaN
    assert rectified_linear_score(np.array([[0.0, 0.0], [3.0, 0.0]]), b) == pytest.approx(1 / 4)
    for x, y in ((b, np.ones((2, 3))), (np.ones(2), b), (np.ones((0, 2)), b), (b, np.ones((2, 2, 1)))):
        with pytest.raises(ValueError, match=r"descriptors must be non-empty \(n, d\) arrays of the same width"):
            rectified_linear_score(x, y)
    with pytest.raises(ValueError, match="descriptors and threshold must be finite"):
        rectified_linear_score(b, np.array([[np.nan, 0.0]]))


def test_descriptors_of_similar_tasks_score_higher():
    mechanism = DPCentroids(CentroidConfig(epsilon=4.0, projection_dim=32), dim=64)
    docs_a, _ = separated_documents(mechanism, 300, seed=1)
    docs_b, _ = separated_documents(mechanism, 300, seed=1, noise_seed=9)    # same task, other documents
    docs_c, _ = separated_documents(mechanism, 300, seed=2)                  # other directions
    ledger = Ledger()
    a, b, c = (mechanism.unpack(mechanism.release(client_id=i, ledger=ledger, documents=d).payload)[0]
               for i, d in enumerate((docs_a, docs_b, docs_c)))
    assert rectified_linear_score(a, b) > 0.2 > rectified_linear_score(a, c)
