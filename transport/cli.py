"""Deployment CLI: a server process and client processes over tcp:// (or ipc://).

    python -m transport.cli server --keys keys --protocol secagg+ --clients 50 --dim 1000000 --port 5555 --check
    python -m transport.cli client --keys keys --id 7 --connect tcp://127.0.0.1:5555 --protocol secagg+ --dim 1000000

Enrolment (`transport.enrolment`), without a trusted dealer: every party makes its own keys and
only public entries travel; then each passes `--keys` its own folder with the roster copied in:

    python -m transport.cli enrol-client --dir keys --id 7      # on each client's machine
    python -m transport.cli init-server --dir keys              # on the server's machine
    python -m transport.cli roster --dir roster --server server.public.json --entry client-*.public.json

`enrol --dir keys --clients 50` (alias `keygen`) is the trusted dealer: one machine makes every
party's secrets in one folder (quick for tests and single-operator setups; that machine must not be
the server, and each client's secrets must reach it privately).

Clients sum a deterministic synthetic vector (`synthetic_input`), so the server can check the
exact ring sum over the round's contributors (`--check`); this makes the CLI a smoke test and a
benchmark harness for the transport and the protocols. Protocols are chosen by registry name with
`--protocol` (default secagg+, on both sides; server and clients must run the same one);
`--param name=value` passes extra constructor arguments (e.g. `--param degree=10`), checked against
the protocol's real keyword arguments. The server prints one JSON line per round.

Deployment is authenticated by default: both sides need `--keys DIR`, a folder with the roster and
that party's own secrets (CurveZMQ with a client allowlist and a pinned server key, client ids
bound to keys at the handshake, round keys signed with each client's enrolled key). `--insecure`
runs without any of it, for development on a trusted machine only, and says so loudly.

`--max-message-mib` and `--max-frames` (server and client) set the largest message a side reads
(`transport.framing.FrameLimits`; default 64 MiB in 64 frames): raise them on the side that
receives bigger vectors or models. The server refuses, before any socket opens, a --dim whose
protocol replies would not fit.

Every argument is checked before any socket opens: a bad value is an argparse error (exit code 2)
naming the option. Both sides announce their session (protocol and vector length) at registration:
a client whose server runs another protocol, or sums vectors of another length, is refused and
exits with code 2 and a message naming both sides (SecAgg and SecAgg+ share message kinds, so no
later request could tell them apart); a server short of clients says how many it refused, and one
whose round nobody answered says which protocol and length it ran.
"""
from __future__ import annotations

import argparse
import inspect
import json
import logging
import math
import re
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import zmq

from secagg.messages import MAX_CLIENT_ID, AbortError, Message
from secagg.protocols import registry
from secagg.protocols.base import MAX_VECTOR_LENGTH, ClientProtocol, WrappedClient
from secagg.ring import RING_2_32, Ring

from transport.client import ClientConfig, ProtocolMismatchError, RegistrationError, run_client
from transport.enrolment import (ROSTER, EnrolmentError, assemble_roster, check_entries, client_public_name,
                                 enrol, enrol_client, init_server, load_client, load_server, read_client_entry,
                                 read_server_entry, roster_fingerprint)
from transport.framing import DEFAULT_LIMITS, FrameLimits
from transport.server import RoundReport, ServerConfig, ServerDriver, peak_rss_mb, release_large_buffers

MAX_CLIENTS = ServerConfig().max_clients
"""Most clients one server registers (the driver's own limit)."""
MIB = 1 << 20
MAX_MESSAGE_MIB = 4096
"""Upper bound of --max-message-mib (4 GiB): four times the largest vector a protocol accepts
(MAX_VECTOR_LENGTH = 2^28 values of 4 bytes, 1 GiB), room for the largest round's replies or a
float32 model of 2^30 values. A server may hold about twice its limit per connection
(`ServerConfig`), so a limit above what the run needs only buys memory exposure."""
MIN_FRAMES, MAX_FRAMES = 8, 256
"""Bounds of --max-frames: the protocols' and the FL engine's own messages have up to 6 frames
(header and payload fields), and the framing encodes at most 255 fields, so no message has more
than 256 frames."""


