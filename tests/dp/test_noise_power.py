"""Every DP mechanism adds (at least) the noise it is calibrated for: variance tests with stated power.

A mechanism that adds less noise than its privacy accounting assumes is a silent privacy failure:
the ledger shows the promised epsilon, the output leaks more. These tests draw noise THROUGH each
mechanism's own code path, with a zero signal so that the output is the noise, and test its second
moment against the calibrated variance v0:

    R = (1/n) sum_i X_i^2 / v0,   accept iff lo <= R <= hi.

(The mean is known to be 0, so the raw second moment is used; a biased mechanism only inflates R.)
Each test is designed so that

  (a) with exactly the calibrated noise it fails with probability below ALPHA = 1e-7 (< 1e-6), and
  (b) an implementation adding HALF the variance (the same noise family at half the variance:
      N(0, v0/2), Skellam(lam/2), N_Z(0, sigma^2/2)) passes with probability below BETA = 1e-7
      (< 1e-6); one adding no noise gives R = 0 < lo and always fails.

Both probabilities are computed at test time from the exact null and alternative distributions and
asserted (< 1e-6) in each test, so every test documents its own error rates; n is the smallest size
meeting (a) and (b) (or the mechanism's natural size, e.g. a power of two for the Hadamard rotation).

* Gaussian (float) noise: n R ~ chi2(n) exactly, so lo, hi = chi2.ppf(ALPHA/2, n)/n, chi2.isf(ALPHA/2, n)/n,
  and at half the variance n R ~ chi2(n)/2, so P[accept] = P[2 n lo <= chi2(n) <= 2 n hi] (scipy).
  Normal approximation for the size: R ~ N(1, 2/n) under the null and N(1/2, (1/2)^2 2/n) at half
  the variance, so we need 1 - z_a sqrt(2/n) >= 1/2 + z_b sqrt(2/n)/2 with z_a = Phi^-1(1 - ALPHA/2)
  = 5.33 and z_b = Phi^-1(1 - BETA) = 5.20: n >= 8 (z_a + z_b/2)^2 ~ 502; the exact chi-square
  computation gives the n used, 467 (the chi-square's right skew shortens the lower tail that matters).
* Integer noise (Skellam, discrete Gaussian, sums of discrete Gaussians): the exact pmf is known (Bessel
  function / normalised Gaussian weights / convolution), and rigorous Chernoff bounds replace the
  CLT: P[n R <= n r] <= exp(n min_{s>=0} (s r + log E e^{-s X^2/v0})) and
  P[n R >= n r] <= n P(|X| > K) + exp(n min_{s>=0} (-s r + log E e^{s X^2 1(|X|<=K)/v0})), with the
  moment generating functions summed exactly over the support |X| <= K and P(|X| > K) bounded in
  closed form. The starting size is the fourth-moment CLT one: Var(X^2/v0) = 2 + kappa with excess
  kurtosis kappa = 1/(2 lam) for Skellam(lam) (variance 2 lam), so n >= ((z_a tau_0 + z_b tau_1) /
  (1 - 1/2))^2 with tau_0^2 = 2 + 1/(2 lam) and tau_1^2 = (2 + 1/lam)/4; it is then raised until the
  Chernoff bounds (slightly more conservative than the CLT) meet (a) and (b).

Every mechanism also has a 'mutant' test: the library's own noise draw is monkeypatched to half the
variance (and to zero) and the same checker must reject it, so the file shows both directions.
Family-wise, the 15 calibrated tests fail by chance with probability below 15 x 1e-7 = 1.5e-6.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import numpy as np
import pytest
from dp_accounting import get_sigma_gaussian
from scipy import optimize, special, stats

import dp.central
import dp.centroids
import dp.distributed
import dp.sketches
from dp import samplers
from dp.central import CentralDPAggregator, CentralDPConfig
from dp.centroids import CentroidConfig, DPCentroids
from dp.distributed import DistributedDPConfig, DistributedDPEncoder, plan_distributed_dp
from dp.ledger import Ledger, PrivacyUnit
from dp.sketches import DPSketcher, SketchConfig
from secagg.prg import CryptoRandom

ALPHA = 1e-7
"""Designed two-sided false-rejection probability with exactly calibrated noise."""
BETA = 1e-7
"""Designed probability of accepting noise of half the calibrated variance."""
LIMIT = 1e-6
"""What every test must certify for both error probabilities."""
MUTANTS = ("half", "zero")


# ---- the checker ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class VarianceTest:
    """Accept iff lo <= sum(x^2) / (n v0) <= hi, with its two certified error probabilities."""

    n: int
    lo: float
    hi: float
    false_rejection: float
    """(Upper bound on) P[reject] when the noise is exactly the calibrated one."""
    miss: float
    """(Upper bound on) P[accept] when the noise has half the calibrated variance."""

    def ratio(self, noise: np.ndarray, variance: float) -> float:
        x = np.asarray(noise, dtype=np.float64).ravel()
        assert x.size == self.n, f"the test was designed for {self.n} draws, got {x.size}"
        return float(x @ x) / (self.n * variance)

    def accepts(self, noise: np.ndarray, variance: float) -> bool:
        return self.lo <= self.ratio(noise, variance) <= self.hi

    def assert_certified(self) -> None:
        """The test documents its own error rates: both below 1e-6, and zero noise (R = 0) rejected."""
        assert self.false_rejection < LIMIT, self
        assert self.miss < LIMIT, self
        assert 0 < self.lo < 1 < self.hi, self


def gaussian_test(n: int | None = None, *, noncentrality: float = 0.0) -> VarianceTest:
    """Exact chi-square design for float Gaussian noise; the smallest n meeting (a) and (b) unless given.

    `noncentrality` = sum of the (known-to-be-unknown-position) signal means squared, over v0: n R is then
    noncentral chi-square ncx2(n, noncentrality), and ncx2(n, 2 noncentrality) / 2 at half the variance."""
    if noncentrality == 0.0:
        sizes = np.arange(2, 5000) if n is None else np.array([n])
        lo = stats.chi2.ppf(ALPHA / 2, sizes) / sizes
        hi = stats.chi2.isf(ALPHA / 2, sizes) / sizes
        # at half the variance n R = chi2(n) / 2, i.e. accept iff 2 n lo <= chi2(n) <= 2 n hi
        miss = stats.chi2.sf(2 * sizes * lo, sizes) - stats.chi2.sf(2 * sizes * hi, sizes)
        i = int(np.argmax(miss < BETA)) if n is None else 0
        k = int(sizes[i])
        false_rejection = stats.chi2.cdf(k * lo[i], k) + stats.chi2.sf(k * hi[i], k)
        return VarianceTest(n=k, lo=float(lo[i]), hi=float(hi[i]), false_rejection=float(false_rejection),
                            miss=float(miss[i]))
    k = gaussian_test().n if n is None else n
    while True:
        null, half = stats.ncx2(k, noncentrality), stats.ncx2(k, 2 * noncentrality)
        lo, hi = null.ppf(ALPHA / 2) / k, null.isf(ALPHA / 2) / k
        found = VarianceTest(n=k, lo=float(lo), hi=float(hi),
                             false_rejection=float(null.cdf(k * lo) + null.sf(k * hi)),
                             miss=float(half.sf(2 * k * lo) - half.sf(2 * k * hi)))
        if n is not None or found.miss < BETA:
            return found
        k += 1


@dataclass(frozen=True)
class IntegerLaw:
    """An integer distribution: log pmf on {-K..K} and a closed-form bound on P(|X| > K)."""

    logpmf: np.ndarray
    tail: float

    @property
    def support(self) -> np.ndarray:
        k = (self.logpmf.shape[0] - 1) // 2
        return np.arange(-k, k + 1, dtype=np.float64)

    def moment(self, power: int) -> float:
        return float(np.sum(np.exp(self.logpmf) * self.support**power))

    def log_mgf_of_square(self, s: float, v0: float) -> float:
        """log of an upper bound on E exp(s W), W = X^2/v0 on |X| <= K and 0 beyond (the tail mass
        counts with weight e^0 = 1)."""
        terms = self.logpmf + s * self.support**2 / v0
        return float(np.logaddexp(special.logsumexp(terms), math.log(self.tail) if self.tail > 0 else -math.inf))

    def log_lower_tail(self, n: int, r: float, v0: float) -> float:
        """log of a bound on P[sum X_i^2 / v0 <= n r] (Chernoff; sum X^2 >= sum W)."""
        fn = lambda s: n * (s * r + self.log_mgf_of_square(-s, v0))  # noqa: E731
        return min(0.0, float(optimize.minimize_scalar(fn, bounds=(0.0, 50.0), method="bounded").fun))

    def log_upper_tail(self, n: int, r: float, v0: float) -> float:
        """log of a bound on P[sum X_i^2 / v0 >= n r]: some |X_i| > K, or the truncated sum is large."""
        fn = lambda s: n * (-s * r + self.log_mgf_of_square(s, v0))  # noqa: E731
        chernoff = float(optimize.minimize_scalar(fn, bounds=(0.0, 2.0), method="bounded").fun)
        out = np.logaddexp(math.log(n * self.tail) if self.tail > 0 else -math.inf, chernoff)
        return min(0.0, float(out))


def skellam_tail(lam: float, k: float) -> float:
    """P(|Sk(lam)| > k) <= 2 exp(-k asinh(k / 2 lam) + 2 lam (sqrt(1 + (k / 2 lam)^2) - 1)) (Chernoff)."""
    u = k / (2.0 * lam)
    return 2.0 * math.exp(-k * math.asinh(u) + 2.0 * lam * (math.sqrt(1.0 + u * u) - 1.0))


def skellam_law(lam: float, *, limit: int | None = None) -> IntegerLaw:
    """Skellam(lam) = Poisson(lam) - Poisson(lam): P(k) = e^{-2 lam} I_|k|(2 lam) = ive(|k|, 2 lam).

    `limit` caps K (the centred lift of a ring of size m sees values up to m/2 - 1 only)."""
    k = int(14 * math.sqrt(2 * lam)) + 30
    while skellam_tail(lam, k) > 1e-40:
        k = int(k * 1.3)
    if limit is not None:
        k = min(k, limit)
    ks = np.arange(-k, k + 1)
    with np.errstate(divide="ignore"):
        logpmf = np.log(special.ive(np.abs(ks), 2.0 * lam))
    assert np.all(np.isfinite(logpmf)), "the Skellam pmf underflowed inside the support"
    return IntegerLaw(logpmf=logpmf, tail=skellam_tail(lam, k))


def _gaussian_weight_tail(sigma: float, k: int) -> float:
    """sum_{|y| > k} exp(-y^2 / 2 sigma^2) <= 2 int_k^inf exp(-x^2 / 2 sigma^2) dx."""
    return 2.0 * sigma * math.sqrt(2.0 * math.pi) * float(stats.norm.sf(k / sigma))


def discrete_gaussian_law(sigma: float, *, summands: int = 1, limit: int | None = None) -> IntegerLaw:
    """N_Z(0, sigma^2) (P(y) ~ exp(-y^2 / 2 sigma^2)), or the sum of `summands` independent copies
    (exact convolution: the sum of discrete Gaussians is not one). P(|sum| > K) <= summands P(|X| > K / summands)."""
    k = int(12 * sigma) + 10
    ys = np.arange(-k, k + 1, dtype=np.float64)
    weights = np.exp(-ys**2 / (2.0 * sigma**2))
    z = weights.sum()  # the true normaliser is larger, so P(|X| > k) <= tail weight / z
    tail = _gaussian_weight_tail(sigma, k) / z
    pmf = weights / z
    total = pmf
    for _ in range(summands - 1):
        total = np.convolve(total, pmf)  # positive terms: no cancellation, relative accuracy ~1e-15
    tail *= summands
    kk = (total.shape[0] - 1) // 2
    if limit is not None and limit < kk:  # the mass cut off is known exactly: add it to the tail
        tail += float(total[: kk - limit].sum() + total[kk + limit + 1:].sum())
        total = total[kk - limit: kk + limit + 1]
    with np.errstate(divide="ignore"):
        logpmf = np.log(total)
    assert np.all(np.isfinite(logpmf)), "the discrete Gaussian pmf underflowed inside the support"
    return IntegerLaw(logpmf=logpmf, tail=tail)


def integer_test(null: IntegerLaw, half: IntegerLaw, v0: float, n: int | None = None) -> VarianceTest:
    """Chernoff design for integer noise of law `null`, against `half` (the law at half the variance).

    lo is the largest r with P[R <= r] <= ALPHA/2, hi the smallest with P[R >= r] <= ALPHA/2 (both by
    the Chernoff bounds, found by root finding and then checked), and the miss probability is bounded
    by P[R >= lo] under `half`. Without `n`, the CLT size with the fourth moment is the start and n grows
    by 5% until (a) and (b) hold."""
    log_half_alpha = math.log(ALPHA / 2)
    m0 = null.moment(2) / v0

    def design(size: int) -> VarianceTest | None:
        low = lambda r: null.log_lower_tail(size, r, v0) - log_half_alpha  # noqa: E731
        high = lambda r: null.log_upper_tail(size, r, v0) - log_half_alpha  # noqa: E731
        if low(1e-9) > 0 or high(20.0) > 0:
            return None
        lo = optimize.brentq(low, 1e-9, m0, xtol=1e-12) * (1 - 1e-9)
        hi = optimize.brentq(high, m0, 20.0, xtol=1e-12) * (1 + 1e-9)
        false_rejection = math.exp(null.log_lower_tail(size, lo, v0)) + math.exp(null.log_upper_tail(size, hi, v0))
        miss = math.exp(half.log_upper_tail(size, lo, v0))
        return VarianceTest(n=size, lo=lo, hi=hi, false_rejection=false_rejection, miss=miss)

    if n is not None:
        found = design(n)
        assert found is not None, f"no acceptance region at n={n}"
        return found
    z_a, z_b = stats.norm.isf(ALPHA / 2), stats.norm.isf(BETA)
    tau0 = math.sqrt(null.moment(4) / v0**2 - m0**2)
    m1 = half.moment(2) / v0
    tau1 = math.sqrt(half.moment(4) / v0**2 - m1**2)
    size = math.ceil(((z_a * tau0 + z_b * tau1) / (m0 - m1)) ** 2)
    while True:
        found = design(size)
        if found is not None and found.false_rejection < ALPHA and found.miss < BETA:
            return found
        size = math.ceil(size * 1.05)


# ---- designs, computed once per parameter set ----------------------------------------------------

@functools.lru_cache(maxsize=None)
def gaussian_design(n: int | None = None, noncentrality: float = 0.0) -> VarianceTest:
    return gaussian_test(n, noncentrality=noncentrality)


@functools.lru_cache(maxsize=None)
def skellam_design(lam: float, n: int | None = None, limit: int | None = None) -> VarianceTest:
    """Skellam(lam) noise, variance 2 lam, against Skellam(lam / 2)."""
    return integer_test(skellam_law(lam, limit=limit), skellam_law(lam / 2, limit=limit), 2.0 * lam, n)


@functools.lru_cache(maxsize=None)
def discrete_gaussian_design(sigma: float, summands: int = 1, n: int | None = None,
                             limit: int | None = None) -> VarianceTest:
    """Sum of `summands` N_Z(0, sigma^2), nominal variance summands sigma^2, against sigma / sqrt(2)."""
    return integer_test(discrete_gaussian_law(sigma, summands=summands, limit=limit),
                        discrete_gaussian_law(sigma / math.sqrt(2), summands=summands, limit=limit),
                        summands * sigma**2, n)


def _fresh_rng() -> CryptoRandom:
    return CryptoRandom()  # the library's own OS-keyed stream


def test_checker_designs_are_certified_and_reject_silence():
    """Both error probabilities of every design family are below 1e-6, zero noise is rejected, and the
    exact chi-square design sits where the normal approximation puts it (n ~ 8 (z_a + z_b / 2)^2)."""
    g = gaussian_design()
    g.assert_certified()
    z_a, z_b = stats.norm.isf(ALPHA / 2), stats.norm.isf(BETA)
    clt = 8 * (z_a + z_b / 2) ** 2
    assert clt * 0.9 < g.n < clt * 1.2, (g.n, clt)
    assert not g.accepts(np.zeros(g.n), 1.0)
    # one fewer draw would not reach the power: n is the smallest size the calculation allows
    assert gaussian_test(g.n - 1).miss >= BETA
    assert gaussian_test(g.n - 1).false_rejection == pytest.approx(ALPHA, rel=1e-6)
    # the Chernoff design for (nearly Gaussian) integer noise is valid and at most ~25% larger
    d = discrete_gaussian_design(40.0)
    d.assert_certified()
    assert g.n <= d.n < 1.25 * g.n
    with pytest.raises(AssertionError, match="designed for"):
        g.accepts(np.zeros(g.n + 1), 1.0)


# ---- integer samplers (dp/samplers.py) ----------------------------------------------------------

@pytest.mark.parametrize("lam", [2.5, 40.0, 5e4])
def test_skellam_sampler_has_variance_two_lambda(lam):
    """samplers.skellam(lam) (inversion of its own table up to SKELLAM_TABLE_MAX) has variance 2 lam.

    Design: Chernoff bounds with the exact Skellam pmf ive(|k|, 2 lam); the starting size is the CLT
    one with Var(X^2 / 2 lam) = 2 + 1/(2 lam) (excess kurtosis 1/(2 lam)): ~520 draws for large lam,
    more for lam = 2.5 (heavier relative tails); the Chernoff bounds raise it to ~560-660."""
    design = skellam_design(lam)
    design.assert_certified()
    assert design.accepts(samplers.skellam(lam, design.n, _fresh_rng()), 2.0 * lam)


@pytest.mark.parametrize("mutant", MUTANTS)
@pytest.mark.parametrize("draw", ["table", "two_poisson"])
@pytest.mark.parametrize("lam", [2.5, 40.0])
def test_skellam_checker_rejects_a_sampler_with_less_noise(monkeypatch, lam, mutant, draw):
    """samplers.skellam with half its variance (or none) is rejected (P[accept] < 1e-6), on each of its
    paths: its own table built for lam / 2 (or every draw 0), and Poisson(lam / 2) (or 0) in the
    two-Poisson difference it takes above SKELLAM_TABLE_MAX (forced here by lowering the limit)."""
    design = skellam_design(lam)
    design.assert_certified()
    monkeypatch.setattr(samplers, "_TABLES", type(samplers._TABLES)())
    if draw == "table":
        real = samplers._build_skellam_table
        if mutant == "half":
            monkeypatch.setattr(samplers, "_build_skellam_table", lambda lam_: real(lam_ / 2))
        else:
            monkeypatch.setattr(samplers, "_invert", lambda table, size, rng: np.zeros(size, dtype=np.int64))
    else:
        monkeypatch.setattr(samplers, "SKELLAM_TABLE_MAX", 0.0)
        real = samplers.poisson
        if mutant == "half":
            monkeypatch.setattr(samplers, "poisson", lambda lam_, size, rng: real(lam_ / 2, size, rng))
        else:
            monkeypatch.setattr(samplers, "poisson", lambda lam_, size, rng: np.zeros(size, dtype=np.int64))
    assert not design.accepts(samplers.skellam(lam, design.n, _fresh_rng()), 2.0 * lam)


@pytest.mark.parametrize("sigma", [1.5, 40.0])
def test_discrete_gaussian_sampler_has_variance_sigma_squared(sigma):
    """samplers.discrete_gaussian(sigma) draws N_Z(0, sigma^2), whose variance is sigma^2 up to
    ~exp(-2 pi^2 sigma^2) for sigma >= 1. Design: Chernoff bounds with the exact pmf (normalised
    exp(-y^2 / 2 sigma^2)) against N_Z(0, sigma^2 / 2); CLT start 2 (z_a sqrt 2 + z_b / sqrt 2)^2."""
    design = discrete_gaussian_design(sigma)
    design.assert_certified()
    assert design.accepts(samplers.discrete_gaussian(sigma, design.n, _fresh_rng()), sigma**2)


@pytest.mark.parametrize("mutant", MUTANTS)
def test_discrete_gaussian_checker_rejects_a_sampler_with_less_noise(monkeypatch, mutant):
    """A discrete Gaussian sampler at sigma / sqrt(2) (or returning 0) is rejected."""
    sigma = 40.0
    design = discrete_gaussian_design(sigma)
    real = samplers.discrete_gaussian
    if mutant == "half":
        monkeypatch.setattr(samplers, "discrete_gaussian", lambda s, size, rng: real(s / math.sqrt(2), size, rng))
    else:
        monkeypatch.setattr(samplers, "discrete_gaussian", lambda s, size, rng: np.zeros(size, dtype=np.int64))
    assert not design.accepts(samplers.discrete_gaussian(sigma, design.n, _fresh_rng()), sigma**2)


# ---- distributed DP (dp/distributed.py) ---------------------------------------------------------

DIM = 1024
"""A power of two: the rotation is then an orthonormal map of R^1024 onto itself, so the decoded noise
has exactly the squared norm of the integer noise / scale^2, and the statistic has the iid law."""


def _ddp_config(mechanism: str) -> DistributedDPConfig:
    # modclip_prob=1e-12: the ring holds ~7 stddevs, so wrap-around is part of the (tiny) tail bound
    return DistributedDPConfig(l2_clip=0.8, noise_multiplier=1.2, expected_clients=4, min_clients=3, bits=12,
                               modclip_prob=1e-12, mechanism=mechanism)


def _ddp_design(mechanism: str, plan, *, clients: int) -> VarianceTest:
    """The integer law of `clients` clients' summed noise, from the CONFIG (z C / sqrt(n_min) per client,
    times the plan's scale), with K = m/2 - 1: beyond it the centred lift wraps, which the tail bound counts."""
    cfg = plan.config
    sigma_int = cfg.noise_multiplier * cfg.l2_clip / math.sqrt(cfg.n_min) * plan.scale
    limit = plan.modulus // 2 - 1
    if mechanism == "skellam":
        return skellam_design(clients * sigma_int**2 / 2.0, DIM, limit)
    return discrete_gaussian_design(sigma_int, clients, DIM, limit)


