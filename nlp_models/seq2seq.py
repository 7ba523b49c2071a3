"""BERT2BERT encoder-decoder warm-started from the offline MiniLM (Rothe et al., 2020), for FedNLP's
seq2seq formulation and AdaFedSelectKD's summariser.

    h_src          = Encoder(x)                                     frozen MiniLM, all 6 layers
    p(y_t | y_<t)  = softmax(E^T LMHead(Decoder(y_<t; CrossAttn(h_src))) + b)

The decoder is a BERT with causal self-attention and cross-attention (transformers'
`EncoderDecoderModel` / `BertLMHeadModel`): its embeddings and self-attention/FFN weights are
MiniLM's bottom `decoder_layers` layers, its cross-attention and LM-head transform are new (MiniLM
ships no MLM head), and the output projection E is tied to the (frozen) word embeddings.

`cross_init='self'` starts each layer's cross-attention as a copy of the same layer's pre-trained
self-attention instead of at random (Rothe et al.'s). A decoder token then attends over the article
as it attended over its own sentence, so with `copy_bias` < 0 the copy mixture below copies salient
words before any training. Measured, not adopted (docs/results/fednlp.md): at the quick budget it lifts
ROUGE-L from 0.07 to 0.16, most of it the untrained start's 0.14; at the grid's scale training first
unlearns the copying and ends under the random start. Defaults keep Rothe et al.'s start.

The encoder is frozen, so its states are computed once per article (like `nlp_models.frozen_prefix`)
and every training step runs the decoder only. What trains (and is uploaded) is chosen by `train`:

* 'decoder': every decoder weight except the tied word embeddings (FedNLP fine-tunes whole models;
  SIMPLIFICATION: here the encoder and the embeddings stay frozen, which makes a CPU run possible);
* 'adapters': named Houlsby adapter sets in the top decoder layers only, everything else frozen
  (AdaFedSelectKD's global and local adapters); the new cross-attention and LM-head transform are
  then trained in the 'decoder' sense first or kept as initialised, as the caller decides.

With `copy=True` (default) the output is a pointer-generator mixture (See et al., 2017):

    p(w) = g P_vocab(w) + (1 - g) sum_{i: x_i = w} a_i,    g = sigmoid(W [s_t; c_t] + b)

where a is the last decoder layer's cross-attention (mean over heads), c_t = a H_src its context and
s_t the decoder state. EXTENSION beyond BERT2BERT, stated: on a CPU budget (a few hundred articles,
a few epochs) the plain decoder learns generic headlines ("uk ..."), ROUGE-L 0.02 on BBC in a pilot,
while the copy mixture reaches 0.17 in the same budget, because a headline reuses the body's words.

Decoding is greedy (no repeated bigram) or, without copying, beam search through `generate`.
"""
from __future__ import annotations

import copy
import math
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from transformers import BertConfig, BertLMHeadModel, BertModel, EncoderDecoderModel
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput

from nlp_models.adapters import AdapterConfig, attach_adapters
from nlp_models.heads import batch_position_ids, batch_token_type_ids

IGNORE_INDEX = -100
TRAINABLE = ("decoder", "adapters")
CROSS_INITS = ("random", "self")


