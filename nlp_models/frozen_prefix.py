"""Reuse of frozen work: the bottom layers of a frozen backbone that carry no adapters are computed
once per example and cached; training and evaluation then run only the top (adapted) layers.

With adapters in the top `k` of `L` layers, every training step costs about k/L of a full pass,
and the cache is shared by every method and round of an experiment (the backbone never changes).
This is exact: the cached states are what the full model computes at that depth (dropout is off in
the frozen prefix, which is in eval mode).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from tqdm.auto import tqdm
from transformers.masking_utils import create_bidirectional_mask

from nlp_models.adapters import _encoder_layers
from nlp_models.heads import batch_position_ids, batch_token_type_ids


@dataclass(frozen=True)
class PrefixCache:
    hidden: torch.Tensor
    """(N, L, H) hidden states after the first `split` layers, float32 (or bfloat16 if asked)."""
    attention_mask: torch.Tensor
    """(N, L) 0/1 padding mask."""
    split: int

    def __len__(self) -> int:
        return self.hidden.shape[0]


@torch.inference_mode()
def build_prefix_cache(backbone: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, split: int,
                       batch_size: int = 64, progress: bool = True, dtype: torch.dtype = torch.float32) -> PrefixCache:
    """Run embeddings + layers[:split] of `backbone` once over all examples (no adapters allowed there)."""
    layers = _encoder_layers(backbone)
    if not 0 <= split <= len(layers):
        raise ValueError(f"split {split} outside 0..{len(layers)}")
    for i in range(split):
        if any(type(m).__name__ == "AdapterSite" for m in layers[i].modules()):
            raise ValueError(f"layer {i} carries adapters: it is not frozen and cannot be cached")
    was_training = backbone.training
    backbone.eval()
    out = []
    for start in tqdm(range(0, input_ids.shape[0], batch_size), desc="frozen prefix", disable=not progress, leave=False):
        ids = input_ids[start : start + batch_size]
        mask = attention_mask[start : start + batch_size]
        h = backbone.embeddings(input_ids=ids, position_ids=batch_position_ids(ids), token_type_ids=batch_token_type_ids(ids))
        ext = create_bidirectional_mask(config=backbone.config, inputs_embeds=h, attention_mask=mask)
        for layer in layers[:split]:
            h = layer(h, ext)
            h = h[0] if isinstance(h, tuple) else h
        out.append(h.to(dtype))
    backbone.train(was_training)
    return PrefixCache(hidden=torch.cat(out), attention_mask=attention_mask.clone(), split=split)


def suffix_forward(backbone: nn.Module, hidden: torch.Tensor, attention_mask: torch.Tensor, *, split: int) -> torch.Tensor:
    """Last hidden states from cached states after `split` layers: runs layers[split:] only."""
    h = hidden.float()
    ext = create_bidirectional_mask(config=backbone.config, inputs_embeds=h, attention_mask=attention_mask)
    for layer in _encoder_layers(backbone)[split:]:
        h = layer(h, ext)
        h = h[0] if isinstance(h, tuple) else h
    return h
