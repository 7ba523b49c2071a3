"""Canary-client auditing of a federated mechanism (after Andrew et al., ICLR 2024), at the secure-sum level.

A trial is one federated run of `rounds` rounds over a population of background clients and the
canary clients inserted into it. Each round every client of the population (canaries included,
as ordinary clients) is taken by the project's cohort sampler (`dp.sampling`: Poisson at the
rate, or everyone), the members' update vectors go through the mechanism (`dp.audit.mechanisms`),
and the released mean is the round's model delta (FedAvg with server step 1). The audit sees only
those deltas, as an outside observer of the models does, and the canary directions it drew.

* canary clients: a pool of `canaries_per_trial` seeded random unit directions; each is inserted
  with probability `inclusion` (1/2: Steinke et al.'s one-run bound applies to the pool), and its
  update every round it is sampled is `canary_norm` x C along its direction (C the clip, so
  canary_norm > 1 is an update beyond the clip, which a correct mechanism clips back to C);
  `held_out_per_trial` more directions are never inserted.
* background clients: fresh random directions each round, of norm `background_norm` x C.
* statistics: 'final' (cosine with the total delta) and 'all_iterates' (largest per-round cosine).
* outputs (`AuditResult`): the Clopper-Pearson lower bound (`dp.audit.bounds`) with the statistic
  and threshold chosen on the first half of the trials and evaluated on the second half (with a
  single trial: a seeded half of the canaries); Andrew et al.'s Gaussian-fit estimate; and, when
  the inclusion coins are fair, Steinke et al.'s one-run bound on the pool.

Independence, stated: trials are independent runs, so canaries of different trials are
independent. Within a trial, held-out canaries are i.i.d. given the released deltas, while inserted
canaries share the trial's noise and each other's cross-talk. With one inserted canary per trial
(or orthogonal canaries and Gaussian-like noise) the evaluation trials are independent and the
Clopper-Pearson bound is a 95% bound; with many inserted canaries per trial it is Andrew et al.'s
approximation. The one-run bound needs no independence at all.

Why vectors and not models: every mechanism audited here releases a mean of clipped client vectors
plus noise, so its privacy does not depend on what the vectors are made of; synthetic client
vectors exercise exactly the code that clips, noises, sums and opens them. The runner-level audit
(`dp.audit.runner`) drives the same canaries through `SimulationRunner`.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from dp.audit.bounds import (DEFAULT_CONFIDENCE, ClopperPearsonBound, GaussianFit, OneRunBound, clopper_pearson_bound,
                             gaussian_fit_epsilon, one_run_bound)
from dp.audit.canaries import STATISTICS, canary_directions, canary_scores
from dp.audit.mechanisms import ReleaseRefused, SumMechanism

THREAT_MODEL = ("outsider who sees every released model (all iterates) or only the final one; "
                "unit: one client (add/remove); the claim is the accountant's outsider epsilon")


@dataclass(frozen=True)
class CanaryDesign:
    """How many canaries, how they are inserted, and what their updates are."""

    trials: int = 1
    canaries_per_trial: int = 32
    inclusion: float = 0.5
    """Probability that a pool canary is inserted (1/2: the one-run bound applies; 1: all inserted)."""
    held_out_per_trial: int = 0
    """Extra canaries per trial that are never inserted (cheap: they only cost a dot product)."""
    canary_norm: float = 1.0
    """A canary's update norm in units of the clip C (> 1: beyond the clip)."""
    orthogonal: bool = False
    """Draw each trial's canaries as an orthonormal set (`canary_directions`)."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.trials < 1 or self.canaries_per_trial < 1 or self.held_out_per_trial < 0:
            raise ValueError("need trials >= 1, canaries_per_trial >= 1, held_out_per_trial >= 0")
        if not 0 < self.inclusion <= 1:
            raise ValueError(f"inclusion must be in (0, 1], got {self.inclusion}")
        if not self.canary_norm > 0:
            raise ValueError("canary_norm must be positive")


@dataclass(frozen=True)
class Cohorts:
    """The population around the canaries and how each round's cohort is drawn."""

    background_clients: int = 1
    population: int | None = None
    """If set, the population size the mechanism was planned for: the background is then this many
    clients less the canaries inserted (canaries replace background clients), whatever the coins gave."""
    background_norm: float = 1.0
    """A background client's update norm in units of the clip C."""
    sampling_rate: float = 1.0
    """Poisson rate of the cohort sampler for every client, canaries included (1: everyone, every round)."""
    rounds: int = 1
    max_participations: int | None = None
    """The run's participation cap (`RunConfig.max_participations`): a client drawn after this many cohorts
    is left out, canaries included, as in the run audited."""

    def __post_init__(self) -> None:
        if self.background_clients < 0 or self.rounds < 1 or not self.background_norm >= 0:
            raise ValueError("need background_clients >= 0, rounds >= 1, background_norm >= 0")
        if self.max_participations is not None and self.max_participations < 1:
            raise ValueError("max_participations must be at least 1 (or None: no cap)")
        if not 0 < self.sampling_rate <= 1:
            raise ValueError(f"sampling_rate must be in (0, 1], got {self.sampling_rate}")
        if self.population is not None and self.population < 1:
            raise ValueError("population must be positive")

    def background(self, inserted: int) -> int:
        """Background clients of a trial with `inserted` canaries."""
        if self.population is None:
            return self.background_clients
        if inserted > self.population:
            raise ValueError(f"{inserted} inserted canaries exceed the population of {self.population}")
        return self.population - inserted


