"""A BERT encoder of our own, module for module and name for name Hugging Face's ``BertModel``
(without its pooler), so that a client process need not import transformers.

Why: importing transformers' BERT costs about 2.5 s on a 2-core CPU (its mask utilities import
``torch._dynamo``), more than the rest of a client's start-up together. This module imports torch
and safetensors only.

What is kept identical, so that everything written against Hugging Face's model works unchanged:
- every parameter name (``embeddings.word_embeddings.weight``, ``encoder.layer.3.attention.self.query.weight``,
  ...), so checkpoints load as they are and peft's LoRA targets (``query``, ``value``) match;
- the module tree (``layer.attention.self``, ``layer.attention.output.{dense,dropout,LayerNorm}``,
  ``layer.intermediate``, ``layer.output.{dense,dropout,LayerNorm}``), so adapter sites
  (`nlp_models.adapters`) replace the same ``dropout`` modules and the frozen-prefix cache
  (`nlp_models.frozen_prefix`) can start a layer at its first adapter site;
- the arithmetic: scaled-dot-product attention with the same boolean mask (None when nothing is
  padded), exact GeLU, LayerNorm after each residual, and feed-forward chunking where configured.
  ``tests/nlp_models/test_bert.py`` checks outputs and gradients against transformers' ``BertModel`` on
  the packaged MiniLM weights.

What is left out: decoders, caches, cross-attention and the pooler (heads pool by mask-aware means).
The seq2seq tasks, which need transformers' ``EncoderDecoderModel``, load Hugging Face's model instead
(`nlp_models.backbone.load_backbone(hf=True)`).
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.nn import functional as F

_ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "gelu": nn.GELU, "relu": nn.ReLU, "silu": nn.SiLU, "swish": nn.SiLU, "tanh": nn.Tanh,
    "gelu_new": lambda: nn.GELU(approximate="tanh"),
}
"""transformers' ACT2FN entries as modules (its ``gelu`` is the exact, erf-based one)."""


@dataclass(frozen=True)
class BertSettings:
    """The shape of a BERT encoder, under the attribute names of Hugging Face's ``BertConfig`` (so code
    reading ``model.config.hidden_size`` works with either model)."""

    vocab_size: int = 30522
    hidden_size: int = 384
    num_hidden_layers: int = 6
    num_attention_heads: int = 12
    intermediate_size: int = 1536
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    initializer_range: float = 0.02
    chunk_size_feed_forward: int = 0

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads "
                             f"{self.num_attention_heads}")
        if self.hidden_act not in _ACTIVATIONS:
            raise ValueError(f"hidden_act must be one of {sorted(_ACTIVATIONS)}, got {self.hidden_act!r}")
        if min(self.vocab_size, self.hidden_size, self.num_hidden_layers, self.intermediate_size,
               self.max_position_embeddings, self.type_vocab_size) < 1:
            raise ValueError("every size of a BERT encoder must be positive")

    @classmethod
    def from_json(cls, path: str | Path) -> "BertSettings":
        """Settings from a checkpoint's ``config.json``; refuses a model that is not a plain BERT encoder."""
        raw = json.loads(Path(path).read_text())
        if raw.get("model_type", "bert") != "bert":
            raise ValueError(f"{path}: model_type {raw.get('model_type')!r} is not 'bert'")
        if raw.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"{path}: only absolute position embeddings are supported")
        if raw.get("is_decoder") or raw.get("add_cross_attention"):
            raise ValueError(f"{path}: a decoder; load it with transformers (load_backbone(hf=True))")
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in names and v is not None})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class EncoderOutput(NamedTuple):
    last_hidden_state: torch.Tensor
    """(B, L, H) states after the last layer."""


def bidirectional_mask(attention_mask: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
    """The (B, 1, L, L) boolean keep-mask scaled-dot-product attention takes (True = attend), or None when
    no position is padded: what transformers' ``create_bidirectional_mask`` gives its SDPA attention."""
    if attention_mask is None:
        return None
    keep = attention_mask.to(device=like.device, dtype=torch.bool)
    if bool(keep.all()):
        return None
    batch, length = keep.shape
    return keep[:, None, None, :].expand(batch, 1, length, length)


def chunked(forward: Callable[[torch.Tensor], torch.Tensor], chunk_size: int, dim: int, x: torch.Tensor) -> torch.Tensor:
    """``forward(x)``, in chunks of `chunk_size` along `dim` when positive (transformers'
    ``apply_chunking_to_forward``: the feed-forward acts on each position alone, so chunks are exact)."""
    if chunk_size <= 0:
        return forward(x)
    if x.shape[dim] % chunk_size:
        raise ValueError(f"dimension {dim} of size {x.shape[dim]} is not a multiple of chunk size {chunk_size}")
    return torch.cat([forward(part) for part in x.split(chunk_size, dim=dim)], dim=dim)


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertSettings):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.register_buffer("position_ids", torch.arange(config.max_position_embeddings).expand((1, -1)),
                             persistent=False)

    def forward(self, input_ids: torch.Tensor | None = None, token_type_ids: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        shape = input_ids.shape if input_ids is not None else inputs_embeds.shape[:-1]
        if position_ids is None:
            position_ids = self.position_ids[:, : shape[1]]
        if token_type_ids is None:
            token_type_ids = torch.zeros(shape, dtype=torch.long, device=self.position_ids.device)
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)
        embeddings = inputs_embeds + self.token_type_embeddings(token_type_ids)
        embeddings = embeddings + self.position_embeddings(position_ids)
        return self.dropout(self.LayerNorm(embeddings))


