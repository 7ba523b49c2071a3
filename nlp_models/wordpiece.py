"""The backbone's WordPiece tokenizer straight from the `tokenizers` library: the same ``tokenizer.json``
and the same Rust code that transformers' fast tokenizer wraps, without importing transformers
(which costs a client process about a second before its first round).

`WordPieceTokenizer` answers the calls the encoder-only tasks make, with transformers' meaning:
``tok(texts, truncation=True, max_length=128, padding="longest", return_tensors="pt")`` and the
special-token ids. Anything else (text pairs, offsets, pre-split words, decoding) is handed to
transformers' tokenizer of the same files, loaded on first need (`transformers()`), so the QA,
tagging and seq2seq tasks pay for transformers and the others do not.
``tests/nlp_models/test_wordpiece.py`` checks ids and masks against transformers' tokenizer.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PADDING = {False: None, "do_not_pad": None, True: "longest", "longest": "longest", "max_length": "max_length"}


class Encoding(dict):
    """What a call returns: a dict of lists (or tensors), also readable as attributes (``enc.input_ids``)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class WordPieceTokenizer:
    """A BERT WordPiece tokenizer on `tokenizers.Tokenizer`, called like transformers' tokenizers."""

    def __init__(self, backend: Any, *, special: dict[str, str], model_max_length: int = 512,
                 directory: str | Path | None = None) -> None:
        self._backend = backend
        self.directory = None if directory is None else Path(directory)
        self._transformers: Any = None
        self.model_max_length = int(model_max_length)
        ids = {}
        for role, token in special.items():
            index = backend.token_to_id(token)
            if index is None:
                raise ValueError(f"the vocabulary has no {role} token {token!r}")
            ids[role] = index
        self.pad_token_id, self.unk_token_id = ids["pad"], ids["unk"]
        self.cls_token_id, self.sep_token_id, self.mask_token_id = ids["cls"], ids["sep"], ids["mask"]
        self.pad_token = special["pad"]
        self.all_special_ids = sorted(set(ids.values()))

    @classmethod
    def from_directory(cls, directory: str | Path) -> "WordPieceTokenizer":
        """The tokenizer of a checkpoint directory (``tokenizer.json`` plus ``tokenizer_config.json``)."""
        from tokenizers import Tokenizer

        directory = Path(directory)
        config_path = directory / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        special = {role: config.get(f"{role}_token", default) for role, default in
                   (("pad", "[PAD]"), ("unk", "[UNK]"), ("cls", "[CLS]"), ("sep", "[SEP]"), ("mask", "[MASK]"))}
        length = config.get("model_max_length", 512)
        if not isinstance(length, int) or length > 1_000_000:   # transformers' "no limit" sentinel
            length = 512
        return cls(Tokenizer.from_file(str(directory / "tokenizer.json")), special=special, model_max_length=length,
                   directory=directory)

    def transformers(self) -> Any:
        """transformers' fast tokenizer of the same directory (loaded once, on first need)."""
        if self._transformers is None:
            if self.directory is None:
                raise TypeError("this tokenizer was not loaded from a directory: transformers' cannot be made")
            from transformers import AutoTokenizer

            self._transformers = AutoTokenizer.from_pretrained(str(self.directory), local_files_only=True)
        return self._transformers

    def decode(self, *args: Any, **kwargs: Any) -> str:
        return self.transformers().decode(*args, **kwargs)

    def batch_decode(self, *args: Any, **kwargs: Any) -> list[str]:
        return self.transformers().batch_decode(*args, **kwargs)

    @property
    def vocab_size(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=False)

    def __len__(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    def convert_ids_to_tokens(self, ids: int | Sequence[int]) -> str | list[str]:
        if isinstance(ids, int):
            return self._backend.id_to_token(ids)
        return [self._backend.id_to_token(int(i)) for i in ids]

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> int | list[int]:
        def one(token: str) -> int:
            index = self._backend.token_to_id(token)
            return self.unk_token_id if index is None else index
        return one(tokens) if isinstance(tokens, str) else [one(t) for t in tokens]

    def __call__(self, text: str | Sequence[str], text_pair: Any = None, *, add_special_tokens: bool = True,
                 padding: bool | str = False, truncation: bool | str = False, max_length: int | None = None,
                 return_tensors: str | None = None, return_token_type_ids: bool = True,
                 return_attention_mask: bool = True, **unsupported: Any) -> Encoding:
        if text_pair is not None or unsupported or not isinstance(truncation, bool):
            return self.transformers()(
                text, text_pair, add_special_tokens=add_special_tokens, padding=padding, truncation=truncation,
                max_length=max_length, return_tensors=return_tensors, return_token_type_ids=return_token_type_ids,
                return_attention_mask=return_attention_mask, **unsupported)
        if padding not in PADDING:
            raise ValueError(f"padding must be one of {sorted(map(str, PADDING))}, got {padding!r}")
        if return_tensors not in (None, "pt"):
            raise ValueError(f"return_tensors must be None or 'pt', got {return_tensors!r}")
        single = isinstance(text, str)
        texts = [text] if single else list(text)
        if not all(isinstance(t, str) for t in texts):
            raise TypeError("text must be a string or a sequence of strings")
        limit = self.model_max_length if max_length is None else int(max_length)
        backend = self._backend
        backend.no_truncation()
        backend.no_padding()
        if truncation:
            backend.enable_truncation(limit)
        pad = PADDING[padding]
        if pad is not None:
            backend.enable_padding(pad_id=self.pad_token_id, pad_token=self.pad_token,
                                   length=limit if pad == "max_length" else None)
        encodings = backend.encode_batch(texts, add_special_tokens=add_special_tokens)
        out = Encoding(input_ids=[e.ids for e in encodings])
        if return_token_type_ids:
            out["token_type_ids"] = [e.type_ids for e in encodings]
        if return_attention_mask:
            out["attention_mask"] = [e.attention_mask for e in encodings]
        if return_tensors == "pt":
            import torch

            if len({len(row) for row in out["input_ids"]}) > 1:
                raise ValueError("rows differ in length: ask for padding to return tensors")
            return Encoding({k: torch.tensor(v, dtype=torch.long) for k, v in out.items()})
        return Encoding({k: v[0] for k, v in out.items()}) if single else out


def as_transformers(tokenizer: Any) -> Any:
    """transformers' tokenizer for `tokenizer` (itself unless it is a `WordPieceTokenizer`): for code that
    needs a ``PreTrainedTokenizerBase``, such as transformers' data collators."""
    return tokenizer.transformers() if isinstance(tokenizer, WordPieceTokenizer) else tokenizer


__all__ = ["WordPieceTokenizer", "Encoding", "as_transformers"]