def _survivor_noise(encoder: DistributedDPEncoder, clients: int) -> np.ndarray:
    """Decoded SUM (mean x clients) of `clients` encodings of the zero vector, in float units."""
    ring_sum = np.zeros(encoder.length, dtype=np.uint32)
    for _ in range(clients):
        encoder.ring.add_(ring_sum, encoder.encode(np.zeros(DIM), round_seed=7))
    return encoder.decode(ring_sum, round_seed=7, n_clients=clients) * clients


@pytest.mark.parametrize("mechanism", ["skellam", "discrete_gaussian"])
def test_distributed_client_noise_is_its_share_of_the_central_noise(mechanism):
    """One client's encoding of 0 carries noise of variance (z C)^2 / n_min in float units (centred lift
    / scale): Skellam((s z C)^2 / (2 n_min)) or N_Z(0, (s z C)^2 / n_min) in integer units. n = 1024
    (the padded dimension; the power calculation needs ~560, see test_checker_designs...)."""
    cfg = _ddp_config(mechanism)
    plan = plan_distributed_dp(cfg, dim=DIM)
    assert plan.padded_dim == DIM
    design = _ddp_design(mechanism, plan, clients=1)
    design.assert_certified()
    encoder = DistributedDPEncoder(plan)
    noise = encoder.centred(encoder.encode(np.zeros(DIM), round_seed=3)) / plan.scale
    target = (cfg.noise_multiplier * cfg.l2_clip) ** 2 / cfg.n_min
    assert design.accepts(noise, target), design.ratio(noise, target)


