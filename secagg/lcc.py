"""Lagrange coded computing (LCC) over F_p, p = 2^31 - 1: the mask code of LightSecAgg.

Notation follows So et al. (LightSecAgg, MLSys 2022), after Yu et al. (LCC, AISTATS 2019):
N coded pieces, U interpolation nodes (the target number of survivors), T-privacy.

    encode:  a mask z in F_p^d is zero-padded to (U - T) * m, m = ceil(d / (U - T)), and cut into
             U - T data pieces [z]_1 .. [z]_{U-T}; T uniformly random pieces [n]_{U-T+1} .. [n]_U
             are appended. f is the polynomial of degree < U with f(alpha_k) = k-th piece, and the
             coded piece for party j is  [~z]_j = f(beta_j) = sum_k l_k(beta_j) * piece_k,
             where l_k is the Lagrange basis over alpha_1 .. alpha_U.
    decode:  from f(beta_j) at any U distinct j (e.g. coded pieces of a SUM of masks, since the
             code is linear) interpolate f and read off the data pieces f(alpha_1 .. alpha_{U-T}).
    privacy: any T coded pieces are independent of the data pieces, because for any T betas the
             T x T block of the encoding matrix on the noise columns is invertible (betas are
             distinct from alphas).

Points: beta_j = j (j = 1 .. N) and alpha_k = N + k (k = 1 .. U).

Speed: the products (coefficient matrix) x (piece matrix) are done exactly in float64 BLAS.
Coefficients are taken centred, |a| <= (p-1)/2 < 2^30, and every data word x < 2^31 is split into
a low 16-bit and a high 15-bit limb; the high limb's coefficient is pre-multiplied by 2^16 (mod p)
so that a single GEMM over the stacked limbs gives sum_k a_k x_k exactly whenever
K * (2^30 - 1) * (2^16 - 1 + 2^15 - 1) < 2^53, i.e. K <= 85 rows per GEMM (`MAX_INNER`, asserted).
Larger K is split into blocks whose reduced results are added mod p. The exact float64 result is
reduced with the Mersenne identity 2^31 = 1 (mod p) in int64, in preallocated buffers. Columns are processed in
cache-sized blocks.
"""
from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from secagg.crypto import hkdf
from secagg.prg import field_mask, random_vector
from secagg.ring import FIELD_P31, MERSENNE_31

P = MERSENNE_31
_LIMB_BITS = 16
_LO_MAX = (1 << _LIMB_BITS) - 1
_HI_MAX = (P - 1) >> _LIMB_BITS
_COEFF_MAX = (P - 1) // 2
MAX_INNER = (1 << 53) // (_COEFF_MAX * (_LO_MAX + _HI_MAX))
"""Largest inner dimension one float64 GEMM can sum exactly (85)."""
assert MAX_INNER * _COEFF_MAX * (_LO_MAX + _HI_MAX) < 1 << 53
_BLOCK_FLOATS = 1 << 17  # float64 words of the limb buffer per column block (1 MiB): stays in L2


# ---- scalar-vector field arithmetic on int64 (products of two residues < 2^62 fit) -------------

def _mulmod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a * b % P


def inverse(x: np.ndarray) -> np.ndarray:
    """Elementwise inverse in F_p by Fermat, x^(p-2); raises ZeroDivisionError on a zero."""
    x = np.asarray(x, dtype=np.int64) % P
    if np.any(x == 0):
        raise ZeroDivisionError("zero has no inverse in F_p")
    result = np.ones_like(x)
    base, e = x.copy(), P - 2
    while e:
        if e & 1:
            result = _mulmod(result, base)
        base = _mulmod(base, base)
        e >>= 1
    return result


