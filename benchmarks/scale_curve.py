"""How secure aggregation grows: one round of plain, SecAgg, SecAgg+ and LightSecAgg at N clients,
d parameters and a dropout rate at the masked-input stage, every party in this process.

    python -m benchmarks.scale_curve --quick    # d = 1e5, N up to 500: < 10 minutes on 2 cores
    python -m benchmarks.scale_curve            # d in {1e5, 1e6}, N up to 1000
    python -m benchmarks.scale_curve --dims 1e7,1e8 --sizes 10,50 --protocols plain,secagg+ --cap 400

Per (protocol, N, d, dropout) it measures, in one run:

    server_s        CPU seconds of the server's protocol code (start, accept, advance, result)
    client_max_s    the slowest client's CPU seconds over the round
    round_s         the critical path: per stage, the server's CPU plus the slowest client's in that
                    stage, summed (what a deployment whose clients run in parallel would wait, less
                    the network; see --latency in docs for round trips)
    up_B / down_B   payload bytes per client sent to / received from the server (median client)
    server_peak_MB  the server's peak memory: what it allocated and still held, the received replies
                    it still references, and the most it allocated within one step (tracemalloc, a
                    separate round)

A protocol stops at the first N whose round would take this process more than --cap CPU seconds to
simulate (server and all N clients, one after another), predicted from the previous N (N^2 for
SecAgg, whose complete graph makes every client's work O(N) by design; N^1.3 for the others, times
the growth of its degree for SecAgg+). Each protocol's growth exponent in N is the least-squares slope of log(server_s) against
log(N) at dropout 0 (N >= 50). Flower's SecAgg+ runs beside it at the sizes it finishes within the
cap if it is installed (`make bench-flower`). Writes scale.csv, scale.md and scale.png under
--out, and ends with one line per protocol:

    scale protocol=secagg+ n_max=.. exponent=.. seconds_at_nmax=.. bytes_per_client_at_nmax=..

(seconds_at_nmax: the critical-path round seconds at n_max, d = the smallest d, 10% dropout;
bytes: upload per client there). LightSecAgg wins over SecAgg+ where its round is shorter: the
crossover dropout, if any, is printed per N.

Large d (`--dims 1e6,1e7,1e8`): from d = --lazy-from (default 1e7) each point runs in a child process of
its own (`run_child`), its inputs generated on demand from a seed (`lazy_input`; the seconds that takes
are not the client's) and regenerated for the exact-sum check, so that no process ever holds N inputs;
instead of the traced server memory the child reports its peak resident memory (VmHWM: the server, the
one client running and the interpreter, `peak_rss_MB`, with `base_rss_MB` before the round). A point is
not run where the same protocol, N and dropout at the next smaller d, scaled by d, predicts more than
--cap CPU seconds, or where `estimated_bytes` predicts more than --max-gib GiB in one process
(LightSecAgg: in one process its clients' masks are O(N d)); each such stop is printed
with its reason. Then one line per secure protocol:

    scale_d protocol=secagg+ d_max=.. n=.. seconds=.. plain_seconds=.. peak_rss_mb=..

(d_max: the largest d it finished at the dropout closest to 10%; n: the largest N there; plain_seconds:
plain's round at the same point; peak_rss_mb: the child's VmHWM), `scale_d.png` (round seconds and
peak RSS against d) and `scale_d.md` (the same points as a table: plain, SecAgg+ and LightSecAgg side by
side per d, N and dropout). --quick adds plain and SecAgg+ at d = 1e7, N = 10, so it always ends with a
`scale_d protocol=secagg+ d_max=1e+07 ...` line.

SecAgg+ is configured per (N, dropout) from the threat model, not with the fixed 2 log2 N degree:
`secagg.plus_params.plus_parameters(n=N, dropout=rate, corrupt_fraction=--corrupt)` gives the
smallest degree k and threshold t with security failure <= 2^-40 and abort <= 2^-30 at that dropout
(corrupt clients counted as possible dropouts too); each configuration prints its `secagg+ n=.. k=..
t=..` line before its round.
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import os
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from secagg.messages import AbortError, Message, ProtocolError
from secagg.plus_params import PlusParameters, plus_parameters
from secagg.prg import field_mask
from secagg.protocols import registry
from secagg.protocols.base import reply_messages
from secagg.protocols.secagg import threshold_for

PROTOCOLS = ("plain", "secagg", "secagg+", "lightsecagg")
MASKED_STAGE = {"plain": "collect", "secagg": "masked", "secagg+": "masked", "lightsecagg": "masked_input"}
DEFAULT_CORRUPT = 0.05
"""Fraction of colluding clients SecAgg+'s degree and threshold are planned for (`--corrupt`)."""


@dataclass(frozen=True)
class Point:
    protocol: str
    n: int
    d: int
    dropout: float
    server_s: float
    client_max_s: float
    round_s: float
    up_B: float
    down_B: float
    server_peak_MB: float
    survivors: int
    total_cpu_s: float = float("nan")
    """CPU seconds this process spent simulating the round (server and every client)."""
    aborted: str = ""
    """Why the round could not finish (e.g. a survivor with too few live share holders), or ''."""
    peak_rss_MB: float = float("nan")
    """Points at d >= LAZY_FROM only: the peak resident memory (VmHWM) of the child process that simulated
    the round, every party included (an upper bound on the server's; see `run_child`)."""
    base_rss_MB: float = float("nan")
    """That child's resident memory before the round (interpreter, numpy, cryptography, the protocol code)."""