@pytest.mark.parametrize("mechanism", ["skellam", "discrete_gaussian"])
def test_distributed_survivor_sum_carries_the_central_noise(mechanism):
    """The decoded sum over n_min = min_clients survivors has per-coordinate noise variance (z C)^2,
    the central noise the accounting assumes (SkellamMechanism: variance n_min (s sigma_l)^2;
    DiscreteGaussianMechanism: n_min clients at s sigma_l). Null law: Skellam(n_min (s sigma_l)^2 / 2),
    or the exact n_min-fold convolution of N_Z(0, (s sigma_l)^2); alternative: the same at half variance."""
    cfg = _ddp_config(mechanism)
    plan = plan_distributed_dp(cfg, dim=DIM)
    design = _ddp_design(mechanism, plan, clients=cfg.n_min)
    design.assert_certified()
    noise = _survivor_noise(DistributedDPEncoder(plan), cfg.n_min)
    target = (cfg.noise_multiplier * cfg.l2_clip) ** 2
    assert design.accepts(noise, target), design.ratio(noise, target)


@pytest.mark.parametrize("mutant", MUTANTS)
@pytest.mark.parametrize("mechanism", ["skellam", "discrete_gaussian"])
def test_distributed_checker_rejects_an_encoder_with_less_noise(monkeypatch, mechanism, mutant):
    """The encoder's own noise draw (dp.distributed.skellam / discrete_gaussian) at half the variance, or
    zero: the survivors' sum then carries half (or none) of (z C)^2 and is rejected."""
    cfg = _ddp_config(mechanism)
    plan = plan_distributed_dp(cfg, dim=DIM)
    design = _ddp_design(mechanism, plan, clients=cfg.n_min)
    name = "skellam" if mechanism == "skellam" else "discrete_gaussian"
    real = getattr(dp.distributed, name)
    if mutant == "zero":
        monkeypatch.setattr(dp.distributed, name, lambda p, size, rng: np.zeros(size, dtype=np.int64))
    elif mechanism == "skellam":
        monkeypatch.setattr(dp.distributed, name, lambda lam, size, rng: real(lam / 2, size, rng))
    else:
        monkeypatch.setattr(dp.distributed, name, lambda sigma, size, rng: real(sigma / math.sqrt(2), size, rng))
    noise = _survivor_noise(DistributedDPEncoder(plan), cfg.n_min)
    assert not design.accepts(noise, (cfg.noise_multiplier * cfg.l2_clip) ** 2)