class BertSelfAttention(nn.Module):
    def __init__(self, config: BertSettings):
        super().__init__()
        self.num_attention_heads = config.num_attention_heads
        self.attention_head_size = config.hidden_size // config.num_attention_heads
        self.scaling = self.attention_head_size ** -0.5
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        shape = (*hidden_states.shape[:-1], -1, self.attention_head_size)
        q = self.query(hidden_states).view(shape).transpose(1, 2)
        k = self.key(hidden_states).view(shape).transpose(1, 2)
        v = self.value(hidden_states).view(shape).transpose(1, 2)
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, scale=self.scaling,
                                                 dropout_p=self.dropout.p if self.training else 0.0)
        return context.transpose(1, 2).reshape(*hidden_states.shape[:-1], -1).contiguous()


class BertSelfOutput(nn.Module):
    def __init__(self, config: BertSettings):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden_states)) + input_tensor)


class BertAttention(nn.Module):
    def __init__(self, config: BertSettings):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.output(self.self(hidden_states, attention_mask), hidden_states)


class BertIntermediate(nn.Module):
    def __init__(self, config: BertSettings):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.intermediate_act_fn = _ACTIVATIONS[config.hidden_act]()

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.intermediate_act_fn(self.dense(hidden_states))


class BertOutput(nn.Module):
    def __init__(self, config: BertSettings):
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden_states)) + input_tensor)


class BertLayer(nn.Module):
    def __init__(self, config: BertSettings):
        super().__init__()
        self.chunk_size_feed_forward = config.chunk_size_feed_forward
        self.seq_len_dim = 1
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        attended = self.attention(hidden_states, attention_mask)
        return chunked(self.feed_forward_chunk, self.chunk_size_feed_forward, self.seq_len_dim, attended)

    def feed_forward_chunk(self, attention_output: torch.Tensor) -> torch.Tensor:
        return self.output(self.intermediate(attention_output), attention_output)


class BertEncoder(nn.Module):
    def __init__(self, config: BertSettings):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        for layer in self.layer:
            hidden_states = layer(hidden_states, attention_mask)
        return hidden_states


class Bert(nn.Module):
    """A BERT encoder (embeddings and layers, no pooler): ``model(input_ids=..., attention_mask=...)``
    returns an `EncoderOutput` whose ``last_hidden_state`` is what transformers' ``BertModel`` gives."""

    def __init__(self, config: BertSettings, *, generator: torch.Generator | None = None):
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.reset_parameters(generator=generator)

    @torch.no_grad()
    def reset_parameters(self, *, generator: torch.Generator | None = None) -> None:
        """BERT's initialisation: weights N(0, initializer_range), biases 0, LayerNorm (1, 0), the padding
        embedding 0."""
        std = self.config.initializer_range
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=std, generator=generator)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
            if isinstance(module, nn.Embedding) and module.padding_idx is not None:
                module.weight[module.padding_idx].zero_()
            if isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None) -> EncoderOutput:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids or inputs_embeds")
        h = self.embeddings(input_ids=input_ids, token_type_ids=token_type_ids, position_ids=position_ids,
                            inputs_embeds=inputs_embeds)
        return EncoderOutput(self.encoder(h, bidirectional_mask(attention_mask, h)))


def load_bert(directory: str | Path) -> Bert:
    """A `Bert` from a checkpoint directory (``config.json`` + ``model.safetensors``), in eval mode.

    Every encoder weight must be present and of the right shape (a checkpoint that misses one is refused,
    not silently random); the pooler and stored buffers (``embeddings.position_ids``) are ignored.
    """
    from safetensors.torch import load_file

    directory = Path(directory)
    config = BertSettings.from_json(directory / "config.json")
    with torch.random.fork_rng(devices=[]):  # the initial values are all overwritten: leave the global RNG alone
        model = Bert(config)
    state = {k.removeprefix("bert."): v for k, v in load_file(str(directory / "model.safetensors")).items()}
    state = {k: v for k, v in state.items() if not k.startswith("pooler.") and k != "embeddings.position_ids"}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{directory}: checkpoint does not fit a BERT encoder (missing {missing[:4]}, "
                         f"unexpected {unexpected[:4]})")
    return model.eval()


__all__ = ["BertSettings", "Bert", "EncoderOutput", "bidirectional_mask", "chunked", "load_bert"]
