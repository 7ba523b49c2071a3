"""Central DP with a TRUSTED aggregator: clip on the client, Gaussian noise on the secure sum.

Labelled separately from distributed DP because its threat model is weaker: the secure sum
reveals the *noiseless* sum of clipped vectors to the server, which then adds N(0, z^2 C^2 I) once
(DP-FedAvg, McMahan et al. arXiv 1710.06963; pfl's `CentrallyAppliedPrivacyMechanism`). Against
outsiders who see only released models this is a subsampled Gaussian (Poisson, or without
replacement for fixed-size cohorts, `dp.sampling`); against the server
it is no protection at all, and the ledger records exactly that (a NonPrivate entry for observer
'server', epsilon = inf).
"""
from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass

import dp_accounting
import numpy as np
from dp_accounting import rdp

from dp import _mint
from dp.sampling import SamplingRecord, boundary_delta
from dp.ledger import Charge, GaussianMechanism, Ledger, NonPrivateMechanism, Observer, PrivacyUnit
from dp.released import Released
from dp.samplers import CryptoRandom, gaussian


@dataclass(frozen=True)
class CentralDPConfig:
    l2_clip: float
    noise_multiplier: float | None = None
    target_epsilon: float | None = None
    """Calibrate z so the outsider's epsilon over `rounds` rounds at `sampling_rate` meets this."""
    delta: float = 1e-5
    rounds: int = 1
    sampling_rate: float = 1.0
    """Cohort / population: amplification against outsiders (expected cohort for Poisson)."""
    population: int | None = None
    """Clients the cohorts are drawn from (needed when sampling_rate < 1)."""
    min_cohort: int = 2
    """Fewest contributors a released sum has (the secure layer's floor); smaller cohorts are skipped."""
    sampler: str = "poisson"
    """How cohorts are drawn when sampling_rate < 1: 'poisson' (add/remove-one, Poisson amplification)
    or 'fixed_size' (population x sampling_rate clients without replacement: replace-one, the
    without-replacement bound, `dp.sampling`)."""

    def __post_init__(self) -> None:
        if not self.l2_clip > 0:
            raise ValueError("l2_clip must be positive")
        if (self.noise_multiplier is None) == (self.target_epsilon is None):
            raise ValueError("give exactly one of noise_multiplier and target_epsilon")
        if not 0 < self.sampling_rate <= 1 or self.rounds < 1:
            raise ValueError("need 0 < sampling_rate <= 1 and rounds >= 1")
        if self.sampling_rate < 1 and (self.population is None or self.population < 2):
            raise ValueError("sampling_rate < 1 needs the population (>= 2) the cohorts are drawn from")
        if type(self.min_cohort) is not int or self.min_cohort < 1:
            raise ValueError("min_cohort is a positive int")
        if self.sampler not in ("poisson", "fixed_size"):
            raise ValueError("sampler is 'poisson' or 'fixed_size'")
        if self.sampler == "fixed_size" and self.sampling_rate < 1:
            size = self.sampling_rate * self.population
            if abs(size - round(size)) > 1e-9 * self.population or round(size) < 1:
                raise ValueError(f"a fixed-size cohort is a whole number of clients: {self.sampling_rate} x "
                                 f"{self.population} = {size}")

    @property
    def sample_size(self) -> int | None:
        """Clients per round of the fixed-size sampler (None for Poisson or no sampling)."""
        if self.sampler != "fixed_size" or self.sampling_rate >= 1:
            return None
        return round(self.sampling_rate * self.population)

    @property
    def boundary_delta(self) -> float:
        """Per-round delta of skipped Poisson cohorts against outsiders (0 without amplification, and
        for fixed-size cohorts, which never fall below the floor)."""
        if self.sampling_rate >= 1 or self.sampler == "fixed_size":
            return 0.0
        return boundary_delta(population=self.population, rate=self.sampling_rate, min_cohort=self.min_cohort)

    def outsider_mechanism(self, z: float) -> GaussianMechanism:
        """One round against outsiders at add/remove multiplier z (noise std z C): Poisson-sampled at q;
        or, for fixed-size cohorts, replace-one (sensitivity 2C, multiplier z/2) sampled without replacement."""
        if self.sample_size is not None:
            return GaussianMechanism(noise_multiplier=z / 2, sensitivity=2 * self.l2_clip, neighbouring="replace_one",
                                     population=self.population, sample_size=self.sample_size)
        return GaussianMechanism(noise_multiplier=z, sampling_rate=self.sampling_rate, sensitivity=self.l2_clip)


@functools.lru_cache(maxsize=256)
def calibrate_noise_multiplier(*, target_epsilon: float, delta: float, rounds: int, sampling_rate: float,
                               population: int | None = None, sample_size: int | None = None) -> float:
    """Smallest z meeting the target, by dp_accounting's calibration with its RDP accountant (replace-one
    and without replacement when `sample_size` of `population` are drawn, where the multiplier is z/2).
    A pure function of its arguments, so kept per process: a sweep asks for the same calibration once per
    seed and setting, and the without-replacement bound takes seconds."""
    if sample_size is not None:
        def event(z: float) -> dp_accounting.DpEvent:
            inner = dp_accounting.GaussianDpEvent(z / 2)
            return dp_accounting.SelfComposedDpEvent(
                dp_accounting.SampledWithoutReplacementDpEvent(population, sample_size, inner), rounds)

        relation = dp_accounting.NeighboringRelation.REPLACE_ONE
        return float(dp_accounting.calibrate_dp_mechanism(  # z > 0: its without-replacement bound divides by z
            lambda: rdp.RdpAccountant(neighboring_relation=relation), event, target_epsilon, delta,
            bracket_interval=dp_accounting.LowerEndpointAndGuess(1e-3, 1.0)))
    return float(dp_accounting.calibrate_dp_mechanism(
        rdp.RdpAccountant,
        lambda z: dp_accounting.SelfComposedDpEvent(_round_event(z, sampling_rate), rounds),
        target_epsilon, delta))


