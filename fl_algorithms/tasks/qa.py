"""FedNLP's extractive question answering formulation (Lin et al., 2022), on a cloze stand-in corpus.

Each client holds (question, passage) pairs and learns to point at the answer span of its passage:
start and end logits per token from a linear head over the top encoder layers, trained with the mean
of the start and end cross-entropies, decoded as the best span (start <= end <= start + 30 tokens)
inside the passage, and scored with SQuAD v1.1's exact match and token F1 (`nlp_models.squad_metrics`).

SIMPLIFICATIONS (against FedNLP's QA runs):
* data: no SQuAD/MRQA corpus is available offline, so the questions are BBC News cloze questions
  (`nlp_models.data.cloze_qa`): a sentence with a name or number blanked, the answer extracted from
  the rest of the article. It measures span extraction (finding the filler of the gap in the text),
  not open-domain reading comprehension, and its scores are not comparable with SQuAD's.
* model: FedNLP fully fine-tunes DistilBERT/BERT; here a frozen MiniLM-L6 (sentence-transformers
  weights) with Houlsby adapters in its top `adapter_layers` layers and a bias-free Linear(hidden, 2) head is
  trained, the layers below computed once per example (`nlp_models.frozen_prefix`); with
  `tune='layers'` the top `adapter_layers` layers train whole instead (6: all but the embeddings, FedNLP's
  setting; a centralised pilot of that reader clears the first-entity baseline, the adapter reader barely
  does: docs/results/fednlp.md; the quick grid trains the top 2 whole), but for the biases the span softmax ignores (every
  key bias and the top LayerNorm's bias: zero gradient, see `build_span_extractor`). That cache feeds
  all-zero token_type_ids (question and passage are told apart by [SEP] only); this matches how the
  sentence-transformers MiniLM was trained, which never used segment B.
* truncation: input is question + passage cut to `max_length` tokens (only the passage is cut;
  questions longer than max_length // 2 tokens are left out of the corpus). An example whose answer
  is cut away is trained to point at [CLS] (start = end = 0) and counts as a miss (F1 = EM = 0) in
  evaluation and in the trivial baseline; its share is reported as `truncated`.

Scores are on the 0..1 scale (SQuAD's script reports them x100).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from fl_algorithms.tasks.formulation import SPLITS, FormulationClients, mean_over_clients
from fl_algorithms.training.classification import ADAPTER_SET, TUNE, shared_parts
from fl_algorithms.training.protocol import TrainingProtocol
from fl_algorithms.training.trainer import SeededTorchTrainer
from nlp_models.classifiers import client_top, seeded_module
from nlp_models.data.cloze_qa import ClozeExample, answer_candidates, build_cloze_qa
from nlp_models.data.dataset import cap_indices
from nlp_models.data.partition import ClientSplit, Partition
from nlp_models.frozen_prefix import CachedSplit, TopEncoder, cache_splits
from nlp_models.squad_metrics import exact_match_score, f1_score, metric_max_over_ground_truths

MAX_ANSWER_TOKENS = 30
"""Longest predicted span, in tokens (end <= start + 30)."""


def cloze_budget(max_length: int) -> tuple[int, int]:
    """(max question words, max passage words) of the cloze corpus for a `max_length`-token input:
    3/8 and 7/16 of max_length, so that question + passage mostly fit (about 2% of answers are cut
    at 64 tokens, 0.1% at 128)."""
    return max(5, round(max_length * 3 / 8)), max(8, round(max_length * 7 / 16))


# ---------------------------------------------------------------- data

@dataclass(frozen=True)
class QACorpus:
    """The capped cloze questions, their topics, and the seeded partition every process derives alike."""

    examples: tuple[ClozeExample, ...]
    labels: np.ndarray
    """BBC topic of each question."""
    label_names: tuple[str, ...]
    available: int
    """Questions that fit `max_length` before the `max_examples` cap."""
    partition: Partition
    splits: tuple[ClientSplit, ...]


@dataclass(frozen=True)
class Encoded:
    """Tokenised (question, passage) pairs with the answer's token span (CPU tensors)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    context_mask: torch.Tensor
    """(N, L) True at passage tokens."""
    offsets: torch.Tensor
    """(N, L, 2) character span of each passage token in its passage; (0, 0) elsewhere."""
    starts: torch.Tensor
    ends: torch.Tensor
    """Answer token span (inclusive); 0, 0 ([CLS]) where the answer was cut away."""
    truncated: torch.Tensor
    """(N,) True where the answer is not inside the tokenised passage."""