def lagrange_matrix(nodes: tuple[int, ...], points: tuple[int, ...]) -> np.ndarray:
    """M[j, k] = l_k(points[j]), the Lagrange basis over `nodes` evaluated at `points` (int64 mod p).

    Barycentric form l_k(x) = L(x) * w_k / (x - node_k), L(x) = prod_i (x - node_i),
    w_k = 1 / prod_{i != k} (node_k - node_i). Points must differ from every node.
    """
    a = np.asarray(nodes, dtype=np.int64) % P
    x = np.asarray(points, dtype=np.int64) % P
    if len(set(a.tolist())) != a.size:
        raise ValueError("interpolation nodes must be distinct")
    diff = (x[:, None] - a[None, :]) % P  # (points, nodes)
    if np.any(diff == 0):
        raise ValueError("evaluation points must differ from the interpolation nodes")
    node_diff = (a[:, None] - a[None, :]) % P
    np.fill_diagonal(node_diff, 1)
    big_l = np.ones(x.size, dtype=np.int64)
    w = np.ones(a.size, dtype=np.int64)
    for i in range(a.size):
        big_l = _mulmod(big_l, diff[:, i])
        w = _mulmod(w, node_diff[:, i])
    w = inverse(w)
    return _mulmod(_mulmod(big_l[:, None], w[None, :]), inverse(diff))


# ---- exact matrix product mod p ------------------------------------------------------------------

@lru_cache(maxsize=1)
def _blas_controller():
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # optional: without it BLAS keeps its own thread count
        return None
    return ThreadpoolController()


def _single_threaded_blas():
    """Our GEMMs are small and many parties run side by side: a second BLAS thread gains little
    when idle and, measured on a loaded 2-core machine, makes a product ~10x slower (spin-waits)."""
    controller = _blas_controller()
    return controller.limit(limits=1, user_api="blas") if controller else contextlib.nullcontext()


def _centred(a: np.ndarray) -> np.ndarray:
    a = a % P
    return np.where(a > _COEFF_MAX, a - P, a)


@dataclass(frozen=True)
class _PreparedCoefficients:
    """Float64 GEMM operands [a | a * 2^16] per inner block of at most MAX_INNER columns."""

    blocks: tuple[tuple[int, int, np.ndarray], ...]  # (start, stop, float64 (n, 2 * (stop - start)))
    rows: int

    @classmethod
    def from_matrix(cls, coeffs: np.ndarray) -> "_PreparedCoefficients":
        coeffs = np.asarray(coeffs, dtype=np.int64)
        n, k = coeffs.shape
        blocks = []
        for start in range(0, k, MAX_INNER):
            a = coeffs[:, start : start + MAX_INNER]
            ab = np.hstack([_centred(a), _centred(a * (1 << _LIMB_BITS))]).astype(np.float64)
            ab.setflags(write=False)
            blocks.append((start, start + a.shape[1], ab))
        return cls(tuple(blocks), n)


