"""Tokenisation, a torch ``Dataset`` of token ids, and the collate that builds Opacus-safe batches.

Batches always carry batch-sized, contiguous ``position_ids`` and ``token_type_ids`` (see
``nlp_models.heads``); padding is on the right, and token labels of padding, special tokens and
non-first word pieces are -100 (ignored by ``cross_entropy``).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch.utils.data import Dataset

from nlp_models.data.dataset import TextDataset
from nlp_models.heads import batch_position_ids, batch_token_type_ids

IGNORE_INDEX = -100


class Batch(NamedTuple):
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor
    position_ids: torch.Tensor
    labels: torch.Tensor

    def model_inputs(self) -> dict[str, torch.Tensor]:
        """Keyword arguments for ``TextClassifier.forward``."""
        return {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "position_ids": self.position_ids,
            "token_type_ids": self.token_type_ids,
        }


def tokenize(texts: Sequence[str], tokenizer, max_length: int) -> dict[str, torch.Tensor]:
    """Pad to the longest text (at most ``max_length`` tokens) and return model inputs, including
    contiguous ``position_ids`` and zero ``token_type_ids``."""
    encoded = tokenizer(
        list(texts), padding=True, truncation=True, max_length=max_length, return_tensors="pt",
        return_token_type_ids=False,
    )
    input_ids = encoded["input_ids"]
    return {
        "input_ids": input_ids,
        "attention_mask": encoded["attention_mask"],
        "position_ids": batch_position_ids(input_ids),
        "token_type_ids": batch_token_type_ids(input_ids),
    }


def tokenize_words(
    words: Sequence[Sequence[str]], word_labels: Sequence[Sequence[int]], tokenizer, max_length: int
) -> tuple[list[list[int]], list[list[int]]]:
    """Word-piece ids and aligned token labels: each word's label on its first piece, -100 elsewhere."""
    encoded = tokenizer(
        [list(sentence) for sentence in words], is_split_into_words=True, truncation=True, max_length=max_length
    )
    all_ids, all_labels = [], []
    for row, labels in enumerate(word_labels):
        aligned, previous = [], None
        for word in encoded.word_ids(row):
            aligned.append(IGNORE_INDEX if word is None or word == previous else int(labels[word]))
            previous = word
        all_ids.append(list(encoded["input_ids"][row]))
        all_labels.append(aligned)
    return all_ids, all_labels


class TokenizedDataset(Dataset):
    """Items are ``(input_ids, label)``: a 1-D LongTensor and an int (sequence) or a 1-D LongTensor (token).

    Tokenised once up front; pair with ``collate_batch`` (or ``make_collate``) in a DataLoader.
    Items are tuples of tensors so that Opacus' Poisson-sampling DataLoader can build empty batches.
    """

    def __init__(self, dataset: TextDataset, tokenizer, *, max_length: int = 128):
        self.task = dataset.task
        self.pad_token_id = int(tokenizer.pad_token_id or 0)
        if dataset.task == "token":
            ids, labels = tokenize_words(dataset.words, dataset.labels, tokenizer, max_length)
            self.labels = [torch.tensor(row, dtype=torch.long) for row in labels]
        else:
            ids = tokenizer(list(dataset.texts), truncation=True, max_length=max_length)["input_ids"]
            self.labels = [torch.tensor(int(label), dtype=torch.long) for label in dataset.labels]
        self.input_ids = [torch.tensor(row, dtype=torch.long) for row in ids]

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.input_ids[index], self.labels[index]


def collate_batch(items: Sequence[tuple[torch.Tensor, torch.Tensor]], *, pad_token_id: int = 0) -> Batch:
    """Right-pad a list of ``(input_ids, label)`` items into a ``Batch``.

    Opacus' Poisson sampler may replace an empty batch by zero-size tensors before this runs; skip a
    batch whose ``input_ids`` has zero rows.
    """
    if not items:
        raise ValueError("cannot collate an empty batch")
    length = max(len(ids) for ids, _ in items)
    input_ids = torch.full((len(items), length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(items), length), dtype=torch.long)
    for row, (ids, _) in enumerate(items):
        input_ids[row, : len(ids)] = ids
        attention_mask[row, : len(ids)] = 1
    first_label = items[0][1]
    if first_label.dim() == 0:
        labels = torch.stack([label for _, label in items])
    else:
        labels = torch.full((len(items), length), IGNORE_INDEX, dtype=torch.long)
        for row, (_, label) in enumerate(items):
            labels[row, : len(label)] = label
    return Batch(input_ids, attention_mask, batch_token_type_ids(input_ids), batch_position_ids(input_ids), labels)


class make_collate:  # noqa: N801 - used like a function: DataLoader(..., collate_fn=make_collate(ds))
    """``collate_batch`` bound to a pad id; a class, not a lambda, so DataLoader worker processes accept it."""

    def __init__(self, dataset_or_pad_id: TokenizedDataset | int = 0):
        if isinstance(dataset_or_pad_id, TokenizedDataset):
            self.pad_token_id = dataset_or_pad_id.pad_token_id
        else:
            self.pad_token_id = int(dataset_or_pad_id)

    def __call__(self, items: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> Batch:
        return collate_batch(items, pad_token_id=self.pad_token_id)
