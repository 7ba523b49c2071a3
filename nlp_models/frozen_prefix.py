"""Reuse of frozen work: the bottom layers of a frozen backbone that carry no adapters are computed
once per example and cached; training and evaluation then run only the top (adapted) layers.

With adapters in the top `k` of `L` layers, every training step costs about k/L of a full pass,
and the cache is shared by every method and round of an experiment (the backbone never changes).
This is exact: the cached states are what the full model computes at that depth (dropout is off in
the frozen prefix, which is in eval mode).

    h_prefix = layers[:split](embed(x))                    (`build_prefix_cache`, once)
    h        = layers[split:](h_prefix; adapters)          (`TopEncoder` / `suffix_forward`, every step)

With ``attended=True`` the cache also keeps the first adapted layer's attention output before its
first adapter site (``attention.output.dense(attention.self(h_prefix))``: frozen weights on frozen
inputs, so it is the same for every method, round and seed), concatenated to ``h_prefix`` on the last
axis ((N, L, 2H)). `suffix_forward` then starts that layer at its first adapter site, skipping a
quarter of each forward pass (the attention block measured 23% of two MiniLM layers' forward on this
2-core CPU, 2026-11-29). A layer whose attention is trained (LoRA on query/value) ignores the kept
half and computes its attention from ``h_prefix``, so one cache serves every method.

This module is the one frozen-prefix cache of the toolkit: `PrefixCache` holds the states,
`CachedSplit` one labelled split of them (what a client trains on), and `cache_texts` goes from
texts to a `CachedSplit` in length-sorted chunks. `TopEncoder` is a client's own copy of the top
layers that shares the frozen weights with the backbone.
"""
from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset
from tqdm.auto import tqdm
from nlp_models.adapters import _encoder_layers
from nlp_models.bert import bidirectional_mask, chunked
from nlp_models.cpu import cpu_autocast
from nlp_models.heads import batch_position_ids, batch_token_type_ids


@dataclass(frozen=True)
class PrefixCache:
    hidden: torch.Tensor
    """(N, L, H) hidden states after the first `split` layers, float32 (or bfloat16 if asked); (N, L, 2H) with
    the next layer's attention output (pre-adapter) after them when built with ``attended=True``."""
    attention_mask: torch.Tensor
    """(N, L) 0/1 padding mask."""
    split: int

    def __len__(self) -> int:
        return self.hidden.shape[0]


def prefix_split(backbone: nn.Module, adapter_layers: int) -> int:
    """Number of frozen bottom layers (the cached prefix) when the top `adapter_layers` are adapted."""
    total = len(_encoder_layers(backbone))
    if not 1 <= adapter_layers <= total:
        raise ValueError(f"adapter_layers must be in 1..{total} for this backbone, got {adapter_layers}")
    return total - adapter_layers


def _frozen_layers(backbone: nn.Module, split: int) -> nn.ModuleList:
    layers = _encoder_layers(backbone)
    if not 0 <= split <= len(layers):
        raise ValueError(f"split {split} outside 0..{len(layers)}")
    for i in range(split):
        if any(type(m).__name__ == "AdapterSite" for m in layers[i].modules()):
            raise ValueError(f"layer {i} carries adapters: it is not frozen and cannot be cached")
    return layers[:split]


@torch.inference_mode()
def _prefix_states(backbone: nn.Module, layers: nn.ModuleList, ids: torch.Tensor, mask: torch.Tensor,
                   attended: nn.Module | None = None) -> torch.Tensor:
    h = backbone.embeddings(input_ids=ids, position_ids=batch_position_ids(ids), token_type_ids=batch_token_type_ids(ids))
    ext = _mask(backbone, mask, h)
    for layer in layers:
        h = layer(h, ext)
        h = h[0] if isinstance(h, tuple) else h
    if attended is None:
        return h
    return torch.cat([h, _attention_block(attended, h, ext)], dim=-1)


def _attention_block(layer: nn.Module, h: torch.Tensor, ext: torch.Tensor | None) -> torch.Tensor:
    """A BERT layer's self-attention up to its first adapter site: ``attention.output.dense`` of the context."""
    context = layer.attention.self(h, attention_mask=ext)
    return layer.attention.output.dense(context[0] if isinstance(context, tuple) else context)


