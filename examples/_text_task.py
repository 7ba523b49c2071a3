"""TorchTrainers for text-classification clients on the frozen-prefix scheme (reusable by examples).

The backbone is frozen; adapters sit only in its top `adapter_layers` encoder layers. The bottom
layers are therefore the same function for every client, round and method, so their outputs are
computed once (`nlp_models.frozen_prefix.build_prefix_cache`) and each client trains and evaluates
only its own copy of the top layers plus a classifier head:

    h_prefix = layers[:split](embed(x))                    (cached once, no dropout)
    logits   = head(mean_pool(layers[split:](h_prefix; adapters), mask))

Each client's model holds its own adapters and head but shares the frozen weights of the top
layers with the backbone (no copy), so many clients cost little memory. Shared (uploaded) parts:
'adapter' (every adapter parameter) and 'head' (the classifier). The client optimiser is AdamW
(FedNLP's ClientOpt); its state stays on the client across rounds.

Determinism: a client's local run seeds dropout and batch order from (seed, client id, how many
times it has trained), and that counter is part of its checkpoint. Two runs that differ only in
the aggregation protocol thus differ only by what the aggregation did, and a resumed run repeats
the uninterrupted one.
"""
from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from fl_algorithms.training.trainer import OptimizerConfig, TorchTrainer
from nlp_models.adapters import _encoder_layers, attach_adapters
from nlp_models.data.partition import ClientSplit
from nlp_models.frozen_prefix import PrefixCache, suffix_forward
from nlp_models.heads import SequenceClassifier, mean_pool

ADAPTER_SET = "adapter"


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

    def __post_init__(self) -> None:
        if self.adapter_layers < 1:
            raise ValueError("adapter_layers must be at least 1")
        if self.bottleneck < 1 or self.batch_size < 1 or self.eval_batch_size < 1:
            raise ValueError("bottleneck and batch sizes must be positive")
        if not self.lr > 0 or self.weight_decay < 0 or not 0 <= self.head_dropout < 1:
            raise ValueError("need lr > 0, weight_decay >= 0 and head_dropout in [0, 1)")


def prefix_split(backbone: nn.Module, adapter_layers: int) -> int:
    """Number of frozen bottom layers (the cached prefix) when the top `adapter_layers` are adapted."""
    total = len(_encoder_layers(backbone))
    if not 1 <= adapter_layers <= total:
        raise ValueError(f"adapter_layers must be in 1..{total} for this backbone, got {adapter_layers}")
    return total - adapter_layers


class _EncoderView(nn.Module):
    """Just enough of a BERT encoder (`.config`, `.encoder.layer`) for the adapter and prefix helpers."""

    def __init__(self, config: Any, layers: Sequence[nn.Module]) -> None:
        super().__init__()
        self.config = config
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList(layers)


class SuffixClassifier(nn.Module):
    """Top encoder layers (with adapters) + mean pooling + linear head, fed with cached prefix states."""

    def __init__(self, *, suffix: _EncoderView, head: SequenceClassifier) -> None:
        super().__init__()
        self.suffix = suffix
        self.head = head

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        states = suffix_forward(self.suffix, hidden, attention_mask, split=0)
        return self.head(states, mean_pool(states, attention_mask))


