"""Distributed DP under secure aggregation: each client adds integer noise before masking.

The maintained successor of TFF's `DistributedDpSumFactory` (deleted from TFF in 2026-01; read at
its parent commit, see research/dp_leakage.md Sec. 2.1). Client side, for a vector x in R^d:

    v = clip_C(w x)                                   L2 clipping (w in [0, 1] applied first)
    y = s * H D pad(v) / sqrt(D)                      randomised Hadamard rotation, scale s
    r = round_beta(y)                                 conditional stochastic rounding: retry until
                                                      ||r|| <= sqrt(c^2 + D/4 + sqrt(2 ln 1/beta)(c + sqrt(D)/2))
    u = r + Skellam((s sigma_l)^2 / 2)  or  r + N_Z(0, (s sigma_l)^2)    local integer noise
    upload = u mod m                                  modular clipping (wrap-around) into the ring

with c = s C, sigma_l = z C / sqrt(n_min) for the noise multiplier z (the noise of n_min
survivors sums to the central stddev z C), m = 2^bits for Z_{2^32} (bits <= 32; the protocol sums mod 2^32 and decoding
reduces mod 2^bits, which is consistent because 2^bits divides 2^32) or m = p for F_p
(p = 2^31 - 1, centred representation). The server decodes the ring sum by centred lift, 1/s,
inverse rotation and division by the client count (or total weight).

Planning (Sec. 4 of arXiv 2102.06387; the heuristic of TFF and the authors' code): with gamma = 1/s,
k = sqrt(2) erfcinv(modclip_prob) stddevs of the aggregate must fit the ring,
    m = 2k sqrt(C^2 n^2 / D + (gamma^2 / 4 + sigma_l^2) n) / gamma     (flatness rho = 1)
    =>  s = sqrt(m^2 - n k^2) / (2k sqrt(C^2 n^2 / D + n sigma_l^2)).
A target epsilon is met by bisection on the noise multiplier z (each z fixing sigma_l, s and the
rounding-inflated sensitivities) through the Skellam/DDG accounting of `dp.accounting`.

Survivors: the noise of fewer than n_min clients is below calibration, so such a sum must never be
unmasked. The secure layer raises the protocol's own survivor minimum to n_min (`protocol_floor`,
applied by `fl_algorithms.engine.secure_sum.SecureAggregator.protocol_params`), so the protocol
aborts before unmasking; `check_survivors` in `release` is the second line of defence. A sum of more
than n = expected_clients clients is refused too: the ring was sized for n.

Simplifications, stated: no adaptive clipping; a single rotation (num_repeats = 1); the
accounting follows the papers in treating the n_min noise shares as present in both neighbouring
datasets.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from scipy import optimize, special

from dp import _mint
from dp.accounting import conditional_rounding_bound, rounded_l1_norm_bound, rounded_l2_norm_bound
from dp.sampling import SamplingRecord, boundary_delta
from dp.ledger import (Charge, DiscreteGaussianMechanism, Ledger, Mechanism, Observer, PrivacyUnit,
                       SkellamMechanism, compose_epsilon)
from dp.released import Released
from dp.rotation import Seed, padded_length, rotate, unrotate
from dp.samplers import CryptoRandom, discrete_gaussian, skellam
from secagg.ring import RING_2_32, Ring

if TYPE_CHECKING:
    from dp.xnoise import LayeredNoise, NoiseRecord
    from secagg.noise_layers import LayerSecrets, LayerSpec

MECHANISMS = ("skellam", "discrete_gaussian")
_MAX_ROUNDING_ATTEMPTS = 1000


class PlanningError(ValueError):
    """The ring, client count, clip and privacy target cannot be met together."""


class InsufficientNoiseError(RuntimeError):
    """Fewer clients contributed noise than the noise was calibrated for (n_min)."""


class TooManyClientsError(ValueError):
    """More clients than the ring was sized for (expected_clients): the sum may wrap around."""


@dataclass(frozen=True)
class DistributedDPConfig:
    l2_clip: float
    """C: each client's (weighted) vector is clipped to this L2 norm."""
    noise_multiplier: float | None = None
    """z: the summed noise of n_min clients has stddev z * C. Give this or target_epsilon."""
    target_epsilon: float | None = None
    """Solve z so that `target_observer`'s epsilon over `rounds` rounds is at most this."""
    delta: float = 1e-5
    mechanism: str = "skellam"
    """'skellam' (default) or 'discrete_gaussian'."""
    expected_clients: int = 100
    """n: the most clients summed in one round (sizes the ring against overflow)."""
    min_clients: int | None = None
    """n_min: survivors the noise is calibrated for (the dropout margin); default n."""
    bits: int = 16
    """Z_{2^32}: values live modulo 2^bits (<= 32). F_p: ignored, the whole field is used."""
    beta: float = math.exp(-0.5)
    """Conditional rounding parameter (0 = unconditional stochastic rounding)."""
    modclip_prob: float = 1e-4
    """Target probability that an aggregate coordinate wraps around (sets k stddevs)."""
    rounds: int = 1
    """Accounting horizon for target_epsilon (rounds for 'outsider', participations for 'server')."""
    sampling_rate: float = 1.0
    """Expected cohort / population: the amplification available against outsiders (Poisson cohorts only)."""
    population: int | None = None
    """Clients the Poisson cohorts are drawn from: needed when sampling_rate < 1, for the boundary delta
    of rounds whose cohort falls below the floor n_min (`dp.sampling`)."""
    target_observer: str = "outsider"
    exact_noise: bool = False
    """XNoise (`dp.xnoise`): split each client's noise into a base and layers that are removed once the
    survivors are known, so every released sum carries the target noise whatever the survivor count from
    n_min up (Skellam: exactly; discrete Gaussian: to within whole units, see `dg_units`), under SecAgg,
    SecAgg+ or LightSecAgg. False: noise sized for n_min is left in."""
    dg_units: int = 16
    """Exact noise with the discrete Gaussian: each client's noise at the floor is this many independent
    discrete Gaussians of one width (units), so every released sum is a sum of equal-width discrete
    Gaussians, the case arXiv 2102.06387 accounts for. A sum of u honest survivors keeps ceil(n_min G / u)
    units each: at least the target and less than (1 + u / (n_min G)) times it. More units, closer to the
    target, more draws per client."""

    def __post_init__(self) -> None:
        if not self.l2_clip > 0:
            raise ValueError("l2_clip must be positive")
        if (self.noise_multiplier is None) == (self.target_epsilon is None):
            raise ValueError("give exactly one of noise_multiplier and target_epsilon")
        if self.noise_multiplier is not None and not self.noise_multiplier > 0:
            raise ValueError("noise_multiplier must be positive")
        if self.target_epsilon is not None and not self.target_epsilon > 0:
            raise ValueError("target_epsilon must be positive")
        if self.mechanism not in MECHANISMS:
            raise ValueError(f"mechanism must be one of {MECHANISMS}")
        if self.expected_clients < 1 or (self.min_clients is not None and not 1 <= self.min_clients <= self.expected_clients):
            raise ValueError("need 1 <= min_clients <= expected_clients")
        if not 1 <= self.bits <= 32:
            raise ValueError("bits must be in [1, 32]")
        if not 0 <= self.beta < 1:
            raise ValueError("beta must be in [0, 1)")
        if not 0 < self.modclip_prob < 1:
            raise ValueError("modclip_prob must be in (0, 1)")
        if not 0 < self.sampling_rate <= 1 or self.rounds < 1 or not 0 < self.delta < 1:
            raise ValueError("need 0 < sampling_rate <= 1, rounds >= 1, 0 < delta < 1")
        if self.target_observer not in (Observer.SERVER.value, Observer.OUTSIDER.value):
            raise ValueError("target_observer is 'server' or 'outsider'")
        if self.sampling_rate < 1 and (self.population is None or self.population < 2):
            raise ValueError("sampling_rate < 1 needs the population (>= 2) the cohorts are drawn from")
        if isinstance(self.dg_units, bool) or not isinstance(self.dg_units, int) or not 1 <= self.dg_units <= 4096:
            raise ValueError(f"dg_units must be an int in [1, 4096], got {self.dg_units!r}")

    def boundary_delta(self, observer: Observer | str) -> float:
        """Per-round delta of skipped Poisson cohorts for `observer` (0 unless amplified; `dp.sampling`)."""
        if Observer(observer) is not Observer.OUTSIDER or self.sampling_rate >= 1:
            return 0.0
        return boundary_delta(population=self.population, rate=self.sampling_rate, min_cohort=self.protocol_floor())

    @property
    def n_min(self) -> int:
        return self.min_clients or self.expected_clients

    def protocol_floor(self) -> int:
        """Fewest survivors a secure-sum protocol may unmask under this config: n_min (at least 2).

        Give it to the protocol as its minimum (SecAgg's `min_clients`, LightSecAgg's target
        survivors) so that a sum with less noise than calibrated is never opened."""
        return max(2, self.n_min)

    def check_cohort(self, n_clients: int) -> None:
        """Refuse a sum over more clients than the ring was sized for (its aggregate may wrap)."""
        if n_clients > self.expected_clients:
            raise TooManyClientsError(f"a secure sum of {n_clients} members exceeds distributed_dp expected_clients="
                                      f"{self.expected_clients} (the ring is sized for that many): raise "
                                      "expected_clients or shrink the cohort")

    def layer_spec(self, *, colluders: int = 0, members: int | None = None) -> "LayerSpec":
        """XNoise layers for honest survivor counts n_min .. m - colluders - 1, m = the sum's `members` (no more
        can survive it; at most expected_clients) or, when not given, expected_clients.

        Per sum, not per config: a Poisson cohort of 50 drawn for a ring sized for 90 needs 18 layers, not 58,
        and every client draws them all (3x the noise draws; measured on the privacy frontier, 2026-11-29).
        A count below what the survivors reach can only leave more noise than the target, never less
        (`LayeredNoise.remaining_variance`): a server that understates a sum's size gains nothing."""
        from secagg.noise_layers import LayerSpec

        m = self.expected_clients if members is None else min(int(members), self.expected_clients)
        return LayerSpec(count=max(0, m - colluders - self.n_min), floor=self.n_min, colluders=colluders)

    @property
    def k_stddevs(self) -> float:
        return math.sqrt(2.0) * float(special.erfcinv(self.modclip_prob))


