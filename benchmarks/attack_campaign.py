"""Attack campaign: a real enrolled deployment over loopback tcp, attacked in bounded ways, by outsiders
and by colluding insiders.

    python benchmarks/attack_campaign.py --quick         # about a minute on 2 cores
    python benchmarks/attack_campaign.py --out campaign.json

Every server declares the threat it withstands: c colluding clients (`colluders`, the number of
colluding insiders of its phase) and a group minimum g (`min_clients` / `min_group`: no sum over
fewer than g honest clients is opened), so a round needs g + c survivors; honest clients hold the
same floors. Three phases per protocol (SecAgg, SecAgg+ on a sparse graph, LightSecAgg):

1. `attack`: the server is the shipped command, `python -m transport.cli server --keys ... --check
   --rejoin-timeout ... --param colluders=c --param min_clients=g`, in its own process, with
   CurveZMQ, the client allowlist and signed round keys from `transport.enrolment`. Honest clients run
   the shipped client driver (`transport.client.run_client`) in threads of this process; one of them
   reaches the server through a TCP relay that records its (encrypted) session. After a warm-up round:
   - rotating rounds: an honest client crashes at a stage that moves round by round, and restarts;
     the first *enrolled* insider (`transport.adversary.Insider`: real keys, real client protocol)
     attacks in a way the server must answer by dropping it (corrupt shares, a low-order key, a
     forged signature, a malformed or an oversized reply, a 256 MiB flood), the second in a way it
     must shrug off while counting its valid reply (garbage, replays, a spoofed sender, replies of
     the wrong stage); network attackers without enrolment register sybils, squat honest ids, flood
     NULL-mechanism frames and a never-ending message, and replay a recorded honest session. One
     round is starved on purpose (every honest client crashes at the first stage).
   - coalition rounds: the insiders collude (`transport.adversary.Coalition`), planning with the
     server's view of the round (the server colludes; `benchmarks.insider_attacks`):
     `accuse_classic` (SecAgg+: accuse the honest partners of a victim next to them, hoping it masks
     only with colluders; SecAgg, LightSecAgg: each accuses a different honest client, the 'c
     colluders leave one victim' attack) and `accuse_search` (the accusation map, of every assignment
     of 0-2 accusations per insider over the honest clients it may accuse, or past a budget every
     distinct matching, that under the server's matching rule exposes a victim or loses the most
     honest seats from a round that still opens);
     `duplicate_keys` / `duplicate_half_key` (the second insider advertises the first's round keys,
     or only its masking key, signed with its own identity); `wrong_unmask` (a wrong seed share or
     aggregate coded piece); and last `stall` (the second insider answers each stage at 0.9 x the
     stage timeout, for as many rounds as the stall policy takes to evict it).
2. `five` (SecAgg, LightSecAgg): 6 honest clients and 5 colluding insiders (c = 5), warm-up, then
   `accuse_classic` (each insider accuses a different honest client, leaving one victim) and
   `accuse_search`, against the shipped server.
3. `withhold`: a server that chooses the dropouts, run in this process (`transport.server.ServerDriver`
   with `insider_attacks.withholding_server`): at the masked stage it withholds the inputs of a
   victim's honest partners (SecAgg+: the honest client with the most colluder neighbours; SecAgg,
   LightSecAgg: every honest client but one), once with its own checks and once skipping them (then
   only the clients' checks stand; its colluders sign any survivor set and reveal what they hold).
   The round must abort, or leave the victim unexposed.

R counts the rounds that enough clients followed to the end: those where the clients that did not
crash and whose replies stay valid reach the protocol's own minimum (g + c survivors, LightSecAgg's
target U, SecAgg's threshold; for SecAgg+ also no more clients removed than a neighbourhood can lose
and the ring check can bear), an honest accuser dropped with each insider it reports; a round of
accusations is in R when the server's own rule, replayed on the round's graph with the accusations
actually made (`insider_attacks.settle`), opens it. Malicious-server rounds are not in R. Last lines:

    round_time_bound_s=B slowest_round=... rounds_over_bound=N
    attack_campaign rounds=R rounds_completed=C wrong_sums=W crashes=X sybil_accepted=S peak_rss_over_baseline_mb=M recovered_inputs=I honest_dropped=H colluders_dropped=D max_round_s=T

wrong_sums counts rounds whose opened sum differs from the exact sum of the contributors' inputs;
crashes counts server exits other than 0/1, tracebacks, protocol exceptions on hostile input and
honest clients that died of anything but their scheduled crash; sybil_accepted counts welcomes
given to unenrolled or squatting connections and replayed sessions the server admitted; peak RSS
is the shipped server's high-water mark (VmHWM, read until it exits) over its value after the
warm-up round. recovered_inputs counts honest contributors whose input the coalition (server view +
insiders' secrets) computes from a finished round (`insider_attacks.recovered_inputs`: live masking
partners all colluders; a LightSecAgg round with fewer than g honest contributors; a lone honest
contributor, whose input is the opened sum minus the colluders' inputs). honest_dropped and
colluders_dropped count the clients a finished round's `faulty` names (faults and disputed
accusations), honest or insider. max_round_s is the longest finished round of the shipped server
among those whose honest clients alone reach the survivor minimum (elsewhere, as in the `five`
phase, no stall policy can close a stage before the colluders answer);
each round's bound is twice its honest round (per stage, until the slowest honest reply, from the
slowest honest reply of the stage before, or from the first honest request after a stage that held
on for a silent client; plus the server's protocol time) plus the stall policy's grace for each stage
that closed with an expected client silent (`insider_attacks.round_time_bound`); B is the bound of
the slowest round. The goal: C = R, W = X = S = I = 0, H <= D, every round within its bound,
M < 200 MB plus the model (the summed vector), every insider judged as its attack requires, every
staller evicted, no honest client evicted, no sum over fewer than g honest clients. Exit code 1 if
it is missed.
"""
from __future__ import annotations

import argparse
import inspect
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import zmq

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: benchmarks.insider_attacks must import
    sys.path.insert(0, str(ROOT))

