"""Sentence embeddings from a frozen backbone (for feature-cluster partitions and similarity studies).

Deterministic for a given model and inputs, so results can be cached on disk: with ``cache_dir`` the
array is stored as ``.npy`` (never pickled) under a SHA-256 of the texts, the model and ``max_length``.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from nlp_models.data.tokenize import tokenize
from nlp_models.heads import mean_pool


def _cache_key(texts: Sequence[str], model: nn.Module, max_length: int, model_id: str | None) -> str:
    digest = hashlib.sha256()
    name = model_id or getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__
    digest.update(f"{name}|{max_length}|{len(texts)}".encode())
    for text in texts:
        digest.update(hashlib.sha256(text.encode("utf-8")).digest())
    return digest.hexdigest()[:32]


def embed_texts(
    texts: Sequence[str],
    *,
    model: nn.Module,
    tokenizer,
    max_length: int = 128,
    batch_size: int = 64,
    progress: bool = True,
    cache_dir: str | Path | None = None,
    model_id: str | None = None,
) -> np.ndarray:
    """Mask-aware mean of the last hidden states, float32 array (len(texts), hidden).

    ``model`` is any callable returning ``.last_hidden_state`` (a ``BertModel``, adapters included).
    Texts are processed in length order to reduce padding; rows come back in input order.
    ``model_id`` names the weights in the cache key when the config's name is not specific enough.
    """
    texts = list(texts)
    cache_file = None
    if cache_dir is not None:
        cache_file = Path(cache_dir) / f"embeddings-{_cache_key(texts, model, max_length, model_id)}.npy"
        if cache_file.is_file():
            return np.load(cache_file, allow_pickle=False)
    order = sorted(range(len(texts)), key=lambda index: len(texts[index]))
    hidden = model.config.hidden_size
    output = np.zeros((len(texts), hidden), dtype=np.float32)
    was_training = model.training
    device = next(model.parameters()).device  # inputs follow the model (a CUDA model needs CUDA inputs)
    model.eval()
    try:
        with torch.inference_mode():
            starts = range(0, len(order), batch_size)
            for start in tqdm(starts, desc="embedding", disable=None if progress else True, total=len(starts)):
                rows = order[start : start + batch_size]
                inputs = {k: v.to(device) for k, v in tokenize([texts[row] for row in rows], tokenizer,
                                                                max_length).items()}
                states = model(**inputs).last_hidden_state
                output[rows] = mean_pool(states, inputs["attention_mask"]).float().cpu().numpy()
    finally:
        model.train(was_training)
    if cache_file is not None:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        temporary = cache_file.with_suffix(".tmp.npy")
        np.save(temporary, output, allow_pickle=False)
        temporary.replace(cache_file)
    return output
