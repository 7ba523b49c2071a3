"""Deployment driver: the round engine with a server process and client processes over ZeroMQ.

The same `RoundMachine` and `ClientEndpoint` as the simulation; only the transport differs. FL
round t uses transport round ids t*64 (train/ready), t*64 + 1 + j (secure sum j) and t*64 + 63
(evaluation); see `fl_algorithms.engine.wire` for the messages:

    server -> each cohort member   fl_train: its own ClientBroadcast and the run's secure config
    client                         checks the config (a mismatch is reported naming both sides),
                                   runs client_update, encodes its inputs, replies fl_ready
    server <-> members of sum j    the secure-sum protocol over their encoded inputs
    server                         decodes (Released + ledger under distributed DP), server_update,
                                   queues Sealed relays, then asks every client to evaluate
                                   (fl_evaluate / fl_evaluated), logs the round, checkpoints

The server never receives an Upload: only layouts, the client's own DP releases (payload and
claimed mechanism, admitted under the algorithm's declared mechanism and charged to the server's
ledger, exactly as in simulation), Sealed ciphertexts for peers, client-reported metrics and
clipped-coordinate counts (scalars, in the clear: diagnostics outside the privacy boundary;
`report_metrics=False` turns both off) and protocol messages.

How a run ends. Before each round the server checks that enough clients are still connected for a
secure sum to be released (`DeployedServer.group_minimum`: the survivor floor, min_release_group or
distributed DP's n_min, plus the colluders); below it the run stops with `TooFewClientsError` after
the last checkpointed round instead of training rounds nothing can come of. After the last round,
rounds whose cohort reached that minimum but released nothing (clients lost mid-round, aborted sums)
raise `NothingReleasedError`, so a command line exits non-zero. Whatever the end, the server tells
every client why (`wire.END`: finished, interrupted, stopped, failed) before the transport's shutdown,
and `client_exit` turns that (or its absence: the server went away) into the client's last words.

The server reads a ready message up to what the run lets a client send (`wire.max_ready_bytes`:
metadata, `DeploymentConfig.max_sealed_bytes` of Sealed, the algorithm's declared releases) and an
evaluation up to `wire.MAX_EVALUATED_BYTES`; bigger ones are dropped before decoding, so a client
costs the server no more memory than the run needs (secure sums are sized by their protocols).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fl_algorithms.engine import wire
from fl_algorithms.engine.roles import ClientRole, ServerRole
from fl_algorithms.engine.round import (EVAL_SLOT, ClientEndpoint, ClientReady, RelayQueue, RoundMachine, RoundRecord,
                                        record_empty_round, transport_round)
from fl_algorithms.engine.secure_sum import SecureAggregator
from fl_algorithms.engine.sim import RunConfig, claimed_sampler, draw_cohort
from fl_algorithms.experiments.task import Task
from secagg.messages import SERVER, AbortError, Message, ProtocolError
from secagg.protocols import registry

log = logging.getLogger(__name__)


class ClientSetupError(RuntimeError):
    """A client cannot take part: its configuration or model differs from the server's."""


class DeploymentStopped(RuntimeError):
    """The deployment cannot release (any more): the run stopped, checkpointed after round `round`."""

    def __init__(self, message: str, *, round: int) -> None:
        super().__init__(message)
        self.round = round


class TooFewClientsError(DeploymentStopped):
    """Fewer clients are connected than a secure sum needs to be released: the next round cannot give anything."""


class NothingReleasedError(DeploymentStopped):
    """Every round ran, but some whose cohort reached the group minimum released nothing."""


