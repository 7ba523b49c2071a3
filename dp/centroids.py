"""DP cluster centres of one client's documents: a task descriptor the server may compare tasks by.

FedSeIT's SIT (Chaudhary et al., 2022; reference RaiPranav/FCL-FedSeIT ``data/utils.cluster``) sends
the server up to 200 real member documents per task (k-medoids over mean GloVe vectors). Here a client
releases instead the centres of a few Lloyd steps of spherical k-means with Gaussian noise
(research/dp_leakage.md Sec. 3.2, run on one client's own documents):

    x_i     = P d_i / ||P d_i||          P: public p x dim JL matrix, N(0, 1/p) entries (`dp.sketches`)
    mu^0    = public unit vectors         (a deterministic function of the public seed: no data)
    for s = 1..T:
        a_i   = argmax_c <x_i, mu_c>
        [S, n] = [sum_{a_i = c} x_i , #{a_i = c}]_c        (k x p sums, k counts)
        [S~, n~] = [S, n] + N(0, sigma^2 I)
        mu_c  = S~_c / ||S~_c||           (kept if the noisy norm is 0)
    release [mu (k x p), n~ (k)]

Privacy unit: one document (example level), replace-one neighbours. Threat model: the server and
anyone who sees the descriptor (both charged); the client draws its own noise from the OS CSPRNG.

Sensitivity of one step, for fixed centres: replacing a unit row x (cluster a) by y (cluster b) moves
[S, n] by (-x at a, +y at b, -1 at a, +1 at b): L2 norm sqrt(1 + 1 + 1 + 1) = 2 if a != b, and
||y - x|| <= 2 with the counts unchanged if a == b. So Delta_2 = 2. Each step's centres are
post-processing of earlier noisy outputs, so the T steps are an adaptive composition of T Gaussian
mechanisms with noise multiplier z = sigma / 2; that composition is *exactly* one Gaussian mechanism
with multiplier z_eff = z / sqrt(T) (RDP: T alpha / (2 z^2) = alpha / (2 z_eff^2); likewise in
Gaussian DP, Dong-Roth-Su 2019). Calibration: z_eff = dp_accounting.get_sigma_gaussian(epsilon, delta)
(the analytic Gaussian mechanism at unit sensitivity), z = z_eff sqrt(T), sigma = 2 z. The ledger
records one `GaussianMechanism(noise_multiplier=z_eff, sensitivity=2, replace_one)` per observer:
anyone recomputes the epsilon from that entry alone (the ledger's RDP composition is at least the
analytic epsilon asked for).

Usefulness, before touching data: the noise norm in one centre direction is about
sigma sqrt(p) / (n / k); above `max_centroid_noise` the release is refused (`DescriptorRefused`) with
the numbers. n (the document count) is public metadata.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

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


class DescriptorRefused(ValueError):
    """The calibrated noise would swamp the centres; nothing was released or charged."""


@dataclass(frozen=True)
class CentroidConfig:
    epsilon: float = 4.0
    """For the whole release (all T steps)."""
    delta: float = 1e-5
    centres: int = 2
    iterations: int = 2
    projection_dim: int = 32
    projection_seed: Seed = 0
    """Public: every client of a run uses the same projection and initial centres."""
    max_centroid_noise: float = 0.5
    unit: PrivacyUnit = PrivacyUnit.EXAMPLE

    def __post_init__(self) -> None:
        object.__setattr__(self, "unit", PrivacyUnit(self.unit))
        if self.unit is not PrivacyUnit.EXAMPLE:
            raise ValueError("centroid descriptors are example-level only: at client level the noise would have "
                             "the size of the whole data")
        for name in ("centres", "iterations", "projection_dim"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not (self.epsilon > 0 and math.isfinite(self.epsilon) and 0 < self.delta < 1 and self.max_centroid_noise > 0):
            raise ValueError("need a finite epsilon > 0, 0 < delta < 1 and max_centroid_noise > 0")


@dataclass(frozen=True)
class CentroidPlan:
    sigma: float
    """Per-step noise std on each coordinate of [S, n]."""
    noise_multiplier: float
    """z_eff: the one Gaussian mechanism the T steps compose to (what the ledger records)."""
    per_step_multiplier: float
    centroid_noise: float
    sensitivity: float = SENSITIVITY


def initial_centres(*, seed: Seed, centres: int, dim: int) -> np.ndarray:
    """The public k x p starting centres: Gaussian directions from a hash of the seed, unit rows."""
    key = hashlib.sha256(_INIT_DOMAIN + b"\x00" + seed_bytes(seed)).digest()
    rows = gaussian(1.0, centres * dim, CryptoRandom(key)).reshape(centres, dim)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def cluster_statistics(x: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """[S.ravel(), n]: per-centre sums of the rows nearest (by inner product) and their counts."""
    assign = np.argmax(x @ centres.T, axis=1)
    k = centres.shape[0]
    sums = np.zeros_like(centres)
    np.add.at(sums, assign, x)
    return np.concatenate([sums.ravel(), np.bincount(assign, minlength=k).astype(np.float64)])


def rectified_linear_score(a: np.ndarray, b: np.ndarray, *, threshold: float = 0.7) -> float:
    """SIT's score of two descriptors (rows = centres): sum of the pairwise cosines above `threshold`
    over n1 * n2 (the reference's ``rectified_linear``); a zero row has cosine 0 with everything."""
    a, b = np.atleast_2d(np.asarray(a, dtype=np.float64)), np.atleast_2d(np.asarray(b, dtype=np.float64))
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1] or not a.size or not b.size:
        raise ValueError(f"descriptors must be (n, d) arrays of the same width, got {a.shape} and {b.shape}")

    def unit(m: np.ndarray) -> np.ndarray:
        norms = np.linalg.norm(m, axis=1, keepdims=True)
        return np.divide(m, norms, out=np.zeros_like(m), where=norms > 0)

    cos = unit(a) @ unit(b).T
    return float(np.where(cos > threshold, cos, 0.0).sum() / cos.size)


