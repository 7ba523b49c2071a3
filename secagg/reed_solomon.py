"""Reed–Solomon error location and correction for share reconstruction (SecAgg, LightSecAgg).

Why: Shamir shares (`secagg.shamir`, F_q with q = 2^255 - 19) and LightSecAgg's coded pieces
(`secagg.lcc`, F_p with p = 2^31 - 1) are Reed–Solomon codewords: n evaluations of a polynomial of
degree < k. A server holding more than k of them can check them against each other instead of
trusting the first k: with n points, up to n - k wrong values are detectable and up to
floor((n - k) / 2) correctable (Berlekamp–Welch), see `capacity`.

Guarantees. Let e be the true number of wrong values and t the correction radius (`max_errors`,
default floor((n - k) / 2); a decoder never returns a polynomial that disagrees with more than t
points, and it is unique: two polynomials of degree < k agreeing with n - t >= (n + k) / 2 points
share >= k of them, so they are equal).

* e <= t: the true secret and exactly the set of wrong indices are returned.
* t < e <= n - k - t: `UncorrectableError` is raised, never a wrong secret (a returned polynomial
  would share >= n - t - e >= k points with the true one, so equal it, yet disagree with e > t).
  With t = 0 (detection only) this covers every 1 <= e <= n - k; with the default t it covers
  e = t + 1 only when n - k is odd.
* e > n - k - t: the values may lie within distance t of ANOTHER codeword; then its secret is
  returned (no decoder can tell, the received word is closer to it); with e > n - k the values may
  even form another codeword, returned with no index flagged. Wrong values chosen at random make
  that negligible (probability about C(n, t) q^-(n - k - t)), but colluding share holders can force
  it: pick t to trade correction for detection.
* n == k: there is no redundancy; the interpolated value is returned unchecked.

Cost: the fast path interpolates through the first k points and checks the other n - k against it
with precomputed Lagrange weights, (n - k + 1) k multiplications per secret, shared by every secret held at
the same points (`decode_many`). Berlekamp–Welch (O(n^3) Gaussian elimination) runs only on a
mismatch.
"""
from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from secagg.prg import CryptoRandom
from secagg.shamir import batch_inverse
from secagg.ring import MERSENNE_31

_VECTOR_PRIME_LIMIT = 1 << 32  # residues < 2^32: a product of two fits uint64
_COLUMN_CHUNK = 1 << 15  # columns per block of `locate_vector_errors`: sums stay < 2^47, memory bounded


class UncorrectableError(ValueError):
    """The values are not within the correction radius of any polynomial of degree < k.

    Attributes: points (n), k, max_errors (the radius t that was tried), row (index in a batch, or
    None).
    """

    def __init__(self, reason: str, *, points: int, k: int, max_errors: int, row: int | None = None) -> None:
        self.points, self.k, self.max_errors, self.row = points, k, max_errors, row
        where = "" if row is None else f"row {row}: "
        super().__init__(
            f"{where}uncorrectable: {reason}; {points} points of a polynomial of degree < {k} tolerate at most "
            f"{max_errors} wrong values (up to {points - k} are detectable)"
        )


def capacity(n: int, k: int) -> tuple[int, int]:
    """(detectable, correctable) numbers of wrong values among n evaluations of a degree < k polynomial:
    (n - k, (n - k) // 2), the minimum distance n - k + 1 of the Reed–Solomon code less one, and half."""
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")
    return n - k, (n - k) // 2


# ---- precomputation shared by every secret held at the same points ------------------------------

class _Plan(NamedTuple):
    xs: tuple[int, ...]
    k: int
    prime: int
    max_errors: int
    at_zero: tuple[int, ...]  # l_i(0) over the first k points
    checks: tuple[tuple[int, ...], ...]  # checks[j][i] = l_i(xs[k + j]) over the first k points


def _lagrange_weights(nodes: tuple[int, ...], targets: Sequence[int], prime: int) -> list[tuple[int, ...]]:
    """w[z][i] = l_i(z), the Lagrange basis over `nodes` at each target z (prefix/suffix products)."""
    k = len(nodes)
    dens = [1] * k
    for i, a in enumerate(nodes):
        for m, b in enumerate(nodes):
            if m != i:
                dens[i] = dens[i] * (a - b) % prime
    inv_dens = batch_inverse(dens, prime)
    out = []
    for z in targets:
        if z in nodes:
            out.append(tuple(int(a == z) for a in nodes))
            continue
        diffs = [(z - a) % prime for a in nodes]
        suffix = [1] * (k + 1)
        for i in range(k - 1, -1, -1):
            suffix[i] = suffix[i + 1] * diffs[i] % prime
        row, pre = [], 1
        for i in range(k):
            row.append(pre * suffix[i + 1] % prime * inv_dens[i] % prime)
            pre = pre * diffs[i] % prime
        out.append(tuple(row))
    return out


