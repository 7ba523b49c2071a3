"""Side-by-side, in one run: our plain / SecAgg+ / SecAgg rounds (one process per client over
tcp://127.0.0.1), Flower 1.42's SecAgg+ round in its own simulation runtime, and the physical floor
of the mask work. Every client is a trivial FL client: a fresh uniform(-0.5, 0.5) float vector of
d values with 100 examples, fixed-point encoded (our plain round encodes too, so the secure/plain
ratio isolates the cost of security).

    python -m benchmarks.secagg_vs_flower --clients 50 --dim 1000000 [--flower-secagg]

The last line is
    N=.. d=.. ours_plain_s=.. ours_secaggplus_s=.. ours_secagg_s=.. flower_secaggplus_s=.. mask_floor_s=..
    overhead_vs_plain=.. overhead_vs_floor=.. speedup_vs_flower=..
with overhead_vs_floor = (ours_secaggplus_s - ours_plain_s) / mask_floor_s. Round times are
medians over rounds after the first (which pays connection set-up), like Flower's.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.mask_floor import mask_floor_seconds, secagg_plus_mask_count
from secagg.encoding import EncodingConfig, FixedPointEncoder
from secagg.protocols import registry
from secagg.simulate import run_round

ROOT = Path(__file__).resolve().parents[1]


def _loadavg() -> float:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except OSError:
        return float("nan")


def ours_tcp(*, protocol: str, clients: int, dim: int, rounds: int, params: dict[str, str], dropouts: int = 0,
             float_input: bool = True, max_message_mib: int | None = None,
             client_params: dict[str, str] | None = None, net=None) -> dict:
    """Server and `clients` client processes over loopback tcp; median round wall time after round 1.
    `net` (a `benchmarks.netns.NetnsPair`): the server in its namespace, the clients in theirs, over its link.

    `params` go to the server's `--param`, `client_params` to every client's. With `dropouts`, that many
    clients crash at the masked-input stage of the last round. Runs
    `--insecure` (no CurveZMQ, no signed keys) to compare like for like with Flower's SecAgg+ over
    plain gRPC; an enrolled deployment adds transport encryption and one signature per client-round.
    `float_input=False`: clients send the deterministic synthetic ring vectors instead (no encoder, a
    quarter of the client memory at large d). Also returns the server's peak RSS (VmHWM, MiB), the
    largest client process's (ru_maxrss from wait4, MiB) and the client processes' CPU seconds in all
    (their whole lives: imports, every round).
    """
    py = [sys.executable, "-m", "transport.cli"]
    extra = [x for k, v in params.items() for x in ("--param", f"{k}={v}")]  # server-side parameters
    limit = ["--max-message-mib", str(max_message_mib)] if max_message_mib is not None else []  # both sides
    extra += limit
    client_extra = [x for k, v in (client_params or {}).items() for x in ("--param", f"{k}={v}")]
    floats = ["--float-input"] if float_input else []
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

    def start(side: str, argv: list[str], **kwargs) -> subprocess.Popen:
        if net is None:
            return subprocess.Popen(argv, cwd=ROOT, env=env, **kwargs)
        return net.popen(side, ["env", f"PYTHONPATH={ROOT}", *argv], cwd=ROOT, env=env, **kwargs)

    host = ["--host", net.server_ip] if net is not None else []
    with tempfile.TemporaryDirectory() as tmp:
        ep_file = Path(tmp) / "endpoint"
        server = start("server", py + ["server", "--insecure", "--protocol", protocol, "--clients", str(clients), "--dim", str(dim),
                                       "--port", "0", "--endpoint-file", str(ep_file), "--rounds", str(rounds), *host,
                                       *floats, "--stage-timeout", "600", "--register-timeout", "300", *extra],
                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        deadline = time.monotonic() + 60
        while not ep_file.exists() or not ep_file.read_text():
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                raise RuntimeError("our server did not start")
            time.sleep(0.05)
        endpoint = ep_file.read_text().strip()
        drop = ["--drop-at-input", "--drop-round", str(rounds)]
        procs = [start("client", py + ["client", "--insecure", "--id", str(i), "--connect", endpoint, "--dim", str(dim),
                                       "--protocol", protocol, *floats, "--max-clients", str(clients), *limit, *client_extra,
                                       *(drop if i > clients - dropouts else [])],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for i in range(1, clients + 1)]
        client_rss, client_cpu = [], []
        try:
            out, _ = server.communicate(timeout=1800)
        finally:
            for p in procs:
                usage = _wait_usage(p, timeout=30)
                if usage is None:
                    p.kill()
                else:
                    client_rss.append(usage.ru_maxrss / 1024)  # KiB on Linux
                    client_cpu.append(usage.ru_utime + usage.ru_stime)
    lines = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    done = [l for l in lines if l.get("event") == "round"]
    expected = [clients] * (rounds - 1) + [clients - dropouts]
    if [len(l["contributors"]) for l in done] != expected:
        raise RuntimeError(f"our {protocol} run did not complete all rounds: {lines[-3:]}")
    measured = done[1:] if rounds > 1 else done
    stages = {k: statistics.median(l["stage_seconds"][k] for l in measured) for k in measured[0]["stage_seconds"]}
    per_client = statistics.median(l["bytes_received"] for l in measured) / clients
    return {"round_s": statistics.median(l["round_seconds"] for l in measured), "stages": stages,
            "bytes_per_param": per_client / dim, "peak_rss_mb": max(l.get("peak_rss_mb") or 0.0 for l in done),
            "client_peak_rss_mb": max(client_rss, default=0.0), "peak_stage": _peak_stage(done),
            "client_cpu_s": sum(client_cpu), "setting": done[-1].get("setting", ""),
            "stage_peak_rss_mb": done[-1].get("stage_peak_rss_mb") or {}}


def _peak_stage(rounds: list[dict]) -> str:
    """The stage at whose end the server's VmHWM first reached its peak ("" where the lines have none)."""
    top = max((l.get("peak_rss_mb") or 0.0) for l in rounds)
    for line in rounds:
        for stage, peak in (line.get("stage_peak_rss_mb") or {}).items():
            if peak >= top:
                return f"round {line['round']} {stage}"
    return ""


