"""Randomised Hadamard rotation: orthonormal, invertible, deterministic in the public seed."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.linalg import hadamard

from dp.rotation import fwht_, padded_length, rademacher_signs, rotate, unrotate


@pytest.mark.parametrize("n", [1, 2, 8, 64])
def test_fwht_matches_the_hadamard_matrix(n):
    x = np.random.default_rng(n).normal(size=n)
    assert np.allclose(fwht_(x.copy()), hadamard(n) @ x)


@settings(max_examples=40, deadline=None)
@given(dim=st.integers(1, 300), seed=st.integers(0, 2**64), data=st.data())
def test_rotation_is_orthonormal_and_inverted(dim, seed, data):
    x = np.array(data.draw(st.lists(st.floats(-1e3, 1e3), min_size=dim, max_size=dim)))
    y = rotate(x, seed=seed)
    assert y.shape == (padded_length(dim),)
    assert np.linalg.norm(y) == pytest.approx(np.linalg.norm(x), rel=1e-9, abs=1e-9)
    assert np.allclose(unrotate(y, seed=seed, dim=dim), x, atol=1e-9 * (1 + np.abs(x).max()))


def test_signs_depend_only_on_the_seed():
    a = rademacher_signs(b"round-1", 1000)
    assert np.array_equal(a, rademacher_signs(b"round-1", 1000))
    assert not np.array_equal(a, rademacher_signs(b"round-2", 1000))
    assert set(np.unique(a)) == {-1.0, 1.0}
    assert abs(a.mean()) < 0.15


def test_rotation_flattens_a_spike():
    x = np.zeros(1024)
    x[3] = 1.0
    y = rotate(x, seed=7)
    assert np.allclose(np.abs(y), 1 / 32)


def test_wrong_lengths_and_seeds_raise():
    with pytest.raises(ValueError, match="rotated length 8 does not match dimension 100"):
        unrotate(np.zeros(8), seed=1, dim=100)
    with pytest.raises(TypeError, match="round seeds are bytes or non-negative ints"):
        rotate(np.zeros(4), seed=-1)
    with pytest.raises(ValueError, match="power of two"):
        fwht_(np.zeros(6))