from benchmarks.insider_attacks import (  # noqa: E402
    Observed, Planners, ServerView, Threat, accusations_made, recovered_inputs, round_time_bound, settle,
    silent_stages, small_groups, withholding_server,
)
from secagg.messages import AbortError  # noqa: E402
from secagg.protocols import registry  # noqa: E402
from secagg.protocols.base import ServerProtocol, WrappedClient  # noqa: E402
from secagg.protocols.secagg import ClientPolicy  # noqa: E402
from secagg.ring import Ring  # noqa: E402
from transport import adversary  # noqa: E402
from transport.adversary import ATTACKS, COUNTED, DROPPED, Coalition, Insider, RawPeer, TcpRecorder  # noqa: E402
from transport.cli import param_names, synthetic_input, synthetic_sum  # noqa: E402
from transport.client import ClientConfig, ClientSession, RegistrationError, run_client  # noqa: E402
from transport.enrolment import enrol, load_client, load_roster, load_server  # noqa: E402
from transport.server import ServerConfig, ServerDriver, StallPolicy  # noqa: E402
from transport.sockets import CurveClientKeys, curve_keypair  # noqa: E402

RSS_BOUND_MB = 200.0

PROTOCOL_PARAMS: dict[str, tuple[str, ...]] = {
    "secagg": (),
    "secagg+": ("degree=6",),                  # sparse: 6 neighbours of 9, so SecAgg+ is not SecAgg
    "lightsecagg": ("target_survivors=0.6",),  # U = 6 of 10: room for a crash, a dropped insider and its accuser
}
"""Protocol parameters besides the threat (`colluders`, and g as `min_clients` or `min_group`)."""
DROP_ATTACKS = ("corrupt_shares", "corrupt_some_shares", "low_order_key", "bad_signature", "malformed", "oversized", "flood")
KEEP_ATTACKS = ("garbage", "replay", "spoof", "wrong_stage")
COALITION_ATTACKS = ("accuse_classic", "accuse_search", "accuse_search", "duplicate_keys", "duplicate_half_key",
                     "wrong_unmask")
"""Coalition rounds of the `attack` phase, in order (then the stall rounds)."""
STALL_ROUNDS = StallPolicy().evict_after or 3
"""Rounds the staller stalls: as many as the default stall policy takes to evict it."""
FIVE_ATTACKS = ("accuse_classic", "accuse_search")
WITHHOLD_ROUNDS = ("withhold", "withhold_unchecked")


@dataclass(frozen=True)
class CampaignConfig:
    protocols: tuple[str, ...] = ("secagg", "secagg+", "lightsecagg")
    honest: int = 8
    colluders: int = 2
    """Insiders, all colluding; every server declares `colluders` = this."""
    group: int = 3
    """g: the fewest honest clients whose sum may be opened (`min_clients` / `min_group`)."""
    dim: int = 1000
    attack_rounds: int = 8
    """Rotating rounds after the warm-up round, per protocol (one of them starved on purpose): with 8,
    every single-insider attack runs at least once in a round that can finish."""
    stage_timeout: float = 4.0
    sybils: int = 4
    squatters: int = 2
    replays: int = 3
    flood_mib: int = 256
    """Bytes the NULL-mechanism peers push at the server, per protocol."""
    coalition: bool = True
    """Run the coalition and stall rounds after the rotating ones."""
    five_protocols: tuple[str, ...] = ("secagg", "lightsecagg")
    """Protocols of the `five` phase (FIVE honest clients and colluders); () to skip it."""
    withhold: bool = True
    """Run the `withhold` phase (a server choosing the dropouts)."""

    def __post_init__(self) -> None:
        if self.honest < 4 or self.attack_rounds < 2 or self.dim < 1 or self.colluders < 2 or self.group < 1:
            raise ValueError("need at least 4 honest clients, 2 colluders, 2 attack rounds, dim >= 1 and g >= 1")
        unknown = (set(self.protocols) | set(self.five_protocols)) - set(PROTOCOL_PARAMS)
        if unknown:
            raise ValueError(f"no campaign for protocols {sorted(unknown)}; choose from {sorted(PROTOCOL_PARAMS)}")

    @property
    def insiders(self) -> tuple[int, ...]:
        return tuple(range(self.honest + 1, self.honest + self.colluders + 1))

    @property
    def clients(self) -> tuple[int, ...]:
        return tuple(range(1, self.honest + self.colluders + 1))

    def five(self) -> CampaignConfig:
        """The `five` phase's sizes: 6 honest clients, 5 colluders, no rotating rounds."""
        return replace(self, honest=6, colluders=5)


QUICK = CampaignConfig()
FULL = CampaignConfig(honest=16, dim=100_000, attack_rounds=16, sybils=10, replays=6, flood_mib=1024)


# ---- the schedule ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class RoundPlan:
    round_id: int
    crashes: dict[int, int]
    """Honest client -> the index of the stage at which it crashes."""
    attacks: dict[int, str]
    """Insider -> its attack (an `adversary.ATTACKS` name)."""
    starved: bool = False
    simulated: bool = False
    """Accusation round: whether it can finish is the server's rule replayed on the accusations made."""


@dataclass(frozen=True)
class Requirement:
    """What a round of `protocol` needs to finish, read from the server protocol itself."""

    need: int
    slack: int | None
    """Most clients SecAgg+ may lose in all (None: complete graph, no such limit): no neighbourhood
    then falls short of the live partners each client needs, and no c colluders can cut the ring."""

    def finishable(self, *, live: int, removed: int) -> bool:
        return live >= self.need and (self.slack is None or removed <= self.slack)

    def hopeless(self, *, live: int) -> bool:
        return live < self.need


def server_params(protocol: str, cfg: CampaignConfig) -> tuple[str, ...]:
    """The server's --param pairs: the protocol's own and the declared threat (c, g)."""
    group = "min_group" if "min_group" in param_names(registry.server_class(protocol)) else "min_clients"
    return (*PROTOCOL_PARAMS[protocol], f"colluders={cfg.colluders}", f"{group}={cfg.group}")


def _params(protocol: str, cfg: CampaignConfig) -> dict[str, object]:
    from transport.cli import parse_params

    return parse_params(list(server_params(protocol, cfg)))


def client_floors(protocol: str, cfg: CampaignConfig) -> dict[str, object]:
    """Client keywords holding every client to the servers' declared threat (c, g)."""
    accepted = inspect.signature(registry.client_class(protocol)).parameters
    if "policy" in accepted:
        return {"policy": ClientPolicy(min_colluders=cfg.colluders, min_group=cfg.group)}
    if "min_colluders" in accepted:
        return {"min_colluders": cfg.colluders, "min_group": cfg.group}
    return {}


