"""Batched Shamir sharing over F_q, q = 2^255 - 19."""
from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from secagg import shamir
from secagg.shamir import PRIME, combine, lagrange_at_zero, split

FAST = settings(max_examples=40, deadline=None)
secret_st = st.one_of(st.integers(0, PRIME - 1), st.sampled_from([0, 1, PRIME - 1]))


@st.composite
def sharing(draw):
    n = draw(st.integers(1, 40))
    t = draw(st.integers(1, n))
    xs = draw(st.lists(st.integers(1, 2**31 - 1), min_size=n, max_size=n, unique=True))
    secrets_ = draw(st.lists(secret_st, min_size=1, max_size=4))
    return n, t, xs, secrets_


def _interpolate(points: list[tuple[int, int]], x: int) -> int:
    """Value at x of the unique polynomial of degree < len(points) through the points (mod q)."""
    total = 0
    for j, (xj, yj) in enumerate(points):
        num, den = 1, 1
        for m, (xm, _) in enumerate(points):
            if m != j:
                num = num * (x - xm) % PRIME
                den = den * (xj - xm) % PRIME
        total = (total + yj * num * pow(den, -1, PRIME)) % PRIME
    return total


@FAST
@given(sharing(), st.randoms(use_true_random=False))
def test_any_t_shares_reconstruct_every_secret_in_the_batch(params, rnd):
    n, t, xs, secrets_ = params
    shares = split(secrets_, xs=xs, threshold=t)
    assert len(shares) == len(secrets_) and all(len(r) == n for r in shares)
    assert all(0 <= s < PRIME for r in shares for s in r)
    k = rnd.randint(t, n)
    idx = sorted(rnd.sample(range(n), k))
    got = combine([xs[i] for i in idx], [[row[i] for i in idx] for row in shares])
    assert got == list(secrets_)


@FAST
@given(sharing(), secret_st)
def test_fewer_than_t_shares_are_consistent_with_every_secret(params, other_secret):
    """Information-theoretic hiding: t-1 shares plus ANY candidate secret define a valid
    degree-(t-1) sharing polynomial, so the shares cannot rule out any secret."""
    n, t, xs, secrets_ = params
    if t < 2:
        return
    row = split(secrets_[:1], xs=xs, threshold=t)[0]
    seen = list(zip(xs[: t - 1], row[: t - 1]))
    # The polynomial through (0, other_secret) and the t-1 seen shares has degree <= t-1 ...
    fake = seen + [(0, other_secret)]
    # ... it reproduces the seen shares, and a fresh share from it completes a valid t-sharing
    assert all(_interpolate(fake, x) == y for x, y in seen)
    x_new = max(xs) + 1
    y_new = _interpolate(fake, x_new)
    pts = [x for x, _ in seen] + [x_new]
    assert combine(pts, [[y for _, y in seen] + [y_new]]) == [other_secret]
    # and combining only the t-1 seen shares does not give the real secret (w.p. 1 - 1/q)
    assert combine([x for x, _ in seen], [[y for _, y in seen]]) != secrets_[:1]


def test_t_minus_1_shares_are_distributed_identically_for_different_secrets():
    """Empirical check on the low byte: share values of secret 0 and of secret q-1 look the same."""
    xs, t, reps = [3, 9, 11, 20, 21], 4, 1500
    low = {}
    for s in (0, PRIME - 1):
        rows = split([s] * reps, xs=xs, threshold=t)
        low[s] = np.array([r[i] & 0xFF for r in rows for i in range(t - 1)])
    for s, v in low.items():
        assert stats.chisquare(np.bincount(v, minlength=256)).pvalue > 1e-6, s
    # and over the whole field: the top byte of a share is uniform too (small coefficients would not be)
    for s in (0, PRIME - 1):
        rows = split([s] * reps, xs=xs, threshold=t)
        top = np.array([r[i] >> 247 for r in rows for i in range(t - 1)])
        assert stats.chisquare(np.bincount(top, minlength=256)).pvalue > 1e-6, s
    table = np.stack([np.bincount(low[s] >> 4, minlength=16) for s in low])
    assert stats.chi2_contingency(table).pvalue > 1e-6


def test_threshold_one_and_threshold_n():
    xs = [1, 2, 3, 4]
    (row,) = split([42], xs=xs, threshold=1)
    assert row == [42] * 4  # a constant polynomial
    (row,) = split([42], xs=xs, threshold=4)
    assert combine(xs, [row]) == [42]
    assert combine(xs[:3], [row[:3]]) != [42]


def test_extra_consistent_shares_are_fine_and_a_corrupted_share_changes_the_result():
    xs = list(range(1, 11))
    (row,) = split([123456789], xs=xs, threshold=4)
    assert combine(xs, [row]) == [123456789]
    bad = row.copy()
    bad[0] = (bad[0] + 1) % PRIME
    assert combine(xs[:4], [bad[:4]]) != [123456789]


def test_lagrange_coefficients_sum_to_one_and_reuse_across_secrets():
    xs = [5, 17, 2, 99]
    lam = lagrange_at_zero(xs)
    assert sum(lam) % PRIME == 1  # the constant polynomial 1
    secrets_ = [random.randrange(PRIME) for _ in range(20)]
    rows = split(secrets_, xs=xs, threshold=4)
    assert combine(xs, rows) == secrets_


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(xs=[1, 2, 3], threshold=0),
        dict(xs=[1, 2, 3], threshold=4),
        dict(xs=[1, 1, 2], threshold=2),
        dict(xs=[0, 1, 2], threshold=2),
        dict(xs=[PRIME, 1, 2], threshold=2),
        dict(xs=[-1, 1, 2], threshold=2),
        dict(xs=[], threshold=1),
    ],
)
def test_split_refuses_bad_parameters(kwargs):
    with pytest.raises(ValueError, match=r"threshold \d+ must be in \[1, \d+\]|share points must be distinct and non-zero"):
        split([1], **kwargs)


@pytest.mark.parametrize("secret", [-1, PRIME, PRIME + 5])
def test_split_refuses_secrets_outside_the_field(secret):
    with pytest.raises(ValueError, match="secret outside the field"):
        split([secret], xs=[1, 2], threshold=2)


def test_combine_refuses_duplicate_points_and_ragged_rows():
    with pytest.raises(ValueError, match="share points must be distinct"):
        combine([1, 1], [[3, 4]])
    with pytest.raises(ValueError, match="each secret needs one share per point"):
        combine([1, 2], [[3]])
    with pytest.raises(ValueError, match="share points must be distinct"):
        lagrange_at_zero([4, 4])


@FAST
@given(secret_st)
def test_byte_encoding_round_trips(v):
    b = shamir.to_bytes(v)
    assert len(b) == shamir.SECRET_BYTES
    assert shamir.from_bytes(b) == v


@pytest.mark.parametrize("bad", [b"", bytes(31), bytes(33), PRIME.to_bytes(32, "little"), b"\xff" * 32])
def test_from_bytes_refuses_out_of_field_or_wrong_length(bad):
    with pytest.raises(ValueError, match="field elements are 32 bytes|field element out of range"):
        shamir.from_bytes(bad)


def test_random_elements_are_in_range_and_fresh():
    vals = [shamir.random_element() for _ in range(200)]
    assert all(0 <= v < PRIME for v in vals)
    assert len(set(vals)) == 200
    # top bit of a 255-bit field element is set about half the time
    top = sum(v >> 254 for v in vals)
    assert 50 < top < 150
