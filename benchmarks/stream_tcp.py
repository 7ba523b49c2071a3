"""Secure sums over real sockets at large d, whole inputs against chunked streams (issue 58).

One server process and N client processes over tcp://127.0.0.1 (`benchmarks.secagg_vs_flower.ours_tcp`,
`--insecure`, synthetic uint32 inputs), per d, protocol (plain, SecAgg+) and upload mode:

- whole: each input in one message, read whole by the server before it is folded;
- chunked: `--param chunk=C`, each input in messages of C values folded as they arrive
  (`secagg.protocols.chunks`; the client masks each chunk while the last one is being sent);
- LightSecAgg (`--protocols plain,lightsecagg`) has no chunks; its modes are held (`spill=false pace=false`:
  the sealed pieces in memory, every large message asked for at once) and bounded (the defaults from
  2026-11-29: pieces spilled to an unlinked file, each relay built when sent, the share, check and
  masked-input stages paced by `send_window`; and the clients' `spill=true`: the pieces each keeps for
  recovery spilled too, which their default does only past 256 MiB). `--lightsecagg-modes` picks them.

Per run: the round's wall time (median of rounds after the first, which pays connection set-up), the
server process's peak resident memory (VmHWM) and the bytes it received per parameter; the largest client
process's peak RSS and the client processes' CPU seconds in all (whole lives, from wait4: what N clients
sharing this host's cores cost it, beside plain's). Goals (issue 58):
SecAgg+ at most 1.3x the plaintext round, server peak RSS at most 3 x 4d bytes + 200 MB, at most 4.0 bytes
per parameter.

`mask_cpu_s` is what the SecAgg+ round's masks cost in CPU on this host: (N - dropped)(k + 1) masks on the
clients, N - dropped self masks and dropped x k rebuilt pairwise ones on the server (k from the server's
round line), each one d-word mask applied as the protocol applies it (`secagg.prg.MaskStream`, the AES-256
keystream and an add), timed here after the runs. With every client on this host's C cores the masks need at least
mask_cpu_s / C seconds of wall time somewhere in the round: set beside `gap_s` (the SecAgg+ round minus the
plain one) it says how much of the gap is masking that clients on hosts of their own would do side by side.

    python -m benchmarks.stream_tcp                      # d = 1e7 and 1e8, N = 10 (about 3 minutes)
    python -m benchmarks.stream_tcp --quick              # d = 1e6, N = 5 (under a minute)
    python -m benchmarks.stream_tcp --dropout 0.1        # 10% of clients crash at the masked-input stage
    python -m benchmarks.stream_tcp --link-mbit 1000     # across a 1 Gbit/s link (network namespaces, root)

`--link-mbit R` puts the server in one network namespace and the clients in another, joined by a veth
link limited to R Mbit/s each way (`benchmarks.netns`, tc tbf): the server's link, which all uploads share,
as in a deployment. Every process still runs on this host's cores. `link_s` is the time that link needs to
carry one round's uploads (bytes received x 8 / R), a floor for any protocol's round, plaintext included,
and `secaggplus_vs_link` the SecAgg+ round over it: an upper bound on SecAgg+ / plain that does not lean on
the plain round's own timing (nan on loopback).

Last lines, one per d and protocol (chunked), then one per d:
    stream protocol=secagg+ d=.. n=.. dropout=.. mode=chunked round_s=.. peak_rss_mb=.. bytes_per_param=..
    stream_goal d=.. n=.. dropout=.. secaggplus_vs_plain=.. peak_rss_mb=.. goal_rss_mb=.. whole_peak_rss_mb=.. gap_s=.. mask_cpu_s=.. cores=.. link_mbit=.. link_s=.. secaggplus_vs_link=..
    stream_lightsecagg d=.. n=.. dropout=.. held_peak_rss_mb=.. bounded_peak_rss_mb=.. held_round_s=.. bounded_round_s=.. bounded_client_rss_mb=..
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import os
import re
import statistics
import time
from pathlib import Path

import numpy as np

from benchmarks import netns
from benchmarks.mask_floor import secagg_plus_mask_count
from benchmarks.secagg_vs_flower import ours_tcp
from secagg.protocols.lightsecagg import LightSecAggServer
from secagg.prg import MaskStream
from secagg.ring import RING_2_32
from secagg.threads import available_cores

MIB = 1 << 20
DEFAULT_CHUNK = 1 << 18
"""Values per chunk (1 MiB of uint32): small against d, large against a message's fixed costs."""


