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
from fl_algorithms.tasks.fednlp_settings import (BACKBONES, DEFAULT_METHODS, FEDOPT_SERVERS, METHODS, QUICK,  # noqa: F401
                                                FedNLPSettings)  # (re-exported)
from fl_algorithms.training.classification import client_model, shared_parts, text_trainer
from fl_algorithms.training.protocol import TrainingProtocol, preset
from fl_algorithms.training.trainer import SeededTorchTrainer, flatten
from nlp_models.cpu import set_torch_threads
from nlp_models.data.dataset import TextDataset
from nlp_models.data.partition import ClientSplit, Partition, PartitionError, client_splits, dirichlet_label_skew
from nlp_models.device import resolve_device
from nlp_models.frozen_prefix import CachedSplit, cache_splits, prefix_split

TASK_OPTIONS = ("settings", "method", "backbone", "device", "threads")


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


def load_named_backbone(name: str, *, hf: bool = False) -> tuple[torch.nn.Module, Any]:
    """'minilm' (the packaged all-MiniLM-L6-v2) or 'tiny' (a seeded 2-layer random BERT for smoke runs);
    transformers' model and tokenizer with ``hf=True`` (`nlp_models.backbone`)."""
    from nlp_models.backbone import load_backbone, load_tokenizer, tiny_bert

    if name == "minilm":
        return load_backbone(hf=hf)
    if name == "tiny":
        return tiny_bert(layers=2, hidden=32, hf=hf), load_tokenizer(hf=hf)
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
    set_torch_threads(threads)
    return clients.task(str(options.get("method", "fedavg")))


__all__ = ["METHODS", "DEFAULT_METHODS", "FEDOPT_SERVERS", "BACKBONES", "FedNLPSettings", "QUICK", "make_algorithm", "secure_config", "Corpus",
           "load_corpus", "load_named_backbone", "FedNLPClients", "build"]
