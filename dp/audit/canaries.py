"""Canary updates and the cosine statistic (Andrew et al., ICLR 2024).

A canary client's update is a random isotropic unit direction, drawn from a generator seeded by
the auditor (the auditor knows every canary; the mechanism treats them as any client). The
statistic is the cosine between a canary's direction and what an outside observer sees of the
model: the total delta of the final model ('final model' threat model) and each round's delta
('all iterates' threat model, where a canary's score is its largest cosine over the rounds).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

STATISTICS = ("final", "all_iterates")


def canary_directions(*, count: int, dim: int, seed: int | Sequence[int], orthogonal: bool = False) -> np.ndarray:
    """`count` unit vectors of length `dim` (rows), isotropic, from a generator seeded by `seed`.

    `orthogonal`: a Haar-random orthonormal set (count <= dim). Each vector is still uniform on the
    sphere, and the canaries then leave no trace on each other's scores (at small `dim`, independent
    canaries' mutual cosines, of order 1/sqrt(dim), would blur the signal)."""
    if count < 0 or dim < 1:
        raise ValueError(f"need count >= 0 and dim >= 1, got {count}, {dim}")
    rng = np.random.default_rng(seed)
    g = rng.standard_normal((count, dim))
    if not orthogonal:
        return g / np.linalg.norm(g, axis=1, keepdims=True)
    if count > dim:
        raise ValueError(f"{count} orthogonal canaries do not fit in {dim} dimensions")
    q, r = np.linalg.qr(g.T)
    return (q * np.where(np.diag(r) < 0, -1.0, 1.0)).T  # the sign fix makes the frame Haar-distributed


def cosines(directions: np.ndarray, released: np.ndarray) -> np.ndarray:
    """Cosine of every direction (unit rows) with each released vector: shape (canaries,) for one
    vector, (canaries, rounds) for a stack of rows. A zero vector (nothing released) scores 0."""
    released = np.asarray(released, dtype=np.float64)
    single = released.ndim == 1
    rows = released[None, :] if single else released
    norms = np.linalg.norm(rows, axis=1)
    dots = directions @ rows.T
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(norms > 0, dots / np.where(norms > 0, norms, 1.0), 0.0)
    return out[:, 0] if single else out


def canary_scores(directions: np.ndarray, deltas: np.ndarray) -> dict[str, np.ndarray]:
    """{'final': cosine with the sum of the round deltas, 'all_iterates': the largest per-round cosine}
    for `deltas` of shape (rounds, dim), one row per round (zeros where a round released nothing)."""
    deltas = np.atleast_2d(np.asarray(deltas, dtype=np.float64))
    per_round = cosines(directions, deltas)
    return {"final": cosines(directions, deltas.sum(axis=0)), "all_iterates": per_round.max(axis=1)}


__all__ = ["STATISTICS", "canary_directions", "cosines", "canary_scores"]
