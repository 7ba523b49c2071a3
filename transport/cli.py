"""Deployment CLI: a server process and client processes over tcp:// (or ipc://).

    python -m transport.cli server --protocol secagg+ --clients 50 --dim 1000000 --port 5555 --check
    python -m transport.cli client --id 7 --connect tcp://127.0.0.1:5555 --protocol secagg+ --dim 1000000
    python -m transport.cli keygen --dir keys --clients 50      # then --curve-dir keys on both sides

Clients sum a deterministic synthetic vector (`synthetic_input`), so the server can check the
exact ring sum over the round's contributors (`--check`); this makes the CLI a smoke test and a
benchmark harness for the transport and the protocols. Protocols are chosen by registry name;
`--param name=value` passes extra constructor arguments (e.g. `--param degree=10`).
The server prints one JSON line per round.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from secagg.messages import AbortError
from secagg.protocols import registry
from secagg.ring import RING_2_32, Ring

from transport.client import ClientConfig, RegistrationError, run_client
from transport.server import RoundReport, ServerConfig, ServerDriver
from transport.sockets import load_client_keys, load_server_keys, write_keys


def synthetic_input(client_id: int, round_id: int, length: int) -> np.ndarray:
    """A public 30-bit test vector: valid in Z_{2^32} and in F_p (p = 2^31 - 1) alike."""
    v = np.arange(length, dtype=np.uint32)
    v *= np.uint32(2654435761)
    v += np.uint32((client_id * 40503 + round_id * 7919) & 0xFFFFFFFF)
    v &= np.uint32(0x3FFFFFFF)
    return v


def float_input(dim: int, *, n_clients: int, ring: Ring) -> np.ndarray:
    """What a trivial FL client uploads: a fresh uniform(-0.5, 0.5) float vector of `dim` values with
    weight 100 (its example count), fixed-point encoded for the ring (length dim + 1)."""
    from secagg.encoding import EncodingConfig, FixedPointEncoder

    x = np.random.default_rng().uniform(-0.5, 0.5, dim).astype(np.float32)
    enc = FixedPointEncoder(EncodingConfig(clip=8.0, max_weight=100.0, max_clients=n_clients), ring=ring)
    return enc.encode(x, weight=100.0)[0]


def synthetic_sum(client_ids: Iterable[int], round_id: int, length: int, *, ring: Ring = RING_2_32) -> np.ndarray:
    """The exact ring sum of the synthetic inputs of `client_ids`."""
    total = np.zeros(length, dtype=np.uint32)
    for cid in client_ids:
        ring.add_(total, synthetic_input(cid, round_id, length))
    return total


def parse_params(pairs: list[str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or not name.isidentifier():
            raise SystemExit(f"--param expects name=value, got {pair!r}")
        for cast in (int, float):
            try:
                out[name] = cast(raw)
                break
            except ValueError:
                continue
        else:
            out[name] = raw
    return out


def _endpoint(args: argparse.Namespace) -> str:
    return args.endpoint or f"tcp://{args.host}:{args.port if args.port else '*'}"


# ---- server -------------------------------------------------------------------------------

def serve(args: argparse.Namespace) -> int:
    server_cls = registry.server_class(args.protocol)
    params = parse_params(args.param)
    curve = load_server_keys(Path(args.curve_dir)) if args.curve_dir else None
    with ServerDriver(_endpoint(args), config=ServerConfig(), curve=curve) as driver:
        if args.endpoint_file:
            Path(args.endpoint_file).write_text(driver.endpoint)
        print(json.dumps({"event": "listening", "endpoint": driver.endpoint}), flush=True)
        t0 = time.perf_counter()
        clients = driver.wait_for_clients(count=args.clients, timeout=args.register_timeout)
        registered = time.perf_counter() - t0
        if len(clients) < args.clients:
            print(json.dumps({"event": "error", "error": f"only {len(clients)} of {args.clients} clients registered"}),
                  flush=True)
            return 2
        failures = 0
        for round_id in range(1, args.rounds + 1):
            length = args.dim + 1 if args.float_input else args.dim
            protocol = server_cls(round_id=round_id, clients=sorted(driver.clients), length=length, **params)
            try:
                report = driver.run_round(protocol, stage_timeout=args.stage_timeout)
            except AbortError as exc:
                print(json.dumps({"event": "aborted", "round": round_id, "error": str(exc)}), flush=True)
                failures += 1
                continue
            line = _round_line(args, round_id, report, registered, protocol.ring)
            failures += line.get("sum_ok") is False
            print(json.dumps(line), flush=True)
    return 1 if failures else 0


def _round_line(args: argparse.Namespace, round_id: int, report: RoundReport, registered: float,
                ring: Ring) -> dict:
    res = report.result
    line = {
        "event": "round", "round": round_id, "protocol": args.protocol, "clients": args.clients,
        "dim": args.dim, "contributors": sorted(res.contributors),
        "dropped": {stage: sorted(ids) for stage, ids in res.dropped.items()},
        "stage_seconds": {k: round(v, 4) for k, v in report.stage_seconds.items()},
        "server_seconds": {k: round(v, 4) for k, v in report.server_seconds.items()},
        "round_seconds": round(report.seconds, 4), "register_seconds": round(registered, 4),
        "bytes_received": sum(report.bytes_received.values()), "bytes_sent": sum(report.bytes_sent.values()),
        "rejected": report.rejected,
    }
    if args.check and not args.float_input:
        expected = synthetic_sum(res.contributors, round_id, args.dim, ring=ring)
        line["sum_ok"] = bool(np.array_equal(expected, res.ring_sum))
    return line


# ---- client -------------------------------------------------------------------------------

def client(args: argparse.Namespace) -> int:
    client_cls = registry.client_class(args.protocol)
    params = parse_params(args.param)
    curve = load_client_keys(Path(args.curve_dir), args.id) if args.curve_dir else None
    cid = args.id

    def factory(round_id: int):
        def input_fn() -> np.ndarray:
            if args.drop_at_input and (args.drop_round is None or round_id == args.drop_round):
                logging.getLogger(__name__).info("client %d drops before sending its input", cid)
                raise SystemExit(3)  # a crash at the masked-input stage, for dropout tests
            if args.float_input:
                return float_input(args.dim, n_clients=args.max_clients, ring=registry.default_ring(args.protocol))
            return synthetic_input(cid, round_id, args.dim)
        return client_cls(client_id=cid, round_id=round_id, input_fn=input_fn, **params)

    config = ClientConfig(hello_timeout=args.hello_timeout, idle_timeout=args.idle_timeout)
    try:
        summary = run_client(endpoint=args.connect, client_id=cid, factory=factory, config=config, curve=curve)
    except RegistrationError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    print(json.dumps({"event": "client_exit", "client": cid, "reason": summary.exit_reason,
                      "rounds": list(summary.rounds), "rejected": summary.rejected}), flush=True)
    return 0


# ---- keys and argument parsing ------------------------------------------------------------

def keygen(args: argparse.Namespace) -> int:
    write_keys(Path(args.dir), clients=args.clients)
    print(f"wrote server and {args.clients} client key pairs to {args.dir}")
    return 0


def _at_least(kind, low):
    """argparse type: a `kind` number >= low (an argparse error, exit code 2, otherwise)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value >= low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {text}")
        return value
    return parse


