"""DP Johnson-Lindenstrauss sketches of a per-client summary, with an explicit privacy unit.

Mechanism (Kenthapadi et al. arXiv 1204.2606): a public k x d matrix P with N(0, 1/k) entries,
s = clip_C(P x), release s + N(0, sigma^2 I_k), sigma from the analytic Gaussian mechanism
(Balle & Wang 2018, via dp_accounting.get_sigma_gaussian) at (epsilon, delta).

Sensitivity depends on the privacy unit (research/dp_leakage.md Sec. 3.1):
* 'client' (the whole summary may change, replace-one): 2C;
* 'example' with x = mean of n unit-norm documents: replacing one document moves x by at most
  2/n, hence P x by at most 2 ||P||_op / n (||P||_op computed exactly for the public P; clipping
  is 1-Lipschitz), capped at 2C. The research note quotes 2/n, which silently assumes ||P||_op <= 1;
  a Gaussian P has ||P||_op ~ 1 + sqrt(d/k), so we charge the honest bound.

Usefulness check, before any data is touched: for two sketches of norm C, the inner product of
their noisy versions has std sqrt(2 sigma^2 C^2 + k sigma^4); divided by C^2 this is the noise std
of their cosine similarity. Releases above `max_cosine_noise_std` are refused with the numbers:
at client level, epsilon 8, k = 64 it is ~12 (useless), at example level with n = 1000 it is ~0.01.
(The refusal depends on n, the client's document count; n is treated as public metadata.)
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

_DOMAIN = b"fedsecure-nlp/dp/jl-projection/v1"
MECHANISM_NAME = "jl_sketch_gaussian"


class SketchRefused(ValueError):
    """The calibrated noise would make the sketch useless for similarity; nothing was released."""


@dataclass(frozen=True)
class SketchConfig:
    epsilon: float
    delta: float = 1e-5
    unit: PrivacyUnit = PrivacyUnit.EXAMPLE
    sketch_dim: int = 64
    clip: float = 1.0
    """C: the projected sketch is clipped to this L2 norm."""
    max_cosine_noise_std: float = 0.1
    projection_seed: Seed = 0
    """Public: every client of a run must use the same projection."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "unit", PrivacyUnit(self.unit))
        if not (self.epsilon > 0 and 0 < self.delta < 1 and self.sketch_dim >= 1 and self.clip > 0
                and self.max_cosine_noise_std > 0):
            raise ValueError("need epsilon > 0, 0 < delta < 1, sketch_dim >= 1, clip > 0, threshold > 0")


@dataclass(frozen=True)
class SketchPlan:
    sensitivity: float
    sigma: float
    cosine_noise_std: float

    @property
    def noise_multiplier(self) -> float:
        return self.sigma / self.sensitivity


def projection_matrix(*, seed: Seed, sketch_dim: int, dim: int) -> np.ndarray:
    """The public k x d JL matrix with N(0, 1/k) entries, a deterministic function of the seed."""
    key = hashlib.sha256(_DOMAIN + b"\x00" + seed_bytes(seed)).digest()
    return gaussian(1.0 / math.sqrt(sketch_dim), sketch_dim * dim, CryptoRandom(key)).reshape(sketch_dim, dim)


def cosine_noise_std(*, sigma: float, sketch_dim: int, clip: float) -> float:
    """Std of the cosine noise between two noisy sketches of norm `clip`."""
    return math.sqrt(2.0 * sigma**2 * clip**2 + sketch_dim * sigma**4) / clip**2


