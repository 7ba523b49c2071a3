"""Cross-task, cross-silo clients (FedMCP, Zhao et al. 2024, Sec. V-A): each client is one offline
corpus and its own task, split 6:2:2 into train / validation / test, the training sets capped alike.

The whole corpus is split (stratified, redrawn per seed) and only then is the training split capped
to the smallest client's (or a given cap), as the paper caps training data: every client is tested
on the whole 20% test split of its corpus, so the test sets are large enough to rank methods (a cap
applied before the split left 60 test examples per client, 1.7 points per example).

No test text is trained on anywhere: each corpus is de-duplicated by its loader before it is split
(`nlp_models.data.loaders.deduplicate`), and a text held out for one client's test split is removed
from every other client's training and validation splits before the caps (RT subjectivity's review
half is drawn from the RT sentiment snippets: 1,083 shared texts), the count logged and added to the
split's `duplicates_removed`.

`build_client_data` tokenises every split once and caches the frozen prefix of the backbone
(`nlp_models.frozen_prefix.cache_texts`), so that every method, round and seed trains only the top
layers.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from nlp_models.data.dataset import DatasetSplits, TextDataset, cap, train_validation_test
from nlp_models.data.loaders import LOADERS, normalise_whitespace
from nlp_models.frozen_prefix import CachedSplit, cache_texts, prefix_split

SPLITS = ("train", "validation", "test")
LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClientTask:
    key: str
    """Loader name in nlp_models.data.loaders.LOADERS."""
    title: str
    options: Mapping[str, Any] | None = None

    def load(self) -> TextDataset:
        return LOADERS[self.key](**dict(self.options or {}))


CLIENT_TASKS = (
    ClientTask("rt_sentiment", "RT sentiment"),
    ClientTask("rt_subjectivity", "RT plot/review"),
    ClientTask("bbc_news", "BBC topic", {"max_chars": 2000}),  # 64-128 tokens need only the first lines
    ClientTask("debates_2016", "Debates party"),
)
"""FedMCP's four real offline tasks: sentiment, subjectivity, news topic, debate party."""


def split_clients(corpora: Mapping[str, TextDataset], *, cap_to: int | None, seed: int = 0,
                  test_cap: int | None = None) -> dict[str, DatasetSplits]:
    """Each corpus split 6:2:2 by `seed` (stratified); texts of any client's test split removed from
    every training and validation split (`without_held_out`); the training splits then capped
    (stratified) to min(smallest client's training split, cap_to), validation to a third of that (the
    6:2 ratio); the test split stays whole unless `test_cap` caps it (smoke runs and tests only)."""
    for name, value in (("cap", cap_to), ("test cap", test_cap)):
        if value is not None and value < 10:
            raise ValueError(f"{name} must be at least 10 examples per client, got {value}")
    splits = without_held_out({key: train_validation_test(d, seed=seed) for key, d in corpora.items()})
    train_size = min(len(s.train) for s in splits.values())
    if cap_to is not None:
        train_size = min(train_size, cap_to)
    validation_size = max(1, -(-train_size // 3))
    return {key: DatasetSplits(train=cap(s.train, train_size, seed=seed),
                               validation=cap(s.validation, validation_size, seed=seed),
                               test=cap(s.test, test_cap, seed=seed))
            for key, s in splits.items()}


def without_held_out(splits: Mapping[str, DatasetSplits]) -> dict[str, DatasetSplits]:
    """`splits` with every text of any client's test split (compared after whitespace normalisation)
    removed from every client's training and validation splits, in order; the count removed is logged
    and added to that split's `duplicates_removed`."""
    held_out = {normalise_whitespace(text) for parts in splits.values() for text in parts.test.texts}

    def clean(key: str, part: str, data: TextDataset) -> TextDataset:
        keep = [i for i, text in enumerate(data.texts) if normalise_whitespace(text) not in held_out]
        removed = len(data) - len(keep)
        if not removed:
            return data
        LOG.info("%s %s: %d texts held out for a test split removed", key, part, removed)
        return dataclasses.replace(data.subset(keep), duplicates_removed=data.duplicates_removed + removed)

    return {key: DatasetSplits(train=clean(key, "train", parts.train),
                               validation=clean(key, "validation", parts.validation), test=parts.test)
            for key, parts in splits.items()}


def load_client_splits(*, cap_to: int | None, seed: int = 0, tasks: Sequence[ClientTask] = CLIENT_TASKS,
                       test_cap: int | None = None) -> dict[str, DatasetSplits]:
    """`split_clients` over the packaged corpora of `tasks`: `cap_to` caps the training examples per client."""
    return split_clients({task.key: task.load() for task in tasks}, cap_to=cap_to, seed=seed, test_cap=test_cap)


@dataclass(frozen=True)
class ClientData:
    client_id: int
    key: str
    title: str
    num_labels: int
    splits: Mapping[str, CachedSplit]
    split_layer: int
    """Layers below this index are frozen and cached in ``CachedSplit.hidden`` (with this layer's attention
    output beside them, (N, L, 2H), when built with ``attended``)."""


def build_client_data(backbone: nn.Module, tokenizer: Any, splits: Mapping[str, DatasetSplits], *, max_length: int,
                      adapter_layers: int, tasks: Sequence[ClientTask] = CLIENT_TASKS, bf16: bool = False,
                      progress: Callable[[str], None] | None = None, attended: bool = True) -> list[ClientData]:
    """Clients 1..K in the order of `splits`, each split cached below the top `adapter_layers` layers, with
    the first adapted layer's attention output kept beside it (`attended`, `nlp_models.frozen_prefix`)."""
    split_layer = prefix_split(backbone, adapter_layers)
    titles = {task.key: task.title for task in tasks}
    clients = []
    for client_id, (key, parts) in enumerate(splits.items(), start=1):
        if progress is not None:
            progress(key)
        cached = {}
        for name in SPLITS:
            dataset = getattr(parts, name)
            cached[name] = cache_texts(backbone, tokenizer, dataset.texts, dataset.labels, max_length=max_length,
                                       split=split_layer, bf16=bf16, attended=attended)
        clients.append(ClientData(client_id=client_id, key=key, title=titles.get(key, key),
                                  num_labels=parts.train.num_labels, splits=cached, split_layer=split_layer))
    return clients


__all__ = ["SPLITS", "ClientTask", "CLIENT_TASKS", "split_clients", "without_held_out", "load_client_splits", "ClientData",
           "build_client_data"]
