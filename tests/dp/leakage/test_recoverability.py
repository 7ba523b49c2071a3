import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dp.leakage.recoverability import (ExactRowSpace, exposure_curve, membership_matrix, reconstruct,
                                       reconstruction_cosine, recoverable_clients)


@pytest.mark.parametrize("method", ["float", "exact"])
def test_two_sums_expose_exactly_the_added_client(method):
    a = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    r = recoverable_clients([a, a + [11]], method=method)
    assert r.exposed == {11}
    assert r.count == 1 and r.fraction == pytest.approx(1 / 11) and r.rank == 2


@pytest.mark.parametrize("method", ["float", "exact"])
def test_random_cohorts_expose_everyone_after_about_n_releases(method):
    n, k = 30, 10
    rng = np.random.default_rng(0)
    releases = [rng.choice(np.arange(1, n + 1), k, replace=False).tolist() for _ in range(3 * n)]
    assert recoverable_clients(releases[: n // 2], method=method).count < n
    assert recoverable_clients(releases, method=method).exposed == set(range(1, n + 1))
    curve = exposure_curve(releases)
    assert np.all(np.diff(curve) >= 0)
    first_full = int(np.argmax(curve == n)) + 1
    assert n <= first_full <= 2 * n  # rank n needs at least n releases


@pytest.mark.parametrize("method", ["float", "exact"])
def test_fixed_disjoint_groups_expose_nobody(method):
    groups = [list(range(1 + 10 * g, 11 + 10 * g)) for g in range(5)]
    releases = [groups[t % 5] for t in range(200)]
    r = recoverable_clients(releases, method=method)
    assert r.count == 0 and r.rank == 5
    assert max(r.leverage.values()) == pytest.approx(0.1 if method == "float" else 0.0)


def test_clients_that_never_took_part_count_but_are_never_exposed():
    r = recoverable_clients([[1, 2], [1]], clients=[1, 2, 3, 4])
    assert r.exposed == {1, 2} and r.n_clients == 4 and r.fraction == 0.5


def test_weights_do_not_change_who_is_exposed():
    plain = recoverable_clients([[1, 2, 3], [1, 2]]).exposed
    weighted = recoverable_clients([{1: 3.0, 2: 0.5, 3: 7.0}, {1: 3.0, 2: 0.5}]).exposed
    assert plain == weighted == {3}


_matrices = st.integers(2, 7).flatmap(
    lambda n: st.lists(st.sets(st.integers(1, n), min_size=1), min_size=1, max_size=12).map(lambda rows: (n, rows)))


@given(_matrices)
def test_float_and_exact_tests_agree(case):
    n, rows = case
    f = recoverable_clients(rows, clients=range(1, n + 1), method="float")
    e = recoverable_clients(rows, clients=range(1, n + 1), method="exact")
    assert f.exposed == e.exposed
    assert f.rank == e.rank == np.linalg.matrix_rank(membership_matrix(rows, clients=range(1, n + 1))[0])


@given(_matrices)
def test_exposed_means_least_squares_recovers_the_vector(case):
    n, rows = case
    rng = np.random.default_rng(len(rows))
    x = {c: rng.normal(size=3) for c in range(1, n + 1)}
    m, ids = membership_matrix(rows, clients=x)
    sums = m @ np.stack([x[c] for c in ids])
    est = reconstruct(rows, sums, clients=x)
    exposed = recoverable_clients(rows, clients=x).exposed
    for c in ids:
        # exposed clients are recovered exactly; the others are not (generic vectors)
        assert np.allclose(est[c], x[c], atol=1e-8) == (c in exposed)


def test_exact_row_space_handles_larger_cohorts():
    rng = np.random.default_rng(1)
    n = 60
    space = ExactRowSpace(n)
    for _ in range(n + 20):
        row = np.zeros(n, dtype=int)
        row[rng.choice(n, 12, replace=False)] = 1
        space.add(row)
    assert space.rank == n and space.unit_rows() == set(range(n))


def test_reconstruction_cosine_is_one_for_exposed_and_falls_with_noise():
    rng = np.random.default_rng(2)
    x = {c: rng.normal(size=50) for c in range(1, 11)}
    releases = [list(range(1, 11)), list(range(1, 10)), [1, 2, 3], [1, 2]]
    m, ids = membership_matrix(releases, clients=x)
    sums = m @ np.stack([x[c] for c in ids])
    clean = reconstruction_cosine(releases, sums, x)
    assert clean.exposed_mean_cosine == pytest.approx(1.0)  # clients 3 and 10 are exposed
    assert clean.cosine[10] == pytest.approx(1.0) and clean.cosine[3] == pytest.approx(1.0)
    assert clean.cosine[5] < 0.9
    noisy = reconstruction_cosine(releases, sums + rng.normal(scale=3.0, size=sums.shape), x)
    assert noisy.cosine[10] < 0.9


def test_reconstruction_with_weighted_means():
    """A decoded mean times its total weight is the weighted sum; weights are per-client constants."""
    rng = np.random.default_rng(3)
    x = {c: rng.normal(size=4) for c in (1, 2, 3)}
    w = {1: 2.0, 2: 5.0, 3: 1.0}
    releases = [[1, 2, 3], [1, 2]]
    sums = np.stack([sum(w[c] * x[c] for c in r) for r in releases])
    est = reconstruct(releases, sums, weights=w)
    assert np.allclose(w[3] * est[3], w[3] * x[3])


def test_validation():
    with pytest.raises(ValueError, match="a release needs at least one member"):
        recoverable_clients([[]])
    with pytest.raises(TypeError, match="client ids are ints, got 1.5"):
        recoverable_clients([[1.5]])
    with pytest.raises(ValueError, match="method must be 'float' or 'exact'"):
        recoverable_clients([[1]], method="magic")
    with pytest.raises(ValueError, match="sums"):
        reconstruct([[1], [2]], np.zeros((3, 2)))


def test_recoverability_from_a_transcript():
    from dp.leakage.recoverability import recoverable_from_transcript
    from dp.leakage.transcript import Transcript

    tr = Transcript(protocol="secagg+")
    tr.record_aggregate(1, "doc-mean", np.zeros(3), contributors=[1, 2, 3, 4], total_weight=4.0)
    tr.record_aggregate(2, "doc-mean", np.zeros(3), contributors=[1, 2, 3], total_weight=3.0)
    tr.record_aggregate(2, "other", np.zeros(3), contributors=[1], total_weight=1.0)
    r = recoverable_from_transcript(tr, part="doc-mean", clients=range(1, 6))
    assert r.exposed == {4} and r.n_clients == 5
    assert recoverable_from_transcript(tr, part="missing").count == 0
