"""Exact match and token F1 exactly as the official SQuAD v1.1 evaluation script defines them.

    normalize_answer(s) = white_space_fix(remove_articles(remove_punc(lower(s))))

with punctuation = `string.punctuation`, articles = the whole words a / an / the, and whitespace
collapsed to single spaces. Token F1 is the harmonic mean of precision and recall over the multiset
of normalised whitespace tokens (0 when no token is shared); each prediction is scored against the
best of its gold answers (`metric_max_over_ground_truths`).

Scores here are on the 0..1 scale (the official script multiplies the means by 100).

A quirk of the official definitions, kept: when prediction and gold both normalise to the empty
string (e.g. "the" vs "a."), exact match is 1 but F1 is 0 (no shared token).
"""
from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Sequence

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation, drop the articles a/an/the, collapse whitespace (SQuAD v1.1)."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match_score(prediction: str, ground_truth: str) -> float:
    """1.0 if the normalised strings are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(ground_truth))


def f1_score(prediction: str, ground_truth: str) -> float:
    """Token-level F1 of the normalised strings (0.0 when they share no token)."""
    prediction_tokens = normalize_answer(prediction).split()
    truth_tokens = normalize_answer(ground_truth).split()
    common = Counter(prediction_tokens) & Counter(truth_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(prediction_tokens)
    recall = same / len(truth_tokens)
    return 2 * precision * recall / (precision + recall)


def metric_max_over_ground_truths(metric: Callable[[str, str], float], prediction: str,
                                  ground_truths: Sequence[str]) -> float:
    """The best score of `prediction` over its gold answers (at least one)."""
    if isinstance(ground_truths, str) or not ground_truths:
        raise ValueError("ground_truths must be a non-empty sequence of strings")
    return max(metric(prediction, truth) for truth in ground_truths)


def squad_scores(predictions: Sequence[str], ground_truths: Sequence[Sequence[str]]) -> dict[str, float]:
    """Mean exact match and F1 (0..1) of `predictions` against their gold lists, plus the count `n`."""
    if len(predictions) != len(ground_truths):
        raise ValueError(f"{len(predictions)} predictions for {len(ground_truths)} gold lists")
    n = len(predictions)
    em = sum(metric_max_over_ground_truths(exact_match_score, p, g) for p, g in zip(predictions, ground_truths))
    f1 = sum(metric_max_over_ground_truths(f1_score, p, g) for p, g in zip(predictions, ground_truths))
    return {"exact_match": em / max(n, 1), "f1": f1 / max(n, 1), "n": float(n)}


__all__ = ["normalize_answer", "exact_match_score", "f1_score", "metric_max_over_ground_truths", "squad_scores"]