@dataclass(frozen=True)
class DeploymentConfig:
    broadcast_timeout: float = 600.0
    """How long the server waits for clients to train and report ready (and to evaluate)."""
    stage_timeout: float = 60.0
    report_metrics: bool = True
    """Clients send their training/evaluation scalars and clipped counts in the clear (diagnostics,
    not covered by secure aggregation or DP); False keeps every per-client scalar on the client."""
    max_sealed_bytes: int = 16 << 20
    """Most bytes of Sealed ciphertexts one client sends in one round, all together (the engine
    allows MAX_SEALED_PER_CLIENT of up to MAX_SEALED_BYTES each, 1 GiB). The server sizes the ready
    messages it reads from it; a client with more reports an error naming it. Raise it (on both
    sides, and the transport's limits with it) for an algorithm that relays more."""

    def __post_init__(self) -> None:
        if not self.broadcast_timeout > 0 or not self.stage_timeout > 0:
            raise ValueError("timeouts must be positive")
        if type(self.max_sealed_bytes) is not int or self.max_sealed_bytes < 0:
            raise ValueError("max_sealed_bytes must be a non-negative int")


def _config_digest(config: RunConfig, algorithm) -> dict[str, Any]:
    """What server and clients must agree on: the algorithm, the secure config, the declared releases."""
    digest = {"algorithm": algorithm.name, **config.secure.describe()}
    if algorithm.releases:
        digest["releases"] = {name: dict(spec.describe()) for name, spec in sorted(algorithm.releases.items())}
    return digest