def encode(tokenizer: Any, examples: Sequence[ClozeExample], *, max_length: int) -> Encoded:
    """Tokenise (question, passage) with `truncation="only_second"` and map answers to token spans."""
    if not examples:
        raise ValueError("no examples to encode")
    enc = tokenizer([e.question for e in examples], [e.passage for e in examples], truncation="only_second",
                    max_length=max_length, padding="longest", return_offsets_mapping=True, return_tensors="pt")
    n, length = enc["input_ids"].shape
    context = torch.zeros(n, length, dtype=torch.bool)
    offsets = enc["offset_mapping"].clone().long()
    starts, ends = torch.zeros(n, dtype=torch.long), torch.zeros(n, dtype=torch.long)
    truncated = torch.zeros(n, dtype=torch.bool)
    for row, example in enumerate(examples):
        seq = enc.sequence_ids(row)
        ctx = [j for j, s in enumerate(seq) if s == 1]
        context[row, ctx] = True
        offsets[row, ~context[row]] = 0
        spans = offsets[row].tolist()
        if not ctx or spans[ctx[0]][0] > example.answer_start or spans[ctx[-1]][1] < example.answer_end:
            truncated[row] = True
            continue
        starts[row] = next(j for j in ctx if spans[j][1] > example.answer_start)
        ends[row] = max(j for j in ctx if spans[j][0] < example.answer_end)
    return Encoded(enc["input_ids"], enc["attention_mask"], context, offsets, starts, ends, truncated)


class QABatch(NamedTuple):
    hidden: torch.Tensor
    attention_mask: torch.Tensor
    context_mask: torch.Tensor
    starts: torch.Tensor
    ends: torch.Tensor
    offsets: torch.Tensor
    truncated: torch.Tensor
    passages: tuple[str, ...]
    answers: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class QASplit:
    """One client split: cached prefix states (labels = (N, 2) start/end) plus what decoding needs."""

    cached: CachedSplit
    context_mask: torch.Tensor
    offsets: torch.Tensor
    truncated: torch.Tensor
    passages: tuple[str, ...]
    answers: tuple[tuple[str, ...], ...]

    def __len__(self) -> int:
        return len(self.cached)

    @property
    def lengths(self) -> torch.Tensor:
        return self.cached.lengths

    def batch(self, index: torch.Tensor) -> QABatch:
        """Rows `index`, every (N, L) tensor trimmed to the same length as `CachedSplit.batch` trims
        the states (right padding: the passage tokens all lie before it)."""
        b = self.cached.batch(index)
        length = b.hidden.shape[1]
        rows = index.tolist()
        return QABatch(b.hidden, b.attention_mask, self.context_mask[index, :length], b.labels[:, 0], b.labels[:, 1],
                       self.offsets[index, :length], self.truncated[index],
                       tuple(self.passages[r] for r in rows), tuple(self.answers[r] for r in rows))

    def batches(self, batch_size: int, *, order: torch.Tensor | None = None) -> list[QABatch]:
        order = torch.arange(len(self)) if order is None else order
        return [self.batch(order[start:start + batch_size]) for start in range(0, len(self), batch_size)]


# ---------------------------------------------------------------- model, loss, decoding, metrics

class SpanExtractor(nn.Module):
    """Adapted top layers + Linear(hidden, 2, bias=False): (B, L, 2) start/end logits from cached prefix states."""

    def __init__(self, *, suffix: TopEncoder, head: nn.Linear) -> None:
        super().__init__()
        self.suffix = suffix
        self.head = head

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.head(self.suffix(hidden, attention_mask))


def build_span_extractor(backbone: nn.Module, *, adapter_layers: int, bottleneck: int, seed: int,
                         tune: str = "adapters") -> SpanExtractor:
    """A client model like `nlp_models.classifiers.build_suffix_classifier`: its own adapters (set
    'adapter') and head, seeded by `seed` only, over the backbone's shared frozen top layers; with
    `tune='layers'` its own trainable copy of the top `adapter_layers` layers instead of adapters."""
    top = client_top(backbone, tune=tune, layers=adapter_layers, bottleneck=bottleneck, seed=seed,
                     adapter_set=ADAPTER_SET)
    # no bias: a constant added to every position's start (or end) logit leaves the span softmax
    # unchanged, so its gradient is zero up to float32 noise, which AdamW's normalised steps would
    # turn into lr-sized random walks (the secure and plaintext twins drifted 1e-2 apart there)
    head = seeded_module(seed, lambda: nn.Linear(backbone.config.hidden_size, 2, bias=False))
    if tune == "layers":
        # the same holds for the top layer's LayerNorm bias, the last thing added to every position
        # alike: the head maps it to one constant per logit column (its key biases are already frozen)
        top.encoder.layer[-1].output.LayerNorm.bias.requires_grad_(False)
    return SpanExtractor(suffix=top, head=head)