def trial_server(protocol: str, cfg: CampaignConfig) -> ServerProtocol:
    """A server protocol of the campaign's round, to read its derived counts from."""
    cls = registry.server_class(protocol)
    return cls(round_id=1, clients=cfg.clients, length=cfg.dim, **_params(protocol, cfg))


def requirement(protocol: str, cfg: CampaignConfig) -> Requirement:
    server = trial_server(protocol, cfg)
    if hasattr(server, "min_survivors"):
        return Requirement(need=server.min_survivors, slack=None)
    if server.complete:
        return Requirement(need=server.min_clients, slack=None)
    degree = max(len(v) for v in server.graph.values())
    # a cut needs two windows of `half` ring positions holding at most c survivors
    slack = min(degree - server.partners, 2 * server.half - server.floors.colluders - 1)
    return Requirement(need=server.min_clients, slack=slack)


def stage_count(protocol: str) -> int:
    return len(registry.client_class(protocol).schemas)


def schedule(cfg: CampaignConfig, protocol: str) -> list[RoundPlan]:
    """Round 1 is a clean warm-up; then one honest crash per round at a rotating stage, one dropped
    and one counted insider attack per round, and one starved round in the middle; then (with
    `cfg.coalition`) the coalition rounds and, last, the stall rounds."""
    honest = list(range(1, cfg.honest + 1))
    quiet = {i: "honest" for i in cfg.insiders}
    stages = stage_count(protocol)
    starved_round = 2 + cfg.attack_rounds // 2
    plans = [RoundPlan(1, {}, dict(quiet))]
    k = 0  # attacks and crashes rotate over the rounds that can finish
    for r in range(2, cfg.attack_rounds + 2):
        attacks = {**quiet, cfg.insiders[0]: DROP_ATTACKS[k % len(DROP_ATTACKS)],
                   cfg.insiders[1]: KEEP_ATTACKS[k % len(KEEP_ATTACKS)]}
        if r == starved_round:
            plans.append(RoundPlan(r, {c: 0 for c in honest}, attacks, starved=True))
            continue
        plans.append(RoundPlan(r, {honest[k % len(honest)]: k % stages}, attacks))
        k += 1
    if cfg.coalition:
        r = cfg.attack_rounds + 2
        for name in COALITION_ATTACKS:
            if name == "duplicate_half_key" and protocol == "lightsecagg":
                continue  # a single key: the same attack as duplicate_keys
            attacks = {**quiet, cfg.insiders[0]: name} if name == "wrong_unmask" else {i: name for i in cfg.insiders}
            plans.append(RoundPlan(r, {}, attacks, simulated=name.startswith("accuse")))
            r += 1
        for _ in range(STALL_ROUNDS):
            plans.append(RoundPlan(r, {}, {**quiet, cfg.insiders[-1]: "stall"}))
            r += 1
    _check_judgeable(cfg, protocol, plans)
    return plans


def five_schedule(cfg: CampaignConfig, protocol: str) -> list[RoundPlan]:
    """A clean warm-up, then every colluder in each of FIVE_ATTACKS."""
    plans = [RoundPlan(1, {}, {i: "honest" for i in cfg.insiders})]
    plans += [RoundPlan(r, {}, {i: name for i in cfg.insiders}, simulated=True)
              for r, name in enumerate(FIVE_ATTACKS, start=2)]
    _check_judgeable(cfg, protocol, plans)
    return plans


def _check_judgeable(cfg: CampaignConfig, protocol: str, plans: list[RoundPlan]) -> None:
    need = requirement(protocol, cfg)
    for plan in plans:
        if plan.simulated:
            continue  # judged after the round, from the accusations actually made
        live, removed = expected_live(plan, cfg.clients, cfg.insiders)
        ok = need.finishable(live=live, removed=removed)
        if ok == plan.starved or (plan.starved and not need.hopeless(live=live)):
            raise ValueError(f"{protocol} round {plan.round_id}: {live} live clients against {need} make it "
                             f"neither clearly finishable nor clearly starved; change the campaign's sizes")


def expected_live(plan: RoundPlan, participants, insiders) -> tuple[int, int]:
    """(clients that follow the round to its end, clients removed from it) if all of `participants`
    start it: crashed clients, insiders the server must drop, and for each insider that honest
    clients report (`AttackSpec.accused_by_honest`) one honest accuser dropped with it."""
    participants = set(participants)
    removed = set(plan.crashes) & participants
    removed |= {i for i in insiders if i in participants and ATTACKS[plan.attacks[i]].outcome != COUNTED}
    accusers = sum(1 for i in insiders if i in participants and ATTACKS[plan.attacks[i]].accused_by_honest)
    return len(participants - removed) - accusers, len(removed) + accusers


# ---- honest clients ------------------------------------------------------------------------------

class ClientCrash(Exception):
    """A scheduled crash: the client's process would die here."""


class _CrashAt(WrappedClient):
    """Wraps a client protocol: raises ClientCrash on the request of stage index `stage`."""

    def __init__(self, inner, stage: int) -> None:
        super().__init__(inner)
        self.stage, self.seen = stage, 0

    def handle(self, msg):
        if self.seen == self.stage:
            raise ClientCrash(f"round {msg.round} at '{msg.kind}'")
        self.seen += 1
        return self.inner.handle(msg)


@dataclass
class HonestLog:
    crashes: int = 0
    restarts_refused: int = 0
    errors: list[str] = field(default_factory=list)