def _plain_attention(layer: nn.Module) -> bool:
    """Whether `layer`'s attention block (up to its first adapter site) is the backbone's own Linear layers
    (False under LoRA on query/value)."""
    block = [layer.attention.self.query, layer.attention.self.key, layer.attention.self.value,
             layer.attention.output.dense]
    return all(type(m) is nn.Linear for m in block)


def _frozen_attention(layer: nn.Module) -> bool:
    """Whether `layer`'s attention block is plain and frozen, so that its output kept in an attended cache
    is what the layer would compute."""
    return _plain_attention(layer) and not any(p.requires_grad for p in layer.attention.self.parameters()) \
        and not any(p.requires_grad for p in layer.attention.output.dense.parameters())


def build_prefix_cache(backbone: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, split: int,
                       batch_size: int = 64, progress: bool = True, dtype: torch.dtype = torch.float32,
                       by_length: bool = False, attended: bool = False) -> PrefixCache:
    """Run embeddings + layers[:split] of `backbone` once over all examples (no adapters allowed there).

    `by_length` batches rows of similar length together and runs each batch only up to its longest
    row (positions past it stay zero; all are masked): much less padding when lengths vary a lot.
    `attended` also keeps layer `split`'s attention output before its first adapter site (see the module
    docstring); that block must be the backbone's own (no LoRA in it).
    """
    layers = _frozen_layers(backbone, split)
    first = None
    if attended:
        first = _encoder_layers(backbone)[split] if split < len(_encoder_layers(backbone)) else None
        if first is None or not _plain_attention(first):
            raise ValueError(f"layer {split} has no plain attention block to cache (none, or LoRA in it)")
    # batches run where the backbone is; the cache stays where the inputs were given (CPU inputs with a
    # GPU backbone: states come back to the CPU, e.g. to be split per client before moving)
    runs_on = next(backbone.parameters()).device
    was_training = backbone.training
    backbone.eval()
    try:
        if by_length:
            lengths = attention_mask.sum(dim=1)
            order = torch.argsort(lengths, descending=True, stable=True)
            width_h = backbone.config.hidden_size * (2 if attended else 1)
            hidden = torch.zeros(*input_ids.shape, width_h, dtype=dtype, device=input_ids.device)
            for start in tqdm(range(0, len(order), batch_size), desc="frozen prefix", disable=None if progress else True,
                              leave=False):
                rows = order[start : start + batch_size]
                width = int(lengths[rows].max())
                states = _prefix_states(backbone, layers, input_ids[rows, :width].to(runs_on),
                                        attention_mask[rows, :width].to(runs_on), first)
                hidden[rows, :width] = states.to(hidden.device, dtype)
        else:
            out = []
            for start in tqdm(range(0, input_ids.shape[0], batch_size), desc="frozen prefix", disable=None if progress else True,
                              leave=False):
                ids = input_ids[start : start + batch_size]
                mask = attention_mask[start : start + batch_size]
                with torch.inference_mode():
                    out.append(_prefix_states(backbone, layers, ids.to(runs_on), mask.to(runs_on), first)
                               .to(ids.device, dtype))
            with torch.inference_mode():
                hidden = torch.cat(out)
    finally:
        backbone.train(was_training)
    return PrefixCache(hidden=hidden, attention_mask=attention_mask.clone(), split=split)


def suffix_forward(backbone: nn.Module, hidden: torch.Tensor, attention_mask: torch.Tensor, *, split: int) -> torch.Tensor:
    """Last hidden states from cached states after `split` layers: runs layers[split:] only. An attended
    cache ((B, L, 2H)) starts layer `split` at its first adapter site when its attention is frozen."""
    h = hidden.to(torch.promote_types(hidden.dtype, torch.float32))  # half caches compute in float32
    layers = _encoder_layers(backbone)[split:]
    size = backbone.config.hidden_size
    attended = None
    if h.shape[-1] == 2 * size:
        h, attended = h[..., :size], h[..., size:]
    elif h.shape[-1] != size:
        raise ValueError(f"cached states have width {h.shape[-1]}, expected {size} (or {2 * size} with attention)")
    if attended is not None and len(layers) and _frozen_attention(layers[0]):
        h = _after_attention(layers[0], h, attended)
        layers = layers[1:]
    if not len(layers):
        return h
    ext = _mask(backbone, attention_mask, h)
    for layer in layers:
        h = layer(h, ext)
        h = h[0] if isinstance(h, tuple) else h
    return h


