"""dp.audit.canaries: seeded isotropic unit canaries and the cosine statistic."""
import numpy as np
import pytest

from dp.audit.canaries import canary_directions, canary_scores, cosines


def test_canaries_are_unit_vectors_reproducible_from_the_seed():
    a = canary_directions(count=50, dim=32, seed=[7, 1])
    assert a.shape == (50, 32)
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0)
    np.testing.assert_array_equal(a, canary_directions(count=50, dim=32, seed=[7, 1]))
    assert not np.allclose(a, canary_directions(count=50, dim=32, seed=[7, 2]))


def test_orthogonal_canaries_are_an_orthonormal_frame_that_is_still_isotropic():
    frame = canary_directions(count=64, dim=64, seed=3, orthogonal=True)
    np.testing.assert_allclose(frame @ frame.T, np.eye(64), atol=1e-10)
    many = np.concatenate([canary_directions(count=8, dim=8, seed=s, orthogonal=True) for s in range(2000)])
    np.testing.assert_allclose(many.mean(axis=0), 0.0, atol=0.02)  # no preferred direction (the sign fix)
    np.testing.assert_allclose((many**2).mean(axis=0), 1 / 8, atol=0.01)
    with pytest.raises(ValueError, match="do not fit in 4 dimensions"):
        canary_directions(count=5, dim=4, seed=0, orthogonal=True)


def test_cosines_of_one_or_several_releases_and_of_nothing():
    d = np.eye(3)
    np.testing.assert_allclose(cosines(d, np.array([3.0, 4.0, 0.0])), [0.6, 0.8, 0.0])
    per_round = cosines(d, np.array([[1.0, 0, 0], [0, 0, 0]]))
    np.testing.assert_allclose(per_round, [[1.0, 0.0], [0.0, 0.0], [0.0, 0.0]])  # a zero release scores 0


def test_final_model_and_all_iterates_statistics():
    d = np.eye(2)
    deltas = np.array([[1.0, 0.0], [-1.0, 1.0]])  # the first canary's round cancels out of the final model
    s = canary_scores(d, deltas)
    np.testing.assert_allclose(s["final"], [0.0, 1.0])
    np.testing.assert_allclose(s["all_iterates"], [1.0, 1 / np.sqrt(2)])