def synthetic_input(client_id: int, round_id: int, length: int) -> np.ndarray:
    """A public 30-bit test vector: valid in Z_{2^32} and in F_p (p = 2^31 - 1) alike."""
    v = np.arange(length, dtype=np.uint32)
    v *= np.uint32(2654435761)
    v += np.uint32((client_id * 40503 + round_id * 7919) & 0xFFFFFFFF)
    v &= np.uint32(0x3FFFFFFF)
    return v


def _float_encoder(*, n_clients: int, ring: Ring):
    """The encoder of `float_input`; ValueError if the ring cannot hold a sum of n_clients."""
    from secagg.encoding import EncodingConfig, FixedPointEncoder

    return FixedPointEncoder(EncodingConfig(clip=8.0, max_weight=100.0, max_clients=n_clients), ring=ring)


def float_input(dim: int, *, n_clients: int, ring: Ring) -> np.ndarray:
    """What a trivial FL client uploads: a fresh uniform(-0.5, 0.5) float vector of `dim` values with
    weight 100 (its example count), fixed-point encoded for the ring (length dim + 1)."""
    x = np.random.default_rng().uniform(-0.5, 0.5, dim).astype(np.float32)
    return _float_encoder(n_clients=n_clients, ring=ring).encode(x, weight=100.0)[0]


def synthetic_sum(client_ids: Iterable[int], round_id: int, length: int, *, ring: Ring = RING_2_32) -> np.ndarray:
    """The exact ring sum of the synthetic inputs of `client_ids`."""
    total = np.zeros(length, dtype=np.uint32)
    for cid in client_ids:
        ring.add_(total, synthetic_input(cid, round_id, length))
    return total


_PER_ROUND = frozenset({"round_id", "clients", "length", "ring", "client_id", "input_fn", "identity", "roster",
                        "noise_layers"})
"""Constructor arguments the drivers fill in themselves (per round, or from enrolment), never from `--param`."""


def param_names(cls: type) -> list[str]:
    """The keyword arguments of a protocol class that `--param NAME=VALUE` can set: those with a
    number, bool, string or None default (not the per-round ones, nor objects such as a ClientPolicy)."""
    return sorted(name for name, prm in inspect.signature(cls).parameters.items()
                  if prm.kind is prm.KEYWORD_ONLY and name not in _PER_ROUND
                  and (prm.default is None or type(prm.default) in (int, float, str, bool)))


def parse_params(pairs: list[str], *, allowed: Iterable[str] | None = None, protocol: str = "",
                 option: str = "--param") -> dict[str, object]:
    """NAME=VALUE pairs as constructor keywords (int, then float, 'none' -> None, 'true' / 'false' -> bool,
    else str).

    Raises ValueError naming `option` for a malformed pair or, with `allowed`, an unknown NAME (the
    message lists the valid names), so that CLIs can turn it into an argparse error.
    """
    known = None if allowed is None else sorted(allowed)
    out: dict[str, object] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or not name.isidentifier() or not raw:
            raise ValueError(f"{option} takes NAME=VALUE, got {pair!r}"
                             + (f"; {protocol or 'the protocol'} takes {known}" if known is not None else ""))
        if known is not None and name not in known:
            raise ValueError(f"{option} {name}: {protocol or 'the protocol'} has no such parameter; "
                             f"it takes {known}")
        out[name] = _param_value(raw)
    return out


def _param_value(raw: str) -> object:
    if raw.lower() == "none":
        return None
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            continue
    return raw


def check_server_params(protocol: str, pairs: list[str], *, clients: int, length: int,
                        option: str = "--param", max_message_bytes: int | None = None) -> dict[str, object]:
    """Parsed `--param` pairs for `protocol`'s server, after building (and starting) one trial round
    with `clients` clients and vectors of `length`: ValueError, naming the option, if the names are
    not the server's keywords, a value is refused, or the protocol needs more clients; with
    `max_message_bytes`, also if the round's largest reply would not fit (naming --max-message-mib)."""
    server_cls = registry.server_class(protocol)
    params = parse_params(pairs, allowed=param_names(server_cls), protocol=protocol, option=option)
    with_params = f" with {option} {' '.join(pairs)}" if pairs else ""
    try:
        trial = server_cls(round_id=0, clients=range(1, clients + 1), length=length, **params)
        trial.start()
    except AbortError as exc:
        raise ValueError(f"--clients {clients}: {protocol}{with_params} needs at least {exc.required} "
                         f"clients") from None
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{protocol}{with_params} refuses a round of {clients} clients: {exc}") from None
    if max_message_bytes is not None:
        bound = getattr(trial, "max_reply_bytes", None)
        need = int(bound()) if callable(bound) else 16 * length + MIB  # the driver's own fallback
        if need > max_message_bytes:
            streams = "chunk" in param_names(server_cls) and params.get("chunk", "auto") is None
            hint = (f", or stream the inputs in chunks folded as they arrive ({option} chunk=262144: replies of about "
                    f"1 MiB, and the server holds O(d) whatever the number of clients)") if streams else ""
            raise ValueError(f"--max-message-mib {max_message_bytes / MIB:g}: {protocol} rounds of {clients} clients "
                             f"on vectors of length {length} take replies of up to {need} bytes; raise it to at "
                             f"least {math.ceil(need / MIB)}{hint}")
    return params