class DeployedServer:
    """Runs FL rounds over a connected ServerDriver; logs and checkpoints after each round; resumable."""

    def __init__(self, *, task: Task, config: RunConfig, driver, deployment: DeploymentConfig = DeploymentConfig(),
                 ledger=None, on_round: Callable[[RoundRecord], None] | None = None, roster=None) -> None:
        """`roster` (from enrolment): secure sums drop a client whose round keys are not signed by
        its enrolled key (clients check each other's signatures either way)."""
        if config.sampler == "seeded" and config.clients_per_round is not None and claimed_sampler(config):
            # RunConfig refuses this already; the deployment does not rely on it (and the ledger checks again)
            raise ValueError("a seeded cohort schedule is public (anyone with the config predicts it) and backs no "
                             f"amplification, but the DP config claims '{claimed_sampler(config)}' sampling: draw "
                             "cohorts from the OS CSPRNG (sampler='poisson' or 'fixed_size') or account at "
                             "sampling_rate=1")
        if config.max_participations is not None or config.plain_twin:
            # a cap the server keeps binds nobody against the server; a deployed server never holds the inputs
            raise ValueError("max_participations and plain_twin are simulation settings: a deployed client does "
                             "not count its own participations yet, and the server never holds the inputs")
        self.task, self.config, self.driver, self.deployment = task, config, driver, deployment
        self.roster = roster
        self.algorithm = task.algorithm
        self.server = ServerRole(task.algorithm)
        self.ledger = ledger
        self.aggregator = SecureAggregator(config.secure, ledger=ledger)
        self.state = self.server.init_state(initial=task.initial())
        self.relays = RelayQueue()
        self.history: list[RoundRecord] = []
        self.rng = np.random.default_rng(config.seed)
        self.on_round = on_round
        self.digest = _config_digest(config, task.algorithm)
        cap = driver.config.limits.max_message_bytes if driver is not None else None
        self.max_ready_bytes = self._read_limit(
            wire.max_ready_bytes(releases=len(self.algorithm.releases), sealed_bytes=deployment.max_sealed_bytes),
            cap, "ready messages")
        """Largest fl_ready read from a client: what the run lets it send, within the transport's cap."""
        self.max_evaluated_bytes = self._read_limit(wire.MAX_EVALUATED_BYTES, cap, "evaluation replies")

    @staticmethod
    def _read_limit(need: int, cap: int | None, what: str) -> int:
        """`need`, or the transport's cap (with a warning) where that is lower."""
        if cap is None or need <= cap:
            return need
        log.warning("%s may legitimately take %d bytes, over the transport's limit of %d: bigger ones are dropped "
                    "(raise ServerConfig.limits, --max-message-mib)", what, need, cap)
        return cap

    # ---- checkpoints ---------------------------------------------------------------------------
    def _ckpt(self) -> Path | None:
        return Path(self.config.checkpoint_dir) / "server" if self.config.checkpoint_dir else None

    def save(self) -> None:
        root = self._ckpt()
        if root is None:
            return
        from fl_algorithms.experiments.checkpoint import save_state

        save_state(root / "latest", {"server": self.state, "relays": self.relays.state_dict(),
                                     "rng": self.rng.bit_generator.state, "history": [asdict(r) for r in self.history],
                                     "ledger": self.ledger.state_dict() if self.ledger is not None else None,
                                     "secure": self.aggregator.state_dict()})
        if self.ledger is not None:
            self.ledger.write(root / "ledger.json")

    def load(self) -> bool:
        root = self._ckpt()
        if root is None:
            return False
        from fl_algorithms.experiments.checkpoint import checkpoint_exists, load_state

        if not checkpoint_exists(root / "latest"):
            return False
        blob = load_state(root / "latest")
        self.state = blob["server"]
        self.relays.load_state_dict(blob["relays"])
        self.rng.bit_generator.state = blob["rng"]
        self.history = [RoundRecord.from_json(r) for r in blob["history"]]
        if self.ledger is not None and blob.get("ledger") is not None:
            self.ledger.load_state_dict(blob["ledger"])
        if blob.get("secure") is not None:
            self.aggregator.load_state_dict(blob["secure"])
        return True

    # ---- what a round needs ---------------------------------------------------------------------
    @property
    def group_minimum(self) -> tuple[int, str]:
        """(fewest connected clients a secure sum can be released from, the settings that say so): the
        survivor floor (min_release_group, or distributed DP's n_min) plus the colluders."""
        floor, why = self.config.secure.survivor_floor()
        c = self.config.secure.colluders
        return floor + c, f"{why}={floor}" + (f" + colluders={c}" if c else "")

    def check_live(self, t: int) -> None:
        """TooFewClientsError when fewer clients are connected than round `t` needs to release anything."""
        live = sorted(self.driver.clients)
        need, why = self.group_minimum
        if len(live) < need:
            raise TooFewClientsError(
                f"only {len(live)} clients are still connected ({live}), fewer than the {need} a secure sum needs "
                f"({why}): round {t} could release nothing, so the run stops after round {t - 1}"
                + (" (checkpointed)" if self._ckpt() is not None else ""), round=t - 1)

    @property
    def unreleased(self) -> dict[int, dict[str, str]]:
        """Rounds whose cohort reached the group minimum but released nothing, with their failed sums (a
        smaller cohort, drawn so by a sampler, releases nothing by design: `dp.sampling`)."""
        need, _ = self.group_minimum
        return {r.round: dict(r.failed) for r in self.history if len(r.cohort) >= need and not r.contributors}

    def check_released(self) -> None:
        """NothingReleasedError when some round released nothing (`unreleased`), naming the rounds and why."""
        bad = self.unreleased
        if bad:
            why = "; ".join(f"round {t}: {', '.join(f'{k}: {v}' for k, v in failed.items()) or 'no sum'}"
                            for t, failed in sorted(bad.items()))
            raise NothingReleasedError(f"{len(bad)} of {len(self.history)} rounds released nothing ({why[:2000]})",
                                       round=len(self.history))

    def announce_end(self, reason: str, detail: str = "") -> None:
        """Tell every connected client why the run ends (`wire.END`), before the transport's shutdown.
        Never raises: the run is ending anyway."""
        if self.driver is None:
            return
        try:
            end = wire.RunEnd(reason=reason, round=len(self.history), detail=detail)
            for c in sorted(self.driver.clients):
                self._send(wire.END, transport_round(len(self.history), EVAL_SLOT), c, wire.end_fields(end))
        except Exception as exc:  # a broken connection must not hide why the run ended
            log.warning("could not tell the clients that the run ends (%s): %s", reason, exc)

    # ---- rounds --------------------------------------------------------------------------------
    def sample(self):
        """(the round's cohort, the record of how it was drawn): see `sim.draw_cohort`."""
        return draw_cohort(self.config, self.rng, self.driver.clients)

    def _send(self, kind: str, round_id: int, client: int, fields: Mapping[str, Any]) -> None:
        if self.driver.send(Message(kind=kind, round=round_id, sender=SERVER, receiver=client, fields=fields)) is None:
            log.info("client %d unreachable for '%s'", client, kind)

    def run_round(self, t: int) -> RoundRecord:
        t0 = time.perf_counter()
        cohort, sampling = self.sample()
        if not cohort:  # Poisson sampling drew nobody: nothing is sent or released (recorded for dp.sampling)
            record_empty_round(self.aggregator, round=t, population=sorted(self.driver.clients), sampling=sampling)
            metrics = self._evaluate(t, lambda c: self.server.client_parameters(state=self.state, client_id=c))
            return RoundRecord(round=t, cohort=[], contributors=[], metrics={c: metrics[c] for c in sorted(metrics)},
                               seconds=time.perf_counter() - t0, secure_seconds=0.0, bytes_uploaded={}, clipped=0,
                               sums={}, failed={})
        population = sorted(self.driver.clients)
        machine = RoundMachine(server=self.server, state=self.state, round=t, cohort=cohort, population=population,
                               aggregator=self.aggregator, relays=self.relays, sampling=sampling)
        rid = transport_round(t, 0)
        for c, b in machine.start().items():
            round_ids = {n: r for n, (r, _) in machine.sums_of(c).items()}
            self._send(wire.TRAIN, rid, c, wire.broadcast_fields(b, round_ids=round_ids, config=self.digest))
        client_metrics: dict[int, dict[str, float]] = {}
        clipped_by: dict[int, dict[str, int]] = {}
        for c, ready in sorted(self.collect_ready(t, cohort).items()):
            if isinstance(ready, str):
                raise ClientSetupError(f"client {c} cannot take part in round {t}: {ready}")
            try:
                machine.on_ready(c, ready)
            except ValueError as exc:
                log.warning("round %d: %s; client %d left out", t, exc, c)
                continue
            client_metrics[c] = dict(ready.metrics)
            clipped_by[c] = dict(ready.clipped)
        sent: dict[int, int] = {}
        clipped = 0
        for job in machine.sum_jobs():
            clipped += sum(clipped_by.get(c, {}).get(job.name, 0) for c in job.members)
            server_cls = registry.server_class(self.config.secure.protocol)
            s0 = time.perf_counter()
            try:  # the secure layer's limits (members vs encoding, survivor floor) fail this sum only
                protocol = self.aggregator.server_protocol(
                    round_id=job.round_id, members=job.members, length=job.length, overrides=job.protocol_params,
                    sized_for=job.sized_for, **registry.with_enrolment(server_cls, {}, roster=self.roster))
            except Exception as exc:
                machine.on_sum(job.name, error=f"{type(exc).__name__}: {exc}", seconds=time.perf_counter() - s0)
                continue
            evicted_before = dict(self.driver.evicted)
            try:
                report = self.driver.run_round(protocol, stage_timeout=self.deployment.stage_timeout)
            except AbortError as exc:
                machine.on_sum(job.name, error=str(exc), seconds=time.perf_counter() - s0)
                continue
            finally:  # a client late or silent in too many consecutive secure sums is gone for the run
                for c, why in sorted(self.driver.evicted.items()):
                    if c not in evicted_before:
                        log.warning("round %d: sum %s: client %d evicted (%s)", t, job.name, c, why)
            for c, n in report.bytes_received.items():
                sent[c] = sent.get(c, 0) + n
            machine.on_sum(job.name, result=report.result, seconds=report.seconds)
        self.state, view = machine.finish()
        metrics = self._evaluate(t, lambda c: machine.evaluation_parameters(c))
        for c, m in client_metrics.items():
            metrics.setdefault(c, {}).update({k: v for k, v in m.items() if k not in metrics.get(c, {})})
        return RoundRecord(round=t, cohort=cohort, contributors=sorted(view.contributors),
                           metrics={c: metrics[c] for c in sorted(metrics)},
                           seconds=time.perf_counter() - t0, secure_seconds=machine.secure_seconds,
                           bytes_uploaded=sent, clipped=clipped,
                           sums={k: sorted(v) for k, v in view.sum_contributors.items()}, failed=dict(view.failed))

    def collect_ready(self, t: int, cohort: Sequence[int]) -> dict[int, ClientReady | str]:
        """Round t's ready answers of `cohort` (or the errors they report), parsed; messages over
        `max_ready_bytes` are dropped by the driver undecoded, malformed ones here (both logged)."""
        got = self.driver.collect(wire.READY, round_id=transport_round(t, 0), timeout=self.deployment.broadcast_timeout,
                                  expect=cohort, max_bytes=self.max_ready_bytes)
        out: dict[int, ClientReady | str] = {}
        for c, msg in sorted(got.replies.items()):
            try:
                out[c] = wire.parse_ready(msg.fields)
            except ProtocolError as exc:
                log.warning("round %d: client %d's ready message is malformed (%s); left out", t, c, exc)
        return out

    def _evaluate(self, t: int, parameters: Callable[[int], Mapping[str, np.ndarray]]) -> dict[int, dict[str, float]]:
        rid = transport_round(t, EVAL_SLOT)
        clients = sorted(self.driver.clients)
        for c in clients:
            self._send(wire.EVALUATE, rid, c, wire.evaluate_fields(parameters(c), round=t))
        got = self.driver.collect(wire.EVALUATED, round_id=rid, timeout=self.deployment.broadcast_timeout,
                                  expect=clients, max_bytes=self.max_evaluated_bytes)
        out = {}
        for c, msg in got.replies.items():
            try:
                out[c] = wire.parse_evaluated(msg.fields)
            except ProtocolError as exc:
                log.warning("client %d's evaluation is malformed: %s", c, exc)
        return out

    def evaluate(self) -> dict[int, dict[str, float]]:
        """Ask every client to evaluate the current parameters (after the last round)."""
        return self._evaluate(len(self.history) + 1,
                              lambda c: self.server.client_parameters(state=self.state, client_id=c))

    def run(self, *, resume: bool = False) -> list[RoundRecord]:
        """Run the remaining rounds (a resumed run may have more than it was saved with: it continues).
        Raises TooFewClientsError before a round that cannot release, NothingReleasedError after the last
        round if some released nothing; tells the clients how the run ended in every case (SIGINT too)."""
        if resume:
            self.load()
        try:
            for t in range(len(self.history) + 1, self.config.rounds + 1):
                self.check_live(t)
                rec = self.run_round(t)
                self.history.append(rec)
                self.save()
                # with a curve split, rounds before the last report only that split's accuracy
                score = "accuracy" if self.config.curve_split is None or t == self.config.rounds \
                    else f"{self.config.curve_split}_accuracy"
                log.info("round %d: %d/%d contributors, mean %s %.4f, %.2f s (secure %.2f s)%s", t,
                         len(rec.contributors), len(rec.cohort), score, rec.mean(score), rec.seconds,
                         rec.secure_seconds, f", failed sums {rec.failed}" if rec.failed else "")
                if self.on_round is not None:
                    self.on_round(rec)
            self.check_released()
        except KeyboardInterrupt:
            self.announce_end("interrupted", "SIGINT at the server")
            raise
        except DeploymentStopped as exc:
            self.announce_end("stopped" if isinstance(exc, TooFewClientsError) else "failed", str(exc))
            raise
        except Exception as exc:
            self.announce_end("failed", f"{type(exc).__name__}: {exc}")
            raise
        self.announce_end("finished")
        return self.history


