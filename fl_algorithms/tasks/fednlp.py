"""FedNLP text classification (Lin et al., 2022) as a Task that both runtimes run the same way.

BBC News topics under a per-class Dirichlet label skew; a frozen encoder (MiniLM-L6 by default) with
adapters in its top layers and a linear head (`fl_algorithms.training.classification`).

Methods as FedNLP names them: FedAvg, FedProx and FedOPT, FedNLP's FedOPT being client AdamW with server
SGD with momentum (FedAvgM: lr 0.1, momentum 0.9, as its scripts; its text fixes the server lr at 1.0);
'fedadam' is Reddi et al.'s server Adam (what this task's 'fedopt' ran before, `fedopt_server='adam'`).
Clients train under the declared protocol `settings.training_protocol` (default FedNLP's: SGD for
FedAvg and FedProx, AdamW for FedOPT, fresh each round with a linear warmup and decay, clip norm 1.0;
`fl_algorithms.training.protocol`), the same in a simulation and in every deployed client process.

Each client builds its trainer from its own documents only: it loads the corpus, takes its shard of
the seeded partition, tokenises and caches the frozen prefix of those documents alone. The
simulation builds every client through the same `FedNLPClients.make_trainer`, so a simulated run and
a deployed one (`python -m fl_algorithms.deploy_cli client --task fl_algorithms.tasks.fednlp:build`)
train identical clients. SIMPLIFICATION: in a real deployment each client would hold its own data;
here every client process loads the packaged corpus and keeps only its shard.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from functools import cached_property
from typing import Any

import numpy as np
import torch

from fl_algorithms.algorithms.fedavg import FedAvg
from fl_algorithms.algorithms.fedopt import FedAdam, FedAvgM, FedOpt
from fl_algorithms.algorithms.fedprox import FedProx
from fl_algorithms.api import Algorithm
from fl_algorithms.engine.secure_sum import SecureAggregationConfig
from fl_algorithms.experiments.task import Task, check_options, int_option, settings_option
from fl_algorithms.training.classification import TextTaskConfig, client_model, shared_parts, text_trainer
from fl_algorithms.training.protocol import PRESETS, TrainingProtocol, preset
from fl_algorithms.training.trainer import SeededTorchTrainer, flatten
from nlp_models.data.dataset import TextDataset
from nlp_models.data.partition import ClientSplit, Partition, PartitionError, client_splits, dirichlet_label_skew
from nlp_models.device import resolve_device
from nlp_models.frozen_prefix import CachedSplit, cache_splits, prefix_split

METHODS = ("fedavg", "fedprox", "fedopt", "fedadam")
DEFAULT_METHODS = ("fedavg", "fedprox", "fedopt")
"""FedNLP's three; 'fedadam' (Reddi et al.'s server Adam) runs when asked for."""
FEDOPT_SERVERS = ("sgdm", "adam")
BACKBONES = ("minilm", "tiny")
TASK_OPTIONS = ("settings", "method", "backbone", "device", "threads")


@dataclass(frozen=True)
class FedNLPSettings:
    """Everything that defines one seed's run (saved in the run directory; --resume reuses it)."""

    quick: bool = False
    max_docs: int | None = None
    """Cap on BBC articles (stratified); None keeps all distinct ones."""
    max_length: int = 128
    clients: int = 20
    alpha: float = 0.5
    min_client_docs: int = 20
    rounds: int = 30
    clients_per_round: int | None = 10
    local_epochs: int = 1
    adapter_layers: int = 2
    bottleneck: int = 16
    batch_size: int = 16
    client_lr: float = 3e-2
    """The AdamW lr (FedOPT's clients under 'fednlp'; every client under 'federated-norm' and 'kept-adamw').
    3e-2: the best final-round validation accuracy of FedOPT under 'fednlp' over {3e-3, 1e-2, 3e-2, 1e-1}
    (0.515, 0.854, 0.910, 0.378; the --quick data, seed 0, 2026-11-29). Runs before 2026-11-29 used 1e-2."""
    sgd_lr: float | None = 3.0
    """The lr of the clients a protocol runs with SGD (FedNLP's FedAvg and FedProx; None: `client_lr`, as
    FedNLP's scripts pass one lr to every algorithm). 3.0: the best final-round validation accuracy of FedAvg
    under 'fednlp' over {1e-2, 3e-2, 0.1, 0.3, 1, 3, 10} (0.251, 0.437, 0.663, 0.742, 0.894, 0.919, 0.270;
    same pilot). Large because clipping to norm 1.0 bounds each step to lr and the round's linear warmup
    and decay average the lr down to about half; runs before 2026-11-29 used `client_lr` (None)."""
    fedprox_mu: float = 0.01
    server_lr: float = 1e-2
    """FedAdam's server lr (chosen on validation for server Adam, see examples/fednlp_classification.py);
    FedOPT's too when `fedopt_server='adam'`."""
    fedopt_server: str = "sgdm"
    """FedOPT's server optimiser: 'sgdm' (FedNLP's: SGD with momentum, FedAvgM) or 'adam' (what this
    task's 'fedopt' ran before protocols were declared: Reddi et al.'s FedAdam at `server_lr`)."""
    fedavgm_lr: float = 0.1
    """FedOPT's server SGD lr (FedNLP's scripts pass 0.1; its text, Sec. 2.2 and App. F.3, states 1.0)."""
    fedavgm_momentum: float = 0.9
    """FedOPT's server momentum (FedNLP App. F.3: 0.9)."""
    training_protocol: str = "fednlp"
    """How the clients train: a preset of `fl_algorithms.training.protocol.PRESETS` ('fednlp', 'federated-norm',
    'kept-adamw'), built per method at `client_lr` (`FedNLPClients.protocol`)."""
    clip: float = 1.0
    """Fixed-point range of each uploaded delta coordinate (clipped values are counted and reported)."""
    min_release_group: int = 5
    """Fewest clients in a released noise-free sum (SecureAggregationConfig.min_release_group)."""
    seed: int = 0
    data: str | None = None
    """Your own classification file or folder (CSV/TSV/JSONL/save_to_disk) instead of BBC News."""
    text_col: str = "text"
    label_col: str = "label"

    def __post_init__(self) -> None:
        checks = [
            (self.max_docs is None or self.max_docs >= 2, "--max-docs must be at least 2"),
            (8 <= self.max_length <= 512, "--max-length must be in 8..512"),
            (self.clients >= 2, "--clients must be at least 2 (secure aggregation needs two)"),
            (math.isfinite(self.alpha) and self.alpha > 0, "--alpha must be a positive number"),
            (self.min_client_docs >= 3, "--min-client-docs must be at least 3 (train, validation, test)"),
            (self.rounds >= 1, "--rounds must be at least 1"),
            (self.clients_per_round is None or 2 <= self.clients_per_round <= self.clients,
             "--clients-per-round must be in 2..--clients"),
            (self.local_epochs >= 1, "--local-epochs must be at least 1"),
            (self.adapter_layers >= 1, "--adapter-layers must be at least 1"),
            (self.bottleneck >= 1 and self.batch_size >= 1, "--bottleneck and --batch-size must be positive"),
            (self.client_lr > 0 and self.fedprox_mu >= 0, "need --client-lr > 0 and --fedprox-mu >= 0"),
            (self.sgd_lr is None or (math.isfinite(self.sgd_lr) and self.sgd_lr > 0), "--sgd-lr must be positive"),
            (self.server_lr > 0 and self.fedavgm_lr > 0, "--server-lr and --fedavgm-lr must be positive"),
            (0 <= self.fedavgm_momentum < 1, "--fedavgm-momentum must be in [0, 1)"),
            (self.fedopt_server in FEDOPT_SERVERS, f"--fedopt-server must be one of {', '.join(FEDOPT_SERVERS)}"),
            (self.training_protocol in PRESETS,
             f"--training-protocol must be one of {', '.join(PRESETS)}, got {self.training_protocol!r}"),
            (self.clip > 0, "--clip must be positive"),
            (self.min_release_group >= 2, "--min-release-group must be at least 2"),
            (self.seed >= 0, "seeds must be non-negative"),
        ]
        if self.max_docs is not None and self.max_docs < self.clients * self.min_client_docs:
            checks.append((False, f"--max-docs {self.max_docs} cannot give {self.clients} clients "
                                  f"{self.min_client_docs} documents each"))
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @property
    def task_config(self) -> TextTaskConfig:
        return TextTaskConfig(adapter_layers=self.adapter_layers, bottleneck=self.bottleneck,
                              batch_size=self.batch_size, lr=self.client_lr, seed=self.seed)


