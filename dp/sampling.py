"""Cohort samplers, and the amplification by sampling each one lets the accountant claim.

Amplification by subsampling holds for the sampler it was proved for, with randomness the
observer cannot predict. Hence:

* `PoissonSampler(rate)`: every client independently with probability q, from the OS CSPRNG
  (`secrets.SystemRandom`), so nobody can derive the cohorts from the run's config or seed.
  It justifies Poisson amplification at q: `PoissonSampledDpEvent` in dp_accounting, the
  Zhu-Wang bound for Skellam and discrete Gaussian (`dp.accounting`). The default.
* `FixedSizeSampler(size)`: `size` clients without replacement, from the OS CSPRNG. The Poisson
  theorem does not cover it; the sampling-without-replacement bound does, for Gaussians under
  replace-one neighbouring (dp_accounting's `SampledWithoutReplacementDpEvent`, Wang-Balle-
  Kasiviswanathan 2019 Thm 27): a `GaussianMechanism` with `population` and `sample_size` is
  accepted against this sampler only (`check_without_replacement`), and its label is accounted
  replace-one (`dp.ledger`). Skellam and discrete Gaussian have no such bound here: no amplification.
  A fixed-size cohort never falls below a floor at or under its size, so it adds no boundary delta.
* `SeededSampler(size, seed)`: a numpy generator seeded from the config, a public schedule for
  runs compared cohort for cohort (a simulation and its deployment, a secure run and its plaintext
  twin). Anyone who knows the seed knows every cohort: no amplification, whatever the runtime
  (`check_amplification` and `check_without_replacement` refuse a claim backed by its record).
* `EveryoneSampler()`: every client, every round (q = 1).

Each sampler produces a `SamplingRecord` (scheme, population, rate, min_cohort), which the ledger
keeps on every outsider entry; the ledger refuses a mechanism whose `sampling_rate` is below 1
unless the record is Poisson at that same rate (`check_amplification`), and one sampled without
replacement unless the record is the fixed-size sampler of that size (`check_without_replacement`).

Rounds that release nothing. A secure sum is never opened over fewer than a floor m of clients
(the disclosure guard, or the n_min that distributed DP noise is calibrated for), and a Poisson
cohort can fall below it; such a round releases nothing. The amplification theorem is about a
mechanism applied to *every* Poisson sample, so the skip needs its own argument. Fix the other
clients' samples S (independent of the target x and identical in both neighbouring datasets): if
|S| >= m both datasets release the sampled mechanism's output; if |S| <= m - 2 both release
nothing (no privacy loss); only |S| = m - 1 separates them (x's presence decides whether anything
is released). So each round's guarantee is the sampled mechanism's, except on an event of
probability

    p = P[Binomial(population - 1, q) = m - 1]                      (`SamplingRecord.boundary_delta`)

which the ledger adds to delta once per round that sampled (released or skipped: it records a
zero-cost `NoReleaseMechanism` entry for a skipped round so the count is in the ledger). Rounds
that release nothing therefore cost no epsilon, and the charged rounds are, on the good event, the
same in both datasets. Assumed: dropouts are independent of the target's data, and the floor is
applied to the sampled cohort (simulated or real dropouts that shrink a sum below the floor
after sampling are not in p; state it where a run has dropouts).
"""
from __future__ import annotations

import math
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np

SCHEMES = ("poisson", "fixed_size", "seeded", "everyone")


class AmplificationNotJustified(ValueError):
    """A mechanism claims amplification by sampling that the recorded sampler does not give."""


@dataclass(frozen=True)
class SamplingRecord:
    """How a round's cohort was drawn, as the ledger records it."""

    scheme: str
    population: int
    rate: float
    """Expected cohort size / population (1 for 'everyone')."""
    min_cohort: int = 0
    """Fewest sampled members a round needs to release anything (smaller cohorts are skipped); 0: every
    sample releases, even an empty one (Opacus' Poisson batches take a noise-only step)."""

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise ValueError(f"sampling scheme is one of {SCHEMES}, got {self.scheme!r}")
        if type(self.population) is not int or self.population < 1:
            raise ValueError("the population is a positive int")
        if not 0 < self.rate <= 1:
            raise ValueError(f"sampling rate must be in (0, 1], got {self.rate}")
        if type(self.min_cohort) is not int or self.min_cohort < 0:
            raise ValueError(f"min_cohort is a non-negative int, got {self.min_cohort!r}")

    def with_floor(self, min_cohort: int) -> "SamplingRecord":
        """The same sampler, recording that cohorts below `min_cohort` release nothing."""
        return SamplingRecord(self.scheme, self.population, self.rate, int(min_cohort))

    @property
    def boundary_delta(self) -> float:
        """The delta a round adds when it claims Poisson amplification while skipping cohorts below
        `min_cohort`: P[Binomial(population - 1, rate) = min_cohort - 1] (module doc); 0 otherwise."""
        if self.amplification_rate >= 1 or self.min_cohort == 0:
            return 0.0
        from scipy import stats  # here, not at the top: scipy.stats costs every client process about 1 s

        return float(stats.binom.pmf(self.min_cohort - 1, self.population - 1, self.rate))

    @property
    def amplification_rate(self) -> float:
        """The Poisson rate an outsider's accounting may use: q for Poisson sampling, else 1 (none)."""
        return self.rate if self.scheme == "poisson" else 1.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SamplingRecord":
        if not {"scheme", "population", "rate"} <= set(d) <= {"scheme", "population", "rate", "min_cohort"}:
            raise ValueError(f"a sampling record has scheme, population, rate and min_cohort, got {sorted(d)}")
        return cls(scheme=str(d["scheme"]), population=int(d["population"]), rate=float(d["rate"]),
                   min_cohort=int(d.get("min_cohort", 0)))