def run_honest(*, endpoint: str, client_id: int, protocol: str, keys: Path, dim: int, session_text: str,
               plans: dict[int, RoundPlan], context: zmq.Context, stop: threading.Event, log: HonestLog,
               view: ServerView | None = None, floors: Mapping[str, object] | None = None) -> None:
    curve, identity = load_client(keys, client_id)
    cls = registry.client_class(protocol)

    def factory(round_id: int):
        proto = cls(client_id=client_id, round_id=round_id, input_fn=lambda: synthetic_input(client_id, round_id, dim),
                    **registry.with_enrolment(cls, dict(floors or {}), identity=identity))
        plan = plans.get(round_id)
        if plan is not None and client_id in plan.crashes:
            proto = _CrashAt(proto, plan.crashes[client_id])
        return Observed(proto, client_id=client_id, view=view) if view is not None else proto

    config = ClientConfig(hello_timeout=30.0, idle_timeout=120.0, session=session_text)
    while not stop.is_set():
        try:
            run_client(endpoint=endpoint, client_id=client_id, factory=factory, context=context, config=config,
                       curve=curve, stop=stop)
            return
        except ClientCrash:
            log.crashes += 1
        except RegistrationError as exc:  # the server has not yet seen our last connection close
            log.restarts_refused += 1
            if log.restarts_refused > 200:
                log.errors.append(str(exc))
                return
            time.sleep(0.1)
        except Exception as exc:  # an honest client must never die of anything else
            log.errors.append(f"{type(exc).__name__}: {exc}")
            return


# ---- network attackers ---------------------------------------------------------------------------

@dataclass
class NetworkLog:
    attempts: Counter = field(default_factory=Counter)
    accepted: Counter = field(default_factory=Counter)
    flood_bytes: int = 0


def network_attacks(*, cfg: CampaignConfig, endpoint: str, server_key: bytes, insider_curve: CurveClientKeys,
                    session_text: str, recorder: TcpRecorder, context: zmq.Context, stop: threading.Event,
                    log: NetworkLog) -> list[threading.Thread]:
    """Start the bounded attacks of unenrolled and squatting peers; returns their threads."""
    honest = list(range(1, cfg.honest + 1))

    def register(kind: str, client_id: int, curve: CurveClientKeys | None) -> None:
        log.attempts[kind] += 1
        try:
            with ClientSession(endpoint=endpoint, client_id=client_id, context=context, curve=curve,
                               config=ClientConfig(hello_timeout=2.0, session=session_text)) as sess:
                sess.register()
            log.accepted[kind] += 1
        except RegistrationError:
            pass

    def sybils() -> None:
        for k in range(cfg.sybils):
            if stop.is_set():
                return
            public, secret = curve_keypair()
            fresh = CurveClientKeys(public_key=public, secret_key=secret, server_key=server_key)
            register("unenrolled_sybil", honest[k % len(honest)] if k % 2 else 900 + k, fresh)

    def squatters() -> None:
        for k in range(cfg.squatters):
            if stop.is_set():
                return
            register("squat_with_insider_key", honest[-1 - k % len(honest)], insider_curve)
            register("squat_without_key", honest[k % len(honest)], None)

    def replays() -> None:
        deadline = time.monotonic() + 30
        while len(recorder.recorded) < 1024 and time.monotonic() < deadline and not stop.is_set():
            time.sleep(0.1)
        for _ in range(cfg.replays):
            if stop.is_set() or len(recorder.recorded) < 64:
                return
            log.attempts["session_replay"] += 1
            log.accepted["session_replay"] += adversary.replay_session(endpoint, bytes(recorder.recorded))

    def null_floods() -> None:
        peers = [RawPeer(endpoint, context) for _ in range(2)]
        try:
            import numpy as np

            big = np.zeros((64 << 20) - 4096, np.uint8)
            messages = [[big]] * max(1, cfg.flood_mib // 128)
            threads = [threading.Thread(target=adversary.flood, args=(p.sock, messages, stop), daemon=True)
                       for p in peers]
            for p in peers:
                p.hello(honest[0], session_text=session_text)
            for t in threads:
                t.start()
            sent = [0]
            log.attempts["unfinished_message"] += 1
            adversary.stream_unfinished_message(endpoint, total=cfg.flood_mib << 19, stop=stop, sent=sent,
                                                max_connections=50)
            log.flood_bytes += sent[0]  # what the server took before closing the connections
            for t in threads:
                t.join()
        finally:
            for p in peers:
                p.close()

    threads = [threading.Thread(target=f, daemon=True) for f in (sybils, squatters, replays, null_floods)]
    for t in threads:
        t.start()
    return threads


# ---- one protocol ------------------------------------------------------------------------------

@dataclass
class PhaseResult:
    protocol: str
    phase: str = "attack"
    rounds: list[dict] = field(default_factory=list)
    exit_code: int | None = None
    peak_rss_over_baseline_mb: float = 0.0
    server_errors: list[str] = field(default_factory=list)
    honest: dict[int, dict] = field(default_factory=dict)
    insiders: dict[int, dict] = field(default_factory=dict)
    network: dict = field(default_factory=dict)
    evicted: dict[int, str] = field(default_factory=dict)
    """Clients the server evicted (stall policy), with its reason."""
    stallers: list[int] = field(default_factory=list)
    """Insiders that stalled in as many consecutive rounds as the stall policy allows."""


@dataclass(frozen=True)
class Judge:
    """What `_judge` needs to know about a phase besides the server's line."""

    cfg: CampaignConfig
    protocol: str
    need: Requirement
    threat: Threat
    view: ServerView
    coalition: Coalition
    planners: Planners


def _vm_hwm(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("VmHWM:")).split()[1]) * 1024


def _watch_hwm(proc: subprocess.Popen, peaks: list[int]) -> None:
    """Append the process's VmHWM every 20 ms while it runs (the last value read is its peak)."""
    while proc.poll() is None:
        try:
            peaks.append(_vm_hwm(proc.pid))
        except (OSError, StopIteration, ValueError):  # exiting: the last value read stands
            return
        time.sleep(0.02)


EVICTED = re.compile(r"client (\d+) evicted: (.*)")


