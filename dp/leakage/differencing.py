"""The differencing attack: estimate each client's contribution from the released cohort sums.

A secure-sum server sees, per round t, the (noisy) sum y_t = n_t * mean_t of its cohort S_t and
knows S_t (it chose it). If client i's contribution x_i is roughly stable across rounds (fixed
local data, slowly moving model), the rounds form a linear system; the attacker solves

    min_X  sum_t || y_t - sum_{i in S_t} x_i ||^2 + lambda sum_i ||x_i||^2      (ridge least squares)

i.e. X_hat = (M^T M + lambda I)^-1 M^T Y with M the rounds x clients 0/1 cohort matrix. The with/
without difference S(A + {i}) - S(A) is the special case of two rounds. Released values are used,
so DP noise shows up: the estimate's error is ~ sigma^2 (M^T M)^-1, and with noise of realistic
scale the estimated rows carry no token signal. Each estimate is then attacked with a calibrated
`TokenAttack` (token recovery from its embedding rows) and scored against the client's true token
set as advantage over chance; optionally its cosine with the client's true mean update.

Memory: V x D may be 30522 x 16 with 200 clients. The N x N Gram is solved once; the N x R
solution is applied to the sums in column chunks, per batch of target clients, and only each
estimate's row statistics (row norms, row max |value|: what the detectors read) and cosine
accumulators are kept, never the N x V x D estimates.

Simplifications, stated: contributions are modelled in sum space (x_i = w_i u_i with the client's
aggregation weight w_i, which the server does not know; the detectors and the cosine are scale-free
in x_i except 'support', whose threshold is calibrated on shadow estimates of the same kind); a
client's update is taken as fixed across rounds (in real training it drifts: the estimate is then
a participation-weighted blend); lambda = ridge x (mean participations per client).

Calibration of the token attack on estimates: `simulate_differencing_shadow` builds SHADOW
ESTIMATES the attacker can simulate (shadow clients with known token sets, random cohorts, the
same noise scale, the same estimator), which is what `calibrate_token_attack` should see;
calibrating on shadow individual updates instead is possible (the pipeline falls back to it) but
picks thresholds for noise-free views.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np

from dp.leakage.calibration import RowStats, TokenAttack
from dp.leakage.recoverability import membership_matrix
from dp.leakage.stats import advantage_over_chance
from dp.leakage.token_recovery import mean_scores, score_tokens

_CHUNK_VALUES = 1 << 20  # float64 values per working block (~8 MB)


@dataclass(frozen=True, kw_only=True)
class ContributionEstimator:
    """The linear map from released sums to estimated contributions: X_hat = weights @ Y."""

    clients: tuple[int, ...]
    weights: np.ndarray
    """(N clients, R releases)."""
    ridge: float
    """The lambda used (absolute)."""
    rank: int
    """Rank of the cohort matrix M."""
    leverage: np.ndarray
    """Per client ||P_rowspace(M) e_i||^2: 1 = identifiable from noise-free sums."""

    def index(self, client: int) -> int:
        try:
            return self.clients.index(int(client))
        except ValueError:
            raise ValueError(f"client {client} is in no release") from None

    def identifiable(self, *, tol: float = 1e-8) -> frozenset[int]:
        return frozenset(c for c, lev in zip(self.clients, self.leverage) if lev >= 1.0 - tol)


def fit_contributions(cohorts: Sequence[Iterable[int]], *, clients: Iterable[int] | None = None,
                      ridge: float = 1e-6) -> ContributionEstimator:
    """Solve the ridge normal equations once on the N x N Gram of the cohort indicators.

    `cohorts[r]` are the contributors of release r. `ridge` is relative to the mean number of
    participations per client; 0 gives the minimum-norm least-squares solution (pseudo-inverse).
    """
    if not ridge >= 0:
        raise ValueError("ridge must be >= 0")
    if not cohorts:
        raise ValueError("no releases")
    m, ids = membership_matrix(list(cohorts), clients=clients)
    m = (m != 0).astype(np.float64)
    n = m.shape[1]
    _, sv, vt = np.linalg.svd(m, full_matrices=False)
    rank = int(np.count_nonzero(sv > sv.max() * max(m.shape) * np.finfo(float).eps)) if sv.size else 0
    leverage = (vt[:rank] ** 2).sum(axis=0)
    if ridge == 0:
        weights = np.linalg.pinv(m)
        lam = 0.0
    else:
        gram = m.T @ m
        lam = ridge * max(float(np.trace(gram)) / n, 1.0)
        weights = np.linalg.solve(gram + lam * np.eye(n), m.T)
    return ContributionEstimator(clients=tuple(ids), weights=weights, ridge=lam, rank=rank, leverage=leverage)


class _Sums(Protocol):
    length: int

    def chunk(self, lo: int, hi: int) -> np.ndarray:
        """Columns lo..hi of every release's sum: (R, hi - lo), float64; the same on every call."""


