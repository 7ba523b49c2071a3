"""Cluster-indexed secure sums: per-cluster sums and counts equal the true ones; Lloyd converges."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp.distributed import DistributedDPConfig, DistributedDPEncoder
from secagg.cluster_indexed import (MIN_COUNT, ClusterLayout, ClusterSums, client_block, decode_cluster_sums,
                                    lloyd_iteration, nearest_cluster, one_hot_block, update_centroids)
from secagg.encoding import EncodingConfig, FixedPointEncoder
from secagg.ring import FIELD_P31, RING_2_32


def true_cluster_sums(xs, centroids):
    k = centroids.shape[0]
    labels = np.argmin(((xs[:, None, :] - centroids[None]) ** 2).sum(-1), axis=1)
    sums = np.stack([xs[labels == c].sum(axis=0) for c in range(k)])
    counts = np.bincount(labels, minlength=k).astype(float)
    return sums, counts


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 40), k=st.integers(1, 6), d=st.integers(1, 12), seed=st.integers(0, 2**32))
def test_summed_blocks_decode_to_per_cluster_sums_and_counts(n, k, d, seed):
    rng = np.random.default_rng(seed)
    xs, centroids = rng.normal(size=(n, d)), rng.normal(size=(k, d))
    total = np.sum([client_block(x, centroids)[0] for x in xs], axis=0)
    want_sums, want_counts = true_cluster_sums(xs, centroids)
    every = decode_cluster_sums(total, layout=ClusterLayout(k, d), min_count=1)
    assert np.allclose(every.sums[want_counts >= 1], want_sums[want_counts >= 1])
    assert np.array_equal(every.counts, want_counts)
    # by default a cluster of fewer than MIN_COUNT members is withheld: its sum would be too close to one vector
    default = decode_cluster_sums(total, layout=ClusterLayout(k, d))
    big = want_counts >= MIN_COUNT
    assert np.allclose(default.sums[big], want_sums[big]) and np.all(np.isnan(default.sums[~big]))
    assert np.array_equal(default.counts, want_counts)


@pytest.mark.parametrize("ring", [RING_2_32, FIELD_P31])
def test_through_the_fixed_point_encoder_and_a_ring_sum(ring):
    rng = np.random.default_rng(3)
    n, k, d = 30, 4, 16
    xs, centroids = rng.uniform(-1, 1, size=(n, d)), rng.uniform(-1, 1, size=(k, d))
    layout = ClusterLayout(k, d)
    encoder = FixedPointEncoder(EncodingConfig(clip=2.0, max_clients=64), ring=ring)
    acc = np.zeros(layout.length + 1, dtype=np.uint32)
    for x in xs:
        ring.add_(acc, encoder.encode(client_block(x, centroids)[0], weight=1.0)[0])
    decoded = encoder.decode(acc, n_clients=n)
    sums = decode_cluster_sums(decoded.weighted_sum, layout=layout, min_count=1)  # arithmetic only
    want_sums, want_counts = true_cluster_sums(xs, centroids)
    assert np.allclose(sums.sums, want_sums, atol=n * encoder.step)
    assert np.allclose(sums.counts, want_counts, atol=n * encoder.step)


def test_lloyd_iterations_find_separated_clusters():
    rng = np.random.default_rng(0)
    centers = np.array([[5.0, 0.0], [-5.0, 0.0], [0.0, 6.0]])
    xs = np.concatenate([c + rng.normal(size=(50, 2)) for c in centers])
    centroids = xs[[0, 50, 100]] + 1.5  # one perturbed point per blob
    for _ in range(10):
        centroids, sums = lloyd_iteration(xs, centroids, secure_sum=lambda ups: np.sum(ups, axis=0))
    order = [int(np.argmin(np.linalg.norm(centroids - c, axis=1))) for c in centers]
    assert sorted(order) == [0, 1, 2]
    assert np.max(np.linalg.norm(centroids[order] - centers, axis=1)) < 0.4
    assert sorted(sums.counts.tolist()) == [50.0, 50.0, 50.0]


def test_distributed_dp_noisy_cluster_sums():
    rng = np.random.default_rng(1)
    n, k, d = 60, 3, 8
    xs = rng.normal(size=(n, d))
    xs /= np.linalg.norm(xs, axis=1, keepdims=True)  # ||block|| = sqrt(2)
    centroids = rng.normal(size=(k, d))
    layout = ClusterLayout(k, d)
    config = DistributedDPConfig(l2_clip=np.sqrt(2.0), noise_multiplier=1.0, expected_clients=n, bits=20)
    encoder = DistributedDPEncoder.from_config(config, dim=layout.length)
    acc = np.zeros(encoder.length, dtype=np.uint32)
    for x in xs:
        RING_2_32.add_(acc, encoder.encode(client_block(x, centroids)[0], round_seed=11))
    total = encoder.decode(acc, round_seed=11, n_clients=n) * n
    sums = decode_cluster_sums(total, layout=layout, min_count=-np.inf)  # DP noise, not the group size, protects
    want_sums, want_counts = true_cluster_sums(xs, centroids)
    sigma = 1.0 * np.sqrt(2.0)  # central noise stddev z C on every coordinate of the sum
    assert np.max(np.abs(sums.counts - want_counts)) < 5 * sigma
    assert np.max(np.abs(sums.sums - want_sums)) < 5 * sigma


def test_a_cluster_of_one_is_withheld_by_default():
    layout = ClusterLayout(2, 3)
    x = np.array([1.0, 2.0, 3.0])
    total = one_hot_block(x, cluster=1, layout=layout)
    sums = decode_cluster_sums(total, layout=layout)
    assert MIN_COUNT >= 5
    assert np.all(np.isnan(sums.sums[1])) and sums.counts.tolist() == [0.0, 1.0]  # the vector never reaches the server
    prev = np.zeros((2, 3))
    assert np.array_equal(update_centroids(sums, previous=prev), prev)
    exposed = ClusterSums(sums=np.stack([np.zeros(3), x]), counts=np.array([0.0, 1.0]))  # decoded with min_count=1
    assert np.all(np.isnan(exposed.means()[1]))  # the default of means() withholds it too
    assert np.array_equal(update_centroids(exposed, previous=prev), prev)
    assert np.array_equal(update_centroids(exposed, previous=prev, min_count=1)[1], x)  # only when asked
    four = decode_cluster_sums(4 * total, layout=layout)
    five = decode_cluster_sums(5 * total, layout=layout)
    assert np.all(np.isnan(four.sums[1])) and np.array_equal(five.sums[1], 5 * x)
    assert np.array_equal(update_centroids(five, previous=prev)[1], x)
    for bad in (float("nan"), "5", None):
        with pytest.raises(ValueError, match="min_count"):
            decode_cluster_sums(total, layout=layout, min_count=bad)
        with pytest.raises(ValueError, match="min_count"):
            exposed.means(min_count=bad)


def test_lloyd_iteration_withholds_small_clusters_by_default():
    centroids = np.array([[0.0, 0.0], [10.0, 10.0]])
    xs = np.concatenate([np.full((6, 2), 1.0), [[9.0, 9.0]]])  # six near the first centroid, one alone
    new, sums = lloyd_iteration(xs, centroids, secure_sum=lambda ups: np.sum(ups, axis=0))
    assert sums.counts.tolist() == [6.0, 1.0] and np.all(np.isnan(sums.sums[1]))
    np.testing.assert_allclose(new, [[1.0, 1.0], [10.0, 10.0]])  # the lone client's centroid is not moved


def test_inputs_are_validated():
    layout = ClusterLayout(2, 3)
    assert nearest_cluster(np.array([0.9, 0.0]), np.array([[0.0, 0.0], [1.0, 0.0]])) == 1
    with pytest.raises(ValueError, match=r"cluster 2 outside \[0, 2\)"):
        one_hot_block(np.zeros(3), cluster=2, layout=layout)
    with pytest.raises(ValueError, match="expected a summed vector of length 8"):
        decode_cluster_sums(np.zeros(7), layout=layout)
    with pytest.raises(ValueError, match="x must be a finite vector of length 3"):
        client_block(np.zeros(4), np.zeros((2, 3)))
