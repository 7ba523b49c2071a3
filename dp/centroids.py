"""DP cluster centres of one client's documents: a task descriptor the server may compare tasks by.

FedSeIT's SIT (Chaudhary et al., 2022; reference RaiPranav/FCL-FedSeIT) sends the server real member
documents of each task and scores task pairs by `rectified_linear_score`. Here a client releases
instead the centres of a few Lloyd steps of spherical k-means with Gaussian noise on its own
documents (research/dp_leakage.md Sec. 3.2):

    x_i      = P d_i / ||P d_i||         P: public p x dim JL matrix, N(0, 1/p) entries (`dp.sketches`)
    mu^0     = public unit vectors        a deterministic function of the public seed: no data
    for t = 1..T:
        a_i      = argmax_c <x_i, mu_c>
        [S, n]   = [sum_{a_i = c} x_i, #{i : a_i = c}]_c      (k x p sums, k counts)
        [S~, n~] = [S, n] + N(0, sigma^2 I_{kp + k})
        mu_c     = S~_c / ||S~_c||          (the previous mu_c if the noisy norm is 0)
    release [mu (k x p, row-major), n~ (k, the last step's)]

Privacy unit: one document (example level), replace-one neighbours. A client-level version would
need noise of the size of the whole data (every x_i may change), so it is refused.

Threat model: the server and anyone who sees the descriptor (each debited, same mechanism); the
client draws its own noise from the OS CSPRNG (`CryptoRandom()`), after the public P and mu^0 that
every client of a run shares. The document count n is public metadata (it decides the refusal).

Sensitivity of one step, for fixed centres mu: each a_i depends only on x_i and mu, so replacing one
unit row x (cluster a) by a unit row y (cluster b) moves [S, n] by (-x at a, +y at b, -1 at a, +1 at
b): L2 norm sqrt(1 + 1 + 1 + 1) = 2 if a != b, and ||y - x|| <= 2 with the counts unchanged if
a == b. So Delta_2 = 2 (`SENSITIVITY`; tight for y = -x).

Composition: step t's centres are post-processing of steps < t's noisy outputs, so the T steps are
an adaptive composition of T Gaussian mechanisms, each with sensitivity 2 and noise multiplier
z = sigma / 2. That composition is *exactly* one Gaussian mechanism with multiplier
z_eff = z / sqrt(T): in RDP, T alpha / (2 z^2) = alpha / (2 z_eff^2) at every order; in Gaussian DP,
T-fold mu-GDP with mu = 1/z is sqrt(T)/z-GDP (Dong, Roth & Su 2019, Cor. 3.3), with no slack.
Calibration: z_eff = dp_accounting.get_sigma_gaussian(epsilon, delta) (the analytic Gaussian
mechanism of Balle & Wang 2018 at unit sensitivity), z = z_eff sqrt(T), sigma = 2 z.

Ledger: one `GaussianMechanism(noise_multiplier=z_eff, sensitivity=2, neighbouring='replace_one')`
per observer stands for the whole release. Anyone recomputes the epsilon from that entry alone: the
privacy loss of one Gaussian mechanism with multiplier z_eff, e.g. dp_accounting's RdpAccountant
with GaussianDpEvent(z_eff) (what `Ledger` does; ~2.17 at a target of 2.0, delta 1e-5, as RDP
conversion is a little loose) or its PLD accountant (the target epsilon itself).

Usefulness, before any document is used: the noise norm in one centre's direction is about
sigma sqrt(p) / (n / k) (noise norm sigma sqrt(p) over a cluster sum of about n / k unit rows);
above `max_centroid_noise` the release is refused (`DescriptorRefused`) with the numbers.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np
from dp_accounting import get_sigma_gaussian

from dp import _mint
from dp.ledger import GaussianMechanism, Ledger, Observer, PrivacyUnit
from dp.released import Released, ReleaseRecord
from dp.rotation import Seed, seed_bytes
from dp.samplers import CryptoRandom, gaussian
from dp.sketches import projection_matrix

_INIT_DOMAIN = b"fedsecure-nlp/dp/centroid-init/v1"
MECHANISM_NAME = "dp_spherical_kmeans_gaussian"
SENSITIVITY = 2.0
"""L2 sensitivity of one step's [S, n] under replace-one of a unit row (module docstring)."""


