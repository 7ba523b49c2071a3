"""One federated round as a sans-IO state machine, and the client endpoint that answers it.

Both runtimes drive the same two objects; only how messages move differs (in memory, or ZeroMQ
processes over tcp). A round, server side (`RoundMachine`):

    start()          the plan: one ClientBroadcast per cohort member (its own public parts and
                     the Sealed messages relayed to it), and the secure sums it is a member of
    on_ready(i, r)   client i's answer: the layout of each sum it joins, its own DP releases
                     (admitted here under the algorithm's declared mechanism, charged to the
                     server's ledger), Sealed messages for peers, client-local metrics
    sum_jobs()       closes collection: one job per secure sum (members that answered with the
                     sum's majority layout; a group below its minimum size is skipped, never run)
    on_sum(name, …)  the protocol's ring sum (or why it failed)
    finish()         decode every sum (Released + ledger under distributed DP), build the
                     AggregateView, server_update; Sealed messages queue for their receivers.
                     A round whose every sum failed or was skipped (e.g. a Poisson cohort below
                     the release floor) releases nothing and leaves the server state as it was;
                     under amplified DP it is recorded for the boundary delta (`dp.sampling`)

Client side (`ClientEndpoint`): `on_broadcast` runs the algorithm's client role, encodes its
Masked parts for each sum and turns its Released parts into plain records (its own ledger keeps
its receipts); `on_evaluate` evaluates the parameters the server names for it.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dp.sampling import SamplingRecord
from fl_algorithms.api import (DEFAULT_SUM, MAX_SUMS_PER_ROUND, ClientBroadcast, ClientContext, Relayed, RoundPlan, Sealed,
                               SumSpec, Upload)
from fl_algorithms.engine.roles import ClientRole, ServerRole
from fl_algorithms.engine.secure_sum import EncodedInput, Layout, SecureAggregator, build_view

from dp.admission import admit
from dp.ledger import Ledger
from dp.released import Released, ReleaseRecord

log = logging.getLogger(__name__)

ROUND_STRIDE = 64
"""Transport round ids of FL round t: t*64 (broadcast/ready), t*64 + 1 + j (sum j), t*64 + 63 (evaluation)."""
EVAL_SLOT = ROUND_STRIDE - 1
MAX_SEALED_PER_CLIENT = 64
"""Most Sealed messages one client may send in one round."""
MAX_RELEASES_PER_CLIENT = 16
"""Most per-client DP releases one client may send in one round."""
MAX_RELAY_QUEUE = 256
"""Most relayed messages held for one receiver; older ones are dropped (and logged) beyond it."""


def transport_round(t: int, slot: int) -> int:
    return t * ROUND_STRIDE + slot


def record_empty_round(aggregator: SecureAggregator, *, round: int, population: Sequence[int],
                       sampling: SamplingRecord | None) -> None:
    """A Poisson draw with nobody in it: nothing is sent or released, but under amplified DP the round
    counts towards the boundary delta of `dp.sampling` (one sum over the cohort, the default one)."""
    if sampling is not None and aggregator.amplification_rate < 1:
        aggregator.record_skip(round=round, sum_name=DEFAULT_SUM, population=population,
                               sampling=sampling.with_floor(aggregator.config.survivor_floor()[0]))


@dataclass(frozen=True)
class ClientReady:
    """A client's answer to its broadcast: everything except its masked inputs."""

    layouts: Mapping[str, Layout]
    released: Mapping[str, ReleaseRecord] = field(default_factory=dict)
    """The client's own DP releases as plain records; the server admits them (`dp.admission`)."""
    sealed: tuple[Sealed, ...] = ()
    metrics: Mapping[str, float] = field(default_factory=dict)
    clipped: Mapping[str, int] = field(default_factory=dict)
    """Per sum, how many of this client's coordinates the fixed-point range clipped (reported, not secret:
    a count, as the simulation reports it)."""


