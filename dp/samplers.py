"""Noise samplers driven by an AES-256-CTR stream keyed from the OS CSPRNG (vectorised numpy).

Randomness: every uniform comes from AES-CTR under a fresh `os.urandom(32)` key (as in
`secagg.encoding`: both use `secagg.prg.CryptoRandom`), never from numpy's generators. What is *not* guaranteed: the samplers compute
acceptance tests and inverse CDFs in float64, so the output distributions are exact only up to
floating-point rounding (TF Privacy's and numpy's samplers share this). Integer-valued outputs
(Poisson, Skellam, discrete Gaussian) are immune to the Mironov-style attack on the low bits of
floating-point noise; the float Gaussian of `gaussian` is not. Research-grade, like Opacus
without `secure_mode`; a formally exact sampler (Canonne-Kamath-Steinke with rational Bernoulli
trials) would be a drop-in replacement.

Samplers:
* `poisson`: inversion of a cached CDF table over lam +- (10 sqrt(lam) + 40) while it has at most
  TABLE_MAX entries, lam up to about 2.7e9 (each tail left out has mass below 1e-21), Hormann's PTRS
  transformed rejection (the algorithm numpy uses) for larger means, vectorised by resampling only the
  rejected positions.
* `skellam`: variance 2 lam; inversion of its own cached CDF table (modified Bessel pmf) up to
  lam = SKELLAM_TABLE_MAX, Poisson(lam) - Poisson(lam) above.
* `discrete_gaussian`: Canonne, Kamath, Steinke (arXiv 2004.00010, Alg. 3): discrete Laplace
  proposal with t = floor(sigma) + 1, accepted with prob. exp(-(|y| - sigma^2/t)^2 / (2 sigma^2)).
"""
from __future__ import annotations

import math
import threading
from collections import OrderedDict

import numpy as np
from scipy import special

from secagg.prg import TWO_M53, CryptoRandom


TABLE_MAX = 1 << 20
"""Poisson means whose table (lam +- (10 sqrt(lam) + 40)) has at most this many entries (lam up to about
2.7e9) are drawn by inversion of a cached CDF table with a guide table: one uniform per value and about
one step of search, 11-23 ns a value against PTRS's 52-84 ns (and the 125 ns of PTRS before 2026-11-29's
faster uniforms) on 2 CPU cores, lam 0.7 to 4e7. Larger means use PTRS. The limit was 2^17 (lam 4.3e7)
until 2026-11-29: the audit's self-test draws 256 values at a time from lam 5e8 and 2e9, where PTRS costs
about 1 ms a call in numpy overhead (14 s of the self-test) and a kept table 20 us. Rounding: the CDF is a
float64 cumulative sum, so each entry is off by at most about entries x 2^-53 (1.2e-10 at 2^20): the
sampled distribution is within that total variation of Poisson's, far below any delta used here."""
GUIDE_STEPS = 3
"""Steps up from the guide table's start before the few values left are found by binary search."""
BLOCK = 1 << 15
"""Values drawn per pass: the samplers' temporaries then stay in cache (1.2-1.8x faster at 5e5 values)."""


def poisson(lam: float, size: int, rng: CryptoRandom) -> np.ndarray:
    """int64 Poisson(lam) samples (drawn in blocks of BLOCK values; each value by the same algorithm)."""
    if not lam >= 0 or not math.isfinite(lam):
        raise ValueError(f"Poisson mean must be finite and non-negative, got {lam}")
    if lam == 0 or size == 0:
        return np.zeros(size, dtype=np.int64)
    if _by_table(lam):
        table = _poisson_table(lam)
        return _blocked(lambda n: _invert(table, n, rng), size)
    return _blocked(lambda n: _poisson_ptrs(lam, n, rng), size)


def _blocked(draw, size: int) -> np.ndarray:
    """`draw(n)` in blocks of at most BLOCK values."""
    if size <= BLOCK:
        return draw(size)
    out = np.empty(size, dtype=np.int64)
    for start in range(0, size, BLOCK):
        stop = min(size, start + BLOCK)
        out[start:stop] = draw(stop - start)
    return out