QUICK = dict(quick=True, max_docs=600, max_length=64, clients=8, rounds=8, clients_per_round=4, min_release_group=4)


def make_algorithm(method: str, settings: FedNLPSettings) -> Algorithm:
    """FedAvg, FedProx (mu), FedOPT as FedNLP runs it (server SGD with momentum; with
    `fedopt_server='adam'`, server Adam as this task ran it before) or FedAdam (server Adam, tau 1e-3 as
    in Reddi et al.)."""
    if method == "fedavg":
        return FedAvg(local_epochs=settings.local_epochs)
    if method == "fedprox":
        return FedProx(mu=settings.fedprox_mu, local_epochs=settings.local_epochs)
    if method == "fedopt" and settings.fedopt_server == "sgdm":
        return FedAvgM(server_lr=settings.fedavgm_lr, beta1=settings.fedavgm_momentum,
                       local_epochs=settings.local_epochs)
    if method == "fedopt":
        return FedOpt(server_optimizer="adam", server_lr=settings.server_lr, tau=1e-3,
                      local_epochs=settings.local_epochs)
    if method == "fedadam":
        return FedAdam(server_lr=settings.server_lr, tau=1e-3, local_epochs=settings.local_epochs)
    raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")


def secure_config(settings: FedNLPSettings, *, protocol: str, max_weight: int) -> SecureAggregationConfig:
    """Fixed-point range `clip` per coordinate, weights up to the largest client's example count."""
    return SecureAggregationConfig(protocol=protocol, clip=settings.clip, max_weight=float(max_weight),
                                   max_clients=settings.clients, min_release_group=settings.min_release_group)