def check_client_params(protocol: str, pairs: list[str], *, option: str = "--param") -> dict[str, object]:
    """Parsed `--param` pairs for `protocol`'s client, after building one trial client: ValueError,
    naming the option, for unknown names or refused values."""
    client_cls = registry.client_class(protocol)
    params = parse_params(pairs, allowed=param_names(client_cls), protocol=f"the {protocol} client",
                          option=option)
    try:
        client_cls(client_id=1, round_id=0, input_fn=lambda: np.zeros(1, np.uint32), **params)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{option} {' '.join(pairs)}: {exc}") from None
    return params


def _endpoint(args: argparse.Namespace) -> str:
    if args.endpoint:
        return args.endpoint
    return f"tcp://{args.host or '127.0.0.1'}:{args.port if args.port else '*'}"


def _session(args: argparse.Namespace) -> str:
    """What both sides announce at registration: a client expecting another protocol or length is
    refused by the server with a reason naming both (SecAgg and SecAgg+ share message kinds, so
    only this tells them apart)."""
    return f"{args.protocol} length={_vector_length(args)}"


def _vector_length(args: argparse.Namespace) -> int:
    """What each client contributes: dim values, plus the weight with --float-input."""
    return args.dim + 1 if args.float_input else args.dim


# ---- server -------------------------------------------------------------------------------

def serve(args: argparse.Namespace) -> int:
    """Register --clients clients, run --rounds rounds; 0 if all finished (and checked) correctly."""
    server_cls = registry.server_class(args.protocol)
    length = _vector_length(args)
    if server_cls.release_buffers:  # its large pieces go back to the OS instead of staying in the heap
        release_large_buffers()
    try:
        driver = ServerDriver(_endpoint(args), config=ServerConfig(session=_session(args), limits=frame_limits(args)),
                              curve=args.curve)
    except zmq.ZMQError as exc:
        print(json.dumps({"event": "error", "error": f"cannot bind {_endpoint(args)}: {exc}"}), flush=True)
        return 2
    with driver:
        if args.endpoint_file:
            Path(args.endpoint_file).write_text(driver.endpoint)
        print(json.dumps({"event": "listening", "endpoint": driver.endpoint}), flush=True)
        t0 = time.perf_counter()
        clients = driver.wait_for_clients(count=args.clients, timeout=args.register_timeout)
        registered = time.perf_counter() - t0
        if len(clients) < args.clients:
            error = f"only {len(clients)} of {args.clients} clients registered"
            refused = driver.rejected_total["registration"]
            if refused:
                error += (f"; {refused} hellos were refused (a client expecting another session than this "
                          f"server's '{_session(args)}' is refused, and its log names both)")
            print(json.dumps({"event": "error", "error": error}), flush=True)
            return 2
        failures = 0
        for round_id in range(1, args.rounds + 1):
            if round_id > 1 and args.rejoin_timeout and len(driver.clients) < args.clients:
                driver.wait_for_clients(count=args.clients, timeout=args.rejoin_timeout)
            if len(driver.clients) < 2:
                error = f"only {len(driver.clients)} clients still connected; stopping"
                print(json.dumps({"event": "error", "round": round_id, "error": error}), flush=True)
                return 1
            try:
                protocol = server_cls(round_id=round_id, clients=sorted(driver.clients), length=length,
                                      **registry.with_enrolment(server_cls, args.params, roster=args.roster))
                report = driver.run_round(protocol, stage_timeout=args.stage_timeout)
            except (AbortError, ValueError) as exc:  # ValueError: too few clients left for the protocol
                line = {"event": "aborted", "round": round_id, "error": str(exc)}
                if isinstance(exc, AbortError) and exc.survivors == 0:
                    line["hint"] = _nobody_answered(args, exc.stage, length)
                    print(line["hint"], file=sys.stderr, flush=True)
                print(json.dumps(line), flush=True)
                failures += 1
                continue
            line = _round_line(args, round_id, report, registered, protocol.ring)
            if hasattr(protocol, "describe"):  # the round's graph and threat parameters
                line["setting"] = protocol.describe()
            failures += line.get("sum_ok") is False
            print(json.dumps(line), flush=True)
    return 1 if failures else 0