@lru_cache(maxsize=128)
def _cached_plan(xs: tuple[int, ...], k: int, prime: int, max_errors: int) -> _Plan:
    weights = _lagrange_weights(xs[:k], (0, *xs[k:]), prime)
    return _Plan(xs, k, prime, max_errors, weights[0], tuple(weights[1:]))


def _plan(xs: Sequence[int], *, k: int, prime: int, max_errors: int | None) -> _Plan:
    if not isinstance(prime, int) or prime < 2:
        raise ValueError(f"prime must be an integer >= 2, got {prime!r}")
    xs = tuple(operator.index(x) for x in xs)
    n = len(xs)
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if n < k:
        raise ValueError(f"need at least k = {k} points, got {n}")
    if any(not 0 <= x < prime for x in xs):
        raise ValueError("points must be residues in [0, prime)")
    if len(set(xs)) != n:
        raise ValueError("points must be distinct")
    correctable = (n - k) // 2
    if max_errors is None:
        max_errors = correctable
    elif not 0 <= max_errors <= correctable:
        raise ValueError(f"max_errors must be in [0, {correctable}] for {n} points and k = {k}, got {max_errors}")
    return _cached_plan(xs, k, prime, max_errors)


def _values(ys: Sequence[int], plan: _Plan) -> list[int]:
    ys = [operator.index(y) for y in ys]
    if len(ys) != len(plan.xs):
        raise ValueError(f"need one value per point: {len(plan.xs)} points, {len(ys)} values")
    if any(not 0 <= y < plan.prime for y in ys):
        raise ValueError("values must be residues in [0, prime)")
    return ys


# ---- decoding ------------------------------------------------------------------------------------

def _decode_row(plan: _Plan, ys: list[int], row: int | None = None) -> tuple[int, frozenset[int]]:
    """Fast path (all points on the interpolant of the first k), else Berlekamp–Welch."""
    k, p = plan.k, plan.prime
    base = ys[:k]
    if all(sum(map(operator.mul, w, base)) % p == y for w, y in zip(plan.checks, ys[k:])):
        return sum(map(operator.mul, plan.at_zero, base)) % p, frozenset()
    n = len(ys)
    if plan.max_errors == 0:
        raise UncorrectableError("the values do not lie on one polynomial", points=n, k=k, max_errors=0, row=row)
    coeffs = _berlekamp_welch(plan.xs, ys, k=k, e=plan.max_errors, prime=p)
    if coeffs is None:
        raise UncorrectableError(
            "no polynomial agrees with enough of the values", points=n, k=k, max_errors=plan.max_errors, row=row
        )
    bad = frozenset(i for i, (x, y) in enumerate(zip(plan.xs, ys)) if _horner(coeffs, x, p) != y)
    if len(bad) > plan.max_errors:  # cannot happen when Q = P * E exactly (E has <= e roots); kept as a guard
        raise UncorrectableError("too many disagreements", points=n, k=k, max_errors=plan.max_errors, row=row)
    return coeffs[0], bad


def _horner(coeffs: Sequence[int], x: int, prime: int) -> int:
    acc = 0
    for c in reversed(coeffs):
        acc = (acc * x + c) % prime
    return acc


def _solve(rows: list[list[int]], unknowns: int, prime: int) -> list[int] | None:
    """One solution of the augmented system rows (each [a_0 .. a_{u-1} | b]) over F_prime; free
    variables are set to zero. None if inconsistent."""
    pivots = []
    r = 0
    for col in range(unknowns):
        pivot = next((i for i in range(r, len(rows)) if rows[i][col]), None)
        if pivot is None:
            continue
        rows[r], rows[pivot] = rows[pivot], rows[r]
        inv = pow(rows[r][col], -1, prime)
        lead = rows[r] = [v * inv % prime for v in rows[r]]
        for i in range(len(rows)):
            f = rows[i][col]
            if i != r and f:
                rows[i] = [(v - f * w) % prime for v, w in zip(rows[i], lead)]
        pivots.append(col)
        r += 1
    if any(row[unknowns] for row in rows[r:]):
        return None
    sol = [0] * unknowns
    for i, col in enumerate(pivots):
        sol[col] = rows[i][unknowns]
    return sol


