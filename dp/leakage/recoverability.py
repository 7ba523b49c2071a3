"""How many clients' vectors the server can recover from noise-free released sums.

For one summary key (a fixed per-client vector x_i) the releases are S = M X with M the
membership matrix (row r = the clients in release r). Any w^T X with w in rowspace(M) is learned
exactly, so client i is exposed iff e_i lies in rowspace(M) (research/dp_leakage.md Sec. 3.4):
two sums S(A), S(A + {i}) suffice, random cohorts expose everyone after about N releases, fixed
disjoint groups expose nobody. Per-client weights fixed per key scale columns of M and do not
change the test.

Two rank tests:
  * 'float' (default): incremental Gram-Schmidt with re-orthogonalisation (CGS2) on the rows,
    tracking the leverages l_i = ||P_rowspace e_i||^2; exposed iff l_i >= 1 - tol. Robust for 0/1
    matrices at research scale (N in the thousands), O(rank N) per release.
  * 'exact': fraction-free elimination over the integers (Python ints, rows kept primitive and
    fully reduced), so rowspace(M) over the rationals is decided exactly: with a fully reduced
    echelon basis, e_i is in the row space iff some basis row has a single non-zero entry, at i.
    O(rank N) big-int operations per release: meant for N up to a few hundred, and as an oracle.
The disclosure guard (secagg/disclosure_guard.py) applies the same criterion before a release;
this module measures it after the fact, from what was released.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Recoverability:
    exposed: frozenset[int]
    """Clients whose individual vector is determined by the releases."""
    n_clients: int
    rank: int
    leverage: Mapping[int, float]
    """||P_rowspace e_i||^2 per client ('float' method; 1.0/0.0 placeholders for 'exact')."""

    @property
    def count(self) -> int:
        return len(self.exposed)

    @property
    def fraction(self) -> float:
        return len(self.exposed) / self.n_clients if self.n_clients else 0.0


@dataclass(frozen=True)
class ReconstructionScores:
    mean_cosine: float
    cosine: Mapping[int, float]
    """Per client: cosine between the least-squares estimate and the true vector."""
    exposed_mean_cosine: float | None
    """Mean over exposed clients (1.0 for noise-free sums), None if nobody is exposed."""


def _members(release: Iterable[int] | Mapping[int, float]) -> tuple[int, ...]:
    ids = release.keys() if isinstance(release, Mapping) else release
    out = set()
    for c in ids:
        if isinstance(c, bool) or not isinstance(c, (int, np.integer)):
            raise TypeError(f"client ids are ints, got {c!r}")
        out.add(int(c))
    if not out:
        raise ValueError("a release needs at least one member")
    return tuple(sorted(out))


def membership_matrix(releases: Sequence[Iterable[int] | Mapping[int, float]], *,
                      clients: Iterable[int] | None = None,
                      weights: Mapping[int, float] | None = None) -> tuple[np.ndarray, list[int]]:
    """(M, client ids): M[r, j] = weight of client ids[j] in release r (1.0 if unweighted).

    A release given as a mapping client -> weight uses those weights; `weights` gives fixed
    per-client weights for releases given as plain id sets.
    """
    rows = [_members(r) for r in releases]
    ids = sorted(set().union(*rows, (int(c) for c in clients or ())))
    col = {c: j for j, c in enumerate(ids)}
    m = np.zeros((len(rows), len(ids)))
    for r, (rel, members) in enumerate(zip(releases, rows)):
        for c in members:
            if isinstance(rel, Mapping):
                m[r, col[c]] = float(rel[c])
            else:
                m[r, col[c]] = float(weights[c]) if weights is not None else 1.0
    return m, ids


class RowSpace:
    """Orthonormal basis of the span of the rows seen so far, with per-column leverages (float)."""

    def __init__(self, n: int, *, tol: float = 1e-9) -> None:
        self.n, self.tol = n, tol
        self.basis = np.zeros((0, n))
        self.leverage = np.zeros(n)

    @property
    def rank(self) -> int:
        return self.basis.shape[0]

    def add(self, row: np.ndarray) -> bool:
        """Add a row; returns whether it increased the rank."""
        row = np.asarray(row, dtype=np.float64)
        norm0 = float(np.linalg.norm(row))
        if norm0 == 0.0 or self.rank == self.n:
            return False
        res = row - self.basis.T @ (self.basis @ row)
        res -= self.basis.T @ (self.basis @ res)  # second pass: CGS2
        norm = float(np.linalg.norm(res))
        if norm <= self.tol * norm0:
            return False
        q = res / norm
        self.basis = np.vstack([self.basis, q])
        self.leverage += q * q
        return True


class ExactRowSpace:
    """Fully reduced echelon basis over the rationals, kept as primitive integer rows."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.rows: list[tuple[int, np.ndarray]] = []  # (pivot column, object-dtype int row)

    @property
    def rank(self) -> int:
        return len(self.rows)

    @staticmethod
    def _primitive(r: np.ndarray, pivot: int) -> np.ndarray:
        g = math.gcd(*(int(x) for x in r if x))
        if r[pivot] < 0:
            g = -g
        return r // g

    def add(self, row: Iterable[int]) -> bool:
        r = np.array([int(x) for x in row], dtype=object)
        if r.shape != (self.n,):
            raise ValueError(f"row of length {r.shape[0]} for {self.n} columns")
        for p, b in self.rows:
            if r[p]:
                r = r * b[p] - r[p] * b
                if not r.any():
                    return False
                r = self._primitive(r, int(np.flatnonzero(r != 0)[0]))
        nz = np.flatnonzero(r != 0)
        if nz.size == 0:
            return False
        p_new = int(nz[0])
        r = self._primitive(r, p_new)
        for j, (p, b) in enumerate(self.rows):
            if b[p_new]:
                b = b * r[p_new] - b[p_new] * r
                self.rows[j] = (p, self._primitive(b, p))
        self.rows.append((p_new, r))
        return True

    def unit_rows(self) -> set[int]:
        """Columns i with e_i in the row space (rows with a single non-zero entry)."""
        out = set()
        for p, b in self.rows:
            if np.count_nonzero(b != 0) == 1:
                out.add(p)
        return out


