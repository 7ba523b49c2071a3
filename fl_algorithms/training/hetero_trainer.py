"""ATC's heterogeneous clients: one model layout for classification, tagging, extractive QA and
headline generation, so that clients of different formulations can share (and securely sum) one part.

Every client holds, over the frozen offline MiniLM (bottom layers computed once, `frozen_prefix`):

    suffix   the top `adapter_layers` encoder layers with Houlsby adapters ('adapter', shared) and
             their own trainable LayerNorms ('norm', shared; FedBN keeps it local)
    head     the client's task head, local: linear over the mean-pooled states (classification), a
             token classifier (tagging), a start/end span head (QA); for generation the decoder below
    decoder  a BERT2BERT decoder warm-started from MiniLM (`nlp_models.seq2seq`), local: headline
             generator of generation clients and every client's denoising-reconstruction head
    lm       an MLM head (dense, GELU, LayerNorm, tied frozen word embeddings), local

`train` fits the task (FedProx's proximal term and ATC's contrastive term optional); `pretrain` runs
one ASSIGN objective (masked language modelling or denoising reconstruction, `nlp_models.pretraining`)
on the client's own training inputs; `represent` encodes the public synthetic inputs (CONTRAST).

SIMPLIFICATION relative to ATC (Sec. 3.2): the paper shares the whole encoder-decoder in ASSIGN; here
only the encoder's adapters and LayerNorms are federated, while the decoder and the MLM head stay on
the client (a 1-layer decoder is 2.5M parameters; K cluster-indexed blocks of it per client and round
cost more secure-sum time than a CPU run affords). The encoder below the adapters is frozen.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from fl_algorithms.tasks.hetero import HeteroClient
from fl_algorithms.tasks.qa import QASplit, encode as encode_qa, qa_loss, qa_metrics
from fl_algorithms.tasks.seq2seq import HeadlineSplit, headline_loss, headline_metrics
from fl_algorithms.tasks.tagging import TaggedSplit, encode_tagged, tagging_metrics, token_loss
from fl_algorithms.training.classification import classification_loss, classification_metrics
from fl_algorithms.training.loop import run_epochs, seeded, sequence_seed
from fl_algorithms.training.trainer import OptimizerConfig, SeededTorchTrainer
from nlp_models.classifiers import adapted_top, make_head, seeded_module
from nlp_models.frozen_prefix import CachedSplit, build_prefix_cache, cache_splits, cache_texts, prefix_split
from nlp_models.heads import TokenClassifier, mean_pool
from nlp_models.pretraining import Corruptor
from nlp_models.seq2seq import (IGNORE_INDEX, Seq2SeqConfig, Seq2SeqModel, client_seq2seq, special_ids, tokenize_pairs,
                                warm_decoder)

METRIC = {"classification": "accuracy", "tagging": "span_f1", "qa": "f1", "generation": "rougeL"}
"""The headline metric of each formulation (the key in the client's `evaluate()` result)."""
SHARED = ("adapter", "norm")
SPLITS = ("train", "validation", "test")


@dataclass(frozen=True)
class HeteroConfig:
    """The clients' shared model shape and optimiser (every client starts from the same seeded model)."""

    adapter_layers: int = 2
    bottleneck: int = 16
    max_length: int = 64
    """Tokens per input (text, sentence, question + passage, article body)."""
    max_target: int = 16
    decoder_layers: int = 1
    batch_size: int = 16
    lr: float = 1e-3
    pretrain_batches: int = 4
    """Corrupted batches per ASSIGN round (of the client's training inputs, reshuffled each time)."""
    pretrain_length: int = 48
    """Tokens per pretraining input (the denoising decoder reconstructs all of them)."""
    contrast_weight: float = 1.0
    """Weight of ATC's contrastive term next to the task loss (the paper minimises their sum)."""
    contrast_temperature: float = 1.0
    """tau of Eq. 3 (the paper's 1.0)."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.adapter_layers < 1 or self.bottleneck < 1 or self.decoder_layers < 1 or self.batch_size < 1:
            raise ValueError("adapter_layers, bottleneck, decoder_layers and batch_size must be positive")
        if not 8 <= self.max_length <= 512 or self.max_target < 2:
            raise ValueError("need 8 <= max_length <= 512 and max_target >= 2")
        if not self.lr > 0 or self.pretrain_batches < 1 or not 8 <= self.pretrain_length <= self.max_length:
            raise ValueError("need lr > 0, pretrain_batches >= 1 and 8 <= pretrain_length <= max_length")
        if self.contrast_weight < 0 or not self.contrast_temperature > 0:
            raise ValueError("need contrast_weight >= 0 and contrast_temperature > 0")


class MaskedLMHead(nn.Module):
    """BERT's MLM head over tied, frozen word embeddings: dense, GELU, LayerNorm, then the vocabulary."""

    def __init__(self, embeddings: nn.Embedding) -> None:
        super().__init__()
        hidden = embeddings.weight.shape[1]
        self.dense, self.norm = nn.Linear(hidden, hidden), nn.LayerNorm(hidden)
        self.bias = nn.Parameter(torch.zeros(embeddings.weight.shape[0]))
        self.embeddings = [embeddings]  # a list: not a submodule, so the frozen matrix is never a parameter

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        h = self.norm(F.gelu(self.dense(states)))
        return h @ self.embeddings[0].weight.T + self.bias


@dataclass(frozen=True)
class ContrastTargets:
    """ATC Eq. 3 for one client: the public inputs' representations its neighbours (positive) and its
    farthest clients (negative) produced, each a group mean from a secure sum, (M, H) arrays."""

    positive: np.ndarray
    negative: np.ndarray


class HeteroModel(nn.Module):
    """One client's model (see the module docstring); `forward` gives task logits for classification,
    tagging and QA, `loss`/`generate` the headline generator's, both from cached prefix states."""

    def __init__(self, *, formulation: str, suffix: nn.Module, head: nn.Module | None, decoder: Seq2SeqModel,
                 lm: MaskedLMHead) -> None:
        super().__init__()
        self.formulation, self.suffix, self.head, self.decoder, self.lm = formulation, suffix, head, decoder, lm

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        states = self.suffix(hidden, attention_mask)
        if self.formulation == "classification":
            return self.head(states, mean_pool(states, attention_mask))
        if self.formulation == "tagging":
            return self.head(states, None)
        if self.formulation == "qa":
            return self.head(states)
        raise TypeError("the generation model is used through loss() and generate()")

    def pooled(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, H) mean-pooled top-layer states: the representation CONTRAST compares."""
        return mean_pool(self.suffix(hidden, attention_mask), attention_mask)

    def loss(self, source: torch.Tensor, source_mask: torch.Tensor, target: torch.Tensor, *,
             source_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.decoder.loss(self.suffix(source, source_mask), source_mask, target, source_ids=source_ids)

    @torch.inference_mode()
    def generate(self, source: torch.Tensor, source_mask: torch.Tensor, *,
                 source_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.decoder.generate(self.suffix(source, source_mask), source_mask, source_ids=source_ids)


def _own_norms(suffix: nn.Module) -> None:
    """Give the adapted layers' LayerNorms the client's own trainable copies (the backbone's stay frozen)."""
    for module in suffix.modules():
        if isinstance(module, nn.LayerNorm):
            module.weight = nn.Parameter(module.weight.detach().clone())
            module.bias = nn.Parameter(module.bias.detach().clone())


def shared_parts(model: HeteroModel) -> dict[str, list[str]]:
    """'adapter': every adapter parameter of the suffix; 'norm': its LayerNorms (same names on every
    client whatever its formulation, so every client can be summed with every other)."""
    names = [n for n, p in model.named_parameters() if p.requires_grad and n.startswith("suffix.")]
    return {"adapter": [n for n in names if ".adapters." in n], "norm": [n for n in names if ".adapters." not in n]}


class HeteroTrainer(SeededTorchTrainer):
    """A client of any formulation: task training (+ FedProx, + ATC's contrastive term), ASSIGN
    pretraining and the public-input representation, over its own data only."""

    def __init__(self, *, client: HeteroClient, model: HeteroModel, data: Mapping[str, Any], config: HeteroConfig,
                 backbone: nn.Module, pretrain_ids: tuple[torch.Tensor, torch.Tensor], public: CachedSplit,
                 corruptor: Corruptor, loss_fn: Callable, metric_fn: Callable) -> None:
        train = data["train"]
        super().__init__(client_id=client.client_id, seed=config.seed, model=model, shared=shared_parts(model),
                         train_batches=lambda: train.batches(config.batch_size, order=torch.randperm(len(train))),
                         eval_batches={s: (lambda d=data[s]: d.batches(64)) for s in ("validation", "test")},
                         num_examples=len(train), loss_fn=loss_fn, metric_fn=metric_fn,
                         optimizer=OptimizerConfig(name="adamw", lr=config.lr))
        self.formulation, self.dataset, self.config, self.train_split = client.formulation, client.dataset, config, train
        self.metric = METRIC[client.formulation]
        self.backbone, self.split = backbone, prefix_split(backbone, config.adapter_layers)
        self.pretrain_ids, self.public, self.corruptor = pretrain_ids, public, corruptor

    # ---- task training ---------------------------------------------------------------------
    def train(self, *, epochs: int, proximal: Mapping[str, np.ndarray] | None = None, mu: float = 0.0,
              round: int | None = None, contrast: ContrastTargets | None = None) -> dict[str, float]:
        if contrast is None:
            return super().train(epochs=epochs, proximal=proximal, mu=mu, round=round)
        task_loss, weight = self.loss_fn, self.config.contrast_weight
        positive = torch.as_tensor(contrast.positive, dtype=torch.float32)
        negative = torch.as_tensor(contrast.negative, dtype=torch.float32)
        terms: list[float] = []

        def with_contrast(model: nn.Module, batch: Any) -> torch.Tensor:
            term = self.contrastive_loss(positive, negative)
            terms.append(float(term.detach()))
            return task_loss(model, batch) + weight * term

        self.loss_fn = with_contrast
        try:
            metrics = super().train(epochs=epochs, proximal=proximal, mu=mu, round=round)
        finally:
            self.loss_fn = task_loss
        return {**metrics, "contrast_loss": float(np.mean(terms)) if terms else 0.0}

    def contrastive_loss(self, positive: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
        """ATC Eq. 3 on the public inputs k: -log e^{s(h_k, p_k)/tau} / (e^{s(h_k, p_k)/tau} + e^{s(h_k, n_k)/tau}),
        s the cosine, averaged over k (h: this client's representation, p / n: the group means)."""
        h = self.model.pooled(self.public.hidden, self.public.attention_mask)
        device = h.device
        tau = self.config.contrast_temperature
        pos = F.cosine_similarity(h, positive.to(device), dim=-1) / tau
        neg = F.cosine_similarity(h, negative.to(device), dim=-1) / tau
        return -(pos - torch.logsumexp(torch.stack([pos, neg]), dim=0)).mean()

    @torch.no_grad()
    def represent(self) -> np.ndarray:
        """(M, H) this client's representations of the public synthetic inputs (dropout off), each row
        scaled to unit norm: the contrastive term compares directions only, and unit rows fit the secure
        sum's fixed-point range."""
        was = self.model.training
        self.model.eval()
        try:
            h = self.model.pooled(self.public.hidden, self.public.attention_mask).float()
            return F.normalize(h, dim=-1).cpu().numpy()
        finally:
            self.model.train(was)

    @torch.no_grad()
    def document_embeddings(self) -> np.ndarray:
        """(n, H) mean-pooled top-layer states of the client's training inputs under its current model
        (what its neighbour sketch summarises; never released as such)."""
        was = self.model.training
        self.model.eval()
        try:
            rows = []
            for batch in self.train_split.batches(self.config.batch_size):   # in order: no RNG drawn
                hidden, mask = _inputs_of(batch)
                rows.append(self.model.pooled(hidden, mask).float().cpu())
            return torch.cat(rows).numpy().astype(np.float64)
        finally:
            self.model.train(was)

    # ---- ASSIGN pretraining ----------------------------------------------------------------
    def pretrain(self, *, objective: str, round: int | None = None) -> dict[str, float]:
        """Up to `pretrain_batches` steps of `objective` ('mlm' or 'denoise') on the client's own
        training inputs, corrupted afresh (seeded by run seed, client and call count)."""
        ids, mask = self.pretrain_ids
        with seeded(sequence_seed(self.seed, self.client_id, self.calls)):
            seed = sequence_seed(self.seed, self.client_id, self.calls) % (2 ** 31)
            self.calls += 1
            order = torch.randperm(ids.shape[0])[: self.config.pretrain_batches * self.config.batch_size]
            corrupted = self.corruptor(objective, ids[order], mask[order], seed=seed)
            self.model.train()
            size = self.config.batch_size
            slices = [slice(start, start + size) for start in range(0, len(order), size)]
            result = run_epochs(
                batches=lambda: slices, optimizer=self.round_optimizer(), epochs=1, protocol=self.protocol,
                loss=lambda rows: self._pretrain_loss(corrupted.input_ids[rows], corrupted.attention_mask[rows],
                                                      corrupted.labels[rows], objective))
        return {"pretrain_loss": result["train_loss"] if slices else float("nan"), "pretrain_steps": result["steps"],
                "objective_mlm": float(objective == "mlm")}

    def _pretrain_loss(self, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor, objective: str) -> torch.Tensor:
        width = max(int(mask.sum(dim=1).max()), 1)
        ids, mask = ids[:, :width], mask[:, :width]
        device = self.public.hidden.device
        hidden = build_prefix_cache(self.backbone, ids.to(device), mask.to(device), split=self.split,
                                    progress=False).hidden
        model = self.model
        if objective == "mlm":                                    # vocabulary logits at the selected positions only
            labels = labels[:, :width].to(device)
            selected = labels != IGNORE_INDEX
            if not bool(selected.any()):
                return model.suffix(hidden, mask.to(device)).sum() * 0.0
            states = model.suffix(hidden, mask.to(device))[selected]
            return F.cross_entropy(model.lm(states), labels[selected])
        target = labels[:, 1:]                                    # the original body + [SEP]; [CLS] starts decoding
        length = max(int((target != IGNORE_INDEX).sum(dim=1).max()), 1)
        return model.loss(hidden, mask.to(device), target[:, :length].to(device), source_ids=ids.to(device))


def _inputs_of(batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(prefix states, mask) of any formulation's batch."""
    if hasattr(batch, "source"):
        return batch.source, batch.source_mask
    return batch.hidden, batch.attention_mask


# ---- building clients ----------------------------------------------------------------------------

def _client_data(client: HeteroClient, backbone: nn.Module, tokenizer: Any, config: HeteroConfig,
                 device: torch.device | str) -> dict[str, Any]:
    split = prefix_split(backbone, config.adapter_layers)
    parts = {name: getattr(client, name) for name in SPLITS}
    if client.formulation == "classification":
        return {name: cache_texts(backbone, tokenizer, [t for t, _ in rows], [y for _, y in rows],
                                  max_length=config.max_length, split=split).to(device)
                for name, rows in parts.items()}
    if client.formulation == "tagging":
        rows = [r for name in SPLITS for r in parts[name]]
        enc = encode_tagged([w for w, _ in rows], [t for _, t in rows], tokenizer=tokenizer, max_length=config.max_length)
        states = cache_splits(backbone, enc.input_ids, enc.attention_mask, enc.labels,
                              sizes={n: len(parts[n]) for n in SPLITS}, split=split, device=device)
        out, start = {}, 0
        for name in SPLITS:
            stop = start + len(parts[name])
            gold = tuple(tuple(client.label_names[t] for t in tags) for _, tags in parts[name])
            out[name] = TaggedSplit(states[name], enc.word_index[start:stop].clone(), gold)
            start = stop
        return out
    if client.formulation == "qa":
        rows = [e for name in SPLITS for e in parts[name]]
        enc = encode_qa(tokenizer, rows, max_length=config.max_length)
        states = cache_splits(backbone, enc.input_ids, enc.attention_mask, torch.stack([enc.starts, enc.ends], dim=1),
                              sizes={n: len(parts[n]) for n in SPLITS}, split=split, device=device)
        out, start = {}, 0
        for name in SPLITS:
            cut = slice(start, start + len(parts[name]))
            out[name] = QASplit(states[name], enc.context_mask[cut].to(device), enc.offsets[cut].to(device),
                                enc.truncated[cut].to(device), tuple(e.passage for e in parts[name]),
                                tuple((e.answer_text,) for e in parts[name]))
            start = cut.stop
        return out
    out = {}
    for name, rows in parts.items():
        ids, mask, target = tokenize_pairs(tokenizer, [b for b, _ in rows], [h for _, h in rows],
                                           max_source=config.max_length, max_target=config.max_target)
        states = build_prefix_cache(backbone, ids.to(device), mask.to(device), split=split, progress=False).hidden
        out[name] = HeadlineSplit(states, mask.to(device), ids.to(device), target.to(device), tuple(h for _, h in rows))
    return out


def _loss_and_metrics(formulation: str, client: HeteroClient, tokenizer: Any) -> tuple[Callable, Callable]:
    if formulation == "classification":
        return classification_loss, classification_metrics
    if formulation == "tagging":
        names = client.label_names
        return token_loss, lambda m, b: tagging_metrics(m, b, label_names=names)
    if formulation == "qa":
        return qa_loss, qa_metrics
    return headline_loss, lambda m, b: headline_metrics(m, b, tokenizer=tokenizer)


def public_inputs(texts: Sequence[str], *, backbone: nn.Module, tokenizer: Any, config: HeteroConfig,
                  device: torch.device | str = "cpu") -> CachedSplit:
    """The CONTRAST stage's synthetic inputs: public texts no client holds, cached through the frozen
    prefix (the same for every client: public)."""
    if not texts:
        raise ValueError("CONTRAST needs at least one public input")
    split = prefix_split(backbone, config.adapter_layers)
    return cache_texts(backbone, tokenizer, list(texts), [0] * len(texts), max_length=config.max_length,
                       split=split).to(device)


class HeteroFactory:
    """Builds every client's trainer over one frozen backbone (its frozen weights shared, not copied)."""

    def __init__(self, *, backbone: nn.Module, tokenizer: Any, config: HeteroConfig, public_texts: Sequence[str],
                 device: torch.device | str = "cpu") -> None:
        self.backbone, self.tokenizer, self.config, self.device = backbone.requires_grad_(False), tokenizer, config, device
        self.seq2seq = Seq2SeqConfig(decoder_layers=config.decoder_layers, max_source=config.max_length,
                                     max_target=config.max_target, seed=config.seed)
        self.template = warm_decoder(backbone, layers=config.decoder_layers, seed=config.seed).to(device)
        self.public = public_inputs(public_texts, backbone=backbone, tokenizer=tokenizer, config=config, device=device)
        self.corruptor = Corruptor(tokenizer)
        self._data: dict[int, dict[str, Any]] = {}

    def model(self, client: HeteroClient) -> HeteroModel:
        c, hidden = self.config, self.backbone.config.hidden_size
        suffix = adapted_top(self.backbone, adapter_layers=c.adapter_layers, bottleneck=c.bottleneck, seed=c.seed)
        _own_norms(suffix)
        head: nn.Module | None = None
        if client.formulation == "classification":
            head = make_head(hidden, len(client.label_names), seed=c.seed)
        elif client.formulation == "tagging":
            head = seeded_module(c.seed, lambda: TokenClassifier(hidden, len(client.label_names), dropout=0.1))
        elif client.formulation == "qa":
            head = seeded_module(c.seed, lambda: nn.Linear(hidden, 2, bias=False))
        decoder = client_seq2seq(self.backbone, self.template, config=self.seq2seq, ids=special_ids(self.tokenizer))
        lm = seeded_module(c.seed, lambda: MaskedLMHead(self.backbone.get_input_embeddings()))
        return HeteroModel(formulation=client.formulation, suffix=suffix, head=head, decoder=decoder, lm=lm).to(self.device)

    def data(self, client: HeteroClient) -> dict[str, Any]:
        if client.client_id not in self._data:
            self._data[client.client_id] = _client_data(client, self.backbone, self.tokenizer, self.config, self.device)
        return self._data[client.client_id]

    def trainer(self, client: HeteroClient) -> HeteroTrainer:
        """A fresh client (seeded model, new AdamW) over its own cached data."""
        enc = self.tokenizer(list(client.texts), truncation=True, max_length=self.config.pretrain_length, padding="longest",
                             return_tensors="pt", return_token_type_ids=False)
        loss_fn, metric_fn = _loss_and_metrics(client.formulation, client, self.tokenizer)
        return HeteroTrainer(client=client, model=self.model(client), data=self.data(client), config=self.config,
                             backbone=self.backbone, pretrain_ids=(enc["input_ids"], enc["attention_mask"]), public=self.public,
                             corruptor=self.corruptor, loss_fn=loss_fn, metric_fn=metric_fn)


__all__ = ["METRIC", "SHARED", "HeteroConfig", "MaskedLMHead", "ContrastTargets", "HeteroModel", "shared_parts",
           "HeteroTrainer", "public_inputs", "HeteroFactory"]