def _round_event(z: float, q: float) -> dp_accounting.DpEvent:
    event = dp_accounting.GaussianDpEvent(z)  # z may be 0 while dp_accounting brackets the solution
    return event if q == 1 else dp_accounting.PoissonSampledDpEvent(q, event)


def clip_l2(x: np.ndarray, *, l2_clip: float, weight: float = 1.0) -> np.ndarray:
    """w x scaled to L2 norm at most `l2_clip` (the client's half of central DP; needs no calibration)."""
    v = weight * np.asarray(x, dtype=np.float64)
    if not 0 <= weight <= 1 or not np.all(np.isfinite(v)):
        raise ValueError("weight must be in [0, 1] and x finite")
    norm = float(np.linalg.norm(v))
    return v * (l2_clip / norm) if norm > l2_clip else v


class CentralDPAggregator:
    """Client: `clip`. Server (trusted): `release` the noisy mean of the secure sum."""

    def __init__(self, config: CentralDPConfig) -> None:
        self.config = config
        remaining = config.delta - config.rounds * config.boundary_delta
        if config.noise_multiplier is None and remaining <= 0:
            raise ValueError(f"the boundary delta of {config.rounds} Poisson rounds uses up delta={config.delta:g}: "
                             "raise the expected cohort or account without amplification")
        self.noise_multiplier = config.noise_multiplier or calibrate_noise_multiplier(
            target_epsilon=config.target_epsilon, delta=remaining, rounds=config.rounds,
            sampling_rate=config.sampling_rate, population=config.population, sample_size=config.sample_size)

    @property
    def noise_stddev(self) -> float:
        return self.noise_multiplier * self.config.l2_clip

    def clip(self, x: np.ndarray, *, weight: float = 1.0) -> np.ndarray:
        """Client side: w x scaled to L2 norm at most C (then encode and secure-sum it)."""
        return clip_l2(x, l2_clip=self.config.l2_clip, weight=weight)

    def add_noise(self, total: np.ndarray) -> np.ndarray:
        total = np.asarray(total, dtype=np.float64)
        return total + gaussian(self.noise_stddev, total.shape[0], CryptoRandom())

    def charge_round(self, ledger: Ledger, *, round_id: int, participants: Iterable[int],
                     population: Iterable[int] | None = None, summary_key: str = "model-update",
                     sampling: SamplingRecord | None = None) -> list[Charge]:
        participants = sorted(set(int(c) for c in participants))
        charges = ledger.debit_many(participants, NonPrivateMechanism("central DP: the server sees the noiseless sum"),
                                    unit=PrivacyUnit.CLIENT, observer=Observer.SERVER, round_id=round_id,
                                    summary_key=summary_key, sampling=sampling)
        q = self.config.sampling_rate
        if q < 1 and population is None:
            raise ValueError("sampling_rate < 1: pass the population so every client is charged")
        outsiders = participants if q == 1 else sorted(set(int(c) for c in population))
        if q < 1 and len(outsiders) != self.config.population:
            raise ValueError(f"a population of {len(outsiders)} clients, but the config says {self.config.population}")
        mech = self.config.outsider_mechanism(self.noise_multiplier)
        charges += ledger.debit_many(outsiders, mech, unit=PrivacyUnit.CLIENT, observer=Observer.OUTSIDER,
                                     round_id=round_id, summary_key=summary_key, sampling=sampling)
        return charges

    def release(self, total: np.ndarray, *, round_id: int, contributors: Iterable[int], ledger: Ledger,
                population: Iterable[int] | None = None, summary_key: str = "model-update",
                total_weight: float | None = None, sampling: SamplingRecord | None = None) -> Released:
        """Noisy mean of the (noiseless) secure sum of clipped vectors, as a Released value. `sampling`:
        how the cohort was drawn (required for an outsider charge amplified by sampling_rate < 1)."""
        contributors = sorted(set(int(c) for c in contributors))
        charges = self.charge_round(ledger, round_id=round_id, participants=contributors, population=population,
                                    summary_key=summary_key, sampling=sampling)
        denom = float(len(contributors) if total_weight is None else total_weight)
        mean = self.add_noise(total) / denom
        description = {"name": "central_gaussian", "trusted_aggregator": True, "l2_clip": self.config.l2_clip,
                       "noise_multiplier": self.noise_multiplier, "delta": self.config.delta}
        return Released(payload=mean, unit=PrivacyUnit.CLIENT, contributors=frozenset(contributors),
                        summary_key=summary_key, mechanism=description, charges=tuple(charges),
                        round_id=round_id, _capability=_mint.MINT)