class DPCentroids:
    """Releases DP centres of a client's documents; one instance per run (shared public P and mu^0)."""

    def __init__(self, config: CentroidConfig, *, dim: int) -> None:
        if type(dim) is not int or dim < 1:
            raise ValueError(f"dim must be a positive int, got {dim!r}")
        self.config, self.dim = config, dim
        self.projection = projection_matrix(seed=config.projection_seed, sketch_dim=config.projection_dim, dim=dim)
        self.initial = initial_centres(seed=config.projection_seed, centres=config.centres, dim=config.projection_dim)
        for array in (self.projection, self.initial):
            array.setflags(write=False)

    @property
    def payload_size(self) -> int:
        return self.config.centres * (self.config.projection_dim + 1)

    def plan(self, *, n_documents: int) -> CentroidPlan:
        """Calibrate; DescriptorRefused if the expected centre noise is above the threshold."""
        c = self.config
        if type(n_documents) is not int or n_documents < 1:
            raise ValueError(f"need a positive document count, got {n_documents!r}")
        z_eff = get_sigma_gaussian(c.epsilon, c.delta)
        z = z_eff * math.sqrt(c.iterations)
        sigma = SENSITIVITY * z
        noise = sigma * math.sqrt(c.projection_dim) * c.centres / n_documents
        if noise > c.max_centroid_noise:
            raise DescriptorRefused(
                f"refusing the descriptor: at epsilon={c.epsilon}, delta={c.delta:g}, {c.iterations} steps, "
                f"{c.centres} centres in {c.projection_dim} dimensions, sigma={sigma:.4g}, n={n_documents} documents, "
                f"the noise in one centre would be about {noise:.3g} > {c.max_centroid_noise}")
        return CentroidPlan(sigma=sigma, noise_multiplier=z_eff, per_step_multiplier=z, centroid_noise=noise)

    def project(self, documents: np.ndarray) -> np.ndarray:
        docs = np.asarray(documents, dtype=np.float64)
        if docs.ndim != 2 or docs.shape[1] != self.dim or docs.shape[0] < 1 or not np.all(np.isfinite(docs)):
            raise ValueError(f"documents must be a finite (n, {self.dim}) array with n >= 1")
        x = docs @ self.projection.T
        norms = np.linalg.norm(x, axis=1, keepdims=True)
        if np.any(norms == 0):
            raise ValueError("a document projects to zero (empty or all-zero row)")
        return x / norms

    def release(self, *, client_id: int, ledger: Ledger, documents: np.ndarray, round_id: int | None = None,
                summary_key: str = "descriptor") -> Released:
        """Centres and noisy counts of `documents` (n x dim), charged to `ledger`; see the module docstring."""
        c = self.config
        x = self.project(documents)
        plan = self.plan(n_documents=int(x.shape[0]))
        charges = tuple(ledger.debit(client_id, mech, unit=c.unit, observer=obs, round_id=round_id,
                                     summary_key=summary_key) for obs, mech in self._charges(plan).items())
        noise_source = CryptoRandom()
        mu = np.array(self.initial)
        counts = np.zeros(c.centres)
        for _ in range(c.iterations):
            stats = cluster_statistics(x, mu)
            stats = stats + gaussian(plan.sigma, stats.shape[0], noise_source)
            sums, counts = stats[:-c.centres].reshape(c.centres, c.projection_dim), stats[-c.centres:]
            norms = np.linalg.norm(sums, axis=1, keepdims=True)
            mu = np.where(norms > 0, sums / np.where(norms > 0, norms, 1.0), mu)
        description = {"name": MECHANISM_NAME, "epsilon": float(c.epsilon), "delta": float(c.delta),
                       "centres": c.centres, "iterations": c.iterations, "projection_dim": c.projection_dim,
                       "sigma": float(plan.sigma), "noise_multiplier": float(plan.noise_multiplier),
                       "sensitivity": SENSITIVITY, "n_documents": int(x.shape[0])}
        return Released(payload=np.concatenate([mu.ravel(), counts]), unit=c.unit,
                        contributors=frozenset({int(client_id)}), summary_key=summary_key, mechanism=description,
                        charges=charges, round_id=round_id, _capability=_mint.MINT)

    def unpack(self, payload: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(centres k x p, noisy counts k) of a released payload."""
        values = np.asarray(payload, dtype=np.float64).ravel()
        if values.shape != (self.payload_size,):
            raise ValueError(f"a descriptor has {self.payload_size} values, got {values.shape[0]}")
        k, p = self.config.centres, self.config.projection_dim
        return values[:k * p].reshape(k, p), values[k * p:]

    @staticmethod
    def _charges(plan: CentroidPlan) -> dict[Observer, GaussianMechanism]:
        mech = GaussianMechanism(noise_multiplier=plan.noise_multiplier, sensitivity=SENSITIVITY,
                                 neighbouring="replace_one")
        return {Observer.SERVER: mech, Observer.OUTSIDER: mech}

    def describe(self) -> dict[str, object]:
        c = self.config
        return {"mechanism": MECHANISM_NAME, "epsilon": c.epsilon, "delta": c.delta, "unit": c.unit.value,
                "centres": c.centres, "iterations": c.iterations, "projection_dim": c.projection_dim, "dim": self.dim,
                "max_centroid_noise": c.max_centroid_noise, "projection_seed": seed_bytes(c.projection_seed).hex()}

    def verify(self, record: ReleaseRecord) -> dict[Observer, GaussianMechanism]:
        """Server side: the charges of a descriptor a client says it released under this configuration
        (name, unit, parameters, payload shape, noise recomputed from the public document count).
        ValueError if anything differs; nothing is charged then."""
        c, m = self.config, record.mechanism
        if m.get("name") != MECHANISM_NAME:
            raise ValueError(f"expected a {MECHANISM_NAME} release, got {m.get('name')!r}")
        claimed = {k: m.get(k) for k in ("epsilon", "delta", "centres", "iterations", "projection_dim")}
        ours = {"epsilon": c.epsilon, "delta": c.delta, "centres": c.centres, "iterations": c.iterations,
                "projection_dim": c.projection_dim}
        if record.unit is not c.unit or claimed != ours:
            raise ValueError(f"descriptor released under {record.unit.value}-level {claimed}, "
                             f"this run declares {c.unit.value}-level {ours}")
        payload = np.asarray(record.payload)
        if payload.shape != (self.payload_size,) or not np.all(np.isfinite(payload)):
            raise ValueError(f"a descriptor is {self.payload_size} finite values, got shape {payload.shape}")
        n = m.get("n_documents")
        if type(n) is not int or n < 1:
            raise ValueError(f"a descriptor needs its document count, got {n!r}")
        plan = self.plan(n_documents=n)
        for key, value in (("sigma", plan.sigma), ("noise_multiplier", plan.noise_multiplier)):
            got = m.get(key)
            if type(got) is not float or not math.isclose(got, value, rel_tol=1e-9):
                raise ValueError(f"claimed {key} {got!r}, this configuration gives {value!r}")
        return self._charges(plan)


__all__ = ["MECHANISM_NAME", "SENSITIVITY", "DescriptorRefused", "CentroidConfig", "CentroidPlan", "initial_centres",
           "cluster_statistics", "rectified_linear_score", "DPCentroids"]