# ---- central DP (dp/central.py) -----------------------------------------------------------------

CENTRAL = CentralDPConfig(l2_clip=0.7, noise_multiplier=1.3)


def _central_noise(n: int) -> np.ndarray:
    released = CentralDPAggregator(CENTRAL).release(np.zeros(n), round_id=0, contributors=[0], ledger=Ledger())
    return np.asarray(released.payload)  # the mean over one contributor: the noise itself


def test_central_noise_has_variance_z_c_squared():
    """release() of a zero secure sum is N(0, (z C)^2 I) / 1. Exact chi-square design (n ~ 470)."""
    design = gaussian_design()
    design.assert_certified()
    target = (CENTRAL.noise_multiplier * CENTRAL.l2_clip) ** 2
    assert design.accepts(_central_noise(design.n), target)


@pytest.mark.parametrize("mutant", MUTANTS)
def test_central_checker_rejects_less_noise(monkeypatch, mutant):
    """dp.central's Gaussian draw at sigma / sqrt(2) (or 0) is rejected."""
    design = gaussian_design()
    real = dp.central.gaussian
    factor = 1 / math.sqrt(2) if mutant == "half" else 0.0
    monkeypatch.setattr(dp.central, "gaussian", lambda sigma, size, rng: real(sigma * factor, size, rng))
    assert not design.accepts(_central_noise(design.n), (CENTRAL.noise_multiplier * CENTRAL.l2_clip) ** 2)