def boundary_delta(*, population: int, rate: float, min_cohort: int) -> float:
    """Per-round delta of skipping Poisson cohorts below `min_cohort` (see `SamplingRecord.boundary_delta`)."""
    return SamplingRecord("poisson", population, rate, min_cohort).boundary_delta


def check_amplification(mechanism_rate: float, record: SamplingRecord | None, *, what: str = "the mechanism") -> None:
    """AmplificationNotJustified unless a mechanism accounted at Poisson rate `mechanism_rate` was
    sampled by a Poisson sampler at that rate (a rate of 1 claims nothing and always passes)."""
    if mechanism_rate >= 1:
        return
    if record is None:
        raise AmplificationNotJustified(f"{what} claims Poisson amplification at q={mechanism_rate:g} "
                                        "but no sampler was recorded")
    if record.scheme != "poisson":
        raise AmplificationNotJustified(
            f"{what} claims Poisson amplification at q={mechanism_rate:g}, but the cohort was drawn by the "
            f"'{record.scheme}' sampler, which gives none here: account it at q=1")
    if not math.isclose(record.rate, mechanism_rate, rel_tol=1e-9):
        raise AmplificationNotJustified(f"{what} claims q={mechanism_rate:g} but the Poisson sampler ran at "
                                        f"q={record.rate:g}")


def check_without_replacement(*, population: int, sample_size: int, record: SamplingRecord | None,
                              what: str = "the mechanism") -> None:
    """AmplificationNotJustified unless a mechanism accounted as `sample_size` of `population` drawn
    without replacement was sampled by the fixed-size CSPRNG sampler with exactly those numbers."""
    claim = f"{what} claims sampling without replacement ({sample_size} of {population})"
    if record is None:
        raise AmplificationNotJustified(f"{claim} but no sampler was recorded")
    if record.scheme != "fixed_size":
        raise AmplificationNotJustified(f"{claim}, but the cohort was drawn by the '{record.scheme}' sampler")
    if record.population != population or round(record.rate * record.population) != sample_size:
        raise AmplificationNotJustified(f"{claim}, but the sampler drew {round(record.rate * record.population)} "
                                        f"of {record.population}")


class CohortSampler(Protocol):
    def sample(self, clients: Iterable[int]) -> list[int]:
        """The cohort: a sorted subset of `clients`."""

    def record(self, population: int) -> SamplingRecord:
        """What the ledger keeps about this sampler over a population of this size."""


def _ids(clients: Iterable[int]) -> list[int]:
    ids = sorted(set(int(c) for c in clients))
    if not ids:
        raise ValueError("no clients to sample from")
    return ids


@dataclass(frozen=True)
class PoissonSampler:
    rate: float

    def __post_init__(self) -> None:
        if not 0 < self.rate <= 1:
            raise ValueError(f"the Poisson rate must be in (0, 1], got {self.rate}")

    def sample(self, clients: Iterable[int]) -> list[int]:
        rng = secrets.SystemRandom()
        return [c for c in _ids(clients) if rng.random() < self.rate]

    def record(self, population: int) -> SamplingRecord:
        return SamplingRecord("poisson", population, self.rate)


@dataclass(frozen=True)
class FixedSizeSampler:
    size: int

    def __post_init__(self) -> None:
        if type(self.size) is not int or self.size < 1:
            raise ValueError("the cohort size is a positive int")

    def sample(self, clients: Iterable[int]) -> list[int]:
        ids = _ids(clients)
        return sorted(secrets.SystemRandom().sample(ids, min(self.size, len(ids))))

    def record(self, population: int) -> SamplingRecord:
        return SamplingRecord("fixed_size", population, min(1.0, self.size / population))


class SeededSampler:
    """Reproducible fixed-size cohorts from a seeded numpy generator: a public schedule, never amplified."""

    def __init__(self, *, size: int, seed: int) -> None:
        if type(size) is not int or size < 1:
            raise ValueError("the cohort size is a positive int")
        self.size, self.seed = size, seed
        self._rng = np.random.default_rng(seed)

    def sample(self, clients: Iterable[int]) -> list[int]:
        ids = _ids(clients)
        if self.size >= len(ids):
            return ids
        return sorted(int(c) for c in self._rng.choice(ids, size=self.size, replace=False))

    def record(self, population: int) -> SamplingRecord:
        return SamplingRecord("seeded", population, min(1.0, self.size / population))


@dataclass(frozen=True)
class EveryoneSampler:
    def sample(self, clients: Iterable[int]) -> list[int]:
        return _ids(clients)

    def record(self, population: int) -> SamplingRecord:
        return SamplingRecord("everyone", population, 1.0)


def make_sampler(scheme: str, *, cohort: int | None, population: int, seed: int = 0) -> CohortSampler:
    """The sampler a run config names: `cohort` clients per round (expected, for Poisson) out of
    `population`; None or a cohort of everyone gives EveryoneSampler."""
    if scheme not in SCHEMES:
        raise ValueError(f"sampler is one of {SCHEMES}, got {scheme!r}")
    if population < 1:
        raise ValueError("the population is a positive int")
    if scheme == "everyone" or cohort is None or cohort >= population:
        return EveryoneSampler()
    if cohort < 1:
        raise ValueError("the cohort size is a positive int")
    if scheme == "poisson":
        return PoissonSampler(cohort / population)
    if scheme == "fixed_size":
        return FixedSizeSampler(cohort)
    return SeededSampler(size=cohort, seed=seed)
