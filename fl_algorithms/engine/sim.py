"""Simulation driver: the round engine with every party in this process.

Each round: sample a cohort, let the `RoundMachine` plan it, hand each client endpoint only its own
broadcast, run each secure sum with the in-memory protocol driver over the clients' encoded inputs,
update the server state from the AggregateView alone, evaluate every client, checkpoint. The
server role and each client's role are separate objects (`fl_algorithms.engine.roles`).

A run killed at any point resumes from the last completed round with nothing lost: checkpoints
are written atomically in the project's one format (`fl_algorithms.experiments.checkpoint`,
safetensors + JSON, no pickle) and hold the server state, relays, client endpoints, the sampler's
RNG, the history and the ledger.
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from fl_algorithms.api import Algorithm
from fl_algorithms.engine.roles import ClientRole, ServerRole
from fl_algorithms.engine.round import (ClientEndpoint, RelayQueue, RoundMachine, RoundRecord, record_empty_round,  # noqa: F401
                                        transport_round)
from fl_algorithms.engine.secure_sum import SecureAggregationConfig, SecureAggregator
from dp.sampling import SamplingRecord, make_sampler

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunConfig:
    rounds: int = 10
    clients_per_round: int | None = None
    """Cohort size; None means every client every round."""
    seed: int = 0
    """Seeds the 'seeded' cohort sampler and simulated dropouts (not any cryptographic randomness)."""
    sampler: str = "poisson"
    """How cohorts are drawn (`dp.sampling`): 'poisson' (the default: each client with probability
    clients_per_round / population, from the OS CSPRNG, so the cohort size varies and nobody can
    replay the cohorts from the config; the only sampler that justifies an outsider's amplified
    epsilon), 'fixed_size' (OS CSPRNG: the without-replacement bound, replace-one, for central DP's
    Gaussian against outsiders; no amplification for distributed DP), 'seeded' (reproducible from
    `seed`: a public schedule anyone who knows the config can predict, for runs compared cohort for
    cohort, a simulation with its deployment or a secure run with its plaintext twin; it backs no
    amplification, so a DP config claiming some is refused, here and by the ledger). Ignored when
    clients_per_round is None (everyone)."""
    dropout: float = 0.0
    """Simulated probability that a sampled client drops at the masked-input stage (simulation only)."""
    eval_split: str = "test"
    curve_split: str | None = None
    """When set (e.g. 'validation'), every round is evaluated on this split, its metrics named with the
    split as prefix ('validation_accuracy'), and `eval_split` only in the last round: a learning curve
    that costs little when the test sets are large. None: `eval_split` every round."""
    secure: SecureAggregationConfig = field(default_factory=SecureAggregationConfig)
    checkpoint_dir: str | None = None
    backend: str = "memory"
    """'memory': every client in this process, one after another; 'ray': clients as Ray actors over the
    cores of this machine or a Ray cluster (`fl_algorithms.engine.ray_backend`), same results per seed.
    With 'ray' the clients' trainers and states live in the actors: read them through
    `SimulationRunner.clients` (handles), not `SimulationRunner.trainers` (the driver's initial copies)."""
    ray_address: str | None = None
    """With backend 'ray': a running cluster's address ('auto', 'ray://host:10001'); None starts one here."""
    ray_workers: int | None = None
    """With backend 'ray': actors the clients are sharded over (default: one per available CPU)."""
    max_participations: int | None = None
    """Each client takes part in at most this many rounds: one drawn after that many is left out of the
    cohort (after the sampler has drawn, so nobody else's inclusion rate changes; `RoundRecord.capped`).
    Noise calibrated against the server may then be sized for this many participations instead of every
    round (a high cap rarely binds: at rate 0.1 over 20 rounds, 7 or more draws has probability 0.24%).
    Against a server that ignores it the cap is the clients' to keep; here the simulated clients keep it,
    and a deployment refuses it (its clients do not count yet). Counted in cohorts drawn, so a client's
    contributions, which the ledger charges, never exceed it."""
    plain_twin: bool = False
    """Also sum every secure sum's inputs with the plaintext protocol (same ring vectors of the same
    contributors) and record in `RoundRecord.plain_twin` whether the two sums agree bit for bit: the
    secure-vs-plaintext comparison without a second training run. Simulation only (a deployed server
    never holds the inputs); the check costs one plaintext sum per secure sum."""

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ValueError("rounds must be at least 1")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError("dropout must be in [0, 1)")
        if self.clients_per_round is not None and self.clients_per_round < 1:
            raise ValueError("clients_per_round must be at least 1 (or None for everyone)")
        if self.curve_split is not None and self.curve_split == self.eval_split:
            raise ValueError(f"curve_split must differ from eval_split ({self.eval_split!r}); None evaluates it every round")
        if self.sampler not in ("seeded", "poisson", "fixed_size"):
            raise ValueError(f"sampler is 'seeded', 'poisson' or 'fixed_size', got {self.sampler!r}")
        if self.backend not in ("memory", "ray"):
            raise ValueError(f"backend is 'memory' or 'ray', got {self.backend!r}")
        if self.ray_workers is not None and self.ray_workers < 1:
            raise ValueError("ray_workers must be at least 1")
        if self.max_participations is not None and self.max_participations < 1:
            raise ValueError("max_participations must be at least 1 (or None: no cap)")
        ddp = self.secure.distributed_dp
        if (self.max_participations is not None and ddp is not None and ddp.target_observer == "server"
                and ddp.rounds < min(self.max_participations, self.rounds)):
            raise ValueError(f"distributed DP is calibrated for {ddp.rounds} participations against the server, "
                             f"fewer than the cap of {self.max_participations} allows")
        if self.plain_twin and self.secure.protocol == "plain":
            raise ValueError("plain_twin compares a secure protocol with the plaintext one: the run already "
                             "sums in plaintext")
        self._check_amplification()

    def _check_amplification(self) -> None:
        """Refuse, before any training, a DP config that claims amplification this sampler cannot give
        (the ledger would refuse the first release: `dp.sampling`)."""
        wanted = claimed_sampler(self)
        if wanted is None:
            return
        size = getattr(self.secure.central_dp or self.secure.distributed_dp, "sample_size", None)
        if self.sampler != wanted or (wanted == "fixed_size" and self.clients_per_round != size):
            raise ValueError(f"the DP config claims amplification by the '{wanted}' sampler"
                             + (f" of {size} clients" if wanted == "fixed_size" else "")
                             + f", but the run samples '{self.sampler}' cohorts of {self.clients_per_round}: "
                             "configure the same sampler, or account at sampling_rate=1")


def claimed_sampler(config: RunConfig) -> str | None:
    """The sampler whose amplification the run's DP accounting relies on ('poisson' or 'fixed_size'), or
    None when it claims none (no DP, or accounted at sampling_rate 1)."""
    dp_config = config.secure.central_dp or config.secure.distributed_dp
    if dp_config is None or dp_config.sampling_rate >= 1:
        return None
    return getattr(dp_config, "sampler", "poisson")


def describe_cohorts(config: RunConfig) -> dict[str, Any]:
    """How the run draws its cohorts, for `config.toml`: the sampler, whether its schedule is public
    (predictable from the config: 'seeded') and the amplification the DP accounting claims ('none'
    or the sampler it relies on). A public schedule never backs a claim (`RunConfig` refuses it)."""
    everyone = config.clients_per_round is None
    sampler = "everyone" if everyone else config.sampler
    source = {"everyone": "every client, every round", "seeded": "public: numpy seeded from the run's seed",
              "poisson": "OS CSPRNG", "fixed_size": "OS CSPRNG"}[sampler]
    return {"sampler": sampler, "clients_per_round": config.clients_per_round, "schedule": source,
            "public": sampler in ("seeded", "everyone"), "amplification": claimed_sampler(config) or "none"}


def sample_cohort(rng: np.random.Generator, clients: Iterable[int], size: int | None) -> list[int]:
    """A uniformly random cohort of `size` clients (all of them if size is None or too large)."""
    ids = sorted(clients)
    if size is None or size >= len(ids):
        return ids
    return sorted(int(c) for c in rng.choice(ids, size=size, replace=False))


def draw_cohort(config: RunConfig, rng: np.random.Generator, clients: Iterable[int]) -> tuple[list[int], SamplingRecord]:
    """The round's cohort under `config.sampler`, and the record the ledger keeps of how it was drawn.
    The seeded sampler draws from the run's `rng` (so simulation and deployment draw the same cohorts)."""
    ids = sorted(clients)
    if config.sampler == "seeded" or config.clients_per_round is None or config.clients_per_round >= len(ids):
        scheme = "everyone" if config.clients_per_round is None or config.clients_per_round >= len(ids) else "seeded"
        cohort = sample_cohort(rng, ids, config.clients_per_round)
        return cohort, SamplingRecord(scheme, len(ids), len(cohort) / len(ids) if scheme == "seeded" else 1.0)
    sampler = make_sampler(config.sampler, cohort=config.clients_per_round, population=len(ids))
    return sampler.sample(ids), sampler.record(len(ids))


class SimulationRunner:
    def __init__(self, *, algorithm: Algorithm, trainers: Mapping[int, Any], config: RunConfig,
                 initial: Mapping[str, np.ndarray] | None = None,
                 on_round: Callable[[RoundRecord], None] | None = None, ledger=None, transcript=None) -> None:
        if not trainers:
            raise ValueError("no clients")
        if any(c <= 0 for c in trainers):
            raise ValueError("client ids must be positive")
        self.algorithm, self.config, self.ledger = algorithm, config, ledger
        self.trainers = dict(trainers)
        self.aggregator = SecureAggregator(config.secure, ledger=ledger, transcript=transcript)
        self.server = ServerRole(algorithm)
        self.clients = {c: ClientEndpoint(client_id=c, role=ClientRole(algorithm), trainer=t,
                                          aggregator=SecureAggregator(config.secure, client_side=True), eval_split=config.eval_split,
                                          curve_split=config.curve_split, rounds=config.rounds)
                        for c, t in self.trainers.items()}
        first = next(iter(self.trainers.values()))
        self.initial = dict(initial) if initial is not None else first.get_shared()
        self._ray = None
        if config.backend == "ray":   # the endpoints move into Ray actors; self.clients become handles on them
            import torch

            from fl_algorithms.engine.ray_backend import RayClients

            self._ray = RayClients(self.clients, address=config.ray_address, workers=config.ray_workers,
                                   threads=torch.get_num_threads())
            self.clients = self._ray.endpoints
        self.on_round = on_round
        self.state = self.server.init_state(initial=self.initial)
        self.relays = RelayQueue()
        self.history: list[RoundRecord] = []
        self.rng = np.random.default_rng(config.seed)
        self.last_view = None

    # ---- checkpoints --------------------------------------------------------------------------
    @property
    def _ckpt(self) -> Path | None:
        return Path(self.config.checkpoint_dir) if self.config.checkpoint_dir else None

    def state_dict(self) -> dict[str, Any]:
        return {"server": self.state, "relays": self.relays.state_dict(),
                "clients": {c: e.state_dict() for c, e in self.clients.items()},
                "rng": self.rng.bit_generator.state, "history": [asdict(r) for r in self.history],
                "ledger": self.ledger.state_dict() if self.ledger is not None else None,
                "secure": self.aggregator.state_dict()}

    def load_state_dict(self, blob: Mapping[str, Any]) -> None:
        self.state = blob["server"]
        self.relays.load_state_dict(blob["relays"])
        for c, st in blob["clients"].items():
            self.clients[int(c)].load_state_dict(st)
        self.rng.bit_generator.state = blob["rng"]
        self.history = [RoundRecord.from_json(r) for r in blob["history"]]
        if self.ledger is not None and blob.get("ledger") is not None:
            self.ledger.load_state_dict(blob["ledger"])
        if blob.get("secure") is not None:
            self.aggregator.load_state_dict(blob["secure"])

    def save(self) -> None:
        """Write the whole run state atomically: a crash leaves the previous checkpoint intact."""
        root = self._ckpt
        if root is None:
            return
        from fl_algorithms.experiments.checkpoint import save_state

        save_state(root / "latest", self.state_dict())
        if self.ledger is not None:
            self.ledger.write(root / "ledger.json")

    def load(self) -> bool:
        """Restore from the last checkpoint, if any. Returns whether one was found."""
        root = self._ckpt
        if root is None:
            return False
        from fl_algorithms.experiments.checkpoint import checkpoint_exists, load_state

        if not checkpoint_exists(root / "latest"):
            return False
        self.load_state_dict(load_state(root / "latest"))
        return True

    # ---- rounds -------------------------------------------------------------------------------
    def sample(self) -> tuple[list[int], SamplingRecord]:
        return draw_cohort(self.config, self.rng, self.trainers)

    def within_cap(self, cohort: list[int]) -> tuple[list[int], list[int]]:
        """(those of `cohort` below `max_participations` cohorts so far, those the cap leaves out)."""
        cap = self.config.max_participations
        if cap is None:
            return cohort, []
        drawn = Counter(c for rec in self.history for c in rec.cohort)
        return [c for c in cohort if drawn[c] < cap], [c for c in cohort if drawn[c] >= cap]

    def run_round(self, t: int) -> RoundRecord:
        t0 = time.perf_counter()
        cohort, sampling = self.sample()
        cohort, capped = self.within_cap(cohort)
        if not cohort:  # Poisson sampling drew nobody: nothing is sent or released (recorded for dp.sampling)
            record_empty_round(self.aggregator, round=t, population=sorted(self.trainers), sampling=sampling)
            metrics = self._evaluate_all({c: self.server.client_parameters(state=self.state, client_id=c)
                                          for c in sorted(self.clients)}, round=t)
            return RoundRecord(round=t, cohort=[], contributors=[], metrics=metrics, seconds=time.perf_counter() - t0,
                               secure_seconds=0.0, bytes_uploaded={}, clipped=0, sums={}, failed={}, capped=capped)
        machine = RoundMachine(server=self.server, state=self.state, round=t, cohort=cohort,
                               population=sorted(self.trainers), aggregator=self.aggregator, relays=self.relays,
                               sampling=sampling)
        inputs, client_metrics = {}, {}
        broadcasts = machine.start()
        answers = self._broadcast_all(broadcasts)
        for c in broadcasts:
            ready, inputs[c] = answers[c]
            client_metrics[c] = dict(ready.metrics)
            machine.on_ready(c, ready)
        # Drawn only when dropouts are simulated, so the cohort stream matches a deployment's.
        drops = {c for c in cohort if self.rng.random() < self.config.dropout} if self.config.dropout > 0 else set()
        sent: dict[int, int] = {}
        clipped = 0
        twin: dict[str, bool] = {}
        for job in machine.sum_jobs():
            s0 = time.perf_counter()
            vectors = {c: inputs[c][job.name].vector for c in job.members}
            clipped += sum(inputs[c][job.name].clipped for c in job.members)
            try:
                layers = {c: inputs[c][job.name].noise_layers for c in job.members} \
                    if self.aggregator.exact_noise else None
                result = self.aggregator.run_sum(round_id=job.round_id, inputs=vectors, length=job.length,
                                                 protocol_params=job.protocol_params,
                                                 drop_at={"masked": drops & set(job.members)} if drops else None,
                                                 bytes_sent=sent, noise_layers=layers, sized_for=job.sized_for)
            except Exception as exc:  # an aborted sum (too few survivors) fails that sum only
                machine.on_sum(job.name, error=f"{type(exc).__name__}: {exc}", seconds=time.perf_counter() - s0)
                continue
            seconds = time.perf_counter() - s0  # the check below is not the secure sum's cost
            if self.config.plain_twin:  # before decoding, which may work on the ring sum in place
                plain = self.aggregator.plain_sum(round_id=job.round_id, length=job.length,
                                                  inputs={c: vectors[c] for c in sorted(result.contributors)})
                twin[job.name] = bool(np.array_equal(plain, result.ring_sum))
            self.aggregator.record_individuals(t, {c: inputs[c][job.name] for c in job.members}, result.contributors)
            machine.on_sum(job.name, result=result, seconds=seconds)
        self.state, view = machine.finish()
        self.last_view = view
        if self.aggregator.transcript is not None and machine.jobs:
            self.aggregator.transcript.record_view(view, cohort=cohort)
        evaluated = self._evaluate_all({c: machine.evaluation_parameters(c) for c in sorted(self.clients)}, round=t)
        metrics = {c: {**client_metrics.get(c, {}), **evaluated[c]} for c in sorted(self.clients)}
        return RoundRecord(round=t, cohort=cohort, contributors=sorted(view.contributors), metrics=metrics,
                           seconds=time.perf_counter() - t0, secure_seconds=machine.secure_seconds,
                           bytes_uploaded=sent, clipped=clipped,
                           sums={k: sorted(v) for k, v in view.sum_contributors.items()}, failed=dict(view.failed),
                           plain_twin=twin, capped=capped)

    def _broadcast_all(self, broadcasts: Mapping[int, Any]) -> dict[int, tuple[Any, Any]]:
        """Every addressed client's (ClientReady, encoded inputs): in parallel on Ray, else one by one."""
        if self._ray is not None:
            return self._ray.broadcast_all(broadcasts)
        return {c: self.clients[c].on_broadcast(b)[:2] for c, b in broadcasts.items()}

    def _evaluate_all(self, parameters: Mapping[int, Mapping[str, np.ndarray]], *, round: int) -> dict[int, dict[str, float]]:
        if self._ray is not None:
            return self._ray.evaluate_all(parameters, round=round)
        return {c: self.clients[c].on_evaluate(p, round=round) for c, p in parameters.items()}

    def close(self) -> None:
        """Stop the Ray actors (a no-op in memory)."""
        if self._ray is not None:
            self._ray.shutdown()
            self._ray = None

    def evaluate_client(self, c: int) -> dict[str, float]:
        """Client-side evaluation of the model the client would use (global parts + its own)."""
        params = self.server.client_parameters(state=self.state, client_id=c)
        return self.clients[c].on_evaluate(params, round=len(self.history))

    def run(self, *, resume: bool = False, progress: bool = True, desc: str = "rounds",
            metric: str = "accuracy") -> list[RoundRecord]:
        """Run the remaining rounds; the progress bar (`progress`, and only when stderr is a terminal: a
        redirected log gets no carriage returns) shows the clients' mean `metric` after each, on the
        curve split in rounds before the last when the run has one."""
        if resume:
            self.load()
        start = len(self.history) + 1
        bar = tqdm(range(start, self.config.rounds + 1), desc=desc, disable=None if progress else True, leave=False)
        try:
            for t in bar:
                rec = self.run_round(t)
                self.history.append(rec)
                self.save()
                # with a curve split, rounds before the last evaluate only that split
                split = self.config.curve_split
                score = metric if split is None or t == self.config.rounds or metric.startswith(f"{split}_") \
                    else f"{split}_{metric}"
                bar.set_postfix({score: f"{rec.mean(score):.3f}"})
                if self.on_round is not None:
                    self.on_round(rec)
        finally:  # an interrupted run leaves no half-drawn bar behind its message
            bar.close()
        return self.history