def plus_config(n: int, dropout: float, corrupt_fraction: float = DEFAULT_CORRUPT) -> PlusParameters:
    """SecAgg+'s degree and threshold for N clients planned for this dropout and corrupt fraction
    (ValueError when no degree up to the complete graph meets the conditions)."""
    return plus_parameters(n=n, dropout=dropout, corrupt_fraction=corrupt_fraction)


def _plus_kwargs(plan: PlusParameters) -> dict:
    """`degree` and a `threshold_fraction` for which the server's threshold_for(k + 1, f) is exactly t."""
    fraction = plan.threshold_fraction()
    if threshold_for(plan.degree + 1, fraction) != plan.threshold:
        raise AssertionError(f"threshold_fraction {fraction} does not give t = {plan.threshold} for k = {plan.degree}")
    return {"degree": plan.degree, "threshold_fraction": fraction}


def _params(protocol: str, dropout: float, *, n: int, corrupt_fraction: float = DEFAULT_CORRUPT) -> dict:
    """LightSecAgg must plan for the dropouts it will meet: U = N (1 - dropout) survivors, T = U / 2.
    SecAgg+ too: its degree and threshold come from `plus_config` at this dropout."""
    if protocol == "lightsecagg":
        return {"target_survivors": max(1.0 - dropout, 0.5) - 1e-9, "privacy": 0.5 * max(1.0 - dropout, 0.5)}
    if protocol == "secagg+":
        return _plus_kwargs(plus_config(n, dropout, corrupt_fraction))
    return {}


def _degree(n: int, dropout: float, corrupt_fraction: float) -> int:
    """SecAgg+'s neighbours per client (what a client's work grows with), for the cost prediction."""
    try:
        return plus_config(n, dropout, corrupt_fraction).degree
    except ValueError:
        return n - 1


class _Meter:
    """Server-memory accounting over one traced round (see the module docstring)."""

    def __init__(self) -> None:
        self.held = 0          # bytes the server allocated and kept across its steps
        self.buffered = 0      # bytes of the current stage's replies the server still references
        self.peak = 0

    def step(self, fn, *args):
        current = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        out = fn(*args)
        now, peak = tracemalloc.get_traced_memory()
        self.peak = max(self.peak, self.held + self.buffered + peak - current)
        self.held = max(self.held + now - current, 0)
        return out


LAZY_FROM = 10**7
"""From this d on, a point runs in a child process of its own (`run_child`) with its inputs generated on
demand (`lazy_input`), so that its peak resident memory is measured alone and N inputs are never held."""
DEFAULT_MAX_GIB = 6.0
"""A child point predicted to hold more than this (`estimated_bytes`) is not run (`--max-gib`)."""


def lazy_input(seed: int, client: int, ring, d: int) -> np.ndarray:
    """Client `client`'s input: uniform on the ring, regenerated from (seed, client) by the mask PRG whenever it
    is asked for, so a lazy round holds only the input of the client that is running."""
    key = hashlib.sha256(f"scale_curve input {seed} {client}".encode()).digest()
    return field_mask(key, ring, d)


def estimated_bytes(protocol: str, *, n: int, d: int, dropout: float) -> float:
    """Bytes a lazy round holds at its peak in one process, every party included (for the memory stop).
    Plain and SecAgg+/SecAgg: the server's running sum, the running client's input and masked copy (3 x 4d;
    the final check holds as much). LightSecAgg: since 2026-11-30 its lazy clients spill the pieces they keep
    for recovery, encode their own a part at a time and make the code's random pieces from a key, so in one
    process the N clients hold their N masks (N x 4d) from the share stage until they mask; besides, one
    part coded and sealed, and the server's sum with one input and its masked copy (5 x 4d). Before, the
    clients also held all N (N - 1) coded pieces and their random pieces."""
    vector = 4.0 * d
    if protocol != "lightsecagg":
        return 3 * vector
    return (n + 5) * vector


def _status_mb(field: str) -> float:
    """A field of /proc/self/status (VmHWM, VmRSS) in MB (2^20 bytes); NaN where there is none."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def run_child(protocol: str, *, n: int, d: int, dropout: float, corrupt_fraction: float = DEFAULT_CORRUPT,
              timeout: float = 900.0) -> Point:
    """`run_point(..., lazy=True)` in a fresh interpreter (`--child`), so that one point's memory does not
    contaminate another's: the Point comes back with the child's VmHWM (`peak_rss_MB`: the server, the one
    client running and the interpreter), its resident memory before the round (`base_rss_MB`), and as
    `total_cpu_s` the child's whole CPU time (inputs generated twice, once for the check)."""
    spec = json.dumps({"protocol": protocol, "n": n, "d": d, "dropout": dropout, "corrupt_fraction": corrupt_fraction})
    try:
        proc = subprocess.run([sys.executable, "-m", "benchmarks.scale_curve", "--child", spec], capture_output=True,
                              text=True, timeout=timeout, env={**os.environ, "PYTHONHASHSEED": "0"},
                              cwd=Path(__file__).resolve().parents[1])   # the repository root: -m finds benchmarks
    except subprocess.TimeoutExpired:
        proc = None
    lines = proc.stdout.strip().splitlines() if proc is not None and proc.returncode == 0 else []
    if lines:
        return Point(**json.loads(lines[-1]))
    nan = float("nan")
    why = (f"child ran past {timeout:.0f} s" if proc is None else
           f"child exited {proc.returncode}: {(proc.stderr.strip().splitlines() or [''])[-1][:200]}")
    return Point(protocol=protocol, n=n, d=d, dropout=dropout, server_s=nan, client_max_s=nan, round_s=nan,
                 up_B=nan, down_B=nan, server_peak_MB=nan, survivors=0, total_cpu_s=nan, aborted=why)