class DeployedClient:
    """Client side: answers broadcasts with local training, joins its secure sums, evaluates."""

    def __init__(self, *, client_id: int, task: Task, config: RunConfig, deployment: DeploymentConfig = DeploymentConfig(),
                 checkpoint_dir: str | None = None, identity=None) -> None:
        """`identity` (from enrolment): sign this client's round keys and check its peers'."""
        self.client_id, self.config, self.deployment = client_id, config, deployment
        self.identity = identity
        self.algorithm = task.algorithm
        self.trainer = task.make_trainer(client_id)
        self.endpoint = ClientEndpoint(client_id=client_id, role=ClientRole(task.algorithm), trainer=self.trainer,
                                       aggregator=SecureAggregator(config.secure, client_side=True), eval_split=config.eval_split,
                                       curve_split=config.curve_split, rounds=config.rounds)
        self.digest = _config_digest(config, task.algorithm)
        self.sizes = {k: int(v.size) for k, v in self.trainer.get_shared().items()}
        self.server_end: wire.RunEnd | None = None
        """Why the server ended the run, once it has said so (`wire.END`)."""
        self.last_round = 0
        """The last round this client was asked to train in."""
        self._pending: dict[int, Any] = {}  # round id -> EncodedInput
        self.ckpt = Path(checkpoint_dir) if checkpoint_dir else None
        if self.ckpt is not None:
            from fl_algorithms.experiments.checkpoint import checkpoint_exists, load_state

            if checkpoint_exists(self.ckpt / "client"):
                self.endpoint.load_state_dict(load_state(self.ckpt / "client"))

    @property
    def state(self) -> Mapping[str, Any]:
        return self.endpoint.state

    def handlers(self):
        return {wire.TRAIN: self.on_train, wire.EVALUATE: self.on_evaluate, wire.END: self.on_end}

    def on_end(self, msg: Message) -> None:
        """The server says why the run ends (a malformed notice raises ProtocolError: dropped, logged)."""
        self.server_end = wire.parse_end(msg.fields)
        log.info("client %d: the server ends the run after round %d (%s)", self.client_id, self.server_end.round,
                 self.server_end.reason)

    def _check(self, broadcast, server_config: Mapping[str, Any]) -> str | None:
        mismatch = wire.config_mismatch(server_config, self.digest)
        if mismatch:
            return f"configuration differs from the server's: {mismatch}"
        for name, arr in broadcast.items():
            if name in self.sizes and arr.shape[0] != self.sizes[name]:
                return (f"model size differs for part '{name}': the server sends {arr.shape[0]} values, "
                        f"client {self.client_id}'s model has {self.sizes[name]}")
        return None

    def on_train(self, msg: Message) -> Message:
        from transport.session import reply_to

        broadcast, round_ids, server_config = wire.parse_broadcast(msg.fields)
        self.last_round = max(self.last_round, int(broadcast.round))
        problem = self._check(broadcast, server_config)
        if problem is None:
            try:
                ready, inputs, _ = self.endpoint.on_broadcast(broadcast)
            except Exception as exc:  # report, rather than vanish: the server names this client
                log.exception("client %d failed in round %d", self.client_id, broadcast.round)
                problem = f"{type(exc).__name__}: {exc}"
        if problem is None:
            sealed = sum(len(s.ciphertext) for s in ready.sealed)
            if sealed > self.deployment.max_sealed_bytes:  # the server would drop the whole answer unread
                problem = (f"client {self.client_id} seals {sealed} bytes for peers in round {broadcast.round}, over "
                           f"DeploymentConfig.max_sealed_bytes ({self.deployment.max_sealed_bytes}) that the server reads")
        if problem is not None:
            return reply_to(msg, wire.READY, **wire.ready_fields(None, error=problem))
        self._pending = {round_ids[name]: enc for name, enc in inputs.items() if enc.layout.parts}
        if self.ckpt is not None:
            from fl_algorithms.experiments.checkpoint import save_state

            save_state(self.ckpt / "client", self.endpoint.state_dict())
        if not self.deployment.report_metrics:
            ready = dataclasses.replace(ready, metrics={}, clipped={})
        return reply_to(msg, wire.READY, **wire.ready_fields(ready))

    def on_evaluate(self, msg: Message) -> Message:
        from transport.session import reply_to

        params, t = wire.parse_evaluate(msg.fields)
        for name, arr in params.items():
            if name in self.sizes and arr.shape[0] != self.sizes[name]:
                raise ProtocolError(f"evaluation part '{name}' has {arr.shape[0]} values, expected {self.sizes[name]}")
        metrics = self.endpoint.on_evaluate(params, round=t) if self.deployment.report_metrics else {}
        return reply_to(msg, wire.EVALUATED, **wire.evaluated_fields(metrics))

    def protocol_for(self, round_id: int):
        enc = self._pending.pop(round_id, None)
        if enc is None:
            return None
        vec = enc.vector
        client_cls = registry.client_class(self.config.secure.protocol)
        policy = self.endpoint.aggregator.client_protocol_params()  # the run's colluders and group floor
        if enc.noise_layers is not None:  # XNoise: this client's layer secrets, shared with its unmasking shares
            policy = {**policy, "noise_layers": enc.noise_layers}
        return client_cls(client_id=self.client_id, round_id=round_id, input_fn=lambda: vec,
                          **registry.with_enrolment(client_cls, policy, identity=self.identity))