def _berlekamp_welch(xs: Sequence[int], ys: Sequence[int], *, k: int, e: int, prime: int) -> list[int] | None:
    """Coefficients of the polynomial P, deg P < k, within distance e of ys, or None (needs n >= k + 2e).

    Unknowns: a monic error locator E of degree e and Q = P * E of degree < e + k, with
    Q(x_i) = y_i E(x_i) at every point. Any solution gives Q / E = P: two solutions (Q, E), (Q', E')
    satisfy Q E' = Q' E at n > 2e + k - 2 points, so as polynomials.
    """
    nq = e + k
    rows = []
    for x, y in zip(xs, ys):
        powers = [1]
        for _ in range(nq):
            powers.append(powers[-1] * x % prime)
        rows.append(powers[:nq] + [-y * v % prime for v in powers[:e]] + [y * powers[e] % prime])
    sol = _solve(rows, nq + e, prime)
    if sol is None:
        return None
    q, locator = sol[:nq], sol[nq:] + [1]
    # Q / E by long division (E is monic); the remainder must vanish.
    quotient = [0] * k
    for d in range(nq - 1, e - 1, -1):
        c = q[d]
        quotient[d - e] = c
        if c:
            for j in range(e + 1):
                q[d - e + j] = (q[d - e + j] - c * locator[j]) % prime
    return quotient if not any(q[:e]) else None


def decode_scalar(
    xs: Sequence[int], ys: Sequence[int], *, k: int, prime: int, max_errors: int | None = None
) -> tuple[int, frozenset[int]]:
    """The secret f(0) of a polynomial f of degree < k from values ys[i] ~ f(xs[i]), some possibly wrong,
    and the frozenset of INDICES i whose value is wrong.

    max_errors (default floor((n - k) / 2)) is the correction radius; 0 means detect only. Raises
    UncorrectableError when no polynomial is within that radius, ValueError on bad input (fewer than
    k points, repeated points, values outside [0, prime)). See the module docstring for guarantees.
    """
    plan = _plan(xs, k=k, prime=prime, max_errors=max_errors)
    return _decode_row(plan, _values(ys, plan))


def decode_many(
    xs: Sequence[int], rows: Sequence[Sequence[int]], *, k: int, prime: int, max_errors: int | None = None
) -> tuple[list[int], list[frozenset[int]]]:
    """`decode_scalar` for many secrets held at the same points: rows[r][i] ~ f_r(xs[i]).

    Returns (secrets, bad index sets), one per row. The Lagrange weights are computed once; only rows
    failing the fast check run Berlekamp–Welch. An UncorrectableError names its row.
    """
    plan = _plan(xs, k=k, prime=prime, max_errors=max_errors)
    values, bad = [], []
    for r, ys in enumerate(rows):
        v, b = _decode_row(plan, _values(ys, plan), row=r)
        values.append(v)
        bad.append(b)
    return values, bad


# ---- vector codewords (LightSecAgg coded pieces) -------------------------------------------------

def _residues(block: np.ndarray, prime: int) -> np.ndarray:
    """block mod prime as uint64, without the int64 wrap-around of large or negative inputs."""
    kind = block.dtype.kind
    if kind == "u":
        return block.astype(np.uint64) % np.uint64(prime)
    if kind == "i":
        return (block.astype(np.int64) % prime).astype(np.uint64)  # numpy's % is non-negative here
    if kind == "O":
        reduced = [[operator.index(v) % prime for v in row] for row in block]
        return np.array(reduced, dtype=np.uint64).reshape(block.shape)
    raise ValueError(f"pieces must be integers, got dtype {block.dtype}")


def _random_residues(rng: CryptoRandom, count: int, prime: int) -> np.ndarray:
    """count uniform residues mod prime (uint64), by rejection from prime.bit_length()-bit words."""
    mask = np.uint64((1 << prime.bit_length()) - 1)
    out = np.empty(0, dtype=np.uint64)
    while out.size < count:
        words = rng.words(count - out.size + 16) & mask
        out = np.concatenate([out, words[words < prime]])
    return out[:count]