class DescriptorRefused(ValueError):
    """The calibrated noise would swamp the centres; nothing was released or charged."""


def _real(value: object) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class CentroidConfig:
    epsilon: float = 4.0
    """For the whole release (all T steps together). FedSeIT's runs use 4 per task descriptor."""
    delta: float = 1e-5
    centres: int = 2
    """k: the number of cluster centres released (2 keeps the noise per centre low for a few hundred
    documents per task)."""
    iterations: int = 2
    """T: Lloyd steps, each on fresh noise."""
    projection_dim: int = 32
    """p: the documents are projected to this many dimensions before clustering."""
    projection_seed: Seed = 0
    """Public: every client of a run uses the same projection and initial centres."""
    max_centroid_noise: float = 0.5
    """Refuse when the expected noise in one centre's direction is above this."""
    unit: PrivacyUnit = PrivacyUnit.EXAMPLE

    def __post_init__(self) -> None:
        object.__setattr__(self, "unit", PrivacyUnit(self.unit))
        if self.unit is not PrivacyUnit.EXAMPLE:
            raise ValueError("centroid descriptors are example-level only: at client level every document may "
                             "change, so the noise would have to be of the size of the whole data")
        for name in ("centres", "iterations", "projection_dim"):
            value = getattr(self, name)
            if not isinstance(value, Integral) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
            object.__setattr__(self, name, int(value))
        for name in ("epsilon", "delta", "max_centroid_noise"):
            value = getattr(self, name)
            if not _real(value):
                raise ValueError(f"{name} must be a finite real number, got {value!r}")
            object.__setattr__(self, name, float(value))
        if not (self.epsilon > 0 and 0 < self.delta < 1 and self.max_centroid_noise > 0):
            raise ValueError(f"need epsilon > 0, 0 < delta < 1 and max_centroid_noise > 0, got epsilon="
                             f"{self.epsilon}, delta={self.delta}, max_centroid_noise={self.max_centroid_noise}")
        try:
            seed_bytes(self.projection_seed)
        except TypeError as exc:
            raise ValueError(f"projection_seed: {exc}, got {self.projection_seed!r}") from None


@dataclass(frozen=True)
class CentroidPlan:
    sigma: float
    """Per-step noise std on each of the k p + k coordinates of [S, n]."""
    noise_multiplier: float
    """z_eff: the one Gaussian mechanism the T steps compose to (what the ledger records)."""
    per_iteration_multiplier: float
    """z = z_eff sqrt(T): each step's noise multiplier (sigma / sensitivity)."""
    sensitivity: float
    centroid_noise: float
    """Expected noise norm in one centre's direction, sigma sqrt(p) / (n / k)."""


def expected_centroid_noise(*, sigma: float, projection_dim: int, centres: int, n_documents: int) -> float:
    """sigma sqrt(p) / (n / k): noise norm over the norm of a cluster sum of n / k unit rows."""
    return sigma * math.sqrt(projection_dim) * centres / n_documents


