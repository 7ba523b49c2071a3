"""Reed–Solomon decoding of shares: exact recovery, correction up to (n-k)/2, guaranteed detection
inside the radius, documented miscorrection outside it, batching, and LightSecAgg piece location."""
from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from secagg import lcc, shamir
from secagg.prg import CryptoRandom
from secagg.reed_solomon import (
    UncorrectableError,
    _project,
    capacity,
    decode_many,
    decode_scalar,
    locate_vector_errors,
)
from secagg.ring import MERSENNE_31

Q = shamir.PRIME
P = MERSENNE_31
FAST = settings(max_examples=20, deadline=None)
PRIMES = st.sampled_from([Q, P, 10007])


def poly_eval(coeffs: list[int], x: int, prime: int) -> int:
    """Reference evaluation, independent of the module (Python ints, reduced at the end)."""
    return sum(c * pow(x, i, prime) for i, c in enumerate(coeffs)) % prime


def codeword(rnd: random.Random, *, n: int, k: int, prime: int) -> tuple[list[int], list[int], list[int]]:
    """(coeffs, xs, ys): a random polynomial of degree < k and its values at n distinct random points."""
    coeffs = [rnd.randrange(prime) for _ in range(k)]
    xs = rnd.sample(range(1, min(prime, 10**6)), n)
    return coeffs, xs, [poly_eval(coeffs, x, prime) for x in xs]


def corrupt(rnd: random.Random, ys: list[int], positions, prime: int) -> list[int]:
    """Replace the values at `positions` by random OTHER field elements."""
    out = list(ys)
    for i in positions:
        out[i] = (out[i] + rnd.randrange(1, prime)) % prime
    return out


shapes = st.integers(1, 8).flatmap(lambda k: st.tuples(st.just(k), st.integers(k, k + 9)))  # (k, n)


# ---- capacity --------------------------------------------------------------------------------------

@given(shapes)
def test_capacity_is_distance_minus_one_and_half_of_it(kn):
    k, n = kn
    detect, correct = capacity(n, k)
    assert detect == n - k
    assert 2 * correct <= detect < 2 * correct + 2


def test_capacity_rejects_k_above_n():
    with pytest.raises(ValueError, match=r"need 1 <= k <= n, got k=5, n=4"):
        capacity(4, 5)


# ---- scalar decoding -------------------------------------------------------------------------------

@FAST
@given(shapes, PRIMES, st.randoms(use_true_random=False))
def test_exact_recovery_without_errors(kn, prime, rnd):
    k, n = kn
    coeffs, xs, ys = codeword(rnd, n=n, k=k, prime=prime)
    assert decode_scalar(xs, ys, k=k, prime=prime) == (coeffs[0], frozenset())


@FAST
@given(shapes, PRIMES, st.randoms(use_true_random=False), st.data())
def test_corrects_up_to_half_the_redundancy_and_names_the_bad_indices(kn, prime, rnd, data):
    k, n = kn
    _, correct = capacity(n, k)
    coeffs, xs, ys = codeword(rnd, n=n, k=k, prime=prime)
    e = data.draw(st.integers(0, correct), label="errors")
    bad = frozenset(rnd.sample(range(n), e))
    assert decode_scalar(xs, corrupt(rnd, ys, bad, prime), k=k, prime=prime) == (coeffs[0], bad)


def test_errors_among_the_first_k_points_defeat_the_fast_path_but_are_corrected():
    rnd = random.Random(1)
    coeffs, xs, ys = codeword(rnd, n=21, k=11, prime=Q)
    bad = frozenset({0, 3, 7, 10, 20})
    assert decode_scalar(xs, corrupt(rnd, ys, bad, Q), k=11, prime=Q) == (coeffs[0], bad)


