"""Round time against network round-trip time: every protocol over tcp with 0, 20 and 100 ms RTT added,
the server and the clients in separate network namespaces (`benchmarks.netns`; loopback where those
are unavailable). Round trips, not bytes, dominate small rounds in real deployments: the slope of
round time against RTT is the number of sequential round trips a round costs.

    python -m benchmarks.latency                # N = 10 clients, d = 1e4, RTT 0 / 20 / 100 ms
    python -m benchmarks.latency --rtts 0,50 --clients 20 --dim 100000

The delay: tc netem on the veth link where the kernel has it, otherwise a userspace relay in front of
the server that holds every chunk for RTT / 2 in each direction (`benchmarks.delay_relay`; latency
only, no bandwidth limit or loss). Runs `--insecure` (no CurveZMQ) to time the protocols alone; the
enrolled deployment is exercised by `make test-netns`. Ends with one line per protocol and RTT:

    latency protocol=secagg+ rtt_ms=20 round_s=.. round_trips=..
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTOCOLS = ("plain", "secagg", "secagg+", "lightsecagg")
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


@contextlib.contextmanager
def _sites(use_netns: bool) -> Iterator[tuple[callable, str, str]]:
    """(popen(side, argv), server host, client-reachable host): namespaces or plain loopback."""
    if use_netns:
        from benchmarks.netns import NetnsPair

        with NetnsPair() as net:
            yield (lambda side, argv, **kw: net.popen(side, ["env", f"PYTHONPATH={ROOT}", *argv], **kw),
                   "127.0.0.1", net.server_ip)
    else:
        yield (lambda side, argv, **kw: subprocess.Popen(argv, env=ENV, **kw)), "127.0.0.1", "127.0.0.1"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(protocol: str, *, rtt_ms: float, clients: int, dim: int, rounds: int, use_netns: bool) -> float:
    """Median round seconds (rounds after the first) of one server and `clients` client processes."""
    py = [sys.executable, "-m"]
    with tempfile.TemporaryDirectory() as tmp, _sites(use_netns) as (popen, bind, reach):
        ep = Path(tmp) / "endpoint"
        server = popen("server", py + ["transport.cli", "server", "--insecure", "--protocol", protocol, "--clients",
                                       str(clients), "--dim", str(dim), "--rounds", str(rounds), "--float-input",
                                       "--host", bind, "--port", "0", "--endpoint-file", str(ep),
                                       "--stage-timeout", "120", "--register-timeout", "120"],
                       cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        deadline = time.monotonic() + 60
        while not ep.exists() or not ep.read_text():
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                raise RuntimeError(f"{protocol} server did not start")
            time.sleep(0.05)
        port = int(ep.read_text().strip().rsplit(":", 1)[1])
        relay_port = _free_port()
        listen = reach if use_netns else "127.0.0.1"
        relay = popen("server", py + ["benchmarks.delay_relay", "--listen", f"{listen}:{relay_port}",
                                      "--target", f"{bind}:{port}", "--delay-ms", str(rtt_ms / 2)],
                      cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        endpoint = f"tcp://{reach}:{relay_port}"
        procs = [popen("client", py + ["transport.cli", "client", "--insecure", "--id", str(k), "--connect", endpoint,
                                       "--dim", str(dim), "--protocol", protocol, "--float-input",
                                       "--max-clients", str(clients), "--idle-timeout", "120"],
                       cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for k in range(1, clients + 1)]
        try:
            out, _ = server.communicate(timeout=600)
        finally:
            relay.kill()
            for p in procs:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
    done = [json.loads(line) for line in out.splitlines() if line.startswith("{") and '"event": "round"' in line]
    if len(done) != rounds:
        raise RuntimeError(f"{protocol} at {rtt_ms} ms: {len(done)} of {rounds} rounds finished")
    return statistics.median(r["round_seconds"] for r in done[1:] or done)


def main(argv: Sequence[str] | None = None) -> dict[tuple[str, float], float]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rtts", default="0,20,100", help="round-trip times to add, ms")
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--dim", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3, help="rounds per run; the first is discarded")
    ap.add_argument("--protocols", default=",".join(PROTOCOLS))
    ap.add_argument("--loopback", action="store_true", help="skip the namespaces even where they work")
    args = ap.parse_args(argv)
    try:
        rtts = [float(x) for x in args.rtts.split(",")]
    except ValueError:
        ap.error("--rtts must be comma-separated numbers")
    protocols = [p for p in args.protocols.split(",") if p]
    if min(rtts) < 0 or args.clients < 3 or args.dim < 1 or args.rounds < 1 or set(protocols) - set(PROTOCOLS):
        ap.error("need rtts >= 0, --clients >= 3, --dim >= 1, --rounds >= 1 and known protocols")
    use_netns = False
    if not args.loopback:
        from benchmarks.netns import unavailable

        reason = unavailable()
        use_netns = reason is None
        if reason:
            print(f"network namespaces unavailable ({reason}): loopback with the delay relay", flush=True)
    print(f"{'namespaces joined by veth' if use_netns else 'loopback'}; delay by a userspace relay "
          f"(RTT/2 each way); N={args.clients} d={args.dim}", flush=True)
    results: dict[tuple[str, float], float] = {}
    for protocol in protocols:
        for rtt in rtts:
            results[(protocol, rtt)] = measure(protocol, rtt_ms=rtt, clients=args.clients, dim=args.dim,
                                               rounds=args.rounds, use_netns=use_netns)
            print(f"  {protocol:11s} RTT {rtt:5.0f} ms: round {results[(protocol, rtt)]:.3f} s", flush=True)
    base = min(rtts)
    for protocol in protocols:
        for rtt in rtts:
            trips = ((results[(protocol, rtt)] - results[(protocol, base)]) / (rtt / 1000.0)) if rtt > base else 0.0
            print(f"latency protocol={protocol} rtt_ms={rtt:g} round_s={results[(protocol, rtt)]:.3f} "
                  f"round_trips={trips:.1f}", flush=True)
    return results


if __name__ == "__main__":
    main()
