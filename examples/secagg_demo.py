"""Secure aggregation of weighted float vectors between real processes over tcp://127.0.0.1.

    python examples/secagg_demo.py --clients 8 --dim 100000 --protocol secagg+ --dropout 1

This process is the server; it starts one process per client (this script with --role client).
Each client draws a random float vector x_k and an example count w_k, encodes (w_k, w_k x_k) with
the FixedPointEncoder and takes part in one round of the chosen protocol. `--dropout` clients
crash on purpose: by default when asked for their input, i.e. in the stage where masked inputs
are collected (`--drop-stage input`), or on receiving their k-th request (`--drop-stage k`).
The server decodes the weighted mean from the ring sum and compares it with the float weighted
mean over the round's contributors. That reference needs the clients' data, so the demo
regenerates it from the public seed: a check only a demo can make.

Arguments are checked before any process starts (argparse error, exit code 2, naming the option):
at least 2 clients (more if the protocol and its `--param`s need more), a positive `--dim` and
`--stage-timeout`, and `--param`/`--client-param` names that the protocol's server/client really
take, e.g. `--param threshold_fraction=0.6` or `--param degree=4` for secagg+.
"""
from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from secagg.encoding import EncodingConfig, FixedPointEncoder
from secagg.messages import AbortError
from secagg.protocols import registry
from secagg.protocols.base import MAX_VECTOR_LENGTH, WrappedClient
from secagg.ring import Ring
from fl_algorithms.experiments.flags import add_common_flags

# transport (ZeroMQ) is imported where it is used, so that --help answers at once

MAX_WEIGHT = 1000  # largest example count a client may have


def client_data(seed: int, client_id: int, dim: int) -> tuple[np.ndarray, int]:
    """Demo data (public seed, so the server can check the result): a vector and an example count."""
    rng = np.random.default_rng([seed, client_id])
    return rng.normal(0.0, 1.0, dim), int(rng.integers(1, MAX_WEIGHT + 1))


def protocol_ring(name: str) -> Ring:
    """The ring the protocol sums in: Z_{2^32}, or F_p for LightSecAgg."""
    return registry.default_ring(name)


def encoder_for(n_clients: int, protocol: str) -> FixedPointEncoder:
    config = EncodingConfig(clip=8.0, max_weight=float(MAX_WEIGHT), max_clients=n_clients)
    return FixedPointEncoder(config, ring=protocol_ring(protocol))


# ---- client process ------------------------------------------------------------------------

class _DropOnRequest(WrappedClient):
    """Wraps a client protocol; the process exits on the k-th request of the round, unanswered."""

    def __init__(self, inner, k: int) -> None:
        super().__init__(inner)
        self.k, self.seen = k, 0

    def handle(self, msg):
        self.seen += 1
        if self.seen == self.k:
            os._exit(3)  # a crash: no goodbye, the server notices the closed connection
        return self.inner.handle(msg)


def run_client_process(args: argparse.Namespace) -> int:
    from transport.client import ClientConfig, ProtocolMismatchError, RegistrationError, run_client

    x, weight = client_data(args.seed, args.id, args.dim)
    encoder = encoder_for(args.clients, args.protocol)
    client_cls = registry.client_class(args.protocol)

    def input_fn() -> np.ndarray:
        if args.drop_stage == "input":
            os._exit(3)  # crash in the masked-input stage, before sending anything
        return encoder.encode(x, weight=weight)[0]

    def factory(round_id: int):
        proto = client_cls(client_id=args.id, round_id=round_id, input_fn=input_fn, **args.client_params)
        return _DropOnRequest(proto, int(args.drop_stage)) if args.drop_stage.isdigit() else proto

    try:
        run_client(endpoint=args.connect, client_id=args.id, factory=factory,
                   config=ClientConfig(hello_timeout=120.0, idle_timeout=args.stage_timeout * 10))
    except (RegistrationError, ProtocolMismatchError) as exc:
        print(f"client {args.id}: {exc}", file=sys.stderr)
        return 2
    return 0


# ---- server (this process) -----------------------------------------------------------------

