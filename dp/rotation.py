"""Randomised Hadamard rotation  y = H D x / sqrt(D_len)  with public per-round Rademacher signs D.

It spreads a vector's energy evenly over the coordinates, so each coordinate of the rotated,
scaled client vector is about c / sqrt(d) and per-coordinate modular clipping rarely wraps
(arXiv 2102.06387 Sec. 4.2; TFF `HadamardTransformFactory`). The vector is zero-padded to the
next power of two. The transform is orthonormal, so it preserves L2 norms and its inverse is
x = D H y / sqrt(D_len).

The signs are public (every party derives them from the round seed), so they come from AES-CTR
under SHA-256(domain || seed): reproducible, and never reused across rounds if seeds differ.
"""
from __future__ import annotations

import hashlib

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

_DOMAIN = b"fedsecure-nlp/dp/hadamard-signs/v1"

Seed = bytes | int


def padded_length(dim: int) -> int:
    if dim < 1:
        raise ValueError("dimension must be positive")
    return 1 << (dim - 1).bit_length()


def seed_bytes(seed: Seed) -> bytes:
    if isinstance(seed, bytes):
        return seed
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) and seed >= 0:
        return int(seed).to_bytes(max(1, (int(seed).bit_length() + 7) // 8), "big")
    raise TypeError("round seeds are bytes or non-negative ints")


def rademacher_signs(seed: Seed, length: int, *, domain: bytes = _DOMAIN) -> np.ndarray:
    """length values in {-1.0, +1.0}, a deterministic function of (domain, seed)."""
    key = hashlib.sha256(domain + b"\x00" + seed_bytes(seed)).digest()
    enc = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
    raw = np.frombuffer(enc.update(bytes((length + 7) // 8)), dtype=np.uint8)
    bits = np.unpackbits(raw)[:length]
    return 1.0 - 2.0 * bits.astype(np.float64)


def fwht_(x: np.ndarray) -> np.ndarray:
    """Unnormalised fast Walsh-Hadamard transform of a float64 power-of-two vector, in place."""
    n = x.shape[0]
    if n & (n - 1):
        raise ValueError("length must be a power of two")
    tmp = np.empty(n // 2, dtype=x.dtype)
    h = 1
    while h < n:
        pairs = x.reshape(-1, 2, h)
        lo, hi = pairs[:, 0, :], pairs[:, 1, :]
        diff = tmp.reshape(-1, h)
        np.subtract(lo, hi, out=diff)
        lo += hi
        hi[...] = diff
        h *= 2
    return x


def rotate(x: np.ndarray, *, seed: Seed) -> np.ndarray:
    """H D pad(x) / sqrt(len): a new float64 vector of power-of-two length."""
    x = np.asarray(x, dtype=np.float64)
    n = padded_length(x.shape[0])
    y = np.zeros(n, dtype=np.float64)
    y[: x.shape[0]] = x
    y *= rademacher_signs(seed, n)
    fwht_(y)
    y *= 1.0 / np.sqrt(n)
    return y


def unrotate(y: np.ndarray, *, seed: Seed, dim: int) -> np.ndarray:
    """Inverse of `rotate`, truncated to the original dimension."""
    y = np.array(y, dtype=np.float64, copy=True)
    n = y.shape[0]
    if n != padded_length(dim):
        raise ValueError(f"rotated length {n} does not match dimension {dim}")
    fwht_(y)
    y *= rademacher_signs(seed, n) / np.sqrt(n)
    return y[:dim]
