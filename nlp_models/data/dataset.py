"""``TextDataset``, the one type every loader returns, and deterministic stratified splits and caps."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

DEFAULT_RATIOS = (0.6, 0.2, 0.2)


@dataclass(frozen=True)
class TextDataset:
    """Texts with labels, read-only.

    ``task`` is ``'sequence'`` (``labels[i]`` is an int index into ``label_names``) or ``'token'``
    (``labels[i]`` is a tuple of ints, one per word of ``words[i]``; ``texts[i]`` is the words joined
    by spaces). ``groups[i]`` is a natural client key (movie, speaker, ...) or ``groups`` is None.
    """

    name: str
    texts: tuple[str, ...]
    labels: tuple
    label_names: tuple[str, ...]
    groups: tuple[str, ...] | None = None
    words: tuple[tuple[str, ...], ...] | None = None
    task: str = "sequence"
    duplicates_removed: int = 0
    """How many repeated texts the loader removed before this dataset was capped or split (0: none, or
    not de-duplicated)."""

    def __post_init__(self) -> None:
        n = len(self.texts)
        if len(self.labels) != n:
            raise ValueError(f"{len(self.labels)} labels for {n} texts")
        for field, values in (("groups", self.groups), ("words", self.words)):
            if values is not None and len(values) != n:
                raise ValueError(f"{len(values)} {field} for {n} texts")
        if self.task not in ("sequence", "token"):
            raise ValueError(f"task must be 'sequence' or 'token', got {self.task!r}")
        if self.task == "token" and self.words is None:
            raise ValueError("a token-level dataset needs words")

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def num_labels(self) -> int:
        return len(self.label_names)

    def label_array(self) -> np.ndarray:
        """Sequence labels as an int64 array (for stratification and label-skew partitions)."""
        if self.task != "sequence":
            raise TypeError("token-level datasets have no single label per example")
        return np.asarray(self.labels, dtype=np.int64)

    def label_counts(self) -> dict[str, int]:
        """Examples per label (sequence tasks) or tags per label (token tasks)."""
        flat = self.label_array() if self.task == "sequence" else np.fromiter(
            (tag for row in self.labels for tag in row), dtype=np.int64
        )
        counts = np.bincount(flat, minlength=self.num_labels)
        return {name: int(count) for name, count in zip(self.label_names, counts)}

    def subset(self, indices: Sequence[int] | np.ndarray) -> TextDataset:
        """The examples at ``indices``, in that order."""
        order = [int(i) for i in indices]

        def pick(values):
            return None if values is None else tuple(values[i] for i in order)

        return TextDataset(
            name=self.name,
            texts=pick(self.texts),
            labels=pick(self.labels),
            label_names=self.label_names,
            groups=pick(self.groups),
            words=pick(self.words),
            task=self.task,
            duplicates_removed=self.duplicates_removed,
        )


@dataclass(frozen=True)
class DatasetSplits:
    train: TextDataset
    validation: TextDataset
    test: TextDataset


def largest_remainder(total: int, weights: Sequence[float]) -> np.ndarray:
    """Integer counts summing to ``total`` and proportional to ``weights`` (Hamilton's method)."""
    weights = np.asarray(weights, dtype=np.float64)
    if total < 0 or weights.ndim != 1 or weights.size == 0 or np.any(weights < 0) or weights.sum() <= 0:
        raise ValueError("need total >= 0 and non-negative weights with a positive sum")
    exact = total * weights / weights.sum()
    counts = np.floor(exact).astype(np.int64)
    shortfall = total - int(counts.sum())
    # ties broken by position, so the result is deterministic
    order = np.argsort(-(exact - counts), kind="stable")
    counts[order[:shortfall]] += 1
    return counts


def _check_ratios(ratios: Sequence[float]) -> np.ndarray:
    ratios = np.asarray(ratios, dtype=np.float64)
    if ratios.ndim != 1 or ratios.size == 0 or np.any(ratios < 0) or ratios.sum() <= 0:
        raise ValueError(f"ratios must be non-negative with a positive sum, got {ratios.tolist()}")
    return ratios


def split_indices(
    n: int,
    *,
    ratios: Sequence[float] = DEFAULT_RATIOS,
    seed: int = 0,
    labels: np.ndarray | None = None,
) -> list[np.ndarray]:
    """Partition ``range(n)`` into ``len(ratios)`` sorted index arrays, deterministically by ``seed``.

    With ``labels`` each class is split by the ratios on its own (stratified); the part sizes can then
    differ from ``n * ratio`` by at most the number of classes.
    """
    ratios = _check_ratios(ratios)
    rng = np.random.default_rng(seed)
    strata = [np.arange(n)] if labels is None else [np.flatnonzero(labels == c) for c in np.unique(labels)]
    parts: list[list[np.ndarray]] = [[] for _ in ratios]
    for members in strata:
        shuffled = rng.permutation(members)
        bounds = np.cumsum(largest_remainder(len(shuffled), ratios))[:-1]
        for part, chunk in zip(parts, np.split(shuffled, bounds)):
            part.append(chunk)
    return [np.sort(np.concatenate(part)).astype(np.int64) for part in parts]


def cap_indices(n: int, max_examples: int, *, seed: int = 0, labels: np.ndarray | None = None) -> np.ndarray:
    """Sorted indices of at most ``max_examples`` examples; with ``labels``, class shares are kept."""
    if max_examples < 1:
        raise ValueError(f"max_examples must be >= 1, got {max_examples}")
    if max_examples >= n:
        return np.arange(n, dtype=np.int64)
    rng = np.random.default_rng(seed)
    if labels is None:
        return np.sort(rng.choice(n, size=max_examples, replace=False)).astype(np.int64)
    classes, counts = np.unique(labels, return_counts=True)
    quotas = largest_remainder(max_examples, counts)
    chosen = [rng.choice(np.flatnonzero(labels == c), size=q, replace=False) for c, q in zip(classes, quotas)]
    return np.sort(np.concatenate(chosen)).astype(np.int64)


def cap(dataset: TextDataset, max_examples: int | None, *, seed: int = 0) -> TextDataset:
    """``dataset`` reduced to ``max_examples`` (stratified by label for sequence tasks); None keeps all."""
    if max_examples is None:
        return dataset
    labels = dataset.label_array() if dataset.task == "sequence" else None
    return dataset.subset(cap_indices(len(dataset), max_examples, seed=seed, labels=labels))


def train_validation_test(
    dataset: TextDataset,
    *,
    ratios: Sequence[float] = DEFAULT_RATIOS,
    seed: int = 0,
    stratify: bool = True,
) -> DatasetSplits:
    """Deterministic 6:2:2 (by default) split, stratified by label for sequence tasks."""
    if len(ratios) != 3:
        raise ValueError("ratios must be (train, validation, test)")
    labels = dataset.label_array() if stratify and dataset.task == "sequence" else None
    train, validation, test = split_indices(len(dataset), ratios=ratios, seed=seed, labels=labels)
    return DatasetSplits(dataset.subset(train), dataset.subset(validation), dataset.subset(test))