@FAST
@given(st.integers(1, 6), st.integers(1, 8), PRIMES, st.randoms(use_true_random=False), st.data())
def test_detect_only_mode_flags_every_error_count_up_to_n_minus_k(k, redundancy, prime, rnd, data):
    n = k + redundancy
    _, xs, ys = codeword(rnd, n=n, k=k, prime=prime)
    e = data.draw(st.integers(1, n - k), label="errors")
    message = rf"{n} points .* at most 0 wrong values \(up to {n - k} are detectable\)"
    with pytest.raises(UncorrectableError, match=message):
        decode_scalar(xs, corrupt(rnd, ys, rnd.sample(range(n), e), prime), k=k, prime=prime, max_errors=0)


@FAST
@given(st.integers(1, 6), st.integers(1, 9), PRIMES, st.randoms(use_true_random=False), st.data())
def test_errors_beyond_the_radius_but_within_distance_minus_radius_always_raise(k, redundancy, prime, rnd, data):
    """Deterministic guarantee: t < e <= n - k - t wrong values never yield an answer, whatever they are."""
    n = k + redundancy
    t = data.draw(st.integers(0, (redundancy - 1) // 2), label="radius")  # so that t + 1 <= n - k - t
    e = data.draw(st.integers(t + 1, n - k - t), label="errors")
    _, xs, ys = codeword(rnd, n=n, k=k, prime=prime)
    with pytest.raises(UncorrectableError, match=rf"uncorrectable: .*{n} points .* at most {t} wrong values"):
        decode_scalar(xs, corrupt(rnd, ys, rnd.sample(range(n), e), prime), k=k, prime=prime, max_errors=t)


@FAST
@given(st.integers(1, 6), st.integers(2, 9), st.integers(0, 2**32), st.data())
def test_random_errors_beyond_the_radius_raise_over_the_large_field(k, redundancy, seed, data):
    """Not a worst-case guarantee (see the next test) but one for random wrong values: landing within
    distance t of another codeword has probability about n^t / q, negligible for q = 2^255 - 19.
    (A seeded Mersenne twister, not hypothesis' Random, which would pick colluding values on purpose.)"""
    rnd = random.Random(seed)
    n = k + redundancy
    t = redundancy // 2
    e = data.draw(st.integers(t + 1, n), label="errors")
    _, xs, ys = codeword(rnd, n=n, k=k, prime=Q)
    with pytest.raises(UncorrectableError, match=rf"at most {t} wrong values"):
        decode_scalar(xs, corrupt(rnd, ys, rnd.sample(range(n), e), Q), k=k, prime=Q)


def test_colluding_errors_beyond_distance_minus_radius_are_miscorrected_as_documented():
    """n - t wrong values that all lie on another polynomial G: the word is within t of G's codeword,
    so G's secret is returned; the limit the module docstring states, shown, not hidden."""
    rnd = random.Random(7)
    n, k = 9, 3
    f, xs, ys = codeword(rnd, n=n, k=k, prime=Q)
    g = [(f[0] + 1) % Q] + [rnd.randrange(Q) for _ in range(k - 1)]
    _, t = capacity(n, k)
    honest = set(rnd.sample(range(n), t))
    received = [ys[i] if i in honest else poly_eval(g, x, Q) for i, x in enumerate(xs)]
    wrong = sum(received[i] != ys[i] for i in range(n))
    assert wrong > n - k - t  # outside the guarantee
    value, bad = decode_scalar(xs, received, k=k, prime=Q)
    assert value == g[0] != f[0]
    assert bad == frozenset(i for i in honest if ys[i] != poly_eval(g, xs[i], Q))


def test_no_redundancy_returns_the_interpolated_value_unchecked():
    rnd = random.Random(3)
    coeffs, xs, ys = codeword(rnd, n=4, k=4, prime=P)
    wrong = corrupt(rnd, ys, [2], P)
    value, bad = decode_scalar(xs, wrong, k=4, prime=P)
    assert bad == frozenset() and value != coeffs[0]


def test_zero_may_be_an_evaluation_point():
    rnd = random.Random(4)
    coeffs = [rnd.randrange(P) for _ in range(3)]
    xs = [5, 0, 9, 2, 11, 7, 4]
    ys = corrupt(rnd, [poly_eval(coeffs, x, P) for x in xs], [1, 6], P)
    assert decode_scalar(xs, ys, k=3, prime=P) == (coeffs[0], frozenset({1, 6}))


def test_uncorrectable_error_carries_its_numbers():
    rnd = random.Random(5)
    _, xs, ys = codeword(rnd, n=21, k=11, prime=Q)
    message = r"21 points of a polynomial of degree < 11 tolerate at most 5 wrong values \(up to 10 are detectable\)"
    with pytest.raises(UncorrectableError, match=message) as info:
        decode_scalar(xs, corrupt(rnd, ys, range(6), Q), k=11, prime=Q)
    assert (info.value.points, info.value.k, info.value.max_errors, info.value.row) == (21, 11, 5, None)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("xs", "ys", "kwargs", "message"),
    [
        ([1, 2], [3, 4], {"k": 3}, r"need at least k = 3 points, got 2"),
        ([1, 2, 1], [3, 4, 5], {"k": 2}, r"points must be distinct"),
        ([1, 2, 3], [3, 4], {"k": 2}, r"need one value per point: 3 points, 2 values"),
        ([1, 2, 3], [3, P, 5], {"k": 2}, r"values must be residues in \[0, prime\)"),
        ([1, 2, 3], [3, -1, 5], {"k": 2}, r"values must be residues in \[0, prime\)"),
        ([1, 2, P], [3, 4, 5], {"k": 2}, r"points must be residues in \[0, prime\)"),
        ([1, 2, 3], [3, 4, 5], {"k": 0}, r"k must be at least 1, got 0"),
        ([1, 2, 3, 4, 5], [1, 2, 3, 4, 5], {"k": 2, "max_errors": 2},
         r"max_errors must be in \[0, 1\] for 5 points and k = 2, got 2"),
        ([1, 2, 3], [3, 4, 5], {"k": 2, "prime": 1}, r"prime must be an integer >= 2, got 1"),
    ],
)
def test_bad_input_is_refused(xs, ys, kwargs, message):
    kwargs = {"prime": P, **kwargs}
    with pytest.raises(ValueError, match=message) as info:
        decode_scalar(xs, ys, **kwargs)
    assert not isinstance(info.value, UncorrectableError)


def test_non_integer_values_are_refused_not_truncated():
    with pytest.raises(TypeError, match=r"'float' object cannot be interpreted as an integer"):
        decode_scalar([1, 2, 3], [3.0, 4, 5], k=2, prime=P)


# ---- batched decoding ------------------------------------------------------------------------------

@FAST
@given(shapes, PRIMES, st.randoms(use_true_random=False), st.integers(1, 12))
def test_batched_decoding_matches_the_scalar_decoder(kn, prime, rnd, count):
    k, n = kn
    _, correct = capacity(n, k)
    xs = rnd.sample(range(1, min(prime, 10**6)), n)
    rows, secrets_, bads = [], [], []
    for _ in range(count):
        coeffs = [rnd.randrange(prime) for _ in range(k)]
        bad = frozenset(rnd.sample(range(n), rnd.randint(0, correct)))
        rows.append(corrupt(rnd, [poly_eval(coeffs, x, prime) for x in xs], bad, prime))
        secrets_.append(coeffs[0])
        bads.append(bad)
    values, bad_by_row = decode_many(xs, rows, k=k, prime=prime)
    assert (values, bad_by_row) == (secrets_, bads)
    assert [decode_scalar(xs, row, k=k, prime=prime) for row in rows] == list(zip(values, bad_by_row))


def test_batched_shamir_unmasking_with_corrupted_shares():
    """The server's case: many secrets shared by `shamir.split` to one holder set, a few shares wrong."""
    rnd = random.Random(11)
    holders = sorted(rnd.sample(range(1, 500), 21))
    secrets_ = [shamir.random_element() for _ in range(50)]
    rows = shamir.split(secrets_, xs=holders, threshold=11)
    liars = frozenset({2, 13, 19})  # holders sending wrong shares for every secret
    rows = [corrupt(rnd, row, liars, Q) for row in rows]
    values, bad = decode_many(holders, rows, k=11, prime=Q)
    assert values == secrets_
    assert bad == [liars] * len(secrets_)
    assert shamir.combine(holders, rows) != secrets_  # without location the liars win


def test_batched_uncorrectable_row_is_named():
    rnd = random.Random(12)
    xs = rnd.sample(range(1, 100), 7)
    polys = [[rnd.randrange(Q) for _ in range(3)] for _ in range(4)]
    rows = [[poly_eval(f, x, Q) for x in xs] for f in polys]
    rows[2] = corrupt(rnd, rows[2], [0, 1, 2], Q)
    message = r"^row 2: uncorrectable: .*7 points .* at most 2 wrong values"
    with pytest.raises(UncorrectableError, match=message) as info:
        decode_many(xs, rows, k=3, prime=Q)
    assert info.value.row == 2


def test_batched_rejects_a_short_row():
    with pytest.raises(ValueError, match=r"need one value per point: 3 points, 2 values"):
        decode_many([1, 2, 3], [[1, 2, 3], [1, 2]], k=2, prime=P)


# ---- vector codewords: LightSecAgg coded pieces ------------------------------------------------------

def coded_sum(code: lcc.LagrangeCode, masks: list[np.ndarray]) -> np.ndarray:
    total = np.zeros((code.num_coded, code.piece_length), dtype=np.int64)
    for mask in masks:
        total = (total + code.encode(mask).astype(np.int64)) % P
    return total.astype(np.uint32)


@pytest.fixture(scope="module")
def lightsecagg_round():
    """N = 14 parties, U = 7, T = 2; 12 survivors answer with their aggregate coded piece."""
    rng = np.random.default_rng(21)  # test data only
    code = lcc.LagrangeCode(num_coded=14, num_nodes=7, privacy=2, length=101)
    masks = [rng.integers(0, P, code.length, dtype=np.int64).astype(np.uint32) for _ in range(4)]
    expected = (np.sum([m.astype(np.int64) for m in masks], axis=0) % P).astype(np.uint32)
    positions = sorted(rng.choice(code.num_coded, 12, replace=False).tolist())
    pieces = coded_sum(code, masks)[positions]
    xs = [lcc.betas(code.num_coded)[j] for j in positions]
    return code, positions, xs, pieces, expected


def decode_trusted(code, positions, pieces, bad):
    keep = [i for i in range(len(positions)) if i not in bad]
    return code.decode([positions[i] for i in keep], pieces[keep])


def test_vector_locator_finds_nothing_on_honest_pieces(lightsecagg_round):
    code, positions, xs, pieces, expected = lightsecagg_round
    assert locate_vector_errors(xs, pieces, k=code.num_nodes) == frozenset()
    assert np.array_equal(decode_trusted(code, positions, pieces, frozenset()), expected)


@pytest.mark.parametrize("bad", [frozenset({0}), frozenset({4}), frozenset({1, 11}), frozenset({0, 6})])
@pytest.mark.parametrize("sparse", [True, False])
def test_vector_locator_finds_wrong_pieces_and_the_rest_decode(lightsecagg_round, bad, sparse):
    code, positions, xs, pieces, expected = lightsecagg_round
    rng = np.random.default_rng(sorted(bad)[0] + 100 * sparse)
    corrupted = pieces.astype(np.int64)
    for i in bad:
        if sparse:  # one word off by one: the stealthiest change
            corrupted[i, rng.integers(code.piece_length)] += 1
        else:
            corrupted[i] += rng.integers(1, P, code.piece_length)
    corrupted = (corrupted % P).astype(np.uint32)
    assert locate_vector_errors(xs, corrupted, k=code.num_nodes) == bad
    assert np.array_equal(decode_trusted(code, positions, corrupted, bad), expected)
    if 0 in bad:  # what the protocol would get by trusting the first U pieces
        assert not np.array_equal(decode_trusted(code, positions, corrupted, frozenset()), expected)


def test_vector_locator_raises_beyond_the_radius(lightsecagg_round):
    """n = 12, k = 7: t = 2 and 3 <= n - k - t wrong rows must raise (up to a 2^-62-ish projection miss)."""
    code, positions, xs, pieces, _ = lightsecagg_round
    corrupted = pieces.copy()
    corrupted[[2, 5, 9], 0] = (corrupted[[2, 5, 9], 0].astype(np.int64) + 1) % P
    message = r"12 points of a polynomial of degree < 7 tolerate at most 2 wrong values"
    with pytest.raises(UncorrectableError, match=message):
        locate_vector_errors(xs, corrupted, k=code.num_nodes)


def test_vector_locator_reduces_any_integer_representation(lightsecagg_round):
    code, _, xs, pieces, _ = lightsecagg_round
    shifted = pieces.astype(np.int64) - P * np.int64(3)  # negative, congruent
    shifted[3, 7] += 1
    as_objects = pieces.astype(object) + P * (1 << 100)  # huge Python ints, congruent
    as_objects[8, 0] += 5
    assert locate_vector_errors(xs, shifted, k=code.num_nodes) == frozenset({3})
    assert locate_vector_errors(xs, as_objects, k=code.num_nodes) == frozenset({8})


def test_projection_is_exact_at_the_largest_residues_over_several_chunks():
    """Overflow check: every entry p - 1, coefficients near p, more columns than one chunk."""
    rng = np.random.default_rng(5)
    length = 70_001
    pieces = np.full((3, length), P - 1, dtype=np.uint32)
    pieces[1] = rng.integers(0, P, length, dtype=np.int64)
    coeffs = np.stack([np.full(length, P - 1, dtype=np.uint64), rng.integers(0, P, length).astype(np.uint64)])
    expected = [[int(v) for v in row] for row in (coeffs.astype(object) @ pieces.T.astype(object)) % P]
    assert _project(pieces, coeffs, P) == expected
    # coefficients drawn block by block (how locate_vector_errors draws them): the same projection
    asked = []
    assert _project(pieces, lambda c0, c1: asked.append((c0, c1)) or coeffs[:, c0:c1], P, rows=2) == expected
    assert asked[0] == (0, 32768) and asked[-1][1] == length and len(asked) == 3


def test_keyed_rng_makes_the_projection_reproducible(lightsecagg_round):
    code, _, xs, pieces, _ = lightsecagg_round
    corrupted = pieces.copy()
    corrupted[5, 3] ^= 1
    found = [
        locate_vector_errors(xs, corrupted, k=code.num_nodes, rng=CryptoRandom(bytes(32)), rounds=r) for r in (1, 3)
    ]
    assert found == [frozenset({5})] * 2


@pytest.mark.parametrize(
    ("pieces", "kwargs", "message"),
    [
        (np.zeros(12, dtype=np.uint32), {}, r"pieces must be a 2-D array \(n, L\) with L >= 1, got shape \(12,\)"),
        (np.zeros((11, 4), dtype=np.uint32), {}, r"need one piece per point: 12 points, 11 pieces"),
        (np.zeros((12, 4), dtype=np.float64), {}, r"pieces must be integers, got dtype float64"),
        (np.zeros((12, 4), dtype=np.uint32), {"prime": 1 << 32}, r"prime must be an integer in \[2, 2\^32\)"),
        (np.zeros((12, 4), dtype=np.uint32), {"rounds": 0}, r"rounds must be at least 1, got 0"),
    ],
)
def test_vector_locator_refuses_bad_input(lightsecagg_round, pieces, kwargs, message):
    code, _, xs, _, _ = lightsecagg_round
    with pytest.raises(ValueError, match=message):
        locate_vector_errors(xs, pieces, k=code.num_nodes, **kwargs)
