"""The seeded-fault suite: five deliberate faults the audit must flag, and correct mechanisms it must not.

    python -m dp.audit --selftest        # ends with: audit_selftest faults=5 flagged=F false_alarms=A

Flagged means: the audit's 95% lower bound (Clopper-Pearson, `dp.audit.bounds`) is above the
accountant's CLAIMED epsilon at the audit's delta. A false alarm is a correct mechanism flagged.

What an audit can catch, honestly. A canary audit measures how well a canary's presence can be
told from the released models; its bound can exceed a claim only where that distinguishability
exceeds what the claim allows, and never beyond what its canary count can certify
(`max_lower_bound`: about ln(n_out / 3.7) with n_out held-out evaluation canaries). Halving the
noise, or counting a client twice, only doubles the Gaussian signal-to-noise ratio mu; one missing
noise share among n_min = 2 multiplies it by sqrt(2). Against a claim at delta = 1e-5 (epsilon
about 4.8 mu) no audit of a few thousand canaries can prove such a factor. So the suite:

* audits at delta = 0.1: the accountant's RDP curve gives an epsilon at every delta, and a
  mechanism that breaks its claim at delta = 1e-5 by adding less noise breaks it at every delta;
  at delta = 0.1 the claim is about 2.5 mu and a factor sqrt(2) on mu is within reach;
* uses a mechanism whose claim is large per round (z = 0.5: mu = 2, claimed 4.9 at delta = 0.1),
  small sums (n_min = 2 members: one canary and one background client, so that one missing share
  halves the noise variance), one round, d = 256 values per update;
* uses many independent trials (one inserted canary each, 250 held-out canaries each): a
  sum-of-vectors mechanism, audited at the secure-sum level with synthetic client updates (the
  mechanism's privacy does not depend on what the vectors encode; `dp.audit.mechanisms`);
* gives every canary an update four times beyond the clip, which the correct code clips back.

| fault                       | mu under the fault (claimed mu = 2) | trials |
|-----------------------------|-------------------------------------|--------|
| ddp_noise_halved            | 4                                   | 1000   |
| noise_share_missing         | 2 sqrt(2) = 2.8                     | 4000   |
| clipping_skipped            | 8 (the canary's 4C enters unclipped)| 500    |
| client_counted_twice        | 2 x 2 / sqrt(3/2) = 3.3             | 2000   |
| sampling_rate_understated   | 2 (mechanism unchanged; the claim falls from 4.9 to 1.35) | 1000 |

Correct runs (the false alarms): the same configuration for DDP Skellam, DDP discrete Gaussian and
central DP, plus Poisson-sampled multi-round runs (rate 1/2, 4 rounds, all-iterates statistic) and
a pool of 16 orthogonal canaries per trial inserted with probability 1/2 (the one-run bound), over
two seeds each. Noise and Poisson cohorts come from the OS CSPRNG as in deployment, so repeated
runs differ; canaries and background updates are seeded.
"""
from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass

from dp.audit.faults import FAULTS

SELFTEST_DELTA = 0.1
SELFTEST_NOISE_MULTIPLIER = 0.5
SELFTEST_DIM = 256
FAULT_TRIALS = {"ddp_noise_halved": 1000, "noise_share_missing": 4000, "clipping_skipped": 500,
                "client_counted_twice": 2000, "sampling_rate_understated": 1000}


@dataclass(frozen=True)
class Case:
    """One audit of the suite: a mechanism, a fault (or none) and the canary configuration."""

    name: str
    mechanism: str
    fault: str | None
    trials: int
    seed: int
    canaries_per_trial: int = 1
    inclusion: float = 1.0
    held_out_per_trial: int = 250
    orthogonal: bool = False
    background_clients: int = 1
    sampling_rate: float = 1.0
    rounds: int = 1
    min_clients: int = 2
    expected_clients: int = 4
    canary_norm: float = 4.0
    noise_seed: int | None = None
    """TESTS ONLY (the unit tests' repeatable cases): seeded DDP noise; the self-test itself draws from the OS."""


@dataclass(frozen=True)
class CaseResult:
    name: str
    mechanism: str
    fault: str | None
    claimed_epsilon: float
    epsilon_lower_bound: float
    empirical_epsilon: float
    one_run_lower_bound: float | None
    max_lower_bound: float
    flagged: bool
    canaries: int
    seconds: float

    def line(self) -> str:
        one = "na" if self.one_run_lower_bound is None else f"{self.one_run_lower_bound:.3g}"
        return (f"case {self.name} mechanism={self.mechanism} fault={self.fault or 'none'} "
                f"claimed_eps={self.claimed_epsilon:.3g} eps_lower_bound={self.epsilon_lower_bound:.3g} "
                f"one_run_lb={one} empirical_eps={self.empirical_epsilon:.3g} max_lb={self.max_lower_bound:.3g} "
                f"canaries={self.canaries} flagged={int(self.flagged)} seconds={self.seconds:.1f}")