def initial_centres(*, seed: Seed, centres: int, dim: int) -> np.ndarray:
    """The public k x dim starting centres: Gaussian directions from a hash of the seed, unit rows.

    Data-independent, so they cost no privacy; a domain string separates them from the projection.
    """
    key = hashlib.sha256(_INIT_DOMAIN + b"\x00" + seed_bytes(seed)).digest()
    rows = gaussian(1.0, centres * dim, CryptoRandom(key)).reshape(centres, dim)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def cluster_statistics(x: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """[S.ravel(), n]: per-centre sums of the rows nearest (largest inner product; ties to the lowest
    index) and their counts. The function one noisy step releases: L2 sensitivity 2 on unit rows."""
    x, centres = np.asarray(x, dtype=np.float64), np.asarray(centres, dtype=np.float64)
    if x.ndim != 2 or centres.ndim != 2 or x.shape[1] != centres.shape[1] or centres.shape[0] < 1:
        raise ValueError(f"need rows (n, p) and centres (k, p), got {x.shape} and {centres.shape}")
    k = centres.shape[0]
    assign = np.argmax(x @ centres.T, axis=1)
    member = (assign[:, None] == np.arange(k)).astype(np.float64)
    return np.concatenate([(member.T @ x).ravel(), member.sum(axis=0)])


def centres_from_statistics(noisy: np.ndarray, previous: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(new unit centres, noisy counts) from a noisy [S~.ravel(), n~]: mu_c = S~_c / ||S~_c||, or the
    previous mu_c where that norm is 0 (post-processing: no privacy cost)."""
    previous = np.asarray(previous, dtype=np.float64)
    k, p = previous.shape
    noisy = np.asarray(noisy, dtype=np.float64)
    if noisy.shape != (k * p + k,):
        raise ValueError(f"expected {k * p + k} statistics for {k} centres in {p} dimensions, got {noisy.shape}")
    sums, counts = noisy[:k * p].reshape(k, p), noisy[k * p:].copy()
    norms = np.linalg.norm(sums, axis=1, keepdims=True)
    centres = np.where(norms > 0, sums / np.where(norms > 0, norms, 1.0), previous)
    return centres, counts


def rectified_linear_score(a: np.ndarray, b: np.ndarray, *, threshold: float = 0.7) -> float:
    """FedSeIT's SIT score of two descriptors (rows = centres): the sum of the pairwise cosines above
    `threshold`, over n1 * n2 (RaiPranav/FCL-FedSeIT `Server.get_top_adapts`, rectified_linear).
    A zero row has cosine 0 with everything (the reference would give NaN)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1] or 0 in a.shape or 0 in b.shape:
        raise ValueError(f"descriptors must be non-empty (n, d) arrays of the same width, got {a.shape} and {b.shape}")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b)) and _real(threshold)):
        raise ValueError("descriptors and threshold must be finite")

    def unit(m: np.ndarray) -> np.ndarray:
        norms = np.linalg.norm(m, axis=1, keepdims=True)
        return np.divide(m, norms, out=np.zeros_like(m), where=norms > 0)

    cos = unit(a) @ unit(b).T
    return float(np.where(cos > threshold, cos, 0.0).sum() / cos.size)