def _nobody_answered(args: argparse.Namespace, stage: str, length: int) -> str:
    """Why a round can end with no client left: most often the clients run something else."""
    return (f"no client answered stage '{stage}': this server runs --protocol {args.protocol} on vectors of "
            f"length {length} (--dim {args.dim}{' with --float-input' if args.float_input else ''}); "
            f"clients started with a different --protocol or --dim refuse its requests (their logs name both)")


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
        "rejected": report.rejected, "faulty": {str(c): why for c, why in sorted(res.faulty.items())},
        "disputes": [list(pair) for pair in res.disputes], "late": sorted(report.late),
        "evicted": sorted(report.evicted),
        "authenticated": args.curve is not None,
        "peak_rss_mb": peak_rss_mb(), "stage_peak_rss_mb": dict(report.stage_peak_rss_mb),
    }
    if args.check and not args.float_input:
        expected = synthetic_sum(res.contributors, round_id, args.dim, ring=ring)
        line["sum_ok"] = bool(np.array_equal(expected, res.ring_sum))
    return line


# ---- client -------------------------------------------------------------------------------

class _ExpectLength(WrappedClient):
    """Wraps a client protocol: a round whose first request asks for vectors of another length than
    this client's input is a ProtocolMismatchError naming both lengths, up front, instead of a
    ValueError from the ring deep in the round (or silence from the client)."""

    def __init__(self, inner: ClientProtocol, *, length: int, source: str) -> None:
        super().__init__(inner)
        self.length, self.source = length, source

    def handle(self, msg: Message) -> Message | None:
        asked = msg.fields.get("length") if msg.kind == self.inner.first_kind() else None
        if type(asked) is int and asked != self.length:
            raise ProtocolMismatchError(
                f"server sums vectors of length {asked} but this client's input has length {self.length} "
                f"({self.source}); start both sides with the same --dim and --float-input")
        return self.inner.handle(msg)


def client(args: argparse.Namespace) -> int:
    """Answer the server's rounds until it shuts down; 2 if refused or mismatched with the server."""
    client_cls = registry.client_class(args.protocol)
    cid = args.id
    length = _vector_length(args)
    source = f"--dim {args.dim}" + (" with --float-input" if args.float_input else "")

    def factory(round_id: int):
        def input_fn() -> np.ndarray:
            if args.drop_at_input and (args.drop_round is None or round_id == args.drop_round):
                logging.getLogger(__name__).info("client %d drops before sending its input", cid)
                raise SystemExit(3)  # a crash at the masked-input stage, for dropout tests
            if args.float_input:
                return float_input(args.dim, n_clients=args.max_clients, ring=registry.default_ring(args.protocol))
            return synthetic_input(cid, round_id, args.dim)
        proto = client_cls(client_id=cid, round_id=round_id, input_fn=input_fn,
                           **registry.with_enrolment(client_cls, args.params, identity=args.identity))
        return _ExpectLength(proto, length=length, source=source)

    config = ClientConfig(hello_timeout=args.hello_timeout, idle_timeout=args.idle_timeout, session=_session(args),
                          limits=frame_limits(args))
    try:
        summary = run_client(endpoint=args.connect, client_id=cid, factory=factory, config=config, curve=args.curve)
    except (RegistrationError, ProtocolMismatchError) as exc:
        print(f"client {cid}: {exc}", file=sys.stderr, flush=True)
        return 2
    print(json.dumps({"event": "client_exit", "client": cid, "reason": summary.exit_reason,
                      "rounds": list(summary.rounds), "rejected": summary.rejected}), flush=True)
    return 0


# ---- keys and argument parsing ------------------------------------------------------------