class _ArraySums:
    def __init__(self, rows: Sequence[tuple[np.ndarray, float]]) -> None:
        self.rows = [(np.asarray(v).reshape(-1), float(w)) for v, w in rows]
        lengths = {v.size for v, _ in self.rows}
        if len(lengths) != 1:
            raise ValueError("every release must have the same length")
        self.length = lengths.pop()

    def chunk(self, lo: int, hi: int) -> np.ndarray:
        return np.stack([v[lo:hi].astype(np.float64) * w for v, w in self.rows])


class _SimulatedSums:
    """M @ U + N(0, noise_std^2) per coordinate, generated per chunk from a fixed seed."""

    def __init__(self, m: np.ndarray, updates: Sequence[np.ndarray], noise_std: float, seed: int) -> None:
        self.m, self.updates, self.noise_std, self.seed = m, updates, noise_std, seed
        self.length = updates[0].size

    def chunk(self, lo: int, hi: int) -> np.ndarray:
        out = self.m @ np.stack([u[lo:hi] for u in self.updates])
        if self.noise_std > 0:
            out += np.random.default_rng([self.seed, lo, hi]).normal(0.0, self.noise_std, size=out.shape)
        return out


def _stream(est: ContributionEstimator, sums: _Sums, *, targets: Sequence[int], shape: tuple[int, int],
            true_vectors: Mapping[int, np.ndarray] | None = None, batch: int = 64
            ) -> Iterator[tuple[int, RowStats, float | None]]:
    """(client, RowStats of its estimate, cosine with its true vector or None), target by target."""
    v, d = int(shape[0]), int(shape[1])
    if sums.length != v * d:
        raise ValueError(f"released vectors of {sums.length} values do not match shape {shape}")
    if est.weights.shape[1] == 0:
        raise ValueError("no releases")
    true_vectors = true_vectors or {}
    for c, x in true_vectors.items():
        if np.asarray(x).size != v * d:
            raise ValueError(f"true vector of client {c} does not match shape {shape}")
    r = est.weights.shape[1]
    for b0 in range(0, len(targets), batch):
        group = list(targets[b0: b0 + batch])
        w = est.weights[[est.index(c) for c in group]]  # (B, R)
        nb = len(group)
        norms, rowmax = np.zeros((nb, v)), np.zeros((nb, v))
        dots, e2, t2 = np.zeros(nb), np.zeros(nb), np.zeros(nb)
        cos_rows = [j for j, c in enumerate(group) if c in true_vectors]
        step = max(1, _CHUNK_VALUES // (d * max(nb, r)))
        for lo in range(0, v, step):
            hi = min(v, lo + step)
            e = w @ sums.chunk(lo * d, hi * d)  # (B, rows * D)
            e3 = e.reshape(nb, hi - lo, d)
            norms[:, lo:hi] = np.linalg.norm(e3, axis=2)
            rowmax[:, lo:hi] = np.abs(e3).max(axis=2)
            for j in cos_rows:
                t = np.asarray(true_vectors[group[j]], dtype=np.float64).reshape(-1)[lo * d: hi * d]
                dots[j] += float(e[j] @ t)
                e2[j] += float(e[j] @ e[j])
                t2[j] += float(t @ t)
        for j, c in enumerate(group):
            cos = None
            if c in true_vectors:
                den = float(np.sqrt(e2[j] * t2[j]))
                cos = float(dots[j] / den) if den > 0 else 0.0
            yield c, RowStats(norms=norms[j], rowmax=rowmax[j]), cos


def estimate_contributions(cohorts: Sequence[Iterable[int]], sums: Any, *, clients: Iterable[int] | None = None,
                           ridge: float = 1e-6) -> dict[int, np.ndarray]:
    """Dense estimates of every client's contribution from R sums (an R x P array): small problems."""
    est = fit_contributions(cohorts, clients=clients, ridge=ridge)
    y = np.asarray(sums, dtype=np.float64)
    y = y[:, None] if y.ndim == 1 else y.reshape(y.shape[0], -1)
    if y.shape[0] != est.weights.shape[1]:
        raise ValueError(f"{y.shape[0]} sums for {est.weights.shape[1]} releases")
    x = est.weights @ y
    return {c: x[j] for j, c in enumerate(est.clients)}


def random_cohorts(clients: Sequence[int], *, size: int, rounds: int, rng: np.random.Generator
                   ) -> list[tuple[int, ...]]:
    """`rounds` cohorts of `size` distinct clients drawn uniformly (a seeded sampler's schedule)."""
    ids = np.asarray(list(clients))
    if not 1 <= size <= ids.size or rounds < 1:
        raise ValueError("need 1 <= size <= len(clients) and rounds >= 1")
    return [tuple(sorted(int(c) for c in rng.choice(ids, size, replace=False))) for _ in range(rounds)]


def simulate_differencing_shadow(updates: Sequence[tuple[np.ndarray, Iterable[int]]], *,
                                 cohorts: Sequence[Iterable[int]], shape: tuple[int, int], noise_std: float = 0.0,
                                 rng: np.random.Generator, ridge: float = 1e-6
                                 ) -> list[tuple[RowStats, frozenset[int]]]:
    """Shadow ESTIMATES for calibrating the differencing attacker, as the attacker simulates them.

    `updates[i]` is shadow client i's (contribution vector, token set) from public data; `cohorts`
    index into `updates` (use the real schedule's sizes and count, e.g. `random_cohorts`);
    `noise_std` is the std of the noise on each coordinate of a released SUM (for a DP mean with
    per-coordinate std s over total weight n, pass s * n). Returns (RowStats of client i's
    estimate, its token set) for every shadow client that took part in some cohort.
    """
    if noise_std < 0:
        raise ValueError("noise_std must be >= 0")
    v, d = int(shape[0]), int(shape[1])
    vecs = [np.asarray(u, dtype=np.float64).reshape(-1) for u, _ in updates]
    if not vecs or any(x.size != v * d for x in vecs):
        raise ValueError(f"need shadow updates of {v * d} values each")
    est = fit_contributions(cohorts, clients=range(len(vecs)), ridge=ridge)
    if est.clients != tuple(range(len(vecs))):
        raise ValueError("cohorts must index into updates (0..len(updates) - 1)")
    m = (membership_matrix(list(cohorts), clients=range(len(vecs)))[0] != 0).astype(np.float64)
    sums = _SimulatedSums(m, vecs, float(noise_std), int(rng.integers(2**63 - 1)))
    taking_part = [c for c in est.clients if m[:, c].any()]
    return [(stats, frozenset(int(x) for x in updates[c][1]))
            for c, stats, _ in _stream(est, sums, targets=taking_part, shape=(v, d))]


@dataclass(frozen=True, kw_only=True)
class DifferencingScores:
    """Token recovery on the differencing estimates of the target clients (macro over clients)."""

    targets: int
    """Clients with a known token set that took part in some release."""
    releases: int
    rank: int
    identifiable: int
    """Targets whose contribution the noise-free sums determine exactly."""
    method: str
    parameter: float
    precision: float
    recall: float
    f1: float
    chance_f1: float
    advantage: float
    """advantage_over_chance(f1, chance_f1): the headline of this attack."""
    mean_cosine: float | None = None
    """Mean over targets with a given true update of cos(estimate, true mean update)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def differencing_attack(transcript: Any, *, part: str, truth: Mapping[int, Iterable[int]], shape: tuple[int, int],
                        attack: TokenAttack, true_updates: Mapping[int, np.ndarray] | None = None,
                        ridge: float = 1e-6, batch: int = 64) -> DifferencingScores:
    """Run the differencing attack on every aggregate of `part` the transcript holds.

    `truth` maps clients to their token sets (the targets are those that took part); `attack` is
    a `TokenAttack` calibrated beforehand (ideally on `simulate_differencing_shadow` output);
    `true_updates` optionally maps clients to their true mean update of `part` (V*D) for the cosine.
    Raises ValueError if there are no aggregates of `part`, they do not cover the whole V x D
    matrix, or no client of `truth` took part.
    """
    v, d = int(shape[0]), int(shape[1])
    if tuple(attack.shape) != (v, d):
        raise ValueError(f"attack calibrated for shape {attack.shape}, not {shape}")
    recs = transcript.aggregates(part)
    if not recs:
        raise ValueError(f"the transcript has no aggregates of '{part}'")
    if any(rec.offset != 0 or rec.mean.size != v * d for rec in recs):
        raise ValueError(f"the aggregates of '{part}' do not cover the whole {v} x {d} matrix")
    est = fit_contributions([rec.contributors for rec in recs], ridge=ridge)
    targets = [c for c in sorted(int(c) for c in truth) if c in est.clients]
    if not targets:
        raise ValueError("no client with a known token set took part in any release")
    sums = _ArraySums([(rec.mean, rec.total_weight) for rec in recs])
    scores, cosines = [], []
    for c, stats, cos in _stream(est, sums, targets=targets, shape=(v, d), true_vectors=true_updates, batch=batch):
        scores.append(score_tokens(attack.recover(stats), truth[c], vocab_size=v))
        if cos is not None:
            cosines.append(cos)
    avg = mean_scores(scores)
    ident = est.identifiable()
    return DifferencingScores(
        targets=len(targets), releases=len(recs), rank=est.rank, identifiable=sum(c in ident for c in targets),
        method=attack.method, parameter=attack.parameter, precision=avg.precision, recall=avg.recall, f1=avg.f1,
        chance_f1=float(avg.chance_f1), advantage=advantage_over_chance(avg.f1, avg.chance_f1),
        mean_cosine=float(np.mean(cosines)) if cosines else None)


__all__ = ["ContributionEstimator", "fit_contributions", "estimate_contributions", "random_cohorts",
           "simulate_differencing_shadow", "DifferencingScores", "differencing_attack"]