def _wait_usage(proc: subprocess.Popen, *, timeout: float):
    """Reap `proc` within `timeout` seconds and return its resource usage (from wait4: peak RSS, CPU
    seconds), or None if it is still running."""
    deadline = time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return usage
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


def ours_in_process(*, protocol: str, clients: int, dim: int, params: dict, repeats: int = 2) -> float:
    """All parties in this process (in-memory driver), clients run one after another on one core."""
    ring = registry.default_ring(protocol)
    enc = FixedPointEncoder(EncodingConfig(clip=8.0, max_weight=100.0, max_clients=clients), ring=ring)
    rng = np.random.default_rng(0)
    times = []
    for r in range(repeats):
        xs = {c: rng.uniform(-0.5, 0.5, dim).astype(np.float32) for c in range(1, clients + 1)}
        server = registry.server_class(protocol)(round_id=r + 1, clients=list(xs), length=dim + 1, **params)
        cls = registry.client_class(protocol)
        cl = {c: cls(client_id=c, round_id=r + 1, input_fn=lambda x=x: enc.encode(x, weight=100.0)[0]) for c, x in xs.items()}
        t0 = time.perf_counter()
        run_round(server, cl)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--dim", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=4, help="rounds per run; the first is discarded")
    ap.add_argument("--degree", type=int, default=10, help="SecAgg+ neighbours (Flower's num_shares k = degree + 1)")
    ap.add_argument("--flower-secagg", action="store_true", help="also time Flower's full SecAgg (minutes per round)")
    ap.add_argument("--skip-flower", action="store_true")
    args = ap.parse_args(argv)
    if args.clients < 3 or args.dim < 1 or args.rounds < 1:
        raise SystemExit("need --clients >= 3, --dim >= 1, --rounds >= 1")
    N, d = args.clients, args.dim
    plus_params = {"degree": str(args.degree)}
    print(f"load average at start: {_loadavg():.2f} (2 cores)", flush=True)

    ours = {}
    for name, proto, params in (("plain", "plain", {}), ("secagg+", "secagg+", plus_params), ("secagg", "secagg", {})):
        ours[name] = ours_tcp(protocol=proto, clients=N, dim=d, rounds=args.rounds, params=params)
        stages = ", ".join(f"{k} {v:.3f}" for k, v in ours[name]["stages"].items())
        print(f"ours {name:8s} tcp round {ours[name]['round_s']:.3f} s  [{stages}]  "
              f"{ours[name]['bytes_per_param']:.3f} B/param uploaded  load {_loadavg():.2f}", flush=True)
    inproc = {name: ours_in_process(protocol=name, clients=N, dim=d, params=({"degree": args.degree} if name == "secagg+" else {}))
              for name in ("plain", "secagg+")}
    floor = mask_floor_seconds(clients=N, degree=args.degree, length=d + 1)
    n_masks = secagg_plus_mask_count(clients=N, degree=args.degree)
    print(f"ours in-process (one core): plain {inproc['plain']:.3f} s, secagg+ {inproc['secagg+']:.3f} s; "
          f"mask floor {floor:.3f} s for {n_masks} masks; in-process overhead_vs_floor "
          f"{(inproc['secagg+'] - inproc['plain']) / floor:.2f}", flush=True)

    flower_plus = flower_secagg = float("nan")
    if not args.skip_flower:
        from benchmarks.flower_baseline import flower_is_installed, measure_flower

        if flower_is_installed():
            fl = measure_flower(clients=N, dim=d, protocol="secagg+", num_shares=args.degree + 1, rounds=max(args.rounds - 1, 1))
            flower_plus = fl["round_s"]
            print(f"flower secagg+ round {flower_plus:.3f} s (cpu {fl.get('cpu_s', float('nan')):.2f} s, "
                  f"runtime {fl.get('runtime')})  load {_loadavg():.2f}", flush=True)
            if args.flower_secagg:
                fs = measure_flower(clients=N, dim=d, protocol="secagg", rounds=1)
                flower_secagg = fs["round_s"]
                print(f"flower secagg round {flower_secagg:.3f} s; ours {ours['secagg']['round_s']:.3f} s; "
                      f"secagg_speedup_vs_flower={flower_secagg / ours['secagg']['round_s']:.2f}", flush=True)
        else:
            print("flower not installed: run `make bench-flower` for the Flower columns", flush=True)

    p, s, f = ours["plain"]["round_s"], ours["secagg+"]["round_s"], ours["secagg"]["round_s"]
    print(f"N={N} d={d} ours_plain_s={p:.3f} ours_secaggplus_s={s:.3f} ours_secagg_s={f:.3f} "
          f"flower_secaggplus_s={flower_plus:.3f} mask_floor_s={floor:.3f} overhead_vs_plain={s / p:.2f} "
          f"overhead_vs_floor={(s - p) / floor:.2f} speedup_vs_flower={flower_plus / s:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
