"""Shamir secret sharing over F_q, q = 2^255 - 19 (a 255-bit prime), batched.

Secrets are field elements: mask seeds and X25519 private keys are drawn uniformly from F_q, so a
secret is one field element (no chunking). `split` shares many secrets in one call; `combine`
computes the Lagrange coefficients at zero once per set of share holders and reuses them for
every secret held by that set, which is what a server unmasking many clients needs.
"""
from __future__ import annotations

import math
import secrets
from collections.abc import Sequence

PRIME = (1 << 255) - 19
SECRET_BYTES = 32


def random_element() -> int:
    """Uniform on F_q from the OS CSPRNG (rejection sampling, no modular bias)."""
    while True:
        v = secrets.randbits(255)
        if v < PRIME:
            return v


def to_bytes(v: int) -> bytes:
    return v.to_bytes(SECRET_BYTES, "little")


def from_bytes(b: bytes) -> int:
    if len(b) != SECRET_BYTES:
        raise ValueError("field elements are 32 bytes")
    v = int.from_bytes(b, "little")
    if v >= PRIME:
        raise ValueError("field element out of range")
    return v


def split(secrets_: Sequence[int], *, xs: Sequence[int], threshold: int) -> list[list[int]]:
    """Shares of each secret at the points xs: result[i][j] is share j of secret i.

    Any `threshold` shares reconstruct; fewer reveal nothing. Points are non-zero and distinct.
    """
    n = len(xs)
    if not 1 <= threshold <= n:
        raise ValueError(f"threshold {threshold} must be in [1, {n}]")
    if len(set(xs)) != n or any(not 0 < x < PRIME for x in xs):
        raise ValueError("share points must be distinct and non-zero")
    out = []
    for s in secrets_:
        if not 0 <= s < PRIME:
            raise ValueError("secret outside the field")
        coeffs = [s] + [random_element() for _ in range(threshold - 1)]
        row = []
        for x in xs:
            acc = 0
            for c in reversed(coeffs):  # Horner; x is small, so reduce once at the end
                acc = acc * x + c
            row.append(acc % PRIME)
        out.append(row)
    return out


def lagrange_at_zero(xs: Sequence[int]) -> list[int]:
    """Coefficients l_j with f(0) = sum_j l_j f(x_j) for any polynomial of degree < len(xs).

    l_j = prod_{m != j} x_m / (x_m - x_j) = P / (x_j * d_j) with P = prod x_m and
    d_j = prod_{m != j} (x_m - x_j); the n inverses are batched into one (Montgomery's trick).
    """
    if len(set(xs)) != len(xs):
        raise ValueError("share points must be distinct")
    total = math.prod(xs) % PRIME
    dens = [xj * math.prod(xm - xj for xm in xs if xm != xj) % PRIME for xj in xs]
    return [total * inv % PRIME for inv in batch_inverse(dens)]


def batch_inverse(values: Sequence[int], prime: int = PRIME) -> list[int]:
    """Inverses of non-zero residues mod `prime` with one modular exponentiation (Montgomery's trick)."""
    prefix = [1]
    for v in values:
        prefix.append(prefix[-1] * v % prime)
    inv = pow(prefix[-1], -1, prime)
    out = [0] * len(values)
    for i in range(len(values) - 1, -1, -1):
        out[i] = prefix[i] * inv % prime
        inv = inv * values[i] % prime
    return out


def combine(xs: Sequence[int], shares: Sequence[Sequence[int]]) -> list[int]:
    """Reconstruct several secrets whose shares are held at the same points xs.

    shares[i][j] is the share of secret i at xs[j]; exactly `threshold` points are needed (extra
    points are fine: they are used, and consistent shares still give the secret).
    """
    lam = lagrange_at_zero(xs)
    out = []
    for row in shares:
        if len(row) != len(xs):
            raise ValueError("each secret needs one share per point")
        out.append(sum(l * s for l, s in zip(lam, row)) % PRIME)
    return out
