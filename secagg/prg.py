"""AES-256 keystreams: masks, produced and applied in place chunk by chunk, and `CryptoRandom`, the one
source of secret uniform randomness (stochastic rounding, DP noise).

A mask's key is the full 256-bit secret derived by HKDF, so a mask has the seed's full entropy (unlike
PRGs seeded from a folded 32-bit integer). Peak extra memory is one chunk, whatever d is.

A mask's keystream is AES-256 in counter mode, produced through OpenSSL's GCM code path (`_Keystream`):
on CPUs with VAES that path runs 2.6x faster than its CTR mode (22 against 8.6 GB/s on the 2-core
benchmark machine), and masking is what SecAgg+ adds to a round. `CryptoRandom` stays plain AES-256-CTR
from counter 0: its seeded public draws (sketch projections, ATC's centroids, seeded simulation noise) are
the streams recorded results were made with, and changing them would change those results.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from secagg.ring import Ring

CHUNK = 1 << 16  # uint32 words per keystream chunk (256 KiB): stays in L2 while it is added
SEGMENT = 1 << 20
"""uint32 words per keystream segment (4 MiB): segment s is keyed by GCM nonce s (see `_Keystream`). A new
segment costs one cipher context (3 us, against 190 us of keystream)."""


TWO_M53 = 1.0 / 9007199254740992.0  # 2^-53: the grid step of `uniform`, so also its smallest positive value
_ZERO_NONCE = bytes(16)
_ZEROS = bytes(1 << 18)
"""The plaintext every keystream encrypts (a cipher's encryption of zeros is its keystream), shared and read-only."""
_ZEROS_VIEW = memoryview(_ZEROS)
_SLACK = 15
"""Bytes `update_into` needs past the data's length (AES block size - 1)."""
_SMALL = 1 << 12
"""Draws up to this many bytes encrypt in one `update` call (cheaper in Python steps than `update_into`)."""


class _Keystream:
    """One key's keystream from byte `4 * offset` on. Its 16-byte block g is

        AES-256_key(s || (j + 2)),   s = g // (SEGMENT / 4) as 96 bits, j = g mod (SEGMENT / 4) as 32 bits,

    i.e. segment s is the ciphertext of AES-256-GCM encrypting zeros under nonce s, its tag discarded (GCM
    counts from 2 under a 96-bit nonce). Every block input is distinct, so the stream is AES as a PRF at
    distinct points, exactly as CTR mode; GCM's authentication is not used (a mask key keys nothing else).
    A stream sought into the middle of a segment produces the rest of that segment in CTR mode with the
    same counter blocks (slower, the same bytes), then returns to GCM at the next segment."""

    __slots__ = ("_algorithm", "_enc", "_position", "_left")

    def __init__(self, key: bytes, *, offset: int = 0) -> None:
        if len(key) != 32:
            raise ValueError("AES-256 keys are 32 bytes")
        if offset < 0:
            raise ValueError("keystream offset must be >= 0")
        self._algorithm = algorithms.AES(key)
        self._seek(4 * offset)

    def _seek(self, position: int) -> None:
        size = 4 * SEGMENT   # read here, not frozen at import: tests shrink SEGMENT to cross many segments
        segment, inside = divmod(position, size)
        nonce = segment.to_bytes(12, "big")
        if inside == 0:
            enc = Cipher(self._algorithm, modes.GCM(nonce)).encryptor()
        else:
            block, skip = divmod(inside, 16)
            enc = Cipher(self._algorithm, modes.CTR(nonce + (block + 2).to_bytes(4, "big"))).encryptor()
            if skip:
                enc.update(bytes(skip))
        self._enc, self._position, self._left = enc, position, size - inside

    def into(self, out: memoryview, nbytes: int) -> None:
        """Write the next `nbytes` bytes of the stream into out[:nbytes] (a byte view)."""
        done = 0
        while done < nbytes:
            if not self._left:
                self._seek(self._position)
            n = min(nbytes - done, self._left, len(_ZEROS))
            self._enc.update_into(_ZEROS_VIEW[:n], out[done : done + n])
            done += n
            self._position += n
            self._left -= n


def _keystream(key: bytes, *, offset: int = 0) -> _Keystream:
    """`key`'s mask keystream from uint32 word `offset` on (the same stream, sought: a window needs no
    keystream before it). One key is used for exactly one stream (one mask), so fixed nonces are safe."""
    return _Keystream(key, offset=offset)


def _ctr_keystream(key: bytes):
    """AES-256-CTR of zeros under `key` from counter block 0 (`CryptoRandom`'s stream)."""
    if len(key) != 32:
        raise ValueError("AES-256 keys are 32 bytes")
    # One key is used for exactly one stream (one CryptoRandom), so a fixed counter block is safe.
    return Cipher(algorithms.AES(key), modes.CTR(_ZERO_NONCE)).encryptor()


class CryptoRandom:
    """Uniform words and doubles from AES-256-CTR, never from numpy's generators.

    `key=None` (the default, and the only choice for rounding and privacy noise) draws a fresh key
    from os.urandom, so nobody can predict the stream. A fixed 32-byte key makes it reproducible, for
    tests only.
    """

    def __init__(self, key: bytes | None = None) -> None:
        self._enc = _ctr_keystream(os.urandom(32) if key is None else key)

    def words(self, n: int, dtype: type[np.unsignedinteger] = np.uint64) -> np.ndarray:
        """n uniform unsigned words of `dtype` (uint64 by default; uint32 costs half the keystream).

        The keystream is written straight into the returned array (`update_into` from a shared zero
        plaintext): encrypting a freshly allocated zero buffer cost 4x the cipher itself."""
        size = np.dtype(dtype).itemsize
        nbytes = size * n
        if nbytes <= _SMALL:  # a few words: one call, fewer Python steps (read-only, like frombuffer's)
            return np.frombuffer(self._enc.update(_ZEROS_VIEW[:nbytes]), dtype=dtype)
        out = np.empty(n + -(-_SLACK // size), dtype=dtype)  # update_into wants block size - 1 bytes of room
        view = memoryview(out).cast("B")
        for start in range(0, nbytes, len(_ZEROS)):
            self._enc.update_into(_ZEROS_VIEW[:min(len(_ZEROS), nbytes - start)], view[start:])
        return out[:n]

    def uniform(self, n: int) -> np.ndarray:
        """n doubles uniform on [0, 1), 53 random bits each."""
        w = self.words(n)
        if not w.flags.writeable:
            return (w >> np.uint64(11)).astype(np.float64) * TWO_M53
        np.right_shift(w, np.uint64(11), out=w)
        u = w.astype(np.float64)
        u *= TWO_M53
        return u

    def uniform_open(self, n: int) -> np.ndarray:
        """n doubles uniform on (0, 1]."""
        return 1.0 - self.uniform(n)


def _chunks(key: bytes, length: int):
    """Yield (start, uint32 view) over the keystream, reusing one buffer."""
    enc = _keystream(key)
    buf = np.empty(min(CHUNK, max(length, 1)), dtype=np.uint32)
    raw = memoryview(buf).cast("B")
    for start in range(0, length, buf.shape[0]):
        n = min(buf.shape[0], length - start)
        enc.into(raw, 4 * n)
        yield start, buf[:n]


def apply_mask_(target: np.ndarray, key: bytes, ring: Ring, *, sign: int = 1) -> np.ndarray:
    """target <- target + sign * PRG(key) (mod ring), in place. PRG output is uniform on the ring."""
    if sign not in (1, -1):
        raise ValueError("sign must be +1 or -1")
    op = ring.add_ if sign == 1 else ring.sub_
    if ring.is_power_of_two:
        for start, ks in _chunks(key, target.shape[0]):
            op(target[start : start + ks.shape[0]], ks)
        return target
    # Prime field: a uniform element of [0, p) by rejection from 31-bit words; p = 2^31 - 1 rejects
    # one value in 2^31, so resampling is rare. Rejected words are redrawn from a second stream.
    mask = field_mask(key, ring, target.shape[0])
    op(target, mask)
    return target


def apply_masks_(target: np.ndarray, masks: Sequence[tuple[bytes, int]], ring: Ring, *, offset: int = 0,
                 source: np.ndarray | None = None, threads: int = 1) -> np.ndarray:
    """target <- target + sum_i sign_i * PRG(key_i) (mod ring), in place, for `masks` = [(key_i, sign_i)]:
    the same result as `apply_mask_` once per key, but chunk-major: each chunk of target is read and
    written once for all the masks (it stays in cache while every keystream is added to it), so at large
    d the cost is the keystreams' plus one pass over target instead of one pass per mask. Extra memory:
    one keystream chunk and one AES context per key (per thread).

    Power-of-two rings only:
    `offset`: `target` is the window [offset, offset + len) of a longer vector, and gets that window of
    each mask: a masked input sent in chunks is masked chunk by chunk.
    `source`: target <- source + masks instead (target's old values are ignored): no separate copy pass.
    `threads`: split target into that many contiguous windows masked side by side (AES and numpy's
    adds release the GIL), for a server unmasking a d-long sum on several cores."""
    masks = list(masks)
    if any(sign not in (1, -1) for _, sign in masks):
        raise ValueError("sign must be +1 or -1")
    if threads < 1:
        raise ValueError("threads must be >= 1")
    if not ring.is_power_of_two:
        if offset or source is not None:
            raise ValueError("mask windows (offset > 0) and sources are for power-of-two rings only")
        for key, sign in masks:
            apply_mask_(target, key, ring, sign=sign)
        return target
    length = target.shape[0]
    parts = min(threads, max(1, length // CHUNK))
    if parts == 1:
        return MaskStream(masks, ring).apply_(target, offset=offset, source=source)
    cuts = [length * i // parts for i in range(1, parts)]
    if length >= parts * SEGMENT:  # cut at segment starts: each window then opens a GCM nonce, not a CTR head
        cuts = [(offset + cut + SEGMENT // 2) // SEGMENT * SEGMENT - offset for cut in cuts]
    bounds = [0, *cuts, length]

    def window(i: int) -> None:
        a, b = bounds[i], bounds[i + 1]
        MaskStream(masks, ring).apply_(target[a:b], offset=offset + a, source=None if source is None else source[a:b])

    with ThreadPoolExecutor(parts) as pool:
        list(pool.map(window, range(parts)))
    return target


class MaskStream:
    """sum_i sign_i * PRG(key_i) over a vector masked window by window (a chunked upload), power-of-two
    rings. Each key's AES-CTR context is kept from one window to the next: windows asked for in order
    continue the keystreams where the last one ended, and any other window seeks them afresh, so a
    vector in C chunks costs one context per key, not C (at d = 1e7 in 1 MiB chunks, 7% of masking)."""

    def __init__(self, masks: Sequence[tuple[bytes, int]], ring: Ring) -> None:
        self.masks = list(masks)
        if any(sign not in (1, -1) for _, sign in self.masks):
            raise ValueError("sign must be +1 or -1")
        if not ring.is_power_of_two:  # the adds below wrap mod 2^32: uint32 arithmetic is the ring's
            raise ValueError("mask windows (offset > 0) are for power-of-two rings only")
        self._streams: list = []
        self._position = -1  # the word the kept contexts stand at (-1: none kept)
        self._buf = np.empty(0, dtype=np.uint32)

    def apply_(self, target: np.ndarray, *, offset: int = 0, source: np.ndarray | None = None) -> np.ndarray:
        """target <- (source if given, else target) + the masks' window [offset, offset + len(target))."""
        if offset < 0:
            raise ValueError("keystream offset must be >= 0")
        length = target.shape[0]
        if source is not None and source.shape != target.shape:
            raise ValueError(f"source of shape {source.shape} for a target of shape {target.shape}")
        if offset != self._position:
            self._streams = [(_keystream(key, offset=offset), sign) for key, sign in self.masks]
        if self._buf.shape[0] < min(CHUNK, length):
            self._buf = np.empty(min(CHUNK, max(length, 1)), dtype=np.uint32)
        buf = self._buf
        raw = memoryview(buf).cast("B")
        for start in range(0, length, buf.shape[0]):
            n = min(buf.shape[0], length - start)
            segment, ks = target[start : start + n], buf[:n]
            base = segment if source is None else source[start : start + n]
            if not self._streams and source is not None:
                segment[...] = base
            for enc, sign in self._streams:
                enc.into(raw, 4 * n)
                (np.add if sign == 1 else np.subtract)(base, ks, out=segment)
                base = segment
        self._position = offset + length
        return target


def mask(key: bytes, ring: Ring, length: int) -> np.ndarray:
    """The mask itself (allocates length words). Prefer apply_mask_ on hot paths."""
    out = np.zeros(length, dtype=np.uint32)
    return apply_mask_(out, key, ring)


def field_mask(key: bytes, ring: Ring, length: int) -> np.ndarray:
    """Uniform vector on F_p from the key, exact (rejection sampling, no modular bias)."""
    if ring.is_power_of_two:
        return mask(key, ring, length)
    bits = int(ring.modulus - 1).bit_length()
    word_mask = np.uint32((1 << bits) - 1)
    out = np.empty(length, dtype=np.uint32)
    for start, ks in _chunks(key, length):
        np.bitwise_and(ks, word_mask, out=out[start : start + ks.shape[0]])
    bad = np.flatnonzero(out >= ring.modulus)
    counter = 0
    while bad.size:
        counter += 1
        extra = np.empty(bad.size, dtype=np.uint32)
        # Counter blocks c || 0^64, c >= 1: never the mask stream's, whose high 64 bits are the top of its
        # 96-bit segment number (0 below 2^52 words).
        enc = Cipher(algorithms.AES(key), modes.CTR(counter.to_bytes(8, "big") + bytes(8))).encryptor()
        enc.update_into(bytes(4 * bad.size), memoryview(extra).cast("B"))
        extra &= word_mask
        out[bad] = extra
        bad = bad[extra >= ring.modulus]
    return out


def random_vector(ring: Ring, length: int) -> np.ndarray:
    """A fresh uniform ring vector from the OS CSPRNG (via a one-time AES key)."""
    import os

    return field_mask(os.urandom(32), ring, length)
