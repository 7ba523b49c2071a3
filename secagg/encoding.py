"""Fixed-point encoding of weighted float vectors into a ring, with a checked bit budget.

A client with weight w and vector x uploads enc = [q(w), q(w * clip_c(x))]. Quantisation is
stochastic rounding (unbiased) driven by an AES-CTR stream keyed from the OS CSPRNG. The scales
are chosen so that the sum over up to `max_clients` clients can never wrap: every encoded value
v satisfies |v| <= half / max_clients - 1, hence |sum| < half. The decoded weighted mean is
sum(w x) / sum(w).

The guarantee holds only up to `max_clients` summands: one more can wrap (the bound is tight for
small counts), so `decode` refuses a stated contributor count above it, and the secure layer
refuses such a cohort when the round is configured (`SecureAggregator.check_members`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from secagg.prg import CryptoRandom
from secagg.ring import RING_2_32, Ring

_CHUNK = 1 << 16


class BitBudgetError(ValueError):
    """The configured range, weight and client count cannot be summed in the ring without wrap."""


class TooManySummandsError(ValueError):
    """More summands than the encoding's `max_clients`: their ring sum may have wrapped."""


@dataclass(frozen=True)
class EncodingConfig:
    clip: float = 8.0
    """Each coordinate of x is clipped to [-clip, clip] (the count of clipped values is reported)."""
    max_weight: float = 1.0
    """Largest aggregation weight a client may send (e.g. its example count, or 1.0 if normalised)."""
    max_clients: int = 1000
    """Largest number of summands; the scales are set so that this many never wrap."""
    min_resolution: float | None = None
    """If set, refuse unless the quantisation step of one coordinate is at most this."""

    def __post_init__(self) -> None:
        if not self.clip > 0:
            raise ValueError(f"clip must be positive, got {self.clip}")
        if not self.max_weight > 0:
            raise ValueError(f"max_weight must be positive, got {self.max_weight}")
        if self.max_clients < 1:
            raise ValueError("max_clients must be at least 1")


@dataclass(frozen=True)
class EncodeReport:
    clipped: int
    """How many coordinates of x were outside [-clip, clip] and were clipped."""


@dataclass(frozen=True)
class Decoded:
    mean: np.ndarray
    total_weight: float
    weighted_sum: np.ndarray


