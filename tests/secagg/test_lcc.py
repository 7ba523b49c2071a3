"""Lagrange coded computing over F_p: exact products, round trips, any-U decoding, T-privacy."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from secagg.lcc import MAX_INNER, P, KeyedNoise, LagrangeCode, _reduce_into, inverse, lagrange_matrix, matmul_mod_p
from secagg.prg import random_vector
from secagg.ring import FIELD_P31

SETTINGS = settings(max_examples=30, deadline=None)


def residues(seed: int, shape) -> np.ndarray:
    """Test data only (masks in the library come from the CSPRNG)."""
    return np.random.default_rng(seed).integers(0, P, shape, dtype=np.int64)


def exact_matmul(a: np.ndarray, x: np.ndarray) -> np.ndarray:
    return (a.astype(object) @ x.astype(np.int64).astype(object)) % P


def solve_mod_p(a: list[list[int]], b: list[list[int]]) -> list[list[int]]:
    """Solve a @ y = b over F_p by Gauss-Jordan with Python ints; raises if a is singular."""
    n = len(a)
    rows = [list(a[i]) + list(b[i]) for i in range(n)]
    for col in range(n):
        pivot = next(r for r in range(col, n) if rows[r][col] % P)  # StopIteration if singular
        rows[col], rows[pivot] = rows[pivot], rows[col]
        inv = pow(rows[col][col], -1, P)
        rows[col] = [v * inv % P for v in rows[col]]
        for r in range(n):
            if r != col and rows[r][col]:
                f = rows[r][col]
                rows[r] = [(v - f * w) % P for v, w in zip(rows[r], rows[col])]
    return [row[n:] for row in rows]


# ---- field helpers -------------------------------------------------------------------------

def test_inverse_is_multiplicative_inverse():
    x = np.concatenate([residues(1, 1000) % (P - 1) + 1, [1, P - 1, 2]])
    assert np.all(x * inverse(x) % P == 1)
    with pytest.raises(ZeroDivisionError, match="zero has no inverse in F_p"):
        inverse(np.array([3, 0]))


@SETTINGS
@given(k=st.integers(1, 12), n=st.integers(1, 12), seed=st.integers(0, 2**32))
def test_lagrange_matrix_interpolates_polynomials(k, n, seed):
    coeffs = [int(c) for c in residues(seed, k)]  # a polynomial of degree < k
    nodes, points = tuple(range(100, 100 + k)), tuple(range(1, n + 1))

    def f(x: int) -> int:
        return sum(c * pow(x, i, P) for i, c in enumerate(coeffs)) % P

    m = lagrange_matrix(nodes, points)
    values = [f(a) for a in nodes]
    for j, x in enumerate(points):
        assert sum(int(m[j, i]) * values[i] for i in range(k)) % P == f(x)


def test_lagrange_matrix_rejects_points_on_nodes_and_repeated_nodes():
    with pytest.raises(ValueError, match="evaluation points must differ from the interpolation nodes"):
        lagrange_matrix((1, 2, 3), (5, 2))
    with pytest.raises(ValueError, match="interpolation nodes must be distinct"):
        lagrange_matrix((1, 2, 2), (5,))


# ---- exact products ------------------------------------------------------------------------

@SETTINGS
@given(n=st.integers(1, 30), k=st.integers(1, 2 * MAX_INNER + 5), m=st.integers(1, 700),
       seed=st.integers(0, 2**32))
def test_matmul_mod_p_is_exact(n, k, m, seed):
    a, x = residues(seed, (n, k)), residues(seed + 1, (k, m)).astype(np.uint32)
    assert np.array_equal(matmul_mod_p(a, x).astype(object), exact_matmul(a, x))


@pytest.mark.parametrize("k", [1, MAX_INNER, MAX_INNER + 1, 3 * MAX_INNER])
@pytest.mark.parametrize("coeff", [(P - 1) // 2, (P + 1) // 2, P - 1, 1 << 15])
def test_matmul_mod_p_worst_case_magnitudes_stay_exact(k, coeff):
    # Largest centred coefficients and largest limbs: the float64 sums come closest to 2^53 here.
    a = np.full((3, k), coeff, dtype=np.int64)
    x = np.full((k, 5), P - 1, dtype=np.uint32)
    x[:, 1] = (1 << 16) - 1
    x[:, 2] = P - 1 - ((1 << 16) - 1)
    x[:, 3] = 0
    assert np.array_equal(matmul_mod_p(a, x).astype(object), exact_matmul(a, x))


def test_reduction_of_exact_float_sums_covers_the_whole_range():
    edge = [0, 1, -1, P, -P, P - 1, P + 1, 2 * P, -(2 * P), 2**31, -(2**31), 2**31 - 2**22,
            -(2**31) * 5 + 3, 2**53 - 1, -(2**53 - 1), (2**53 // P) * P, -(2**53 // P) * P]
    rng = np.random.default_rng(7)
    hi = rng.integers(-(2**22), 2**22, 2000)
    lo = rng.integers(0, 2**10, 2000)  # small low words: after one fold the value goes negative
    values = edge + [int(h) * 2**31 + int(l) for h, l in zip(hi, lo)]
    s = np.array(values, dtype=np.float64)
    assert all(float(v) == v for v in values)  # exactly representable
    out = np.empty(len(values), dtype=np.uint32)
    scratch = dict(v=np.empty(len(values), np.int64), hi=np.empty(len(values), np.int64),
                   tmp=np.empty(len(values), np.uint32))
    _reduce_into(s, out, **scratch)
    assert out.tolist() == [v % P for v in values]


def test_inner_block_bound():
    assert MAX_INNER == 85
    assert MAX_INNER * ((P - 1) // 2) * ((1 << 16) - 1 + ((P - 1) >> 16)) < 2**53


# ---- the code ------------------------------------------------------------------------------

codes = st.integers(2, 12).flatmap(
    lambda n: st.integers(2, n).flatmap(
        lambda u: st.tuples(st.just(n), st.just(u), st.integers(0, u - 1), st.integers(1, 400))
    )
)


@SETTINGS
@given(params=codes, data=st.data())
def test_round_trip_from_any_u_pieces(params, data):
    n, u, t, d = params
    code = LagrangeCode(num_coded=n, num_nodes=u, privacy=t, length=d)
    mask = random_vector(FIELD_P31, d)
    coded = code.encode(mask)
    assert coded.shape == (n, code.piece_length) and coded.dtype == np.uint32
    assert int(coded.max()) < P
    positions = data.draw(st.permutations(range(n)))[:u]
    assert np.array_equal(code.decode(positions, coded[list(positions)]), mask)


@SETTINGS
@given(params=codes, data=st.data())
def test_decoding_column_blocks_gives_the_mask_block_by_block(params, data):
    """`decode_columns` on any cut of the piece columns reassembles the whole decode (the server removes
    the aggregate mask this way, without a d-long temporary)."""
    n, u, t, d = params
    code = LagrangeCode(num_coded=n, num_nodes=u, privacy=t, length=d)
    mask = random_vector(FIELD_P31, d)
    positions = data.draw(st.permutations(range(n)))[:u]
    coded = code.encode(mask)[list(positions)]
    m, step = code.piece_length, data.draw(st.integers(1, code.piece_length))
    rows = np.zeros((u - t, m), dtype=np.uint32)
    for c0 in range(0, m, step):
        rows[:, c0:c0 + step] = code.decode_columns(positions, coded[:, c0:c0 + step])
    assert np.array_equal(rows.reshape(-1)[:d], mask)
    with pytest.raises(ValueError, match="distinct positions"):
        code.decode_columns(list(positions[:-1]) + [positions[0]], coded)


@SETTINGS
@given(params=codes, data=st.data())
def test_encoding_any_rows_gives_those_rows_of_the_whole_code(params, data):
    """`encode_rows` (a client encodes its pieces part by part) equals the same rows of `encode`, for any
    subset of parties in any order, from the same mask and random pieces."""
    n, u, t, d = params
    code = LagrangeCode(num_coded=n, num_nodes=u, privacy=t, length=d)
    mask = random_vector(FIELD_P31, d)
    noise = random_vector(FIELD_P31, t * code.piece_length).reshape(t, -1) if t else None
    whole = code.encode(mask, noise=noise)
    positions = data.draw(st.lists(st.integers(0, n - 1), max_size=n, unique=True))
    rows = code.encode_rows(positions, code.data_rows(mask), noise)
    assert rows.shape == (len(positions), code.piece_length) and rows.dtype == np.uint32
    assert np.array_equal(rows, whole[positions])


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 3), length=st.integers(1, 40), block=st.integers(1, 12), data=st.data())
def test_keyed_noise_gives_the_same_columns_however_it_is_cut(rows, length, block, data):
    """Any window of `KeyedNoise` equals that window of the whole (blocks made again from the key are the
    same), every value is in F_p, and another key gives other values."""
    key = bytes(range(32))
    whole = KeyedNoise(rows, length, key=key, block=block).columns(0, length)
    assert whole.shape == (rows, length) and whole.dtype == np.uint32 and int(whole.max()) < P
    c0 = data.draw(st.integers(0, length))
    c1 = data.draw(st.integers(c0, length))
    assert np.array_equal(KeyedNoise(rows, length, key=key, block=block).columns(c0, c1), whole[:, c0:c1])
    if length > 4:
        assert not np.array_equal(KeyedNoise(rows, length, key=bytes(32), block=block).columns(0, length), whole)
    with pytest.raises(ValueError, match="columns must lie"):
        KeyedNoise(rows, length, key=key).columns(0, length + 1)


@settings(max_examples=20, deadline=None)
@given(params=codes, data=st.data())
def test_encoding_rows_with_keyed_noise_equals_encoding_with_that_noise(params, data):
    """Encoding block by block from a `KeyedNoise` gives the rows `encode` gives from the same noise whole."""
    n, u, t, d = params
    if not t:
        return
    code = LagrangeCode(num_coded=n, num_nodes=u, privacy=t, length=d)
    block = data.draw(st.integers(1, code.piece_length))  # column blocks of any width, a cut anywhere
    mask, noise = random_vector(FIELD_P31, d), KeyedNoise(t, code.piece_length, block=block)
    positions = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True))
    whole = code.encode(mask, noise=noise.columns(0, code.piece_length))
    assert np.array_equal(code.encode_rows(positions, code.data_rows(mask), noise), whole[positions])


def test_keyed_noise_values_look_uniform_on_the_field():
    """Coarse check of the sampler: 2^18 values in 16 equal bins of F_p (chi-square, 15 d.o.f., p ~ 1e-6 cut)."""
    values = KeyedNoise(4, 1 << 16).columns(0, 1 << 16).ravel().astype(np.int64)
    counts = np.bincount(values * 16 // P, minlength=16)
    expected = values.size / 16
    assert ((counts - expected) ** 2 / expected).sum() < 50


def test_encode_rows_validates_its_inputs():
    code = LagrangeCode(num_coded=5, num_nodes=4, privacy=2, length=10)
    data, noise = code.data_rows(random_vector(FIELD_P31, 10)), random_vector(FIELD_P31, 10).reshape(2, 5)
    with pytest.raises(ValueError, match="positions"):
        code.encode_rows([5], data, noise)
    with pytest.raises(ValueError, match="data pieces"):
        code.encode_rows([0], data[:1], noise)
    with pytest.raises(ValueError, match="noise"):
        code.encode_rows([0], data, None)
    with pytest.raises(ValueError, match="residues"):
        code.encode_rows([0], data, np.full((2, 5), P, dtype=np.uint32))


def test_every_u_subset_decodes():
    code = LagrangeCode(num_coded=7, num_nodes=4, privacy=2, length=13)  # 13 not divisible by 2
    mask = random_vector(FIELD_P31, 13)
    coded = code.encode(mask)
    for subset in itertools.combinations(range(7), 4):
        assert np.array_equal(code.decode(subset, coded[list(subset)]), mask)


def test_decoding_summed_pieces_gives_the_summed_mask():
    code = LagrangeCode(num_coded=9, num_nodes=6, privacy=3, length=101)
    masks = [random_vector(FIELD_P31, 101) for _ in range(5)]
    coded_sum = np.zeros((9, code.piece_length), dtype=np.uint32)
    mask_sum = np.zeros(101, dtype=np.uint32)
    for z in masks:
        FIELD_P31.add_(coded_sum, code.encode(z))
        FIELD_P31.add_(mask_sum, z)
    assert np.array_equal(code.decode((8, 1, 3, 5, 0, 2), coded_sum[[8, 1, 3, 5, 0, 2]]), mask_sum)


def test_changing_one_random_piece_changes_every_coded_piece():
    code = LagrangeCode(num_coded=10, num_nodes=7, privacy=3, length=40)
    mask = random_vector(FIELD_P31, 40)
    noise = random_vector(FIELD_P31, 3 * code.piece_length).reshape(3, -1)
    for row in range(3):
        other = noise.copy()
        other[row] = random_vector(FIELD_P31, code.piece_length)
        a, b = code.encode(mask, noise=noise), code.encode(mask, noise=other)
        assert np.all(np.any(a != b, axis=1)), "some coded piece does not depend on the noise"


def test_t_coded_pieces_are_consistent_with_every_mask():
    """Perfect T-privacy: for any T holders and ANY other mask z', some noise explains exactly the
    pieces they hold, because the noise block of the encoding matrix is invertible."""
    n, u, t, d = 8, 6, 3, 9
    code = LagrangeCode(num_coded=n, num_nodes=u, privacy=t, length=d)
    e = code.encoding_matrix()
    k, m = code.data_pieces, code.piece_length
    z, z_other = random_vector(FIELD_P31, d), random_vector(FIELD_P31, d)
    coded = code.encode(z)
    for holders in itertools.combinations(range(n), t):
        rows = list(holders)
        data_other = np.zeros(k * m, dtype=np.uint32)
        data_other[:d] = z_other
        seen = coded[rows].astype(object)
        rhs = (seen - exact_matmul(e[rows, :k], data_other.reshape(k, m))) % P
        noise = solve_mod_p(e[rows, k:].tolist(), rhs.tolist())
        forged = code.encode(z_other, noise=np.array(noise, dtype=np.uint32))
        assert np.array_equal(forged[rows], coded[rows])
        assert not np.array_equal(z_other, z)


def test_code_validates_its_inputs():
    with pytest.raises(ValueError, match="need 0 <= T < U <= N, got T=1, U=5, N=4"):
        LagrangeCode(num_coded=4, num_nodes=5, privacy=1, length=3)
    with pytest.raises(ValueError, match="need 0 <= T < U <= N, got T=3, U=3, N=4"):
        LagrangeCode(num_coded=4, num_nodes=3, privacy=3, length=3)
    code = LagrangeCode(num_coded=5, num_nodes=3, privacy=1, length=10)
    with pytest.raises(ValueError, match="ring vector has length 9, expected 10"):
        code.encode(np.zeros(9, dtype=np.uint32))
    with pytest.raises(ValueError, match=r"entries outside \[0, p\)"):
        code.encode(np.full(10, P, dtype=np.uint32))
    coded = code.encode(random_vector(FIELD_P31, 10))
    with pytest.raises(ValueError, match="decoding needs 3 coded pieces, got 2"):
        code.decode((0, 1), coded[:2])
    with pytest.raises(ValueError, match="positions must be distinct"):
        code.decode((0, 0, 1), coded[[0, 0, 1]])
    with pytest.raises(ValueError, match=r"positions must be distinct and in \[0, N\)"):
        code.decode((0, 1, 5), coded[:3])
    with pytest.raises(ValueError, match="data entries must be residues mod p"):
        code.decode((0, 1, 2), np.full_like(coded[:3], P))  # not residues: the exact-sum bound fails
