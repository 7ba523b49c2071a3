"""TextDataset, largest-remainder counts, stratified splits and caps."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nlp_models.data.dataset import (
    TextDataset,
    cap_indices,
    largest_remainder,
    split_indices,
    train_validation_test,
)


def toy(n=50, classes=3):
    return TextDataset(
        name="toy",
        texts=tuple(f"text {i}" for i in range(n)),
        labels=tuple(i % classes for i in range(n)),
        label_names=tuple(f"c{k}" for k in range(classes)),
        groups=tuple(f"g{i % 7}" for i in range(n)),
    )


@settings(max_examples=50, deadline=None)
@given(total=st.integers(0, 10_000), weights=st.lists(st.floats(0.01, 10), min_size=1, max_size=8))
def test_largest_remainder_sums_and_is_within_one(total, weights):
    counts = largest_remainder(total, weights)
    exact = total * np.asarray(weights) / np.sum(weights)
    assert counts.sum() == total and np.all(np.abs(counts - exact) < 1)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 400), classes=st.integers(1, 6), seed=st.integers(0, 2**32 - 1))
def test_split_covers_every_index_once_and_is_deterministic(n, classes, seed):
    labels = np.arange(n) % classes
    parts = split_indices(n, seed=seed, labels=labels)
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(n))
    assert all(np.array_equal(a, b) for a, b in zip(parts, split_indices(n, seed=seed, labels=labels)))
    for part, ratio in zip(parts, (0.6, 0.2, 0.2)):
        assert abs(len(part) - ratio * n) <= classes


def test_train_validation_test_is_stratified():
    splits = train_validation_test(toy(300), seed=1)
    assert (len(splits.train), len(splits.validation), len(splits.test)) == (180, 60, 60)
    assert splits.test.label_counts() == {"c0": 20, "c1": 20, "c2": 20}
    assert not set(splits.train.texts) & set(splits.test.texts)
    assert splits.train.groups is not None


def test_cap_keeps_class_shares():
    labels = np.array([0] * 90 + [1] * 10)
    chosen = cap_indices(100, 20, seed=0, labels=labels)
    assert len(chosen) == 20 and np.sum(labels[chosen] == 1) == 2


def test_dataset_validates_lengths():
    with pytest.raises(ValueError):
        TextDataset(name="bad", texts=("a", "b"), labels=(0,), label_names=("x",))
    with pytest.raises(ValueError):
        TextDataset(name="bad", texts=("a",), labels=((0,),), label_names=("O",), task="token")