def modes(protocol: str, chunk: int, max_streams: int | None = None) -> dict[str, dict[str, str]]:
    """Upload modes -> the server parameters that select them (`max_streams`: chunked uploads paced to that
    many clients at once, plain's and SecAgg(+)'s alike)."""
    if protocol == "lightsecagg":
        return {"held": {"spill": "false", "pace": "false"}, "bounded": {"spill": "true", "pace": "true"}}
    paced = {} if max_streams is None else {"max_streams": str(max_streams)}
    return {"whole": {"chunk": "none"}, "chunked": {"chunk": str(chunk), **paced}}  # whole: never the auto chunks


def client_params(protocol: str, mode: str) -> dict[str, str]:
    """The client parameters of a mode (bounded LightSecAgg: each client spills the pieces it keeps)."""
    return {"spill": "true"} if (protocol, mode) == ("lightsecagg", "bounded") else {}


def message_mib(protocol: str, mode: str, d: int, clients: int) -> int | None:
    """The message limit a mode needs (None: the default fits): a whole input is 4d bytes, and a LightSecAgg
    share reply or relay about (N - 1) sealed pieces of 4d / (U - T) bytes."""
    if protocol == "lightsecagg":
        largest = LightSecAggServer(round_id=0, clients=range(1, clients + 1), length=d).max_reply_bytes()
        return max(64, -(-largest // MIB) + 8)
    return max(64, -(-(4 * (d + 1)) // MIB) + 8) if mode == "whole" else None


def dropouts_of(*rows: dict) -> float:
    """The dropout fraction of whichever of `rows` ran."""
    return next(r["dropout"] for r in rows if r)


def goal_rss_mb(d: int) -> float:
    return (3 * 4 * d + 200e6) / MIB


def link_mbit(net) -> str:
    """The link a run crossed: its tbf rate in Mbit/s, "veth" for namespaces at the link's own speed, or "loopback"."""
    if net is None:
        return "loopback"
    return "veth" if net.rate_mbit is None else f"{net.rate_mbit:g}"


def link_seconds(row: dict, *, d: int, clients: int) -> float:
    """The time a run's link needs to carry one round's uploads at its rate (the bytes the server received per
    round, `bytes_per_param` x d x N): no protocol's round over it can be shorter. nan off a rate-limited link."""
    try:
        rate = float(row["link_mbit"]) * 1e6
    except ValueError:  # "loopback", "veth"
        return float("nan")
    return row["bytes_per_param"] * d * clients * 8 / rate


def degree_of(setting: str) -> int | None:
    """The neighbours per client a SecAgg(+) server's round line reports (`describe()`), None without one."""
    found = re.search(r"\bdegree=(\d+)", setting)
    return int(found.group(1)) if found else None


def mask_seconds(d: int, *, repeats: int = 3) -> float:
    """Median seconds of one d-word mask applied as the protocol applies it (one key, `MaskStream`, in place)."""
    target = np.zeros(d, dtype=np.uint32)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        MaskStream([(os.urandom(32), 1)], RING_2_32).apply_(target)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def mask_cpu_seconds(*, clients: int, degree: int, dropped: int, mask_s: float) -> float:
    """CPU seconds of a SecAgg+ round's masks, clients' and server's, at `mask_s` a mask."""
    return secagg_plus_mask_count(clients=clients, degree=degree, dropped_after_share=dropped) * mask_s


def run(*, dims: list[int], clients: int, chunk: int, rounds: int, protocols: list[str],
        dropout: float = 0.0, lightsecagg_modes: tuple[str, ...] = ("held", "bounded"), repeats: int = 1,
        net=None, upload_modes: tuple[str, ...] = ("whole", "chunked"), max_streams: int | None = None) -> list[dict]:
    """One row per run; with `repeats`, every protocol and mode runs that many times, interleaved (all of
    them once, then all again), so that a drift in the machine's load falls on every row alike. `net`: a
    `benchmarks.netns.NetnsPair` whose link the runs cross (None: loopback)."""
    rows = []
    dropouts = round(clients * dropout)
    runs = [(d, repeat, protocol, mode, params) for d in dims for repeat in range(repeats) for protocol in protocols
            for mode, params in modes(protocol, chunk, max_streams).items()
            if mode in (lightsecagg_modes if protocol == "lightsecagg" else upload_modes)]
    for d, repeat, protocol, mode, params in runs:
        started = time.monotonic()
        limit = message_mib(protocol, mode, d, clients)
        secure = dict(params, planned_dropout=str(dropout)) if protocol == "secagg+" and dropouts else params
        r = ours_tcp(protocol=protocol, clients=clients, dim=d, rounds=rounds, params=secure,
                     float_input=False, max_message_mib=limit, dropouts=dropouts,
                     client_params=client_params(protocol, mode), net=net)
        row = {"d": d, "n": clients, "dropout": dropouts / clients, "protocol": protocol, "mode": mode,
               "repeat": repeat, "chunk": chunk if mode == "chunked" else 0, "round_s": r["round_s"],
               "peak_rss_mb": r["peak_rss_mb"], "bytes_per_param": r["bytes_per_param"],
               "client_peak_rss_mb": r["client_peak_rss_mb"], "client_cpu_s": r["client_cpu_s"],
               "degree": degree_of(r.get("setting", "")), "link_mbit": link_mbit(net),
               "max_streams": params.get("max_streams", ""),
               "peak_stage": r["peak_stage"], "stages": " ".join(f"{k}={v:.2f}" for k, v in r["stages"].items()),
               "stage_peaks": " ".join(f"{k}={v:.0f}" for k, v in r["stage_peak_rss_mb"].items()),
               "wall_s": time.monotonic() - started}
        rows.append(row)
        print(f"  d={d:.0e} {protocol:8s} {mode:8s} round {row['round_s']:.3f} s, server peak {row['peak_rss_mb']:.0f} "
              f"MiB (at the end of {row['peak_stage'] or '?'}), largest client {row['client_peak_rss_mb']:.0f} MiB, "
              f"clients' CPU {row['client_cpu_s']:.1f} s in all, "
              f"{row['bytes_per_param']:.3f} B/param ({row['wall_s']:.0f} s)", flush=True)
    return rows


def summarise(rows: list[dict]) -> list[dict]:
    """One row per (d, protocol, mode), in the order first run: the median round time over its runs (with
    their range and count, and the stage times of the run nearest the median), the largest peak memories
    (with the stage peaks of that run), the median bytes per parameter."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["d"], r["protocol"], r["mode"]), []).append(r)
    out = []
    for runs in groups.values():
        top = max(runs, key=lambda r: r["peak_rss_mb"])
        times = [r["round_s"] for r in runs]
        middle = min(runs, key=lambda r: abs(r["round_s"] - statistics.median(times)))
        out.append({**{k: v for k, v in runs[0].items() if k != "repeat"}, "runs": len(runs),
                    "round_s": statistics.median(times), "round_s_min": min(times), "round_s_max": max(times),
                    "stages": middle.get("stages", ""), "stage_peaks": top.get("stage_peaks", ""),
                    "peak_rss_mb": top["peak_rss_mb"], "peak_stage": top["peak_stage"],
                    "client_peak_rss_mb": max(r["client_peak_rss_mb"] for r in runs),
                    "client_cpu_s": statistics.median(r.get("client_cpu_s", float("nan")) for r in runs),
                    "bytes_per_param": statistics.median(r["bytes_per_param"] for r in runs),
                    "wall_s": sum(r["wall_s"] for r in runs)})
    return out


def _round_cell(r: dict) -> str:
    runs = r.get("runs", 1)
    return f"{r['round_s']:.3f}" if runs == 1 else f"{r['round_s']:.3f} ({r['round_s_min']:.2f}-{r['round_s_max']:.2f}, {runs} runs)"


def table(rows: list[dict]) -> str:
    out = ["| d | N | dropout | protocol | upload | round s | server peak RSS MiB | goal MiB (3 x 4d + 200 MB) | bytes/param "
           "| largest client peak RSS MiB |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['d']:.0e} | {r['n']} | {r['dropout']:.0%} | {r['protocol']} | {r['mode']} | {_round_cell(r)} | "
                   f"{r['peak_rss_mb']:.0f} | {goal_rss_mb(r['d']):.0f} | {r['bytes_per_param']:.3f} | "
                   f"{r.get('client_peak_rss_mb', 0):.0f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dims", default=None, help="comma-separated d (default 1e7,1e8; --quick 1e6)")
    ap.add_argument("--clients", type=int, default=None, help="client processes (default 10; --quick 5)")
    ap.add_argument("--chunk", type=int, default=DEFAULT_CHUNK, help=f"values per chunk (default {DEFAULT_CHUNK})")
    ap.add_argument("--rounds", type=int, default=2, help="rounds per run; the first is not timed (default 2)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs per protocol and mode, interleaved; the tables give the median round (default 1)")
    ap.add_argument("--protocols", default="plain,secagg+", help="comma-separated (default plain,secagg+)")
    ap.add_argument("--dropout", type=float, default=0.0,
                    help="fraction of clients that crash at the masked-input stage of the timed round (default 0); "
                         "SecAgg+ is planned for it (planned_dropout)")
    ap.add_argument("--lightsecagg-modes", default="held,bounded",
                    help="LightSecAgg's modes to run, comma-separated (default held,bounded)")
    ap.add_argument("--quick", action="store_true", help="d = 1e6, N = 5")
    ap.add_argument("--modes", default="whole,chunked",
                    help="plain's and SecAgg(+)'s upload modes, comma-separated (default whole,chunked; chunked is "
                         "the goal's and must be run)")
    ap.add_argument("--max-streams", type=int, default=None,
                    help="chunked uploads paced to this many clients at once (the servers' max_streams), plain's "
                         "and SecAgg(+)'s alike; default: every client at once")
    ap.add_argument("--link-mbit", type=float, default=None,
                    help="run the server and the clients in two network namespaces whose link carries at most this "
                         "many Mbit/s each way (tc tbf; needs root): the server's link, which every upload shares. "
                         "Default: loopback")
    ap.add_argument("--out", default="results/stream_tcp", help="where stream.csv and stream.md go")
    args = ap.parse_args(argv)
    dims = [int(float(x)) for x in (args.dims or ("1e6" if args.quick else "1e7,1e8")).split(",")]
    clients = args.clients or (5 if args.quick else 10)
    protocols = [p.strip() for p in args.protocols.split(",") if p.strip()]
    if "plain" not in protocols or set(protocols) - {"plain", "secagg+", "secagg", "lightsecagg"} or clients < 3 \
            or args.rounds < 1 or args.repeats < 1:
        ap.error("--protocols must include plain (the baseline) and name plain, secagg+, secagg or lightsecagg; "
                 "--clients >= 3")
    upload_modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    if "chunked" not in upload_modes or set(upload_modes) - {"whole", "chunked"}:
        ap.error("--modes names chunked (the goal's mode) and optionally whole")
    lsa_modes = tuple(m.strip() for m in args.lightsecagg_modes.split(",") if m.strip())
    if not lsa_modes or set(lsa_modes) - {"held", "bounded"}:
        ap.error("--lightsecagg-modes names held and/or bounded")
    if not 0.0 <= args.dropout < 0.5:
        ap.error("--dropout must be in [0, 0.5)")
    if args.max_streams is not None and args.max_streams < 1:
        ap.error("--max-streams must be at least 1")
    if args.link_mbit is not None:
        if not args.link_mbit > 0:
            ap.error("--link-mbit must be positive")
        if (reason := netns.unavailable()) is not None:
            ap.error(f"--link-mbit needs network namespaces: {reason}")
    link = "tcp://127.0.0.1" if args.link_mbit is None else f"a {args.link_mbit:g} Mbit/s link (tc tbf, each way)"
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: N={clients}, chunk={args.chunk}, "
          f"{args.rounds} rounds, dropout {args.dropout:.0%}, {link}, one process per party", flush=True)
    with contextlib.ExitStack() as stack:
        net = None if args.link_mbit is None else stack.enter_context(netns.NetnsPair(rate_mbit=args.link_mbit))
        rows = run(dims=dims, clients=clients, chunk=args.chunk, rounds=args.rounds, protocols=protocols,
                   dropout=args.dropout, lightsecagg_modes=lsa_modes, repeats=args.repeats, net=net,
                   upload_modes=upload_modes, max_streams=args.max_streams)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, data in (("stream_runs.csv", rows), ("stream.csv", rows := summarise(rows))):
        with open(out / name, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(data[0]))
            writer.writeheader()
            writer.writerows(data)
    (out / "stream.md").write_text(table(rows) + "\n")
    print(table(rows))
    by = {(r["d"], r["protocol"], r["mode"]): r for r in rows}
    for d in dims:
        for protocol in (p for p in protocols if p != "lightsecagg"):
            r = by[(d, protocol, "chunked")]
            print(f"stream protocol={protocol} d={d:.0e} n={clients} dropout={r['dropout']:.2f} mode=chunked round_s={r['round_s']:.3f} "
                  f"peak_rss_mb={r['peak_rss_mb']:.0f} bytes_per_param={r['bytes_per_param']:.3f}")
    for d in dims:
        if "lightsecagg" in protocols:  # a mode not run reads nan
            h, b = (by.get((d, "lightsecagg", m), {}) for m in ("held", "bounded"))
            nan = float("nan")
            print(f"stream_lightsecagg d={d:.0e} n={clients} dropout={dropouts_of(h, b):.2f} "
                  f"held_peak_rss_mb={h.get('peak_rss_mb', nan):.0f} bounded_peak_rss_mb={b.get('peak_rss_mb', nan):.0f} "
                  f"held_round_s={h.get('round_s', nan):.3f} bounded_round_s={b.get('round_s', nan):.3f} "
                  f"bounded_client_rss_mb={b.get('client_peak_rss_mb', nan):.0f}")
        secure = next((p for p in protocols if p not in ("plain", "lightsecagg")), None)
        if secure is None:
            continue
        s, p, w = by[(d, secure, "chunked")], by[(d, "plain", "chunked")], by.get((d, secure, "whole"), {})
        masking, link_s = float("nan"), link_seconds(s, d=d, clients=clients)
        if s.get("degree") is not None:
            masking = mask_cpu_seconds(clients=clients, degree=s["degree"], dropped=round(s["dropout"] * clients),
                                       mask_s=mask_seconds(d))
        print(f"stream_goal d={d:.0e} n={clients} dropout={s['dropout']:.2f} {secure.replace('+', 'plus')}_vs_plain={s['round_s'] / p['round_s']:.2f} "
              f"peak_rss_mb={s['peak_rss_mb']:.0f} goal_rss_mb={goal_rss_mb(d):.0f} whole_peak_rss_mb={w.get('peak_rss_mb', float('nan')):.0f} "
              f"gap_s={s['round_s'] - p['round_s']:.3f} mask_cpu_s={masking:.3g} cores={available_cores()} "
              f"link_mbit={s['link_mbit']} link_s={link_s:.3f} {secure.replace('+', 'plus')}_vs_link={s['round_s'] / link_s:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