@dataclass(frozen=True)
class DistributedDPPlan:
    """Everything a round needs, derived once from the config, the dimension and the ring."""

    config: DistributedDPConfig
    ring: Ring
    dim: int
    padded_dim: int
    modulus: int
    noise_multiplier: float
    scale: float
    local_stddev: float
    """Per-client noise stddev in float units (z C / sqrt(n_min))."""
    l2_sensitivity: float
    """Rounding-inflated L2 bound in integer units."""
    l1_sensitivity: float
    rounding_threshold: float
    """Conditional rounding retries until ||r|| is at most this (inf when beta = 0)."""

    @property
    def local_stddev_scaled(self) -> float:
        return self.local_stddev * self.scale

    @property
    def units(self) -> int:
        """Equal-width discrete Gaussian units per client at the floor (exact noise with the discrete
        Gaussian, `DistributedDPConfig.dg_units`); 0 otherwise (Skellam, or floor-sized noise)."""
        c = self.config
        return c.dg_units if c.exact_noise and c.mechanism == "discrete_gaussian" else 0

    @property
    def unit_stddev_scaled(self) -> float:
        """The stddev of one unit (integer units): local_stddev_scaled / sqrt(units)."""
        return self.local_stddev_scaled / math.sqrt(self.units) if self.units else self.local_stddev_scaled

    @property
    def inflation(self) -> float:
        """Rounded over unrounded L2 sensitivity (1.0 = no cost of discreteness)."""
        return self.l2_sensitivity / (self.config.l2_clip * self.scale)

    def mechanism(self, observer: Observer | str) -> Mechanism:
        """The per-round mechanism as seen by `observer` (amplified by sampling for outsiders)."""
        q = self.config.sampling_rate if Observer(observer) is Observer.OUTSIDER else 1.0
        n_min, s = self.config.n_min, self.scale
        if self.config.mechanism == "skellam":
            return SkellamMechanism(l1_sensitivity=self.l1_sensitivity, l2_sensitivity=self.l2_sensitivity,
                                    variance=n_min * self.local_stddev_scaled**2, sampling_rate=q, scale=s)
        units = max(1, self.units)  # exact noise: n_min G equal-width units at the floor, the same variance
        return DiscreteGaussianMechanism(l1_sensitivity=self.l1_sensitivity, l2_sensitivity=self.l2_sensitivity,
                                         local_stddev=self.unit_stddev_scaled, n_clients=n_min * units,
                                         dim=self.padded_dim, sampling_rate=q, scale=s)

    def epsilon(self, *, observer: Observer | str, rounds: int, delta: float | None = None,
                accountant: str = "rdp") -> float:
        """Epsilon over `rounds` rounds at `delta` less the rounds' boundary delta (amplified outsiders)."""
        remaining = (delta or self.config.delta) - rounds * self.config.boundary_delta(observer)
        if remaining <= 0:
            return math.inf
        return compose_epsilon([(self.mechanism(observer), rounds)], delta=remaining, accountant=accountant)

    @property
    def target_variance(self) -> float:
        """V: the noise variance (integer units) of n_min clients' shares, which the accounting assumes."""
        return self.config.n_min * self.local_stddev_scaled**2

    def layered(self, spec: "LayerSpec") -> "LayeredNoise":
        """This plan's noise split into a base and removable layers (`dp.xnoise`)."""
        from dp.xnoise import LayeredNoise

        if spec.floor != self.config.n_min:
            raise ValueError(f"a layer spec for floor {spec.floor}, but the plan's n_min is {self.config.n_min}")
        return LayeredNoise(spec=spec, target_variance=self.target_variance, units=self.units)

    def summary(self) -> dict:
        c = self.config
        return {
            "mechanism": c.mechanism, "l2_clip": c.l2_clip, "noise_multiplier": self.noise_multiplier,
            "expected_clients": c.expected_clients, "min_clients": c.n_min, "modulus": self.modulus,
            "dim": self.dim, "padded_dim": self.padded_dim, "scale": self.scale,
            "local_stddev": self.local_stddev, "local_stddev_scaled": self.local_stddev_scaled,
            "k_stddevs": c.k_stddevs, "l2_inflation": self.inflation, "delta": c.delta, "exact_noise": c.exact_noise,
            "epsilon_server_per_round": self.epsilon(observer=Observer.SERVER, rounds=1),
            "epsilon_target": self.epsilon(observer=c.target_observer, rounds=c.rounds),
        }


