"""Federated continual text classification for FedSeIT / FedWeIT, on offline stand-ins.

The reference (RaiPranav/FCL-FedSeIT, ``--gen-num-tasks 15 --num-pick-tasks 5 --split-option
non_iid``) cuts Reuters-8 / TMN / TREC label sets into a pool of tasks and gives each of 3 clients its
own random sequence of 5. Those corpora and GloVe are not available offline; the pool here
(`POOL`, stated in docs/results/fedseit.md) is ten binary tasks from the shipped corpora:

* five BBC topic pairs (each topic in two pairs), as the reference's label subsets of one corpus;
* Rotten Tomatoes polarity (rotten / fresh) and subjectivity (plot summary / review);
* 2016 debates: the speaker's party;
* tweets that mention a person / a geo-location (annotated entities) vs tweets that do not, balanced.

Each client draws `tasks_per_client` distinct tasks in a seeded random order (non-IID: clients hold
different tasks and different orders); a task drawn by several clients is split between them, so no
document is held twice. Each (client, task) keeps at most `max_train` training and `max_test` test
documents. Text is WordPiece-tokenised with MiniLM's tokenizer and cut to `max_length` tokens; the
CNN's frozen word vectors are MiniLM's token-embedding matrix (the reference uses GloVe 840B).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache

import numpy as np
import torch

from nlp_models.data.loaders import load_bbc_news, load_debates_2016, load_rt_sentiment, load_rt_subjectivity, load_tweets_ner


@dataclass(frozen=True)
class TaskSpec:
    """One task of the pool: a corpus and the labels that define it."""

    name: str
    corpus: str
    labels: tuple[str, ...] = ()
    """BBC: the two topics; tweets: the entity type whose mention is the positive class."""


POOL: tuple[TaskSpec, ...] = (
    TaskSpec("bbc_business_tech", "bbc", ("business", "tech")),
    TaskSpec("bbc_politics_entertainment", "bbc", ("politics", "entertainment")),
    TaskSpec("bbc_sports_business", "bbc", ("sports", "business")),
    TaskSpec("bbc_tech_politics", "bbc", ("tech", "politics")),
    TaskSpec("bbc_entertainment_sports", "bbc", ("entertainment", "sports")),
    TaskSpec("rt_polarity", "rt_polarity"),
    TaskSpec("rt_subjectivity", "rt_subjectivity"),
    TaskSpec("debates_party", "debates"),
    TaskSpec("tweets_person", "tweets", ("person",)),
    TaskSpec("tweets_geo", "tweets", ("geo-loc",)),
)
POOL_NAMES = tuple(spec.name for spec in POOL)


@dataclass(frozen=True)
class ContinualSettings:
    """Clients, task sequences and sizes (the model and optimiser live in the trainer's config)."""

    clients: int = 3
    tasks_per_client: int = 5
    max_train: int = 300
    max_test: int = 150
    max_length: int = 48
    seed: int = 0
    pool: tuple[str, ...] = POOL_NAMES

    def __post_init__(self) -> None:
        object.__setattr__(self, "pool", tuple(self.pool))
        unknown = set(self.pool) - set(POOL_NAMES)
        if unknown or len(set(self.pool)) != len(self.pool):
            raise ValueError(f"pool must be distinct task names from {', '.join(POOL_NAMES)}, got {self.pool}")
        if self.clients < 2:
            raise ValueError(f"need at least 2 clients, got {self.clients}")
        if not 1 <= self.tasks_per_client <= len(self.pool):
            raise ValueError(f"tasks_per_client must be in 1..{len(self.pool)}, got {self.tasks_per_client}")
        if self.max_train < 8 or self.max_test < 4:
            raise ValueError("need max_train >= 8 and max_test >= 4")
        if self.max_length < 5:
            raise ValueError("max_length must be at least 5 (the widest kernel)")
        if self.seed < 0:
            raise ValueError("seed must be >= 0")

    def record(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TaskData:
    """One client's share of one task: texts and labels (0/1), train and test."""

    name: str
    label_names: tuple[str, ...]
    train_texts: tuple[str, ...]
    train_labels: np.ndarray
    test_texts: tuple[str, ...]
    test_labels: np.ndarray

    @property
    def num_classes(self) -> int:
        return len(self.label_names)


@lru_cache(maxsize=None)
def task_examples(name: str) -> tuple[tuple[str, ...], np.ndarray, tuple[str, ...]]:
    """All distinct examples of a pool task: texts, labels, label names (binary; a repeated text is
    kept once, so clients that split a task never share a document; tweet tasks balanced by a fixed
    seed, so every run sees the same examples)."""
    texts, labels, names = _task_examples(name)
    first: dict[str, int] = {}
    for index, text in enumerate(texts):
        first.setdefault(text, index)
    keep = np.array(sorted(first.values()), dtype=np.int64)
    return tuple(texts[i] for i in keep), labels[keep], names


def _task_examples(name: str) -> tuple[tuple[str, ...], np.ndarray, tuple[str, ...]]:
    spec = {s.name: s for s in POOL}[name]
    if spec.corpus == "bbc":
        data = load_bbc_news()
        ids = [data.label_names.index(topic) for topic in spec.labels]
        keep = [i for i, label in enumerate(data.labels) if label in ids]
        return (tuple(data.texts[i] for i in keep), np.array([ids.index(data.labels[i]) for i in keep]),
                spec.labels)
    if spec.corpus in ("rt_polarity", "rt_subjectivity", "debates"):
        data = {"rt_polarity": load_rt_sentiment, "rt_subjectivity": load_rt_subjectivity,
                "debates": load_debates_2016}[spec.corpus]()
        return data.texts, data.label_array(), data.label_names
    data = load_tweets_ner()
    wanted = {i for i, tag in enumerate(data.label_names) if tag == f"B-{spec.labels[0]}"}
    positive = np.array([bool(wanted & set(tags)) for tags in data.labels])
    pos, neg = np.flatnonzero(positive), np.flatnonzero(~positive)
    neg = np.sort(np.random.default_rng(0).choice(neg, size=len(pos), replace=False))
    keep = np.sort(np.concatenate([pos, neg]))
    return tuple(data.texts[i] for i in keep), positive[keep].astype(np.int64), (f"no {spec.labels[0]}", spec.labels[0])


def assign_tasks(settings: ContinualSettings) -> dict[int, tuple[str, ...]]:
    """Each client's task sequence: distinct pool tasks in a seeded random order (clients 1..n)."""
    rng = np.random.default_rng([settings.seed, 0xC0])
    return {k: tuple(settings.pool[i] for i in rng.choice(len(settings.pool), settings.tasks_per_client, replace=False))
            for k in range(1, settings.clients + 1)}


def _stratified_take(labels: np.ndarray, order: np.ndarray, count: int) -> np.ndarray:
    """The first `count` of `order`, alternating classes while both last (keeps small splits balanced)."""
    by_class = [order[labels[order] == c] for c in np.unique(labels[order])]
    picked, cursor = [], [0] * len(by_class)
    while len(picked) < count and any(cursor[c] < len(by_class[c]) for c in range(len(by_class))):
        for c in range(len(by_class)):
            if cursor[c] < len(by_class[c]) and len(picked) < count:
                picked.append(by_class[c][cursor[c]])
                cursor[c] += 1
    return np.array(picked, dtype=np.int64)


def build_tasks(settings: ContinualSettings) -> dict[int, list[TaskData]]:
    """Every client's task sequence with its data; a task held by several clients is split between them."""
    sequences = assign_tasks(settings)
    holders: dict[str, list[int]] = {}
    for client, names in sequences.items():
        for name in names:
            holders.setdefault(name, []).append(client)
    shares: dict[tuple[int, str], TaskData] = {}
    for name, clients in holders.items():
        texts, labels, label_names = task_examples(name)
        order = np.random.default_rng([settings.seed, POOL_NAMES.index(name)]).permutation(len(texts))
        for part, client in zip(np.array_split(order, len(clients)), clients):
            test = _stratified_take(labels, part, min(settings.max_test, len(part) // 3))
            rest = np.setdiff1d(part, test, assume_unique=True)
            rest = part[np.isin(part, rest)]                        # keep the shuffled order
            train = _stratified_take(labels, rest, settings.max_train)
            shares[(client, name)] = TaskData(
                name=name, label_names=label_names,
                train_texts=tuple(texts[i] for i in train), train_labels=labels[train].astype(np.int64),
                test_texts=tuple(texts[i] for i in test), test_labels=labels[test].astype(np.int64))
    return {client: [shares[(client, name)] for name in names] for client, names in sequences.items()}


@dataclass(frozen=True)
class EncodedSplit:
    """Token ids and attention mask (N x L) with labels, ready for the CNN."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def encode(tokenizer, texts: Sequence[str], labels: np.ndarray, *, max_length: int) -> EncodedSplit:
    """WordPiece ids cut/padded to `max_length` (the valid convolution needs the widest kernel's width)."""
    batch = tokenizer(list(texts), max_length=max_length, truncation=True, padding="max_length", return_tensors="pt")
    return EncodedSplit(batch["input_ids"], batch["attention_mask"], torch.as_tensor(np.asarray(labels), dtype=torch.long))


def task_statistics(tasks: Mapping[int, Sequence[TaskData]]) -> list[dict]:
    """One row per (client, position): task, train/test sizes and the positive share (for the results page)."""
    return [{"client": client, "position": position, "task": task.name, "train": len(task.train_texts),
             "test": len(task.test_texts), "positive_share": float(np.mean(task.train_labels))}
            for client, sequence in sorted(tasks.items()) for position, task in enumerate(sequence)]


__all__ = ["TaskSpec", "POOL", "POOL_NAMES", "ContinualSettings", "TaskData", "task_examples", "assign_tasks",
           "build_tasks", "EncodedSplit", "encode", "task_statistics"]