# ---- DP sketches (dp/sketches.py) ---------------------------------------------------------------

SKETCH_DIM_IN = 6


def _sketch_setup(unit: PrivacyUnit, n: int) -> tuple[DPSketcher, dict, float, np.ndarray]:
    """(sketcher, release kwargs, calibrated sigma, the exact noiseless sketch).

    The calibrated sigma is derived here, independently of the sketcher's plan: the analytic Gaussian
    mechanism's multiplier at (epsilon, delta) times the replace-one sensitivity, 2 C at client level
    and min(2 C, 2 ||P||_op / n_docs) at example level."""
    config = SketchConfig(epsilon=2.0, delta=1e-5, unit=unit, sketch_dim=n, clip=1.0, max_cosine_noise_std=1e9)
    sketcher = DPSketcher(config, dim=SKETCH_DIM_IN)
    multiplier = get_sigma_gaussian(config.epsilon, config.delta)
    if unit is PrivacyUnit.CLIENT:
        return sketcher, {"summary": np.zeros(SKETCH_DIM_IN)}, multiplier * 2 * config.clip, np.zeros(n)
    docs = np.random.default_rng(5).normal(size=(8, SKETCH_DIM_IN))
    x = (docs / np.linalg.norm(docs, axis=1, keepdims=True)).mean(axis=0)
    s = sketcher.projection @ x
    s *= min(1.0, config.clip / float(np.linalg.norm(s)))
    op_norm = float(np.linalg.svd(sketcher.projection, compute_uv=False)[0])
    sensitivity = min(2 * config.clip, 2 * op_norm / docs.shape[0])
    return sketcher, {"documents": docs}, multiplier * sensitivity, s


