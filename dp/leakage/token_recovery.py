"""Token-set recovery from an update of an embedding matrix (research/dp_leakage.md Sec. 4.2).

A row of the input-embedding gradient is non-zero only for tokens present in the batch (Melis et
al., S&P 2019), so the rows of an embedding update (V x D) that stand out reveal which tokens a
client used. On an individual update (the plaintext server) this is the client's token set; on a
secure sum (or mean) it is the union over the contributors.

Detectors, all on the row norms r_v = ||Delta E_v||:
  * 'support':   {v : max_j |Delta E_vj| > atol}. Exact for untied embeddings and plain SGD; fails
                 when every row moves (weight decay, tied output embeddings, DP noise).
  * 'two_sided': robust z-score of log r_v against the bulk of rows (median, MAD):
                 {v : |log r_v - median| > z * 1.4826 * MAD}. Two-sided because with tied weights
                 and Adam the used rows are anomalously *small* (every row gets a softmax gradient,
                 Adam normalises magnitudes, and input and output gradients partly cancel).
  * 'top_k' / 'bottom_k' / 'extreme_k': the k rows with the largest norms / smallest norms / largest
                 |log r_v - median|; with k = the true set size, as in the research note. These
                 are oracle-k attacks: an upper bound on what a threshold attacker achieves.
Simplified relative to breaching's `embedding-norm` (mean + k std of log norms): median and MAD
instead of mean and std, because the used rows are a large minority of V in small vocabularies
and would inflate a non-robust scale.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

METHODS = ("support", "two_sided", "top_k", "bottom_k", "extreme_k")


@dataclass(frozen=True)
class TokenScores:
    """Bag-of-tokens precision, recall and F1 of a recovered set against the true set."""

    precision: float
    recall: float
    f1: float
    n_recovered: int
    n_true: int
    chance_f1: float | None = None
    """Expected F1 of guessing n_recovered tokens uniformly from the vocabulary (None if V unknown)."""


def embedding_rows(update: Any, *, shape: tuple[int, int]) -> np.ndarray:
    """The update as a (V, D) float64 matrix; `update` is the flattened vector (or the matrix)."""
    v, d = (int(shape[0]), int(shape[1]))
    if v < 1 or d < 1:
        raise ValueError(f"invalid embedding shape {shape}")
    a = np.asarray(update, dtype=np.float64)
    if a.size != v * d:
        raise ValueError(f"update of {a.size} values does not match shape {shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError("update contains NaN or infinity")
    return a.reshape(v, d)


def row_norms(update: Any, *, shape: tuple[int, int]) -> np.ndarray:
    return np.linalg.norm(embedding_rows(update, shape=shape), axis=1)


def log_norm_deviation(norms: np.ndarray) -> np.ndarray:
    """Signed robust z-score of log row norms against the bulk of rows (median and MAD).

    Zero rows are floored at 1e-12 x the largest norm so they stay finite and, when they are the
    bulk (untied SGD), every non-zero row stands out.
    """
    top = float(norms.max()) if norms.size else 0.0
    if top == 0.0:
        return np.zeros_like(norms)
    logs = np.log(np.maximum(norms, top * 1e-12))
    med = float(np.median(logs))
    scale = 1.4826 * float(np.median(np.abs(logs - med)))
    scale = max(scale, 1e-9)  # all-equal bulk: any departure counts
    return (logs - med) / scale


def recover_tokens(update: Any, *, shape: tuple[int, int], method: str = "two_sided", k: int | None = None,
                   z: float = 3.5, atol: float = 0.0) -> frozenset[int]:
    """The token ids an embedding update reveals (see the module docstring for the methods)."""
    if method not in METHODS:
        raise ValueError(f"unknown method '{method}'; choose one of {METHODS}")
    rows = embedding_rows(update, shape=shape)
    if method == "support":
        return frozenset(int(i) for i in np.flatnonzero(np.abs(rows).max(axis=1) > atol))
    norms = np.linalg.norm(rows, axis=1)
    if method == "two_sided":
        if not z > 0:
            raise ValueError("z must be positive")
        return frozenset(int(i) for i in np.flatnonzero(np.abs(log_norm_deviation(norms)) > z))
    if k is None or not 0 <= k <= norms.shape[0]:
        raise ValueError(f"method '{method}' needs 0 <= k <= V, got k={k}")
    if k == 0:
        return frozenset()
    if method == "top_k":
        score = norms
    elif method == "bottom_k":
        score = -norms
    else:
        score = np.abs(log_norm_deviation(norms))
    picked = np.argpartition(-score, k - 1)[:k]
    return frozenset(int(i) for i in picked)


def score_tokens(recovered: Iterable[int], true: Iterable[int], *, vocab_size: int | None = None) -> TokenScores:
    """Precision, recall and F1 (empty-vs-empty counts as perfect) and, given V, the chance F1."""
    rec, tru = set(map(int, recovered)), set(map(int, true))
    hit = len(rec & tru)
    precision = hit / len(rec) if rec else float(not tru)
    recall = hit / len(tru) if tru else float(not rec)
    f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    chance = chance_f1(n_true=len(tru), n_guessed=len(rec), vocab_size=vocab_size) if vocab_size else None
    return TokenScores(precision, recall, f1, len(rec), len(tru), chance)


def chance_f1(*, n_true: int, n_guessed: int, vocab_size: int) -> float:
    """F1 of the expected hits when guessing n_guessed of V tokens at random: 2 s g / (V (s + g))."""
    if vocab_size < 1 or n_true + n_guessed == 0:
        return 0.0
    hits = n_true * n_guessed / vocab_size
    return 2 * hits / (n_true + n_guessed)


def mean_scores(scores: Iterable[TokenScores]) -> TokenScores:
    """Macro average (for many individual updates or many rounds)."""
    s = list(scores)
    if not s:
        raise ValueError("no scores to average")
    chances = [x.chance_f1 for x in s if x.chance_f1 is not None]
    return TokenScores(float(np.mean([x.precision for x in s])), float(np.mean([x.recall for x in s])),
                       float(np.mean([x.f1 for x in s])), round(float(np.mean([x.n_recovered for x in s]))),
                       round(float(np.mean([x.n_true for x in s]))),
                       float(np.mean(chances)) if len(chances) == len(s) else None)


def recover_from_transcript(transcript: Any, *, part: str, shape: tuple[int, int], method: str = "two_sided",
                            k: int | Mapping[int, int] | None = None, z: float = 3.5, atol: float = 0.0,
                            ) -> tuple[dict[int, frozenset[int]], dict[int, dict[int, frozenset[int]]]]:
    """Run the detector on everything the server received for `part`.

    Returns (per-round sets recovered from aggregates, per-round per-client sets recovered from
    individual plaintext uploads). `k` may be a mapping round -> k for the oracle-k methods. The
    recorded vector must cover whole rows: its offset and length must be multiples of D.
    """
    v, d = shape
    sums: dict[int, frozenset[int]] = {}
    individual: dict[int, dict[int, frozenset[int]]] = {}

    def run(vec: np.ndarray, offset: int, t: int) -> frozenset[int]:
        if offset % d or vec.size % d or offset + vec.size > v * d:
            raise ValueError(f"recorded range of '{part}' does not cover whole embedding rows")
        kk = k.get(t) if isinstance(k, Mapping) else k
        got = recover_tokens(vec, shape=(vec.size // d, d), method=method, k=kk, z=z, atol=atol)
        return frozenset(i + offset // d for i in got)

    for t in transcript.rounds:
        rec = transcript.aggregate(t, part)
        if rec is not None:
            sums[t] = run(rec.mean, rec.offset, t)
        ind = transcript.individuals(t, part)
        if ind:
            off = transcript.individual_offset(t, part)
            individual[t] = {c: run(vec, off, t) for c, vec in ind.items()}
    return sums, individual


def gaussian_sum(updates: Iterable[np.ndarray], *, clip: float, noise_multiplier: float,
                 rng: np.random.Generator) -> np.ndarray:
    """Sum of L2-clipped updates plus N(0, (z C)^2 I): the central-DP view, for leakage experiments.

    Evaluation helper only: `rng` is numpy's generator, so this noise gives no privacy; real DP
    noise is added by the mechanisms in `dp`.
    """
    if not clip > 0 or noise_multiplier < 0:
        raise ValueError("clip must be positive and noise_multiplier non-negative")
    total = None
    for u in updates:
        u = np.asarray(u, dtype=np.float64).ravel()
        norm = float(np.linalg.norm(u))
        u = u * min(1.0, clip / norm) if norm > 0 else u
        total = u.copy() if total is None else total + u
    if total is None:
        raise ValueError("no updates")
    return total + rng.normal(0.0, noise_multiplier * clip, size=total.shape)


__all__ = ["METHODS", "TokenScores", "embedding_rows", "row_norms", "log_norm_deviation", "recover_tokens",
           "score_tokens", "chance_f1", "mean_scores", "recover_from_transcript", "gaussian_sum"]
