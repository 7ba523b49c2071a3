"""RDP curves for the mechanisms dp_accounting has no event for, and the one RDP -> (eps, delta) step.

Gaussian mechanisms (plain or subsampled) are always accounted by `dp_accounting` itself (see
`dp.ledger`). This module holds only what it lacks:

* Skellam (Agarwal, Kairouz, Liu, arXiv 2110.04995, Thm. 3.5), in the scaled integer domain:
      eps(a) = a D2^2 / (2 mu) + min( ((2a - 1) D2^2 + 6 D1) / (4 mu^2),  3 D1 / (2 mu) )
  with mu the variance of the summed Skellam noise and D1, D2 the L1/L2 sensitivities.
* Distributed discrete Gaussian (Kairouz, Liu, Steinke, arXiv 2102.06387, Prop. 14 / Eq. 17):
      eps(a) = min( a/2 D2'^2 + tau d,  a/2 (D2'^2 + 2 D1' tau + tau^2 d),  a/2 (D2' + sqrt(d) tau)^2 )
  with D' = D / (sqrt(n) sigma) and tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 sigma^2 k / (k + 1)).
* Poisson subsampling of any RDP curve (Zhu & Wang, ICML 2019, "Poisson subsampled RDP",
  general upper bound), the form used in the authors' `distributed_dp/accounting_utils.py`.
* Rounding-inflated sensitivities (arXiv 2102.06387, Thm. 1).

The three closed forms and the subsampling bound hold at integer orders. A curve is evaluated at
ceil(alpha) for fractional orders: Renyi divergence is non-decreasing in alpha, so this is a valid
(slightly loose) upper bound, and it lets every curve share dp_accounting's default order grid, so
curves from here and from dp_accounting's RdpAccountant add up order by order.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from scipy import special

ORDERS: tuple[float, ...] = tuple(float(a) for a in [1 + x / 10.0 for x in range(1, 100)] + list(range(11, 64))
                                   + [128, 256, 512, 1024])
"""The RDP orders every curve in this package is evaluated at: dp_accounting's default grid
(`DEFAULT_RDP_ORDERS`), written out so that importing this module does not import dp_accounting and scipy
(1 s that every deployed client paid at start-up); a test checks the two are equal."""

RdpFn = Callable[[int], float]


def epsilon_from_rdp(rdp: Sequence[float], *, delta: float, orders: Sequence[float] = ORDERS) -> float:
    """(eps, delta) from an RDP curve, by dp_accounting's conversion (Balle et al. 2020, Thm. 21)."""
    rdp = np.asarray(rdp, dtype=np.float64)
    if np.all(rdp == 0):
        return 0.0
    if not np.any(np.isfinite(rdp)):
        return math.inf
    from dp_accounting.rdp import compute_epsilon

    eps, _ = compute_epsilon(list(orders), list(rdp), delta)
    return float(eps)


# ---- sensitivities after stochastic rounding ---------------------------------------------------

def rounded_l2_norm_bound(l2_norm: float, *, beta: float, dim: int) -> float:
    """Largest L2 norm of a stochastically rounded vector whose norm was <= l2_norm (scaled units).

    Thm. 1 of arXiv 2102.06387: unconditional rounding gives l2 + sqrt(d); conditional rounding that
    retries until the norm is below sqrt(l2^2 + d/4 + sqrt(2 ln(1/beta)) (l2 + sqrt(d)/2)) (beta > 0)
    guarantees the smaller of the two.
    """
    if not 0 <= beta < 1:
        raise ValueError(f"beta must be in [0, 1), got {beta}")
    if l2_norm <= 0 or dim < 1:
        raise ValueError("l2_norm must be positive and dim at least 1")
    unconditional = l2_norm + math.sqrt(dim)
    if beta == 0:
        return unconditional
    return min(unconditional, conditional_rounding_bound(l2_norm, beta=beta, dim=dim))


def conditional_rounding_bound(l2_norm: float, *, beta: float, dim: int) -> float:
    """The norm a conditionally rounded vector is forced under (retry threshold, beta > 0)."""
    sq = l2_norm**2 + 0.25 * dim + math.sqrt(2.0 * math.log(1.0 / beta)) * (l2_norm + 0.5 * math.sqrt(dim))
    return math.sqrt(sq)


def rounded_l1_norm_bound(l2_norm: float, *, dim: int) -> float:
    """L1 <= sqrt(d) L2 always, and L1 <= L2^2 for integer vectors."""
    return l2_norm * min(math.sqrt(dim), l2_norm)


# ---- closed-form curves -----------------------------------------------------------------------

def _integer_orders(orders: Sequence[float]) -> np.ndarray:
    a = np.ceil(np.asarray(orders, dtype=np.float64)).astype(np.int64)
    if np.any(a < 2):
        raise ValueError("RDP orders must exceed 1")
    return a


def skellam_rdp_fn(*, l1: float, l2: float, variance: float) -> RdpFn:
    """Skellam RDP at one integer order; sensitivities and variance in the integer domain."""
    if variance <= 0:
        raise ValueError("Skellam variance must be positive")

    def eps(a: int) -> float:
        base = a * l2**2 / (2.0 * variance)
        extra = min(((2 * a - 1) * l2**2 + 6.0 * l1) / (4.0 * variance**2), 3.0 * l1 / (2.0 * variance))
        return base + extra

    return eps


