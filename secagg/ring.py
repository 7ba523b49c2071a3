"""The finite rings secure sums live in: Z_{2^32} (SecAgg, SecAgg+) and F_p, p = 2^31 - 1 (LightSecAgg).

Every vector on the wire is uint32. Arithmetic is done in place, chunk by chunk, so a round never
allocates more than one extra chunk per operation.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MERSENNE_31 = (1 << 31) - 1


_REDUCE_BLOCK = 1 << 16
"""Words reduced at a time by a prime field's add_ / sub_: their temporary is one block, not the vector."""


def _fold_min_(acc: np.ndarray, op, m: np.uint32) -> None:
    """acc <- min(acc, op(acc, m)) in place, a block at a time for a contiguous acc (a d-long temporary at
    d = 1e8 would be 400 MB beside a server's running sum)."""
    flat = acc.reshape(-1) if acc.flags.c_contiguous else None
    if flat is None or flat.size <= _REDUCE_BLOCK:
        np.minimum(acc, op(acc, m), out=acc)
        return
    tmp = np.empty(_REDUCE_BLOCK, dtype=np.uint32)
    for start in range(0, flat.size, _REDUCE_BLOCK):
        block = flat[start : start + _REDUCE_BLOCK]
        scratch = tmp[: block.size]
        op(block, m, out=scratch)
        np.minimum(block, scratch, out=block)


@dataclass(frozen=True)
class Ring:
    """Z_m for m = 2^32 or a prime m < 2^31, with uint32 representatives in [0, m)."""

    modulus: int

    def __post_init__(self) -> None:
        if self.modulus != 1 << 32 and not (2 < self.modulus < 1 << 31):
            raise ValueError(f"modulus must be 2^32 or a prime below 2^31, got {self.modulus}")

    @property
    def is_power_of_two(self) -> bool:
        return self.modulus == 1 << 32

    @property
    def half(self) -> int:
        """Signed values in [-half, half) are representable without ambiguity."""
        return self.modulus // 2

    def add_(self, acc: np.ndarray, x: np.ndarray) -> np.ndarray:
        """acc <- acc + x (mod m), in place; both uint32 in [0, m)."""
        np.add(acc, x, out=acc)
        if not self.is_power_of_two:
            # Both < m < 2^31, so the sum fits in uint32; min(s, s - m) picks the reduced value
            # because s - m wraps to a huge number exactly when s < m.
            _fold_min_(acc, np.subtract, np.uint32(self.modulus))
        return acc

    def sub_(self, acc: np.ndarray, x: np.ndarray) -> np.ndarray:
        """acc <- acc - x (mod m), in place."""
        if self.is_power_of_two:
            np.subtract(acc, x, out=acc)
            return acc
        np.subtract(acc, x, out=acc)  # wraps when acc < x; adding m back fixes it below
        _fold_min_(acc, np.add, np.uint32(self.modulus))
        return acc

    def neg(self, x: np.ndarray) -> np.ndarray:
        out = np.zeros_like(x)
        return self.sub_(out, x)

    def from_signed(self, v: np.ndarray) -> np.ndarray:
        """int64 values in [-half, half) -> uint32 representatives."""
        return np.mod(v, self.modulus).astype(np.uint32)

    def to_signed(self, r: np.ndarray) -> np.ndarray:
        """uint32 representatives -> int64 in [-half, half) (centred lift)."""
        v = r.astype(np.int64)
        v[v >= self.modulus - self.half] -= self.modulus
        return v

    def validate(self, x: np.ndarray, *, length: int) -> None:
        """Raise ValueError unless x is a uint32 vector of the given length with entries < m."""
        if not isinstance(x, np.ndarray) or x.dtype != np.uint32 or x.ndim != 1:
            raise ValueError("ring vectors are one-dimensional uint32 arrays")
        if x.shape[0] != length:
            raise ValueError(f"ring vector has length {x.shape[0]}, expected {length}")
        if not self.is_power_of_two and x.size and int(x.max()) >= self.modulus:
            raise ValueError("ring vector has entries outside [0, p)")


RING_2_32 = Ring(1 << 32)
FIELD_P31 = Ring(MERSENNE_31)
