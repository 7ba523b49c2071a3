"""Non-IID partitioners: exactly-once placement, determinism, skew that follows alpha/beta, errors."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nlp_models.data.partition import (
    Partition,
    PartitionError,
    client_splits,
    dirichlet_label_skew,
    dirichlet_quantity_skew,
    feature_cluster_skew,
    iid_partition,
    natural_partition,
)

seeds = st.integers(0, 2**32 - 1)


def assert_exactly_once(partition, n):
    every = np.concatenate(partition.clients)
    assert len(every) == n and np.array_equal(np.sort(every), np.arange(n))


def same(first, second):
    return len(first) == len(second) and all(np.array_equal(a, b) for a, b in zip(first.clients, second.clients))


@settings(max_examples=30, deadline=None)
@given(n=st.integers(20, 500), classes=st.integers(1, 6), clients=st.integers(1, 10),
       alpha=st.floats(0.05, 100), seed=seeds)
def test_label_skew_places_every_example_once_deterministically(n, classes, clients, alpha, seed):
    labels = np.random.default_rng(0).integers(0, classes, n)
    partition = dirichlet_label_skew(labels, num_clients=clients, alpha=alpha, seed=seed, min_size=0)
    assert_exactly_once(partition, n)
    assert len(partition) == clients
    assert same(partition, dirichlet_label_skew(labels, num_clients=clients, alpha=alpha, seed=seed, min_size=0))


def mean_total_variation(partition, labels, classes):
    counts = partition.label_counts(labels, classes).astype(float)
    shares = counts / counts.sum(axis=1, keepdims=True)
    overall = np.bincount(labels, minlength=classes) / len(labels)
    return float(np.mean(0.5 * np.abs(shares - overall).sum(axis=1)))


@pytest.mark.parametrize("seed", range(5))
def test_small_alpha_is_more_label_skewed_than_large_alpha(seed):
    labels = np.random.default_rng(seed).integers(0, 5, 2_000)
    skewed = dirichlet_label_skew(labels, num_clients=10, alpha=0.1, seed=seed, min_size=10)
    uniform = dirichlet_label_skew(labels, num_clients=10, alpha=100.0, seed=seed, min_size=10)
    assert mean_total_variation(skewed, labels, 5) > 0.4 > 0.1 > mean_total_variation(uniform, labels, 5)


def test_label_skew_min_size_is_guaranteed_or_refused():
    labels = np.repeat(np.arange(4), 50)
    partition = dirichlet_label_skew(labels, num_clients=8, alpha=0.3, seed=0, min_size=5)
    assert partition.sizes.min() >= 5
    with pytest.raises(PartitionError):
        dirichlet_label_skew(labels, num_clients=8, alpha=0.01, seed=0, min_size=24, max_tries=5)
    with pytest.raises(PartitionError):
        dirichlet_label_skew(labels, num_clients=300, alpha=1.0, min_size=1)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(10, 1_000), clients=st.integers(1, 10), beta=st.floats(0.05, 100),
       min_size=st.integers(0, 1), seed=seeds)
def test_quantity_skew_exactly_once_with_min_size(n, clients, beta, min_size, seed):
    partition = dirichlet_quantity_skew(n, num_clients=clients, beta=beta, seed=seed, min_size=min_size)
    assert_exactly_once(partition, n)
    assert partition.sizes.min() >= min_size
    assert same(partition, dirichlet_quantity_skew(n, num_clients=clients, beta=beta, seed=seed, min_size=min_size))


def test_small_beta_spreads_client_sizes():
    spread = [np.std(dirichlet_quantity_skew(5_000, num_clients=20, beta=b, seed=s).sizes)
              for b in (0.1, 100.0) for s in range(3)]
    assert min(spread[:3]) > 2 * max(spread[3:])


def test_feature_clusters_follow_the_geometry():
    rng = np.random.default_rng(0)
    centres = np.array([[10.0, 0.0], [0.0, 10.0], [-10.0, -10.0]])
    embeddings = np.concatenate([centre + rng.normal(size=(60, 2)) for centre in centres])
    partition = feature_cluster_skew(embeddings, num_clients=3, num_clusters=3, alpha=0.01, seed=0, min_size=1)
    assert_exactly_once(partition, 180)
    truth = np.repeat(np.arange(3), 60)
    dominant = partition.label_counts(truth, 3).max(axis=1) / partition.sizes
    assert dominant.min() > 0.9
    assert same(partition, feature_cluster_skew(embeddings, num_clients=3, num_clusters=3, alpha=0.01, seed=0))


@settings(max_examples=30, deadline=None)
@given(groups=st.lists(st.sampled_from("abcdefgh"), min_size=8, max_size=200), clients=st.integers(1, 4), seed=seeds)
def test_natural_partition_keeps_groups_whole(groups, clients, seed):
    per_group = natural_partition(groups)
    assert_exactly_once(per_group, len(groups))
    assert per_group.keys == tuple(sorted(set(groups)))
    for key, members in zip(per_group.keys, per_group.clients):
        assert {groups[i] for i in members} == {key}
    if clients <= len(set(groups)):
        packed = natural_partition(groups, num_clients=clients, seed=seed)
        assert_exactly_once(packed, len(groups))
        owner = {}
        for number, members in enumerate(packed.clients):
            for i in members:
                assert owner.setdefault(groups[i], number) == number
        assert same(packed, natural_partition(groups, num_clients=clients, seed=seed))
    else:
        with pytest.raises(PartitionError):
            natural_partition(groups, num_clients=clients)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(30, 300), clients=st.integers(1, 10), seed=seeds)
def test_client_splits_cover_each_client_with_nonempty_parts(n, clients, seed):
    labels = np.arange(n) % 3
    partition = iid_partition(n, num_clients=clients, seed=seed)
    for stratify in (None, labels):
        splits = client_splits(partition, seed=seed, labels=stratify)
        for members, split in zip(partition.clients, splits):
            joined = np.concatenate([split.train, split.validation, split.test])
            assert np.array_equal(np.sort(joined), members)
            assert min(len(split.train), len(split.validation), len(split.test)) >= 1


def test_client_splits_refuse_tiny_clients_and_partition_checks_placement():
    with pytest.raises(PartitionError):
        client_splits(Partition((np.array([0, 1]), np.array([2, 3, 4])), 5, "manual"))
    with pytest.raises(PartitionError):
        Partition((np.array([0, 1]), np.array([1, 2])), 3, "overlap")
    with pytest.raises(PartitionError):
        Partition((np.array([0]),), 2, "missing")


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.integers(4, 8), min_size=6, max_size=12), fraction=st.sampled_from([0.0, 0.2, 0.5]),
       seed=st.integers(0, 5))
def test_public_groups_are_whole_and_disjoint_from_every_client(sizes, fraction, seed):
    from nlp_models.data.dataset import TextDataset
    from nlp_models.data.partition import movie_clients, split_off_public_groups

    groups = [f"g{g}" for g, n in enumerate(sizes) for _ in range(n)]
    private, public = split_off_public_groups(groups, fraction=fraction, seed=seed)
    assert sorted([*private, *public]) == list(range(len(groups)))
    public_groups = {groups[i] for i in public}
    assert not public_groups & {groups[i] for i in private}  # a group is public whole, or not at all
    assert len(public_groups) == round(fraction * len(set(groups)))
    data = TextDataset(name="t", texts=tuple(f"x{i}" for i in range(len(groups))), labels=tuple(i % 2 for i in range(len(groups))),
                       label_names=("a", "b"), groups=tuple(groups))
    split = movie_clients(data, num_clients=2, test_fraction=0.25, public_fraction=fraction, seed=seed)
    held = {int(i) for c in split.clients for i in (*c.train, *c.test)}
    assert held.isdisjoint(int(i) for i in split.public) and set(split.public) == set(public)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(10, 200), clients=st.integers(1, 5), seed=seeds)
def test_a_partition_survives_its_json_record(n, clients, seed):
    import json

    partition = dirichlet_quantity_skew(n, num_clients=clients, beta=1.0, min_size=1, seed=seed)
    back = Partition.from_record(json.loads(json.dumps(partition.record())))
    assert same(back, partition) and (back.n, back.method, back.keys) == (partition.n, partition.method, partition.keys)
    keyed = natural_partition([f"g{i % clients}" for i in range(n)], seed=seed)
    assert Partition.from_record(json.loads(json.dumps(keyed.record()))).keys == keyed.keys
    with pytest.raises(PartitionError):  # a damaged record is refused, not half-built
        Partition.from_record({**partition.record(), "n": n + 1})
