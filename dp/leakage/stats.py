"""Small statistics for leakage numbers: advantage over chance, and confidence intervals over seeds.

`advantage_over_chance` makes attacks on different views comparable (their chance levels differ);
`mean_ci` summarises one number measured over several independent runs (seeds).
"""
from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
from scipy import stats as _stats

_TOL = 1e-9  # slack for rounding when validating numbers that must lie in [0, 1]


def advantage_over_chance(f1: float, chance: float | None) -> float:
    """(F1 - chance) / (1 - chance): 0 = guessing as many tokens at random, 1 = exact recovery.

    Negative when the attack does worse than guessing. `chance` None counts as 0 (V unknown);
    chance = 1 (every guess is right) leaves nothing to gain, so the advantage is 0.
    """
    f = float(f1)
    c = 0.0 if chance is None else float(chance)
    for name, v in (("f1", f), ("chance", c)):
        if not (math.isfinite(v) and -_TOL <= v <= 1.0 + _TOL):
            raise ValueError(f"{name} must be in [0, 1], got {v}")
    return (f - c) / (1.0 - c) if c < 1.0 else 0.0


token_advantage = advantage_over_chance
"""Old name (dp.leakage.pipeline.token_advantage), kept for existing callers."""


def mean_ci(values: Iterable[float], *, level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the two-sided Student-t confidence interval of the mean at `level`.

    Meant for one number measured over n independent seeds: mean +- t_{(1+level)/2, n-1} s / sqrt(n)
    with s the sample standard deviation (ddof = 1). Rule for n = 1: the interval is undefined and
    returned as (v, nan, nan), never as a zero-width interval. Identical values give a zero-width
    interval. Empty input and NaN/inf raise ValueError.
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    a = np.asarray(list(values), dtype=np.float64).ravel()
    if a.size == 0:
        raise ValueError("mean_ci needs at least one value")
    if not np.all(np.isfinite(a)):
        raise ValueError("values contain NaN or infinity")
    m = float(np.mean(a))
    if a.size == 1:
        return m, math.nan, math.nan
    sem = float(np.std(a, ddof=1)) / math.sqrt(a.size)
    half = float(_stats.t.ppf(0.5 + level / 2.0, df=a.size - 1)) * sem
    return m, m - half, m + half


__all__ = ["advantage_over_chance", "token_advantage", "mean_ci"]
