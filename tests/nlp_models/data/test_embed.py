"""Sentence embeddings with a frozen backbone: order, determinism, on-disk cache."""
import numpy as np
import torch

from nlp_models.backbone import tiny_bert
from nlp_models.data.embed import embed_texts
from nlp_models.data.tokenize import tokenize
from nlp_models.heads import mean_pool

TEXTS = ["a", "a somewhat longer text here", "mid length text", "b"]


def test_rows_follow_input_order_and_match_single_text_embeddings(tokenizer):
    model = tiny_bert(seed=0)
    batched = embed_texts(TEXTS, model=model, tokenizer=tokenizer, batch_size=3, progress=False)
    assert batched.shape == (4, 32) and batched.dtype == np.float32
    for row, text in enumerate(TEXTS):
        inputs = tokenize([text], tokenizer, 128)
        with torch.inference_mode():
            alone = mean_pool(model(**inputs).last_hidden_state, inputs["attention_mask"])
        np.testing.assert_allclose(batched[row], alone[0].numpy(), atol=1e-5)
    assert model.training  # restored after embedding


def test_cache_round_trip(tokenizer, tmp_path):
    model = tiny_bert(seed=0)
    first = embed_texts(TEXTS, model=model, tokenizer=tokenizer, progress=False, cache_dir=tmp_path, model_id="t0")
    assert len(list(tmp_path.glob("*.npy"))) == 1
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
    cached = embed_texts(TEXTS, model=model, tokenizer=tokenizer, progress=False, cache_dir=tmp_path, model_id="t0")
    np.testing.assert_array_equal(first, cached)
    fresh = embed_texts(TEXTS, model=model, tokenizer=tokenizer, progress=False, cache_dir=tmp_path, model_id="t1")
    assert not np.array_equal(first, fresh)