@pytest.mark.parametrize("unit", [PrivacyUnit.CLIENT, PrivacyUnit.EXAMPLE])
def test_sketch_noise_has_the_calibrated_variance(unit):
    """A released sketch minus its exact noiseless value (0 for the zero summary) is N(0, sigma^2 I_k),
    sigma from the analytic Gaussian mechanism; k = n from the exact chi-square design (~470)."""
    design = gaussian_design()
    design.assert_certified()
    sketcher, kwargs, sigma, clean = _sketch_setup(unit, design.n)
    released = sketcher.release(client_id=0, ledger=Ledger(), **kwargs)
    assert design.accepts(np.asarray(released.payload) - clean, sigma**2)


@pytest.mark.parametrize("mutant", MUTANTS)
def test_sketch_checker_rejects_less_noise(monkeypatch, mutant):
    """dp.sketches' noise draw at sigma / sqrt(2) (or 0), patched after the public projection was
    drawn, is rejected."""
    design = gaussian_design()
    sketcher, kwargs, sigma, clean = _sketch_setup(PrivacyUnit.CLIENT, design.n)
    real = dp.sketches.gaussian
    factor = 1 / math.sqrt(2) if mutant == "half" else 0.0
    monkeypatch.setattr(dp.sketches, "gaussian", lambda s, size, rng: real(s * factor, size, rng))
    released = sketcher.release(client_id=0, ledger=Ledger(), **kwargs)
    assert not design.accepts(np.asarray(released.payload) - clean, sigma**2)