def _ring_modulus(config: DistributedDPConfig, ring: Ring) -> int:
    return 1 << config.bits if ring.is_power_of_two else ring.modulus


def _plan_for(config: DistributedDPConfig, *, dim: int, ring: Ring, z: float) -> DistributedDPPlan:
    n, n_min, c, k = config.expected_clients, config.n_min, config.l2_clip, config.k_stddevs
    d_pad = padded_length(dim)
    m = _ring_modulus(config, ring)
    if float(m) ** 2 <= n * k**2:
        raise PlanningError(f"a ring of size {m} cannot hold {n} clients at k={k:.2f} stddevs "
                            f"(need m^2 > n k^2): raise bits, lower expected_clients or modclip_prob")
    local = z * c / math.sqrt(n_min)
    scale = math.sqrt(float(m) ** 2 - n * k**2) / (2.0 * k * math.sqrt(c**2 * n**2 / d_pad + n * local**2))
    l2 = rounded_l2_norm_bound(c * scale, beta=config.beta, dim=d_pad)
    threshold = conditional_rounding_bound(c * scale, beta=config.beta, dim=d_pad) if config.beta > 0 else math.inf
    return DistributedDPPlan(config=config, ring=ring, dim=dim, padded_dim=d_pad, modulus=m, noise_multiplier=z,
                             scale=scale, local_stddev=local, l2_sensitivity=l2,
                             l1_sensitivity=rounded_l1_norm_bound(l2, dim=d_pad), rounding_threshold=threshold)