def _project(pieces: np.ndarray, coeffs: np.ndarray | Callable[[int, int], np.ndarray], prime: int, *,
             rows: int | None = None) -> list[list[int]]:
    """(pieces @ coeffs.T) mod prime exactly, as lists of Python ints: one list per row of coeffs.

    Residues < 2^32, so a product fits uint64 and is reduced at once; a block of _COLUMN_CHUNK
    reduced products sums below 2^47. `coeffs` may be a function giving the (rows, c1 - c0) block of
    columns c0..c1 when asked, so that coefficients for a long vector are never all held at once.
    """
    n, length = pieces.shape
    rows = coeffs.shape[0] if rows is None else rows
    acc = np.zeros((rows, n), dtype=np.uint64)
    p = np.uint64(prime)
    for c0 in range(0, length, _COLUMN_CHUNK):
        block = _residues(pieces[:, c0 : c0 + _COLUMN_CHUNK], prime)
        c1 = min(c0 + _COLUMN_CHUNK, length)
        part = coeffs(c0, c1) if callable(coeffs) else coeffs[:, c0:c1]
        for r in range(rows):
            prod = block * part[r]
            np.remainder(prod, p, out=prod)
            acc[r] = (acc[r] + prod.sum(axis=1, dtype=np.uint64) % p) % p
    return [[int(v) for v in row] for row in acc]


def locate_vector_errors(
    xs: Sequence[int],
    pieces: np.ndarray,
    *,
    k: int,
    prime: int = MERSENNE_31,
    rng: CryptoRandom | None = None,
    max_errors: int | None = None,
    rounds: int = 2,
) -> frozenset[int]:
    """Indices of the wrong rows of `pieces` (n, L): row i should be F(xs[i]) for a vector polynomial
    F of degree < k over F_prime (prime < 2^32; entries are reduced mod prime, any integer dtype).
    `pieces` is an array, or any object with `shape` read a block of columns at a time as
    `pieces[:, c0:c1]` (e.g. `relay.RowStore`, rows spilled to disk).

    Why a projection: each of `rounds` secret uniform vectors c in F_prime^L turns the rows into one
    scalar codeword F(x).c, decoded with `decode_scalar`; the union of the flagged rows is returned.
    A wrong row i (error vector d_i != 0) is missed by one round only if d_i.c = 0, probability
    exactly 1/prime for a c its sender cannot know; so it escapes all rounds with probability
    prime^-rounds (2^-62 for p = 2^31 - 1 and the default 2 rounds; n wrong rows: at most n times
    that). `rng` is the source of c (default a fresh OS-keyed CryptoRandom; pass a keyed one only in
    tests). Raises UncorrectableError when more than max_errors (default floor((n - k) / 2)) rows
    are wrong, with the guarantees of `decode_scalar` (each round's error weight is at most the true
    one). Decode afterwards from rows not returned, e.g. `LagrangeCode.decode`; for
    LightSecAgg the point of 0-based roster position j is lcc.betas(N)[j] = j + 1, and k = U.
    """
    if not isinstance(prime, int) or not 2 <= prime < _VECTOR_PRIME_LIMIT:
        raise ValueError(f"prime must be an integer in [2, 2^32) for vector pieces, got {prime!r}")
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    pieces = pieces if hasattr(pieces, "shape") else np.asarray(pieces)  # or any matrix read as pieces[:, c0:c1]
    if len(pieces.shape) != 2 or pieces.shape[1] < 1:
        raise ValueError(f"pieces must be a 2-D array (n, L) with L >= 1, got shape {pieces.shape}")
    plan = _plan(xs, k=k, prime=prime, max_errors=max_errors)
    if pieces.shape[0] != len(plan.xs):
        raise ValueError(f"need one piece per point: {len(plan.xs)} points, {pieces.shape[0]} pieces")
    rng = CryptoRandom() if rng is None else rng
    def coeffs(c0: int, c1: int) -> np.ndarray:  # drawn block by block: O(rounds x chunk), not O(rounds x L)
        return _random_residues(rng, rounds * (c1 - c0), prime).reshape(rounds, c1 - c0)

    bad: set[int] = set()
    for ys in _project(pieces, coeffs, prime, rows=rounds):
        bad |= _decode_row(plan, ys)[1]
    if len(bad) > plan.max_errors:
        raise UncorrectableError(
            f"{len(bad)} rows are wrong", points=len(plan.xs), k=k, max_errors=plan.max_errors
        )
    return frozenset(bad)
