"""Shamir secret sharing over F_q, q = 2^255 - 19 (a 255-bit prime), batched.

Secrets are field elements: mask seeds and X25519 private keys are drawn uniformly from F_q, so a
secret is one field element (no chunking). `split` shares many secrets in one call; `combine`
computes the Lagrange coefficients at zero once per set of share holders and reuses them for
every secret held by that set, which is what a server unmasking many clients needs.
"""
from __future__ import annotations

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
            for c in reversed(coeffs):  # Horner
                acc = (acc * x + c) % PRIME
            row.append(acc)
        out.append(row)
    return out


def lagrange_at_zero(xs: Sequence[int]) -> list[int]:
    """Coefficients l_j with f(0) = sum_j l_j f(x_j) for any polynomial of degree < len(xs)."""
    if len(set(xs)) != len(xs):
        raise ValueError("share points must be distinct")
    coeffs = []
    for j, xj in enumerate(xs):
        num, den = 1, 1
        for m, xm in enumerate(xs):
            if m != j:
                num = num * xm % PRIME
                den = den * (xm - xj) % PRIME
        coeffs.append(num * pow(den, -1, PRIME) % PRIME)
    return coeffs


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