def discrete_gaussian_tau(*, local_stddev: float, n_clients: int) -> float:
    """tau of arXiv 2102.06387 Thm. 1: how far a sum of n discrete Gaussians is from one."""
    if n_clients <= 1:
        return 0.0
    k = np.arange(1, n_clients, dtype=np.float64)
    return float(10.0 * np.sum(np.exp(-2.0 * (math.pi * local_stddev) ** 2 * k / (k + 1.0))))


def discrete_gaussian_rdp_fn(*, l1: float, l2: float, local_stddev: float, n_clients: int, dim: int,
                             tau_clients: int | None = None) -> RdpFn:
    """Distributed discrete Gaussian RDP at one integer order (integer-domain parameters). `tau_clients`:
    take tau for that many clients instead (every term grows with tau, so a larger count bounds any sum
    of between `n_clients` and `tau_clients` equal-width discrete Gaussians; `distributed._checked`)."""
    if local_stddev <= 0 or n_clients < 1:
        raise ValueError("need a positive local stddev and at least one client")
    total = math.sqrt(n_clients) * local_stddev
    l1s, l2s = l1 / total, l2 / total
    tau = discrete_gaussian_tau(local_stddev=local_stddev, n_clients=tau_clients or n_clients)

    def eps(a: int) -> float:
        return min(
            a / 2.0 * l2s**2 + tau * dim,
            a / 2.0 * (l2s**2 + 2.0 * l1s * tau + tau**2 * dim),
            a / 2.0 * (l2s + math.sqrt(dim) * tau) ** 2,
        )

    return eps


def curve(fn: RdpFn, *, orders: Sequence[float] = ORDERS, sampling_rate: float = 1.0) -> np.ndarray:
    """The RDP curve of `fn` (optionally Poisson-subsampled) over `orders`."""
    ints = _integer_orders(orders)
    if not 0 < sampling_rate <= 1:
        raise ValueError(f"sampling rate must be in (0, 1], got {sampling_rate}")
    top = int(ints.max()) if sampling_rate < 1 else 0
    table = np.array([fn(a) if a >= 2 else 0.0 for a in range(max(top, 1) + 1)])  # eps(l), l = 0..top
    direct = np.array([table[a] if a <= top else fn(int(a)) for a in ints])
    if sampling_rate == 1.0:
        return direct
    amplified = np.array([_subsampled(int(a), sampling_rate, table) for a in ints])
    return np.minimum(amplified, direct)


def poisson_subsampled_rdp(alpha: int, *, sampling_rate: float, rdp_fn: RdpFn) -> float:
    """Zhu & Wang (ICML 2019) general upper bound on the RDP of a Poisson-subsampled mechanism:

    (1/(a-1)) log( (1-q)^{a-1} (a q - q + 1) + C(a,2) q^2 (1-q)^{a-2} e^{eps(2)}
                   + 3 sum_{l=3}^{a} C(a,l) (1-q)^{a-l} q^l e^{(l-1) eps(l)} )
    """
    a = int(alpha)
    if a < 2:
        raise ValueError("integer order >= 2 required")
    if sampling_rate == 1.0:
        return rdp_fn(a)
    table = np.array([rdp_fn(ell) if ell >= 2 else 0.0 for ell in range(a + 1)])
    return _subsampled(a, float(sampling_rate), table)


def _subsampled(a: int, q: float, table: np.ndarray) -> float:
    """The Zhu-Wang bound at order a, from eps(l) = table[l]."""
    log1mq, logq = math.log1p(-q), math.log(q)
    ell = np.arange(2, a + 1)
    log_comb = special.gammaln(a + 1) - special.gammaln(ell + 1) - special.gammaln(a - ell + 1)
    terms = log_comb + (a - ell) * log1mq + ell * logq + (ell - 1) * table[2 : a + 1]
    logs = np.concatenate(([(a - 1) * log1mq + math.log(a * q - q + 1.0)], terms))
    weights = np.concatenate(([1.0, 1.0], np.full(a - 2, 3.0)))
    return float(special.logsumexp(logs, b=weights)) / (a - 1)


def skellam_curve(*, l1: float, l2: float, variance: float, sampling_rate: float = 1.0,
                  orders: Sequence[float] = ORDERS) -> np.ndarray:
    return curve(skellam_rdp_fn(l1=l1, l2=l2, variance=variance), orders=orders, sampling_rate=sampling_rate)


def discrete_gaussian_curve(*, l1: float, l2: float, local_stddev: float, n_clients: int, dim: int,
                            sampling_rate: float = 1.0, orders: Sequence[float] = ORDERS) -> np.ndarray:
    fn = discrete_gaussian_rdp_fn(l1=l1, l2=l2, local_stddev=local_stddev, n_clients=n_clients, dim=dim)
    return curve(fn, orders=orders, sampling_rate=sampling_rate)