def _start_clients(*, cfg: CampaignConfig, protocol: str, keys: Path, endpoint: str,
                   honest_endpoints: Mapping[int, str], plans: dict[int, RoundPlan], view: ServerView,
                   coalition: Coalition, ctx: zmq.Context, stop: threading.Event,
                   ) -> tuple[dict[int, HonestLog], dict[int, Insider], list[threading.Thread]]:
    """Honest client threads (observed into `view`) and the colluding insiders, all started."""
    session_text = f"{protocol} length={cfg.dim}"
    floors = client_floors(protocol, cfg)
    threads = []
    honest_logs = {c: HonestLog() for c in range(1, cfg.honest + 1)}
    for c, hlog in honest_logs.items():
        t = threading.Thread(target=run_honest, daemon=True, kwargs=dict(
            endpoint=honest_endpoints.get(c, endpoint), client_id=c, protocol=protocol, keys=keys, dim=cfg.dim,
            session_text=session_text, plans=plans, context=ctx, stop=stop, log=hlog, view=view, floors=floors))
        t.start()
        threads.append(t)
    insiders = {}
    for i in cfg.insiders:
        curve, identity = load_client(keys, i)
        insiders[i] = Insider(
            endpoint=endpoint, client_id=i, protocol=protocol, curve=curve, identity=identity,
            session_text=session_text, plan=lambda r, i=i: plans[r].attacks[i] if r in plans else "honest",
            input_fn=lambda r, i=i: synthetic_input(i, r, cfg.dim), honest=range(1, cfg.honest + 1),
            max_reply_bytes=_max_reply_bytes(protocol, cfg), context=ctx, coalition=coalition,
            stage_timeout=cfg.stage_timeout, observe=view.observe, client_params=floors)
        t = threading.Thread(target=insiders[i].run, args=(stop,), daemon=True)
        t.start()
        threads.append(t)
    return honest_logs, insiders, threads


def run_phase(cfg: CampaignConfig, protocol: str, keys: Path, workdir: Path, *, plans: list[RoundPlan] | None = None,
              phase: str = "attack", network: bool = True) -> PhaseResult:
    """One phase against the shipped server (`python -m transport.cli server`): `plans` (default
    `schedule(cfg, protocol)`), with the network attackers if `network`."""
    plans = {p.round_id: p for p in (plans if plans is not None else schedule(cfg, protocol))}
    need = requirement(protocol, cfg)
    threat = Threat.of(trial_server(protocol, cfg))
    view = ServerView()
    planners = Planners(view=view, colluders=cfg.insiders, threat=threat)
    coalition = Coalition(members=cfg.insiders, planners=planners.as_dict())
    judge = Judge(cfg=cfg, protocol=protocol, need=need, threat=threat, view=view, coalition=coalition,
                  planners=planners)
    endpoint_file = workdir / f"{protocol}-{phase}.endpoint"
    cmd = [sys.executable, "-m", "transport.cli", "server", "--keys", str(keys), "--protocol", protocol,
           "--clients", str(len(cfg.clients)), "--dim", str(cfg.dim), "--rounds", str(len(plans)), "--check",
           "--stage-timeout", str(cfg.stage_timeout), "--register-timeout", "60", "--rejoin-timeout", "20",
           "--endpoint-file", str(endpoint_file)]
    for p in server_params(protocol, cfg):
        cmd += ["--param", p]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    server = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stderr_lines: list[str] = []
    threading.Thread(target=lambda: stderr_lines.extend(server.stderr), daemon=True).start()
    result = PhaseResult(protocol, phase=phase)
    result.stallers = sorted({i for p in plans.values() for i, a in p.attacks.items() if a == "stall"})
    ctx = zmq.Context()
    stop = threading.Event()
    threads: list[threading.Thread] = []
    recorder = None
    try:
        deadline = time.monotonic() + 60
        while not endpoint_file.exists() or not endpoint_file.read_text():
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start: {''.join(stderr_lines)[-2000:]}")
            time.sleep(0.05)
        endpoint = endpoint_file.read_text()
        recorder = TcpRecorder(endpoint) if network else None
        server_key, _, _ = load_roster(keys)
        honest_logs, insiders, threads = _start_clients(
            cfg=cfg, protocol=protocol, keys=keys, endpoint=endpoint,
            honest_endpoints={1: recorder.endpoint} if recorder is not None else {}, plans=plans, view=view,
            coalition=coalition, ctx=ctx, stop=stop)

        # VmHWM is a high-water mark: read until the process is gone, its last value is the peak.
        # (Not ru_maxrss from wait4: Linux folds the forked parent's RSS before exec into it.)
        peaks: list[int] = []
        watch = threading.Thread(target=_watch_hwm, args=(server, peaks), daemon=True)
        watch.start()
        baseline = None
        net = NetworkLog()
        for line in server.stdout:
            event = json.loads(line)
            if event.get("event") not in ("round", "aborted"):
                continue
            result.rounds.append(_judge(event, plans[event["round"]], judge, phase))
            if event["round"] == 1 and baseline is None:
                baseline = _vm_hwm(server.pid)
                if network:
                    threads += network_attacks(cfg=cfg, endpoint=endpoint, server_key=server_key.encode(),
                                               insider_curve=load_client(keys, cfg.insiders[0])[0],
                                               session_text=f"{protocol} length={cfg.dim}", recorder=recorder,
                                               context=ctx, stop=stop, log=net)
        server.wait()
        watch.join()
        result.exit_code = server.returncode
        peak = max(peaks, default=0)
        result.peak_rss_over_baseline_mb = round((peak - (baseline or peak)) / 2**20, 1)
        result.server_errors = [line.strip() for line in stderr_lines if "Traceback" in line or "Error" in line][:20]
        result.evicted = {int(m.group(1)): m.group(2).strip() for m in map(EVICTED.search, stderr_lines) if m}
        result.honest = {c: asdict(h) for c, h in honest_logs.items()}
        result.insiders = {i: asdict(ins.log) for i, ins in insiders.items()}
        result.network = {"attempts": dict(net.attempts), "accepted": dict(net.accepted),
                          "flood_bytes": net.flood_bytes}
    finally:
        stop.set()
        for t in threads:  # every attacker is bounded in time, and clients stop with `stop`
            t.join(60)
        if recorder is not None:
            recorder.close()
        if server.poll() is None:
            server.kill()
            server.wait()
        if not any(t.is_alive() for t in threads):
            ctx.term()
    return result


def _max_reply_bytes(protocol: str, cfg: CampaignConfig) -> int:
    return trial_server(protocol, cfg).max_reply_bytes()


def _sum_ring(protocol: str) -> Ring:
    return registry.default_ring(protocol)