class DPSketcher:
    """Releases DP sketches of d-dimensional summaries; one instance per run (shared projection)."""

    def __init__(self, config: SketchConfig, *, dim: int) -> None:
        self.config = config
        self.dim = dim
        self.projection = projection_matrix(seed=config.projection_seed, sketch_dim=config.sketch_dim, dim=dim)
        self.projection.setflags(write=False)
        self.operator_norm = float(np.linalg.norm(self.projection, 2))

    def sensitivity(self, *, n_documents: int | None = None) -> float:
        c = self.config
        if c.unit is PrivacyUnit.CLIENT:
            return 2.0 * c.clip
        if n_documents is None or n_documents < 1:
            raise ValueError("example-level sketches need the number of documents averaged")
        return min(2.0 * c.clip, 2.0 * self.operator_norm / n_documents)

    def plan(self, *, n_documents: int | None = None) -> SketchPlan:
        """Calibrate the noise; raise SketchRefused if the similarity noise is above threshold."""
        c = self.config
        delta_2 = self.sensitivity(n_documents=n_documents)
        sigma = get_sigma_gaussian(c.epsilon, c.delta) * delta_2
        std = cosine_noise_std(sigma=sigma, sketch_dim=c.sketch_dim, clip=c.clip)
        if std > c.max_cosine_noise_std:
            raise SketchRefused(
                f"refusing the {c.unit.value}-level sketch: at epsilon={c.epsilon}, delta={c.delta:g}, "
                f"sensitivity={delta_2:.4g}, sigma={sigma:.4g}, k={c.sketch_dim}, the cosine-similarity noise "
                f"std would be {std:.4g} > {c.max_cosine_noise_std} (useless for similarity)")
        return SketchPlan(sensitivity=delta_2, sigma=sigma, cosine_noise_std=std)

    def release(self, *, client_id: int, ledger: Ledger, documents: np.ndarray | None = None,
                summary: np.ndarray | None = None, round_id: int | None = None,
                summary_key: str = "jl-sketch") -> Released:
        """Sketch a client's mean document embedding (`documents`, n x d, rows normalised here) or,
        at client level only, an arbitrary `summary` vector. Debits the ledger, returns Released."""
        c = self.config
        if (documents is None) == (summary is None):
            raise ValueError("pass exactly one of documents and summary")
        if documents is not None:
            docs = np.asarray(documents, dtype=np.float64)
            if docs.ndim != 2 or docs.shape[1] != self.dim or docs.shape[0] < 1:
                raise ValueError(f"documents must be an (n, {self.dim}) array with n >= 1")
            norms = np.linalg.norm(docs, axis=1, keepdims=True)
            if not np.all(np.isfinite(docs)) or np.any(norms == 0):
                raise ValueError("documents must be finite and non-zero")
            x, n = (docs / norms).mean(axis=0), docs.shape[0]
        else:
            if c.unit is not PrivacyUnit.CLIENT:
                raise ValueError("an example-level sketch needs the documents, not a precomputed summary")
            x, n = np.asarray(summary, dtype=np.float64), None
            if x.shape != (self.dim,) or not np.all(np.isfinite(x)):
                raise ValueError(f"summary must be a finite vector of length {self.dim}")
        plan = self.plan(n_documents=n)
        s = self.projection @ x
        norm = float(np.linalg.norm(s))
        if norm > c.clip:
            s *= c.clip / norm
        charges = tuple(ledger.debit(client_id, mech, unit=c.unit, observer=obs, round_id=round_id,
                                     summary_key=summary_key) for obs, mech in self._charges(plan).items())
        noisy = s + gaussian(plan.sigma, s.shape[0], CryptoRandom())
        description = {"name": MECHANISM_NAME, "epsilon": c.epsilon, "delta": c.delta,
                       "sigma": plan.sigma, "sensitivity": plan.sensitivity, "sketch_dim": c.sketch_dim,
                       "clip": c.clip, "cosine_noise_std": plan.cosine_noise_std, "n_documents": n}
        return Released(payload=noisy, unit=c.unit, contributors=frozenset({int(client_id)}),
                        summary_key=summary_key, mechanism=description, charges=charges, round_id=round_id,
                        _capability=_mint.MINT)

    @staticmethod
    def _charges(plan: SketchPlan) -> dict[Observer, GaussianMechanism]:
        """What one sketch costs, per observer: the server and outsiders see the same noisy value."""
        mech = GaussianMechanism(noise_multiplier=plan.noise_multiplier, sensitivity=plan.sensitivity,
                                 neighbouring="replace_one")
        return {Observer.SERVER: mech, Observer.OUTSIDER: mech}

    def describe(self) -> dict[str, object]:
        """The public configuration both sides of a run must share (JSON-able)."""
        c = self.config
        return {"mechanism": MECHANISM_NAME, "epsilon": c.epsilon, "delta": c.delta, "unit": c.unit.value,
                "sketch_dim": c.sketch_dim, "clip": c.clip, "dim": self.dim,
                "max_cosine_noise_std": c.max_cosine_noise_std, "projection_seed": seed_bytes(c.projection_seed).hex()}

    def verify(self, record: ReleaseRecord) -> dict[Observer, GaussianMechanism]:
        """Server side: the charges of a sketch a client says it released under this configuration.

        Checks the claimed mechanism against this sketcher's own (name, unit, epsilon, delta, k,
        clip), the payload's shape, and recomputes the noise from the claimed document count (public
        metadata): a sigma or sensitivity that is not what this configuration gives is refused.
        Raises ValueError; nothing is charged then, and the value must not be used.
        """
        c, m = self.config, record.mechanism
        if m.get("name") != MECHANISM_NAME:
            raise ValueError(f"expected a {MECHANISM_NAME} release, got {m.get('name')!r}")
        claimed = {k: m.get(k) for k in ("epsilon", "delta", "sketch_dim", "clip")}
        ours = {"epsilon": c.epsilon, "delta": c.delta, "sketch_dim": c.sketch_dim, "clip": c.clip}
        if record.unit is not c.unit or claimed != ours:
            raise ValueError(f"sketch released under {record.unit.value}-level {claimed}, "
                             f"this run declares {c.unit.value}-level {ours}")
        if record.payload.shape != (c.sketch_dim,):
            raise ValueError(f"a sketch has {c.sketch_dim} values, got {record.payload.shape[0]}")
        n = m.get("n_documents")
        if c.unit is PrivacyUnit.CLIENT:
            if n is not None:
                raise ValueError("a client-level sketch claims no document count")
        elif type(n) is not int or n < 1:
            raise ValueError(f"an example-level sketch needs its document count, got {n!r}")
        plan = self.plan(n_documents=n)  # SketchRefused (a ValueError) if this run would not release it
        for key, value in (("sigma", plan.sigma), ("sensitivity", plan.sensitivity)):
            got = m.get(key)
            if type(got) is not float or not math.isclose(got, value, rel_tol=1e-9):
                raise ValueError(f"claimed {key} {got!r}, this configuration gives {value!r}")
        return self._charges(plan)
