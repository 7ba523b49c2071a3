"""Server driver: runs protocol rounds, and generic broadcasts, over one ZeroMQ ROUTER socket.

Lifecycle (see `ServerDriver`):

    with ServerDriver("tcp://127.0.0.1:*") as driver:
        driver.wait_for_clients(count=n, timeout=30)           # clients say hello
        report = driver.run_round(PlainServer(round_id=1, clients=sorted(driver.clients),
                                              length=d), stage_timeout=10)
        driver.broadcast("model", {"weights": w}, round_id=2)   # higher layers reuse the socket
        replies = driver.collect("ack", round_id=2, timeout=5)
        driver.shutdown()                                       # tells clients to exit

Every received message is checked before protocol code sees it: it must decode (size limits,
wire version, dtypes), come from a registered routing identity whose client id equals its
`sender`, and be addressed to the server; the protocol (or `collect`) then checks kind, stage,
round, schema and duplicates. Anything failing is logged, counted in the report and dropped;
it never stops the driver. A client that stays silent until the stage deadline, or whose TCP
connection closes, is counted as dropped for that stage by the protocol's `advance`.
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

import zmq

from secagg.messages import SERVER, Message, ProtocolError, Schema, Value
from secagg.protocols.base import RoundResult, ServerProtocol
from transport import session
from transport.framing import (DEFAULT_LIMITS, WIRE_VERSION, FrameLimits, decode, encode,
                               encode_header, encode_payload, wire_size)
from transport.sockets import (CurveServerKeys, SocketOptions, apply_options, is_inproc,
                               make_curve_server, start_authenticator)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerConfig:
    limits: FrameLimits = DEFAULT_LIMITS
    sockets: SocketOptions = SocketOptions(linger_ms=2000)
    allowed_clients: frozenset[int] | None = None
    """If set, only these client ids may register."""
    max_clients: int = 100_000
    session: str = ""
    """What this server runs (protocol and round parameters), e.g. 'secagg+ length=1000'. A client
    whose hello expects another session is refused with a reason naming both ('': accept any)."""

    def __post_init__(self) -> None:
        session.session_bytes(self.session)  # fits a hello, or ValueError now rather than per client


@dataclass(frozen=True)
class RoundReport:
    """What one `run_round` produced and what it cost."""

    result: RoundResult
    stage_seconds: Mapping[str, float]
    """Wall time per stage: from sending its requests until `advance` returned."""
    server_seconds: Mapping[str, float]
    """Part of each stage spent in protocol code (start/accept/advance) on the server."""
    bytes_received: Mapping[int, int]
    """Wire bytes of the accepted replies, per client."""
    bytes_sent: Mapping[int, int]
    rejected: Mapping[str, int]
    """Messages dropped during the round, by reason."""

    @property
    def seconds(self) -> float:
        return sum(self.stage_seconds.values())

    @property
    def dropped(self) -> Mapping[str, frozenset[int]]:
        return self.result.dropped


@dataclass(frozen=True)
class CollectResult:
    replies: Mapping[int, Message]
    missing: frozenset[int]
    bytes_received: Mapping[int, int] = field(default_factory=dict)
    rejected: Mapping[str, int] = field(default_factory=dict)


@dataclass
class _Peer:
    identity: bytes
    client_id: int
    fd: int
    connected: bool = True


Handle = Callable[[int, Message, int], None]
"""(client id, message, wire bytes) for a message that passed the driver's own checks."""


