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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
import torch
from torch import nn

from fl_algorithms.training.classification import TUNE
from fl_algorithms.training.protocol import TrainingProtocol
from fl_algorithms.training.trainer import LocalTrainer, OptimizerConfig, SeededTorchTrainer, flatten
from nlp_models.data.partition import (ClientSplit, Partition, PartitionError, client_splits, dirichlet_label_skew,
                                       dirichlet_quantity_skew, feature_cluster_skew, iid_partition)
from nlp_models.device import resolve_device
from nlp_models.frozen_prefix import prefix_split

TASKS = ("classification", "tagging", "qa", "seq2seq")
SPLITS = ("train", "validation", "test")
EVAL_BATCH_SIZE = 64
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
    below are computed once, `nlp_models.frozen_prefix`) plus the task's head, at client lr `lr` (the
    optimiser and its lifetime are the run's `TrainingProtocol`, `make_trainer(protocol=...)`); with
    `tune='layers'` they train those top layers whole instead (FedNLP fine-tunes whole models; 6 of
    MiniLM's 6 layers is everything but the embeddings), where the formulation offers it.
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
    sgd_lr: float | None = None
    """The lr of clients a training protocol runs with SGD (FedNLP's FedAvg and FedProx); None: `lr`, as
    FedNLP's scripts pass one lr to every algorithm (`fl_algorithms.training.protocol.fednlp_protocol`)."""
    seed: int = 0
    tune: str = "adapters"
    """'adapters' (adapters in the top `adapter_layers` layers train) or 'layers' (those layers train whole)."""
    length_groups: int = 0
    """With k > 0, each run of k consecutive training batches of an epoch's random order is sorted by
    length before it is cut into batches (`length_grouped`): less padding, batches still drawn at random.
    0 keeps the random order as it is."""

    def __post_init__(self) -> None:
        checks = [
            (self.clients >= 1, "clients must be at least 1 (one client is centralised training)"),
            (self.max_examples is None or self.max_examples >= self.clients * self.min_client_examples,
             f"max_examples {self.max_examples} cannot give {self.clients} clients "
             f"{self.min_client_examples} examples each"),
            (8 <= self.max_length <= 512, "max_length must be in 8..512"),
            (self.min_client_examples >= 3, "min_client_examples must be at least 3 (train, validation, test)"),
            (self.adapter_layers >= 1 and self.bottleneck >= 1 and self.batch_size >= 1,
             "adapter_layers, bottleneck and batch_size must be positive"),
            (self.lr > 0, "lr must be positive"),
            (self.sgd_lr is None or self.sgd_lr > 0, "sgd_lr must be positive"),
            (self.tune in TUNE, f"tune must be one of {', '.join(TUNE)}, got {self.tune!r}"),
            (self.seed >= 0, "seed must be non-negative"),
            (self.length_groups >= 0, "length_groups must be non-negative"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        PartitionSpec.parse(self.partition)  # a bad spec fails here, before any data is loaded

    @property
    def partition_spec(self) -> PartitionSpec:
        return PartitionSpec.parse(self.partition)


def length_grouped(order: torch.Tensor, lengths: torch.Tensor, *, batch_size: int, groups: int) -> torch.Tensor:
    """`order` with each run of `groups * batch_size` consecutive examples sorted by `lengths`, longest
    first (ties keep their order), so that batches cut from it in turn need little padding (transformers'
    group_by_length, with runs of a few batches so that each epoch still draws its batches at random).
    `groups=0` returns `order` unchanged."""
    if groups < 0 or batch_size < 1:
        raise ValueError("groups must be non-negative and batch_size positive")
    if groups == 0:
        return order
    run = groups * batch_size
    keys = lengths.to(order.device)[order]  # a split's lengths may live on the GPU, the order on the CPU
    parts = [order[start:start + run][torch.argsort(keys[start:start + run], descending=True, stable=True)]
             for start in range(0, len(order), run)]
    return torch.cat(parts) if parts else order


T = TypeVar("T")


@dataclass(frozen=True)
class Shards(Generic[T]):
    """A formulation's corpus (`data`), its partition and every client's 60/20/20 split: what a
    subclass's cached `corpus` holds (QA keeps more, see `tasks.qa.QACorpus`)."""

    data: T
    partition: Partition
    splits: tuple[ClientSplit, ...]


class Formulation(Protocol):
    """One task's federated clients (ids 1..num_clients) over a partitioned corpus."""

    task: str
    """One of TASKS."""
    metric: str
    """The key of the headline metric in every client's `evaluate()` result (e.g. 'accuracy')."""
    settings: FormulationSettings
    device: torch.device
    """Where the clients train (results name it: devices agree only up to floating-point order)."""

    @property
    def num_clients(self) -> int: ...

    @property
    def partition(self) -> Partition: ...

    def make_trainer(self, client_id: int, *, protocol: TrainingProtocol | None = None) -> LocalTrainer:
        """Client `client_id`'s trainer over its own train/validation/test shard only, training under
        `protocol` (None: AdamW at the settings' lr kept across rounds, the formulations' earlier default)."""
        ...

    def initial(self) -> dict[str, np.ndarray]:
        """The shared parts of a freshly initialised (seeded) client model."""
        ...

    def train_sizes(self) -> list[int]:
        """Training examples per client (the secure sums' weights)."""
        ...

    def trivial(self) -> float:
        """The trivial baseline's `metric`, the mean over clients of each client's test-split score."""
        ...

    def pooled(self, metrics: Mapping[int, Mapping[str, float]]) -> float:
        """`metric` over the union of the clients' test splits, from each client's test metrics (by
        client id): FedNLP's score, its global model on the global test set (its
        `test_on_the_server` concatenates the clients' test data)."""
        ...


def mean_over_clients(scores: Sequence[float]) -> float:
    """The unweighted mean of per-client scores: every client counts once, whatever its size (the
    grid's `score`; `Formulation.pooled` is the score over all test examples instead)."""
    if not scores:
        raise ValueError("no client scores")
    return float(np.mean(np.asarray(scores, dtype=np.float64)))



class FormulationClients:
    """What every formulation's clients share: the frozen backbone, the partition and per-client
    splits, the initial shared parameters and the trivial baseline's mean over clients.

    A subclass provides `corpus` (a cached `Shards`, or any object with `.partition` and `.splits`), `_model()` (a
    fresh seeded client model), `shared_parts(model)`, `client_data`, `make_trainer` and
    `trivial_scores(client_id)`; `prefix_adapters = False` where no adapted prefix split applies, and
    `tunes` the `FormulationSettings.tune` values its `_model()` can build.
    """

    task: str
    metric: str
    prefix_adapters = True
    transformers_backbone = False
    """Whether the clients need transformers' model and tokenizer (offsets, word ids, EncoderDecoderModel):
    otherwise they get `nlp_models.bert.Bert`, which starts a client process without importing transformers."""
    tunes: tuple[str, ...] = ("adapters",)

    def __init__(self, settings: FormulationSettings, *, backbone: str = "minilm", device: str = "cpu") -> None:
        if settings.tune not in self.tunes:
            raise ValueError(f"the {self.task} clients cannot tune {settings.tune!r}; they offer {', '.join(self.tunes)}")
        self.settings, self.backbone_name = settings, backbone
        self.device = resolve_device(device)
        self._data: dict[int, Any] = {}

    @cached_property
    def backbone(self) -> tuple[nn.Module, Any]:
        """The frozen backbone on the clients' device and its tokenizer (checked against the settings)."""
        from fl_algorithms.tasks.fednlp import load_named_backbone

        model, tokenizer = load_named_backbone(self.backbone_name, hf=self.transformers_backbone)
        if self.prefix_adapters:
            try:
                prefix_split(model, self.settings.adapter_layers)
            except ValueError as error:
                raise ValueError(f"adapter_layers: {error}") from None
        if self.settings.max_length > model.config.max_position_embeddings:
            raise ValueError(f"max_length {self.settings.max_length} exceeds the backbone's "
                             f"{model.config.max_position_embeddings} positions")
        return model.requires_grad_(False).to(self.device), tokenizer

    @property
    def split(self) -> int:
        """Frozen bottom layers (the cached prefix) below the adapted top layers."""
        return prefix_split(self.backbone[0], self.settings.adapter_layers)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Mean-pooled backbone sentence embeddings (for 'cluster:ALPHA' partitions only)."""
        from nlp_models.data.embed import embed_texts

        model, tokenizer = self.backbone
        return embed_texts(texts, model=model, tokenizer=tokenizer, max_length=self.settings.max_length,
                           progress=False)

    def shard(self, *, n: int, labels: np.ndarray | None, texts: Sequence[str],
              stratify: bool = False) -> tuple[Partition, tuple[ClientSplit, ...]]:
        """The settings' partition of `n` examples and each client's 60/20/20 split (stratified by
        `labels` when `stratify`); `texts` are embedded only for cluster partitions."""
        s = self.settings
        partition = s.partition_spec.build(n=n, num_clients=s.clients, seed=s.seed, min_size=s.min_client_examples,
                                           labels=labels, embeddings=lambda: self.embed(texts))
        try:
            splits = client_splits(partition, seed=s.seed, labels=labels if stratify else None)
        except PartitionError as error:
            raise ValueError(f"cannot split the clients of partition {s.partition}: {error}") from None
        return partition, tuple(splits)

    @property
    def num_clients(self) -> int:
        return len(self.corpus.splits)

    @property
    def partition(self) -> Partition:
        return self.corpus.partition

    def client_split(self, client_id: int) -> ClientSplit:
        """Client `client_id`'s corpus indices (a clear error for an id outside 1..K)."""
        if not 1 <= client_id <= self.num_clients:
            raise ValueError(f"client id {client_id} is not in 1..{self.num_clients}")
        return self.corpus.splits[client_id - 1]

    def rows(self, client_id: int) -> dict[str, np.ndarray]:
        split = self.client_split(client_id)
        return {name: np.asarray(getattr(split, name), dtype=np.int64) for name in SPLITS}

    def train_sizes(self) -> list[int]:
        """Training examples per client (the secure sums' weights)."""
        return [len(split.train) for split in self.corpus.splits]

    def split_trainer(self, client_id: int, *, model: nn.Module, data: Mapping[str, Any], loss_fn: Any,
                      metric_fn: Any, protocol: TrainingProtocol | None = None) -> SeededTorchTrainer:
        """A client over its own splits (`.batches(size, order=)`): reshuffled training batches each
        epoch, evaluation on 'validation' and 'test', training under `protocol` (None: AdamW at the
        settings' lr, kept across rounds)."""
        train, s = data["train"], self.settings
        if len(train) == 0:
            raise ValueError(f"client {client_id} has no training examples")
        lengths = train.lengths  # fixed for the client's life: counted once, not every epoch
        return SeededTorchTrainer(
            client_id=client_id, seed=s.seed, model=model, shared=self.shared_parts(model),
            train_batches=lambda: train.batches(s.batch_size, order=length_grouped(
                torch.randperm(len(train)), lengths, batch_size=s.batch_size, groups=s.length_groups)),
            eval_batches={name: (lambda d=data[name]: d.batches(EVAL_BATCH_SIZE)) for name in ("validation", "test")},
            num_examples=len(train), loss_fn=loss_fn, metric_fn=metric_fn,
            optimizer=OptimizerConfig(name="adamw", lr=s.lr), protocol=protocol)

    def initial(self) -> dict[str, np.ndarray]:
        """The shared parts of a freshly initialised client model (seeded: every client starts there)."""
        model = self._model()
        named = dict(model.named_parameters())
        return {part: flatten([named[n] for n in names]) for part, names in self.shared_parts(model).items()}

    def trivial(self) -> float:
        """The trivial baseline's `metric`, the mean over clients of each client's test score."""
        return mean_over_clients([self.trivial_scores(k)[self.metric] for k in range(1, self.num_clients + 1)])

    def pooled(self, metrics: Mapping[int, Mapping[str, float]]) -> float:
        """`metric` over the union of the test splits, for a metric that is a mean over test examples
        (accuracy, SQuAD F1 over questions, ROUGE over articles): each client's score weighted by its
        example count `n` (its test split's size where the metrics give none). A metric that is not
        such a mean (span F1) overrides this."""
        weights = [float(m["n"]) if "n" in m else float(len(self.rows(k)["test"])) for k, m in metrics.items()]
        if sum(weights) <= 0:
            raise ValueError("no test examples to pool")
        return float(np.average([m[self.metric] for m in metrics.values()], weights=weights))


__all__ = ["TASKS", "SPLITS", "PARTITION_KINDS", "PartitionSpec", "FormulationSettings", "length_grouped", "Shards",
           "Formulation", "mean_over_clients", "FormulationClients"]