def _after_attention(layer: nn.Module, h: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
    """The rest of a BERT layer from its attention block's output: the first adapter site (BertSelfOutput's
    dropout slot), the residual LayerNorm, then the feed-forward sublayer (with the second site)."""
    out = layer.attention.output
    a = out.LayerNorm(out.dropout(attended) + h)
    # as BertLayer.forward does after its attention (chunked only where the config asks for it)
    return chunked(layer.feed_forward_chunk, layer.chunk_size_feed_forward, layer.seq_len_dim, a)


def _mask(backbone: nn.Module, attention_mask: torch.Tensor, h: torch.Tensor) -> torch.Tensor | None:
    """The attention mask the backbone's layers take: our `Bert`'s boolean SDPA mask, or for transformers'
    ``BertModel`` the one its own attention implementation expects."""
    if getattr(backbone.config, "_attn_implementation", "sdpa") == "sdpa":
        return bidirectional_mask(attention_mask, h)
    from transformers.masking_utils import create_bidirectional_mask

    return create_bidirectional_mask(config=backbone.config, inputs_embeds=h, attention_mask=attention_mask)


class _LayerHolder(nn.Module):
    def __init__(self, layers: nn.ModuleList) -> None:
        super().__init__()
        self.layer = layers


class TopEncoder(nn.Module):
    """Layers[split:] of a frozen backbone, sharing its frozen weights (no copy), fed with cached states.

    Laid out like a BERT encoder (``.config``, ``.encoder.layer``) so that ``attach_adapters`` and
    ``suffix_forward`` work on it unchanged: each client attaches its own adapters to its own
    TopEncoder, so many clients cost little memory. The shared weights must be frozen (they serve
    every client); ``freeze=True`` freezes them in place. ``dropout=False`` sets the layers' dropout
    to p = 0 (not eval mode, which would also switch the adapters off training mode for Opacus), like
    the cached prefix below them.
    """

    def __init__(self, backbone: nn.Module, *, split: int, dropout: bool = True, freeze: bool = False) -> None:
        super().__init__()
        layers = _encoder_layers(backbone)[split:]
        if freeze:
            layers.requires_grad_(False)
        elif any(p.requires_grad for p in layers.parameters()):
            raise ValueError("freeze the backbone first: its layers are shared between clients")
        memo: dict[int, Any] = {id(p): p for p in layers.parameters()}
        memo.update({id(b): b for b in layers.buffers()})
        self.config = backbone.config
        self.encoder = _LayerHolder(copy.deepcopy(layers, memo))
        if not dropout:
            for module in self.encoder.modules():
                if isinstance(module, nn.Dropout):
                    module.p = 0.0

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return suffix_forward(self, hidden, attention_mask, split=0)


class CachedBatch(NamedTuple):
    hidden: torch.Tensor
    """(B, L, H) states after the frozen prefix (or token ids (B, L) for full fine-tuning)."""
    attention_mask: torch.Tensor
    labels: torch.Tensor


@dataclass(frozen=True)
class CachedSplit:
    """One split of examples (a client's train, validation or test set) as cached prefix states."""

    hidden: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor
    input_ids: torch.Tensor | None = None
    """Token ids, kept where a method also trains the whole backbone (full fine-tuning)."""

    def __len__(self) -> int:
        return self.labels.shape[0]

    @property
    def lengths(self) -> torch.Tensor:
        """(N,) tokens per example (what `batch` trims to)."""
        return self.attention_mask.sum(dim=1)

    @classmethod
    def take(cls, cache: PrefixCache, labels: torch.Tensor, indices: Sequence[int] | np.ndarray) -> "CachedSplit":
        """Rows `indices` of a cache over a whole corpus (copies: a client holds only its own)."""
        idx = torch.as_tensor(np.asarray(indices, dtype=np.int64))
        return cls(cache.hidden[idx].clone(), cache.attention_mask[idx].clone(), labels[idx].clone())

    def to(self, device: torch.device | str) -> "CachedSplit":
        """The same split on `device` (a no-op copy-free return when it is already there)."""
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        return CachedSplit(move(self.hidden), move(self.attention_mask), move(self.labels), move(self.input_ids))

    def batch(self, index: torch.Tensor, *, tokens: bool = False) -> CachedBatch:
        """Rows `index` trimmed to their longest text (dynamic padding; exact for the real tokens)."""
        mask = self.attention_mask[index]
        length = max(int(mask.sum(dim=1).max()), 1) if len(index) else 1
        if tokens and self.input_ids is None:
            raise ValueError("this split was cached without token ids")
        source = self.input_ids if tokens else self.hidden
        return CachedBatch(source[index, :length], mask[:, :length], self.labels[index])

    def batches(self, batch_size: int, *, order: torch.Tensor | None = None) -> list[CachedBatch]:
        """Consecutive batches in `order` (default: as stored)."""
        order = torch.arange(len(self)) if order is None else order
        return [self.batch(order[start : start + batch_size]) for start in range(0, len(self), batch_size)]

    def dataset(self) -> Dataset:
        """Per-example items (hidden, mask, label) for Opacus' Poisson-sampling loader."""
        return TensorDataset(self.hidden, self.attention_mask, self.labels)


def dummy_if_empty(batch: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], bool]:
    """An empty (hidden, mask, label, ...) batch from Opacus' Poisson sampler as one dummy row (zero states,
    one attended position, label 0), and whether it was empty; other batches unchanged.

    BERT's layers cannot take zero rows (they reshape with an inferred dimension). A caller that cuts its
    per-example losses to zero rows (`losses[:0]`) gets an empty sum, so the dummy's per-example gradient
    is exactly zero and DP-SGD takes the empty batch's step: clip, sum (nothing), noise.
    """
    hidden, mask = batch[0], batch[1]
    if hidden.shape[0] > 0:
        return list(batch), False
    return [hidden.new_zeros(1, 1, hidden.shape[-1]), mask.new_ones(1, 1),
            *(t.new_zeros(1, *t.shape[1:]) for t in batch[2:])], True