@dataclass(frozen=True)
class Seq2SeqConfig:
    """The generator's shape, what trains, and how it decodes."""

    decoder_layers: int = 2
    """Decoder depth; its layers are warm-started from the encoder's bottom layers."""
    max_source: int = 64
    """Source (article body) tokens the encoder reads."""
    max_target: int = 16
    """Target tokens, [SEP] included (BBC headlines are at most 9 words)."""
    train: str = "decoder"
    adapters: Mapping[str, AdapterConfig | int] | None = None
    """Adapter sets (name -> config or bottleneck) in the top `adapter_layers` decoder layers (train='adapters')."""
    adapter_layers: int = 1
    copy: bool = True
    """Pointer-generator output mixture (see the module docstring)."""
    copy_bias: float = 0.0
    """Initial bias of the copy gate g: g starts near sigmoid(copy_bias), so a negative value starts the
    mixture mostly copying (See et al. leave it to training; a prior for small data)."""
    cross_init: str = "random"
    """'random' (Rothe et al.) or 'self': cross-attention starts as the layer's self-attention."""
    num_beams: int = 1
    """Beam search (through `generate`) needs copy=False; greedy otherwise."""
    no_repeat_ngram_size: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        if self.train not in TRAINABLE:
            raise ValueError(f"train must be one of {', '.join(TRAINABLE)}, got {self.train!r}")
        if self.decoder_layers < 1 or self.max_source < 8 or self.max_target < 2:
            raise ValueError("need decoder_layers >= 1, max_source >= 8 and max_target >= 2")
        if not 1 <= self.adapter_layers <= self.decoder_layers:
            raise ValueError(f"adapter_layers must be in 1..{self.decoder_layers}")
        if self.train == "adapters" and not self.adapters:
            raise ValueError("train='adapters' needs at least one adapter set")
        if self.num_beams < 1 or self.no_repeat_ngram_size < 0:
            raise ValueError("num_beams must be >= 1 and no_repeat_ngram_size >= 0")
        if self.cross_init not in CROSS_INITS:
            raise ValueError(f"cross_init must be one of {', '.join(CROSS_INITS)}, got {self.cross_init!r}")
        if not math.isfinite(self.copy_bias):
            raise ValueError(f"copy_bias must be finite, got {self.copy_bias}")
        if self.copy and self.num_beams > 1:
            raise ValueError("beam search is implemented for copy=False only; use num_beams=1 with copy")


def warm_decoder(encoder: BertModel, *, layers: int, seed: int, cross_init: str = "random") -> BertLMHeadModel:
    """A causal BERT decoder with cross-attention whose embeddings and bottom `layers` layers are
    copies of `encoder`'s (Rothe et al.'s BERT2BERT warm start); new weights are seeded by `seed`.
    With `cross_init='self'` each layer's cross-attention starts as a copy of its self-attention."""
    if not 1 <= layers <= encoder.config.num_hidden_layers:
        raise ValueError(f"decoder_layers must be in 1..{encoder.config.num_hidden_layers}, got {layers}")
    if cross_init not in CROSS_INITS:
        raise ValueError(f"cross_init must be one of {', '.join(CROSS_INITS)}, got {cross_init!r}")
    config = BertConfig(**{**encoder.config.to_dict(), "num_hidden_layers": layers, "is_decoder": True,
                           "add_cross_attention": True, "tie_word_embeddings": True})
    config._attn_implementation = "eager"  # the copy mixture reads the cross-attention probabilities
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        decoder = BertLMHeadModel(config)
    state = {k: v for k, v in encoder.state_dict().items()
             if not k.startswith("encoder.layer.") or int(k.split(".")[2]) < layers}
    missing, unexpected = decoder.bert.load_state_dict(state, strict=False)
    if unexpected or any("crossattention" not in k and "pooler" not in k for k in missing):
        raise RuntimeError(f"warm start mismatch: missing {missing[:4]}, unexpected {unexpected[:4]}")
    if cross_init == "self":
        for layer in decoder.bert.encoder.layer:
            layer.crossattention.load_state_dict(layer.attention.state_dict())
    decoder.tie_weights()
    return decoder