class DPCentroids:
    """Releases DP centres of a client's documents; one instance per run (shared public P and mu^0)."""

    def __init__(self, config: CentroidConfig, *, dim: int) -> None:
        if not isinstance(config, CentroidConfig):
            raise ValueError(f"config must be a CentroidConfig, got {type(config).__name__}")
        if not isinstance(dim, Integral) or isinstance(dim, bool) or dim < 1:
            raise ValueError(f"dim must be a positive int, got {dim!r}")
        self.config, self.dim = config, int(dim)
        self.projection = projection_matrix(seed=config.projection_seed, sketch_dim=config.projection_dim,
                                            dim=self.dim)
        self.initial = initial_centres(seed=config.projection_seed, centres=config.centres,
                                       dim=config.projection_dim)
        for array in (self.projection, self.initial):
            array.setflags(write=False)

    @property
    def payload_size(self) -> int:
        """k p + k: the centres, then the noisy counts."""
        return self.config.centres * (self.config.projection_dim + 1)

    def plan(self, *, n_documents: int) -> CentroidPlan:
        """Calibrate the noise; DescriptorRefused if the expected centre noise is above the threshold."""
        c = self.config
        if not isinstance(n_documents, Integral) or isinstance(n_documents, bool) or n_documents < 1:
            raise ValueError(f"need a positive int document count, got {n_documents!r}")
        n = int(n_documents)
        z_eff = float(get_sigma_gaussian(c.epsilon, c.delta))
        z = z_eff * math.sqrt(c.iterations)
        sigma = SENSITIVITY * z
        noise = expected_centroid_noise(sigma=sigma, projection_dim=c.projection_dim, centres=c.centres,
                                        n_documents=n)
        if noise > c.max_centroid_noise:
            raise DescriptorRefused(
                f"refusing the descriptor: at epsilon={c.epsilon}, delta={c.delta:g}, T={c.iterations} steps, "
                f"k={c.centres} centres, p={c.projection_dim} dimensions, sensitivity={SENSITIVITY}, "
                f"sigma={sigma:.4g} (z_eff={z_eff:.4g}), n={n} documents, the noise in one centre's direction "
                f"would be about {noise:.4g} > max_centroid_noise={c.max_centroid_noise}")
        return CentroidPlan(sigma=sigma, noise_multiplier=z_eff, per_iteration_multiplier=z,
                            sensitivity=SENSITIVITY, centroid_noise=noise)

    def _documents(self, documents: np.ndarray) -> np.ndarray:
        docs = np.asarray(documents, dtype=np.float64)
        if docs.ndim != 2 or docs.shape[1] != self.dim or docs.shape[0] < 1:
            raise ValueError(f"documents must be an (n, {self.dim}) array with n >= 1, got shape {docs.shape}")
        return docs

    def project(self, documents: np.ndarray) -> np.ndarray:
        """x_i = P d_i / ||P d_i||: the unit rows the mechanism clusters (ValueError on a row that is
        not finite, is zero, or projects to (numerically) zero)."""
        docs = self._documents(documents)
        if not np.all(np.isfinite(docs)):
            raise ValueError("documents must be finite")
        doc_norms = np.linalg.norm(docs, axis=1)
        if np.any(doc_norms == 0):
            raise ValueError("documents must be non-zero rows")
        x = docs @ self.projection.T
        norms = np.linalg.norm(x, axis=1, keepdims=True)
        if np.any(norms[:, 0] <= 1e-12 * doc_norms):
            raise ValueError("a document projects to zero: the public projection cannot see it")
        return x / norms

    def release(self, *, client_id: int, ledger: Ledger, documents: np.ndarray, round_id: int | None = None,
                summary_key: str = "descriptor") -> Released:
        """Centres and noisy counts of `documents` (n x dim), charged to `ledger` (module docstring).

        The refusal is decided from n alone, before any document is used; the ledger is debited
        before any noise is drawn, so a BudgetExceeded releases nothing."""
        c = self.config
        n = int(self._documents(documents).shape[0])
        plan = self.plan(n_documents=n)
        x = self.project(documents)
        charges = tuple(ledger.debit(client_id, mech, unit=c.unit, observer=obs, round_id=round_id,
                                     summary_key=summary_key) for obs, mech in self._charges(plan).items())
        noise_source = CryptoRandom()
        mu, counts = np.array(self.initial), np.zeros(c.centres)
        for _ in range(c.iterations):
            stats = cluster_statistics(x, mu)
            mu, counts = centres_from_statistics(stats + gaussian(plan.sigma, stats.shape[0], noise_source), mu)
        description = {"name": MECHANISM_NAME, "epsilon": c.epsilon, "delta": c.delta, "centres": c.centres,
                       "iterations": c.iterations, "projection_dim": c.projection_dim, "sigma": float(plan.sigma),
                       "noise_multiplier": float(plan.noise_multiplier), "sensitivity": SENSITIVITY,
                       "n_documents": n}
        return Released(payload=np.concatenate([mu.ravel(), counts]), unit=c.unit,
                        contributors=frozenset({int(client_id)}), summary_key=summary_key, mechanism=description,
                        charges=charges, round_id=round_id, _capability=_mint.MINT)

    def unpack(self, payload: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(centres k x p, noisy counts k) of a released payload."""
        values = np.asarray(payload, dtype=np.float64)
        if values.shape != (self.payload_size,):
            raise ValueError(f"a descriptor is a vector of {self.payload_size} values, got shape {values.shape}")
        k, p = self.config.centres, self.config.projection_dim
        return values[:k * p].reshape(k, p).copy(), values[k * p:].copy()

    @staticmethod
    def _charges(plan: CentroidPlan) -> dict[Observer, GaussianMechanism]:
        """What one descriptor costs, per observer: the server and outsiders see the same noisy value.
        One Gaussian at z_eff is exactly the T steps at z each (module docstring)."""
        mech = GaussianMechanism(noise_multiplier=plan.noise_multiplier, sensitivity=plan.sensitivity,
                                 neighbouring="replace_one")
        return {Observer.SERVER: mech, Observer.OUTSIDER: mech}

    def describe(self) -> dict[str, object]:
        """The public configuration both sides of a run must share (JSON-able)."""
        c = self.config
        return {"mechanism": MECHANISM_NAME, "epsilon": c.epsilon, "delta": c.delta, "unit": c.unit.value,
                "centres": c.centres, "iterations": c.iterations, "projection_dim": c.projection_dim,
                "dim": self.dim, "max_centroid_noise": c.max_centroid_noise,
                "projection_seed": seed_bytes(c.projection_seed).hex()}

    def verify(self, record: ReleaseRecord) -> dict[Observer, GaussianMechanism]:
        """Server side: the charges of a descriptor a client says it released under this configuration.

        Checks the claimed mechanism against this configuration (name, unit, epsilon, delta, k, T, p),
        the payload's shape, and recomputes the noise from the claimed document count (public
        metadata): a count this run would refuse, or a sigma or multiplier it would not use, is
        refused. Raises ValueError; nothing is charged then, and the value must not be used.
        """
        c, m = self.config, record.mechanism
        if m.get("name") != MECHANISM_NAME:
            raise ValueError(f"expected a {MECHANISM_NAME} release, got {m.get('name')!r}")
        ours = {"epsilon": c.epsilon, "delta": c.delta, "centres": c.centres, "iterations": c.iterations,
                "projection_dim": c.projection_dim}
        claimed = {key: m.get(key) for key in ours}
        if record.unit is not c.unit or any(type(claimed[key]) is not type(value) or claimed[key] != value
                                            for key, value in ours.items()):
            raise ValueError(f"descriptor released under {record.unit.value}-level {claimed}, "
                             f"this run declares {c.unit.value}-level {ours}")
        payload = np.asarray(record.payload)
        if payload.shape != (self.payload_size,) or not np.all(np.isfinite(payload)):
            raise ValueError(f"a descriptor is {self.payload_size} finite values, got shape {payload.shape}")
        n = m.get("n_documents")
        if type(n) is not int or n < 1:
            raise ValueError(f"a descriptor needs its document count (an int >= 1), got {n!r}")
        plan = self.plan(n_documents=n)  # DescriptorRefused (a ValueError) if this run would not release it
        for key, value in (("sigma", plan.sigma), ("noise_multiplier", plan.noise_multiplier),
                           ("sensitivity", plan.sensitivity)):
            got = m.get(key)
            if type(got) is not float or not math.isclose(got, value, rel_tol=1e-9):
                raise ValueError(f"claimed {key} {got!r}, this configuration gives {value!r}")
        return self._charges(plan)


__all__ = ["MECHANISM_NAME", "SENSITIVITY", "CentroidConfig", "CentroidPlan", "DPCentroids", "DescriptorRefused",
           "centres_from_statistics", "cluster_statistics", "expected_centroid_noise", "initial_centres",
           "rectified_linear_score"]