def _judge(event: dict, plan: RoundPlan, judge: Judge, phase: str) -> dict:
    """One round's line from the server, with what the campaign expected of it."""
    cfg, protocol, view = judge.cfg, judge.protocol, judge.view
    completed = event["event"] == "round"
    if completed:  # the round's line leaves out clients dropped short of live partners: the requests tell
        participants = set(event["contributors"]).union(*map(set, event["dropped"].values()),
                                                        view.started(plan.round_id))
    else:
        participants = set(cfg.clients)  # an aborted round does not say: assume everyone had rejoined
    live, removed = expected_live(plan, participants, cfg.insiders)
    out = {"round": event["round"], "protocol": protocol, "phase": phase, "completed": completed,
           "starved": plan.starved, "live": live, "crashes": plan.crashes, "attacks": plan.attacks,
           "in_R": judge.need.finishable(live=live, removed=removed) and plan.round_id > 1}
    verdicts: dict[str, bool] = {}
    settlement = None
    if plan.simulated:
        accusations = accusations_made(judge.coalition.plans, round_id=plan.round_id)
        settlement = settle(graph=view.graph(plan.round_id), alive=participants, accusations=accusations,
                            colluders=frozenset(cfg.insiders), threat=judge.threat)
        out["in_R"] = settlement.opens
        out["accusations"] = {m: sorted(t) for m, t in sorted(accusations.items())}
        out["maps_searched"] = judge.planners.log.maps.get(plan.round_id, 0)
        out["rule"] = {"opens": settlement.opens, "why": settlement.why, "disputed": sorted(settlement.disputed),
                       "kept": sorted(settlement.kept), "exposed_if_opened": sorted(settlement.exposed),
                       "honest_lost": settlement.honest_lost, "colluders_lost": settlement.colluders_lost}
    if completed:
        contributors = set(event["contributors"])
        faulty = {int(c): why for c, why in event["faulty"].items()}
        out |= {"sum_ok": event.get("sum_ok"), "contributors": sorted(contributors), "dropped": event["dropped"],
                "faulty": event["faulty"], "rejected": event["rejected"], "round_seconds": event["round_seconds"]}
        misjudged = []
        for i, name in plan.attacks.items():
            spec = ATTACKS[name]
            wrong = ""
            if i in participants and (spec.outcome == DROPPED and i in contributors
                                      or spec.outcome == COUNTED and i not in contributors):
                wrong = f"insider {i} ({name}) {'counted' if i in contributors else 'dropped'}"
            elif i in participants and spec.faulty and not re.search(spec.faulty, faulty.get(i, "")):
                wrong = f"insider {i} ({name}) not named faulty for it: {faulty.get(i, 'not named')!r}"
            if wrong:
                misjudged.append(wrong)
            verdicts[name] = verdicts.get(name, True) and not wrong
        if settlement is not None and (not settlement.opens or set(faulty) != settlement.disputed
                                       or contributors != settlement.kept):
            misjudged.append(f"the server's settlement (faulty {sorted(faulty)}, contributors {sorted(contributors)}) "
                             f"is not its rule's ({out['rule']})")
            for name in set(plan.attacks.values()):
                verdicts[name] = False
        secagg_like = judge.threat.partners is not None
        mask_with = view.mask_with(plan.round_id) if secagg_like else None
        ring = _sum_ring(protocol)
        opened = synthetic_sum(contributors, plan.round_id, cfg.dim, ring=ring) if event.get("sum_ok") else None
        recovered = recovered_inputs(contributors=contributors, colluders=cfg.insiders, mask_with=mask_with,
                                     group=cfg.group, opened=opened,
                                     inputs=lambda c: synthetic_input(c, plan.round_id, cfg.dim), ring=ring)
        small = small_groups(contributors=contributors, colluders=cfg.insiders, mask_with=mask_with, group=cfg.group)
        waited = silent_stages(dropped=event["dropped"], faulty=faulty)
        honest_seconds = view.honest_stage_seconds(plan.round_id, waited=waited)
        out |= {"misjudged": misjudged, "recovered": sorted(recovered), "small_groups": [sorted(g) for g in small],
                "honest_dropped": sorted(set(faulty) - set(cfg.insiders)),
                "colluders_dropped": sorted(set(faulty) & set(cfg.insiders)),
                "honest_seats_lost": len(participants - contributors - set(cfg.insiders)),
                "stage_seconds": event["stage_seconds"], "waited_stages": waited,
                "honest_stage_seconds": {k: round(v, 4) for k, v in honest_seconds.items()},
                "bound_s": round(round_time_bound(honest_seconds=honest_seconds, server_seconds=event["server_seconds"],
                                                  waited=waited), 4),
                "honest_quorum": len(participants - set(cfg.insiders)) >= judge.need.need}
        if recovered or small:
            for name in set(plan.attacks.values()):
                verdicts[name] = False
    else:
        out["error"] = event.get("error")
        if settlement is not None:  # refused by the rule: it must abort, and before anything is unmasked
            stage = re.search(r"aborted at stage '([^']+)'", event.get("error") or "")
            ok = not settlement.opens and stage is not None and stage.group(1) not in ("unmask", "recovery")
            for name in set(plan.attacks.values()):
                verdicts[name] = ok
    out["verdicts"] = verdicts
    return out


# ---- a server that chooses the dropouts (in this process) -------------------------------------------