def _positive_float(text: str) -> float:
    value = _at_least(float, 0.0)(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be positive")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m transport.cli", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("server", help="run rounds over a ROUTER socket")
    s.add_argument("--protocol", default="secagg+", choices=registry.names(),
                   help="secure-sum protocol (default secagg+); clients must run the same one")
    s.add_argument("--clients", type=_at_least(int, 2), required=True, help="wait for this many clients")
    s.add_argument("--dim", type=_at_least(int, 1), required=True, help="vector length summed per round")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=_at_least(int, 0), default=0, help="0 picks a free port (see --endpoint-file)")
    s.add_argument("--endpoint", help="bind here instead of tcp://HOST:PORT (e.g. ipc:///tmp/sa)")
    s.add_argument("--endpoint-file", help="write the bound endpoint to this file")
    s.add_argument("--rounds", type=_at_least(int, 1), default=1)
    s.add_argument("--stage-timeout", type=_positive_float, default=60.0)
    s.add_argument("--register-timeout", type=_positive_float, default=60.0)
    s.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    s.add_argument("--curve-dir", help="CurveZMQ keys from `keygen`: server secret + client allowlist")
    s.add_argument("--check", action="store_true", help="verify the exact sum of the synthetic inputs")
    s.add_argument("--float-input", action="store_true", help="clients encode random float vectors (length dim + 1)")
    s.set_defaults(run=serve)

    c = sub.add_parser("client", help="answer a server's rounds over a DEALER socket")
    c.add_argument("--id", type=_at_least(int, 1), required=True)
    c.add_argument("--connect", required=True)
    c.add_argument("--dim", type=_at_least(int, 1), required=True)
    c.add_argument("--protocol", default="secagg+", choices=registry.names(),
                   help="must match the server's (default secagg+)")
    c.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    c.add_argument("--curve-dir")
    c.add_argument("--hello-timeout", type=_positive_float, default=60.0)
    c.add_argument("--idle-timeout", type=_positive_float, default=600.0)
    c.add_argument("--drop-at-input", action="store_true", help="exit when asked for the (masked) input")
    c.add_argument("--drop-round", type=int, help="with --drop-at-input: only in this round")
    c.add_argument("--float-input", action="store_true", help="encode a random float vector, as a trivial FL client")
    c.add_argument("--max-clients", type=int, default=1000, help="with --float-input: the encoder's client bound")
    c.set_defaults(run=client)

    k = sub.add_parser("keygen", help="write CurveZMQ key pairs for a server and its clients")
    k.add_argument("--dir", required=True)
    k.add_argument("--clients", type=_at_least(int, 1), required=True)
    k.set_defaults(run=keygen)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
