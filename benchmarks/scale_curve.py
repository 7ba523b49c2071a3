"""How secure aggregation grows: one round of plain, SecAgg, SecAgg+ and LightSecAgg at N clients,
d parameters and a dropout rate at the masked-input stage, every party in this process.

    python -m benchmarks.scale_curve --quick    # d = 1e5, N up to 500: < 10 minutes on 2 cores
    python -m benchmarks.scale_curve            # d in {1e5, 1e6}, N up to 1000

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

SecAgg+ is configured per (N, dropout) from the threat model, not with the fixed 2 log2 N degree:
`secagg.plus_params.plus_parameters(n=N, dropout=rate, corrupt_fraction=--corrupt)` gives the
smallest degree k and threshold t with security failure <= 2^-40 and abort <= 2^-30 at that dropout
(corrupt clients counted as possible dropouts too); each configuration prints its `secagg+ n=.. k=..
t=..` line before its round.
"""
from __future__ import annotations

import argparse
import csv
import math
import time
import tracemalloc
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from secagg.messages import AbortError, Message, ProtocolError
from secagg.plus_params import PlusParameters, plus_parameters
from secagg.protocols import registry
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


def run_point(protocol: str, *, n: int, d: int, dropout: float, seed: int = 0, memory: bool = False,
              corrupt_fraction: float = DEFAULT_CORRUPT) -> Point:
    """One round; `memory` traces allocations (slower: the times of a traced round are not reported).
    `corrupt_fraction`: what SecAgg+'s degree and threshold are planned for (no client colludes here);
    where no SecAgg+ parameters exist the point is recorded as aborted, without a round."""
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
    server = registry.server_class(protocol)(round_id=1, clients=ids, length=d, ring=ring, **params)
    cls = registry.client_class(protocol)
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
                t = time.process_time()
                try:
                    reply: Message | None = clients[cid].handle(request)
                except ProtocolError:
                    reply = None
                spent = time.process_time() - t
                client_s[cid] += spent
                slowest = max(slowest, spent)
                if reply is None:
                    continue
                up[cid] += reply.nbytes()
                _, s = timed_server(server.accept, reply)
                stage_server += s
                if meter:   # what the server keeps of the stage's replies (a deployment decodes them server-side)
                    meter.buffered = sum(m.nbytes() for m in server._replies.values())
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
    expected = np.zeros(d, dtype=np.uint64)
    for c in result.contributors:
        expected += inputs[c]
    if not np.array_equal((expected % ring.modulus).astype(np.uint32), result.ring_sum):
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
          cap: float, memory: bool, corrupt_fraction: float = DEFAULT_CORRUPT, log=print) -> list[Point]:
    """Every protocol at every size until the predicted time of the next size passes `cap`: the previous
    size's round without dropout scaled by N^1.3 (N^2 for SecAgg). SecAgg+'s degree is planned per
    dropout (a high dropout can cost far more than none), so each of its dropouts is predicted on its
    own (its previous round scaled by N^1.3 and by its degree's growth) and stops on its own."""
    points: list[Point] = []
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
                        if predicted > cap:
                            log(f"  {protocol} d={d} drop={p.dropout:.0%}: stops before N={n} (simulating one round "
                                f"would take about {predicted:.0f} CPU s > cap {cap:.0f} s)")
                        else:
                            active.append(p.dropout)
                    if not active:
                        break
                elif previous:
                    power = 2.0 if protocol == "secagg" else 1.3
                    predicted = previous[0].total_cpu_s * (n / previous[0].n) ** power
                    if predicted > cap:
                        log(f"  {protocol} d={d}: stops before N={n} (simulating one round would take about "
                            f"{predicted:.0f} CPU s > cap {cap:.0f} s)")
                        break
                row = []
                headline = min(dropouts, key=lambda r: abs(r - 0.1))
                for dropout in active:
                    if protocol == "secagg+":
                        try:
                            log(f"  {plus_config(n, dropout, corrupt_fraction).describe()}")
                        except ValueError as error:
                            log(f"  secagg+ n={n} dropout={dropout:.2f} corrupt={corrupt_fraction:.2f}: {error}")
                    p = run_point(protocol, n=n, d=d, dropout=dropout, corrupt_fraction=corrupt_fraction)
                    if memory and dropout == headline and not p.aborted.startswith("no parameters"):
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
                        f"server peak {p.server_peak_MB:.0f} MB")
                previous = row
    return points


def write(points: Sequence[Point], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "scale.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(asdict(points[0])))
        writer.writeheader()
        writer.writerows(asdict(p) for p in points)
    lines = ["| protocol | N | d | dropout | round s | server CPU s | slowest client s | up B/param | down MB | server peak MB |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for p in points:
        lines.append(f"| {p.protocol} | {p.n} | {p.d:.0e} | {p.dropout:.0%} | {p.round_s:.2f} | {p.server_s:.2f} | "
                     f"{p.client_max_s:.2f} | {p.up_B / p.d:.2f} | {p.down_B / 1e6:.2f} | {p.server_peak_MB:.0f} |")
    (out / "scale.md").write_text("\n".join(lines) + "\n")


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
    ap.add_argument("--out", default="results/scale")
    args = ap.parse_args(argv)
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
                   memory=not args.no_memory, corrupt_fraction=args.corrupt)
    out = Path(args.out)
    write(points, out)
    plot(points, out / "scale.png")
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
    return points


if __name__ == "__main__":
    main()