def run_withholding_phase(cfg: CampaignConfig, protocol: str, keys: Path) -> PhaseResult:
    """WITHHOLD_ROUNDS against a `ServerDriver` in this process whose protocol withholds the masked
    inputs of a victim's honest partners (`insider_attacks.withholding_server`); the insiders collude
    with it (`collude`: they sign any survivor set and reveal what they hold for it)."""
    server_cls = registry.server_class(protocol)
    params = _params(protocol, cfg)
    curve, roster = load_server(keys)
    view = ServerView()
    coalition = Coalition(members=cfg.insiders)
    plans = {r: RoundPlan(r, {}, {i: "collude" for i in cfg.insiders}) for r in range(1, len(WITHHOLD_ROUNDS) + 1)}
    result = PhaseResult(protocol, phase="withhold")
    ctx = zmq.Context()
    stop = threading.Event()
    threads: list[threading.Thread] = []
    ring = _sum_ring(protocol)
    try:
        with ServerDriver("tcp://127.0.0.1:*", config=ServerConfig(session=f"{protocol} length={cfg.dim}"),
                          curve=curve) as driver:
            honest_logs, insiders, threads = _start_clients(
                cfg=cfg, protocol=protocol, keys=keys, endpoint=driver.endpoint, honest_endpoints={}, plans=plans,
                view=view, coalition=coalition, ctx=ctx, stop=stop)
            driver.wait_for_clients(count=len(cfg.clients), timeout=60)
            for round_id, name in enumerate(WITHHOLD_ROUNDS, start=1):
                cls = withholding_server(server_cls, colluders=cfg.insiders, unchecked=name.endswith("unchecked"))
                proto = cls(round_id=round_id, clients=sorted(driver.clients), length=cfg.dim,
                            **registry.with_enrolment(cls, params, roster=roster))
                try:
                    report = driver.run_round(proto, stage_timeout=cfg.stage_timeout)
                except AbortError as exc:
                    report, error = None, str(exc)
                rec = {"round": round_id, "protocol": protocol, "phase": "withhold", "attack": name,
                       "completed": report is not None, "in_R": False, "victim": proto.victim,
                       "withheld": sorted(proto.withheld), "attacks": {}}
                if report is None:
                    rec["error"] = error
                    rec["verdicts"] = {name: True}
                else:
                    res = report.result
                    contributors = set(res.contributors)
                    mask_with = dict(proto._mask_with) if hasattr(proto, "_mask_with") else None
                    expected = synthetic_sum(contributors, round_id, cfg.dim, ring=ring)
                    recovered = recovered_inputs(contributors=contributors, colluders=cfg.insiders, mask_with=mask_with,
                                                 group=cfg.group, opened=res.ring_sum,
                                                 inputs=lambda c: synthetic_input(c, round_id, cfg.dim), ring=ring)
                    small = small_groups(contributors=contributors, colluders=cfg.insiders, mask_with=mask_with,
                                         group=cfg.group)
                    rec |= {"sum_ok": bool(np.array_equal(expected, res.ring_sum)),
                            "contributors": sorted(contributors),
                            "faulty": {str(c): w for c, w in sorted(res.faulty.items())},
                            "recovered": sorted(recovered), "small_groups": [sorted(g) for g in small],
                            "honest_dropped": sorted(set(res.faulty) - set(cfg.insiders)),
                            "colluders_dropped": sorted(set(res.faulty) & set(cfg.insiders)),
                            "verdicts": {name: not recovered and not small and proto.victim not in recovered}}
                result.rounds.append(rec)
            result.honest = {c: asdict(h) for c, h in honest_logs.items()}
            result.insiders = {i: asdict(ins.log) for i, ins in insiders.items()}
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        if not any(t.is_alive() for t in threads):
            ctx.term()
    result.exit_code = 0
    return result


# ---- the campaign ------------------------------------------------------------------------------

def summarise(phases: list[PhaseResult], cfg: CampaignConfig) -> dict:
    rounds = [r for p in phases for r in p.rounds]
    crashes = sum(p.exit_code not in (0, 1) for p in phases)
    crashes += sum(any("Traceback" in e for e in p.server_errors) for p in phases)
    crashes += sum(r.get("rejected", {}).get("protocol_error", 0) for r in rounds)
    crashes += sum(len(h["errors"]) > 0 for p in phases for h in p.honest.values())
    timed = [r for r in rounds if r["completed"] and r.get("honest_quorum")]
    slowest = max(timed, key=lambda r: r["round_seconds"], default=None)
    honest_ids = {p.protocol + p.phase: set(p.honest) for p in phases}
    return {
        "rounds": sum(r["in_R"] for r in rounds),
        "rounds_completed": sum(r["in_R"] and r["completed"] and r.get("sum_ok") is True for r in rounds),
        "wrong_sums": sum(r.get("sum_ok") is False for r in rounds),
        "crashes": crashes,
        "sybil_accepted": sum(sum(p.network.get("accepted", {}).values()) for p in phases),
        "peak_rss_over_baseline_mb": max((p.peak_rss_over_baseline_mb for p in phases), default=0.0),
        "recovered_inputs": sum(len(r.get("recovered", ())) for r in rounds),
        "honest_dropped": sum(len(r.get("honest_dropped", ())) for r in rounds),
        "colluders_dropped": sum(len(r.get("colluders_dropped", ())) for r in rounds),
        "honest_seats_lost": sum(r.get("honest_seats_lost", 0) for r in rounds if r.get("rule")),
        "honest_seats_disputed": sum(len(r.get("honest_dropped", ())) for r in rounds if r.get("rule")),
        "colluder_seats_lost": sum(len(r.get("colluders_dropped", ())) for r in rounds if r.get("rule")),
        "max_round_s": round(slowest["round_seconds"], 3) if slowest else 0.0,
        "round_time_bound_s": round(slowest["bound_s"], 3) if slowest else 0.0,
        "slowest_round": f"{slowest['protocol']}/{slowest['phase']}/{slowest['round']}" if slowest else "",
        "rounds_over_bound": sum(r["round_seconds"] > r["bound_s"] for r in timed),
        "small_groups": sum(len(r.get("small_groups", ())) for r in rounds),
        "misjudged": sum(len(r.get("misjudged", [])) for r in rounds),
        "stallers_not_evicted": sum(i not in p.evicted for p in phases for i in p.stallers),
        "honest_evicted": sum(len(set(p.evicted) & honest_ids[p.protocol + p.phase]) for p in phases),
        "model_mb": round(4 * (cfg.dim + 1) / 2**20, 3),
    }


def goal_met(summary: dict) -> bool:
    return (summary["rounds_completed"] == summary["rounds"] and summary["wrong_sums"] == 0
            and summary["crashes"] == 0 and summary["sybil_accepted"] == 0 and summary["recovered_inputs"] == 0
            and summary["honest_dropped"] <= summary["colluders_dropped"] and summary["rounds_over_bound"] == 0
            and summary["misjudged"] == 0 and summary["small_groups"] == 0
            and summary["stallers_not_evicted"] == 0 and summary["honest_evicted"] == 0
            and summary["peak_rss_over_baseline_mb"] < RSS_BOUND_MB + summary["model_mb"])


