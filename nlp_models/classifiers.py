"""Client models over a frozen backbone: adapters in the top layers (fed with cached prefix states)
plus classifier heads, and the whole-backbone model for full fine-tuning.

* `SuffixClassifier`: one adapter set (or, with `tuned_top`, whole trainable top layers) and one
  head, ``logits = model(hidden, mask)``;
* `AdapterClassifier`: named adapter sets mixed per pass and named heads (FedMCP's ``AdapterModel``:
  ``represent(batch, mixing=...)`` then ``classify(head, representation)``);
* `FullModel`: the same interface over token ids with every backbone weight trainable.

Every client model owns its adapters and heads; the frozen top-layer weights are the backbone's own
tensors (`nlp_models.frozen_prefix.TopEncoder`), so many clients cost little memory.
"""
from __future__ import annotations

import copy
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn

from nlp_models.adapters import active, attach_adapters
from nlp_models.cpu import bf16_autocast, training_attention
from nlp_models.frozen_prefix import TopEncoder, prefix_split
from nlp_models.heads import SequenceClassifier, TextClassifier, mean_pool


def make_head(hidden: int, num_labels: int, *, mlp_hidden: int | None = None, dropout: float = 0.1,
              seed: int) -> SequenceClassifier:
    """A classifier head whose initialisation depends on `seed` only (not on the global RNG)."""
    return seeded_module(seed, lambda: SequenceClassifier(hidden, num_labels, dropout=dropout, mlp_hidden=mlp_hidden))


class SuffixClassifier(nn.Module):
    """Top encoder layers (with adapters) + mean pooling + a head, fed with cached prefix states."""

    def __init__(self, *, suffix: TopEncoder, head: nn.Module) -> None:
        super().__init__()
        self.suffix = suffix
        self.head = head

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        states = self.suffix(hidden, attention_mask)
        return self.head(states, mean_pool(states, attention_mask))


def adapted_top(backbone: nn.Module, *, adapter_layers: int, bottleneck: int, seed: int,
                adapter_set: str = "adapter") -> TopEncoder:
    """The backbone's top `adapter_layers` layers (frozen weights shared with `backbone`, not copied)
    carrying one trainable adapter set seeded by `seed`: every client's adapted part starts equal."""
    top = TopEncoder(backbone, split=prefix_split(backbone, adapter_layers), dropout=True, freeze=True)
    attach_adapters(top, {adapter_set: bottleneck}, seed=seed)
    for name, p in top.named_parameters():
        if f"adapters.{adapter_set}." in name:
            p.requires_grad_(True)
    return top


KEY_BIAS = "attention.self.key.bias"
"""Each BERT layer's key bias: it adds q . b to every key's score for a query, which the attention
softmax ignores, so its gradient is zero but for float32 noise."""


def tuned_top(backbone: nn.Module, *, layers: int) -> TopEncoder:
    """The backbone's top `layers` layers as this client's own trainable copy (FedNLP's layer-freezing
    study: the embeddings and the layers below stay frozen and cached, the layers above train whole).

    Every weight trains but the key biases (`KEY_BIAS`): their true gradient is zero, and AdamW's
    normalised steps turn the float32 noise left in it into lr-sized random walks, which change nothing
    the model computes but made the secure and plaintext twins' parameters drift apart (2e-3 after 4
    rounds at lr 2e-3, from 1e-7 after round 1). Frozen, they stay at the pre-trained values and are not
    uploaded."""
    top = TopEncoder(backbone, split=prefix_split(backbone, layers), dropout=True, freeze=True)
    top.encoder.layer = copy.deepcopy(top.encoder.layer).requires_grad_(True)
    for name, p in top.encoder.layer.named_parameters():
        if name.endswith(KEY_BIAS):
            p.requires_grad_(False)
    return top


def client_top(backbone: nn.Module, *, tune: str, layers: int, bottleneck: int, seed: int,
               adapter_set: str = "adapter") -> TopEncoder:
    """A client's trainable top `layers` layers: adapters in them (`tune='adapters'`, `adapted_top`)
    or the layers themselves (`tune='layers'`, `tuned_top`)."""
    if tune == "layers":
        return tuned_top(backbone, layers=layers)
    if tune != "adapters":
        raise ValueError(f"tune must be 'adapters' or 'layers', got {tune!r}")
    return adapted_top(backbone, adapter_layers=layers, bottleneck=bottleneck, seed=seed, adapter_set=adapter_set)