@dataclass(frozen=True)
class SumJob:
    """One secure sum to run: who, how long the vectors are, and under which transport round id."""

    name: str
    round_id: int
    members: tuple[int, ...]
    layout: Layout
    length: int
    protocol_params: Mapping[str, object]
    sized_for: int | None = None
    """Members the broadcast announced for this sum (`ClientBroadcast.sum_sizes`): what sized the clients'
    exact-noise layers, so the server sizes them alike, however many of them answer."""


@dataclass
class RoundRecord:
    round: int
    cohort: list[int]
    contributors: list[int]
    metrics: dict[int, dict[str, float]]
    seconds: float
    secure_seconds: float
    bytes_uploaded: dict[int, int]
    clipped: int
    sums: dict[str, list[int]] = field(default_factory=dict)
    """Contributors of each secure sum."""
    failed: dict[str, str] = field(default_factory=dict)
    """Secure sums that did not finish, with the reason."""
    plain_twin: dict[str, bool] = field(default_factory=dict)
    """With `RunConfig.plain_twin`: per finished secure sum, whether the plaintext protocol's sum of the
    same inputs equalled it bit for bit (empty when not checked)."""
    capped: list[int] = field(default_factory=list)
    """Clients the sampler drew whom `RunConfig.max_participations` left out of the cohort."""

    def mean(self, key: str) -> float:
        vals = [m[key] for m in self.metrics.values() if key in m]
        return float(np.mean(vals)) if vals else float("nan")

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> "RoundRecord":
        """Inverse of dataclasses.asdict after a JSON round trip (client ids come back as strings)."""
        return cls(**{**raw, "metrics": {int(k): v for k, v in raw["metrics"].items()},
                      "bytes_uploaded": {int(k): v for k, v in raw["bytes_uploaded"].items()}})