def _table_bounds(lam: float) -> tuple[int, int]:
    """[lo, hi]: the values a table covers; each tail beyond them has mass below 1e-21."""
    reach = 10.0 * math.sqrt(lam) + 40.0
    return max(0, math.floor(lam - reach)), math.ceil(lam + reach)


def _table_size(lam: float) -> int:
    lo, hi = _table_bounds(lam)
    return hi - lo + 1


def _by_table(lam: float) -> bool:
    """Inversion whenever lam's table fits TABLE_MAX, PTRS above. A function of lam alone, never of what this
    process drew before: a noise layer redrawn from its key (XNoise's removal, on the server or in another
    process) must be drawn by the same algorithm as the client's, or the two differ and the removal leaves
    the wrong noise. (Until 2026-11-29 a mean asked for the first time went to PTRS and the second time to a
    table: the simulation and the deployment of one seeded DDP run then drew different noise.) Tables are
    kept, so a mean drawn again costs no second build."""
    return _table_size(lam) <= TABLE_MAX


_TABLES: OrderedDict[float | tuple[str, float], tuple[int, np.ndarray, np.ndarray]] = OrderedDict()
"""Kept tables: a Poisson mean's by the mean, a Skellam's by ('skellam', lam)."""
TABLE_ENTRIES_KEPT = 1 << 21
"""Entries of all kept tables together (16 bytes each: 32 MiB), least recently used dropped first. A budget
in entries rather than tables: XNoise draws each client's noise in about 40 layers of different means, and a
limit of 32 tables evicted every one before its next use (an audit then rebuilt a table per draw: 128 s
instead of 28 s, 2026-11-29)."""
_LOCK = threading.Lock()
_KEPT_ENTRIES = 0


def _poisson_table(lam: float) -> tuple[int, np.ndarray, np.ndarray]:
    return _kept_table(lam, lambda: _build_table(lam))


def _kept_table(key, build) -> tuple[int, np.ndarray, np.ndarray]:
    with _LOCK:  # clients of a threaded simulation draw at once
        if key in _TABLES:
            _TABLES.move_to_end(key)
            return _TABLES[key]
    table = build()
    with _LOCK:
        global _KEPT_ENTRIES
        if key not in _TABLES:
            _KEPT_ENTRIES += len(table[1])
        _TABLES[key] = table
        while _KEPT_ENTRIES > TABLE_ENTRIES_KEPT and len(_TABLES) > 1:
            _KEPT_ENTRIES -= len(_TABLES.popitem(last=False)[1][1])
    return table


def _build_table(lam: float) -> tuple[int, np.ndarray, np.ndarray]:
    """(lo, cdf, guide): cdf[i] = P(lo <= K <= lo + i); guide[b] an index at or below the answer for
    any u with floor(u * len(cdf)) = b, computed in floats (the first i with cdf[i] > (b - 1) / len(cdf): one bucket of
    slack, so float rounding of u * len(cdf) can never start the search past the answer). Read-only;
    kept (`_poisson_table`) because the noise of a run draws from a few means again and again."""
    lo, hi = _table_bounds(lam)
    base = math.floor(lam)
    j = np.arange(lo - base, hi - base + 1, dtype=np.float64)
    cdf = np.cumsum(np.exp(_poisson_logpmf(j, base=base, frac=lam - base, lam=lam)))
    return _with_guide(lo, cdf)


