"""Attack campaign: a real enrolled deployment over loopback tcp, attacked in bounded ways.

    python benchmarks/attack_campaign.py --quick         # about 3 minutes on 2 cores
    python benchmarks/attack_campaign.py --out campaign.json

For each protocol (SecAgg, SecAgg+ on a sparse graph, LightSecAgg) the server is the shipped
command, `python -m transport.cli server --keys ... --check --rejoin-timeout ...`, in its own
process, with CurveZMQ, the client allowlist and signed round keys from `transport.enrolment`.
Honest clients run the shipped client driver (`transport.client.run_client`) in threads of this
process; one of them reaches the server through a TCP relay that records its (encrypted) session.
Every round after a warm-up round, at the same time:

- an honest client crashes at a stage that moves through the protocol's stages round by round,
  and restarts (it is back for the next round: the server waits `--rejoin-timeout` for it);
- two *enrolled* insiders (`transport.adversary.Insider`: real keys, real client protocol) attack:
  the first with an attack the server must answer by dropping it (corrupt shares, a low-order key,
  a forged signature, a malformed or an oversized reply, a 256 MiB flood), the second with one
  it must shrug off while still counting its valid reply (garbage, replays, a spoofed sender,
  replies of the wrong stage);
- network attackers without enrolment: unenrolled CurveZMQ keys (sybils) registering new and
  honest ids, an insider's key claiming honest ids (id squatting), NULL-mechanism peers flooding
  maximum-size frames and a never-ending message, and replays of the recorded honest session.
One round per protocol is starved on purpose (every honest client crashes at the first stage): it
must abort cleanly and the rounds after it must recover.

R counts the rounds that enough clients followed to the end: those where the clients that did
not crash and whose replies stay valid reach the protocol's own minimum (LightSecAgg's target U;
SecAgg's threshold; for SecAgg+ also no more clients removed than a neighbourhood can lose).
The schedule is checked to make every round clearly one or the other. Last line:

    attack_campaign rounds=R rounds_completed=C wrong_sums=W crashes=X sybil_accepted=S peak_rss_over_baseline_mb=M

wrong_sums counts rounds whose opened sum differs from the exact sum of the contributors' inputs;
crashes counts server exits other than 0/1, tracebacks, protocol exceptions on hostile input and
honest clients that died of anything but their scheduled crash; sybil_accepted counts welcomes
given to unenrolled or squatting connections and replayed sessions the server admitted; peak RSS
is the server's high-water mark (VmHWM, read until it exits) over its value after the warm-up round. The goal:
C = R, W = X = S = 0, M < 200 MB plus the model (the summed vector). Exit code 1 if it is missed.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import zmq

from secagg.protocols import registry
from secagg.protocols.base import WrappedClient
from transport import adversary
from transport.adversary import ATTACKS, COUNTED, DROPPED, Insider, RawPeer, TcpRecorder
from transport.cli import synthetic_input
from transport.client import ClientConfig, RegistrationError, ClientSession, run_client
from transport.enrolment import enrol, load_client, load_roster
from transport.sockets import CurveClientKeys, curve_keypair

ROOT = Path(__file__).resolve().parents[1]
RSS_BOUND_MB = 200.0

PROTOCOL_PARAMS: dict[str, tuple[str, ...]] = {
    "secagg": (),
    "secagg+": ("degree=4",),                  # sparse: 4 neighbours of 9, so SecAgg+ is not SecAgg
    "lightsecagg": ("target_survivors=0.6",),  # U = 6 of 10: room for one crash and one dropped insider
}
DROP_ATTACKS = ("corrupt_shares", "corrupt_some_shares", "low_order_key", "bad_signature", "malformed", "oversized", "flood")
KEEP_ATTACKS = ("garbage", "replay", "spoof", "wrong_stage")


@dataclass(frozen=True)
class CampaignConfig:
    protocols: tuple[str, ...] = ("secagg", "secagg+", "lightsecagg")
    honest: int = 8
    dim: int = 1000
    attack_rounds: int = 8
    """Rounds after the warm-up round, per protocol (one of them starved on purpose): with 8, every
    insider attack runs at least once in a round that can finish."""
    stage_timeout: float = 4.0
    sybils: int = 4
    squatters: int = 2
    replays: int = 3
    flood_mib: int = 256
    """Bytes the NULL-mechanism peers push at the server, per protocol."""

    def __post_init__(self) -> None:
        if self.honest < 4 or self.attack_rounds < 2 or self.dim < 1:
            raise ValueError("need at least 4 honest clients, 2 attack rounds and dim >= 1")
        unknown = set(self.protocols) - set(PROTOCOL_PARAMS)
        if unknown:
            raise ValueError(f"no campaign for protocols {sorted(unknown)}; choose from {sorted(PROTOCOL_PARAMS)}")

    @property
    def insiders(self) -> tuple[int, int]:
        return (self.honest + 1, self.honest + 2)

    @property
    def clients(self) -> tuple[int, ...]:
        return tuple(range(1, self.honest + 3))


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


@dataclass(frozen=True)
class Requirement:
    """What a round of `protocol` needs to finish, read from the server protocol itself."""

    need: int
    slack: int | None
    """Most clients a SecAgg+ neighbourhood may lose (None: complete graph, no such limit)."""

    def finishable(self, *, live: int, removed: int) -> bool:
        return live >= self.need and (self.slack is None or removed <= self.slack)

    def hopeless(self, *, live: int) -> bool:
        return live < self.need


def requirement(protocol: str, clients: tuple[int, ...], length: int) -> Requirement:
    cls = registry.server_class(protocol)
    server = cls(round_id=1, clients=clients, length=length, **_params(protocol))
    if hasattr(server, "target"):
        return Requirement(need=server.target, slack=None)
    degree = max(len(v) for v in server.graph.values())
    complete = degree == len(clients) - 1
    return Requirement(need=server.min_clients, slack=None if complete else degree + 1 - server.threshold)


def _params(protocol: str) -> dict[str, object]:
    from transport.cli import parse_params

    return parse_params(list(PROTOCOL_PARAMS[protocol]))


def stage_count(protocol: str) -> int:
    return len(registry.client_class(protocol).schemas)


def schedule(cfg: CampaignConfig, protocol: str) -> list[RoundPlan]:
    """Round 1 is a clean warm-up; then one honest crash per round at a rotating stage, one dropped
    and one counted insider attack per round, and one starved round in the middle."""
    honest = list(range(1, cfg.honest + 1))
    stages = stage_count(protocol)
    starved_round = 2 + cfg.attack_rounds // 2
    plans = [RoundPlan(1, {}, {i: "honest" for i in cfg.insiders})]
    k = 0  # attacks and crashes rotate over the rounds that can finish
    for r in range(2, cfg.attack_rounds + 2):
        attacks = {cfg.insiders[0]: DROP_ATTACKS[k % len(DROP_ATTACKS)],
                   cfg.insiders[1]: KEEP_ATTACKS[k % len(KEEP_ATTACKS)]}
        if r == starved_round:
            plans.append(RoundPlan(r, {c: 0 for c in honest}, attacks, starved=True))
            continue
        plans.append(RoundPlan(r, {honest[k % len(honest)]: k % stages}, attacks))
        k += 1
    need = requirement(protocol, cfg.clients, cfg.dim)
    for plan in plans:
        live, removed = expected_live(plan, cfg.clients, cfg.insiders)
        ok = need.finishable(live=live, removed=removed)
        if ok == plan.starved or (plan.starved and not need.hopeless(live=live)):
            raise ValueError(f"{protocol} round {plan.round_id}: {live} live clients against {need} make it "
                             f"neither clearly finishable nor clearly starved; change the campaign's sizes")
    return plans


def expected_live(plan: RoundPlan, participants, insiders) -> tuple[int, int]:
    """(clients that follow the round to its end, clients removed from it) if all of `participants` start it."""
    participants = set(participants)
    removed = set(plan.crashes) & participants
    removed |= {i for i in insiders if i in participants and ATTACKS[plan.attacks[i]].outcome != COUNTED}
    return len(participants - removed), len(removed)


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
               plans: dict[int, RoundPlan], context: zmq.Context, stop: threading.Event, log: HonestLog) -> None:
    curve, identity = load_client(keys, client_id)
    cls = registry.client_class(protocol)

    def factory(round_id: int):
        proto = cls(client_id=client_id, round_id=round_id, input_fn=lambda: synthetic_input(client_id, round_id, dim),
                    **registry.with_enrolment(cls, {}, identity=identity))
        plan = plans.get(round_id)
        if plan is not None and client_id in plan.crashes:
            return _CrashAt(proto, plan.crashes[client_id])
        return proto

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
    rounds: list[dict] = field(default_factory=list)
    exit_code: int | None = None
    peak_rss_over_baseline_mb: float = 0.0
    server_errors: list[str] = field(default_factory=list)
    honest: dict[int, dict] = field(default_factory=dict)
    insiders: dict[int, dict] = field(default_factory=dict)
    network: dict = field(default_factory=dict)


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


def run_phase(cfg: CampaignConfig, protocol: str, keys: Path, workdir: Path) -> PhaseResult:
    plans = {p.round_id: p for p in schedule(cfg, protocol)}
    need = requirement(protocol, cfg.clients, cfg.dim)
    session_text = f"{protocol} length={cfg.dim}"
    endpoint_file = workdir / f"{protocol}.endpoint"
    cmd = [sys.executable, "-m", "transport.cli", "server", "--keys", str(keys), "--protocol", protocol,
           "--clients", str(len(cfg.clients)), "--dim", str(cfg.dim), "--rounds", str(len(plans)), "--check",
           "--stage-timeout", str(cfg.stage_timeout), "--register-timeout", "60", "--rejoin-timeout", "20",
           "--endpoint-file", str(endpoint_file)]
    for p in PROTOCOL_PARAMS[protocol]:
        cmd += ["--param", p]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    server = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stderr_lines: list[str] = []
    threading.Thread(target=lambda: stderr_lines.extend(server.stderr), daemon=True).start()
    result = PhaseResult(protocol)
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
        recorder = TcpRecorder(endpoint)
        server_key, _, _ = load_roster(keys)
        honest_logs = {c: HonestLog() for c in range(1, cfg.honest + 1)}
        for c, hlog in honest_logs.items():
            t = threading.Thread(target=run_honest, daemon=True, kwargs=dict(
                endpoint=recorder.endpoint if c == 1 else endpoint, client_id=c, protocol=protocol, keys=keys,
                dim=cfg.dim, session_text=session_text, plans=plans, context=ctx, stop=stop, log=hlog))
            t.start()
            threads.append(t)
        insiders = {}
        for i in cfg.insiders:
            curve, identity = load_client(keys, i)
            insiders[i] = Insider(
                endpoint=endpoint, client_id=i, protocol=protocol, curve=curve, identity=identity,
                session_text=session_text, plan=lambda r, i=i: plans[r].attacks[i] if r in plans else "honest",
                input_fn=lambda r, i=i: synthetic_input(i, r, cfg.dim), honest=range(1, cfg.honest + 1),
                max_reply_bytes=_max_reply_bytes(protocol, cfg), context=ctx)
            t = threading.Thread(target=insiders[i].run, args=(stop,), daemon=True)
            t.start()
            threads.append(t)

        # VmHWM is a high-water mark: read until the process is gone, its last value is the peak.
        # (Not ru_maxrss from wait4: Linux folds the forked parent's RSS before exec into it.)
        peaks: list[int] = []
        watch = threading.Thread(target=_watch_hwm, args=(server, peaks), daemon=True)
        watch.start()
        baseline = None
        network = NetworkLog()
        for line in server.stdout:
            event = json.loads(line)
            if event.get("event") not in ("round", "aborted"):
                continue
            result.rounds.append(_judge(event, plans[event["round"]], cfg, need, protocol))
            if event["round"] == 1 and baseline is None:
                baseline = _vm_hwm(server.pid)
                threads += network_attacks(cfg=cfg, endpoint=endpoint, server_key=server_key.encode(),
                                           insider_curve=load_client(keys, cfg.insiders[0])[0],
                                           session_text=session_text, recorder=recorder, context=ctx,
                                           stop=stop, log=network)
        server.wait()
        watch.join()
        result.exit_code = server.returncode
        peak = max(peaks, default=0)
        result.peak_rss_over_baseline_mb = round((peak - (baseline or peak)) / 2**20, 1)
        result.server_errors = [line.strip() for line in stderr_lines if "Traceback" in line or "Error" in line][:20]
        result.honest = {c: asdict(h) for c, h in honest_logs.items()}
        result.insiders = {i: asdict(ins.log) for i, ins in insiders.items()}
        result.network = {"attempts": dict(network.attempts), "accepted": dict(network.accepted),
                          "flood_bytes": network.flood_bytes}
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
    cls = registry.server_class(protocol)
    return cls(round_id=1, clients=cfg.clients, length=cfg.dim, **_params(protocol)).max_reply_bytes()


def _judge(event: dict, plan: RoundPlan, cfg: CampaignConfig, need: Requirement, protocol: str) -> dict:
    """One round's line from the server, with what the campaign expected of it."""
    completed = event["event"] == "round"
    if completed:
        participants = set(event["contributors"]).union(*map(set, event["dropped"].values()))
    else:
        participants = set(cfg.clients)  # an aborted round does not say: assume everyone had rejoined
    live, removed = expected_live(plan, participants, cfg.insiders)
    out = {"round": event["round"], "protocol": protocol, "completed": completed, "starved": plan.starved,
           "in_R": need.finishable(live=live, removed=removed) and plan.round_id > 1,
           "live": live, "crashes": plan.crashes, "attacks": plan.attacks}
    if completed:
        contributors = set(event["contributors"])
        out |= {"sum_ok": event.get("sum_ok"), "contributors": sorted(contributors), "dropped": event["dropped"],
                "faulty": event["faulty"], "rejected": event["rejected"]}
        misjudged = []
        for i, name in plan.attacks.items():
            outcome = ATTACKS[name].outcome
            if i in participants and (outcome == DROPPED and i in contributors
                                      or outcome == COUNTED and i not in contributors):
                misjudged.append(f"insider {i} ({name}) {'counted' if i in contributors else 'dropped'}")
        out["misjudged"] = misjudged
    else:
        out["error"] = event.get("error")
    return out