class ServerDriver:
    """Owns a ROUTER socket bound to `endpoint` (tcp://127.0.0.1:*, ipc://..., inproc://...).

    Not thread-safe: call it from one thread. Pass `context` to share a zmq.Context with
    inproc clients; `curve` turns on CurveZMQ (a ZAP handler is started on the context).
    """

    def __init__(self, endpoint: str, *, context: zmq.Context | None = None,
                 config: ServerConfig = ServerConfig(), curve: CurveServerKeys | None = None) -> None:
        self.config = config
        self._own_context = context is None
        self._ctx = context if context is not None else zmq.Context()
        self._curve = curve
        self._auth = start_authenticator(self._ctx, curve) if curve is not None else None
        sock = self._ctx.socket(zmq.ROUTER)
        try:
            # Sends to unknown or vanished peers fail loudly instead of being silently dropped.
            sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
            apply_options(sock, config.sockets, max_message_bytes=config.limits.max_message_bytes)
            if curve is not None:
                make_curve_server(sock, curve)
            sock.bind(endpoint)
        except BaseException:
            sock.close(linger=0)
            if self._auth is not None:
                self._auth.stop()
            if self._own_context:
                self._ctx.term()
            raise
        self._sock = sock
        self.endpoint: str = sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        """The bound endpoint, with the actual port when bound to `*`."""
        self._monitor = None if is_inproc(endpoint) else sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._poller = zmq.Poller()
        self._poller.register(sock, zmq.POLLIN)
        if self._monitor is not None:
            self._poller.register(self._monitor, zmq.POLLIN)
        self._peers: dict[bytes, _Peer] = {}
        self._by_id: dict[int, _Peer] = {}
        self._last_round = -1
        self._rejected: Counter[str] = Counter()
        self.rejected_total: Counter[str] = Counter()
        """Dropped messages by reason over the driver's lifetime."""
        self._closed = False

    # ---- registration ---------------------------------------------------------------------
    @property
    def clients(self) -> frozenset[int]:
        """Ids of the registered clients whose connection is (as far as we know) alive."""
        return frozenset(self._by_id)

    def wait_for_clients(self, *, count: int | None = None, ids: Iterable[int] | None = None,
                         timeout: float) -> frozenset[int]:
        """Accept hellos until `count` clients (or all of `ids`) are registered, or the timeout."""
        want = frozenset(ids) if ids is not None else None
        if (count is None) == (want is None):
            raise ValueError("give exactly one of count= or ids=")

        def done() -> bool:
            return want <= self._by_id.keys() if want is not None else len(self._by_id) >= count

        self._pump(time.monotonic() + timeout, self._unexpected, done)
        return self.clients

    # ---- secure rounds ---------------------------------------------------------------------
    def run_round(self, protocol: ServerProtocol, *, stage_timeout: float = 60.0,
                  stage_timeouts: Mapping[str, float] | None = None) -> RoundReport:
        """Drive one round to completion; raises AbortError if the protocol cannot finish.

        Round ids must increase from round to round on one driver, so that a reply replayed from
        an earlier round can never match the current one. `stage_timeouts` overrides the
        deadline of named stages.
        """
        if protocol.round_id <= self._last_round:
            raise ValueError(f"round id {protocol.round_id} is not above the last one ({self._last_round})")
        self._last_round = protocol.round_id
        self._begin()
        stage_seconds: Counter[str] = Counter()
        server_seconds: Counter[str] = Counter()
        received: Counter[int] = Counter()
        sent: Counter[int] = Counter()
        t = time.perf_counter()
        requests = protocol.start()
        server_seconds[protocol.stage] += time.perf_counter() - t

        def accept(cid: int, msg: Message, size: int) -> None:
            t = time.perf_counter()
            try:
                protocol.accept(msg)
            except ProtocolError as exc:
                self._reject("protocol", cid, exc)
            except Exception as exc:  # a protocol bug on hostile input must not stop the server
                log.exception("protocol %s raised on a message from client %d", protocol.name, cid)
                self._reject("protocol_error", cid, exc)
            else:
                received[cid] += size
            server_seconds[stage] += time.perf_counter() - t

        while requests:
            stage = protocol.stage
            t0 = time.perf_counter()
            unreachable = self._send_requests(requests, sent)
            timeout = (stage_timeouts or {}).get(stage, stage_timeout)

            def stage_done() -> bool:
                waiting = protocol.waiting_for() - unreachable
                return waiting <= self._lost(waiting)

            self._pump(time.monotonic() + timeout, accept, stage_done)
            self._drain(accept)  # replies already queued when the stage closed still count
            t = time.perf_counter()
            requests = protocol.advance()
            server_seconds[stage] += time.perf_counter() - t
            stage_seconds[stage] += time.perf_counter() - t0
        return RoundReport(result=protocol.result(), stage_seconds=dict(stage_seconds),
                           server_seconds=dict(server_seconds), bytes_received=dict(received),
                           bytes_sent=dict(sent), rejected=dict(self._rejected))

    # ---- generic messages for higher layers ------------------------------------------------
    def send(self, msg: Message) -> int | None:
        """Send one message to client `msg.receiver`; wire bytes, or None if it is unreachable."""
        self._check_app_kind(msg.kind)
        return self._send_to(msg.receiver, encode(msg))

    def broadcast(self, kind: str, fields: Mapping[str, Value], *, round_id: int,
                  to: Iterable[int] | None = None) -> dict[int, int]:
        """Send the same fields to clients `to` (default: all registered); wire bytes per client reached.

        The payload is encoded once and shared zero-copy by all sends (large arrays are not
        copied per client): do not modify the arrays until the receivers have them.
        """
        self._check_app_kind(kind)
        template = Message(kind=kind, round=round_id, sender=SERVER, receiver=SERVER, fields=fields)
        payload = encode_payload(template)
        sent: dict[int, int] = {}
        for cid in sorted(self._by_id if to is None else set(to)):
            n = self._send_to(cid, [encode_header(replace(template, receiver=cid)), *payload])
            if n is not None:
                sent[cid] = n
        return sent

    def collect(self, kind: str, *, round_id: int, timeout: float, expect: Iterable[int] | None = None,
                schema: Schema | None = None) -> CollectResult:
        """Receive one `kind` message for `round_id` from each expected client (default: all registered).

        Stops when all have answered or at the timeout. Messages of another kind or round,
        duplicates, and (if given) messages failing `schema` are dropped.
        """
        self._begin()
        expected = frozenset(self._by_id if expect is None else expect)
        replies: dict[int, Message] = {}
        received: Counter[int] = Counter()

        def take(cid: int, msg: Message, size: int) -> None:
            if cid not in expected:
                return self._reject("unexpected_sender", cid, msg.kind)
            if msg.kind != kind or msg.round != round_id:
                return self._reject("unexpected_kind", cid, f"{msg.kind} round {msg.round}")
            if cid in replies:
                return self._reject("replayed", cid, msg.kind)
            if schema is not None:
                try:
                    schema.validate(msg)
                except ProtocolError as exc:
                    return self._reject("schema", cid, exc)
            replies[cid] = msg
            received[cid] += size

        def done() -> bool:
            waiting = expected - replies.keys()
            return waiting <= self._lost(waiting)

        self._pump(time.monotonic() + timeout, take, done)
        self._drain(take)
        return CollectResult(replies=replies, missing=expected - replies.keys(),
                             bytes_received=dict(received), rejected=dict(self._rejected))

    # ---- shutdown ------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Tell every registered client to exit, then close the socket."""
        if not self._closed:
            for cid in sorted(self._by_id):
                self._send_to(cid, encode(session.to_client(session.SHUTDOWN, cid)))
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._monitor is not None:
            self._sock.disable_monitor()
            self._monitor.close(linger=0)
        self._sock.close()
        if self._auth is not None:
            self._auth.stop()
        if self._own_context:
            self._ctx.term()

    def __enter__(self) -> ServerDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ---- internals ---------------------------------------------------------------------------
    def _begin(self) -> None:
        """Start of a round or collection: forget closed connections, reset per-call counters."""
        self._drain_monitor()
        self._peers = {ident: p for ident, p in self._peers.items() if p.connected}
        self._rejected = Counter()

    def _lost(self, ids: Iterable[int]) -> frozenset[int]:
        """Those of `ids` we cannot hear from any more (never registered or disconnected)."""
        return frozenset(i for i in ids if i not in self._by_id)

    def _send_requests(self, requests: Mapping[int, Message], sent: Counter[int]) -> frozenset[int]:
        unreachable = set()
        for cid, req in requests.items():
            n = self._send_to(cid, encode(req))
            if n is None:
                unreachable.add(cid)
            else:
                sent[cid] += n
        return frozenset(unreachable)

    def _send_to(self, cid: int, frames: list) -> int | None:
        peer = self._by_id.get(cid)
        if peer is None:
            return None
        try:
            self._sock.send_multipart([peer.identity, *frames], flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            log.warning("client %d is not draining its queue; message not sent", cid)
            return None
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EHOSTUNREACH:
                raise
            log.info("client %d is no longer connected", cid)
            self._disconnected(peer)
            return None
        return wire_size(frames)

    def _pump(self, deadline: float, handle: Handle, done: Callable[[], bool]) -> None:
        """Dispatch incoming messages to `handle` until `done()` or the deadline."""
        while not done():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            events = dict(self._poller.poll(max(1, int(remaining * 1000))))
            if self._monitor is not None and self._monitor in events:
                self._drain_monitor()
            if self._sock in events:
                self._drain(handle, deadline=deadline)

    def _drain(self, handle: Handle, *, deadline: float | None = None, max_messages: int = 100_000) -> None:
        """Dispatch what is queued now without waiting; stops at the deadline or after max_messages."""
        for _ in range(max_messages):
            if deadline is not None and time.monotonic() >= deadline:
                return
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._dispatch(frames, handle)

    def _dispatch(self, frames: list[zmq.Frame], handle: Handle) -> None:
        identity = frames[0].bytes
        body = frames[1:]
        peer = self._peers.get(identity)
        who = peer.client_id if peer is not None else None
        try:
            msg = decode(body, limits=self.config.limits)
        except ProtocolError as exc:
            return self._reject("malformed", who, exc)
        if msg.kind == session.HELLO:
            return self._register(identity, msg, body[0])
        if peer is None:
            return self._reject("unregistered", None, f"'{msg.kind}' from an unknown connection")
        if msg.sender != peer.client_id:
            return self._reject("spoofed_sender", who, f"claims to be client {msg.sender}")
        if msg.receiver != SERVER:
            return self._reject("misaddressed", who, f"addressed to {msg.receiver}")
        if msg.kind in session.SESSION_KINDS:
            return self._reject("unexpected_kind", who, msg.kind)
        handle(peer.client_id, msg, wire_size(body))

    def _register(self, identity: bytes, msg: Message, first_frame: zmq.Frame) -> None:
        try:
            session.SCHEMAS[session.HELLO].validate(msg)
            if msg.receiver != SERVER or msg.round != session.SESSION_ROUND:
                raise ProtocolError("hello must be addressed to the server in the session round")
        except ProtocolError as exc:
            return self._reject("registration", None, exc)
        cid = msg.sender
        self._drain_monitor()  # a closed connection's file descriptor may have been reused
        reason = (self._refusal(identity, cid, first_frame, msg["wire_version"])
                  or session.session_mismatch(server=self.config.session,
                                              client=msg["session"].decode(errors="replace")))
        if reason:
            self._reject("registration", cid, reason)
            refusal = session.to_client(session.REJECT, cid, reason=reason.encode()[:256])
            try:
                self._sock.send_multipart([identity, *encode(refusal)], flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                pass  # the refused peer is gone or not reading: nothing more to tell it
            return
        if identity not in self._peers:
            peer = _Peer(identity=identity, client_id=cid, fd=_source_fd(first_frame))
            self._peers[identity] = self._by_id[cid] = peer
            log.info("client %d registered", cid)
        self._send_to(cid, encode(session.to_client(session.WELCOME, cid)))

    def _refusal(self, identity: bytes, cid: int, frame: zmq.Frame, version: int) -> str:
        """Why a hello must be refused ('' to accept; a repeated hello is re-welcomed)."""
        if version != WIRE_VERSION:
            return f"wire version {version} unsupported (server speaks {WIRE_VERSION})"
        if cid == SERVER:
            return "client ids are positive"
        if self.config.allowed_clients is not None and cid not in self.config.allowed_clients:
            return f"client id {cid} is not allowed"
        if self._curve is not None and self._curve.client_keys is not None:
            key = self._curve.client_keys.get(cid)
            if key is None or _user_id(frame) != key.decode("ascii"):
                return f"this key is not the one registered for client {cid}"
        known = self._peers.get(identity)
        if known is not None:
            return "" if known.client_id == cid else f"connection already registered as client {known.client_id}"
        if cid in self._by_id:
            return f"client id {cid} is already registered"
        if len(self._by_id) >= self.config.max_clients:
            return "server is full"
        return ""

    def _drain_monitor(self) -> None:
        if self._monitor is None:
            return
        while True:
            try:
                event = self._monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(event) >= 1 and len(event[0]) == 6:
                event_id, fd = int.from_bytes(event[0][:2], "little"), int.from_bytes(event[0][2:], "little")
                if event_id == zmq.EVENT_DISCONNECTED:
                    for peer in [p for p in self._by_id.values() if p.fd == fd]:
                        log.info("client %d disconnected", peer.client_id)
                        self._disconnected(peer)

    def _disconnected(self, peer: _Peer) -> None:
        peer.connected = False
        if self._by_id.get(peer.client_id) is peer:
            del self._by_id[peer.client_id]

    def _unexpected(self, cid: int, msg: Message, size: int) -> None:
        self._reject("unexpected_kind", cid, f"'{msg.kind}' while waiting for registrations")

    def _reject(self, reason: str, cid: int | None, detail: object) -> None:
        self._rejected[reason] += 1
        self.rejected_total[reason] += 1
        who = f"client {cid}" if cid is not None else "an unregistered connection"
        log.warning("dropped a message from %s (%s): %s", who, reason, str(detail)[:200])

    @staticmethod
    def _check_app_kind(kind: str) -> None:
        if kind in session.SESSION_KINDS:
            raise ValueError(f"'{kind}' is reserved for the transport's session messages")


def _source_fd(frame: zmq.Frame) -> int:
    """File descriptor of the connection a frame came on (-1 for inproc)."""
    try:
        return int(frame.get(zmq.SRCFD))
    except zmq.ZMQError:
        return -1


def _user_id(frame: zmq.Frame) -> str | None:
    """The ZAP user id of the frame's connection: for CURVE, the client's Z85 public key."""
    try:
        return frame.get("User-Id")
    except zmq.ZMQError:
        return None