def plan_distributed_dp(config: DistributedDPConfig, *, dim: int, ring: Ring = RING_2_32) -> DistributedDPPlan:
    """Choose scale (and the noise multiplier, for a target epsilon) for vectors of length `dim`."""
    if dim < 1:
        raise ValueError("dim must be positive")
    if config.bits < math.log2(config.expected_clients) and ring.is_power_of_two:
        raise PlanningError(f"bits={config.bits} < log2(expected_clients={config.expected_clients})")
    if config.noise_multiplier is not None:
        return _checked(_plan_for(config, dim=dim, ring=ring, z=config.noise_multiplier))

    target, obs = config.target_epsilon, config.target_observer

    def excess(log_z: float) -> float:
        plan = _plan_for(config, dim=dim, ring=ring, z=math.exp(log_z))
        return plan.epsilon(observer=obs, rounds=config.rounds) - target

    lo, hi = math.log(1e-3), math.log(1e4)
    if config.rounds * config.boundary_delta(obs) >= config.delta:
        raise PlanningError(
            f"Poisson cohorts of {config.sampling_rate:g} x {config.population} fall below the floor n_min="
            f"{config.protocol_floor()} so often that the boundary delta of {config.rounds} rounds "
            f"({config.rounds * config.boundary_delta(obs):.3g}) uses up delta={config.delta:g}: raise the "
            "expected cohort, lower min_clients, or account without amplification (sampling_rate=1)")
    if excess(hi) > 0:
        floor = excess(hi) + target
        raise PlanningError(f"target epsilon {target} is unreachable: even z=1e4 gives {floor:.4g} "
                            f"(rounding at this ring size dominates; raise bits)")
    if excess(lo) <= 0:
        log_z = lo
    else:
        log_z = optimize.brentq(excess, lo, hi, xtol=1e-6)
        while excess(log_z) > 0:  # brentq lands within xtol on either side: step to the safe side
            log_z += 1e-6
    return _checked(_plan_for(config, dim=dim, ring=ring, z=math.exp(log_z)))