class RelayQueue:
    """Sealed messages the server holds until their receiver's next broadcast (server state)."""

    def __init__(self) -> None:
        self.pending: dict[int, list[Relayed]] = {}

    def put(self, *, sender: int, round: int, sealed: Sealed) -> None:
        queue = self.pending.setdefault(sealed.receiver, [])
        queue.append(Relayed(sender=sender, round=round, ciphertext=sealed.ciphertext))
        if len(queue) > MAX_RELAY_QUEUE:
            log.warning("relay queue of client %d is full: dropping its oldest message", sealed.receiver)
            del queue[0]

    def take(self, receiver: int) -> tuple[Relayed, ...]:
        return tuple(self.pending.pop(receiver, ()))

    def state_dict(self) -> dict[str, Any]:
        return {"pending": {c: [[r.sender, r.round, r.ciphertext] for r in q] for c, q in self.pending.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.pending = {int(c): [Relayed(sender=int(s), round=int(t), ciphertext=bytes(b)) for s, t, b in q]
                        for c, q in state["pending"].items()}


class RoundMachine:
    """The server side of one round, sans IO. Drivers call its methods in the order of the module doc."""

    def __init__(self, *, server: ServerRole, state: Any, round: int, cohort: Sequence[int], population: Sequence[int],
                 aggregator: SecureAggregator, relays: RelayQueue, sampling: SamplingRecord | None = None) -> None:
        """`sampling`: how the cohort was drawn, for the ledger (the basis of any amplification by sampling)."""
        if not cohort:
            raise ValueError("a round needs a non-empty cohort")
        self.server, self.state, self.round = server, state, round
        self.cohort, self.population = sorted(cohort), sorted(population)
        self.aggregator, self.relays = aggregator, relays
        self.plan: RoundPlan = server.plan(round=round, state=state, cohort=self.cohort)
        self.specs: tuple[SumSpec, ...] = self.plan.sums_for(self.cohort)
        if len(self.specs) > MAX_SUMS_PER_ROUND:
            raise ValueError(f"at most {MAX_SUMS_PER_ROUND} secure sums per round")
        self.sizes: dict[str, int] = {s.name: len(s.members & set(self.cohort)) for s in self.specs}
        """How many of the cohort are members of each sum: announced in each member's broadcast (it sizes
        the clients' exact-noise layers) and kept in its SumJob."""
        for n in self.sizes.values():  # before any client encodes: refuse a sum the encoding cannot add without wrap
            if n:
                self.aggregator.check_members(n)
        self.sampling = self._floored(sampling)
        self.ready: dict[int, ClientReady] = {}
        self.admitted: dict[int, dict[str, Released]] = {}
        self.jobs: dict[str, SumJob] = {}
        self.results: dict[str, Any] = {}
        self.failed: dict[str, str] = {}
        self.stage = "new"
        self.secure_seconds = 0.0
        self.skipped = False
        """True once finish() found that no sum released anything (the state was left as it was)."""

    def _floored(self, sampling: SamplingRecord | None) -> SamplingRecord | None:
        """The sampling record with the round's release floor, refusing amplified accounting that the
        boundary argument of `dp.sampling` does not cover (it is stated for one sum over the cohort)."""
        floor = self.aggregator.config.survivor_floor()[0]
        if sampling is None or self.aggregator.amplification_rate >= 1:
            return sampling
        if len(self.specs) != 1 or not set(self.cohort) <= self.specs[0].members or self.specs[0].min_size > floor:
            raise ValueError("DP amplified by Poisson sampling is accounted for one secure sum over the whole cohort "
                             f"(the boundary delta of dp.sampling); this round plans {[s.name for s in self.specs]}")
        return sampling.with_floor(floor)

    # ---- broadcast -----------------------------------------------------------------------------
    def sums_of(self, client_id: int) -> dict[str, tuple[int, tuple[str, ...] | None]]:
        """The sums client `client_id` is a member of: name -> (transport round id, parts)."""
        return {s.name: (transport_round(self.round, 1 + j), s.parts)
                for j, s in enumerate(self.specs) if client_id in s.members}

    def start(self) -> dict[int, ClientBroadcast]:
        if self.stage != "new":
            raise RuntimeError("start() runs once")
        self.stage = "collect"
        out = {}
        for c in self.cohort:
            sums = self.sums_of(c)
            out[c] = self.plan.broadcast.for_client(c, round=self.round, inbox=self.relays.take(c),
                                                    sums={n: p for n, (_, p) in sums.items()},
                                                    sum_sizes={n: self.sizes[n] for n in sums})
        return out

    def on_ready(self, client_id: int, ready: ClientReady) -> None:
        """Accept one client's answer; a malformed one leaves that client out of the round."""
        if self.stage != "collect":
            raise RuntimeError("ready answers are accepted only while collecting")
        if client_id not in self.cohort or client_id in self.ready:
            raise ValueError(f"client {client_id} is not expected (or answered twice)")
        expected = set(self.sums_of(client_id))
        if set(ready.layouts) != expected:
            raise ValueError(f"client {client_id} answered for sums {sorted(ready.layouts)}, expected {sorted(expected)}")
        if len(ready.sealed) > MAX_SEALED_PER_CLIENT:
            raise ValueError(f"client {client_id} sent {len(ready.sealed)} sealed messages (limit {MAX_SEALED_PER_CLIENT})")
        for s in ready.sealed:
            if s.receiver not in self.population or s.receiver == client_id:
                raise ValueError(f"client {client_id} sealed a message for unknown client {s.receiver}")
        self.admitted[client_id] = self._admit(client_id, ready.released)
        self.ready[client_id] = ready

    def _admit(self, client_id: int, records: Mapping[str, ReleaseRecord]) -> dict[str, Released]:
        """The client's releases, admitted under the algorithm's declared mechanisms and charged to
        the server's ledger; ValueError (nothing charged or used) leaves the client out whole."""
        if not records:
            return {}
        if len(records) > MAX_RELEASES_PER_CLIENT:
            raise ValueError(f"client {client_id} sent {len(records)} releases (limit {MAX_RELEASES_PER_CLIENT})")
        if self.aggregator.ledger is None:
            raise ValueError("per-client releases need a privacy ledger on the server (run with a ledger)")
        return admit(records, specs=self.server.releases, client_id=client_id, round_id=self.round,
                     ledger=self.aggregator.ledger)

    # ---- secure sums -----------------------------------------------------------------------------
    def sum_jobs(self) -> list[SumJob]:
        if self.stage != "collect":
            raise RuntimeError("sum_jobs() runs once, after collection")
        self.stage = "sums"
        for j, spec in enumerate(self.specs):
            ready = [c for c in self.cohort if c in spec.members and c in self.ready]
            layouts = [self.ready[c].layouts[spec.name] for c in ready]
            if not layouts:
                self.failed[spec.name] = "no member answered"
                continue
            layout = max(set(layouts), key=layouts.count)
            if not layout.parts:
                continue  # nothing masked in this sum (e.g. Local)
            members = tuple(c for c, lay in zip(ready, layouts) if lay == layout)
            odd = sorted(set(ready) - set(members))
            if odd:
                log.warning("round %d, sum '%s': clients %s sent another layout; left out", self.round, spec.name, odd)
            if len(members) < spec.min_size:
                self.failed[spec.name] = f"{len(members)} members ready, minimum {spec.min_size}"
                continue
            self.jobs[spec.name] = SumJob(name=spec.name, round_id=transport_round(self.round, 1 + j), members=members,
                                          layout=layout, length=self.aggregator.input_length(layout),
                                          protocol_params=dict(spec.protocol_params), sized_for=self.sizes[spec.name])
        return list(self.jobs.values())

    def on_sum(self, name: str, *, result: Any = None, error: str | None = None, seconds: float = 0.0) -> None:
        if self.stage != "sums" or name not in self.jobs or name in self.results or name in self.failed:
            raise RuntimeError(f"unexpected result for sum '{name}'")
        self.secure_seconds += seconds
        if error is not None:
            self.failed[name] = error
        else:
            self.results[name] = result

    # ---- update ----------------------------------------------------------------------------------
    def finish(self) -> tuple[Any, Any]:
        """Decode, update the server state, queue relays. Returns (new state, the AggregateView)."""
        if self.stage != "sums" or set(self.jobs) - set(self.results) - set(self.failed):
            raise RuntimeError("finish() needs every sum job answered")
        self.stage = "done"
        t0 = time.perf_counter()
        sums, contributors_of, released = {}, {}, {}
        for name, job in self.jobs.items():
            if name not in self.results:
                continue
            result = self.results[name]
            try:
                groups, rel = self.aggregator.server_decode(result.ring_sum, layout=job.layout,
                                                            contributors=result.contributors, round=self.round,
                                                            sum_name=name, population=self.population,
                                                            sampling=self.sampling,
                                                            layer_index=getattr(result, "layer_index", -1),
                                                            layer_secrets=getattr(result, "layer_secrets", None),
                                                            layer_excess=getattr(result, "layer_excess", None),
                                                            members=job.sized_for)
            except Exception as exc:  # e.g. too few survivors for the DP noise: this sum only
                self.failed[name] = f"{type(exc).__name__}: {exc}"
                continue
            sums[name] = groups
            contributors_of[name] = frozenset(result.contributors)
            if rel is not None:
                released["model-update" if name == "all" else f"model-update/{name}"] = {0: rel}
        # who the round's result depends on: every sum's contributors (or, with nothing masked, who answered)
        everyone = frozenset().union(*contributors_of.values()) if self.jobs else frozenset(self.ready)
        for part in {n for r in self.admitted.values() for n in r}:
            released[part] = {c: self.admitted[c][part] for c in sorted(everyone) if part in self.admitted.get(c, {})}
        for c in sorted(self.ready):
            for s in self.ready[c].sealed:
                self.relays.put(sender=c, round=self.round, sealed=s)
        view = build_view(round=self.round, released=released, contributors=everyone, sums=sums,
                          sum_contributors=contributors_of, failed=self.failed)
        for name in sorted(self.failed):  # amplified DP: a sum that released nothing still counts (dp.sampling)
            self.aggregator.record_skip(round=self.round, sum_name=name, population=self.population,
                                        sampling=self.sampling)
        if self.jobs:  # decoding is part of the secure sum's cost
            self.secure_seconds += time.perf_counter() - t0
        if self.failed and not sums:
            log.warning("round %d released nothing (%s): the server state is unchanged", self.round, self.failed)
            self.skipped = True
            return self.state, view
        self.state = self.server.server_update(state=self.state, view=view)
        return self.state, view

    def evaluation_parameters(self, client_id: int) -> Mapping[str, np.ndarray]:
        return self.server.client_parameters(state=self.state, client_id=client_id)


class ClientEndpoint:
    """A client, sans IO: its role, trainer and private state; answers broadcasts and evaluations."""

    def __init__(self, *, client_id: int, role: ClientRole, trainer: Any, aggregator: SecureAggregator,
                 eval_split: str = "test", curve_split: str | None = None, rounds: int | None = None) -> None:
        """`curve_split` (with `rounds`): evaluate every round on it (metrics prefixed with its name) and on
        `eval_split` only in round `rounds` (`fl_algorithms.engine.sim.RunConfig.curve_split`)."""
        if client_id <= 0:
            raise ValueError("client ids must be positive")
        self.client_id, self.role, self.trainer = client_id, role, trainer
        if curve_split is not None and rounds is None:
            raise ValueError("a curve split needs the number of rounds (the last one is evaluated on eval_split)")
        self.aggregator, self.eval_split, self.curve_split, self.rounds = aggregator, eval_split, curve_split, rounds
        self.state: dict[str, Any] = {}
        self.ledger = Ledger()
        """This client's own record of what it released (checkpointed with its state)."""

    def context(self, round: int) -> ClientContext:
        return ClientContext(client_id=self.client_id, state=self.state, trainer=self.trainer, round=round,
                             releases=self.role.releases, ledger=self.ledger)

    def on_broadcast(self, broadcast: ClientBroadcast) -> tuple[ClientReady, dict[str, EncodedInput], Upload]:
        """Local update, then this client's input to each of its sums (encoded here, on the client)."""
        upload, new_state = self.role.client_update(broadcast=broadcast, client=self.context(broadcast.round))
        self.state = dict(new_state)
        inputs = {name: self.aggregator.client_encode(upload, parts=parts, round=broadcast.round, sum_name=name,
                                                      client_id=self.client_id, members=broadcast.sum_sizes.get(name))
                  for name, parts in broadcast.sums.items()}
        undeclared = sorted(set(upload.released) - set(self.role.releases))
        if undeclared:
            raise ValueError(f"releases {undeclared} are not declared in {self.role.name}.releases")
        ready = ClientReady(layouts={n: e.layout for n, e in inputs.items()},
                            released={n: r.record() for n, r in upload.released.items()},
                            sealed=tuple(upload.sealed), metrics=dict(upload.metrics),
                            clipped={n: int(e.clipped) for n, e in inputs.items()})
        return ready, inputs, upload

    def on_evaluate(self, parameters: Mapping[str, np.ndarray], *, round: int) -> dict[str, float]:
        def evaluate(split: str) -> dict[str, float]:
            return self.role.evaluate(parameters=parameters, client=self.context(round), split=split)
        if self.curve_split is None:
            return evaluate(self.eval_split)
        metrics = {f"{self.curve_split}_{k}": v for k, v in evaluate(self.curve_split).items()}
        if round >= self.rounds:
            metrics.update(evaluate(self.eval_split))
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"trainer": self.trainer.state_dict(), "state": dict(self.state), "ledger": self.ledger.state_dict()}

    def load_state_dict(self, blob: Mapping[str, Any]) -> None:
        self.trainer.load_state_dict(blob["trainer"])
        self.state = dict(blob["state"])
        if blob.get("ledger") is not None:
            self.ledger.load_state_dict(blob["ledger"])