def cache_splits(backbone: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor, *,
                 sizes: Mapping[str, int], split: int, device: torch.device | str) -> dict[str, CachedSplit]:
    """One client's consecutive splits (`sizes` in row order, e.g. train/validation/test) cached in one
    pass over their rows, each split a copy of its own rows (a client holds only its own)."""
    if sum(sizes.values()) != input_ids.shape[0] or labels.shape[0] != input_ids.shape[0]:
        raise ValueError(f"split sizes {dict(sizes)} do not cover {input_ids.shape[0]} rows and their labels")
    cache = build_prefix_cache(backbone, input_ids.to(device), attention_mask.to(device), split=split, progress=False)
    labels = labels.to(device)
    out, start = {}, 0
    for name, size in sizes.items():
        rows = slice(start, start + size)
        out[name] = CachedSplit(cache.hidden[rows].clone(), cache.attention_mask[rows].clone(), labels[rows].clone())
        start += size
    return out


def cache_texts(backbone: nn.Module, tokenizer: Any, texts: Sequence[str], labels: Sequence[int], *, max_length: int,
                split: int, chunk: int = 64, bf16: bool = False, attended: bool = False) -> CachedSplit:
    """Tokenise `texts` and cache their frozen prefix in length-sorted chunks (token ids kept); `attended`
    keeps the first adapted layer's attention output too (`build_prefix_cache`)."""
    encoded = tokenizer(list(texts), truncation=True, max_length=max_length, padding="max_length",
                        return_tensors="pt", return_token_type_ids=False)
    ids, mask = encoded["input_ids"], encoded["attention_mask"]
    longest = int(mask.sum(dim=1).max())
    ids, mask = ids[:, :longest].contiguous(), mask[:, :longest].contiguous()
    with cpu_autocast(bf16):
        cache = build_prefix_cache(backbone, ids, mask, split=split, batch_size=chunk, progress=False, by_length=True,
                                   attended=attended)
    return CachedSplit(hidden=cache.hidden, attention_mask=mask,
                       labels=torch.tensor([int(y) for y in labels], dtype=torch.long), input_ids=ids)


__all__ = ["PrefixCache", "prefix_split", "build_prefix_cache", "suffix_forward", "TopEncoder", "CachedBatch",
           "CachedSplit", "dummy_if_empty", "cache_splits", "cache_texts"]