# ---- DP centroid descriptors (dp/centroids.py) --------------------------------------------------

def _centroid_setup(iterations: int) -> tuple[DPCentroids, float, VarianceTest]:
    """k = n centres, ONE document, T steps. The last step's noisy counts are e_{c*} + N(0, sigma^2 I_k),
    where c* (the document's nearest centre) depends only on earlier steps, whose noise is independent
    of this step's: so sum_c count_c^2 / sigma^2 is noncentral chi-square ncx2(k, 1 / sigma^2) exactly,
    wherever c* is. sigma = 2 sqrt(T) z_eff, z_eff = the analytic Gaussian multiplier at (epsilon, delta):
    T adaptive steps of sensitivity 2 compose to one Gaussian of multiplier z_eff (derived here,
    independently of the library's plan)."""
    config = CentroidConfig(epsilon=4.0, delta=1e-5, centres=gaussian_design().n, iterations=iterations,
                            projection_dim=2, max_centroid_noise=1e12)
    sigma = 2.0 * math.sqrt(iterations) * get_sigma_gaussian(config.epsilon, config.delta)
    design = gaussian_design(None, 1.0 / sigma**2)
    if design.n != config.centres:  # the noncentrality needed more draws
        config = dataclasses.replace(config, centres=design.n)
    return DPCentroids(config, dim=4), sigma, design


def _centroid_counts(centroids: DPCentroids) -> np.ndarray:
    doc = np.array([[0.3, -1.2, 0.5, 2.0]])
    released = centroids.release(client_id=0, ledger=Ledger(), documents=doc)
    return centroids.unpack(released.payload)[1]


