"""A token-recovery attacker that calibrates itself on shadow views instead of on the ground truth.

The oracle in `dp.leakage.pipeline` reports the best of several detectors chosen with the target's
true token set, and tells `top_k` the true number of tokens: an upper bound, not an attack. A real
adversary picks its detector and parameter beforehand, on SHADOW views: updates (or cohort means,
or differencing estimates) it simulated itself from public data with the same training and the
same noise mechanism, so it knows their token sets. `calibrate_token_attack` does exactly that:
it maximises the mean advantage over chance (or mean F1) over the shadow views, and the resulting
`TokenAttack` is then applied unchanged to the real views.

Grid searched (the detectors of `dp.leakage.token_recovery`; candidates tried in this order, ties
go to the earlier one, so the scale-free detectors win ties against the absolute threshold):
  * 'two_sided': z in `Z_GRID` (robust z-score of log row norms, both tails).
  * 'top_k', 'extreme_k', 'bottom_k': EVERY k in 1..V. k is one number fitted on the shadow views
    (a fixed fraction k / V of the vocabulary), never the target's true count. One sort per view
    gives the score of every k at once, so the full range costs no more than a grid.
  * 'support': atol in {0} and the pooled shadow quantiles of the row max |Delta E_vj| at
    `SUPPORT_QUANTILES`. This is an absolute threshold: it transfers only if the shadow views have
    the real views' scale (same training, same clipping).
Simplifications: one detector and one parameter for all targets (no per-view adaptive k beyond
what 'two_sided' does); the shadow views are assumed to come from the real views' distribution.

Views are given as the flattened update (V*D values), the (V, D) matrix, or its `RowStats` (row
norms and row max |value|, all the detectors read), so that callers holding many large views
(differencing estimates) need not materialise them.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dp.leakage.stats import advantage_over_chance
from dp.leakage.token_recovery import (METHODS, TokenScores, embedding_rows, log_norm_deviation, recover_tokens,
                                       score_tokens)

Z_GRID = (1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0, 12.0)
"""Two-sided z thresholds tried."""
SUPPORT_QUANTILES = (0.5, 0.75, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999)
"""Quantiles of the pooled shadow row max |value| tried as support thresholds (besides 0)."""
K_METHODS = ("top_k", "extreme_k", "bottom_k")
ORDER = ("two_sided", *K_METHODS, "support")
OBJECTIVES = ("advantage", "f1")


@dataclass(frozen=True, kw_only=True)
class RowStats:
    """What the detectors read of a V x D view: per-row L2 norm and per-row max |value|."""

    norms: np.ndarray
    rowmax: np.ndarray

    def __post_init__(self) -> None:
        n, m = np.asarray(self.norms, dtype=np.float64), np.asarray(self.rowmax, dtype=np.float64)
        if n.ndim != 1 or n.shape != m.shape or n.size == 0:
            raise ValueError("norms and rowmax must be non-empty 1-D arrays of the same length")
        if not (np.all(np.isfinite(n)) and np.all(np.isfinite(m))) or n.min() < 0 or m.min() < 0:
            raise ValueError("row statistics must be finite and non-negative")
        object.__setattr__(self, "norms", n)
        object.__setattr__(self, "rowmax", m)

    @property
    def vocab_size(self) -> int:
        return int(self.norms.size)

    @property
    def constant(self) -> bool:
        """Every row alike: no row can stand out, whatever the detector."""
        return bool(np.ptp(self.norms) == 0.0 and np.ptp(self.rowmax) == 0.0)


def row_stats(view: Any, *, shape: tuple[int, int]) -> RowStats:
    """`RowStats` of a view (flattened V*D vector, (V, D) matrix, or already a RowStats)."""
    if isinstance(view, RowStats):
        if view.vocab_size != int(shape[0]):
            raise ValueError(f"row statistics of {view.vocab_size} rows do not match shape {shape}")
        return view
    rows = embedding_rows(view, shape=shape)
    return RowStats(norms=np.linalg.norm(rows, axis=1), rowmax=np.abs(rows).max(axis=1))


def detect(stats: RowStats, *, method: str, parameter: float) -> frozenset[int]:
    """`recover_tokens` on row statistics (same rules, same tie handling)."""
    if method == "support":
        return frozenset(int(i) for i in np.flatnonzero(stats.rowmax > parameter))
    if method == "two_sided":
        return frozenset(int(i) for i in np.flatnonzero(np.abs(log_norm_deviation(stats.norms)) > parameter))
    if method not in K_METHODS:
        raise ValueError(f"unknown method '{method}'; choose one of {METHODS}")
    k = int(parameter)
    if not 0 <= k <= stats.vocab_size:
        raise ValueError(f"k={k} outside 0..V")
    if k == 0:
        return frozenset()
    score = _k_score(stats, method)
    return frozenset(int(i) for i in np.argpartition(-score, k - 1)[:k])


def _k_score(stats: RowStats, method: str) -> np.ndarray:
    if method == "top_k":
        return stats.norms
    if method == "bottom_k":
        return -stats.norms
    return np.abs(log_norm_deviation(stats.norms))


@dataclass(frozen=True, kw_only=True)
class TokenAttack:
    """A calibrated token-recovery attack: one detector and one parameter, fixed before the target.

    `parameter` is atol ('support'), z ('two_sided') or k (the '*_k' methods). `shadow_score` is the
    mean objective the attack reached on its shadow views (re-evaluated with `recover`).
    """

    method: str
    parameter: float
    shadow_score: float
    shape: tuple[int, int]
    objective: str = "advantage"
    shadow_f1: float = float("nan")
    n_shadow: int = 0
    grid_size: int = field(default=0, compare=False)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"unknown method '{self.method}'; choose one of {METHODS}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}")
        v, d = int(self.shape[0]), int(self.shape[1])
        if v < 1 or d < 1:
            raise ValueError(f"invalid embedding shape {self.shape}")
        object.__setattr__(self, "shape", (v, d))
        p = float(self.parameter)
        if not (np.isfinite(p) and p >= 0):
            raise ValueError("parameter must be finite and non-negative")
        if self.method in K_METHODS and (p != int(p) or not 1 <= p <= v):
            raise ValueError(f"k must be an integer in 1..V, got {self.parameter}")
        if self.method == "two_sided" and p == 0:
            raise ValueError("z must be positive")
        object.__setattr__(self, "parameter", p)

    @property
    def k(self) -> int | None:
        return int(self.parameter) if self.method in K_METHODS else None

    def recover(self, view: Any) -> frozenset[int]:
        """The token ids the attack names on one view (vector, matrix or `RowStats`)."""
        if isinstance(view, RowStats):
            return detect(row_stats(view, shape=self.shape), method=self.method, parameter=self.parameter)
        kw: dict[str, Any] = {"support": {"atol": self.parameter}, "two_sided": {"z": self.parameter}}.get(
            self.method, {"k": self.k})
        return recover_tokens(view, shape=self.shape, method=self.method, **kw)

    def score(self, view: Any, truth: Iterable[int]) -> TokenScores:
        """Precision, recall, F1 and chance F1 of `recover(view)` against `truth`."""
        return score_tokens(self.recover(view), truth, vocab_size=self.shape[0])

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "parameter": self.parameter, "k": self.k, "objective": self.objective,
                "shadow_score": self.shadow_score, "shadow_f1": self.shadow_f1, "n_shadow": self.n_shadow,
                "grid_size": self.grid_size}


def _objective(hits: np.ndarray, guessed: np.ndarray, n_true: int, v: int) -> tuple[np.ndarray, np.ndarray]:
    """(F1, advantage over chance) for arrays of hit and guess counts, as score_tokens would give."""
    hits = np.asarray(hits, dtype=np.float64)
    g = np.asarray(guessed, dtype=np.float64)
    denom = g + n_true
    with np.errstate(divide="ignore", invalid="ignore"):
        f1 = np.where(denom > 0, 2.0 * hits / np.where(denom > 0, denom, 1.0), 1.0)
        chance = np.where(denom > 0, 2.0 * n_true * g / (v * np.where(denom > 0, denom, 1.0)), 0.0)
        adv = np.where(chance < 1.0, (f1 - chance) / np.where(chance < 1.0, 1.0 - chance, 1.0), 0.0)
    return f1, adv


def _truth_mask(truth: Iterable[int], v: int) -> np.ndarray:
    ids = np.fromiter((int(x) for x in truth), dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= v):
        raise ValueError(f"token ids must lie in 0..{v - 1}")
    mask = np.zeros(v, dtype=bool)
    mask[ids] = True
    return mask


def calibrate_token_attack(shadow: Sequence[tuple[Any, Iterable[int]]], *, shape: tuple[int, int],
                           objective: str = "advantage") -> TokenAttack:
    """Pick the detector and parameter that maximise the mean `objective` over shadow views.

    `shadow` holds (view, true token set) pairs the attacker simulated itself (public data, same
    training and noise mechanism as the real views). `objective` is 'advantage' (mean advantage
    over chance per view; naming every token scores 0) or 'f1'. See the module docstring for the
    grid. Raises ValueError for an empty shadow set, views of the wrong shape, shadow views that
    are all constant (no row can stand out: nothing to calibrate on), or token sets that are all
    empty or all the whole vocabulary (chance is then perfect or undefined).
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}")
    v, d = int(shape[0]), int(shape[1])
    if v < 1 or d < 1:
        raise ValueError(f"invalid embedding shape {shape}")
    pairs = list(shadow)
    if not pairs:
        raise ValueError("calibration needs at least one shadow view (got none)")
    stats: list[RowStats] = []
    truths: list[np.ndarray] = []
    for i, pair in enumerate(pairs):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise ValueError(f"shadow view {i} must be a (view, token set) pair")
        stats.append(row_stats(pair[0], shape=(v, d)))
        truths.append(_truth_mask(pair[1], v))
    if all(s.constant for s in stats):
        raise ValueError("every shadow view is constant (all rows alike, e.g. all-zero updates): "
                         "no row stands out, so there is nothing to calibrate on")
    sizes = [int(t.sum()) for t in truths]
    if all(s == 0 for s in sizes) or all(s == v for s in sizes):
        raise ValueError("every shadow token set is empty or the whole vocabulary: chance is perfect or "
                         "undefined, so no detector can be preferred")

    pick = 1 if objective == "advantage" else 0
    n = len(stats)
    candidates: list[tuple[float, int, float, str]] = []  # (total score, -order, -parameter, method)

    def add(method: str, params: Sequence[float], totals: np.ndarray) -> None:
        for p, tot in zip(params, totals):
            candidates.append((float(tot), -ORDER.index(method), -float(p), method))

    # two_sided: fixed z grid.
    acc = np.zeros(len(Z_GRID))
    for s, t, size in zip(stats, truths, sizes):
        masks = np.abs(log_norm_deviation(s.norms))[None, :] > np.asarray(Z_GRID)[:, None]
        acc += _objective((masks & t).sum(axis=1), masks.sum(axis=1), size, v)[pick]
    add("two_sided", Z_GRID, acc)
    # *_k: every k in 1..V from one sort per view; only each method's best k (smallest on ties) competes.
    ks = np.arange(1, v + 1)
    for method in K_METHODS:
        acc = np.zeros(v)
        for s, t, size in zip(stats, truths, sizes):
            order = np.argsort(-_k_score(s, method), kind="stable")
            acc += _objective(np.cumsum(t[order]), ks, size, v)[pick]
        j = int(np.argmax(acc))
        add(method, [float(ks[j])], acc[j: j + 1])
    # support: atol = 0 and pooled quantiles of the row max.
    pooled = np.concatenate([s.rowmax for s in stats])
    atols = sorted({0.0, *(float(q) for q in np.quantile(pooled, SUPPORT_QUANTILES))})
    acc = np.zeros(len(atols))
    for s, t, size in zip(stats, truths, sizes):
        masks = s.rowmax[None, :] > np.asarray(atols)[:, None]
        acc += _objective((masks & t).sum(axis=1), masks.sum(axis=1), size, v)[pick]
    add("support", atols, acc)

    grid = len(Z_GRID) + len(K_METHODS) * v + len(atols)
    _, _, neg_param, method = max(candidates)
    parameter = -neg_param
    attack = TokenAttack(method=method, parameter=parameter, shadow_score=0.0, shape=(v, d), objective=objective)
    scores = [attack.score(s, np.flatnonzero(t)) for s, t in zip(stats, truths)]
    f1s = [sc.f1 for sc in scores]
    advs = [advantage_over_chance(sc.f1, sc.chance_f1) for sc in scores]
    return TokenAttack(method=method, parameter=parameter, shadow_score=float(np.mean(advs if pick else f1s)),
                       shape=(v, d), objective=objective, shadow_f1=float(np.mean(f1s)), n_shadow=n, grid_size=grid)


__all__ = ["Z_GRID", "SUPPORT_QUANTILES", "RowStats", "row_stats", "detect", "TokenAttack", "calibrate_token_attack"]
