"""Text-classification clients on the frozen-prefix scheme (FedNLP-style FedAvg / FedProx / FedOPT).

The backbone is frozen; adapters sit only in its top `adapter_layers` encoder layers. The bottom
layers are the same function for every client, round and method, so their outputs are computed once
(`nlp_models.frozen_prefix.build_prefix_cache`) and each client trains and evaluates only its own
copy of the top layers plus a classifier head (`nlp_models.classifiers.SuffixClassifier`):

    h_prefix = layers[:split](embed(x))                    (cached once, no dropout)
    logits   = head(mean_pool(layers[split:](h_prefix; adapters), mask))

Shared (uploaded) parts: 'adapter' (every adapter parameter) and 'head' (the classifier). The client
trains under a declared `TrainingProtocol` (`text_trainer(protocol=...)`; without one, AdamW kept
across rounds, as these clients trained before protocols were declared). Each client is a
`SeededTorchTrainer`: its checkpoint holds only the trainable parameters, the optimiser state (none
when the optimiser is fresh each round) and its run counter (the frozen weights never change).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from fl_algorithms.training.protocol import TrainingProtocol
from fl_algorithms.training.trainer import OptimizerConfig, SeededTorchTrainer
from nlp_models.classifiers import SuffixClassifier, client_top, make_head
from nlp_models.data.partition import ClientSplit
from nlp_models.frozen_prefix import CachedBatch, CachedSplit, PrefixCache, prefix_split
from nlp_models.heads import classification_metrics as logit_metrics

ADAPTER_SET = "adapter"
TUNE = ("adapters", "layers")


@dataclass(frozen=True)
class TextTaskConfig:
    adapter_layers: int = 2
    """Adapters go in this many top encoder layers; the layers below are frozen and cached."""
    bottleneck: int = 16
    batch_size: int = 16
    eval_batch_size: int = 64
    lr: float = 1e-3
    """Client AdamW learning rate (adapters and head)."""
    weight_decay: float = 0.0
    head_dropout: float = 0.1
    seed: int = 0
    """Seeds adapter/head initialisation (identical on every client) and local shuffling/dropout."""
    tune: str = "adapters"
    """'adapters': adapters in the top `adapter_layers` layers train; 'layers': those layers train
    whole (FedNLP's layer-freezing study; every client then holds its own copy of them)."""

    def __post_init__(self) -> None:
        if self.adapter_layers < 1:
            raise ValueError("adapter_layers must be at least 1")
        if self.tune not in TUNE:
            raise ValueError(f"tune must be one of {', '.join(TUNE)}, got {self.tune!r}")
        if self.bottleneck < 1 or self.batch_size < 1 or self.eval_batch_size < 1:
            raise ValueError("bottleneck and batch sizes must be positive")
        if not self.lr > 0 or self.weight_decay < 0 or not 0 <= self.head_dropout < 1:
            raise ValueError("need lr > 0, weight_decay >= 0 and head_dropout in [0, 1)")


def client_model(backbone: nn.Module, *, num_labels: int, config: TextTaskConfig) -> SuffixClassifier:
    """One client's adapters and head over the backbone's top layers (frozen weights shared), or with
    tune='layers' its own trainable copy of those layers and a head."""
    top = client_top(backbone, tune=config.tune, layers=config.adapter_layers, bottleneck=config.bottleneck,
                     seed=config.seed, adapter_set=ADAPTER_SET)
    head = make_head(backbone.config.hidden_size, num_labels, dropout=config.head_dropout, seed=config.seed)
    return SuffixClassifier(suffix=top, head=head)


def shared_parts(model: nn.Module) -> dict[str, list[str]]:
    """The uploaded parts of a model laid out as `suffix` (adapted top layers) + `head` (the suffix
    classifier, FedNLP's tagger and span extractor): every adapter parameter, and the head."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    return {"adapter": [n for n in names if n.startswith("suffix.")],
            "head": [n for n in names if n.startswith("head.")]}


def classification_loss(model: nn.Module, batch: CachedBatch) -> torch.Tensor:
    return F.cross_entropy(model(batch.hidden, batch.attention_mask), batch.labels)


def classification_metrics(model: nn.Module, batches: Iterable[CachedBatch]) -> dict[str, float]:
    """Accuracy and mean loss, plus the example count (to pool accuracies over clients)."""
    return logit_metrics((model(b.hidden, b.attention_mask), b.labels) for b in batches)


def text_trainer(*, model: SuffixClassifier, data: dict[str, CachedSplit], client_id: int,
                 config: TextTaskConfig, protocol: TrainingProtocol | None = None) -> SeededTorchTrainer:
    """A client over its cached splits: shuffled batches each epoch, evaluation on every other split;
    trains under `protocol` (None: AdamW at `config.lr` kept across rounds)."""
    if "train" not in data or len(data["train"]) == 0:
        raise ValueError(f"client {client_id} has no training examples")
    train, bs, ebs = data["train"], config.batch_size, config.eval_batch_size
    return SeededTorchTrainer(
        client_id=client_id, seed=config.seed, model=model, shared=shared_parts(model),
        train_batches=lambda: train.batches(bs, order=torch.randperm(len(train))),
        eval_batches={split: (lambda s=s: s.batches(ebs)) for split, s in data.items() if split != "train"},
        num_examples=len(train), loss_fn=classification_loss, metric_fn=classification_metrics,
        optimizer=OptimizerConfig(name="adamw", lr=config.lr, weight_decay=config.weight_decay), protocol=protocol)


def build_text_trainers(*, backbone: nn.Module, cache: PrefixCache, labels: torch.Tensor | Sequence[int],
                        splits: Sequence[ClientSplit], num_labels: int,
                        config: TextTaskConfig = TextTaskConfig()) -> dict[int, SeededTorchTrainer]:
    """One trainer per client (ids 1..K), each holding only its own train/validation/test states.

    `cache` must be the prefix computed with `split = prefix_split(backbone, config.adapter_layers)`
    over the same examples that `splits` index.
    """
    split = prefix_split(backbone, config.adapter_layers)
    if cache.split != split:
        raise ValueError(f"cache was built with split {cache.split}, but {config.adapter_layers} adapted "
                         f"layers need split {split}")
    labels = torch.as_tensor(np.asarray(labels, dtype=np.int64))
    if labels.shape[0] != len(cache):
        raise ValueError(f"{labels.shape[0]} labels for {len(cache)} cached examples")
    trainers = {}
    for number, client in enumerate(splits, start=1):
        data = {"train": CachedSplit.take(cache, labels, client.train),
                "validation": CachedSplit.take(cache, labels, client.validation),
                "test": CachedSplit.take(cache, labels, client.test)}
        model = client_model(backbone, num_labels=num_labels, config=config)
        trainers[number] = text_trainer(model=model, data=data, client_id=number, config=config)
    return trainers


__all__ = ["ADAPTER_SET", "TextTaskConfig", "client_model", "shared_parts", "classification_loss",
           "classification_metrics", "text_trainer", "build_text_trainers"]
