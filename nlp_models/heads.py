"""Task heads and ``TextClassifier``: a backbone (with adapter sets) plus named heads.

Sentence representations are mask-aware means over token states (FedMCP pools this way, and uses
separate classifiers g1 for the full model and g2 for the global-adapter-only pass).

Opacus: the backbone is always called with batch-sized, contiguous ``position_ids`` and
``token_type_ids``. Hugging Face BERT otherwise reads them from registered buffers of batch size 1
(or an expanded view), which breaks per-sample gradients of the embeddings in every Opacus mode.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

import torch
from torch import nn
from torch.nn import functional as F

from nlp_models.adapters import AdapterControl, freeze_backbone


def batch_position_ids(input_ids: torch.Tensor) -> torch.Tensor:
    """Positions 0..L-1 for each row, as a contiguous (B, L) tensor (right padding assumed)."""
    batch, length = input_ids.shape
    return torch.arange(length, device=input_ids.device).expand(batch, length).contiguous()


def batch_token_type_ids(input_ids: torch.Tensor) -> torch.Tensor:
    """All-zero segment ids, a fresh contiguous (B, L) tensor."""
    return torch.zeros_like(input_ids)


def mean_pool(hidden_states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean of the token states where ``attention_mask`` is 1: (B, L, H) -> (B, H)."""
    mask = attention_mask.unsqueeze(-1).to(hidden_states.dtype)
    return (hidden_states * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)


def classification_metrics(outputs: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, float]:
    """Accuracy and mean cross-entropy over (logits, labels) batches, plus the example count (to pool
    accuracies over clients)."""
    correct, loss, count = 0, 0.0, 0
    for logits, labels in outputs:
        correct += int((logits.argmax(-1) == labels).sum())
        loss += float(F.cross_entropy(logits, labels, reduction="sum"))
        count += int(labels.shape[0])
    return {"accuracy": correct / max(count, 1), "loss": loss / max(count, 1), "examples": float(count)}


class SequenceClassifier(nn.Module):
    """Logits from the pooled representation: Linear (optionally Linear-GeLU-Linear, FedMCP's "MLP")."""

    def __init__(self, hidden: int, num_labels: int, *, dropout: float = 0.0, mlp_hidden: int | None = None):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        if mlp_hidden is None:
            self.classifier = nn.Linear(hidden, num_labels)
        else:
            self.classifier = nn.Sequential(nn.Linear(hidden, mlp_hidden), nn.GELU(), nn.Linear(mlp_hidden, num_labels))

    def forward(self, sequence_output: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(pooled))


class TokenClassifier(nn.Module):
    """Per-token logits (B, L, C) for tagging tasks such as NER."""

    def __init__(self, hidden: int, num_labels: int, *, dropout: float = 0.0):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden, num_labels)

    def forward(self, sequence_output: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(sequence_output))


class ClassifierOutput(NamedTuple):
    logits: torch.Tensor
    pooled: torch.Tensor


class TextClassifier(nn.Module):
    """Backbone (adapters attached beforehand) + named heads; ``forward(..., head='g1')`` picks one head.

    Heads take ``(sequence_output, pooled)``; adapters are steered with ``clf.adapters.active({...})``.
    """

    def __init__(self, backbone: nn.Module, heads: Mapping[str, nn.Module]):
        super().__init__()
        if not heads:
            raise ValueError("a TextClassifier needs at least one head")
        self.backbone = backbone
        self.heads = nn.ModuleDict(dict(heads))

    @property
    def adapters(self) -> AdapterControl:
        return AdapterControl(self.backbone)

    def freeze_backbone(self) -> None:
        """Freeze the backbone except its adapters; heads stay as they are (trainable by default)."""
        freeze_backbone(self.backbone)

    def encode(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Token states (B, L, H) and their mask-aware mean (B, H) under the current adapter mixing."""
        if position_ids is None:
            position_ids = batch_position_ids(input_ids)
        if token_type_ids is None:
            token_type_ids = batch_token_type_ids(input_ids)
        sequence_output = self.backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            token_type_ids=token_type_ids,
        ).last_hidden_state
        return sequence_output, mean_pool(sequence_output, attention_mask)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        head: str | None = None,
    ) -> ClassifierOutput:
        if head is None:
            if len(self.heads) != 1:
                raise ValueError(f"choose a head among {list(self.heads)}")
            head = next(iter(self.heads))
        if head not in self.heads:
            raise KeyError(f"no head {head!r}; heads: {list(self.heads)}")
        sequence_output, pooled = self.encode(input_ids, attention_mask, position_ids, token_type_ids)
        return ClassifierOutput(self.heads[head](sequence_output, pooled), pooled)
