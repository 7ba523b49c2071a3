"""SQuAD v1.1 exact match and token F1: hand-checked cases, and agreement with the official script."""
import re
import string
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nlp_models.squad_metrics import (exact_match_score, f1_score, metric_max_over_ground_truths, normalize_answer,
                                      squad_scores)


# The official SQuAD v1.1 evaluation functions, verbatim but for formatting (the reference).
def official_normalize(s):
    def remove_articles(text):
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    return white_space_fix(remove_articles(remove_punc(s.lower())))


def official_f1(prediction, ground_truth):
    prediction_tokens = official_normalize(prediction).split()
    ground_truth_tokens = official_normalize(ground_truth).split()
    common = Counter(prediction_tokens) & Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(prediction_tokens)
    recall = 1.0 * num_same / len(ground_truth_tokens)
    return (2 * precision * recall) / (precision + recall)


def official_em(prediction, ground_truth):
    return official_normalize(prediction) == official_normalize(ground_truth)


@pytest.mark.parametrize("text, expected", [
    ("The  Eiffel\tTower!", "eiffel tower"),
    ("an apple, a pear and THE plum.", "apple pear and plum"),
    ("theatre anthem", "theatre anthem"),          # articles only as whole words
    ("$1.13bn (76%)", "113bn 76"),
    ("U.S.-based", "usbased"),
    ("", ""),
])
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_hand_checked_scores():
    assert exact_match_score("the Eiffel Tower.", "Eiffel Tower") == 1.0
    assert f1_score("the Eiffel Tower.", "Eiffel Tower") == 1.0
    # partial overlap: precision 2/3, recall 1 -> F1 = 0.8
    assert exact_match_score("Tony Blair said", "Tony Blair") == 0.0
    assert f1_score("Tony Blair said", "Tony Blair") == pytest.approx(0.8)
    # no overlap
    assert f1_score("Gordon Brown", "Tony Blair") == 0.0
    # multiset overlap: common {cat, dog} -> precision = recall = 2/3
    assert f1_score("cat cat dog", "cat dog dog") == pytest.approx(2 / 3)
    # the official quirk: both normalise to '' -> EM 1 but F1 0
    assert exact_match_score("the", "a.") == 1.0 and f1_score("the", "a.") == 0.0


def test_max_over_several_gold_answers():
    golds = ["Tony Blair", "Mr Blair", "the prime minister"]
    assert metric_max_over_ground_truths(exact_match_score, "Mr. Blair", golds) == 1.0
    assert metric_max_over_ground_truths(f1_score, "prime minister Blair", golds) == pytest.approx(0.8)
    with pytest.raises(ValueError, match="non-empty"):
        metric_max_over_ground_truths(f1_score, "x", [])
    with pytest.raises(ValueError, match="non-empty"):
        metric_max_over_ground_truths(f1_score, "x", "x")


def test_squad_scores_averages_on_the_unit_scale():
    out = squad_scores(["Tony Blair", "Tony Blair said", "nothing"], [["Tony Blair"], ["Tony Blair"], ["Brown"]])
    assert out == pytest.approx({"exact_match": 1 / 3, "f1": (1 + 0.8 + 0) / 3, "n": 3.0})
    with pytest.raises(ValueError, match="2 predictions for 1"):
        squad_scores(["a", "b"], [["a"]])


answers = st.lists(st.sampled_from(["the", "a", "An", "Blair", "blair", "Tony", "76%", "$1bn", ",", ".", "-", "cat",
                                    "theatre", "Mr"]), max_size=6).map(" ".join)


@given(answers, answers)
def test_properties_and_agreement_with_the_official_script(prediction, gold):
    f1, em = f1_score(prediction, gold), exact_match_score(prediction, gold)
    assert f1 == pytest.approx(official_f1(prediction, gold))
    assert em == float(official_em(prediction, gold))
    assert 0.0 <= f1 <= 1.0
    assert f1 == pytest.approx(f1_score(gold, prediction)) and em == exact_match_score(gold, prediction)
    if em and normalize_answer(gold):
        assert f1 == pytest.approx(1.0)
    if f1 == pytest.approx(1.0):
        assert sorted(normalize_answer(prediction).split()) == sorted(normalize_answer(gold).split())