def _checked(plan: DistributedDPPlan) -> DistributedDPPlan:
    """Exact discrete Gaussian noise: the ledger charges the floor's N0 = n_min G units, and a release carries
    N >= N0 of them (u honest survivors keeping ceil(n_min G / u) each, or more if a sum's layers were sized
    for fewer members), at most n G: more noise, but a larger tau (arXiv 2102.06387's distance of a sum of
    discrete Gaussians from one). Each term of the RDP bound grows with the scaled sensitivities and with
    tau, so the curve with N0's sensitivities and n G's tau bounds every such release; refuse a plan where
    it lies above the charged curve at some order, so that the charge bounds every release."""
    if not plan.units:
        return plan
    from dp.accounting import curve, discrete_gaussian_rdp_fn

    charged = plan.mechanism(Observer.SERVER)
    worst = discrete_gaussian_rdp_fn(l1=charged.l1_sensitivity, l2=charged.l2_sensitivity,
                                     local_stddev=charged.local_stddev, n_clients=charged.n_clients, dim=charged.dim,
                                     tau_clients=plan.config.expected_clients * plan.units)
    if np.any(curve(worst) > charged.rdp() * (1 + 1e-9) + 1e-12):
        raise PlanningError(f"exact discrete Gaussian noise: a release of up to {plan.config.expected_clients * plan.units} "
                            f"units of stddev {plan.unit_stddev_scaled:.3g} could lose more privacy than the floor's "
                            f"charge of {charged.n_clients} (its units are too narrow for the tau term): lower dg_units "
                            "or raise bits")
    return plan
    c, g = plan.config, plan.units
    charged = plan.mechanism(Observer.SERVER).rdp()
    for u in range(c.n_min + 1, c.expected_clients + 1):
        kept = -(-c.n_min * g // u)
        realised = dataclasses.replace(plan.mechanism(Observer.SERVER), n_clients=u * kept).rdp()
        if np.any(realised > charged * (1 + 1e-9) + 1e-12):
            raise PlanningError(f"exact discrete Gaussian noise: a release of {u} survivors ({u * kept} units of stddev "
                                f"{plan.unit_stddev_scaled:.3g}) would lose more privacy than the floor's charge (its "
                                "units are too narrow for the tau term): lower dg_units or raise bits")
    return plan


@dataclass(frozen=True)
class EncodeReport:
    clipped: bool
    """The weighted vector's norm exceeded C and was scaled down."""
    norm: float
    rounding_attempts: int
    wrapped: int
    """Coordinates of this client's noisy integer vector outside [-m/2, m/2) before reduction."""


@dataclass(frozen=True)
class DecodeReport:
    headroom: float
    """max |centred aggregate| / (m/2): near 1 means wrap-around is likely."""
    n_clients: int


class DistributedDPEncoder:
    """Encode client vectors to uint32 ring vectors with local integer noise; decode ring sums."""

    def __init__(self, plan: DistributedDPPlan, *, rng_factory: Callable[[], CryptoRandom] = CryptoRandom) -> None:
        self.plan = plan
        self._rng_factory = rng_factory

    @classmethod
    def from_config(cls, config: DistributedDPConfig, *, dim: int, ring: Ring = RING_2_32) -> "DistributedDPEncoder":
        return cls(plan_distributed_dp(config, dim=dim, ring=ring))

    @property
    def ring(self) -> Ring:
        return self.plan.ring

    @property
    def length(self) -> int:
        """Length of the uint32 vector each client uploads (the padded dimension)."""
        return self.plan.padded_dim

    # ---- client side ----------------------------------------------------------------------
    def encode(self, x: np.ndarray, *, round_seed: Seed, weight: float = 1.0, rng: CryptoRandom | None = None,
               noise_layers: "LayerSecrets | None" = None, client: int = 0) -> np.ndarray:
        return self.encode_with_report(x, round_seed=round_seed, weight=weight, rng=rng,
                                       noise_layers=noise_layers, client=client)[0]

    def encode_with_report(self, x: np.ndarray, *, round_seed: Seed, weight: float = 1.0,
                           rng: CryptoRandom | None = None, noise_layers: "LayerSecrets | None" = None,
                           client: int = 0) -> tuple[np.ndarray, EncodeReport]:
        """`rng` replaces the fresh OS-keyed stream for rounding and noise: tests of
        reproducibility only (a known key makes the noise known, and with it the input).
        `noise_layers` (XNoise): the same total noise, drawn as a base plus this client's removable
        layers (`dp.xnoise`); `client` is its id in the secure sum (it keys the layers)."""
        p = self.plan
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 1 or x.shape[0] != p.dim:
            raise ValueError(f"expected a flat vector of length {p.dim}, got shape {x.shape}")
        if not np.all(np.isfinite(x)):
            raise ValueError("input contains NaN or infinity")
        if not 0 <= weight <= 1:
            raise ValueError("weight must be in [0, 1] (it is applied before clipping)")
        v = weight * x
        norm = float(np.linalg.norm(v))
        clipped = norm > p.config.l2_clip
        if clipped:
            v *= p.config.l2_clip / norm
        y = rotate(v, seed=round_seed)
        y *= p.scale
        rng = self._rng_factory() if rng is None else rng
        r, attempts = self._conditional_round(y, rng)
        if noise_layers is None:
            r += self._noise(rng)
        else:
            cache = noise_layers.excess if isinstance(noise_layers.excess, ClientExcess) else None
            r += self.plan.layered(noise_layers.spec).client_noise(
                noise_layers, client=client, dim=p.padded_dim, rng=rng, prefixes=cache.keep if cache else None)
        half = p.modulus // 2
        wrapped = int(np.count_nonzero((r < -half) | (r >= p.modulus - half)))
        return self._reduce(r), EncodeReport(clipped=clipped, norm=norm, rounding_attempts=attempts, wrapped=wrapped)

    def _conditional_round(self, y: np.ndarray, rng: CryptoRandom) -> tuple[np.ndarray, int]:
        floor = np.floor(y)
        frac = y - floor
        base = floor.astype(np.int64)
        bound_sq = self.plan.rounding_threshold**2
        for attempt in range(1, _MAX_ROUNDING_ATTEMPTS + 1):
            r = base + (rng.uniform(y.shape[0]) < frac)
            if not math.isfinite(bound_sq):
                return r, attempt
            rf = r.astype(np.float64)  # the squared norm can pass 2^63 for wide rings
            if float(rf @ rf) <= bound_sq:
                return r, attempt
        raise RuntimeError("conditional rounding failed repeatedly: the norm bound is inconsistent")

    def _noise(self, rng: CryptoRandom) -> np.ndarray:
        sigma = self.plan.local_stddev_scaled
        n = self.plan.padded_dim
        if self.plan.config.mechanism == "skellam":
            return skellam(sigma**2 / 2.0, n, rng)
        if self.plan.units:  # exact noise without layers: the floor's units, as charged
            from dp.xnoise import discrete_gaussian_units
            return discrete_gaussian_units(self.plan.unit_stddev_scaled, self.plan.units, n, rng)
        return discrete_gaussian(sigma, n, rng)

    def _reduce(self, r: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """int64 values mod the ring's modulus as uint32 (into `out` when given). A power of two is a mask
        (two's complement: the same residues as np.mod, 10x faster)."""
        m = self.plan.modulus
        if m & (m - 1) == 0:  # 2^bits, bits <= 32: two's-complement truncation, masked below 2^32
            if out is None:
                out = np.empty(r.shape, dtype=np.uint32)
            return np.bitwise_and(r, m - 1, out=out, casting="unsafe")
        reduced = np.mod(r, m).astype(np.uint32)
        if out is None:
            return reduced
        out[...] = reduced
        return out

    # ---- server side ----------------------------------------------------------------------
    def centred(self, ring_sum: np.ndarray) -> np.ndarray:
        """Centred lift of the aggregate modulo m: int64 in [-m/2, m/2)."""
        p = self.plan
        self.ring.validate(ring_sum, length=p.padded_dim)
        m = p.modulus
        if self.ring.is_power_of_two:
            v = (ring_sum & np.uint32(m - 1)).astype(np.int64) if m < 1 << 32 else ring_sum.astype(np.int64)
        else:
            v = ring_sum.astype(np.int64)
        v[v >= m - m // 2] -= m
        return v

    def remove_layers(self, ring_sum: np.ndarray, *, spec: "LayerSpec", index: int,
                      revealed: Mapping[int, int], excess: np.ndarray | None = None) -> np.ndarray:
        """XNoise, server side: the ring sum less the contributors' layers 0..index: `excess` (the ring sum
        of those the survivors sent themselves) and those regenerated from `revealed` layer secrets (of
        survivors that dropped during the removal). A new array, mod the ring."""
        removed = self.plan.layered(spec).removed(revealed, index, dim=self.plan.padded_dim)
        out = self._reduce(-removed)
        if excess is not None:
            self.ring.validate(excess, length=self.plan.padded_dim)
            self.ring.sub_(out, excess)
        return self.ring.add_(out, ring_sum)

    def excess_fn(self, secrets: "LayerSecrets", *, client: int) -> "ClientExcess":
        """The client's own excess noise for a removal index: its layers 0..index as a ring vector (what
        `LayerSecrets.excess` sends instead of leaving the server to regenerate them)."""
        return ClientExcess(encoder=self, secrets=secrets, client=client)

    def noise_record(self, *, spec: "LayerSpec | None", survivors: int, index: int = -1,
                     colluders: int = 0) -> "NoiseRecord":
        """Planned and realised noise of one release (honest survivors only), for the ledger."""
        from secagg.noise_layers import LayerSpec

        spec = spec or LayerSpec(count=0, floor=self.plan.config.n_min, colluders=colluders)
        return self.plan.layered(spec).record(survivors=survivors, index=index)

    def decode(self, ring_sum: np.ndarray, *, round_seed: Seed, n_clients: int,
               total_weight: float | None = None) -> np.ndarray:
        """Noisy mean (sum / n_clients, or / total_weight) of the clients' clipped vectors."""
        return self.decode_with_report(ring_sum, round_seed=round_seed, n_clients=n_clients,
                                       total_weight=total_weight)[0]

    def decode_with_report(self, ring_sum: np.ndarray, *, round_seed: Seed, n_clients: int,
                           total_weight: float | None = None) -> tuple[np.ndarray, DecodeReport]:
        self.check_survivors(n_clients)
        v = self.centred(ring_sum)
        headroom = float(np.max(np.abs(v))) / (self.plan.modulus / 2) if v.size else 0.0
        total = unrotate(v.astype(np.float64) / self.plan.scale, seed=round_seed, dim=self.plan.dim)
        denom = float(n_clients if total_weight is None else total_weight)
        if not denom > 0:
            raise ValueError("total weight must be positive")
        return total / denom, DecodeReport(headroom=headroom, n_clients=n_clients)

    def check_survivors(self, n_clients: int) -> None:
        """Refuse aggregates of fewer than n_min clients (noise below calibration) or more than
        expected_clients (the ring was sized for that many).

        The secure layer sets the protocol's survivor minimum to n_min (`DistributedDPConfig.
        protocol_floor`), so such a sum is never unmasked in the first place; this is the second
        line of defence.
        """
        if n_clients < self.plan.config.n_min:
            raise InsufficientNoiseError(f"{n_clients} contributors < min_clients={self.plan.config.n_min}: "
                                         "the summed noise is below the calibrated level")
        if n_clients > self.plan.config.expected_clients:
            raise TooManyClientsError(f"{n_clients} contributors > expected_clients="
                                      f"{self.plan.config.expected_clients}: the ring was sized for fewer; "
                                      "the sum may have wrapped")

    # ---- accounting -----------------------------------------------------------------------
    def charge_round(self, ledger: Ledger, *, round_id: int, participants: Iterable[int],
                     population: Iterable[int] | None = None, summary_key: str = "model-update",
                     sampling: SamplingRecord | None = None) -> list[Charge]:
        """Debit one round: participants against the server (no amplification), and against
        outsiders either the participants (sampling_rate = 1) or the whole population (amplified
        by sampling_rate, charged whether sampled or not, as amplification requires)."""
        participants = sorted(set(int(c) for c in participants))
        server = self.plan.mechanism(Observer.SERVER)
        charges = ledger.debit_many(participants, server, unit=PrivacyUnit.CLIENT, observer=Observer.SERVER,
                                    round_id=round_id, summary_key=summary_key, sampling=sampling)
        if self.plan.config.sampling_rate < 1:
            if population is None:
                raise ValueError("sampling_rate < 1: pass the population so every client is charged")
            outsiders = sorted(set(int(c) for c in population))
            if len(outsiders) != self.plan.config.population:
                raise ValueError(f"a population of {len(outsiders)} clients, but the plan was made for "
                                 f"{self.plan.config.population}")
            if not set(participants) <= set(outsiders):
                raise ValueError("participants must belong to the population")
        else:
            outsiders = participants
        charges += ledger.debit_many(outsiders, self.plan.mechanism(Observer.OUTSIDER), unit=PrivacyUnit.CLIENT,
                                     observer=Observer.OUTSIDER, round_id=round_id, summary_key=summary_key, sampling=sampling)
        return charges

    def release(self, ring_sum: np.ndarray, *, round_seed: Seed, round_id: int, contributors: Iterable[int],
                ledger: Ledger, population: Iterable[int] | None = None, summary_key: str = "model-update",
                total_weight: float | None = None, sampling: SamplingRecord | None = None,
                noise: "NoiseRecord | None" = None) -> Released:
        """Decode a group sum and return it as a Released value, debiting the ledger first. `sampling`:
        how the cohort was drawn (required for an outsider charge amplified by sampling_rate < 1).
        `noise`: the release's planned and realised noise (default: no layers removed), kept in the
        ledger's noise log for `dp.recompute`."""
        contributors = sorted(set(int(c) for c in contributors))
        self.check_survivors(len(contributors))
        noise = noise or self.noise_record(spec=None, survivors=len(contributors))
        if noise.survivors != len(contributors) or not noise.realised_variance >= noise.target_variance * (1 - 1e-9):
            raise InsufficientNoiseError(f"the release would carry variance {noise.realised_variance:.6g} from its "
                                         f"honest survivors, below the accounted {noise.target_variance:.6g}")
        charges = self.charge_round(ledger, round_id=round_id, participants=contributors,
                                    population=population, summary_key=summary_key, sampling=sampling)
        ledger.record_noise(dataclasses.replace(noise, round_id=round_id, summary_key=summary_key).to_dict())
        mean = self.decode(ring_sum, round_seed=round_seed, n_clients=len(contributors), total_weight=total_weight)
        p = self.plan
        description = {"name": f"distributed_{p.config.mechanism}", "l2_clip": p.config.l2_clip,
                       "noise_multiplier": p.noise_multiplier, "min_clients": p.config.n_min,
                       "scale": p.scale, "modulus": p.modulus, "delta": p.config.delta,
                       "exact_noise": p.config.exact_noise, "target_variance": noise.target_variance,
                       "planned_variance": noise.planned_variance, "realised_variance": noise.realised_variance}
        return Released(payload=mean, unit=PrivacyUnit.CLIENT, contributors=frozenset(contributors),
                        summary_key=summary_key, mechanism=description, charges=tuple(charges),
                        round_id=round_id, _capability=_mint.MINT)


class ClientExcess:
    """A client's excess noise for the removal index the survivors warrant: its layers 0..index, reduced
    mod the ring. Encoding keeps one vector, the sum of all L layers (`keep`); the excess for index i is
    that sum less the layers above i, redrawn from their keys, or layers 0..i redrawn, whichever draws
    fewer. With no dropout (i = L - 1) it costs nothing more. Until 2026-11-29 every prefix sum was kept
    (L ring vectors a client: 8.8 GB resident at cohort 50 of the privacy frontier, a reduction per
    layer); now one int64 vector."""

    def __init__(self, *, encoder: DistributedDPEncoder, secrets: "LayerSecrets", client: int) -> None:
        self.encoder, self.secrets, self.client = encoder, secrets, client
        self._all: np.ndarray | None = None

    def keep(self, j: int, prefix: np.ndarray) -> None:
        if j == self.secrets.spec.count - 1:
            self._all = prefix.copy()

    def __call__(self, index: int) -> np.ndarray:
        if index < 0:
            return np.zeros(0, dtype=np.uint32)
        count = self.secrets.spec.count
        if not index < count:
            raise ValueError(f"removal index {index} is past this client's {count} layers")
        total, self._all = self._all, None  # one removal per round: the kept sum is not needed again
        if total is not None and count - 1 - index <= index + 1:  # fewer layers above the index than up to it
            for j in range(index + 1, count):
                total -= self._layer(j)
        else:
            total = np.zeros(self.encoder.plan.padded_dim, dtype=np.int64)
            for j in range(index + 1):
                total += self._layer(j)
        return self.encoder._reduce(total)

    def _layer(self, j: int) -> np.ndarray:
        from secagg.noise_layers import layer_key

        layered, dim = self.encoder.plan.layered(self.secrets.spec), self.encoder.plan.padded_dim
        return layered.layer(layer_key(self.secrets.secrets[j], client=self.client, index=j), j, dim)