def _child_main(spec: str) -> None:
    import resource

    args = json.loads(spec)
    base = _status_mb("VmRSS")
    p = run_point(args["protocol"], n=args["n"], d=args["d"], dropout=args["dropout"],
                  corrupt_fraction=args["corrupt_fraction"], lazy=True)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    p = Point(**{**asdict(p), "peak_rss_MB": _status_mb("VmHWM"), "base_rss_MB": base,
                 "total_cpu_s": usage.ru_utime + usage.ru_stime})
    print(json.dumps(asdict(p)), flush=True)


def run_point(protocol: str, *, n: int, d: int, dropout: float, seed: int = 0, memory: bool = False,
              corrupt_fraction: float = DEFAULT_CORRUPT, lazy: bool = False, chunk: int | None = None) -> Point:
    """One round; `memory` traces allocations (slower: the times of a traced round are not reported).
    `corrupt_fraction`: what SecAgg+'s degree and threshold are planned for (no client colludes here);
    where no SecAgg+ parameters exist the point is recorded as aborted, without a round. `lazy`: each
    client's input is generated when it asks for it (`lazy_input`; the seconds that takes are not counted
    as the client's) and regenerated for the final check, so that the round holds O(d), not O(N d), of
    inputs (the points at d >= LAZY_FROM). `chunk`: inputs in chunks of this many values (plain and
    SecAgg(+)); None (the default here, unlike the servers' "auto") sends them whole: in one process nothing
    is queued, and a chunked client keeps its input until the survivor set (for a resend), so N clients
    in one process would hold N inputs; streaming over sockets is `benchmarks.stream_tcp`'s measure."""
    rng = np.random.default_rng([seed, n, d])
    ring = registry.default_ring(protocol)
    ids = list(range(1, n + 1))
    try:
        params = _params(protocol, dropout, n=n, corrupt_fraction=corrupt_fraction)
    except ValueError as error:
        nan = float("nan")
        return Point(protocol=protocol, n=n, d=d, dropout=dropout, server_s=nan, client_max_s=nan, round_s=nan,
                     up_B=nan, down_B=nan, server_peak_MB=nan, survivors=0, total_cpu_s=0.0,
                     aborted=f"no parameters: {error}")
    if protocol != "lightsecagg":
        params["chunk"] = chunk
    server = registry.server_class(protocol)(round_id=1, clients=ids, length=d, ring=ring, **params)
    cls = registry.client_class(protocol)
    generating = dict.fromkeys(ids, 0.0)   # CPU seconds spent making lazy inputs (not the client's work)
    if lazy:
        inputs = None

        def input_fn(c: int):
            def make() -> np.ndarray:
                t = time.process_time()
                x = lazy_input(seed, c, ring, d)
                generating[c] += time.process_time() - t
                return x
            return make

        spill = {"spill": True} if protocol == "lightsecagg" else {}  # kept pieces to disk: O(d) per client
        clients = {c: cls(client_id=c, round_id=1, input_fn=input_fn(c), **spill) for c in ids}
    else:
        inputs = {c: rng.integers(0, ring.modulus, size=d, dtype=np.uint64).astype(np.uint32) for c in ids}
        clients = {c: cls(client_id=c, round_id=1, input_fn=lambda x=inputs[c]: x) for c in ids}
    dropped = set(rng.choice(ids, size=int(round(dropout * n)), replace=False).tolist()) if dropout > 0 else set()
    meter = _Meter() if memory else None
    if memory:
        tracemalloc.start()
    server_s, round_s = 0.0, 0.0
    client_s = dict.fromkeys(ids, 0.0)
    up, down = dict.fromkeys(ids, 0), dict.fromkeys(ids, 0)
    gone: set[int] = set()

    def timed_server(fn, *args):
        nonlocal server_s
        t = time.process_time()
        out = meter.step(fn, *args) if meter else fn(*args)
        spent = time.process_time() - t
        server_s += spent
        return out, spent

    aborted = ""
    try:
        requests, stage_server = timed_server(server.start)
        while requests:
            if server.stage == MASKED_STAGE[protocol]:
                gone |= dropped
            slowest = 0.0
            for cid, request in requests.items():
                down[cid] += request.nbytes()
                if cid in gone:
                    continue
                t, made = time.process_time(), generating[cid]
                try:
                    reply = clients[cid].handle(request)
                except ProtocolError:
                    reply = None
                spent = time.process_time() - t - (generating[cid] - made)
                parts = reply_messages(reply)   # one message, or chunks made (masked) one at a time
                while True:
                    t, made = time.process_time(), generating[cid]
                    part: Message | None = next(parts, None)
                    spent += time.process_time() - t - (generating[cid] - made)   # making a chunk is the client's
                    if part is None:
                        break
                    up[cid] += part.nbytes()
                    _, s = timed_server(server.accept, part)
                    part = None   # the server keeps what it keeps; the sent vector must not outlive this client
                    stage_server += s
                    if meter:   # what the server keeps of the stage's replies (a deployment decodes them server-side)
                        meter.buffered = sum(m.nbytes() for m in server._replies.values())
                reply = parts = None
                client_s[cid] += spent
                slowest = max(slowest, spent)
            requests, s = timed_server(server.advance)
            if meter:
                meter.buffered = 0
            round_s += stage_server + s + slowest
            stage_server = 0.0
        result, _ = timed_server(server.result)
    except AbortError as error:
        aborted, result = str(error), None
    finally:
        if memory:
            tracemalloc.stop()
    alive = [c for c in ids if c not in gone]
    if result is None:
        return Point(protocol=protocol, n=n, d=d, dropout=dropout, server_s=server_s,
                     client_max_s=max(client_s[c] for c in alive), round_s=float("nan"),
                     up_B=float(np.median([up[c] for c in alive])), down_B=float(np.median([down[c] for c in alive])),
                     server_peak_MB=(meter.peak / 2**20) if meter else float("nan"), survivors=0,
                     total_cpu_s=server_s + sum(client_s.values()), aborted=aborted)
    if lazy:   # uint32 and in place: the check holds 3 x 4d at most, like the round
        clients.clear()
        total = np.zeros(d, dtype=np.uint32)
        for c in sorted(result.contributors):
            ring.add_(total, lazy_input(seed, c, ring, d))
        correct = np.array_equal(total, result.ring_sum)
        del total
    else:
        expected = np.zeros(d, dtype=np.uint64)
        for c in result.contributors:
            expected += inputs[c]
        correct = np.array_equal((expected % ring.modulus).astype(np.uint32), result.ring_sum)
    if not correct:
        raise AssertionError(f"{protocol} N={n} d={d}: the secure sum is wrong")
    return Point(protocol=protocol, n=n, d=d, dropout=dropout, server_s=server_s,
                 client_max_s=max(client_s[c] for c in alive), round_s=round_s,
                 up_B=float(np.median([up[c] for c in alive])), down_B=float(np.median([down[c] for c in alive])),
                 server_peak_MB=(meter.peak / 2**20) if meter else float("nan"), survivors=len(result.contributors),
                 total_cpu_s=server_s + sum(client_s.values()))