@dataclass(frozen=True)
class ClientExit:
    """How a client process reports the end of its run: a JSON line, a sentence for a person, an exit status."""

    line: dict[str, Any]
    message: str | None
    code: int


def client_exit(*, client_id: int, exit_reason: str, end: wire.RunEnd | None, last_round: int,
                idle_timeout: float | None = None) -> ClientExit:
    """What a client says when its loop ends (`transport.client.ClientSummary.exit_reason`): 'finished'
    when the server said so; 'server_stopped' (why and after which round) when it ended the run early;
    'server_gone' when its connection closed without a word (killed, crashed) and 'idle' when it fell
    silent. Anything but a finished run exits non-zero."""
    if end is not None and end.reason == "finished":
        return ClientExit({"client": client_id, "exit": "finished", "round": end.round}, None, 0)
    if end is not None:
        detail = f": {end.detail}" if end.detail else ""
        return ClientExit({"client": client_id, "exit": "server_stopped", "why": end.reason, "round": end.round},
                          f"client {client_id}: the server ended the run after round {end.round} ({end.reason}{detail})",
                          1)
    line = {"client": client_id, "exit": exit_reason, "round": last_round}
    if exit_reason == "server_gone":
        return ClientExit(line, f"client {client_id}: the server went away after round {last_round} (its connection "
                                "closed without a word): restart it with --resume, then this client", 1)
    if exit_reason == "idle":
        quiet = f" for {idle_timeout:.0f} s" if idle_timeout else ""
        return ClientExit(line, f"client {client_id}: no word from the server{quiet} after round {last_round}: "
                                "giving up", 1)
    return ClientExit(line, None, 0)  # 'shutdown' from a server that does not say why, or 'stopped' (threads)


def describe_round(rec: RoundRecord) -> str:
    """One JSON line per round for logs and CLIs."""
    return json.dumps({"round": rec.round, "cohort": rec.cohort, "contributors": rec.contributors,
                       "accuracy": rec.mean("accuracy"), "seconds": round(rec.seconds, 3),
                       "secure_seconds": round(rec.secure_seconds, 3), "failed": rec.failed})
