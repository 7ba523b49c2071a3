"""ATC's corruptions: MLM selects ~15% of real tokens (80/10/10), denoising permutes sentences and
infills whole-word spans covering 30% of the words; both reproducible per seed."""
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nlp_models.backbone import load_tokenizer
from nlp_models.pretraining import CorruptionConfig, Corruptor

TEXTS = ["The quick brown fox jumps over the lazy dog. It was unbelievably fast! Nobody saw it coming.",
         "Markets rallied on Tuesday. Shares in the bank rose sharply after the announcement.",
         "Short one.", "A question? An answer. Another statement follows here, with commas and numbers 2024."]


@pytest.fixture(scope="module")
def corruptor():
    return Corruptor(load_tokenizer())


@pytest.fixture(scope="module")
def batch(corruptor):
    return corruptor.tokenizer(TEXTS * 8, padding="max_length", max_length=40, truncation=True, return_tensors="pt")


def test_mlm_selects_real_tokens_only_and_keeps_the_rest(corruptor, batch):
    out = corruptor("mlm", batch["input_ids"], batch["attention_mask"], seed=3)
    selected = out.labels != -100
    ids = batch["input_ids"]
    special = torch.as_tensor(corruptor.special[ids.numpy()])
    assert not (selected & special).any()                           # [CLS]/[SEP]/[PAD] never selected
    assert torch.equal(out.labels[selected], ids[selected])
    assert torch.equal(out.input_ids[~selected], ids[~selected])
    share = selected.sum().item() / (~special).sum().item()
    assert 0.08 < share < 0.25
    masked = (out.input_ids == corruptor.mask) & selected
    assert masked.sum() > 0.6 * selected.sum()                      # 80% become [MASK]
    again = corruptor("mlm", batch["input_ids"], batch["attention_mask"], seed=3)
    assert torch.equal(again.input_ids, out.input_ids)


def test_denoise_targets_are_the_original_and_inputs_infill(corruptor, batch):
    out = corruptor("denoise", batch["input_ids"], batch["attention_mask"], seed=5)
    ids, attention = batch["input_ids"], batch["attention_mask"]
    assert torch.equal(out.labels[attention == 1], ids[attention == 1]) and (out.labels[attention == 0] == -100).all()
    for i in range(ids.shape[0]):
        original = ids[i][attention[i] == 1].tolist()
        corrupted = out.input_ids[i][out.attention_mask[i] == 1].tolist()
        assert corrupted[0] == original[0] and corrupted[-1] == original[-1]   # [CLS] ... [SEP] kept
        kept = Counter(t for t in corrupted if t != corruptor.mask)
        assert not kept - Counter(original)                          # nothing invented
        assert corrupted.count(corruptor.mask) >= 1 and len(corrupted) <= len(original)
    assert torch.equal(corruptor("denoise", ids, attention, seed=5).input_ids, out.input_ids)
    assert not torch.equal(corruptor("denoise", ids, attention, seed=6).input_ids, out.input_ids)


def test_sentences_are_permuted_whole(corruptor):
    tok = corruptor.tokenizer
    text = " ".join(f"sentence number {w} ends here." for w in ("one", "two", "three", "four", "five", "six"))
    ids = tok([text], return_tensors="pt")
    plain = Corruptor(tok, CorruptionConfig(mask_ratio=1e-9))       # one masked word: the order shows
    orders = set()
    for seed in range(6):
        out = plain("denoise", ids["input_ids"], ids["attention_mask"], seed=seed)
        words = tok.decode(out.input_ids[0], skip_special_tokens=False).split()
        orders.add(tuple(w for w in words if w in ("one", "two", "three", "four", "five", "six")))
    assert len(orders) > 1                                          # the order changes with the seed


@settings(max_examples=50, deadline=None)
@given(count=st.integers(1, 200), seed=st.integers(0, 2**31), ratio=st.floats(0.05, 0.9))
def test_span_masking_covers_exactly_the_ratio(corruptor, count, seed, ratio):
    c = Corruptor.__new__(Corruptor)
    c.config = CorruptionConfig(mask_ratio=ratio)
    masked = c._masked_words(count, np.random.default_rng(seed))
    assert masked.sum() == int(np.ceil(ratio * count))


def test_words_group_wordpieces(corruptor):
    ids = corruptor.tokenizer("unbelievably fast", add_special_tokens=False)["input_ids"]
    words = corruptor._words(np.array(ids))
    assert len(words) == 2 and words[0].stop - words[0].start > 1   # 'un ##bel ##ie ##va ##bly' is one word


def test_bad_objective_and_config():
    with pytest.raises(ValueError, match="mask_ratio < 1"):
        CorruptionConfig(mask_ratio=0)
    with pytest.raises(ValueError, match="poisson_lambda > 0"):
        CorruptionConfig(poisson_lambda=0)
    corruptor = Corruptor(load_tokenizer())
    with pytest.raises(ValueError, match="objective"):
        corruptor("clm", torch.zeros((1, 4), dtype=torch.long), torch.ones((1, 4), dtype=torch.long), seed=0)