class FixedPointEncoder:
    """Encode (w, x) -> uint32 ring vector of length d + 1; decode ring sums back to floats."""

    def __init__(self, config: EncodingConfig, *, ring: Ring = RING_2_32) -> None:
        self.config = config
        self.ring = ring
        per_client = ring.half // config.max_clients - 1  # largest |encoded value| allowed
        if per_client < 1:
            raise BitBudgetError(
                f"ring of {ring.modulus.bit_length() - 1} bits cannot hold a sum of "
                f"{config.max_clients} clients: at most {ring.half // 2} summands fit"
            )
        # |w * x * scale| + 1 (rounding) <= per_client
        self.value_scale = (per_client - 1) / (config.max_weight * config.clip)
        self.weight_scale = (per_client - 1) / config.max_weight
        if self.value_scale <= 0 or self.weight_scale <= 0:
            raise BitBudgetError("no quantisation levels left after reserving the rounding margin")
        step = 1.0 / self.value_scale
        if config.min_resolution is not None and step > config.min_resolution:
            raise BitBudgetError(
                f"quantisation step {step:.3g} exceeds the required {config.min_resolution:.3g}: "
                f"{config.max_clients} clients x weight {config.max_weight} x range {config.clip} "
                f"leave only {per_client} levels per value in a {ring.modulus.bit_length() - 1}-bit ring; "
                "lower max_clients, max_weight or clip"
            )

    @property
    def step(self) -> float:
        """Quantisation step of one coordinate of w * x."""
        return 1.0 / self.value_scale

    def mean_error_bound(self, *, n_clients: int, total_weight: float) -> float:
        """Worst-case absolute error of a decoded mean coordinate (rounding only, clipping aside).

        Each client's rounding error is below one step in the numerator and in the weight, so
        |mean - exact| <= n (step_x + |mean| step_w) / (W - n step_w) with |mean| <= clip.
        """
        sx, sw = 1.0 / self.value_scale, 1.0 / self.weight_scale
        return n_clients * (sx + self.config.clip * sw) / max(total_weight - n_clients * sw, 1e-300)

    def encode(self, x: np.ndarray, *, weight: float, rounding_key: bytes | None = None) -> tuple[np.ndarray, EncodeReport]:
        """`rounding_key` (32 bytes) makes the stochastic rounding reproducible: tests only; the
        default draws a fresh OS-random key, so nobody can predict a client's rounding."""
        x = np.asarray(x)
        if x.ndim != 1:
            raise ValueError("encode expects a flat vector")
        if not np.all(np.isfinite(x)):
            raise ValueError("input contains NaN or infinity")
        if not 0 < weight <= self.config.max_weight:
            raise ValueError(f"weight {weight} outside (0, {self.config.max_weight}]")
        d = x.shape[0]
        out = np.empty(d + 1, dtype=np.uint32)
        rng = CryptoRandom(rounding_key)
        out[:1] = self._round(np.array([weight * self.weight_scale]), rng)
        c = self.config.clip
        clipped = 0
        factor = weight * self.value_scale
        v = np.empty(min(_CHUNK, max(d, 1)), dtype=np.float64)
        for s in range(0, d, _CHUNK):
            chunk = x[s : s + _CHUNK]
            n = chunk.shape[0]
            clipped += int(np.count_nonzero(np.abs(chunk) > c))
            vv = v[:n]
            np.clip(chunk, -c, c, out=vv)
            vv *= factor
            out[1 + s : 1 + s + n] = self._round(vv, rng)
        return out, EncodeReport(clipped=clipped)

    def _round(self, v: np.ndarray, rng: CryptoRandom) -> np.ndarray:
        """Stochastic rounding of float64 v (overwritten) to ring representatives: floor(v + u).

        With u uniform on [0, 1), floor(v + u) = ceil(v) with probability frac(v), so the rounding is
        unbiased; u has 32 random bits, and |v| < 2^31 keeps at least 21 of them in the sum, so the
        residual bias is below 2^-21 of one quantisation step.
        """
        v += rng.words(v.shape[0], np.uint32) * (1.0 / 4294967296.0)
        np.floor(v, out=v)
        q = v.astype(np.int64)
        if self.ring.is_power_of_two:
            return q.astype(np.uint32)  # two's complement truncation is reduction mod 2^32
        return np.mod(q, self.ring.modulus).astype(np.uint32)

    def check_count(self, n_clients: int) -> None:
        """Refuse a sum of more than `max_clients` encodings: the no-wrap guarantee stops there."""
        if isinstance(n_clients, bool) or not isinstance(n_clients, (int, np.integer)) or n_clients < 1:
            raise ValueError(f"a contributor count is a positive int, got {n_clients!r}")
        if n_clients > self.config.max_clients:
            raise TooManySummandsError(
                f"{n_clients} contributors exceed the encoding's max_clients={self.config.max_clients}: "
                "their fixed-point sum may have wrapped around the ring; raise max_clients or shrink the cohort")

    def decode(self, ring_sum: np.ndarray, *, n_clients: int | None = None) -> Decoded:
        """Weighted mean from the ring sum of encoded vectors.

        `n_clients` (how many encodings were summed) is checked against `max_clients` first: the
        secure layer always passes it; None skips the check (a caller that cannot know the count)."""
        if n_clients is not None:
            self.check_count(n_clients)
        signed = self.ring.to_signed(ring_sum)
        total_w = float(signed[0]) / self.weight_scale
        if total_w <= 0:
            raise ValueError("decoded total weight is not positive: no contributions or corrupted sum")
        wsum = signed[1:].astype(np.float64) / self.value_scale
        return Decoded(mean=wsum / total_w, total_weight=total_w, weighted_sum=wsum)


