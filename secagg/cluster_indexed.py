"""Cluster-indexed secure sums: per-cluster sums and counts, with the assignments kept on clients.

One Lloyd iteration (research/dp_leakage.md Sec. 3.2):
  1. the server publishes centroids mu_1..mu_K;
  2. each client picks a = argmin_c ||x - mu_c|| locally and builds a one-hot block vector of
     length K (d + 1): block a holds [x, 1], every other block is zero;
  3. the blocks are summed by any secure-sum protocol (after a fixed-point or distributed-DP
     encoder), so the server learns per-cluster sums and counts, never who is in which cluster;
  4. the server sets mu_c = sum_c / count_c for clusters with enough members.

Pure functions and small dataclasses; no network. With noise-free sums, a cluster of count 1
reveals one (anonymous but exact) vector. So decoding withholds (NaN) the sum of every cluster with
fewer than `min_count` members, default `MIN_COUNT` = 5, and such a centroid keeps its previous
value; a smaller `min_count` must be asked for explicitly (e.g. with DP noise on the blocks,
per-client sensitivity sqrt(||x||^2 + 1)). The counts themselves are released (they name no one).
The engine's cluster-indexed parts (`fl_algorithms.engine.secure_sum`) refuse such a sum outright.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

MIN_COUNT = 5.0
"""Fewest members of a cluster whose sum (hence mean) a server may see when sums are noise-free."""


def _check_min_count(min_count: float) -> float:
    """Any number but NaN: below 1 only makes sense for DP-noised counts (which can be 0 or negative)."""
    if isinstance(min_count, bool) or not isinstance(min_count, (int, float, np.integer, np.floating)) \
            or np.isnan(min_count):
        raise ValueError(f"min_count must be a number, got {min_count!r}")
    return float(min_count)


@dataclass(frozen=True)
class ClusterLayout:
    n_clusters: int
    dim: int

    def __post_init__(self) -> None:
        if self.n_clusters < 1 or self.dim < 1:
            raise ValueError("n_clusters and dim must be positive")

    @property
    def block(self) -> int:
        return self.dim + 1

    @property
    def length(self) -> int:
        """Length of every client's upload: K (d + 1)."""
        return self.n_clusters * self.block


def _check_centroids(centroids: np.ndarray) -> np.ndarray:
    c = np.asarray(centroids, dtype=np.float64)
    if c.ndim != 2 or c.shape[0] < 1 or not np.all(np.isfinite(c)):
        raise ValueError("centroids must be a finite (K, d) array")
    return c


def nearest_cluster(x: np.ndarray, centroids: np.ndarray) -> int:
    """Client side: index of the centroid nearest to x (ties: the lowest index)."""
    c = _check_centroids(centroids)
    x = np.asarray(x, dtype=np.float64)
    if x.shape != (c.shape[1],) or not np.all(np.isfinite(x)):
        raise ValueError(f"x must be a finite vector of length {c.shape[1]}")
    return int(np.argmin(((c - x) ** 2).sum(axis=1)))


def one_hot_block(x: np.ndarray, *, cluster: int, layout: ClusterLayout) -> np.ndarray:
    """The K (d + 1) upload: [x, 1] in block `cluster`, zeros elsewhere."""
    x = np.asarray(x, dtype=np.float64)
    if x.shape != (layout.dim,):
        raise ValueError(f"x must have length {layout.dim}")
    if not 0 <= cluster < layout.n_clusters:
        raise ValueError(f"cluster {cluster} outside [0, {layout.n_clusters})")
    out = np.zeros(layout.length)
    start = cluster * layout.block
    out[start : start + layout.dim] = x
    out[start + layout.dim] = 1.0
    return out


def client_block(x: np.ndarray, centroids: np.ndarray) -> tuple[np.ndarray, int]:
    """Client side: (upload, chosen cluster). The cluster index never leaves the client."""
    c = _check_centroids(centroids)
    a = nearest_cluster(x, c)
    return one_hot_block(x, cluster=a, layout=ClusterLayout(c.shape[0], c.shape[1])), a


@dataclass(frozen=True)
class ClusterSums:
    sums: np.ndarray
    """(K, d) per-cluster sums of member vectors."""
    counts: np.ndarray
    """(K,) per-cluster member counts (floats: noisy under DP)."""

    def means(self, *, min_count: float = MIN_COUNT) -> np.ndarray:
        """(K, d) per-cluster means; NaN rows where count < min_count (or the sum was withheld)."""
        min_count = _check_min_count(min_count)
        out = np.full_like(self.sums, np.nan)
        ok = (self.counts >= min_count) & (self.counts > 0)
        out[ok] = self.sums[ok] / self.counts[ok, None]
        return out


def decode_cluster_sums(total: np.ndarray, *, layout: ClusterLayout, min_count: float = MIN_COUNT) -> ClusterSums:
    """Server side: split the summed blocks into per-cluster sums and counts; the sum of a cluster
    with fewer than `min_count` members is withheld (NaN), as one member's sum is its vector."""
    min_count = _check_min_count(min_count)
    total = np.asarray(total, dtype=np.float64)
    if total.shape != (layout.length,):
        raise ValueError(f"expected a summed vector of length {layout.length}")
    blocks = total.reshape(layout.n_clusters, layout.block)
    sums, counts = blocks[:, : layout.dim].copy(), blocks[:, layout.dim].copy()
    sums[~(counts >= min_count)] = np.nan
    return ClusterSums(sums=sums, counts=counts)


def update_centroids(sums: ClusterSums, *, previous: np.ndarray, min_count: float = MIN_COUNT) -> np.ndarray:
    """New centroids: the cluster mean where count >= min_count, else the previous centroid."""
    prev = _check_centroids(previous)
    means = sums.means(min_count=min_count)
    if means.shape != prev.shape:
        raise ValueError("centroid shapes differ")
    return np.where(np.isnan(means), prev, means)


SecureSum = Callable[[Sequence[np.ndarray]], np.ndarray]
"""Sums client uploads (a protocol plus its encoder in deployment; a plain sum in tests)."""


def lloyd_iteration(client_vectors: Mapping[int, np.ndarray] | Sequence[np.ndarray], centroids: np.ndarray, *,
                    secure_sum: SecureSum, min_count: float = MIN_COUNT) -> tuple[np.ndarray, ClusterSums]:
    """Simulate one iteration: every client builds its block locally, `secure_sum` adds them, the
    server decodes (withholding clusters below `min_count`). Returns (new centroids, per-cluster sums
    and counts)."""
    c = _check_centroids(centroids)
    layout = ClusterLayout(c.shape[0], c.shape[1])
    vectors = list(client_vectors.values()) if isinstance(client_vectors, Mapping) else list(client_vectors)
    uploads = [client_block(x, c)[0] for x in vectors]
    sums = decode_cluster_sums(secure_sum(uploads), layout=layout, min_count=min_count)
    return update_centroids(sums, previous=c, min_count=min_count), sums
