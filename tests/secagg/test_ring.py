"""Laws of the two rings secure sums live in: Z_{2^32} and F_p, p = 2^31 - 1."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from secagg.ring import FIELD_P31, MERSENNE_31, RING_2_32, Ring

RINGS = [RING_2_32, FIELD_P31, Ring(65521)]  # 65521: a small prime, so wrap-arounds are frequent
FAST = settings(max_examples=40, deadline=None)


def _edge_biased(ring: Ring):
    m = ring.modulus
    return st.one_of(st.integers(0, m - 1), st.sampled_from([0, 1, m - 1, m - 2, ring.half, ring.half - 1, ring.half + 1]))


@st.composite
def ring_and_vectors(draw, count: int = 2):
    ring = draw(st.sampled_from(RINGS))
    n = draw(st.integers(1, 64))
    vecs = [np.array(draw(st.lists(_edge_biased(ring), min_size=n, max_size=n)), dtype=np.uint32) for _ in range(count)]
    return ring, vecs


def _py(v: np.ndarray) -> list[int]:
    return [int(a) for a in v]


@FAST
@given(ring_and_vectors(2))
def test_add_and_sub_match_python_modular_arithmetic(rv):
    ring, (a, b) = rv
    m = ring.modulus
    s = ring.add_(a.copy(), b)
    d = ring.sub_(a.copy(), b)
    assert s.dtype == np.uint32 and d.dtype == np.uint32
    assert _py(s) == [(x + y) % m for x, y in zip(_py(a), _py(b))]
    assert _py(d) == [(x - y) % m for x, y in zip(_py(a), _py(b))]


@FAST
@given(ring_and_vectors(3))
def test_group_laws(rv):
    ring, (a, b, c) = rv
    # commutative, associative, sub inverts add, neg is the additive inverse and an involution
    assert np.array_equal(ring.add_(a.copy(), b), ring.add_(b.copy(), a))
    left = ring.add_(ring.add_(a.copy(), b), c)
    right = ring.add_(a.copy(), ring.add_(b.copy(), c))
    assert np.array_equal(left, right)
    assert np.array_equal(ring.sub_(ring.add_(a.copy(), b), b), a)
    assert not ring.add_(a.copy(), ring.neg(a)).any()
    assert np.array_equal(ring.neg(ring.neg(a)), a)
    assert np.array_equal(ring.sub_(a.copy(), b), ring.add_(a.copy(), ring.neg(b)))
    for v in (left, ring.neg(a), ring.sub_(a.copy(), b)):
        assert int(v.max()) < ring.modulus


def test_add_and_sub_are_in_place():
    for ring in RINGS:
        acc = np.array([1, 2, 3], dtype=np.uint32)
        assert ring.add_(acc, np.array([1, 1, 1], dtype=np.uint32)) is acc
        assert ring.sub_(acc, np.array([1, 1, 1], dtype=np.uint32)) is acc
        assert _py(acc) == [1, 2, 3]


@FAST
@given(st.sampled_from(RINGS), st.data())
def test_signed_lift_round_trips(ring, data):
    m, h = ring.modulus, ring.half
    hi = h if m % 2 else h - 1  # odd modulus: the centred range is symmetric [-h, h]
    v = np.array(data.draw(st.lists(st.one_of(st.integers(-h, hi), st.sampled_from([-h, hi, 0, -1, 1])), min_size=1, max_size=50)),
                 dtype=np.int64)
    r = ring.from_signed(v)
    assert r.dtype == np.uint32 and int(r.max()) < m
    assert np.array_equal(ring.to_signed(r), v)
    assert _py(r) == [int(x) % m for x in v]


@FAST
@given(ring_and_vectors(1))
def test_to_signed_is_the_centred_representative(rv):
    ring, (r,) = rv
    s = ring.to_signed(r)
    assert s.dtype == np.int64
    assert np.all(s >= -ring.half) and np.all(s <= ring.half)
    assert np.all(np.abs(s) <= ring.modulus / 2)
    assert np.array_equal(ring.from_signed(s), r)


@FAST
@given(st.sampled_from(RINGS), st.data())
def test_ring_sum_of_signed_values_decodes_exactly_when_it_fits(ring, data):
    """The homomorphism encoding relies on: lift(sum of reps) = sum of values when |sum| < half."""
    n = data.draw(st.integers(1, 30))
    bound = ring.half // n - 1
    vals = np.array(data.draw(st.lists(st.integers(-bound, bound), min_size=n, max_size=n)), dtype=np.int64)
    acc = np.zeros(1, dtype=np.uint32)
    for v in vals:
        ring.add_(acc, ring.from_signed(np.array([v])))
    assert int(ring.to_signed(acc)[0]) == int(vals.sum())


def test_extreme_values_of_the_2_32_ring():
    r = RING_2_32
    assert _py(r.to_signed(np.array([0, 2**31 - 1, 2**31, 2**32 - 1], dtype=np.uint32))) == [0, 2**31 - 1, -(2**31), -1]
    a = np.array([2**32 - 1], dtype=np.uint32)
    assert _py(r.add_(a, np.array([1], dtype=np.uint32))) == [0]
    assert _py(r.sub_(a, np.array([1], dtype=np.uint32))) == [2**32 - 1]


def test_extreme_values_of_the_mersenne_field():
    p = MERSENNE_31
    f = FIELD_P31
    a = np.array([p - 1, p - 1, 0], dtype=np.uint32)
    assert _py(f.add_(a.copy(), np.array([p - 1, 1, 0], dtype=np.uint32))) == [p - 2, 0, 0]
    assert _py(f.sub_(a.copy(), np.array([0, p - 1, p - 1], dtype=np.uint32))) == [p - 1, 0, 1]
    assert _py(f.neg(np.array([0, 1, p - 1], dtype=np.uint32))) == [0, p - 1, 1]


@pytest.mark.parametrize("modulus", [0, 1, 2, 1 << 31, (1 << 32) + 1, (1 << 32) - 1, -5])
def test_bad_moduli_are_refused(modulus):
    with pytest.raises(ValueError, match=r"modulus must be 2\^32 or a prime below 2\^31"):
        Ring(modulus)


def test_power_of_two_flag_and_half():
    assert RING_2_32.is_power_of_two and RING_2_32.half == 1 << 31
    assert not FIELD_P31.is_power_of_two and FIELD_P31.half == (MERSENNE_31 - 1) // 2


@pytest.mark.parametrize(
    "ring, x, length",
    [
        (RING_2_32, np.zeros(3, dtype=np.int64), 3),           # wrong dtype
        (RING_2_32, np.zeros(3, dtype=np.float32), 3),
        (RING_2_32, np.zeros((3, 1), dtype=np.uint32), 3),     # 2-D
        (RING_2_32, np.zeros(4, dtype=np.uint32), 3),          # wrong length
        (RING_2_32, [0, 0, 0], 3),                             # not an array
        (FIELD_P31, np.array([0, MERSENNE_31], dtype=np.uint32), 2),   # outside [0, p)
        (FIELD_P31, np.array([2**32 - 1], dtype=np.uint32), 1),
    ],
)
def test_validate_rejects(ring, x, length):
    with pytest.raises(ValueError, match=r"one-dimensional uint32 arrays|has length 4, expected 3|entries outside \[0, p\)"):
        ring.validate(x, length=length)


def test_validate_accepts_good_vectors():
    RING_2_32.validate(np.array([0, 2**32 - 1], dtype=np.uint32), length=2)
    FIELD_P31.validate(np.array([0, MERSENNE_31 - 1], dtype=np.uint32), length=2)
    FIELD_P31.validate(np.zeros(0, dtype=np.uint32), length=0)


@FAST
@given(arrays(np.uint32, st.integers(1, 40)))
def test_2_32_arithmetic_equals_numpy_wraparound(a):
    b = a[::-1].copy()
    assert np.array_equal(RING_2_32.add_(a.copy(), b), (a.astype(np.uint64) + b) % (1 << 32))


@pytest.mark.parametrize("length", [1, 6, 7, 8, 20, 21, 50])
def test_prime_field_reduction_block_by_block_is_exact(monkeypatch, length):
    """add_ / sub_ reduce a long vector a block at a time (no d-long temporary); any cut gives the exact
    result, on contiguous vectors, 2-D arrays and strided views alike."""
    from secagg import ring as ring_module

    monkeypatch.setattr(ring_module, "_REDUCE_BLOCK", 7)
    rng = np.random.default_rng(length)
    p = MERSENNE_31
    a = rng.integers(0, p, size=length, dtype=np.uint64)
    b = np.concatenate([[p - 1, 0], rng.integers(0, p, size=length, dtype=np.uint64)])[:length]
    fresh = (lambda: a.astype(np.uint32), lambda: a.astype(np.uint32).reshape(1, -1),
             lambda: np.repeat(a.astype(np.uint32), 2)[::2])  # contiguous, 2-D, strided
    for make in fresh:
        acc = make()
        x = b.astype(np.uint32).reshape(acc.shape)
        added = FIELD_P31.add_(acc, x)
        assert added is acc and np.array_equal(acc.reshape(-1), (a + b) % p)
        assert np.array_equal(FIELD_P31.sub_(acc, x).reshape(-1), a)
