"""Tokenisation, word-label alignment and the Opacus-safe collate."""
import torch
from torch.utils.data import DataLoader

from nlp_models.data.dataset import TextDataset
from nlp_models.data.tokenize import IGNORE_INDEX, TokenizedDataset, make_collate, tokenize, tokenize_words


def test_tokenize_pads_truncates_and_adds_contiguous_ids(tokenizer):
    batch = tokenize(["short", "a much longer sentence than the first one " * 10], tokenizer, 16)
    assert batch["input_ids"].shape == (2, 16)
    assert batch["attention_mask"][0].sum() == 3  # [CLS] short [SEP]
    assert batch["position_ids"].is_contiguous() and batch["position_ids"].shape == (2, 16)
    assert not batch["token_type_ids"].any()


def test_word_labels_go_to_first_piece_only(tokenizer):
    ids, labels = tokenize_words([["Empire", "Statesmanship", "!"]], [[1, 2, 0]], tokenizer, 32)
    pieces = tokenizer.convert_ids_to_tokens(ids[0])
    assert len(pieces) == len(labels[0])
    assert labels[0][0] == IGNORE_INDEX and labels[0][-1] == IGNORE_INDEX  # [CLS], [SEP]
    assert [label for label in labels[0] if label != IGNORE_INDEX] == [1, 2, 0]
    assert len(pieces) > 5  # "Statesmanship" is several pieces, only the first labelled


def test_sequence_batches(tokenizer):
    data = TextDataset(name="toy", texts=("good film", "a bad , bad film indeed"), labels=(1, 0),
                       label_names=("neg", "pos"))
    dataset = TokenizedDataset(data, tokenizer, max_length=8)
    batch = next(iter(DataLoader(dataset, batch_size=2, collate_fn=make_collate(dataset))))
    assert batch.input_ids.shape == batch.position_ids.shape == batch.token_type_ids.shape == (2, 8)
    assert batch.attention_mask[0].tolist() == [1, 1, 1, 1, 0, 0, 0, 0]
    assert batch.input_ids[0, 4:].eq(tokenizer.pad_token_id).all()
    assert batch.labels.tolist() == [1, 0]
    assert set(batch.model_inputs()) == {"input_ids", "attention_mask", "position_ids", "token_type_ids"}


def test_token_batches_pad_labels_with_ignore_index(tokenizer):
    data = TextDataset(name="toy", texts=("hi", "hello there Bob"), labels=((0,), (0, 0, 1)),
                       label_names=("O", "B-person"), words=(("hi",), ("hello", "there", "Bob")), task="token")
    dataset = TokenizedDataset(data, tokenizer, max_length=16)
    batch = make_collate(dataset)([dataset[0], dataset[1]])
    assert batch.labels.shape == batch.input_ids.shape
    assert batch.labels[0].tolist() == [IGNORE_INDEX, 0] + [IGNORE_INDEX] * (batch.labels.shape[1] - 2)
    assert torch.equal(batch.labels[1][batch.labels[1] != IGNORE_INDEX], torch.tensor([0, 0, 1]))