def attack_table(phases: list[PhaseResult]) -> list[str]:
    """Per insider attack: rounds run, and how many ended as the server (and the clients) must make them
    end. Rounds that aborted count only for the attacks judged by the server's rule (accusations) and
    the malicious-server rounds (which must abort or leave the victim unexposed)."""
    runs: Counter = Counter()
    right: Counter = Counter()
    for p in phases:
        for r in p.rounds:
            for name, ok in r.get("verdicts", {}).items():
                if name == "honest":
                    continue
                key = f"{name}" + ("" if p.phase == "attack" else f" ({p.phase})")
                runs[key] += 1
                right[key] += ok
    lines = [f"{'insider attack':<30} {'expected':<18} rounds  as_expected"]
    for key in sorted(runs):
        name = key.split(" ")[0]
        expected = ATTACKS[name].outcome if name in ATTACKS else "abort_or_unexposed"
        lines.append(f"{key:<30} {expected:<18} {runs[key]:>6}  {right[key]:>11}")
    return lines


def coalition_lines(phases: list[PhaseResult]) -> list[str]:
    """One line per accusation and malicious-server round: what the coalition tried and what came of it."""
    lines = []
    for p in phases:
        for r in p.rounds:
            if "rule" in r:
                name = next(iter(set(r["attacks"].values())))
                outcome = (f"opened: contributors {r.get('contributors')}, recovered {r.get('recovered')}"
                           if r["completed"] else f"aborted: {r.get('error')}")
                lines.append(f"  {p.protocol} {p.phase} round {r['round']} {name}: {r['maps_searched']} maps, "
                             f"accused {r['accusations']}; rule: {r['rule']['why']}, disputed "
                             f"{r['rule']['disputed']}; {outcome}")
            elif p.phase == "withhold":
                outcome = (f"opened: contributors {r.get('contributors')}, recovered {r.get('recovered')}"
                           if r["completed"] else f"aborted: {r.get('error')}")
                lines.append(f"  {p.protocol} withhold round {r['round']} {r['attack']}: victim {r['victim']}, "
                             f"withheld {r['withheld']}; {outcome}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="the default sizes (8 honest clients, d=1000, 8 attack rounds)")
    p.add_argument("--full", action="store_true", help="16 honest clients, d=100000, 16 attack rounds")
    p.add_argument("--protocols", default=",".join(QUICK.protocols), help="comma list (default all three)")
    p.add_argument("--out", type=Path, help="write every round's record and the summary here as JSON")
    args = p.parse_args(argv)
    if args.quick and args.full:
        p.error("--quick and --full contradict each other")
    base = FULL if args.full else QUICK
    try:
        protocols = tuple(x for x in args.protocols.split(",") if x)
        cfg = replace(base, protocols=protocols, five_protocols=tuple(x for x in base.five_protocols if x in protocols))
        for protocol in cfg.protocols:
            schedule(cfg, protocol)
        for protocol in cfg.five_protocols:
            five_schedule(cfg.five(), protocol)
    except ValueError as exc:
        p.error(str(exc))
    if args.out is not None and not args.out.resolve().parent.is_dir():
        p.error(f"--out {args.out}: its folder does not exist")

    # The in-process server and clients log every message they drop; the campaign reports outcomes.
    logging.getLogger("transport").setLevel(logging.ERROR)
    phases = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="attack-campaign-") as tmp:
        keys = Path(tmp) / "keys"
        enrol(keys, clients=range(1, max(len(cfg.clients), len(cfg.five().clients)) + 1))
        runs = [(protocol, "attack") for protocol in cfg.protocols]
        runs += [(protocol, "five") for protocol in cfg.five_protocols]
        runs += [(protocol, "withhold") for protocol in cfg.protocols if cfg.withhold]
        for protocol, phase_name in runs:
            if phase_name == "attack":
                phase = run_phase(cfg, protocol, keys, Path(tmp))
            elif phase_name == "five":
                five = cfg.five()
                phase = run_phase(five, protocol, keys, Path(tmp), plans=five_schedule(five, protocol), phase="five",
                                  network=False)
            else:
                phase = run_withholding_phase(cfg, protocol, keys)
            phases.append(phase)
            done = sum(r["completed"] for r in phase.rounds)
            line = (f"{protocol} {phase_name}: {len(phase.rounds)} rounds, {done} completed, "
                    f"server exit {phase.exit_code}")
            if phase_name != "withhold":
                line += f", peak RSS +{phase.peak_rss_over_baseline_mb} MB, evicted {sorted(phase.evicted)}"
            if phase.network.get("attempts"):
                line += (f", network attempts {phase.network.get('attempts')}, accepted "
                         f"{phase.network.get('accepted')}, unauthenticated stream bytes taken "
                         f"{phase.network.get('flood_bytes')}")
            print(line, flush=True)
            for r in phase.rounds:
                if (r.get("misjudged") or r.get("sum_ok") is False or (r["in_R"] and not r["completed"])
                        or r.get("recovered") or r.get("small_groups")
                        or (r.get("honest_quorum") and r["round_seconds"] > r["bound_s"])):
                    print(f"  round {r['round']}: {json.dumps(r, default=str)}", flush=True)
    summary = summarise(phases, cfg)
    print("\n".join(attack_table(phases)))
    print("coalition rounds:")
    print("\n".join(coalition_lines(phases)))
    if args.out is not None:
        args.out.write_text(json.dumps({"config": asdict(cfg), "summary": summary,
                                        "phases": [asdict(p) for p in phases]}, indent=1, default=str))
    met = goal_met(summary)
    print(f"seconds={time.perf_counter() - t0:.0f} misjudged_insiders={summary['misjudged']} "
          f"small_groups={summary['small_groups']} stallers_not_evicted={summary['stallers_not_evicted']} "
          f"honest_evicted={summary['honest_evicted']} goal_met={met}")
    print(f"opened accusation rounds: honest seats lost {summary['honest_seats_lost']} (disputed "
          f"{summary['honest_seats_disputed']}, short of partners after them "
          f"{summary['honest_seats_lost'] - summary['honest_seats_disputed']}), colluder seats lost "
          f"{summary['colluder_seats_lost']}")
    print(f"round_time_bound_s={summary['round_time_bound_s']} slowest_round={summary['slowest_round']} "
          f"rounds_over_bound={summary['rounds_over_bound']}")
    print("attack_campaign " + " ".join(f"{k}={summary[k]}" for k in (
        "rounds", "rounds_completed", "wrong_sums", "crashes", "sybil_accepted", "peak_rss_over_baseline_mb",
        "recovered_inputs", "honest_dropped", "colluders_dropped", "max_round_s")))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
