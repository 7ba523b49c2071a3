import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nlp_models.losses import centered_gram, hsic, linear_cka


def _batch(seed: int, n: int = 12, h: int = 7) -> torch.Tensor:
    return torch.randn(n, h, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _cka_by_the_equations(x: torch.Tensor, y: torch.Tensor) -> float:
    """Eqs. 6-7 literally: K = XX^T, L = YY^T, H = I - 11^T/n, HSIC = tr(KHLH)/(n-1)^2."""
    n = x.shape[0]
    k, l = x @ x.T, y @ y.T
    h = torch.eye(n, dtype=x.dtype) - torch.ones(n, n, dtype=x.dtype) / n
    def hs(a, b):
        return torch.trace(a @ h @ b @ h) / (n - 1) ** 2
    return float(hs(k, l) / torch.sqrt(hs(k, k) * hs(l, l)))


seeds = st.integers(min_value=0, max_value=10_000)


@settings(max_examples=30, deadline=None)
@given(seed=seeds, n=st.integers(min_value=2, max_value=20), h=st.integers(min_value=1, max_value=9))
def test_cka_matches_eqs_6_7_and_lies_in_unit_interval(seed, n, h):
    x, y = _batch(seed, n, h), _batch(seed + 1, n, h + 1)
    value = float(linear_cka(x, y))
    assert value == pytest.approx(_cka_by_the_equations(x.double(), y.double()), abs=1e-5)
    assert -1e-6 <= value <= 1 + 1e-6


@settings(max_examples=30, deadline=None)
@given(seed=seeds, scale=st.floats(min_value=1e-3, max_value=1e3))
def test_cka_is_invariant_to_orthogonal_transforms_and_isotropic_scaling(seed, scale):
    x, y = _batch(seed), _batch(seed + 7)
    q, _ = torch.linalg.qr(torch.randn(7, 7, generator=torch.Generator().manual_seed(seed + 3), dtype=torch.float64))
    base = float(linear_cka(x, y))
    assert float(linear_cka(x @ q, y)) == pytest.approx(base, abs=1e-5)
    assert float(linear_cka(scale * x, y)) == pytest.approx(base, abs=1e-5)
    assert float(linear_cka(x, y * scale)) == pytest.approx(base, abs=1e-5)


@settings(max_examples=20, deadline=None)
@given(seed=seeds)
def test_cka_is_one_for_identical_inputs_and_symmetric(seed):
    x, y = _batch(seed), _batch(seed + 1)
    assert float(linear_cka(x, x)) == pytest.approx(1.0, abs=1e-6)
    assert float(linear_cka(x, y)) == pytest.approx(float(linear_cka(y, x)), abs=1e-6)


def test_cka_is_insensitive_to_a_shift_but_not_to_a_non_isotropic_scaling():
    x, y = _batch(0), _batch(1)
    assert float(linear_cka(x + 5.0, y)) == pytest.approx(float(linear_cka(x, y)), abs=1e-6)
    stretched = x * torch.linspace(0.1, 10.0, x.shape[1], dtype=x.dtype)
    assert abs(float(linear_cka(stretched, x)) - 1.0) > 1e-2


def test_gradients_flow_to_both_arguments():
    x = _batch(0).float().requires_grad_(True)
    y = _batch(1).float().requires_grad_(True)
    linear_cka(x, y).backward()
    for grad in (x.grad, y.grad):
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_gradient_ascent_increases_similarity():
    x = _batch(0).float()
    y = _batch(1).float().requires_grad_(True)
    before = float(linear_cka(x, y).detach())
    for _ in range(20):
        loss = -linear_cka(x, y)
        (grad,) = torch.autograd.grad(loss, y)
        y = (y - 0.5 * grad).detach().requires_grad_(True)
    assert float(linear_cka(x, y).detach()) > before + 0.05


def test_constant_batch_scores_zero_with_finite_gradient():
    x = torch.ones(5, 3, requires_grad=True)
    value = linear_cka(x, _batch(2, 5, 3).float())
    value.backward()
    assert float(value.detach()) == 0.0 and torch.isfinite(x.grad).all()


def test_hsic_and_gram_validate_shapes():
    with pytest.raises(ValueError, match="rows"):
        linear_cka(torch.zeros(3, 2), torch.zeros(4, 2))
    with pytest.raises(ValueError, match="two examples"):
        linear_cka(torch.zeros(1, 2), torch.zeros(1, 2))
    with pytest.raises(ValueError, match=r"\(n, h\)"):
        centered_gram(torch.zeros(3))
    with pytest.raises(ValueError, match="Gram"):
        hsic(torch.zeros(3, 3), torch.zeros(2, 2))
    assert np.isclose(float(hsic(centered_gram(_batch(0)), centered_gram(_batch(0)))),
                      float((centered_gram(_batch(0)) ** 2).sum() / 11 ** 2))


def test_linear_cka_gradient_matches_finite_differences():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.randn(6, 4, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(linear_cka, (x, y), eps=1e-6, atol=1e-7)
    near = (x.detach() + 1e-2 * torch.randn(6, 5, generator=g, dtype=torch.float64)).requires_grad_(True)
    assert torch.autograd.gradcheck(linear_cka, (x, near), eps=1e-6, atol=1e-7)  # near-identical inputs too