INSECURE_WARNING = ("INSECURE MODE (--insecure): no CurveZMQ, no client authentication, unsigned round keys. "
                    "Anyone who can reach this port can register any client id, read what is sent and, as the "
                    "server, substitute keys. For development on a trusted machine only; enrol with "
                    "`python -m transport.cli enrol-client` / `init-server` / `roster` and pass --keys for "
                    "anything else.")


def enrol_command(args: argparse.Namespace) -> int:
    """Trusted dealer: every party's keys and the roster in one folder (see `enrol_client_command`
    and its siblings for enrolment in which nobody holds another party's secrets)."""
    try:
        roster = enrol(Path(args.dir), clients=range(1, args.clients + 1))
    except EnrolmentError as exc:
        print(f"enrol: {exc}", file=sys.stderr)
        return 2
    print(f"enrolled the server and clients 1..{args.clients} in {args.dir} (trusted dealer: this folder holds "
          f"every secret): give {roster.name} to everyone, server.key_secret to the server, "
          f"client-<k>.key_secret and client-<k>.sign_secret to client k only")
    return 0


def enrol_client_command(args: argparse.Namespace) -> int:
    """On a client's machine: its own keys, and the public entry to send to the roster's assembler."""
    try:
        entry = enrol_client(Path(args.dir), client_id=args.id)
    except EnrolmentError as exc:
        print(f"enrol-client: {exc}", file=sys.stderr)
        return 2
    print(f"client {args.id}'s keys are in {args.dir}; send {entry} (public, no secret in it) to whoever assembles "
          f"the roster, over a channel that shows it is yours. Keep client-{args.id}.key_secret and "
          f"client-{args.id}.sign_secret here; put the {ROSTER} you get back in {args.dir} and run with --keys {args.dir}")
    return 0


def init_server_command(args: argparse.Namespace) -> int:
    """On the server's machine: its CurveZMQ pair, and its public key for the roster."""
    try:
        public = init_server(Path(args.dir))
    except EnrolmentError as exc:
        print(f"init-server: {exc}", file=sys.stderr)
        return 2
    print(f"the server's key is in {args.dir}; give {public} to whoever assembles the roster. Keep "
          f"server.key_secret here; put the {ROSTER} in {args.dir} and run the server with --keys {args.dir}")
    return 0


def roster_command(args: argparse.Namespace) -> int:
    """Check the public entries (already done by `_validate_roster`) and write the roster."""
    try:
        roster = assemble_roster(Path(args.dir), server_public=Path(args.server), client_entries=map(Path, args.entry))
    except EnrolmentError as exc:
        print(f"roster: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {roster} with clients {sorted(args.clients_in)}; SHA-256 {roster_fingerprint(roster)}: every "
          f"party compares it over an authentic channel, then copies {ROSTER} into its --keys folder")
    return 0


