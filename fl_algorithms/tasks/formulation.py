"""FedNLP's task formulations behind one contract, so that one benchmark grid runs any of them.

FedNLP (Lin et al., 2022) benchmarks four formulations: text classification, sequence tagging,
extractive question answering and seq2seq generation. Each lives in its own module under
`fl_algorithms.tasks` and exposes a `Formulation`: clients built from their own shard of a corpus
partitioned by a `PartitionSpec`, the server's initial shared parameters, the metric every client's
evaluation reports, and the score of the task's trivial baseline on the same test splits.

Partitions (FedNLP Section 3.2; all deterministic given the seed):

    iid            uniformly random, equal sizes
    label:ALPHA    Dir(ALPHA) label skew over class labels (classification only)
    quantity:BETA  client sizes ~ n Dir_K(BETA), contents IID
    cluster:ALPHA  Dir(ALPHA) label skew over k-means cluster ids of MiniLM sentence embeddings
                   (FedNLP's partition for tasks without a class label to skew)
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from fl_algorithms.training.trainer import LocalTrainer
from nlp_models.data.partition import (Partition, PartitionError, dirichlet_label_skew, dirichlet_quantity_skew,
                                       feature_cluster_skew, iid_partition)

TASKS = ("classification", "tagging", "qa", "seq2seq")
PARTITION_KINDS = ("iid", "label", "quantity", "cluster")


@dataclass(frozen=True)
class PartitionSpec:
    """How a corpus is spread over clients: 'iid', 'label:0.1', 'quantity:1', 'cluster:0.1'."""

    kind: str = "iid"
    alpha: float = 1.0
    """Dirichlet concentration (label and cluster skew) or beta (quantity skew); unused for iid."""
    clusters: int = 5
    """k of the k-means over sentence embeddings (cluster partitions)."""

    def __post_init__(self) -> None:
        if self.kind not in PARTITION_KINDS:
            raise ValueError(f"partition kind must be one of {', '.join(PARTITION_KINDS)}, got {self.kind!r}")
        if not (math.isfinite(self.alpha) and self.alpha > 0):
            raise ValueError(f"partition concentration must be a positive number, got {self.alpha}")
        if self.clusters < 2:
            raise ValueError(f"cluster partitions need at least 2 clusters, got {self.clusters}")

    @classmethod
    def parse(cls, text: str) -> "PartitionSpec":
        """'iid', 'label:ALPHA', 'quantity:BETA' or 'cluster:ALPHA' (clear errors otherwise)."""
        kind, _, value = text.strip().partition(":")
        if kind == "iid":
            if value:
                raise ValueError(f"'iid' takes no parameter, got {text!r}")
            return cls()
        if kind not in PARTITION_KINDS or not value:
            raise ValueError(f"partition must be iid, label:ALPHA, quantity:BETA or cluster:ALPHA, got {text!r}")
        try:
            alpha = float(value)
        except ValueError:
            raise ValueError(f"partition parameter of {text!r} is not a number") from None
        return cls(kind=kind, alpha=alpha)

    def __str__(self) -> str:
        return "iid" if self.kind == "iid" else f"{self.kind}:{self.alpha:g}"

    @property
    def needs_embeddings(self) -> bool:
        return self.kind == "cluster"

    def build(self, *, n: int, num_clients: int, seed: int, min_size: int, labels: np.ndarray | None = None,
              embeddings: Callable[[], np.ndarray] | None = None) -> Partition:
        """The partition of `n` examples; `labels` for label skew, `embeddings()` (called only when
        needed) for cluster skew. Raises ValueError naming what is missing or impossible."""
        try:
            if self.kind == "iid":
                if n < num_clients * min_size:
                    raise PartitionError(f"{n} examples cannot give {num_clients} clients {min_size} each")
                return iid_partition(n, num_clients=num_clients, seed=seed)
            if self.kind == "quantity":
                return dirichlet_quantity_skew(n, num_clients=num_clients, beta=self.alpha, seed=seed,
                                               min_size=min_size)
            if self.kind == "label":
                if labels is None:
                    raise ValueError("label skew needs class labels; this task has none (use cluster:ALPHA)")
                return dirichlet_label_skew(labels, num_clients=num_clients, alpha=self.alpha, seed=seed,
                                            min_size=min_size)
            if embeddings is None:
                raise ValueError("cluster skew needs sentence embeddings")
            return feature_cluster_skew(embeddings(), num_clients=num_clients, num_clusters=self.clusters,
                                        alpha=self.alpha, seed=seed, min_size=min_size)
        except PartitionError as error:
            raise ValueError(f"cannot build partition {self}: {error}") from None


@dataclass(frozen=True)
class FormulationSettings:
    """What every formulation's clients share: the partition, the model shape and the client optimiser.

    Clients train Houlsby adapters in the top `adapter_layers` layers of the frozen MiniLM (the layers
    below are computed once, `nlp_models.frozen_prefix`) plus the task's head, with AdamW at `lr`.
    """

    clients: int = 4
    partition: str = "iid"
    max_examples: int | None = 400
    """Cap on the corpus before partitioning (deterministic by seed); None keeps all of it."""
    max_length: int = 64
    """Tokens per input (the article body for seq2seq, the passage for QA)."""
    min_client_examples: int = 10
    adapter_layers: int = 2
    bottleneck: int = 16
    batch_size: int = 16
    lr: float = 1e-3
    seed: int = 0

    def __post_init__(self) -> None:
        checks = [
            (self.clients >= 2, "clients must be at least 2 (secure aggregation needs two)"),
            (self.max_examples is None or self.max_examples >= self.clients * self.min_client_examples,
             f"max_examples {self.max_examples} cannot give {self.clients} clients "
             f"{self.min_client_examples} examples each"),
            (8 <= self.max_length <= 512, "max_length must be in 8..512"),
            (self.min_client_examples >= 3, "min_client_examples must be at least 3 (train, validation, test)"),
            (self.adapter_layers >= 1 and self.bottleneck >= 1 and self.batch_size >= 1,
             "adapter_layers, bottleneck and batch_size must be positive"),
            (self.lr > 0, "lr must be positive"),
            (self.seed >= 0, "seed must be non-negative"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        PartitionSpec.parse(self.partition)  # a bad spec fails here, before any data is loaded

    @property
    def partition_spec(self) -> PartitionSpec:
        return PartitionSpec.parse(self.partition)


class Formulation(Protocol):
    """One task's federated clients (ids 1..num_clients) over a partitioned corpus."""

    task: str
    """One of TASKS."""
    metric: str
    """The key of the headline metric in every client's `evaluate()` result (e.g. 'accuracy')."""
    settings: FormulationSettings

    @property
    def num_clients(self) -> int: ...

    @property
    def partition(self) -> Partition: ...

    def make_trainer(self, client_id: int) -> LocalTrainer:
        """Client `client_id`'s trainer over its own train/validation/test shard only."""
        ...

    def initial(self) -> dict[str, np.ndarray]:
        """The shared parts of a freshly initialised (seeded) client model."""
        ...

    def trivial(self) -> float:
        """The trivial baseline's `metric`, the mean over clients of each client's test-split score."""
        ...


def mean_over_clients(scores: Sequence[float]) -> float:
    """The unweighted mean of per-client scores (FedNLP reports per-client averages the same way)."""
    if not scores:
        raise ValueError("no client scores")
    return float(np.mean(np.asarray(scores, dtype=np.float64)))


__all__ = ["TASKS", "PARTITION_KINDS", "PartitionSpec", "FormulationSettings", "Formulation", "mean_over_clients"]