@dataclass(frozen=True)
class AuditResult:
    """What one audit of one mechanism measured, next to what its accountant claims."""

    mechanism: str
    claimed_epsilon: float
    """The accountant's epsilon at `delta` (one client, against observers of the released models)."""
    empirical_epsilon: float
    """Andrew et al.'s Gaussian-fit estimate (the larger over the two statistics): an estimate, no confidence."""
    epsilon_lower_bound: float
    """Clopper-Pearson lower bound at `delta`, with probability `confidence`."""
    one_run_lower_bound: float | None
    """Steinke et al.'s one-run bound on the canary pool (None unless the inclusion coins are fair)."""
    max_lower_bound: float
    """The largest Clopper-Pearson bound this audit's evaluation canaries can give."""
    delta: float
    confidence: float
    canaries: int
    """Canaries scored (inserted + held out)."""
    inserted: int
    held_out: int
    trials: int
    rounds: int
    skipped_rounds: int
    """Rounds whose sum was not opened (cohort below the floor): they released nothing."""
    bound: ClopperPearsonBound
    fits: dict[str, GaussianFit]
    one_run: OneRunBound | None
    mechanism_description: dict[str, Any]
    seconds: float
    threat_model: str = THREAT_MODEL
    unit: str = "client"

    @property
    def flagged(self) -> bool:
        """The audit proves (at `confidence`) that the mechanism is less private than claimed."""
        return self.epsilon_lower_bound > self.claimed_epsilon

    def line(self, *, mechanism: str | None = None, claimed: float | None = None) -> str:
        """`audit mechanism=M claimed_eps=C empirical_eps=E eps_lower_bound=L canaries=K`."""
        c = self.claimed_epsilon if claimed is None else claimed
        return (f"audit mechanism={mechanism or self.mechanism} claimed_eps={_fmt(c)} "
                f"empirical_eps={_fmt(self.empirical_epsilon)} eps_lower_bound={_fmt(self.epsilon_lower_bound)} "
                f"canaries={self.canaries}")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["flagged"] = self.flagged
        return json_safe(out)


def _fmt(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.3g}"


def json_safe(x: Any) -> Any:
    """`x` with every non-finite float spelled as a string ('inf', '-inf', 'nan'), for JSON."""
    if isinstance(x, float) and not math.isfinite(x):
        return "inf" if x > 0 else ("-inf" if x < 0 else "nan")
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x


@dataclass(frozen=True)
class _Scores:
    """Per statistic: scores, inserted flags, trial index, pool membership."""

    values: dict[str, list[np.ndarray]] = field(default_factory=lambda: {s: [] for s in STATISTICS})
    inserted: list[np.ndarray] = field(default_factory=list)
    trial: list[np.ndarray] = field(default_factory=list)
    pool: list[np.ndarray] = field(default_factory=list)

    def add(self, scores: dict[str, np.ndarray], *, inserted: np.ndarray, trial: int, pool: np.ndarray) -> None:
        for s in STATISTICS:
            self.values[s].append(scores[s])
        self.inserted.append(inserted)
        self.trial.append(np.full(inserted.shape, trial))
        self.pool.append(pool)

    def arrays(self) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
        return ({s: np.concatenate(v) for s, v in self.values.items()}, np.concatenate(self.inserted),
                np.concatenate(self.trial), np.concatenate(self.pool))


