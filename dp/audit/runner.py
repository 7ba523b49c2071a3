"""Canary clients as ordinary clients of a `SimulationRunner` run: the audit through the public runner API.

Each trial is one run of the round engine (`fl_algorithms.engine.sim.SimulationRunner`, FedAvg with one
local step) over background clients and the inserted canary clients. A canary client's trainer
returns its canary update (the model it was sent plus `canary_norm` x C along its direction); the
engine samples it, clips and encodes it, secure-sums it and releases it like any client's. The
auditor records only the global model after each round (what an outside observer of the models
sees), takes the round deltas, and scores every canary as in `dp.audit.federated`. The claim is the
run's own ledger: the largest outsider epsilon, at the audit's delta, of any canary client.

Slower than the secure-sum level (the masking protocol runs), so meant for few canaries: it checks
that the engine releases what the secure-sum level audits, not for a high bound.
"""
from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from dp.audit.bounds import DEFAULT_CONFIDENCE, clopper_pearson_bound, gaussian_fit_epsilon, one_run_bound
from dp.audit.canaries import STATISTICS, canary_directions, canary_scores
from dp.audit.federated import THREAT_MODEL, AuditResult, CanaryDesign

PART = "w"
"""The one shared parameter of the audit's model: a flat vector of `dim` values."""


class CanaryTrainer:
    """A client whose local training moves the model by a fixed update (a canary's, or zero)."""

    def __init__(self, update: np.ndarray) -> None:
        self.update = np.asarray(update, dtype=np.float32)
        self.num_examples = 1
        self._params = np.zeros_like(self.update)

    def get_shared(self) -> dict[str, np.ndarray]:
        return {PART: self._params.copy()}

    def set_shared(self, params: Mapping[str, np.ndarray]) -> None:
        self._params = np.asarray(params[PART], dtype=np.float32).copy()

    def train(self, *, epochs: int, proximal: Mapping[str, np.ndarray] | None = None, mu: float = 0.0,
              round: int | None = None) -> dict[str, float]:
        self._params = self._params + self.update
        return {}

    def evaluate(self, *, split: str = "test") -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        return None


class BackgroundTrainer(CanaryTrainer):
    """A client whose update is a fresh random direction of a fixed norm every round (seeded)."""

    def __init__(self, *, dim: int, norm: float, seed: Any) -> None:
        super().__init__(np.zeros(dim))
        self.norm, self.rng = float(norm), np.random.default_rng(seed)

    def train(self, *, epochs: int, proximal: Mapping[str, np.ndarray] | None = None, mu: float = 0.0,
              round: int | None = None) -> dict[str, float]:
        g = self.rng.standard_normal(self._params.shape[0])
        self.update = (self.norm * g / np.linalg.norm(g)).astype(np.float32)
        return super().train(epochs=epochs, round=round)


def run_trial(secure: Any, *, design: CanaryDesign, trial: int, dim: int, rounds: int, background_clients: int,
              clients_per_round: int | None, sampler: str, l2_clip: float, ledger_delta: float,
              background_norm: float = 1.0) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, Any]:
    """One engine run with canaries: (scores per statistic, inserted flags, pool flags, the run's ledger)."""
    from dp.ledger import Ledger, LedgerConfig
    from fl_algorithms.algorithms.fedavg import FedAvg
    from fl_algorithms.engine.sim import RunConfig, SimulationRunner

    rng = np.random.default_rng([design.seed, trial])
    k, h = design.canaries_per_trial, design.held_out_per_trial
    directions = canary_directions(count=k + h, dim=dim, seed=[design.seed, trial, 1],
                                   orthogonal=design.orthogonal and k + h <= dim)
    inserted = np.zeros(k + h, dtype=bool)
    inserted[:k] = rng.random(k) < design.inclusion if design.inclusion < 1 else True
    trainers: dict[int, CanaryTrainer] = {}
    for i, j in enumerate(np.flatnonzero(inserted)):
        trainers[i + 1] = CanaryTrainer(design.canary_norm * l2_clip * directions[j])
    for b in range(background_clients):
        trainers[len(trainers) + 1] = BackgroundTrainer(dim=dim, norm=background_norm * l2_clip,
                                                        seed=[design.seed, trial, 2, b])
    ledger = Ledger(LedgerConfig(delta=ledger_delta))
    config = RunConfig(rounds=rounds, clients_per_round=clients_per_round, seed=trial, sampler=sampler, secure=secure)
    runner = SimulationRunner(algorithm=FedAvg(local_epochs=1), trainers=trainers, config=config,
                              initial={PART: np.zeros(dim, dtype=np.float32)}, ledger=ledger)
    models = [np.zeros(dim)]
    runner.on_round = lambda rec: models.append(
        np.asarray(runner.algorithm.shared_parameters(runner.state)[PART], dtype=np.float64).copy())
    runner.run(progress=False)
    runner.close()
    return canary_scores(directions, np.diff(np.stack(models), axis=0)), inserted, np.arange(k + h) < k, ledger