@dataclass(frozen=True)
class Corpus:
    """The seeded corpus and partition every process derives identically."""

    dataset: TextDataset
    labels: np.ndarray
    partition: Partition
    splits: tuple[ClientSplit, ...]


def load_corpus(settings: FedNLPSettings) -> Corpus:
    """BBC News (duplicates dropped, articles cut to ~12 characters per token: tokenising less text
    only saves time) or `settings.data`, partitioned with Dir(alpha) label skew, each client split
    60/20/20. A bad own-data file raises `nlp_models.data.own.DataError` (a ValueError) naming it."""
    if settings.data is not None:
        from nlp_models.data.own import load_classification

        dataset = load_classification(settings.data, text_col=settings.text_col, label_col=settings.label_col,
                                      max_examples=settings.max_docs, seed=settings.seed)
    else:
        from nlp_models.data.loaders import load_bbc_news

        dataset = load_bbc_news(max_examples=settings.max_docs, seed=settings.seed, dedupe=True,
                                max_chars=12 * settings.max_length)
    labels = dataset.label_array()
    try:
        partition = dirichlet_label_skew(labels, num_clients=settings.clients, alpha=settings.alpha,
                                         seed=settings.seed, min_size=settings.min_client_docs)
        splits = client_splits(partition, seed=settings.seed, labels=labels)
    except PartitionError as error:
        raise ValueError(f"cannot partition {len(dataset)} documents: {error}") from None
    return Corpus(dataset, labels, partition, tuple(splits))


def load_named_backbone(name: str) -> tuple[torch.nn.Module, Any]:
    """'minilm' (the packaged all-MiniLM-L6-v2) or 'tiny' (a seeded 2-layer random BERT for smoke runs)."""
    from nlp_models.backbone import load_backbone, load_tokenizer, tiny_bert

    if name == "minilm":
        return load_backbone()
    if name == "tiny":
        return tiny_bert(layers=2, hidden=32), load_tokenizer()
    raise ValueError(f"backbone must be one of {', '.join(BACKBONES)}, got {name!r}")