def growth_exponent(points: Sequence[Point], *, min_n: int = 50) -> float:
    """Least-squares slope of log(server_s) on log(N)."""
    xs = [(math.log(p.n), math.log(max(p.server_s, 1e-6))) for p in points if p.n >= min_n]
    if len(xs) < 2:
        return float("nan")
    x, y = np.array(xs).T
    return float(np.polyfit(x, y, 1)[0])


def sweep(*, protocols: Sequence[str], sizes: Sequence[int], dims: Sequence[int], dropouts: Sequence[float],
          cap: float, memory: bool, corrupt_fraction: float = DEFAULT_CORRUPT, max_gib: float = DEFAULT_MAX_GIB,
          lazy_from: int = LAZY_FROM, log=print) -> list[Point]:
    """Every protocol at every size until the predicted time of the next size passes `cap`: the previous
    size's round without dropout scaled by N^1.3 (N^2 for SecAgg). SecAgg+'s degree is planned per
    dropout (a high dropout can cost far more than none), so each of its dropouts is predicted on its
    own (its previous round scaled by N^1.3 and by its degree's growth) and stops on its own.
    From d = `lazy_from` (LAZY_FROM) on, each point runs in a child process (`run_child`, no traced round: its memory
    is the child's measured peak RSS); it is also skipped where the same protocol, N and dropout at a
    smaller d, scaled by d, predicts more than `cap` CPU seconds, or where `estimated_bytes` passes
    `max_gib` GiB in one process."""
    points: list[Point] = []

    def too_costly(protocol: str, n: int, d: int, dropout: float) -> str:
        smaller = [p for p in points if (p.protocol, p.n, p.dropout) == (protocol, n, dropout) and p.d < d
                   and not p.aborted and math.isfinite(p.total_cpu_s)]
        if smaller:
            p = max(smaller, key=lambda q: q.d)
            predicted = p.total_cpu_s * d / p.d
            if predicted > cap:
                return (f"simulating one round would take about {predicted:.0f} CPU s (d={p.d:.0e}'s round scaled "
                        f"by d) > cap {cap:.0f} s")
        if d >= lazy_from:
            need = estimated_bytes(protocol, n=n, d=d, dropout=dropout)
            if need > max_gib * 2**30:
                return f"one process would hold about {need / 2**30:.1f} GiB (estimated_bytes) > {max_gib:g} GiB"
        return ""

    for d in dims:
        for protocol in protocols:
            previous: list[Point] = []
            active = list(dropouts)
            for n in sizes:
                if previous and protocol == "secagg+":
                    active = []
                    for p in previous:
                        predicted = (p.total_cpu_s * (n / p.n) ** 1.3 * (_degree(n, p.dropout, corrupt_fraction) + 1)
                                     / (_degree(p.n, p.dropout, corrupt_fraction) + 1))
                        if not predicted <= cap:   # NaN: the previous size's child failed or timed out
                            log(f"  {protocol} d={d} drop={p.dropout:.0%}: stops before N={n} (simulating one round "
                                f"would take about {predicted:.0f} CPU s > cap {cap:.0f} s)")
                        else:
                            active.append(p.dropout)
                    if not active:
                        break
                elif previous:
                    power = 2.0 if protocol == "secagg" else 1.3
                    predicted = previous[0].total_cpu_s * (n / previous[0].n) ** power
                    if not predicted <= cap:
                        log(f"  {protocol} d={d}: stops before N={n} (simulating one round would take about "
                            f"{predicted:.0f} CPU s > cap {cap:.0f} s)")
                        break
                row = []
                headline = min(dropouts, key=lambda r: abs(r - 0.1))
                for dropout in list(active):
                    why = too_costly(protocol, n, d, dropout)
                    if why:
                        log(f"  {protocol} d={d:.0e} N={n} drop={dropout:.0%}: not run ({why})")
                        active.remove(dropout)
                if not active:
                    break
                for dropout in active:
                    if protocol == "secagg+":
                        try:
                            log(f"  {plus_config(n, dropout, corrupt_fraction).describe()}")
                        except ValueError as error:
                            log(f"  secagg+ n={n} dropout={dropout:.2f} corrupt={corrupt_fraction:.2f}: {error}")
                    if d >= lazy_from:
                        p = run_child(protocol, n=n, d=d, dropout=dropout, corrupt_fraction=corrupt_fraction,
                                      timeout=max(300.0, 1.5 * cap))
                    else:
                        p = run_point(protocol, n=n, d=d, dropout=dropout, corrupt_fraction=corrupt_fraction)
                    if memory and d < lazy_from and dropout == headline and not p.aborted.startswith("no parameters"):
                        p = Point(**{**asdict(p), "server_peak_MB": run_point(
                            protocol, n=n, d=d, dropout=dropout, memory=True,
                            corrupt_fraction=corrupt_fraction).server_peak_MB})
                    row.append(p)
                    points.append(p)
                    if p.aborted:
                        log(f"  {protocol:11s} N={n:5d} d={d:.0e} drop={dropout:.0%}: ABORTED ({p.aborted})")
                        continue
                    log(f"  {protocol:11s} N={n:5d} d={d:.0e} drop={dropout:.0%}: round {p.round_s:7.2f} s "
                        f"(server {p.server_s:6.2f} s, slowest client {p.client_max_s:5.2f} s), "
                        f"up {p.up_B / d:.2f} B/param, down {p.down_B / 1e6:.2f} MB, "
                        + (f"peak RSS {p.peak_rss_MB:.0f} MB (before the round {p.base_rss_MB:.0f} MB; "
                           f"3 x 4d + 200 MB = {(12 * d + 200e6) / 2**20:.0f} MB), child CPU {p.total_cpu_s:.0f} s"
                           if d >= lazy_from else f"server peak {p.server_peak_MB:.0f} MB"), flush=True)
                previous = row
    return points