def audit_run(secure: Any, *, design: CanaryDesign, dim: int, rounds: int = 1, background_clients: int = 1,
              clients_per_round: int | None = None, sampler: str = "poisson", delta: float,
              ledger_delta: float = 1e-5, confidence: float = DEFAULT_CONFIDENCE) -> AuditResult:
    """Audit the secure layer `secure` (a `SecureAggregationConfig`) through `SimulationRunner` runs.

    The claim: the largest outsider epsilon at `delta` that any run's ledger holds for a canary client
    (inf when the configuration adds no noise)."""
    t0 = time.perf_counter()
    dp_config = secure.distributed_dp or secure.central_dp
    l2_clip = float(dp_config.l2_clip) if dp_config is not None else 1.0
    values: dict[str, list[np.ndarray]] = {s: [] for s in STATISTICS}
    flags, pools, trials, claims = [], [], [], []
    for t in range(design.trials):
        scores, inserted, pool, ledger = run_trial(secure, design=design, trial=t, dim=dim, rounds=rounds,
                                                   background_clients=background_clients,
                                                   clients_per_round=clients_per_round, sampler=sampler,
                                                   l2_clip=l2_clip, ledger_delta=ledger_delta)
        for s in STATISTICS:
            values[s].append(scores[s])
        flags.append(inserted), pools.append(pool), trials.append(np.full(inserted.shape, t))
        canary_ids = range(1, int(inserted.sum()) + 1)
        claims.append(math.inf if dp_config is None else
                      max((ledger.epsilon(c, unit="client", observer="outsider", delta=delta) for c in canary_ids),
                          default=0.0))
    arrays = {s: np.concatenate(v) for s, v in values.items()}
    inserted, pool, trial = np.concatenate(flags), np.concatenate(pools), np.concatenate(trials)
    if not inserted.any() or inserted.all():
        raise ValueError("the audit needs inserted and held-out canaries")
    stats_used = STATISTICS if rounds > 1 else ("final",)
    select = (trial < design.trials // 2 if design.trials >= 2 else
              np.random.default_rng([design.seed, 0x5E1EC7]).permutation(inserted.size) < inserted.size // 2)

    def split(mask: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        return {s: (arrays[s][mask & inserted], arrays[s][mask & ~inserted]) for s in stats_used}

    bound = clopper_pearson_bound(selection=split(select), evaluation=split(~select), delta=delta, confidence=confidence)
    fits = {s: gaussian_fit_epsilon(arrays[s][inserted], arrays[s][~inserted], delta=delta) for s in stats_used}
    one_run = None
    if design.inclusion == 0.5:
        one_run = max((one_run_bound(arrays[s][pool], inserted[pool], delta=delta,
                                     confidence=1 - (1 - confidence) / len(stats_used)) for s in stats_used),
                      key=lambda b: b.epsilon)
    name = ("ddp_" + ("skellam" if secure.distributed_dp.mechanism == "skellam" else "dgauss") if secure.distributed_dp
            else "central" if secure.central_dp else "plaintext" if secure.protocol == "plain" else "secagg")
    return AuditResult(mechanism=name, claimed_epsilon=float(max(claims)),
                       empirical_epsilon=max(f.epsilon for f in fits.values()), epsilon_lower_bound=bound.epsilon,
                       one_run_lower_bound=None if one_run is None else one_run.epsilon, max_lower_bound=bound.max_epsilon,
                       delta=delta, confidence=confidence, canaries=int(inserted.size), inserted=int(inserted.sum()),
                       held_out=int((~inserted).sum()), trials=design.trials, rounds=rounds, skipped_rounds=0,
                       bound=bound, fits=fits, one_run=one_run,
                       mechanism_description={"level": "SimulationRunner", "protocol": secure.protocol, "dim": dim},
                       seconds=time.perf_counter() - t0, threat_model=THREAT_MODEL)


__all__ = ["PART", "CanaryTrainer", "BackgroundTrainer", "run_trial", "audit_run"]
