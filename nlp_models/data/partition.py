"""Non-IID partitions of a data set over clients (FedNLP, Lin et al. 2022, Section 3.2).

- ``dirichlet_label_skew``: each class is spread over clients by proportions ~ Dir(alpha). Small alpha:
  each client sees few classes; large alpha: near-IID. This is the per-class form used by FedNLP's and
  FedML's code (with their balancing rule: a client stops receiving once it holds n/K examples), not
  the paper's per-client q_j ~ Dir(alpha p) with sampling without replacement, because the per-class
  form places every example exactly once.
- ``dirichlet_quantity_skew``: client sizes ~ n * Dir_K(beta), labels IID.
- ``feature_cluster_skew``: k-means over sentence embeddings gives latent labels, then label skew over
  those (FedNLP's partition for tasks without class labels, e.g. NER).
- ``natural_partition``: one client per group key (movie, speaker, ...), or groups packed into K clients.

All are deterministic by ``seed`` and return a ``Partition`` that is checked on construction: every
example lands in exactly one client. ``client_splits`` then gives each client train/validation/test.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from nlp_models.data.dataset import DEFAULT_RATIOS, DatasetSplits, TextDataset, largest_remainder, split_indices


class PartitionError(ValueError):
    """A partition with the requested guarantees could not be built."""


@dataclass(frozen=True)
class Partition:
    """Global example indices per client (sorted), over ``n`` examples; ``keys`` name natural clients."""

    clients: tuple[np.ndarray, ...]
    n: int
    method: str
    keys: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if not self.clients:
            raise PartitionError("a partition needs at least one client")
        if self.keys is not None and len(self.keys) != len(self.clients):
            raise PartitionError("one key per client")
        every = np.concatenate(self.clients) if self.n else np.zeros(0, dtype=np.int64)
        if every.size and (every.min() < 0 or every.max() >= self.n):
            raise PartitionError("index out of range")
        if every.size != self.n or np.any(np.bincount(every, minlength=self.n) != 1):
            raise PartitionError("every example must be in exactly one client")

    def __len__(self) -> int:
        return len(self.clients)

    @property
    def sizes(self) -> np.ndarray:
        return np.array([len(client) for client in self.clients], dtype=np.int64)

    def record(self) -> dict:
        """A JSON-ready record (``from_record`` rebuilds the partition)."""
        return {"method": self.method, "n": self.n, "clients": [c.tolist() for c in self.clients],
                "keys": list(self.keys) if self.keys is not None else None}

    @classmethod
    def from_record(cls, record: dict) -> "Partition":
        keys = record.get("keys")
        return cls(clients=tuple(np.asarray(c, dtype=np.int64) for c in record["clients"]), n=int(record["n"]),
                   method=str(record["method"]), keys=tuple(keys) if keys is not None else None)

    def label_counts(self, labels: np.ndarray, num_labels: int) -> np.ndarray:
        """(clients, classes) matrix of example counts."""
        labels = np.asarray(labels)
        return np.stack([np.bincount(labels[client], minlength=num_labels) for client in self.clients])


def _client_arrays(buckets: Sequence[Sequence[int] | np.ndarray]) -> tuple[np.ndarray, ...]:
    return tuple(np.sort(np.asarray(bucket, dtype=np.int64)) for bucket in buckets)


def _check_common(n: int, num_clients: int, min_size: int) -> None:
    if num_clients < 1:
        raise PartitionError(f"num_clients must be >= 1, got {num_clients}")
    if min_size < 0:
        raise PartitionError(f"min_size must be >= 0, got {min_size}")
    if n < num_clients * min_size:
        raise PartitionError(f"{n} examples cannot give {num_clients} clients {min_size} examples each")


def iid_partition(n: int, *, num_clients: int, seed: int = 0) -> Partition:
    """Uniformly random, equal-size (within one) clients."""
    _check_common(n, num_clients, 0)
    shuffled = np.random.default_rng(seed).permutation(n)
    return Partition(_client_arrays(np.array_split(shuffled, num_clients)), n, "iid")


def dirichlet_label_skew(
    labels: np.ndarray | Sequence[int],
    *,
    num_clients: int,
    alpha: float,
    seed: int = 0,
    min_size: int = 1,
    max_tries: int = 1000,
) -> Partition:
    """Spread each class over clients with proportions ~ Dir(alpha * 1); redraw until every client
    has ``min_size`` examples (raises ``PartitionError`` after ``max_tries`` draws)."""
    labels = np.asarray(labels)
    n = len(labels)
    _check_common(n, num_clients, min_size)
    if not alpha > 0:
        raise PartitionError(f"alpha must be > 0, got {alpha}")
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    for _ in range(max_tries):
        buckets: list[list[int]] = [[] for _ in range(num_clients)]
        for label in classes:
            members = rng.permutation(np.flatnonzero(labels == label))
            proportions = rng.dirichlet(np.full(num_clients, alpha))
            open_clients = np.array([len(bucket) < n / num_clients for bucket in buckets])
            if np.any(open_clients & (proportions > 0)):
                proportions = proportions * open_clients
            proportions = proportions / proportions.sum()
            cuts = (np.cumsum(proportions) * len(members)).astype(np.int64)[:-1]
            for bucket, chunk in zip(buckets, np.split(members, cuts)):
                bucket.extend(chunk.tolist())
        if min(len(bucket) for bucket in buckets) >= min_size:
            return Partition(_client_arrays(buckets), n, f"dirichlet_label_skew(alpha={alpha})")
    raise PartitionError(
        f"no Dir({alpha}) label partition of {n} examples over {num_clients} clients gave every client "
        f">= {min_size} examples in {max_tries} draws; raise alpha, lower min_size or use fewer clients"
    )


def dirichlet_quantity_skew(n: int, *, num_clients: int, beta: float, seed: int = 0, min_size: int = 1) -> Partition:
    """Client sizes min_size + (n - K min_size) * z with z ~ Dir_K(beta); examples assigned at random.

    Reserving ``min_size`` first (rather than redrawing) makes the guarantee exact for any beta.
    """
    _check_common(n, num_clients, min_size)
    if not beta > 0:
        raise PartitionError(f"beta must be > 0, got {beta}")
    rng = np.random.default_rng(seed)
    shares = rng.dirichlet(np.full(num_clients, beta))
    sizes = min_size + largest_remainder(n - num_clients * min_size, shares)
    shuffled = rng.permutation(n)
    return Partition(
        _client_arrays(np.split(shuffled, np.cumsum(sizes)[:-1])), n, f"dirichlet_quantity_skew(beta={beta})"
    )


def kmeans_clusters(embeddings: np.ndarray, *, num_clusters: int, seed: int = 0) -> np.ndarray:
    """Cluster id per row of ``embeddings`` (scikit-learn KMeans, deterministic by ``seed``)."""
    from sklearn.cluster import KMeans

    embeddings = np.asarray(embeddings, dtype=np.float64)
    if embeddings.ndim != 2 or len(embeddings) < num_clusters:
        raise PartitionError(f"need a 2-D array with >= {num_clusters} rows, got shape {embeddings.shape}")
    if not np.all(np.isfinite(embeddings)):
        raise PartitionError("embeddings must be finite")
    model = KMeans(n_clusters=num_clusters, random_state=seed, n_init=10)
    return model.fit_predict(embeddings).astype(np.int64)


def feature_cluster_skew(
    embeddings: np.ndarray,
    *,
    num_clients: int,
    num_clusters: int,
    alpha: float,
    seed: int = 0,
    min_size: int = 1,
) -> Partition:
    """Label skew over k-means cluster ids of sentence embeddings (FedNLP's feature-shift partition)."""
    clusters = kmeans_clusters(embeddings, num_clusters=num_clusters, seed=seed)
    partition = dirichlet_label_skew(clusters, num_clients=num_clients, alpha=alpha, seed=seed, min_size=min_size)
    return Partition(partition.clients, partition.n, f"feature_cluster_skew(k={num_clusters}, alpha={alpha})")


def natural_partition(
    groups: Sequence[str], *, num_clients: int | None = None, seed: int = 0, min_size: int = 1
) -> Partition:
    """One client per distinct group (keys sorted), or with ``num_clients`` whole groups packed into that
    many clients: groups in random order (by ``seed``), largest first, each to the smallest client."""
    groups = list(groups)
    n = len(groups)
    keys = sorted(set(groups))
    members: dict[str, list[int]] = {key: [] for key in keys}
    for index, key in enumerate(groups):
        members[key].append(index)
    if num_clients is None:
        partition = Partition(_client_arrays([members[key] for key in keys]), n, "natural", tuple(keys))
    else:
        _check_common(n, num_clients, min_size)
        if num_clients > len(keys):
            raise PartitionError(f"{len(keys)} groups cannot fill {num_clients} clients")
        order = np.random.default_rng(seed).permutation(len(keys))
        order = sorted(order, key=lambda position: -len(members[keys[position]]))  # stable: ties keep shuffle
        buckets: list[list[int]] = [[] for _ in range(num_clients)]
        for position in order:
            smallest = min(range(num_clients), key=lambda client: (len(buckets[client]), client))
            buckets[smallest].extend(members[keys[position]])
        partition = Partition(_client_arrays(buckets), n, f"natural(packed into {num_clients})")
    if partition.sizes.min() < min_size:
        raise PartitionError(f"a natural client has {partition.sizes.min()} examples, fewer than {min_size}")
    return partition


@dataclass(frozen=True)
class ClientSplit:
    """One client's global example indices for training, validation and test."""

    train: np.ndarray
    validation: np.ndarray
    test: np.ndarray


def client_splits(
    partition: Partition,
    *,
    ratios: Sequence[float] = DEFAULT_RATIOS,
    seed: int = 0,
    labels: np.ndarray | None = None,
) -> tuple[ClientSplit, ...]:
    """Split every client's examples by ``ratios`` (stratified when ``labels`` is given).

    Every part with a positive ratio gets at least one example (taken from the largest part);
    a client with fewer examples than such parts raises ``PartitionError``.
    """
    if len(ratios) != 3:
        raise PartitionError("ratios must be (train, validation, test)")
    needed = sum(1 for ratio in ratios if ratio > 0)
    splits = []
    for number, client in enumerate(partition.clients):
        if len(client) < needed:
            raise PartitionError(f"client {number} has {len(client)} examples, fewer than the {needed} parts")
        client_labels = None if labels is None else np.asarray(labels)[client]
        parts = split_indices(len(client), ratios=ratios, seed=seed + number, labels=client_labels)
        for part_number, ratio in enumerate(ratios):
            if ratio > 0 and len(parts[part_number]) == 0:
                largest = max(range(3), key=lambda k: len(parts[k]))
                parts[part_number] = parts[largest][-1:]
                parts[largest] = parts[largest][:-1]
        splits.append(ClientSplit(*(client[part] for part in parts)))
    return tuple(splits)


def client_datasets(dataset: TextDataset, splits: Sequence[ClientSplit]) -> tuple[DatasetSplits, ...]:
    """Materialise each client's train/validation/test ``TextDataset``s."""
    return tuple(
        DatasetSplits(dataset.subset(split.train), dataset.subset(split.validation), dataset.subset(split.test))
        for split in splits
    )


# ---- a public split of whole groups, then clients -------------------------------------------------

def split_off_public_groups(groups: Sequence[str], *, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(private, public): sorted example indices, where round(fraction x #groups) whole groups (movies),
    drawn uniformly by `seed` from the sorted group keys, are public. fraction = 0: nothing is public.

    Groups, not examples, so that no movie (its names, its plot words) is both public and some
    client's; the public share of the examples is therefore only about `fraction`.
    """
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"fraction must be in [0, 1), got {fraction}")
    groups = list(groups)
    keys = sorted(set(groups))
    count = int(round(fraction * len(keys)))
    if fraction > 0 and count < 1:
        raise ValueError(f"public fraction {fraction} of {len(keys)} groups is no group")
    # a seed stream of its own (tag 'public'), independent of natural_partition's draw from `seed`
    rng = np.random.default_rng(np.random.SeedSequence([seed, int.from_bytes(b"public", "big")]))
    public_keys = {keys[i] for i in rng.permutation(len(keys))[:count]}
    is_public = np.fromiter((g in public_keys for g in groups), dtype=bool, count=len(groups))
    return np.flatnonzero(~is_public).astype(np.int64), np.flatnonzero(is_public).astype(np.int64)


@dataclass(frozen=True)
class MovieClients:
    """Corpus indices of each client's train/test snippets and of the public split."""

    clients: tuple[ClientSplit, ...]
    """Client k + 1's corpus indices (validation is empty)."""
    movies: tuple[int, ...]
    """Movies per client."""
    public: np.ndarray
    public_movies: int


def movie_clients(dataset: TextDataset, *, num_clients: int, test_fraction: float, public_fraction: float,
                  seed: int) -> MovieClients:
    """`load_bag_task`'s clients after setting the public movies aside: whole movies packed into
    `num_clients` clients (`natural_partition`, min 2 snippets), each split train/test stratified by
    label (`client_splits`). With public_fraction = 0 this is exactly the bag task's partition."""
    if dataset.groups is None:
        raise ValueError("the corpus needs groups (movies) to be partitioned by movie")
    private, public = split_off_public_groups(dataset.groups, fraction=public_fraction, seed=seed)
    rest = dataset.subset(private) if len(public) else dataset
    partition = natural_partition(rest.groups, num_clients=num_clients, seed=seed, min_size=2)
    splits = client_splits(partition, ratios=(1 - test_fraction, 0.0, test_fraction), seed=seed,
                           labels=rest.label_array())
    back = private if len(public) else np.arange(len(dataset), dtype=np.int64)
    clients = tuple(ClientSplit(back[s.train], back[s.validation], back[s.test]) for s in splits)
    movies = tuple(len({rest.groups[i] for i in members}) for members in partition.clients)
    return MovieClients(clients=clients, movies=movies, public=public,
                        public_movies=len({dataset.groups[i] for i in public}))