def seeded_module(seed: int, make: Callable[[], nn.Module]) -> nn.Module:
    """`make()` under a forked RNG seeded by `seed`: a head initialised by the seed alone."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make()


def build_suffix_classifier(backbone: nn.Module, *, num_labels: int, adapter_layers: int, bottleneck: int,
                            head_dropout: float = 0.1, seed: int = 0, adapter_set: str = "adapter") -> SuffixClassifier:
    """A client model: its own adapters (set `adapter_set`) and head over the backbone's top layers.

    The top layers' weights are shared with `backbone` and frozen there; nothing else of the backbone
    changes. Adapters and head are seeded by `seed`, so every client starts from the same model.
    """
    top = adapted_top(backbone, adapter_layers=adapter_layers, bottleneck=bottleneck, seed=seed,
                      adapter_set=adapter_set)
    head = make_head(backbone.config.hidden_size, num_labels, dropout=head_dropout, seed=seed)
    return SuffixClassifier(suffix=top, head=head)


class HeadsAndLabels(nn.Module):
    """Named heads over a pooled representation; labels are batch[2] (`CachedBatch.labels`)."""

    heads: nn.ModuleDict

    def classify(self, head: str, representation: torch.Tensor) -> torch.Tensor:
        return self.heads[head](None, representation)

    @staticmethod
    def labels(batch: Sequence[torch.Tensor]) -> torch.Tensor:
        return batch[2]


class AdapterClassifier(HeadsAndLabels):
    """Adapted top layers + named heads over cached prefix states; the FedMCP ``AdapterModel``.

    `timer` accumulates the seconds of training forward passes per adapter mixing.
    """

    def __init__(self, top: TopEncoder, heads: Mapping[str, nn.Module], *, bf16: bool = False) -> None:
        super().__init__()
        self.top = top
        self.heads = nn.ModuleDict(dict(heads))
        self.bf16 = bf16
        self.timer: dict[str, float] = defaultdict(float)

    def represent(self, batch: Sequence[torch.Tensor], *, mixing: Mapping[str, float]) -> torch.Tensor:
        start = time.perf_counter()
        hidden, mask = batch[0], batch[1]
        if mask.shape[0]:  # Opacus' loader yields fully padded rows: trim to the longest text
            length = max(int(mask.sum(dim=1).max()), 1)
            hidden, mask = hidden[:, :length], mask[:, :length]
        with (active(self.top, mixing), bf16_autocast(self.bf16, device=hidden.device),
              training_attention(hidden.device)):
            states = self.top(hidden, mask)
        pooled = mean_pool(states.float(), mask)
        if self.training:  # evaluation is timed as a whole by the trainer
            self.timer["forward " + "+".join(sorted(mixing))] += time.perf_counter() - start
        return pooled


class FullModel(HeadsAndLabels):
    """A whole (trainable) backbone + its heads over token ids: FedAvg with full fine-tuning."""

    def __init__(self, classifier: TextClassifier, *, bf16: bool = False) -> None:
        super().__init__()
        self.classifier = classifier
        self.heads = classifier.heads
        self.bf16 = bf16
        self.timer: dict[str, float] = defaultdict(float)

    def represent(self, batch: Sequence[torch.Tensor], *, mixing: Mapping[str, float]) -> torch.Tensor:
        start = time.perf_counter()
        with bf16_autocast(self.bf16, device=batch[0].device):
            states, _ = self.classifier.encode(batch[0], batch[1])
        pooled = mean_pool(states.float(), batch[1])
        if self.training:
            self.timer["forward full backbone"] += time.perf_counter() - start
        return pooled


__all__ = ["make_head", "SuffixClassifier", "adapted_top", "KEY_BIAS", "tuned_top", "seeded_module", "build_suffix_classifier", "HeadsAndLabels", "AdapterClassifier",
           "FullModel"]
