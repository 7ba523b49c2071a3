"""Central DP with a TRUSTED aggregator: clip on the client, Gaussian noise on the secure sum.

Labelled separately from distributed DP because its threat model is weaker: the secure sum
reveals the *noiseless* sum of clipped vectors to the server, which then adds N(0, z^2 C^2 I) once
(DP-FedAvg, McMahan et al. arXiv 1710.06963; pfl's `CentrallyAppliedPrivacyMechanism`). Against
outsiders who see only released models this is a Poisson-subsampled Gaussian; against the server
it is no protection at all, and the ledger records exactly that (a NonPrivate entry for observer
'server', epsilon = inf).
"""
from __future__ import annotations

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
    """Expected cohort / population: amplification against outsiders (Poisson cohorts only)."""
    population: int | None = None
    """Clients the Poisson cohorts are drawn from (needed when sampling_rate < 1: boundary delta)."""
    min_cohort: int = 2
    """Fewest contributors a released sum has (the secure layer's floor); smaller cohorts are skipped."""

    def __post_init__(self) -> None:
        if not self.l2_clip > 0:
            raise ValueError("l2_clip must be positive")
        if self.sampling_rate < 1 and (self.population is None or self.population < 2):
            raise ValueError("sampling_rate < 1 needs the population (>= 2) the cohorts are drawn from")
        if type(self.min_cohort) is not int or self.min_cohort < 1:
            raise ValueError("min_cohort is a positive int")

    @property
    def boundary_delta(self) -> float:
        """Per-round delta of skipped Poisson cohorts against outsiders (0 without amplification)."""
        if self.sampling_rate >= 1:
            return 0.0
        return boundary_delta(population=self.population, rate=self.sampling_rate, min_cohort=self.min_cohort)
        if (self.noise_multiplier is None) == (self.target_epsilon is None):
            raise ValueError("give exactly one of noise_multiplier and target_epsilon")
        if not 0 < self.sampling_rate <= 1 or self.rounds < 1:
            raise ValueError("need 0 < sampling_rate <= 1 and rounds >= 1")


def _round_event(z: float, q: float) -> dp_accounting.DpEvent:
    event = dp_accounting.GaussianDpEvent(z)  # z may be 0 while dp_accounting brackets the solution
    return event if q == 1 else dp_accounting.PoissonSampledDpEvent(q, event)


def calibrate_noise_multiplier(*, target_epsilon: float, delta: float, rounds: int, sampling_rate: float) -> float:
    """Smallest z meeting the target, by dp_accounting's calibration with its RDP accountant."""
    return float(dp_accounting.calibrate_dp_mechanism(
        rdp.RdpAccountant,
        lambda z: dp_accounting.SelfComposedDpEvent(_round_event(z, sampling_rate), rounds),
        target_epsilon, delta))


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
            sampling_rate=config.sampling_rate)

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
        mech = GaussianMechanism(noise_multiplier=self.noise_multiplier, sampling_rate=q,
                                 sensitivity=self.config.l2_clip)
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