def write(points: Sequence[Point], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "scale.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(asdict(points[0])))
        writer.writeheader()
        writer.writerows(asdict(p) for p in points)
    lines = ["| protocol | N | d | dropout | round s | server CPU s | slowest client s | up B/param | down MB | "
             "server peak MB (traced) | process peak RSS MB |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in points:
        lines.append(f"| {p.protocol} | {p.n} | {p.d:.0e} | {p.dropout:.0%} | {p.round_s:.2f} | {p.server_s:.2f} | "
                     f"{p.client_max_s:.2f} | {p.up_B / p.d:.2f} | {p.down_B / 1e6:.2f} | {p.server_peak_MB:.0f} | "
                     f"{p.peak_rss_MB:.0f} |" + (f" {p.aborted[:80]} |" if p.aborted else ""))
    (out / "scale.md").write_text("\n".join(lines) + "\n")


def read_points(path: Path) -> list[Point]:
    """The points of a scale.csv written by `write`."""
    types = {f.name: f.type for f in fields(Point)}
    with open(path, newline="") as handle:
        return [Point(**{k: (v if types[k] in (str, "str") else
                             int(v) if types[k] in (int, "int") else float(v)) for k, v in row.items()})
                for row in csv.DictReader(handle)]


def plot(points: Sequence[Point], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dims = sorted({p.d for p in points})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for d in dims:
        for protocol in PROTOCOLS:
            for dropout, style in ((0.0, "-"), (0.3, ":")):
                ps = sorted((p for p in points if p.protocol == protocol and p.d == d and p.dropout == dropout),
                            key=lambda p: p.n)
                if ps:
                    axes[0].loglog([p.n for p in ps], [p.round_s for p in ps], style, marker="o", markersize=3,
                                   label=f"{protocol} d={d:.0e} drop {dropout:.0%}")
    axes[0].set_xlabel("clients N")
    axes[0].set_ylabel("round seconds (critical path)")
    axes[0].grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=6)
    d = dims[0]
    for protocol in ("secagg+", "lightsecagg"):
        for n in sorted({p.n for p in points if p.protocol == protocol and p.d == d}):
            ps = sorted((p for p in points if p.protocol == protocol and p.d == d and p.n == n), key=lambda p: p.dropout)
            if len(ps) > 1 and n == max(q.n for q in points if q.protocol == protocol and q.d == d):
                axes[1].plot([100 * p.dropout for p in ps], [p.round_s for p in ps], marker="o", label=f"{protocol} N={n}")
    axes[1].set_xlabel("dropout at the masked-input stage (%)")
    axes[1].set_ylabel("round seconds")
    axes[1].set_title(f"d = {d:.0e}: where LightSecAgg wins")
    axes[1].grid(alpha=0.3)
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_d(points: Sequence[Point], path: Path) -> None:
    """Round seconds and peak RSS against d, per protocol, N and dropout (the points at d >= LAZY_FROM
    and the smaller d of the same run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    colours = dict(zip(PROTOCOLS, ("tab:grey", "tab:purple", "tab:blue", "tab:orange")))
    sizes = sorted({p.n for p in points})
    markers = dict(zip(sizes, "o^sDvP*X" * (len(sizes) // 8 + 1)))
    for protocol in PROTOCOLS:
        for n in sorted({p.n for p in points if p.protocol == protocol}):
            for dropout, style in ((0.0, "-"), (0.1, ":")):
                ps = sorted((p for p in points if (p.protocol, p.n, p.dropout) == (protocol, n, dropout)
                             and not p.aborted), key=lambda p: p.d)
                if len(ps) < 2:
                    continue
                look = dict(color=colours[protocol], linestyle=style, marker=markers[n], markersize=4,
                            label=f"{protocol} N={n} drop {dropout:.0%}")
                axes[0].loglog([p.d for p in ps], [p.round_s for p in ps], **look)
                rss = [p for p in ps if math.isfinite(p.peak_rss_MB)]
                if rss:
                    axes[1].loglog([p.d for p in rss], [p.peak_rss_MB for p in rss], **look)
    ds = sorted({p.d for p in points})
    axes[1].loglog(ds, [(12 * d + 200e6) / 2**20 for d in ds], "k--", linewidth=1, label="3 x 4d + 200 MB")
    axes[0].set_ylabel("round seconds (critical path)")
    axes[1].set_ylabel("peak RSS of the simulating process (MB)")
    for ax in axes:
        ax.set_xlabel("d (parameters)")
        ax.grid(alpha=0.3, which="both")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def d_table(points: Sequence[Point]) -> str:
    """The secure-sums-in-d table (markdown), one row per (d, N, dropout) with a child point: plain, SecAgg+
    and LightSecAgg round seconds, SecAgg+ / plain, each one's peak RSS against 3 x 4d + 200 MB, and the
    secure protocols' bytes per parameter; "not run" where a protocol stopped or has no point."""
    by = {(p.protocol, p.n, p.d, p.dropout): p for p in points if math.isfinite(p.peak_rss_MB) and not p.aborted}
    keys = sorted({(d, n, r) for _, n, d, r in by})

    def cell(protocol: str, key: tuple, fmt) -> str:
        d, n, r = key
        p = by.get((protocol, n, d, r))
        return fmt(p) if p is not None else "not run"

    lines = ["| d | N | dropout | plain round s | SecAgg+ round s | SecAgg+ / plain | LightSecAgg round s | "
             "peak RSS MiB plain / SecAgg+ / LightSecAgg | 3 x 4d + 200 MB, in MiB | bytes/param SecAgg+ / LightSecAgg |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for key in keys:
        d, n, r = key
        plain, plus = by.get(("plain", n, d, r)), by.get(("secagg+", n, d, r))
        ratio = f"{plus.round_s / plain.round_s:.1f}x" if plain and plus and plain.round_s > 0 else "-"
        rss = " / ".join(cell(q, key, lambda p: f"{p.peak_rss_MB:.0f}") for q in ("plain", "secagg+", "lightsecagg"))
        per = " / ".join(cell(q, key, lambda p: f"{p.up_B / p.d:.3f}") for q in ("secagg+", "lightsecagg"))
        lines.append(f"| {d:.0e} | {n} | {r:.0%} | {cell('plain', key, lambda p: f'{p.round_s:.2f}')} | "
                     f"{cell('secagg+', key, lambda p: f'{p.round_s:.2f}')} | {ratio} | "
                     f"{cell('lightsecagg', key, lambda p: f'{p.round_s:.2f}')} | {rss} | {(12 * d + 200e6) / 2**20:.0f} | "
                     f"{per} |")
    return "\n".join(lines) + "\n"


def scale_d_lines(points: Sequence[Point], dropouts: Sequence[float]) -> list[str]:
    """One `scale_d protocol=..` line per secure protocol with a child point (measured RSS): its largest d
    finished at the headline dropout (closest to 10%), the largest N finished there, its round seconds,
    plain's at the same (N, d, dropout) and the child's peak RSS."""
    headline = min(dropouts, key=lambda r: abs(r - 0.1))
    out = []
    for protocol in PROTOCOLS[1:]:
        mine = [p for p in points if p.protocol == protocol and math.isfinite(p.peak_rss_MB)
                and p.dropout == headline and not p.aborted]
        if not mine:
            continue
        d_max = max(p.d for p in mine)
        at = max((p for p in mine if p.d == d_max), key=lambda p: p.n)
        plain = next((p.round_s for p in points if (p.protocol, p.n, p.d, p.dropout) == ("plain", at.n, d_max, headline)
                      and not p.aborted), float("nan"))
        out.append(f"scale_d protocol={protocol} d_max={d_max:.0e} n={at.n} seconds={at.round_s:.2f} "
                   f"plain_seconds={plain:.2f} peak_rss_mb={at.peak_rss_MB:.0f}")
    return out


def crossovers(points: Sequence[Point]) -> dict[tuple[int, int], float | None]:
    """Per (N, d): the smallest measured dropout at which LightSecAgg finishes faster than SecAgg+, or
    finishes where SecAgg+ aborts (a survivor left with too few live share holders)."""
    out: dict[tuple[int, int], float | None] = {}
    by = {(p.protocol, p.n, p.d, p.dropout): p for p in points}
    for (protocol, n, d, dropout), p in sorted(by.items(), key=lambda kv: kv[0][1:]):
        if protocol != "lightsecagg" or ("secagg+", n, d, dropout) not in by or p.aborted:
            continue
        out.setdefault((n, d), None)
        plus = by[("secagg+", n, d, dropout)]
        if out[(n, d)] is None and (plus.aborted or p.round_s < plus.round_s):
            out[(n, d)] = dropout
    return out


def flower_points(sizes: Sequence[int], d: int, cap: float, dropout: float = 0.0,
                  corrupt_fraction: float = DEFAULT_CORRUPT, log=print) -> dict[int, float]:
    from benchmarks.flower_baseline import flower_is_installed, measure_flower

    if not flower_is_installed():
        log("flower not installed: `make bench-flower` adds Flower's SecAgg+ to this comparison")
        return {}
    out: dict[int, float] = {}
    for n in sizes:
        if out and max(out.values()) * (n / max(out)) ** 1.3 > cap:
            log(f"  flower secagg+ stops before N={n} (predicted past the cap)")
            break
        # the same neighbourhood as ours (planned for `dropout`): Flower's num_shares counts the client itself
        try:
            shares = min(plus_config(n, dropout, corrupt_fraction).degree + 1, n)
        except ValueError:
            shares = n
        result = measure_flower(clients=n, dim=d, protocol="secagg+", num_shares=shares, rounds=1)
        out[n] = result["round_s"]
        log(f"  flower secagg+ N={n} d={d:.0e}: round {out[n]:.2f} s (wall, Ray simulation, 2 CPUs)")
    return out


def main(argv: Sequence[str] | None = None) -> list[Point]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="d = 1e5, N up to 500")
    ap.add_argument("--sizes", default=None, help="comma-separated N (default 10,50,100,200,500,1000)")
    ap.add_argument("--dims", default=None, help="comma-separated d (default 1e5,1e6; --quick 1e5)")
    ap.add_argument("--dropouts", default="0,0.1,0.3")
    ap.add_argument("--protocols", default=",".join(PROTOCOLS))
    ap.add_argument("--corrupt", type=float, default=DEFAULT_CORRUPT,
                    help="fraction of colluding clients SecAgg+'s degree and threshold are planned for "
                         f"(default {DEFAULT_CORRUPT})")
    ap.add_argument("--cap", type=float, default=None,
                    help="CPU seconds to simulate one round: a protocol stops before a size predicted past it "
                         "(default 60; 20 with --quick)")
    ap.add_argument("--no-memory", action="store_true", help="skip the traced round per point (faster)")
    ap.add_argument("--flower", action="store_true", help="also run Flower's SecAgg+ (if installed)")
    ap.add_argument("--max-gib", type=float, default=DEFAULT_MAX_GIB,
                    help=f"a point at d >= {LAZY_FROM:.0e} estimated to hold more in one process is not run "
                         f"(default {DEFAULT_MAX_GIB:g})")
    ap.add_argument("--lazy-from", default=f"{LAZY_FROM:.0e}",
                    help="from this d on, each point runs in a child process with inputs made on demand and its "
                         f"peak RSS measured (default {LAZY_FROM:.0e})")
    ap.add_argument("--out", default="results/scale")
    ap.add_argument("--combine", default=None, metavar="CSV,CSV",
                    help="only read the points of earlier runs' scale.csv files, then write their union's table, "
                         "scale_d.png and scale_d lines under --out (runs over d made one d at a time)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        _child_main(args.child)
        return []
    if args.combine:
        points = [p for path in args.combine.split(",") if path for p in read_points(Path(path))]
        out = Path(args.out)
        write(points, out)
        plot_d(points, out / "scale_d.png")
        (out / "scale_d.md").write_text(d_table(points))
        print(f"wrote {out / 'scale.csv'}, {out / 'scale.md'}, {out / 'scale_d.md'}, {out / 'scale_d.png'} "
              f"({len(points)} points)")
        for line in scale_d_lines(points, sorted({p.dropout for p in points})):
            print(line, flush=True)
        return points
    try:
        sizes = [int(x) for x in (args.sizes or ("10,50,100,200,500" if args.quick else "10,50,100,200,500,1000")).split(",")]
        dims = [int(float(x)) for x in (args.dims or ("1e5" if args.quick else "1e5,1e6")).split(",")]
        dropouts = [float(x) for x in args.dropouts.split(",")]
        protocols = [p for p in args.protocols.split(",") if p]
    except ValueError as error:
        ap.error(f"bad list: {error}")
    if args.cap is None:
        args.cap = 20.0 if args.quick else 60.0
    if (min(sizes) < 3 or min(dims) < 1 or not all(0 <= r < 0.5 for r in dropouts) or set(protocols) - set(PROTOCOLS)
            or not args.cap > 0 or not 0 <= args.corrupt < 0.5):
        ap.error(f"need N >= 3, d >= 1, dropouts in [0, 0.5), protocols from {', '.join(PROTOCOLS)}, cap > 0, "
                 "corrupt in [0, 0.5)")
    start = time.perf_counter()
    points = sweep(protocols=protocols, sizes=sorted(sizes), dims=sorted(dims), dropouts=sorted(dropouts), cap=args.cap,
                   memory=not args.no_memory, corrupt_fraction=args.corrupt, max_gib=args.max_gib,
                   lazy_from=int(float(args.lazy_from)))
    d_points = [p for p in points if math.isfinite(p.peak_rss_MB)]
    if args.quick and not d_points:
        # the d dimension at one small point: plain and SecAgg+ at d = 1e7, N = 10, the headline dropout
        headline = min(dropouts, key=lambda r: abs(r - 0.1))
        d_points = sweep(protocols=[p for p in ("plain", "secagg+") if p in protocols] or ["plain", "secagg+"],
                         sizes=[10], dims=[LAZY_FROM], dropouts=[headline], cap=max(args.cap, 60.0), memory=False,
                         corrupt_fraction=args.corrupt, max_gib=args.max_gib)
        points = points + d_points
    out = Path(args.out)
    write(points, out)
    plot(points, out / "scale.png")
    if d_points:
        plot_d([p for p in points if p.protocol in {q.protocol for q in d_points}], out / "scale_d.png")
        (out / "scale_d.md").write_text(d_table(points))
    flower = (flower_points(sorted(sizes), min(dims), args.cap, dropout=min(dropouts), corrupt_fraction=args.corrupt)
              if args.flower else {})
    by = {(p.protocol, p.n, p.d, p.dropout): p for p in points}
    for (n, d), rate in crossovers(points).items():
        if rate is None:
            verdict = "SecAgg+ is faster at every measured dropout"
        elif by[("secagg+", n, d, rate)].aborted:
            verdict = f"from {rate:.0%} dropout SecAgg+ aborts (or has no parameters) and LightSecAgg finishes"
        else:
            verdict = f"LightSecAgg's round is shorter from {rate:.0%} dropout"
        print(f"lightsecagg vs secagg+ N={n} d={d:.0e}: {verdict}")
    print(f"wrote {out / 'scale.csv'}, {out / 'scale.md'}, {out / 'scale.png'} ({time.perf_counter() - start:.0f} s)")
    d0 = min(dims)
    headline = min(dropouts, key=lambda r: abs(r - 0.1))
    for protocol in protocols:
        mine = [p for p in points if p.protocol == protocol and p.d == d0]
        if not mine:
            continue
        n_max = max(p.n for p in mine if p.dropout == headline)   # SecAgg+ may stop earlier at a high dropout
        at = next(p for p in mine if p.n == n_max and p.dropout == headline)
        exponent = growth_exponent([p for p in mine if p.dropout == min(dropouts)])
        extra = ""
        if protocol == "secagg+" and flower:
            common = [n for n in flower if any(p.n == n for p in mine)]
            # conservative: Flower's simulated round (wall, 2 CPUs) against the CPU this process needs to
            # simulate ours with every client one after another, not against our critical path
            ratios = [flower[n] / next(p.total_cpu_s for p in mine if p.n == n and p.dropout == min(dropouts))
                      for n in common]
            for n, r in zip(common, ratios):
                print(f"secagg+ vs flower N={n} d={d0:.0e}: flower {flower[n]:.2f} s, ours {flower[n] / r:.2f} CPU s "
                      f"simulating all clients: {r:.1f}x")
            extra = f" min_speedup_vs_flower={min(ratios):.1f}" if ratios else ""
        print(f"scale protocol={protocol} n_max={n_max} exponent={exponent:.2f} seconds_at_nmax={at.round_s:.2f} "
              f"bytes_per_client_at_nmax={at.up_B:.0f}{extra}", flush=True)
    for line in scale_d_lines(points, dropouts):
        print(line, flush=True)
    return points


if __name__ == "__main__":
    main()