def _with_guide(lo: int, cdf: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
    m = len(cdf)
    # one entry more than buckets: u * m may round up to m itself for u just below 1
    guide = np.minimum(np.searchsorted(cdf, (np.arange(m + 1, dtype=np.float64) - 1.0) / m, side="right"), m - 1)
    for a in (cdf, guide):
        a.setflags(write=False)
    return lo, cdf, guide


def _poisson_inversion(lam: float, size: int, rng: CryptoRandom) -> np.ndarray:
    """Poisson(lam) by inversion of its kept table."""
    return _invert(_poisson_table(lam), size, rng)


def _invert(table: tuple[int, np.ndarray, np.ndarray], size: int, rng: CryptoRandom) -> np.ndarray:
    """K = lo + the first i with cdf[i] > u: start at the guide table's index for u's bucket and step
    up (about one step on average)."""
    lo, cdf, guide = table
    last = len(cdf) - 1
    u = rng.uniform(size)
    idx = guide[(u * len(cdf)).astype(np.intp)]
    todo = np.flatnonzero((cdf[idx] <= u) & (idx < last))
    for _ in range(GUIDE_STEPS):
        if not todo.size:
            break
        idx[todo] += 1
        todo = todo[(cdf[idx[todo]] <= u[todo]) & (idx[todo] < last)]
    if todo.size:  # the tails, where one bucket spans many values: a binary search
        idx[todo] = np.minimum(np.searchsorted(cdf, u[todo], side="right"), last)
    return (idx + lo).astype(np.int64, copy=False)


def _poisson_ptrs(lam: float, size: int, rng: CryptoRandom) -> np.ndarray:
    """W. Hormann, "The transformed rejection method for generating Poisson random variables" (1993).

    Deviations from lam are computed as k = floor(lam) + j with j a small float integer, and the
    log-pmf as a function of x = (k - lam) / lam, so neither loses precision for huge lam.
    """
    slam = math.sqrt(lam)
    base = math.floor(lam)
    frac = lam - base
    b = 0.931 + 2.53 * slam
    a = -0.059 + 0.02483 * b
    log_invalpha = math.log(1.1239 + 1.1328 / (b - 3.4))
    vr = 0.9277 - 3.6224 / (b - 2.0)
    out = np.empty(size, dtype=np.int64)
    pending = np.arange(size)
    while pending.size:
        m = pending.size
        u = rng.uniform(m) - 0.5
        v = rng.uniform(m)
        us = 0.5 - np.abs(u)
        with np.errstate(divide="ignore", invalid="ignore"):
            j = np.floor((2.0 * a / us + b) * u + frac + 0.43)  # k - floor(lam)
        accept = (us >= 0.07) & (v <= vr)
        slow = np.flatnonzero(~accept & (us > 0) & (j >= -base) & ~((us < 0.013) & (v > us)))
        if slow.size:
            uss = us[slow]
            with np.errstate(divide="ignore"):
                lhs = np.log(v[slow]) + log_invalpha - np.log(a / (uss * uss) + b)
            accept[slow] = lhs <= _poisson_logpmf(j[slow], base=base, frac=frac, lam=lam)
        out[pending[accept]] = base + j[accept].astype(np.int64)
        pending = pending[~accept]
    return out


def _poisson_logpmf(j: np.ndarray, *, base: int, frac: float, lam: float) -> np.ndarray:
    """log P(k) for k = base + j: -lam h(x) - log(2 pi k)/2 - stirling(k), x = (k - lam)/lam,
    h(x) = (1 + x) log1p(x) - x (series for small |x|); direct formula for k < 10."""
    k = base + j
    x = (j - frac) / lam
    small = np.abs(x) < 1e-2
    with np.errstate(divide="ignore", invalid="ignore"):
        h = np.where(small, 0.0, (1.0 + x) * np.log1p(x) - x)
        xs = np.where(small, x, 0.0)
        series = np.zeros_like(xs)
        for n in range(9, 1, -1):  # sum_{n>=2} (-1)^n x^n / (n (n - 1)), Horner from the top
            series = xs * (series + (-1.0) ** n / (n * (n - 1)))
        h = np.where(small, xs * series, h)
        kk = np.maximum(k, 10.0)
        stirling = 1.0 / (12.0 * kk) - 1.0 / (360.0 * kk**3) + 1.0 / (1260.0 * kk**5)
        stable = -lam * h - 0.5 * np.log(2.0 * math.pi * kk) - stirling
        direct = -lam + k * math.log(lam) - special.gammaln(np.maximum(k, 0.0) + 1.0)
    return np.where(k >= 10, stable, direct)


SKELLAM_TABLE_MAX = 1e8
"""Symmetric Skellam(lam) with lam up to this is drawn by inversion of its own CDF table (pmf
P(k) = e^(-2 lam) I_|k|(2 lam), scipy's `ive`, over +-(10 sqrt(2 lam) + 40), each tail left out below
1e-21): one uniform and one table walk a value instead of two Poisson draws, 1.5-2.3x faster (lam 0.3 to
1e7 on 2 shared cores, 2026-11-29), the distribution within 1e-12 in total variation of the two Poissons'
difference (`tests/dp/test_samplers.py`). Above it, Poisson(lam) - Poisson(lam): `ive` returns NaN from
about lam 6e8. A constant, not a check of the built table, so that a client and a server drawing one
noise layer from one key choose the same algorithm (XNoise's removal needs the same values)."""


def skellam(lam: float, size: int, rng: CryptoRandom) -> np.ndarray:
    """Symmetric Skellam: Poisson(lam) - Poisson(lam); mean 0, variance 2 lam."""
    if not lam >= 0 or not math.isfinite(lam):
        raise ValueError(f"Skellam parameter must be finite and non-negative, got {lam}")
    if lam == 0 or size == 0:
        return np.zeros(size, dtype=np.int64)
    if lam > SKELLAM_TABLE_MAX:
        return poisson(lam, size, rng) - poisson(lam, size, rng)
    table = _kept_table(("skellam", lam), lambda: _build_skellam_table(lam))
    return _blocked(lambda n: _invert(table, n, rng), size)


def _build_skellam_table(lam: float) -> tuple[int, np.ndarray, np.ndarray]:
    reach = math.ceil(10.0 * math.sqrt(2.0 * lam) + 40.0)
    k = np.arange(-reach, reach + 1, dtype=np.float64)
    cdf = np.cumsum(special.ive(np.abs(k), 2.0 * lam))
    if not np.all(np.isfinite(cdf)) or abs(cdf[-1] - 1.0) > 1e-9:
        raise RuntimeError(f"Skellam table for lam={lam} does not sum to 1 ({cdf[-1]!r}): scipy's ive failed")
    return _with_guide(-reach, cdf)


def discrete_laplace(t: float, size: int, rng: CryptoRandom) -> np.ndarray:
    """P(y) proportional to exp(-|y| / t): the difference of two geometric variables."""
    g1 = np.floor(-t * np.log(rng.uniform_open(size)))
    g2 = np.floor(-t * np.log(rng.uniform_open(size)))
    return (g1 - g2).astype(np.int64)


def discrete_gaussian(sigma: float, size: int, rng: CryptoRandom) -> np.ndarray:
    """Discrete Gaussian N_Z(0, sigma^2): P(y) proportional to exp(-y^2 / (2 sigma^2))."""
    if not sigma > 0 or not math.isfinite(sigma):
        raise ValueError(f"sigma must be positive and finite, got {sigma}")
    t = math.floor(sigma) + 1.0
    out = np.empty(size, dtype=np.int64)
    pending = np.arange(size)
    while pending.size:
        y = discrete_laplace(t, pending.size, rng)
        accept_prob = np.exp(-((np.abs(y) - sigma**2 / t) ** 2) / (2.0 * sigma**2))
        accept = rng.uniform(pending.size) < accept_prob
        out[pending[accept]] = y[accept]
        pending = pending[~accept]
    return out


def gaussian(sigma: float, size: int, rng: CryptoRandom) -> np.ndarray:
    """Float N(0, sigma^2) by inverse CDF of CSPRNG uniforms (floating-point noise: see module doc)."""
    u = rng.uniform(size)
    u[u == 0.0] = TWO_M53  # ndtri(0) = -inf
    return sigma * special.ndtri(u)