def run_trial(mechanism: SumMechanism, *, design: CanaryDesign, cohorts: Cohorts, trial: int,
              sampler: Callable[[list[int]], list[int]] | None = None) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, int]:
    """One federated run with its canaries: (scores per statistic for pool + held-out canaries, which
    were inserted, which belong to the pool, rounds that released nothing)."""
    from dp.sampling import EveryoneSampler, PoissonSampler

    rng = np.random.default_rng([design.seed, trial])
    k, h, d = design.canaries_per_trial, design.held_out_per_trial, mechanism.dim
    directions = canary_directions(count=k + h, dim=d, seed=[design.seed, trial, 1],
                                   orthogonal=design.orthogonal and k + h <= d)
    inserted = np.zeros(k + h, dtype=bool)
    inserted[:k] = rng.random(k) < design.inclusion if design.inclusion < 1 else True
    # client ids: the inserted canaries first (1..), then the background clients
    canary_ids = {i + 1: int(j) for i, j in enumerate(np.flatnonzero(inserted))}
    ids = list(range(1, len(canary_ids) + cohorts.background(len(canary_ids)) + 1))
    draw = sampler or (EveryoneSampler() if cohorts.sampling_rate >= 1 else PoissonSampler(cohorts.sampling_rate)).sample
    c = mechanism.l2_clip
    deltas = np.zeros((cohorts.rounds, d))
    skipped = 0
    drawn: dict[int, int] = {}
    for r in range(cohorts.rounds):
        cohort = draw(ids) if ids else []
        if cohorts.max_participations is not None:
            cohort = [cid for cid in cohort if drawn.get(cid, 0) < cohorts.max_participations]
            for cid in cohort:
                drawn[cid] = drawn.get(cid, 0) + 1
        members = []
        for cid in cohort:
            if cid in canary_ids:
                members.append((cid, design.canary_norm * c * directions[canary_ids[cid]]))
            else:
                g = rng.standard_normal(d)
                members.append((cid, cohorts.background_norm * c * g / np.linalg.norm(g)))
        try:
            deltas[r] = mechanism.release(members, trial=trial, round=r + 1) if members else 0.0
            if not members:
                skipped += 1
        except ReleaseRefused:
            skipped += 1
    return canary_scores(directions, deltas), inserted, np.arange(k + h) < k, skipped


def audit(mechanism: SumMechanism, *, design: CanaryDesign, cohorts: Cohorts, delta: float,
          confidence: float = DEFAULT_CONFIDENCE, claimed_epsilon: float | None = None,
          statistics: tuple[str, ...] | None = None) -> AuditResult:
    """Run `design.trials` trials of `mechanism` with canary clients and audit its claim at `delta`.

    `claimed_epsilon`: the claim to compare with; default the mechanism's accountant over
    `cohorts.rounds` rounds at `delta`. `statistics`: which of 'final' and 'all_iterates' the bound
    may choose from (default both when there are several rounds, else 'final')."""
    from threadpoolctl import threadpool_limits

    t0 = time.perf_counter()
    stats_used = statistics or (STATISTICS if cohorts.rounds > 1 else ("final",))
    if set(stats_used) - set(STATISTICS):
        raise ValueError(f"statistics are among {STATISTICS}")
    collected, skipped = _Scores(), 0
    with threadpool_limits(limits=1):  # small matrices: a multithreaded BLAS only contends (a QR went 600x slower)
        for t in range(design.trials):
            scores, inserted, pool, skip = run_trial(mechanism, design=design, cohorts=cohorts, trial=t)
            collected.add(scores, inserted=inserted, trial=t, pool=pool)
            skipped += skip
    values, inserted, trial, pool = collected.arrays()
    if not inserted.any() or inserted.all():
        raise ValueError("the audit needs inserted and held-out canaries: raise the counts or lower inclusion")
    if design.trials >= 2:
        select = trial < design.trials // 2
    else:
        select = np.random.default_rng([design.seed, 0x5E1EC7]).permutation(inserted.size) < inserted.size // 2

    def split(mask: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        return {s: (values[s][mask & inserted], values[s][mask & ~inserted]) for s in stats_used}

    bound = clopper_pearson_bound(selection=split(select), evaluation=split(~select), delta=delta, confidence=confidence)
    fits = {s: gaussian_fit_epsilon(values[s][inserted], values[s][~inserted], delta=delta) for s in stats_used}
    one_run = None
    if design.inclusion == 0.5:
        runs = [one_run_bound(values[s][pool], inserted[pool], delta=delta,
                              confidence=1 - (1 - confidence) / len(stats_used)) for s in stats_used]
        one_run = max(runs, key=lambda b: b.epsilon)
    claim = mechanism.claimed_epsilon(rounds=cohorts.rounds, delta=delta) if claimed_epsilon is None else claimed_epsilon
    return AuditResult(mechanism=mechanism.name, claimed_epsilon=float(claim),
                       empirical_epsilon=max(f.epsilon for f in fits.values()), epsilon_lower_bound=bound.epsilon,
                       one_run_lower_bound=None if one_run is None else one_run.epsilon, max_lower_bound=bound.max_epsilon,
                       delta=delta, confidence=confidence, canaries=int(inserted.size), inserted=int(inserted.sum()),
                       held_out=int((~inserted).sum()), trials=design.trials, rounds=cohorts.rounds, skipped_rounds=skipped,
                       bound=bound, fits=fits, one_run=one_run, mechanism_description=mechanism.describe(),
                       seconds=time.perf_counter() - t0)


__all__ = ["THREAT_MODEL", "CanaryDesign", "Cohorts", "AuditResult", "run_trial", "audit", "json_safe"]