_OFFSET = ((1 << 53) // P + 1) * P  # a multiple of p above 2^53: makes every sum non-negative


def _reduce_into(s: np.ndarray, out: np.ndarray, *, v: np.ndarray, hi: np.ndarray, tmp: np.ndarray) -> None:
    """out <- s mod p for float64 s holding exact integers, |s| < 2^53; out is uint32.

    v, hi (int64) and tmp (uint32) are scratch of s's shape: allocating them per call costs more
    than the arithmetic (measured 5x).
    """
    np.copyto(v, s, casting="unsafe")
    np.add(v, _OFFSET, out=v)  # 0 < v < 2^54 + p
    np.right_shift(v, 31, out=hi)
    np.bitwise_and(v, P, out=v)
    np.add(v, hi, out=v)  # 2^31 = 1 (mod p): v = hi * 2^31 + lo = hi + lo < 2^31 + 2^23 + 1 < 2p
    np.copyto(out, v, casting="unsafe")
    np.subtract(out, np.uint32(P), out=tmp)  # wraps to a huge value exactly when out < p
    np.minimum(out, tmp, out=out)


def matmul_mod_p(coeffs: np.ndarray | _PreparedCoefficients, data: np.ndarray) -> np.ndarray:
    """(coeffs @ data) mod p, exactly. coeffs: int (n, K) residues; data: uint32 (K, m) residues < p."""
    prepared = coeffs if isinstance(coeffs, _PreparedCoefficients) else _PreparedCoefficients.from_matrix(coeffs)
    if data.dtype != np.uint32 or data.ndim != 2:
        raise ValueError("data must be a 2-D uint32 array")
    k, m = data.shape
    if prepared.blocks[-1][1] != k:
        raise ValueError(f"inner dimensions differ: {prepared.blocks[-1][1]} vs {k}")
    if data.size and int(data.max()) >= P:
        raise ValueError("data entries must be residues mod p")  # the limb bound relies on x < 2^31
    n = prepared.rows
    out = np.empty((n, m), dtype=np.uint32)
    kb = min(k, MAX_INNER)
    width = max(256, min(m, _BLOCK_FLOATS // (2 * kb)))
    # Scratch buffers reused by every column block; views of their first elements stay contiguous.
    limb_buf = np.empty(2 * kb * width, dtype=np.float64)
    word_buf = np.empty(kb * width, dtype=np.uint32)
    acc_buf = np.empty(n * width, dtype=np.float64)
    v_buf, hi_buf = np.empty(n * width, dtype=np.int64), np.empty(n * width, dtype=np.int64)
    tmp_buf, part_buf = np.empty(n * width, dtype=np.uint32), np.empty(n * width, dtype=np.uint32)
    with _single_threaded_blas():
        for c0 in range(0, m, width):
            w = min(width, m - c0)
            acc, v, hi, tmp, part = (b[: n * w].reshape(n, w) for b in (acc_buf, v_buf, hi_buf, tmp_buf, part_buf))
            target = out[:, c0 : c0 + w]
            for b, (k0, k1, ab) in enumerate(prepared.blocks):
                kk = k1 - k0
                x = data[k0:k1, c0 : c0 + w]
                limbs = limb_buf[: 2 * kk * w].reshape(2 * kk, w)
                words = word_buf[: kk * w].reshape(kk, w)
                np.bitwise_and(x, np.uint32(_LO_MAX), out=words)
                limbs[:kk] = words
                np.right_shift(x, np.uint32(_LIMB_BITS), out=words)
                limbs[kk:] = words
                np.matmul(ab, limbs, out=acc)
                if b == 0:
                    _reduce_into(acc, target, v=v, hi=hi, tmp=tmp)
                else:
                    _reduce_into(acc, part, v=v, hi=hi, tmp=tmp)
                    FIELD_P31.add_(target, part)
    return out


# ---- the code's random pieces, made from a key ---------------------------------------------------

NOISE_BLOCK = 1 << 16
"""Columns of the random pieces `KeyedNoise` makes at a time, and `encode_rows` encodes at a time with it."""


class KeyedNoise:
    """The code's T random pieces (T, m), uniform on F_p, made from one secret key a block of columns at a
    time, and made again identically when asked again: a party that encodes its coded pieces part by part
    keeps 32 bytes instead of T m words (T / (U - T) times its mask).

    Block b of row r is `field_mask` under HKDF(key, (r, b)): exact rejection sampling from the AES-256 keystream, so
    each block is uniform and the blocks are independent (HKDF-SHA256 and AES as PRFs). The key comes from
    the OS CSPRNG; pass one only in tests."""

    def __init__(self, rows: int, length: int, *, key: bytes | None = None, block: int = NOISE_BLOCK) -> None:
        if rows < 1 or length < 1 or block < 1:
            raise ValueError("random pieces need at least one row, one column and a positive block")
        if key is not None and len(key) != 32:
            raise ValueError("the noise key is 32 bytes")
        self.shape = (rows, length)
        self.block = block
        """Columns per block (`NOISE_BLOCK`; smaller only in tests)."""
        self._key = os.urandom(32) if key is None else key

    def _block(self, row: int, index: int) -> np.ndarray:
        info = b"fedsecure lcc noise" + row.to_bytes(4, "big") + index.to_bytes(8, "big")
        return field_mask(hkdf(self._key, info), FIELD_P31, min(self.block, self.shape[1] - index * self.block))

    def columns(self, c0: int, c1: int) -> np.ndarray:
        """Columns c0..c1 of every random piece, uint32 (T, c1 - c0)."""
        rows, length = self.shape
        if not 0 <= c0 <= c1 <= length:
            raise ValueError(f"columns must lie in [0, {length}], got {c0}..{c1}")
        out, size = np.empty((rows, c1 - c0), dtype=np.uint32), self.block
        for b in range(c0 // size, -(-c1 // size)):
            lo, hi = max(c0, b * size), min(c1, (b + 1) * size)
            for r in range(rows):
                out[r, lo - c0 : hi - c0] = self._block(r, b)[lo - b * size : hi - b * size]
        return out


# ---- the code ----------------------------------------------------------------------------------

def alphas(n: int, u: int) -> tuple[int, ...]:
    """Interpolation nodes alpha_1 .. alpha_U: data pieces first, then the T random pieces."""
    return tuple(range(n + 1, n + u + 1))


def betas(n: int) -> tuple[int, ...]:
    """Evaluation points beta_1 .. beta_N, one per party (distinct from every alpha)."""
    return tuple(range(1, n + 1))


@lru_cache(maxsize=64)
def _encoding_matrix(n: int, u: int) -> np.ndarray:
    matrix = lagrange_matrix(alphas(n, u), betas(n))
    matrix.setflags(write=False)
    return matrix


@lru_cache(maxsize=64)
def _encoder(n: int, u: int) -> _PreparedCoefficients:
    return _PreparedCoefficients.from_matrix(_encoding_matrix(n, u))


@lru_cache(maxsize=256)
def _decoder(n: int, u: int, t: int, positions: tuple[int, ...]) -> _PreparedCoefficients:
    nodes = tuple(betas(n)[p] for p in positions)
    return _PreparedCoefficients.from_matrix(lagrange_matrix(nodes, alphas(n, u)[: u - t]))


@dataclass(frozen=True)
class LagrangeCode:
    """An (N, U, T) Lagrange code for masks of length d over F_p, p = 2^31 - 1.

    Coded piece j (0-based position, j < N) goes to the j-th party; any U of them decode.
    """

    num_coded: int
    """N: number of coded pieces (one per party)."""
    num_nodes: int
    """U: interpolation nodes = coded pieces needed to decode (target survivors)."""
    privacy: int
    """T: random pieces; any T coded pieces reveal nothing about the mask."""
    length: int
    """d: mask length."""

    def __post_init__(self) -> None:
        if not 0 <= self.privacy < self.num_nodes <= self.num_coded:
            raise ValueError(f"need 0 <= T < U <= N, got T={self.privacy}, U={self.num_nodes}, N={self.num_coded}")
        if self.num_coded + self.num_nodes >= P:
            raise ValueError("too many parties for the field")
        if self.length < 1:
            raise ValueError("mask length must be positive")

    @property
    def data_pieces(self) -> int:
        return self.num_nodes - self.privacy

    @property
    def piece_length(self) -> int:
        """m = ceil(d / (U - T)): the length of every piece, coded or not."""
        return math.ceil(self.length / self.data_pieces)

    def encoding_matrix(self) -> np.ndarray:
        """W[j, k] = l_k(beta_j) (int64 mod p): coded piece j = sum_k W[j, k] * piece_k."""
        return _encoding_matrix(self.num_coded, self.num_nodes).copy()

    def encode(self, mask: np.ndarray, *, noise: np.ndarray | None = None) -> np.ndarray:
        """Coded pieces of `mask`, uint32 (N, m); row j is party j's piece.

        `noise` (uint32 (T, m), uniform on F_p) defaults to fresh OS-CSPRNG output; pass it only
        in tests.
        """
        FIELD_P31.validate(mask, length=self.length)
        k, t, m = self.data_pieces, self.privacy, self.piece_length
        pieces = np.zeros((self.num_nodes, m), dtype=np.uint32)
        pieces.reshape(-1)[: self.length] = mask
        if t:
            if noise is None:
                noise = random_vector(FIELD_P31, t * m).reshape(t, m)
            if noise.shape != (t, m) or noise.dtype != np.uint32 or int(noise.max()) >= P:
                raise ValueError(f"noise must be uint32 ({t}, {m}) residues mod p")
            pieces[k:] = noise
        return matmul_mod_p(_encoder(self.num_coded, self.num_nodes), pieces)

    def data_rows(self, mask: np.ndarray) -> np.ndarray:
        """The U - T data pieces of `mask`, uint32 (U - T, m): the mask zero-padded to (U - T) m."""
        FIELD_P31.validate(mask, length=self.length)
        rows = np.zeros((self.data_pieces, self.piece_length), dtype=np.uint32)
        rows.reshape(-1)[: self.length] = mask
        return rows

    def encode_rows(self, positions: Sequence[int], data: np.ndarray,
                    noise: np.ndarray | KeyedNoise | None) -> np.ndarray:
        """The coded pieces of the parties at 0-based `positions` only, uint32 (len(positions), m): the same
        rows as `encode` from the data pieces `data` (`data_rows`) and the T random pieces `noise` (an array,
        or a `KeyedNoise` made a block of columns at a time), so a party can encode and send its pieces part
        by part instead of holding all N, or the random pieces, at once."""
        k, t, m = self.data_pieces, self.privacy, self.piece_length
        positions = [int(p) for p in positions]
        if any(not 0 <= p < self.num_coded for p in positions):
            raise ValueError(f"positions must be in [0, {self.num_coded})")
        if data.shape != (k, m) or data.dtype != np.uint32:
            raise ValueError(f"data pieces must be uint32 ({k}, {m})")
        keyed = isinstance(noise, KeyedNoise)
        if t and (noise is None or noise.shape != (t, m) or not keyed and noise.dtype != np.uint32):
            raise ValueError(f"noise must be uint32 ({t}, {m}) residues mod p")
        if not positions:
            return np.zeros((0, m), dtype=np.uint32)
        rows = _encoding_matrix(self.num_coded, self.num_nodes)[positions]
        on_data = _PreparedCoefficients.from_matrix(rows[:, :k])
        on_noise = _PreparedCoefficients.from_matrix(rows[:, k:]) if t else None
        step = noise.block if t and keyed else m  # an array of random pieces is one block
        out = np.empty((len(positions), m), dtype=np.uint32)
        for c0 in range(0, m, step):
            c1 = min(c0 + step, m)
            block = matmul_mod_p(on_data, data[:, c0:c1])
            if t:
                FIELD_P31.add_(block, matmul_mod_p(on_noise, noise.columns(c0, c1) if keyed else noise[:, c0:c1]))
            out[:, c0:c1] = block
        return out

    def decode(self, positions: tuple[int, ...] | list[int], coded: np.ndarray) -> np.ndarray:
        """The (summed) mask of length d from coded pieces at U distinct 0-based positions.

        coded[i] is the coded piece of party positions[i]; exactly U rows are used (extra rows
        are ignored, so pass the ones you trust first).
        """
        u, m = self.num_nodes, self.piece_length
        if np.shape(coded)[1:] != (m,):
            raise ValueError(f"coded pieces must be uint32 ({u}, {m})")
        flat = self.decode_columns(positions, coded).reshape(-1)
        return flat if flat.size == self.length else flat[: self.length].copy()

    def decode_columns(self, positions: tuple[int, ...] | list[int], coded: np.ndarray) -> np.ndarray:
        """Columns c0..c1 of the decoded data pieces, (U - T, c1 - c0), from the same columns of U coded
        pieces: the mask's coordinates r m + c0 .. r m + c1 of each data piece r (m = piece length), so a
        long mask can be decoded block by block without holding it whole."""
        u = self.num_nodes
        positions = tuple(int(p) for p in positions)[:u]
        if len(positions) < u:
            raise ValueError(f"decoding needs {u} coded pieces, got {len(positions)}")
        if len(set(positions)) != u or any(not 0 <= p < self.num_coded for p in positions):
            raise ValueError("positions must be distinct and in [0, N): distinct positions, one per coded piece")
        coded = np.ascontiguousarray(coded[:u])
        if coded.ndim != 2 or coded.shape[0] != u or coded.shape[1] > self.piece_length or coded.dtype != np.uint32:
            raise ValueError(f"coded pieces must be uint32 ({u}, <= {self.piece_length})")
        return matmul_mod_p(_decoder(self.num_coded, u, self.privacy, positions), coded)