def build_suffix_classifier(backbone: nn.Module, *, num_labels: int, config: TextTaskConfig) -> SuffixClassifier:
    """A client model: its own adapters and head over the backbone's top layers (frozen weights shared).

    The backbone itself is not modified.
    """
    split = prefix_split(backbone, config.adapter_layers)
    top = list(_encoder_layers(backbone)[split:])
    frozen = {id(p): p for layer in top for p in layer.parameters()}
    layers = [copy.deepcopy(layer, memo=dict(frozen)) for layer in top]  # memo: reuse, not copy, the weights
    view = _EncoderView(backbone.config, layers)
    for p in view.parameters():
        p.requires_grad_(False)
    attach_adapters(view, {ADAPTER_SET: config.bottleneck}, seed=config.seed)
    for name, p in view.named_parameters():
        if f"adapters.{ADAPTER_SET}." in name:
            p.requires_grad_(True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        head = SequenceClassifier(backbone.config.hidden_size, num_labels, dropout=config.head_dropout)
    return SuffixClassifier(suffix=view, head=head)


def shared_parts(model: SuffixClassifier) -> dict[str, list[str]]:
    """The uploaded parts: every adapter parameter, and the head."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    return {"adapter": [n for n in names if n.startswith("suffix.")],
            "head": [n for n in names if n.startswith("head.")]}


@dataclass(frozen=True)
class CachedSplit:
    """One client's examples of one split, as cached prefix states."""

    hidden: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return self.labels.shape[0]

    @classmethod
    def take(cls, cache: PrefixCache, labels: torch.Tensor, indices: np.ndarray) -> "CachedSplit":
        idx = torch.as_tensor(np.asarray(indices, dtype=np.int64))
        return cls(cache.hidden[idx].clone(), cache.attention_mask[idx].clone(), labels[idx].clone())

    def batches(self, batch_size: int, *, order: torch.Tensor | None = None) -> list[dict[str, torch.Tensor]]:
        order = torch.arange(len(self)) if order is None else order
        out = []
        for start in range(0, len(self), batch_size):
            rows = order[start : start + batch_size]
            mask = self.attention_mask[rows]
            width = int(mask.sum(dim=1).max())  # drop all-padding columns: cheaper, same result
            out.append({"hidden": self.hidden[rows, :width], "attention_mask": mask[:, :width],
                        "labels": self.labels[rows]})
        return out


def classification_loss(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(model(batch["hidden"], batch["attention_mask"]), batch["labels"])


def classification_metrics(model: nn.Module, batches: Iterable[Mapping[str, torch.Tensor]]) -> dict[str, float]:
    """Accuracy and mean loss, plus the example count (to pool accuracies over clients)."""
    correct, loss, count = 0, 0.0, 0
    for b in batches:
        logits = model(b["hidden"], b["attention_mask"])
        correct += int((logits.argmax(-1) == b["labels"]).sum())
        loss += float(F.cross_entropy(logits, b["labels"], reduction="sum"))
        count += int(b["labels"].shape[0])
    return {"accuracy": correct / max(count, 1), "loss": loss / max(count, 1), "examples": float(count)}


class CachedTextTrainer(TorchTrainer):
    """A TorchTrainer over cached prefix states with per-call seeding and a small checkpoint.

    Checkpoints hold only the trainable parameters, the optimiser state and the call counter: the
    frozen weights never change, so saving them every round would only cost disk and time.
    """

    def __init__(self, *, model: SuffixClassifier, data: Mapping[str, CachedSplit], client_id: int,
                 config: TextTaskConfig) -> None:
        if "train" not in data or len(data["train"]) == 0:
            raise ValueError(f"client {client_id} has no training examples")
        self.data, self.client_id, self.seed = dict(data), client_id, config.seed
        self.calls = 0
        train, bs, ebs = self.data["train"], config.batch_size, config.eval_batch_size
        super().__init__(
            model=model, shared=shared_parts(model),
            train_batches=lambda: train.batches(bs, order=torch.randperm(len(train))),
            eval_batches={split: (lambda s=s: s.batches(ebs)) for split, s in self.data.items() if split != "train"},
            num_examples=len(train), loss_fn=classification_loss, metric_fn=classification_metrics,
            optimizer=OptimizerConfig(name="adamw", lr=config.lr, weight_decay=config.weight_decay),
        )

    def train(self, *, epochs: int, proximal: Mapping[str, np.ndarray] | None = None, mu: float = 0.0,
              round: int | None = None) -> dict[str, float]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(np.random.SeedSequence([self.seed, self.client_id, self.calls]).generate_state(1)[0]))
            self.calls += 1
            return super().train(epochs=epochs, proximal=proximal, mu=mu, round=round)

    def state_dict(self) -> dict[str, Any]:
        return {"trainable": {n: p.detach().clone() for n, p in self.model.named_parameters() if p.requires_grad},
                # a copy: torch's optimizer state_dict aliases the live moment tensors
                "optimizer": copy.deepcopy(self._optimizer.state_dict()) if self._optimizer is not None else None,
                "calls": self.calls}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, value in state["trainable"].items():
                params[name].copy_(value)
        if state.get("optimizer") is not None:
            self.optimizer().load_state_dict(state["optimizer"])
        self.calls = int(state["calls"])


def build_text_trainers(*, backbone: nn.Module, cache: PrefixCache, labels: torch.Tensor | Sequence[int],
                        splits: Sequence[ClientSplit], num_labels: int,
                        config: TextTaskConfig = TextTaskConfig()) -> dict[int, CachedTextTrainer]:
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
        model = build_suffix_classifier(backbone, num_labels=num_labels, config=config)
        trainers[number] = CachedTextTrainer(model=model, data=data, client_id=number, config=config)
    return trainers