def recoverable_clients(releases: Sequence[Iterable[int] | Mapping[int, float]], *,
                        clients: Iterable[int] | None = None, method: str = "float",
                        tol: float = 1e-8) -> Recoverability:
    """Which clients' vectors are determined by the noise-free sums over `releases`.

    `clients` adds clients who never took part (they count in the fraction and are never exposed).
    """
    m, ids = membership_matrix(releases, clients=clients)
    support = (m != 0).astype(np.int64)  # column scaling by fixed weights does not change the test
    if method == "float":
        space = RowSpace(len(ids))
        for row in support:
            space.add(row)
        exposed = frozenset(ids[j] for j in np.flatnonzero(space.leverage >= 1.0 - tol))
        return Recoverability(exposed, len(ids), space.rank, {c: float(space.leverage[j]) for j, c in enumerate(ids)})
    if method == "exact":
        exact = ExactRowSpace(len(ids))
        for row in support:
            exact.add(row)
        cols = exact.unit_rows()
        exposed = frozenset(ids[j] for j in cols)
        return Recoverability(exposed, len(ids), exact.rank, {c: float(j in cols) for j, c in enumerate(ids)})
    raise ValueError("method must be 'float' or 'exact'")


def exposure_curve(releases: Sequence[Iterable[int] | Mapping[int, float]], *,
                   clients: Iterable[int] | None = None, tol: float = 1e-8) -> np.ndarray:
    """Number of exposed clients after each release (float method), for 'releases until exposure'."""
    m, ids = membership_matrix(releases, clients=clients)
    space = RowSpace(len(ids))
    out = np.zeros(len(releases), dtype=np.int64)
    for r, row in enumerate((m != 0).astype(np.float64)):
        space.add(row)
        out[r] = int(np.count_nonzero(space.leverage >= 1.0 - tol))
    return out


def reconstruct(releases: Sequence[Iterable[int] | Mapping[int, float]], sums: np.ndarray, *,
                clients: Iterable[int] | None = None,
                weights: Mapping[int, float] | None = None) -> dict[int, np.ndarray]:
    """Minimum-norm least-squares estimate of every client's vector from the released sums.

    `sums[r]` is the (weighted) sum of release r: for a decoded mean, pass mean * total_weight.
    Exposed clients are recovered exactly (noise-free sums); with DP noise the estimate's
    covariance is sigma^2 (M^T M)^-1 on the row space.
    """
    m, ids = membership_matrix(releases, clients=clients, weights=weights)
    s = np.asarray(sums, dtype=np.float64)
    if s.ndim == 1:
        s = s[:, None]
    if s.shape[0] != m.shape[0]:
        raise ValueError(f"{s.shape[0]} sums for {m.shape[0]} releases")
    x, *_ = np.linalg.lstsq(m, s, rcond=None)
    return {c: x[j] for j, c in enumerate(ids)}


def reconstruction_cosine(releases: Sequence[Iterable[int] | Mapping[int, float]], sums: np.ndarray,
                          vectors: Mapping[int, np.ndarray], *, weights: Mapping[int, float] | None = None,
                          tol: float = 1e-8) -> ReconstructionScores:
    """Cosine between each client's least-squares reconstruction and its true vector (evaluation)."""
    est = reconstruct(releases, sums, clients=vectors.keys(), weights=weights)
    cos = {}
    for c, x in vectors.items():
        x = np.asarray(x, dtype=np.float64).ravel()
        e = est[c].ravel()
        denom = float(np.linalg.norm(x) * np.linalg.norm(e))
        cos[int(c)] = float(x @ e / denom) if denom > 0 else 0.0
    exposed = recoverable_clients(releases, clients=vectors.keys(), tol=tol).exposed
    exp_cos = [cos[c] for c in exposed if c in cos]
    return ReconstructionScores(float(np.mean(list(cos.values()))) if cos else 0.0, cos,
                                float(np.mean(exp_cos)) if exp_cos else None)


def recoverable_from_transcript(transcript: Any, *, part: str, clients: Iterable[int] | None = None,
                                method: str = "float", tol: float = 1e-8) -> Recoverability:
    """`recoverable_clients` over every recorded aggregate of `part` (one fixed-vector summary key)."""
    releases = [rec.contributors for rec in transcript.aggregates(part)]
    if not releases:
        return Recoverability(frozenset(), len(set(clients or ())), 0, {})
    return recoverable_clients(releases, clients=clients, method=method, tol=tol)


__all__ = ["recoverable_from_transcript", "Recoverability", "ReconstructionScores", "membership_matrix", "RowSpace", "ExactRowSpace",
           "recoverable_clients", "exposure_curve", "reconstruct", "reconstruction_cosine"]
