"""Skellam / distributed discrete Gaussian RDP curves and the Zhu-Wang subsampling bound."""
import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import rdp
from hypothesis import given, settings
from hypothesis import strategies as st

from dp.accounting import (ORDERS, conditional_rounding_bound, curve, discrete_gaussian_curve, epsilon_from_rdp,
                           rounded_l1_norm_bound, rounded_l2_norm_bound, skellam_curve)

DELTA = 1e-5


def gaussian_epsilon(z: float, *, q: float = 1.0, steps: int = 1) -> float:
    event = dp_accounting.GaussianDpEvent(z)
    if q < 1:
        event = dp_accounting.PoissonSampledDpEvent(q, event)
    acc = rdp.RdpAccountant()
    acc.compose(dp_accounting.SelfComposedDpEvent(event, steps))
    return acc.get_epsilon(DELTA)


def skellam_epsilon(*, z: float, scale: float, dim: int = 1024, q: float = 1.0, steps: int = 1) -> float:
    """Clip C = 1 scaled by `scale`, central noise z * scale, rounding inflation included."""
    l2 = rounded_l2_norm_bound(scale, beta=math.exp(-0.5), dim=dim)
    l1 = rounded_l1_norm_bound(l2, dim=dim)
    return epsilon_from_rdp(steps * skellam_curve(l1=l1, l2=l2, variance=(z * scale) ** 2, sampling_rate=q),
                            delta=DELTA)


@settings(max_examples=30, deadline=None)
@given(z=st.floats(0.3, 5.0), factor=st.floats(1.05, 4.0), scale=st.floats(10.0, 1e5))
def test_skellam_epsilon_decreases_with_noise(z, factor, scale):
    assert skellam_epsilon(z=z * factor, scale=scale) < skellam_epsilon(z=z, scale=scale)


def gaussian_epsilon_at_integer_orders(z: float) -> float:
    """The continuous Gaussian on the grid our curves use (fractional orders rounded up)."""
    return epsilon_from_rdp(curve(lambda a: a / (2 * z**2)), delta=DELTA)


@pytest.mark.parametrize("z", [0.7, 1.0, 2.0])
def test_skellam_approaches_gaussian_at_high_scale(z):
    gauss = gaussian_epsilon_at_integer_orders(z)
    assert gauss == pytest.approx(gaussian_epsilon(z), rel=0.01)  # rounding orders up costs < 1%
    gaps = [skellam_epsilon(z=z, scale=s) - gauss for s in (30.0, 300.0, 3e3, 3e5)]
    assert all(g >= -1e-9 for g in gaps)  # never better than the continuous Gaussian
    assert gaps == sorted(gaps, reverse=True)
    assert gaps[-1] < 1e-3 * gauss


def test_discrete_gaussian_approaches_gaussian_and_degrades_at_low_noise():
    z, n, dim = 1.0, 50, 4096
    gauss = gaussian_epsilon_at_integer_orders(z)

    def ddg(scale: float) -> float:
        local = z * scale / math.sqrt(n)
        return epsilon_from_rdp(discrete_gaussian_curve(l1=scale * math.sqrt(dim), l2=scale, local_stddev=local,
                                                        n_clients=n, dim=dim), delta=DELTA)

    assert ddg(1e4) == pytest.approx(gauss, rel=1e-3)
    assert ddg(3.0) > 2 * gauss  # scaled local noise below ~1: the sum is far from a discrete Gaussian


def test_subsampling_bound_is_valid_and_useful_for_the_gaussian():
    z, q = 1.2, 0.01
    exact = rdp.RdpAccountant()
    exact.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)))
    zhu_wang = curve(lambda a: a / (2 * z**2), sampling_rate=q)
    unamplified = np.array([math.ceil(a) / (2 * z**2) for a in ORDERS])
    assert np.all(zhu_wang >= exact.rdp - 1e-12)  # an upper bound (at ceil(alpha) >= alpha)
    assert np.all(zhu_wang <= unamplified + 1e-12)
    eps_zw = epsilon_from_rdp(1000 * zhu_wang, delta=DELTA)
    eps_exact = gaussian_epsilon(z, q=q, steps=1000)
    assert eps_exact <= eps_zw < 1.5 * eps_exact


def test_subsampled_skellam_is_amplified():
    full = skellam_epsilon(z=1.0, scale=1e4, steps=100)
    sampled = skellam_epsilon(z=1.0, scale=1e4, q=0.01, steps=100)
    assert sampled < full / 5


def test_rounding_bounds():
    c, d = 100.0, 4096
    assert rounded_l2_norm_bound(c, beta=0.0, dim=d) == pytest.approx(c + 64.0)
    conditional = rounded_l2_norm_bound(c, beta=math.exp(-0.5), dim=d)
    assert c < conditional < c + 64.0
    assert conditional == pytest.approx(conditional_rounding_bound(c, beta=math.exp(-0.5), dim=d))
    assert rounded_l1_norm_bound(3.0, dim=100) == 9.0  # integer vectors: L1 <= L2^2
    assert rounded_l1_norm_bound(30.0, dim=100) == 300.0  # L1 <= sqrt(d) L2


def test_epsilon_from_rdp_edge_cases():
    assert epsilon_from_rdp(np.zeros(len(ORDERS)), delta=DELTA) == 0.0
    assert epsilon_from_rdp(np.full(len(ORDERS), np.inf), delta=DELTA) == math.inf


def test_the_order_grid_is_dp_accountings_default_without_importing_it_at_start_up():
    """dp.accounting writes dp_accounting's default RDP orders out, so a client that never accounts does not
    import dp_accounting and scipy (1 s); the grid must stay the same, and the import lazy."""
    import subprocess
    import sys

    from dp_accounting.rdp.rdp_privacy_accountant import DEFAULT_RDP_ORDERS

    from dp.accounting import ORDERS

    assert ORDERS == tuple(float(a) for a in DEFAULT_RDP_ORDERS)
    code = ("import sys, dp.accounting, dp.ledger, fl_algorithms.engine.round; "
            "print('dp_accounting' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stdout + done.stderr