@torch.inference_mode()
def encode_sources(encoder: BertModel, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(N, L, H) last hidden states of the frozen encoder in eval mode (no dropout): computed once per
    source and cached, since the encoder never trains."""
    was = encoder.training
    encoder.eval()
    try:
        return encoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=batch_position_ids(input_ids),
                       token_type_ids=batch_token_type_ids(input_ids)).last_hidden_state
    finally:
        encoder.train(was)


def special_ids(tokenizer: Any) -> dict[str, int]:
    """BERT2BERT's ids: decoding starts at [CLS], ends at [SEP], pads with [PAD]."""
    return {"decoder_start_token_id": tokenizer.cls_token_id, "eos_token_id": tokenizer.sep_token_id,
            "pad_token_id": tokenizer.pad_token_id}


_TWINS: "weakref.WeakKeyDictionary[nn.Module, BertModel]" = weakref.WeakKeyDictionary()


def transformers_encoder(encoder: nn.Module) -> BertModel:
    """`encoder` as transformers' ``BertModel`` (which ``EncoderDecoderModel`` requires): itself if it is one;
    for our `nlp_models.bert.Bert`, a ``BertModel`` made once per encoder that holds the very same parameter
    tensors (no copy: clients keep sharing one frozen encoder)."""
    if isinstance(encoder, BertModel):
        return encoder
    twin = _TWINS.get(encoder)
    if twin is None:
        with torch.random.fork_rng(devices=[]):  # its own initial values are replaced below
            twin = BertModel(BertConfig(**encoder.config.to_dict()), add_pooling_layer=False)
        theirs = dict(twin.named_parameters())
        if set(theirs) != {name for name, _ in encoder.named_parameters()}:
            raise TypeError(f"{type(encoder).__name__} does not lay out its parameters as BertModel does")
        for name, parameter in encoder.named_parameters():
            module, _, leaf = name.rpartition(".")
            setattr(twin.get_submodule(module), leaf, parameter)
        twin.to(next(encoder.parameters()).device).train(encoder.training)
        _TWINS[encoder] = twin
    return twin


class Seq2SeqModel(nn.Module):
    """One client's decoder over a frozen encoder shared by every client (no copy of its weights).

    `encode` runs the frozen encoder (once per article, cache the result); `loss` and `generate`
    take those states.
    """

    def __init__(self, encoder: BertModel, decoder: BertLMHeadModel, *, config: Seq2SeqConfig,
                 ids: Mapping[str, int]) -> None:
        super().__init__()
        if any(p.requires_grad for p in encoder.parameters()):
            raise ValueError("freeze the encoder first: it is shared between clients")
        self.config = config
        self.wrapper = EncoderDecoderModel(encoder=transformers_encoder(encoder), decoder=decoder)
        for key, value in ids.items():
            setattr(self.wrapper.config, key, value)
            setattr(self.wrapper.generation_config, key, value)
        hidden = decoder.config.hidden_size
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            self.copy_gate = nn.Linear(2 * hidden, 1) if config.copy else None
        if self.copy_gate is not None:
            with torch.no_grad():
                self.copy_gate.bias.add_(config.copy_bias)

    @property
    def encoder(self) -> BertModel:
        return self.wrapper.encoder

    @property
    def decoder(self) -> BertLMHeadModel:
        return self.wrapper.decoder

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(N, L, H) last hidden states of the frozen encoder (see `encode_sources`)."""
        return encode_sources(self.encoder, input_ids, attention_mask)

    def _outputs(self, source: torch.Tensor, source_mask: torch.Tensor, inputs: torch.Tensor, mask: torch.Tensor, *,
                 last_only: bool = False, cache: EncoderDecoderCache | None = None,
                 ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """The decoder's (B, T, V) vocabulary logits and, when the config copies, the gate g (B, T, 1) and
        the last layer's cross-attention a (B, T, S), mean over heads (T = 1 with `last_only`). With a
        `cache`, `inputs` are the new tokens only (their keys and values are added to it) and `mask`
        covers the cached tokens and the new ones."""
        out = self.decoder.bert(input_ids=inputs, attention_mask=mask, encoder_hidden_states=source.float(),
                                encoder_attention_mask=source_mask, use_cache=cache is not None, cache=cache,
                                output_attentions=self.config.copy)
        states = out.last_hidden_state[:, -1:] if last_only else out.last_hidden_state
        logits = self.decoder.cls(states).float()
        if not self.config.copy:
            return logits, None, None
        attention = out.cross_attentions[-1].float().mean(dim=1)  # (B, T, S)
        attention = attention[:, -1:] if last_only else attention
        context = attention @ source.float()
        gate = torch.sigmoid(self.copy_gate(torch.cat([states.float(), context], dim=-1)))
        return logits, gate, attention

    def _decode(self, source: torch.Tensor, source_mask: torch.Tensor, source_ids: torch.Tensor | None,
                inputs: torch.Tensor, mask: torch.Tensor, *, last_only: bool = False,
                cache: EncoderDecoderCache | None = None) -> torch.Tensor:
        """(B, T, V) next-token log-probabilities (T = 1 with `last_only`, as decoding needs): the
        vocabulary softmax, mixed with the copy distribution over `source_ids` when the config copies."""
        _need_ids(self.config, source_ids)
        logits, gate, attention = self._outputs(source, source_mask, inputs, mask, last_only=last_only, cache=cache)
        vocab = logits.log_softmax(-1)
        if gate is None:
            return vocab
        copied = torch.zeros_like(vocab).scatter_add_(
            2, source_ids[:, None, :].expand(-1, attention.shape[1], -1), attention)
        return (gate * vocab.exp() + (1 - gate) * copied).clamp_min(1e-12).log()

    def _teacher_inputs(self, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher forcing's decoder input ([CLS] + target[:-1]) and its attention mask."""
        start = torch.full_like(target[:, :1], self.wrapper.config.decoder_start_token_id)
        inputs = torch.cat([start, target[:, :-1].clamp_min(0)], dim=1)
        mask = torch.cat([torch.ones_like(start), (target[:, :-1] != IGNORE_INDEX).long()], dim=1)
        return inputs, mask

    def log_probs(self, source: torch.Tensor, source_mask: torch.Tensor, target: torch.Tensor, *,
                  source_ids: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T, V) log p(y_t | y_<t, x) under teacher forcing: the decoder reads [CLS] + target[:-1]."""
        inputs, mask = self._teacher_inputs(target)
        return self._decode(source, source_mask, source_ids, inputs, mask)

    def loss(self, source: torch.Tensor, source_mask: torch.Tensor, target: torch.Tensor, *,
             source_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Mean token negative log-likelihood of the target (ids, [SEP] last, IGNORE_INDEX as padding).

        Only the targets' probabilities are formed, p(y_t) = g P_vocab(y_t) + (1 - g) sum_{i: x_i = y_t} a_i:
        the number `log_probs` gives at y_t, without building the (B, T, V) mixture or scattering the
        attention into it (a third of a CPU training step; on a GPU the scatter is an atomic add, which
        deterministic kernels replace by a slower sorted one)."""
        _need_ids(self.config, source_ids)
        inputs, mask = self._teacher_inputs(target)
        logits, gate, attention = self._outputs(source, source_mask, inputs, mask)
        y = target.clamp_min(0)
        logp = -F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view_as(y)
        if gate is not None:
            copied = (attention * (source_ids[:, None, :] == y[:, :, None])).sum(-1)
            gate = gate.squeeze(-1)
            logp = (gate * logp.exp() + (1 - gate) * copied).clamp_min(1e-12).log()
        return -logp[target != IGNORE_INDEX].mean()

    @torch.inference_mode()
    def generate(self, source: torch.Tensor, source_mask: torch.Tensor, *,
                 source_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Token ids of the decoded targets, at most max_target tokens, [CLS] first."""
        was = self.training
        self.eval()
        try:
            if self.config.num_beams > 1:
                return self.wrapper.generate(
                    encoder_outputs=BaseModelOutput(last_hidden_state=source.float()), attention_mask=source_mask,
                    max_new_tokens=self.config.max_target, num_beams=self.config.num_beams,
                    no_repeat_ngram_size=self.config.no_repeat_ngram_size, do_sample=False)
            return self._greedy(source, source_mask, source_ids)
        finally:
            self.train(was)

    def _greedy(self, source: torch.Tensor, source_mask: torch.Tensor, source_ids: torch.Tensor | None, *,
                use_cache: bool = True) -> torch.Tensor:
        """Greedy decoding with no repeated n-gram. Each step feeds only the newest token and reuses the
        earlier tokens' keys and values (and the article's cross-attention keys and values) from a
        cache; `use_cache=False` re-reads the whole prefix each step, the reference the cache must equal."""
        ids = self.wrapper.config
        sequence = torch.full((source.shape[0], 1), ids.decoder_start_token_id, dtype=torch.long,
                              device=source.device)
        done = torch.zeros(source.shape[0], dtype=torch.bool, device=source.device)
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache()) if use_cache else None
        for _ in range(self.config.max_target):
            inputs = sequence[:, -1:] if use_cache else sequence
            logp = self._decode(source, source_mask, source_ids, inputs, torch.ones_like(sequence),
                                last_only=True, cache=cache)[:, -1]
            for row, banned in enumerate(_repeated_ngram_ends(sequence.tolist(), self.config.no_repeat_ngram_size)):
                if banned:
                    logp[row, list(banned)] = -float("inf")
            step = logp.argmax(dim=-1).masked_fill(done, ids.pad_token_id)
            sequence = torch.cat([sequence, step[:, None]], dim=1)
            done |= step == ids.eos_token_id
            if bool(done.all()):
                break
        return sequence


def _need_ids(config: Seq2SeqConfig, source_ids: torch.Tensor | None) -> None:
    if config.copy and source_ids is None:
        raise ValueError("the copy mixture needs the source token ids")


def _repeated_ngram_ends(rows: list[list[int]], n: int) -> list[set[int]]:
    """Per row, the tokens that would complete an n-gram already in it (HF's no_repeat_ngram rule)."""
    if n < 1:
        return [set() for _ in rows]
    banned = []
    for row in rows:
        prefix = tuple(row[len(row) - n + 1:]) if n > 1 else ()
        ends = {row[i + n - 1] for i in range(len(row) - n + 1) if tuple(row[i:i + n - 1]) == prefix}
        banned.append(ends)
    return banned


def _freeze_for(model: Seq2SeqModel) -> None:
    config = model.config
    model.decoder.requires_grad_(False)
    if config.train == "decoder":
        for name, p in model.decoder.named_parameters():
            p.requires_grad_("word_embeddings" not in name)
        return
    if model.copy_gate is not None:
        model.copy_gate.requires_grad_(False)
    top = range(config.decoder_layers - config.adapter_layers, config.decoder_layers)
    attach_adapters(model.decoder, dict(config.adapters or {}), seed=config.seed, layers=list(top))
    for name, p in model.decoder.named_parameters():
        p.requires_grad_(".adapters." in name)


def client_seq2seq(encoder: BertModel, template: BertLMHeadModel, *, config: Seq2SeqConfig,
                   ids: Mapping[str, int]) -> Seq2SeqModel:
    """A client's model: its own copy of the decoder `template` (frozen word embeddings shared, not
    copied), trainable as `config.train` says, over the shared frozen `encoder`."""
    frozen = template.get_input_embeddings().weight
    decoder = copy.deepcopy(template, {id(frozen): frozen})
    model = Seq2SeqModel(encoder, decoder, config=config, ids=ids)
    _freeze_for(model)
    return model


def build_seq2seq(encoder: BertModel, *, config: Seq2SeqConfig, tokenizer: Any) -> Seq2SeqModel:
    """Warm-start a decoder from `encoder` (frozen here) and wrap both: the one-call form."""
    encoder.requires_grad_(False)
    template = warm_decoder(encoder, layers=config.decoder_layers, seed=config.seed, cross_init=config.cross_init)
    return client_seq2seq(encoder, template, config=config, ids=special_ids(tokenizer))


def tokenize_pairs(tokenizer: Any, sources: Sequence[str], targets: Sequence[str], *, max_source: int,
                   max_target: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(source ids, source mask, target ids): targets are word pieces + [SEP], padded with IGNORE_INDEX."""
    src = tokenizer(list(sources), truncation=True, max_length=max_source, padding="longest", return_tensors="pt",
                    return_token_type_ids=False)
    tgt = tokenizer(list(targets), truncation=True, max_length=max_target, add_special_tokens=False,
                    return_token_type_ids=False, return_attention_mask=False)["input_ids"]
    rows = [ids[: max_target - 1] + [tokenizer.sep_token_id] for ids in tgt]
    width = max(len(r) for r in rows)
    target = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    for i, r in enumerate(rows):
        target[i, : len(r)] = torch.tensor(r)
    return src["input_ids"], src["attention_mask"], target


def rouge_scores(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Mean ROUGE-1/2/L F-measures (rouge-score package, Porter stemming), in [0, 1]."""
    from rouge_score import rouge_scorer

    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    if not predictions:
        return {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    totals = {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}
    for pred, ref in zip(predictions, references):
        for key, score in scorer.score(ref, pred).items():
            totals[key] += score.fmeasure
    return {key: value / len(predictions) for key, value in totals.items()}


__all__ = ["IGNORE_INDEX", "TRAINABLE", "CROSS_INITS", "Seq2SeqConfig", "warm_decoder", "encode_sources",
           "special_ids", "Seq2SeqModel", "client_seq2seq", "build_seq2seq", "tokenize_pairs", "rouge_scores"]