def _at_least(kind: type, low: float, high: float | None = None) -> Callable[[str], float]:
    """argparse type: a finite `kind` number in [low, high] (an argparse error, exit code 2, otherwise)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {'an integer' if kind is int else 'a number'}: {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {text}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"must be at most {high}, got {text}")
        return value
    return parse


def _positive_float(text: str) -> float:
    """argparse type: seconds, a finite number above 0."""
    value = _at_least(float, 0.0)(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be positive")
    return value


_HOST = r"(\*|[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\])"
_TCP = re.compile(rf"tcp://{_HOST}:(\*|\d{{1,5}})")


def _endpoint_type(*, bind: bool) -> Callable[[str], str]:
    """argparse type: tcp://HOST:PORT or ipc://PATH (inproc:// cannot reach another process).
    Binding also takes a * host or port; connecting needs both spelled out."""
    example = "tcp://0.0.0.0:5555" if bind else "tcp://127.0.0.1:5555"

    def parse(text: str) -> str:
        if text.startswith("ipc://") and len(text) > 6 and not any(c.isspace() for c in text):
            return text
        match = _TCP.fullmatch(text)
        if match is not None:
            host, port = match.groups()
            if (bind or host != "*") and (bind and port == "*" or port.isdigit() and 0 < int(port) <= 65535):
                return text
        raise argparse.ArgumentTypeError(f"expected tcp://HOST:PORT or ipc://PATH (e.g. {example}), got {text!r}")
    return parse


def _host(text: str) -> str:
    """argparse type: a host name, address or interface to bind (no scheme, no port)."""
    if not re.fullmatch(_HOST, text):
        raise argparse.ArgumentTypeError(f"expected a host name or address such as 127.0.0.1, got {text!r}")
    return text


def add_limit_options(p: argparse.ArgumentParser) -> None:
    """--max-message-mib and --max-frames: the largest message this side reads (`frame_limits`)."""
    p.add_argument("--max-message-mib", type=_at_least(int, 1, MAX_MESSAGE_MIB),
                   default=DEFAULT_LIMITS.max_message_bytes // MIB, metavar="MIB",
                   help=f"largest message this side reads, in MiB (default {DEFAULT_LIMITS.max_message_bytes // MIB}, "
                        f"at most {MAX_MESSAGE_MIB}); raise it where bigger vectors or models arrive")
    p.add_argument("--max-frames", type=_at_least(int, MIN_FRAMES, MAX_FRAMES), default=DEFAULT_LIMITS.max_frames,
                   help=f"most frames in one message (default {DEFAULT_LIMITS.max_frames}, "
                        f"{MIN_FRAMES}..{MAX_FRAMES}): one per array, bytes or map field, plus the header")


def frame_limits(args: argparse.Namespace) -> FrameLimits:
    """The FrameLimits of --max-message-mib and --max-frames (the header limit unchanged)."""
    return FrameLimits(max_message_bytes=args.max_message_mib * MIB, max_frames=args.max_frames,
                       max_header_bytes=DEFAULT_LIMITS.max_header_bytes)


def parser() -> argparse.ArgumentParser:
    """The CLI's parser: `server`, `client`, and the enrolment subcommands `enrol-client`,
    `init-server`, `roster` and `enrol` (alias `keygen`, the trusted dealer); see the module docstring."""
    p = argparse.ArgumentParser(prog="python -m transport.cli", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    protocols = registry.names()

    s = sub.add_parser("server", help="run rounds over a ROUTER socket")
    s.add_argument("--protocol", default="secagg+", choices=protocols,
                   help="secure-sum protocol (default secagg+); clients must run the same one")
    s.add_argument("--clients", type=_at_least(int, 2, MAX_CLIENTS), required=True,
                   help="wait for this many clients (a secure sum needs at least 2)")
    s.add_argument("--dim", type=_at_least(int, 1, MAX_VECTOR_LENGTH - 1), required=True,
                   help="vector length summed per round")
    s.add_argument("--host", type=_host, help="interface to bind (default 127.0.0.1)")
    s.add_argument("--port", type=_at_least(int, 0, 65535), help="default 0: a free port (see --endpoint-file)")
    s.add_argument("--endpoint", type=_endpoint_type(bind=True),
                   help="bind here instead of tcp://HOST:PORT (e.g. ipc:///tmp/sa)")
    s.add_argument("--endpoint-file", help="write the bound endpoint to this file")
    s.add_argument("--rounds", type=_at_least(int, 1), default=1)
    s.add_argument("--stage-timeout", type=_positive_float, default=60.0, help="seconds per stage")
    s.add_argument("--register-timeout", type=_positive_float, default=60.0, help="seconds to wait for --clients")
    s.add_argument("--rejoin-timeout", type=_at_least(float, 0.0), default=0.0,
                   help="before each later round, wait up to this many seconds for dropped clients to "
                        "reconnect (default 0: run with whoever is connected)")
    s.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="server protocol argument, e.g. degree=10 or threshold_fraction=0.6 (checked)")
    s.add_argument("--keys", "--curve-dir", dest="keys",
                   help="enrolment folder: roster.json + server.key_secret (from init-server, or enrol)")
    s.add_argument("--insecure", action="store_true", help="no authentication or encryption: development only")
    s.add_argument("--check", action="store_true", help="verify the exact sum of the synthetic inputs")
    s.add_argument("--float-input", action="store_true", help="clients encode random float vectors (length dim + 1)")
    add_limit_options(s)
    s.set_defaults(run=serve, validate=_validate_server, error=s.error)

    c = sub.add_parser("client", help="answer a server's rounds over a DEALER socket")
    c.add_argument("--id", type=_at_least(int, 1, MAX_CLIENT_ID), required=True)
    c.add_argument("--connect", type=_endpoint_type(bind=False), required=True,
                   help="the server's endpoint: tcp://HOST:PORT or ipc://PATH")
    c.add_argument("--dim", type=_at_least(int, 1, MAX_VECTOR_LENGTH - 1), required=True,
                   help="vector length (the server's --dim)")
    c.add_argument("--protocol", default="secagg+", choices=protocols,
                   help="must match the server's (default secagg+)")
    c.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="client protocol argument, e.g. min_survivors=3 for lightsecagg (checked)")
    c.add_argument("--keys", "--curve-dir", dest="keys",
                   help="enrolment folder: roster.json + this client's two secret files (from enrol-client, or enrol)")
    c.add_argument("--insecure", action="store_true", help="no authentication or encryption: development only")
    c.add_argument("--hello-timeout", type=_positive_float, default=60.0, help="seconds to wait for the welcome")
    c.add_argument("--idle-timeout", type=_positive_float, default=600.0,
                   help="exit after this many seconds without a message")
    c.add_argument("--drop-at-input", action="store_true", help="exit when asked for the (masked) input")
    c.add_argument("--drop-round", type=_at_least(int, 1), help="with --drop-at-input: only in this round")
    c.add_argument("--float-input", action="store_true", help="encode a random float vector, as a trivial FL client")
    c.add_argument("--max-clients", type=_at_least(int, 1), default=1000,
                   help="with --float-input: the encoder's client bound")
    add_limit_options(c)
    c.set_defaults(run=client, validate=_validate_client, error=c.error)

    about = ("on a client's machine: make its own keys and its public entry client-<k>.public.json "
             "(no trusted dealer; see transport.enrolment)")
    e = sub.add_parser("enrol-client", help=about, description=about)
    e.add_argument("--dir", required=True, help="this client's key folder (existing keys are never overwritten)")
    e.add_argument("--id", type=_at_least(int, 1, MAX_CLIENT_ID), required=True, help="this client's id")
    e.set_defaults(run=enrol_client_command, validate=_validate_enrol_client, error=e.error)

    about = "on the server's machine: make its key and server.public.json (no trusted dealer)"
    i = sub.add_parser("init-server", help=about, description=about)
    i.add_argument("--dir", required=True, help="the server's key folder (an existing key is never overwritten)")
    i.set_defaults(run=init_server_command, validate=_validate_init_server, error=i.error)

    about = ("check the public entries of the server and the clients (format, ids, keys, proofs of possession, "
             "no repeats) and write roster.json; prints its SHA-256 for every party to compare")
    r = sub.add_parser("roster", help=about, description=about)
    r.add_argument("--dir", required=True, help="where to write roster.json (an existing roster is never overwritten)")
    r.add_argument("--server", required=True, metavar="PATH", help="the server's server.public.json (from init-server)")
    r.add_argument("--entry", required=True, nargs="+", action="extend", metavar="PATH",
                   help="clients' client-<k>.public.json files (from enrol-client); repeatable, and takes several, "
                        "e.g. --entry entries/client-*.public.json")
    r.set_defaults(run=roster_command, validate=_validate_roster, error=r.error)

    about = ("trusted dealer: create the server's and every client's secrets and the roster in one folder "
             "(this machine then holds them all); enrol-client, init-server and roster avoid that")
    k = sub.add_parser("enrol", aliases=["keygen"], help=about, description=about)
    k.add_argument("--dir", required=True, help="a new folder (existing keys are never overwritten)")
    k.add_argument("--clients", type=_at_least(int, 1, MAX_CLIENTS), required=True, help="enrol ids 1..N")
    k.set_defaults(run=enrol_command, validate=_validate_keygen, error=k.error)
    return p


def _validate_server(args: argparse.Namespace) -> None:
    """Checks that need several options at once; ValueError names the option. Sets params, curve."""
    if args.endpoint and (args.host is not None or args.port is not None):
        raise ValueError("--endpoint replaces --host and --port: give one or the other")
    if args.endpoint_file and not Path(args.endpoint_file).resolve().parent.is_dir():
        raise ValueError(f"--endpoint-file {args.endpoint_file}: its folder does not exist")
    if _vector_length(args) > MAX_VECTOR_LENGTH:
        raise ValueError(f"--dim {args.dim} with --float-input exceeds the longest vector, {MAX_VECTOR_LENGTH}")
    args.params = check_server_params(args.protocol, args.param, clients=args.clients, length=_vector_length(args),
                                      max_message_bytes=frame_limits(args).max_message_bytes)
    args.curve, args.roster = None, None
    if use_enrolment(args):
        try:
            args.curve, args.roster = load_server(_key_dir(args.keys))
        except (OSError, ValueError) as exc:
            raise ValueError(f"--keys {args.keys}: cannot read the server's enrolment ({exc})") from None
        if len(args.roster.keys) < args.clients:
            raise ValueError(f"--clients {args.clients}: only {len(args.roster.keys)} clients are enrolled in {args.keys}")


def _validate_client(args: argparse.Namespace) -> None:
    """Checks that need several options at once; ValueError names the option. Sets params, curve."""
    if args.drop_round is not None and not args.drop_at_input:
        raise ValueError("--drop-round only applies with --drop-at-input")
    if args.float_input:
        try:
            _float_encoder(n_clients=args.max_clients, ring=registry.default_ring(args.protocol))
        except ValueError as exc:
            raise ValueError(f"--max-clients {args.max_clients}: {exc}") from None
    args.params = check_client_params(args.protocol, args.param)
    if args.params.get("max_length", MAX_VECTOR_LENGTH) < _vector_length(args):
        raise ValueError(f"--param max_length={args.params['max_length']} is below this client's vector length "
                         f"{_vector_length(args)}: it would refuse every round")
    args.curve, args.identity = None, None
    if use_enrolment(args):
        try:
            args.curve, args.identity = load_client(_key_dir(args.keys), args.id)
        except (OSError, ValueError) as exc:
            raise ValueError(f"--keys {args.keys}: cannot read the enrolment of client {args.id} ({exc})") from None


def use_enrolment(args: argparse.Namespace) -> bool:
    """True with --keys; False with --insecure (after the loud warning); ValueError with neither or both."""
    if args.insecure and args.keys:
        raise ValueError("--insecure and --keys contradict each other: give one")
    if not args.insecure and not args.keys:
        raise ValueError("give --keys DIR (a folder with roster.json and this party's secrets: "
                         "`python -m transport.cli enrol-client`, `init-server` and `roster`) or, for "
                         "development on a trusted machine only, --insecure")
    if args.insecure:
        print(INSECURE_WARNING, file=sys.stderr, flush=True)
    return not args.insecure


def _validate_keygen(args: argparse.Namespace) -> None:
    if Path(args.dir).exists() and not Path(args.dir).is_dir():
        raise ValueError(f"--dir {args.dir}: exists and is not a folder")


def _validate_enrol_client(args: argparse.Namespace) -> None:
    _validate_keygen(args)
    names = [f"client-{args.id}.key_secret", f"client-{args.id}.sign_secret", client_public_name(args.id)]
    found = [n for n in names if (Path(args.dir) / n).exists()]
    if found:
        raise ValueError(f"--dir {args.dir}: already holds {', '.join(found)} (keys are never overwritten)")


def _validate_init_server(args: argparse.Namespace) -> None:
    _validate_keygen(args)
    found = [n for n in ("server.key_secret", "server.public.json") if (Path(args.dir) / n).exists()]
    if found:
        raise ValueError(f"--dir {args.dir}: already holds {', '.join(found)} (keys are never overwritten)")


def _validate_roster(args: argparse.Namespace) -> None:
    """Every entry is read and checked here, so that a bad one is an argparse error naming it."""
    _validate_keygen(args)
    if (Path(args.dir) / ROSTER).exists():
        raise ValueError(f"--dir {args.dir}: already holds {ROSTER} (a roster is never overwritten)")
    try:
        server_curve = read_server_entry(Path(args.server))
    except EnrolmentError as exc:
        raise ValueError(f"--server {exc}") from None
    entries = []
    for path in map(Path, args.entry):
        try:
            entries.append((path, read_client_entry(path)))
        except EnrolmentError as exc:
            raise ValueError(f"--entry {exc}") from None
    try:
        args.clients_in = check_entries(server_curve, entries, server=Path(args.server))
    except EnrolmentError as exc:
        raise ValueError(f"--entry {exc}") from None


def _key_dir(text: str) -> Path:
    path = Path(text)
    if not path.is_dir():
        raise ValueError("no such folder (write one with `enrol-client` or `init-server`, and `roster`)")
    return path


def main(argv: list[str] | None = None) -> int:
    """Parse and check every argument (argparse error, exit code 2, on any bad one), then run."""
    args = parser().parse_args(argv)
    try:
        args.validate(args)
    except ValueError as exc:
        args.error(str(exc))
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