@pytest.mark.parametrize("iterations", [1, 3])
def test_centroid_noise_has_the_calibrated_variance(iterations):
    """The noisy counts of a one-document release carry N(0, (2 sqrt(T) z_eff)^2) per centre (T = 1: the
    per-step calibration; T = 3: the sqrt(T) composition). Exact noncentral chi-square design."""
    centroids, sigma, design = _centroid_setup(iterations)
    design.assert_certified()
    assert design.accepts(_centroid_counts(centroids), sigma**2)


@pytest.mark.parametrize("mutant", MUTANTS)
def test_centroid_checker_rejects_less_noise(monkeypatch, mutant):
    """dp.centroids' per-step noise at sigma / sqrt(2) (or 0), patched after the public projection and
    initial centres were drawn, is rejected (zero noise: the counts are e_{c*}, R = 1/(k sigma^2))."""
    centroids, sigma, design = _centroid_setup(3)
    real = dp.centroids.gaussian
    factor = 1 / math.sqrt(2) if mutant == "half" else 0.0
    monkeypatch.setattr(dp.centroids, "gaussian", lambda s, size, rng: real(s * factor, size, rng))
    assert not design.accepts(_centroid_counts(centroids), sigma**2)


# ---- DP-SGD (dp/opacus_client.py, Opacus) ---------------------------------------------------------

DPSGD_BATCH = 4


@dataclass(frozen=True)
class _DPSGD:
    noise_multiplier: float = 1.3
    max_grad_norm: float = 0.5


DPSGD = _DPSGD()


def _dpsgd_noise(n: int, *, check_params_moved: bool = True) -> np.ndarray:
    """One DP-SGD step of OpacusClient.train_round on a loss with zero per-example gradients.

    Model: Linear(n, 1, bias=False) with zero weights, inputs all zero, so every per-example gradient
    is 0 (d(w.x)/dw = x = 0) and the clipped sum is 0. One batch (dataset = batch size: sample rate 1,
    Opacus' expected batch B = 4), SGD with lr 1: w_after = -(0 + N(0, (z C)^2 I)) / B exactly
    (B a power of two), so -B w_after is Opacus' noise on the summed gradient."""
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset

    from dp.opacus_client import DPSGDConfig, OpacusClient

    model = nn.Linear(n, 1, bias=False)
    nn.init.zeros_(model.weight)
    client = OpacusClient(client_id=0, config=DPSGDConfig(max_grad_norm=DPSGD.max_grad_norm,
                                                          noise_multiplier=DPSGD.noise_multiplier,
                                                          batch_size=DPSGD_BATCH,
                                                          check_params_moved=check_params_moved))
    report = client.train_round(model=model, optimizer_factory=lambda ps: torch.optim.SGD(ps, lr=1.0),
                                dataset=TensorDataset(torch.zeros(DPSGD_BATCH, n)),
                                loss_fn=lambda m, batch: m(batch[0]).sum(dim=1), round_id=0)
    assert (report.steps, report.sample_rate) == (1, 1.0)
    return -DPSGD_BATCH * model.weight.detach().double().numpy().ravel()


def test_dpsgd_step_noise_is_z_times_max_grad_norm():
    """Opacus adds N(0, (z C)^2) to the summed clipped gradient at every step (z = noise multiplier,
    C = max_grad_norm). Exact chi-square design (n ~ 470 parameters)."""
    pytest.importorskip("opacus", reason="DP-SGD noise is Opacus' own: nothing to measure without it")
    design = gaussian_design()
    design.assert_certified()
    target = (DPSGD.noise_multiplier * DPSGD.max_grad_norm) ** 2
    noise = _dpsgd_noise(design.n)
    assert design.accepts(noise, target), design.ratio(noise, target)


@pytest.mark.parametrize("mutant", MUTANTS)
def test_dpsgd_checker_rejects_less_noise(monkeypatch, mutant):
    """Opacus' noise draw (opacus.optimizers.optimizer._generate_noise) at std / sqrt(2) (or 0) is
    rejected. With zero noise nothing moves, so the library's own stale-parameter check is switched
    off to let the checker see it."""
    pytest.importorskip("opacus", reason="DP-SGD noise is Opacus' own: nothing to measure without it")
    import opacus.optimizers.optimizer as opacus_optimizer

    design = gaussian_design()
    real = opacus_optimizer._generate_noise
    factor = 1 / math.sqrt(2) if mutant == "half" else 0.0
    monkeypatch.setattr(opacus_optimizer, "_generate_noise",
                        lambda std, reference, **kw: real(std * factor, reference, **kw))
    noise = _dpsgd_noise(design.n, check_params_moved=mutant == "half")
    assert not design.accepts(noise, (DPSGD.noise_multiplier * DPSGD.max_grad_norm) ** 2)