def _masked_logits(model: nn.Module, batch: QABatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Start and end logits with every position but the passage and [CLS] set to -inf."""
    logits = model(batch.hidden, batch.attention_mask)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # half precision scores in float32
    allowed = batch.context_mask.clone()
    allowed[:, 0] = True  # [CLS]: the target of examples whose answer was cut away
    logits = logits.masked_fill(~allowed.unsqueeze(-1), float("-inf"))
    return logits[..., 0], logits[..., 1]


def qa_loss(model: nn.Module, batch: QABatch, *, reduction: str = "mean") -> torch.Tensor:
    """Mean of the start and end cross-entropies (passage tokens and [CLS] are the only classes)."""
    start, end = _masked_logits(model, batch)
    return 0.5 * (F.cross_entropy(start, batch.starts, reduction=reduction)
                  + F.cross_entropy(end, batch.ends, reduction=reduction))


def decode_spans(start: torch.Tensor, end: torch.Tensor, context_mask: torch.Tensor, *,
                 max_answer_tokens: int = MAX_ANSWER_TOKENS) -> tuple[torch.Tensor, torch.Tensor]:
    """The highest start + end score with start <= end <= start + max_answer_tokens, both passage tokens."""
    length = start.shape[1]
    s = start.masked_fill(~context_mask, float("-inf"))
    e = end.masked_fill(~context_mask, float("-inf"))
    scores = s.unsqueeze(2) + e.unsqueeze(1)
    ones = torch.ones(length, length, dtype=torch.bool, device=start.device)
    band = torch.triu(ones) & ~torch.triu(ones, diagonal=max_answer_tokens + 1)
    best = scores.masked_fill(~band, float("-inf")).flatten(1).argmax(dim=1)
    return best // length, best % length


def predicted_texts(batch: QABatch, starts: torch.Tensor, ends: torch.Tensor) -> list[str]:
    """passage[offset(start).begin : offset(end).end] for each row."""
    rows = torch.arange(starts.shape[0], device=starts.device)
    begin = batch.offsets[rows, starts, 0].tolist()
    finish = batch.offsets[rows, ends, 1].tolist()
    return [passage[b:f] for passage, b, f in zip(batch.passages, begin, finish)]


def qa_metrics(model: nn.Module, batches: Iterable[QABatch]) -> dict[str, float]:
    """Mean SQuAD token F1 and exact match (0..1; a cut-away answer is a miss), mean loss, count `n`
    and the share of cut-away answers `truncated`."""
    f1 = em = loss = cut = 0.0
    n = 0
    for batch in batches:
        start, end = _masked_logits(model, batch)
        loss += float(0.5 * (F.cross_entropy(start, batch.starts, reduction="sum")
                             + F.cross_entropy(end, batch.ends, reduction="sum")))
        starts, ends = decode_spans(start, end, batch.context_mask)
        for text, golds, lost in zip(predicted_texts(batch, starts, ends), batch.answers, batch.truncated.tolist()):
            if not lost:
                f1 += metric_max_over_ground_truths(f1_score, text, golds)
                em += metric_max_over_ground_truths(exact_match_score, text, golds)
        cut += float(batch.truncated.sum())
        n += len(batch.passages)
    d = max(n, 1)
    return {"f1": f1 / d, "exact_match": em / d, "loss": loss / d, "n": float(n), "truncated": cut / d}


def first_entity(passage: str) -> str:
    """The trivial prediction: the first name or number of the passage (by the cloze rules), or ''."""
    found = answer_candidates(passage)
    return found[0][1] if found else ""


# ---------------------------------------------------------------- the formulation

class QAClients(FormulationClients):
    """Extractive QA clients (ids 1..K) over a partitioned cloze corpus; see the module docstring.

    `backbone`: 'minilm' (the packaged all-MiniLM-L6-v2) or 'tiny' (a random 2-layer BERT for tests).
    """

    task = "qa"
    metric = "f1"
    tunes = TUNE
    transformers_backbone = True

    shared_parts = staticmethod(shared_parts)

    @cached_property
    def corpus(self) -> QACorpus:
        """Cloze questions that fit max_length (question <= max_length // 2 tokens), capped at
        max_examples (topic-stratified, seeded), partitioned by the settings' PartitionSpec, each
        client split 60/20/20."""
        s = self.settings
        model, tokenizer = self.backbone
        question_words, passage_words = cloze_budget(s.max_length)
        cloze = build_cloze_qa(seed=s.seed, max_passage_words=passage_words, max_question_words=question_words)
        lengths = [len(ids) for ids in tokenizer([e.question for e in cloze.examples])["input_ids"]]
        examples = [e for e, k in zip(cloze.examples, lengths) if k <= s.max_length // 2]
        available = len(examples)
        if s.max_examples is not None:
            labels = np.array([e.label for e in examples], dtype=np.int64)
            examples = [examples[i] for i in cap_indices(len(examples), s.max_examples, seed=s.seed, labels=labels)]
        labels = np.array([e.label for e in examples], dtype=np.int64)

        partition, splits = self.shard(n=len(examples), labels=labels, texts=[e.question for e in examples])
        return QACorpus(tuple(examples), labels, cloze.label_names, available, partition, splits)

    def client_examples(self, client_id: int) -> dict[str, tuple[ClozeExample, ...]]:
        """Client `client_id`'s own questions per split."""
        split = self.client_split(client_id)
        return {name: tuple(self.corpus.examples[i] for i in getattr(split, name)) for name in SPLITS}

    def client_data(self, client_id: int) -> dict[str, QASplit]:
        """Client `client_id`'s splits: frozen-prefix states of its own questions only (computed once)."""
        if client_id not in self._data:
            parts = self.client_examples(client_id)
            rows = [e for name in SPLITS for e in parts[name]]
            model, tokenizer = self.backbone
            enc = encode(tokenizer, rows, max_length=self.settings.max_length)
            labels = torch.stack([enc.starts, enc.ends], dim=1)
            states = cache_splits(model, enc.input_ids, enc.attention_mask, labels,
                                  sizes={name: len(parts[name]) for name in SPLITS}, split=self.split, device=self.device)
            data, start = {}, 0
            for name in SPLITS:
                cut = slice(start, start + len(parts[name]))
                data[name] = QASplit(
                    states[name], enc.context_mask[cut].to(self.device), enc.offsets[cut].to(self.device),
                    enc.truncated[cut].to(self.device), tuple(e.passage for e in parts[name]),
                    tuple((e.answer_text,) for e in parts[name]))
                start = cut.stop
            self._data[client_id] = data
        return self._data[client_id]

    def _model(self) -> SpanExtractor:
        s = self.settings
        return build_span_extractor(self.backbone[0], adapter_layers=s.adapter_layers, bottleneck=s.bottleneck,
                                    seed=s.seed, tune=s.tune).to(self.device)

    def make_trainer(self, client_id: int, *, protocol: TrainingProtocol | None = None) -> SeededTorchTrainer:
        """A fresh client (new adapters, head and optimiser, under `protocol`) over its own cached
        questions; evaluates 'validation' and 'test' with `qa_metrics`."""
        return self.split_trainer(client_id, model=self._model(), data=self.client_data(client_id), loss_fn=qa_loss,
                                  metric_fn=qa_metrics, protocol=protocol)

    def trivial_scores(self) -> dict[str, dict[str, float]]:
        """Mean over clients of each client's test-split F1 / exact match for two trivial answers:
        'first_entity' (the passage's first name or number) and 'empty' (''). A test answer cut away by
        truncation is a miss for both, as for the model."""
        _, tokenizer = self.backbone
        names = ("first_entity", "empty")
        scores: dict[str, dict[str, list[float]]] = {k: {"f1": [], "exact_match": []} for k in names}
        for client in range(1, self.num_clients + 1):
            test = self.client_examples(client)["test"]
            lost = encode(tokenizer, test, max_length=self.settings.max_length).truncated.tolist()
            for name, guess in (("first_entity", first_entity), ("empty", lambda _: "")):
                f1 = [0.0 if cut else f1_score(guess(e.passage), e.answer_text) for e, cut in zip(test, lost)]
                em = [0.0 if cut else exact_match_score(guess(e.passage), e.answer_text) for e, cut in zip(test, lost)]
                scores[name]["f1"].append(float(np.mean(f1)))
                scores[name]["exact_match"].append(float(np.mean(em)))
        return {name: {k: mean_over_clients(v) for k, v in parts.items()} for name, parts in scores.items()}

    def trivial(self) -> float:
        """The trivial F1: the better of 'first entity of the passage' and 'empty answer' (the empty
        answer always scores 0 under SQuAD's F1, so this is the first-entity score)."""
        return max(s["f1"] for s in self.trivial_scores().values())


__all__ = ["ADAPTER_SET", "MAX_ANSWER_TOKENS", "cloze_budget", "QACorpus", "Encoded", "encode", "QABatch", "QASplit",
           "SpanExtractor", "build_span_extractor", "qa_loss", "decode_spans", "predicted_texts",
           "qa_metrics", "first_entity", "QAClients"]