# ---- the campaign ------------------------------------------------------------------------------

def summarise(phases: list[PhaseResult], cfg: CampaignConfig) -> dict:
    rounds = [r for p in phases for r in p.rounds]
    crashes = sum(p.exit_code not in (0, 1) for p in phases)
    crashes += sum(any("Traceback" in e for e in p.server_errors) for p in phases)
    crashes += sum(r.get("rejected", {}).get("protocol_error", 0) for r in rounds)
    crashes += sum(len(h["errors"]) > 0 for p in phases for h in p.honest.values())
    return {
        "rounds": sum(r["in_R"] for r in rounds),
        "rounds_completed": sum(r["in_R"] and r["completed"] and r.get("sum_ok") is True for r in rounds),
        "wrong_sums": sum(r.get("sum_ok") is False for r in rounds),
        "crashes": crashes,
        "sybil_accepted": sum(sum(p.network.get("accepted", {}).values()) for p in phases),
        "peak_rss_over_baseline_mb": max((p.peak_rss_over_baseline_mb for p in phases), default=0.0),
        "misjudged": sum(len(r.get("misjudged", [])) for r in rounds),
        "model_mb": round(4 * (cfg.dim + 1) / 2**20, 3),
    }


def attack_table(phases: list[PhaseResult]) -> list[str]:
    """Per insider attack: rounds run, and how many ended as the server must make them end."""
    runs: Counter = Counter()
    right: Counter = Counter()
    for p in phases:
        for r in p.rounds:
            for i, name in r["attacks"].items():
                if name == "honest" or not r["completed"]:
                    continue
                runs[name] += 1
                right[name] += not any(m.startswith(f"insider {i} ") for m in r["misjudged"])
    lines = [f"{'insider attack':<20} {'expected':<9} rounds  as_expected"]
    for name in sorted(runs):
        lines.append(f"{name:<20} {ATTACKS[name].outcome:<9} {runs[name]:>6}  {right[name]:>11}")
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
        cfg = CampaignConfig(**{**asdict(base), "protocols": tuple(x for x in args.protocols.split(",") if x)})
        for protocol in cfg.protocols:
            schedule(cfg, protocol)
    except ValueError as exc:
        p.error(str(exc))
    if args.out is not None and not args.out.resolve().parent.is_dir():
        p.error(f"--out {args.out}: its folder does not exist")

    phases = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="attack-campaign-") as tmp:
        keys = Path(tmp) / "keys"
        enrol(keys, clients=cfg.clients)
        for protocol in cfg.protocols:
            phase = run_phase(cfg, protocol, keys, Path(tmp))
            phases.append(phase)
            done = sum(r["completed"] for r in phase.rounds)
            print(f"{protocol}: {len(phase.rounds)} rounds, {done} completed, server exit {phase.exit_code}, "
                  f"peak RSS +{phase.peak_rss_over_baseline_mb} MB, network attempts {phase.network.get('attempts')}, "
                  f"accepted {phase.network.get('accepted')}, unauthenticated stream bytes taken "
                  f"{phase.network.get('flood_bytes')}", flush=True)
            for r in phase.rounds:
                if r.get("misjudged") or r.get("sum_ok") is False or (r["in_R"] and not r["completed"]):
                    print(f"  round {r['round']}: {json.dumps(r)}", flush=True)
    summary = summarise(phases, cfg)
    print("\n".join(attack_table(phases)))
    if args.out is not None:
        args.out.write_text(json.dumps({"config": asdict(cfg), "summary": summary,
                                        "phases": [asdict(p) for p in phases]}, indent=1, default=str))
    met = (summary["rounds_completed"] == summary["rounds"] and summary["wrong_sums"] == 0 and summary["crashes"] == 0
           and summary["sybil_accepted"] == 0 and summary["misjudged"] == 0
           and summary["peak_rss_over_baseline_mb"] < RSS_BOUND_MB + summary["model_mb"])
    print(f"seconds={time.perf_counter() - t0:.0f} misjudged_insiders={summary['misjudged']} goal_met={met}")
    print("attack_campaign " + " ".join(f"{k}={summary[k]}" for k in (
        "rounds", "rounds_completed", "wrong_sums", "crashes", "sybil_accepted", "peak_rss_over_baseline_mb")))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