@dataclass(frozen=True)
class SelfTestReport:
    faults: int
    flagged: int
    correct_runs: int
    false_alarms: int
    cases: tuple[CaseResult, ...]
    seconds: float

    @property
    def passed(self) -> bool:
        return self.flagged == self.faults and self.false_alarms == 0

    def last_line(self) -> str:
        return f"audit_selftest faults={self.faults} flagged={self.flagged} false_alarms={self.false_alarms}"

    def to_dict(self) -> dict:
        out = asdict(self)
        out["passed"] = self.passed
        return out


def default_cases(*, seeds: Sequence[int] = (1, 2)) -> list[Case]:
    """The suite: each fault once, then the correct mechanisms over `seeds`."""
    cases = [Case(f"fault:{name}", "ddp_skellam", name, trials, seed=seeds[0]) for name, trials in FAULT_TRIALS.items()]
    for seed in seeds:
        cases += [
            Case(f"correct:ddp_skellam/seed{seed}", "ddp_skellam", None, 2000, seed),
            Case(f"correct:ddp_dgauss/seed{seed}", "ddp_dgauss", None, 1000, seed),
            Case(f"correct:central/seed{seed}", "central", None, 1000, seed),
            Case(f"correct:ddp_skellam_poisson/seed{seed}", "ddp_skellam", None, 300, seed, background_clients=3,
                 sampling_rate=0.5, rounds=4),
            Case(f"correct:central_poisson/seed{seed}", "central", None, 300, seed, background_clients=3,
                 sampling_rate=0.5, rounds=4),
            Case(f"correct:ddp_skellam_pool/seed{seed}", "ddp_skellam", None, 100, seed, canaries_per_trial=16,
                 inclusion=0.5, held_out_per_trial=64, orthogonal=True, expected_clients=20),
        ]
    return cases


def _cost(case: Case) -> float:
    """Rough cost of a case: encodes per trial times trials."""
    members = case.background_clients + case.canaries_per_trial * case.inclusion
    return case.trials * case.rounds * (members * case.sampling_rate + 0.3)


def run_case(case: Case, *, delta: float = SELFTEST_DELTA) -> CaseResult:
    """Audit one case (inside its fault's patch, if any)."""
    from dp.audit.federated import CanaryDesign, Cohorts, audit
    from dp.audit.mechanisms import make_mechanism

    extra = {"noise_seed": case.noise_seed} if case.noise_seed is not None else {}
    mechanism = make_mechanism(case.mechanism, dim=SELFTEST_DIM, noise_multiplier=SELFTEST_NOISE_MULTIPLIER,
                               min_clients=case.min_clients, expected_clients=case.expected_clients, **extra)
    design = CanaryDesign(trials=case.trials, canaries_per_trial=case.canaries_per_trial, inclusion=case.inclusion,
                          held_out_per_trial=case.held_out_per_trial, canary_norm=case.canary_norm,
                          orthogonal=case.orthogonal, seed=case.seed)
    cohorts = Cohorts(background_clients=case.background_clients, sampling_rate=case.sampling_rate, rounds=case.rounds)
    patch = FAULTS[case.fault].patch() if case.fault else contextlib.nullcontext()
    with patch:
        result = audit(mechanism, design=design, cohorts=cohorts, delta=delta)
    return CaseResult(case.name, case.mechanism, case.fault, result.claimed_epsilon, result.epsilon_lower_bound,
                      result.empirical_epsilon, result.one_run_lower_bound, result.max_lower_bound, result.flagged,
                      result.canaries, result.seconds)


def run_selftest(*, cases: Sequence[Case] | None = None, jobs: int | None = None, delta: float = SELFTEST_DELTA,
                 progress: bool = True) -> SelfTestReport:
    """Run the suite (`jobs` worker processes; default: up to 2 of this machine's CPUs)."""
    t0 = time.perf_counter()
    cases = list(cases or default_cases())
    jobs = jobs or max(1, min(2, os.cpu_count() or 1))
    results: list[CaseResult] = []
    if jobs == 1:
        for case in cases:
            results.append(run_case(case, delta=delta))
            if progress:
                print(results[-1].line(), flush=True)
    else:  # the longest cases first, so that the workers finish together
        order = sorted(range(len(cases)), key=lambda i: -_cost(cases[i]))
        done: dict[int, CaseResult] = {}
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(functools.partial(run_case, delta=delta), cases[i]): i for i in order}
            for future in as_completed(futures):
                done[futures[future]] = future.result()
                if progress:
                    print(done[futures[future]].line(), flush=True)
        results = [done[i] for i in range(len(cases))]
    faults = [r for r in results if r.fault]
    correct = [r for r in results if not r.fault]
    return SelfTestReport(faults=len(faults), flagged=sum(r.flagged for r in faults), correct_runs=len(correct),
                          false_alarms=sum(r.flagged for r in correct), cases=tuple(results),
                          seconds=time.perf_counter() - t0)


__all__ = ["SELFTEST_DELTA", "SELFTEST_NOISE_MULTIPLIER", "SELFTEST_DIM", "FAULT_TRIALS", "Case", "CaseResult",
           "SelfTestReport", "default_cases", "run_case", "run_selftest"]