class FedNLPClients:
    """Builds client `k`'s trainer from client k's documents alone; the server's initial parameters."""

    def __init__(self, settings: FedNLPSettings, *, backbone: str = "minilm", device: str = "cpu") -> None:
        self.settings, self.backbone_name = settings, backbone
        self.device = resolve_device(device)
        self._data: dict[int, dict[str, CachedSplit]] = {}

    @cached_property
    def corpus(self) -> Corpus:
        return load_corpus(self.settings)

    @cached_property
    def backbone(self) -> tuple[torch.nn.Module, Any]:
        model, tokenizer = load_named_backbone(self.backbone_name)
        self.check_backbone(model)
        return model.to(self.device), tokenizer

    @property
    def split(self) -> int:
        return prefix_split(self.backbone[0], self.settings.adapter_layers)

    def check_backbone(self, model: torch.nn.Module) -> None:
        """A clear error when the backbone cannot serve these settings."""
        try:
            prefix_split(model, self.settings.adapter_layers)
        except ValueError as error:
            raise ValueError(f"--adapter-layers: {error}") from None
        if self.settings.max_length > model.config.max_position_embeddings:
            raise ValueError(f"--max-length {self.settings.max_length} exceeds the backbone's "
                             f"{model.config.max_position_embeddings} positions")

    @property
    def num_clients(self) -> int:
        return len(self.corpus.splits)

    def client_data(self, client_id: int) -> dict[str, CachedSplit]:
        """Client `client_id`'s train/validation/test splits as frozen-prefix states (computed once)."""
        if not 1 <= client_id <= self.num_clients:
            raise ValueError(f"client id {client_id} is not in 1..{self.num_clients}")
        if client_id not in self._data:
            corpus, (model, tokenizer) = self.corpus, self.backbone
            split = corpus.splits[client_id - 1]
            parts = {"train": split.train, "validation": split.validation, "test": split.test}
            rows = np.concatenate([np.asarray(v, dtype=np.int64) for v in parts.values()])
            encoded = tokenizer([corpus.dataset.texts[i] for i in rows], truncation=True,
                                max_length=self.settings.max_length, padding="longest", return_tensors="pt")
            data = cache_splits(model, encoded["input_ids"], encoded["attention_mask"],
                                torch.as_tensor(corpus.labels[rows], dtype=torch.long),
                                sizes={k: len(v) for k, v in parts.items()}, split=self.split, device=self.device)
            self._data[client_id] = data
        return self._data[client_id]

    def _model(self) -> torch.nn.Module:
        return client_model(self.backbone[0], num_labels=self.corpus.dataset.num_labels,
                            config=self.settings.task_config).to(self.device)

    def protocol(self, method: str) -> TrainingProtocol:
        """The declared training protocol of `method`'s clients (`settings.training_protocol` at `client_lr`)."""
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
        s = self.settings
        return preset(s.training_protocol).for_algorithm(method, lr=s.client_lr, local_epochs=s.local_epochs,
                                                         sgd_lr=s.sgd_lr)

    def make_trainer(self, client_id: int, *, protocol: TrainingProtocol | None = None) -> SeededTorchTrainer:
        """A fresh client (new adapters, head and optimiser) over its cached documents, training under
        `protocol` (None: AdamW kept across rounds, this task's clients before protocols were declared;
        a run passes `self.protocol(method)`, as `task` does)."""
        return text_trainer(model=self._model(), data=self.client_data(client_id), client_id=client_id,
                            config=self.settings.task_config, protocol=protocol)

    def trainer_factory(self, method: str) -> Callable[[int], SeededTorchTrainer]:
        """`make_trainer` of `method`'s runs: every client under `self.protocol(method)`."""
        protocol = self.protocol(method)
        return lambda client_id: self.make_trainer(client_id, protocol=protocol)

    def initial(self) -> dict[str, np.ndarray]:
        """The shared parts of a freshly initialised client model (seeded: every client starts there)."""
        model = self._model()
        named = dict(model.named_parameters())
        return {part: flatten([named[n] for n in names]) for part, names in shared_parts(model).items()}

    def task(self, method: str) -> Task:
        return Task(algorithm=make_algorithm(method, self.settings), make_trainer=self.trainer_factory(method),
                    initial=self.initial)

    def options(self, method: str) -> dict[str, str]:
        """The `--option key=value` pairs that make `build` rebuild this task in another process."""
        return {"settings": json.dumps(asdict(self.settings)), "method": method, "backbone": self.backbone_name,
                "device": str(self.device.type)}


def build(options: Mapping[str, Any]) -> Task:
    """deploy_cli entry point: options `settings` (JSON of FedNLPSettings), `method`, `backbone`,
    `device`, `threads` (torch threads of this process, default 1)."""
    check_options(options, TASK_OPTIONS, task="fednlp")
    settings = settings_option(FedNLPSettings, options)
    threads = int_option(options, "threads", default=1, minimum=1)
    clients = FedNLPClients(settings, backbone=str(options.get("backbone", "minilm")),
                            device=str(options.get("device", "cpu")))
    torch.set_num_threads(threads)
    return clients.task(str(options.get("method", "fedavg")))


__all__ = ["METHODS", "DEFAULT_METHODS", "FEDOPT_SERVERS", "BACKBONES", "FedNLPSettings", "QUICK", "make_algorithm", "secure_config", "Corpus",
           "load_corpus", "load_named_backbone", "FedNLPClients", "build"]