def run_demo(args: argparse.Namespace) -> int:
    from transport.server import ServerDriver

    rng = np.random.default_rng(args.seed)
    droppers = set(rng.choice(np.arange(1, args.clients + 1), size=args.dropout, replace=False).tolist())
    encoder = encoder_for(args.clients, args.protocol)
    server_cls = registry.server_class(args.protocol)
    with ServerDriver("tcp://127.0.0.1:*") as driver:
        procs = [_spawn_client(args, cid, driver.endpoint, args.drop_stage if cid in droppers else "none")
                 for cid in range(1, args.clients + 1)]
        try:
            t0 = time.perf_counter()
            clients = driver.wait_for_clients(count=args.clients, timeout=120.0)
            if len(clients) < args.clients:
                print(f"only {len(clients)} of {args.clients} clients registered", file=sys.stderr)
                return 2
            startup = time.perf_counter() - t0
            protocol = server_cls(round_id=1, clients=sorted(clients), length=args.dim + 1, **args.params)
            try:
                report = driver.run_round(protocol, stage_timeout=args.stage_timeout)
            except AbortError as exc:
                print(f"round aborted: {exc}")
                return 1
        finally:
            driver.shutdown()
            _reap(procs)

    result = report.result
    decoded = encoder.decode(result.ring_sum)
    weighted_sum, total_weight = np.zeros(args.dim), 0.0
    for cid in sorted(result.contributors):
        x, w = client_data(args.seed, cid, args.dim)
        weighted_sum += w * np.clip(x, -encoder.config.clip, encoder.config.clip)
        total_weight += w
    error = float(np.max(np.abs(decoded.mean - weighted_sum / total_weight)))
    bound = encoder.mean_error_bound(n_clients=len(result.contributors), total_weight=total_weight)

    print(f"protocol      {args.protocol}")
    print(f"clients       {args.clients} (started and registered in {startup:.2f} s)")
    print(f"dimension     {args.dim}")
    print(f"dropouts      {args.dropout} planned {sorted(droppers)} at stage '{args.drop_stage}'; "
          f"found missing: {_fmt_dropped(result.dropped)}")
    print(f"contributors  {len(result.contributors)}: {sorted(result.contributors)}")
    print(f"total weight  decoded {decoded.total_weight:.3f}, true {total_weight:.0f}")
    print(f"max |error|   {error:.3e} of the weighted mean (encoder bound {bound:.3e})"
          f" -> {'OK' if error <= bound else 'ABOVE BOUND'}")
    print("time / stage  " + ", ".join(f"{s} {t * 1e3:.1f} ms" for s, t in report.stage_seconds.items())
          + f"; round {report.seconds * 1e3:.1f} ms")
    print(f"bytes         received {sum(report.bytes_received.values()):,}, sent {sum(report.bytes_sent.values()):,}")
    return 0 if error <= bound else 1


def _spawn_client(args: argparse.Namespace, cid: int, endpoint: str, drop_stage: str) -> subprocess.Popen:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--role", "client", "--id", str(cid),
           "--connect", endpoint, "--clients", str(args.clients), "--dim", str(args.dim),
           "--protocol", args.protocol, "--seed", str(args.seed), "--drop-stage", drop_stage,
           "--stage-timeout", str(args.stage_timeout)]
    for p in args.client_param:
        cmd += ["--client-param", p]
    return subprocess.Popen(cmd)


def _reap(procs: list[subprocess.Popen], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _fmt_dropped(dropped) -> str:
    return ", ".join(f"{sorted(ids)} in '{stage}'" for stage, ids in dropped.items()) or "none"


def parser() -> argparse.ArgumentParser:
    """The demo's options (the hidden --role/--id/--connect start its client processes)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clients", type=int, default=8, help="client processes to start (at least 2)")
    p.add_argument("--dim", type=int, default=100_000, help="length of each client's float vector")
    add_common_flags(p, protocols=registry.names(), protocol_default="secagg+")
    p.add_argument("--dropout", type=int, default=1, help="how many clients crash during the round")
    p.add_argument("--drop-stage", default="input",
                   help="'input' (the masked-input stage) or k: crash on the k-th server request")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="extra server protocol argument, e.g. threshold_fraction=0.6 (checked against the protocol)")
    p.add_argument("--client-param", action="append", default=[], metavar="NAME=VALUE",
                   help="extra client protocol argument, e.g. max_length=1000000 (checked against the protocol)")
    p.add_argument("--seed", type=int, default=0, help="public seed of the clients' data and the dropouts")
    p.add_argument("--stage-timeout", type=float, default=30.0, help="seconds per stage")
    p.add_argument("--role", choices=["server", "client"], default="server", help=argparse.SUPPRESS)
    p.add_argument("--id", type=int, help=argparse.SUPPRESS)
    p.add_argument("--connect", help=argparse.SUPPRESS)
    return p


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Every value the demo would otherwise hang or trace back on is an argparse error (exit code 2);
    sets args.params and args.client_params, the checked protocol keywords."""
    from transport.cli import MAX_CLIENTS, check_client_params, check_server_params

    if not 2 <= args.clients <= MAX_CLIENTS:
        p.error(f"--clients must be at least 2 (a secure sum of one client is that client's input) "
                f"and at most {MAX_CLIENTS}, got {args.clients}")
    if not 1 <= args.dim < MAX_VECTOR_LENGTH:
        p.error(f"--dim must be at least 1 and below {MAX_VECTOR_LENGTH} (one slot holds the weight), got {args.dim}")
    if not (math.isfinite(args.stage_timeout) and args.stage_timeout > 0):
        p.error(f"--stage-timeout must be positive and finite, got {args.stage_timeout}")
    if args.seed < 0:
        p.error(f"--seed must be at least 0, got {args.seed}")
    if args.drop_stage not in ("input", "none") and not (args.drop_stage.isdigit() and int(args.drop_stage) > 0):
        p.error(f"--drop-stage is 'input' or a positive integer, got {args.drop_stage!r}")
    if not 0 <= args.dropout < args.clients:
        p.error(f"--dropout must be between 0 and --clients - 1 = {args.clients - 1}, got {args.dropout}")
    if args.role == "client" and (args.id is None or args.id < 1 or not args.connect):
        p.error("--role client needs --id (at least 1) and --connect")
    try:
        args.params = check_server_params(args.protocol, args.param, clients=args.clients, length=args.dim + 1)
        args.client_params = check_client_params(args.protocol, args.client_param, option="--client-param")
    except ValueError as exc:
        p.error(str(exc))


def main(argv: list[str] | None = None) -> int:
    """Check the arguments, then run the demo (server) or one of its client processes."""
    p = parser()
    args = p.parse_args(argv)
    check_args(p, args)
    return run_client_process(args) if args.role == "client" else run_demo(args)


if __name__ == "__main__":
    sys.exit(main())
