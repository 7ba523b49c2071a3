"""Client driver: a DEALER loop that registers with the server and answers its requests.

For each protocol round the client builds a fresh `ClientProtocol` with `factory(round_id)` the
first time it sees a request for a round newer than the last one; older rounds are ignored.
Messages whose kind has an entry in `handlers` (e.g. a model broadcast from
`ServerDriver.broadcast`) go to that handler instead, which may return a reply (use
`transport.session.reply_to`). The loop ends on a `shutdown` message, when the server's
connection closes (TCP/IPC), after `idle_timeout` seconds without a message, or when `stop`
is set (threads). It runs the same in a thread (inproc://, shared zmq.Context) or a process.

A round that opens with a request of another registered protocol (the server runs secagg+, this
client plain) raises `ProtocolMismatchError` naming both, instead of dropping every request until
the server gives up on this client; other malformed or unexpected messages are logged and dropped.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import zmq

from secagg.messages import SERVER, Message, ProtocolError
from secagg.protocols.base import ClientProtocol, reply_messages
from transport import session
from transport.framing import DEFAULT_LIMITS, WIRE_VERSION, FrameLimits, decode, encode, wire_size
from transport.sockets import CurveClientKeys, SocketOptions, apply_options, is_inproc, make_curve_client, send_whole

log = logging.getLogger(__name__)

ProtocolFactory = Callable[[int], "ClientProtocol | None"]
"""round id -> the client's protocol object for that round (None: sit this round out)."""
Handler = Callable[[Message], "Message | None"]


class RegistrationError(ConnectionError):
    """The server refused this client, authentication failed, or no welcome came in time."""


class ProtocolMismatchError(RuntimeError):
    """The server runs another protocol (or other round parameters) than this client: no round can
    succeed, so the client stops instead of waiting for requests it will never understand."""


def protocols_speaking(kind: str) -> list[str]:
    """Registered protocols whose clients accept requests of this kind (to name the server's one)."""
    from secagg.protocols import registry

    return [name for name in registry.names() if kind in registry.client_class(name).schemas]


def _check_same_protocol(msg: Message, protocol: ClientProtocol) -> None:
    """Raise ProtocolMismatchError if `msg` is a request of another registered protocol.

    Kinds no registered protocol knows are left to the caller to drop: they are garbage, not a
    server speaking a protocol we can name.
    """
    ours = getattr(protocol, "schemas", {})
    if msg.kind in ours:
        return
    theirs = protocols_speaking(msg.kind)
    if theirs:
        mine = getattr(protocol, "name", "") or type(protocol).__name__
        raise ProtocolMismatchError(
            f"server speaks {' or '.join(theirs)} (its round {msg.round} request is '{msg.kind}') "
            f"but this client runs {mine}, whose rounds start with '{protocol.first_kind()}'; "
            f"run the same protocol (--protocol) on both sides")


@dataclass(frozen=True)
class ClientConfig:
    limits: FrameLimits = DEFAULT_LIMITS
    sockets: SocketOptions = SocketOptions()
    hello_timeout: float = 30.0
    """Give up registering after this long without a welcome."""
    hello_retry: float = 1.0
    idle_timeout: float | None = 600.0
    """Exit after this long without any message from the server (None: wait forever)."""
    poll_interval: float = 0.5
    """How often a thread checks its `stop` event."""
    session: str = ""
    """What this client expects the server to run (see `ServerConfig.session`; '': anything). A
    server running another session refuses the hello and `register` raises ProtocolMismatchError."""

    def __post_init__(self) -> None:
        session.session_bytes(self.session)


@dataclass(frozen=True)
class ClientSummary:
    client_id: int
    exit_reason: str
    """'shutdown', 'server_gone', 'idle' or 'stopped'."""
    rounds: tuple[int, ...] = ()
    """Rounds this client built a protocol for."""
    finished_rounds: int = 0
    rejected: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    replies: Mapping[str, int] = field(default_factory=dict)


def run_client(*, endpoint: str, client_id: int, factory: ProtocolFactory,
               handlers: Mapping[str, Handler] | None = None, context: zmq.Context | None = None,
               config: ClientConfig = ClientConfig(), curve: CurveClientKeys | None = None,
               stop: threading.Event | None = None) -> ClientSummary:
    """Connect, register, serve until told to stop. Raises RegistrationError if not admitted and
    ProtocolMismatchError if the server's rounds are of another protocol."""
    with ClientSession(endpoint=endpoint, client_id=client_id, context=context, config=config,
                       curve=curve) as sess:
        sess.register()
        return sess.serve(factory=factory, handlers=handlers or {}, stop=stop)


class ClientSession:
    """One DEALER connection to the server; `register()` then `serve(...)`."""

    def __init__(self, *, endpoint: str, client_id: int, context: zmq.Context | None = None,
                 config: ClientConfig = ClientConfig(), curve: CurveClientKeys | None = None) -> None:
        if client_id <= SERVER:
            raise ValueError("client ids are positive")
        self.client_id = client_id
        self.config = config
        self._own_context = context is None
        self._ctx = context if context is not None else zmq.Context()
        sock = self._ctx.socket(zmq.DEALER)
        apply_options(sock, config.sockets, max_message_bytes=config.limits.max_message_bytes)
        if curve is not None:
            make_curve_client(sock, curve)
        self._monitor = None if is_inproc(endpoint) else sock.get_monitor_socket(
            zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
            | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
        sock.connect(endpoint)
        self._sock = sock
        self._poller = zmq.Poller()
        self._poller.register(sock, zmq.POLLIN)
        if self._monitor is not None:
            self._poller.register(self._monitor, zmq.POLLIN)
        self._registered = False
        self._closed = False
        self.bytes_sent = 0
        self.bytes_received = 0
        self.rejected = 0

    # ---- registration ---------------------------------------------------------------------
    def register(self) -> None:
        deadline = time.monotonic() + self.config.hello_timeout
        next_hello = 0.0
        while True:
            now = time.monotonic()
            if now >= deadline:
                raise RegistrationError(f"client {self.client_id}: no welcome within {self.config.hello_timeout}s")
            if now >= next_hello:  # a repeated hello is answered idempotently by the server
                self._send(session.hello(self.client_id, wire_version=WIRE_VERSION, session=self.config.session))
                next_hello = now + self.config.hello_retry
            msg = self._receive(min(deadline, next_hello) - now, registering=True)
            if msg is None:
                continue
            if msg.kind == session.WELCOME:
                self._registered = True
                return
            if msg.kind == session.REJECT:
                reason = msg["reason"].decode(errors="replace")
                if reason.startswith(session.SESSION_MISMATCH):
                    raise ProtocolMismatchError(f"client {self.client_id}: {reason}; run the same --protocol "
                                                f"and parameters on both sides")
                raise RegistrationError(f"client {self.client_id} refused: {reason}")
            self._drop(f"'{msg.kind}' before the welcome")

    # ---- serving --------------------------------------------------------------------------
    def serve(self, *, factory: ProtocolFactory, handlers: Mapping[str, Handler],
              stop: threading.Event | None = None) -> ClientSummary:
        if not self._registered:
            raise RuntimeError("register() first")
        current_round, protocol = -1, None
        rounds: list[int] = []
        finished = 0
        replies: dict[str, int] = {}
        last_heard = time.monotonic()
        while True:
            if stop is not None and stop.is_set():
                reason = "stopped"
                break
            wait = self.config.poll_interval if stop is not None else 3600.0
            if self.config.idle_timeout is not None:
                left = last_heard + self.config.idle_timeout - time.monotonic()
                if left <= 0:
                    reason = "idle"
                    break
                wait = min(wait, left)
            try:
                msg = self._receive(wait)
            except _ServerGone:
                reason = "server_gone"
                break
            if msg is None:
                continue
            last_heard = time.monotonic()
            if msg.kind == session.SHUTDOWN:
                reason = "shutdown"
                break
            if msg.kind in session.SESSION_KINDS:
                continue  # a late duplicate welcome
            try:
                if msg.kind in handlers:
                    reply = handlers[msg.kind](msg)
                else:
                    if msg.round > current_round:  # a new round starts with its first request
                        candidate = factory(msg.round)
                        if candidate is not None and msg.kind != candidate.first_kind():
                            _check_same_protocol(msg, candidate)
                            raise ProtocolError(f"round {msg.round} cannot start with '{msg.kind}' "
                                                f"(rounds of this client start with '{candidate.first_kind()}')")
                        current_round, protocol = msg.round, candidate
                        rounds.append(msg.round)
                    if msg.round < current_round or protocol is None:
                        raise ProtocolError(f"'{msg.kind}' for round {msg.round}, not a round this client is in")
                    was_finished = protocol.finished
                    reply = protocol.handle(msg)
                    finished += protocol.finished and not was_finished
            except ProtocolError as exc:
                self._drop(exc)
                continue
            # A chunked reply is made chunk by chunk: the next chunk is masked while ZeroMQ's I/O thread
            # sends the last (copy=False), and at most the socket's high-water mark of chunks is queued.
            for part in reply_messages(reply):
                if part.sender != self.client_id or part.receiver != SERVER:
                    raise ValueError(f"reply {part.kind} must be from {self.client_id} to the server")
                self._send(part)
                replies[part.kind] = replies.get(part.kind, 0) + 1
        log.info("client %d exits: %s", self.client_id, reason)
        return ClientSummary(client_id=self.client_id, exit_reason=reason, rounds=tuple(rounds),
                             finished_rounds=finished, rejected=self.rejected, bytes_sent=self.bytes_sent,
                             bytes_received=self.bytes_received, replies=replies)

    # ---- plumbing -------------------------------------------------------------------------
    def _send(self, msg: Message) -> None:
        frames = encode(msg)
        send_whole(self._sock, frames)
        self.bytes_sent += wire_size(frames)

    def _receive(self, timeout: float, *, registering: bool = False) -> Message | None:
        """One valid message from the server, or None (timeout or dropped). Raises _ServerGone."""
        events = dict(self._poller.poll(max(0, int(timeout * 1000))))
        if self._sock not in events:  # queued messages (e.g. a shutdown) go before a disconnect
            if self._monitor is not None and self._monitor in events:
                self._check_monitor(registering)
            return None
        frames = self._sock.recv_multipart(copy=False)
        try:
            msg = decode(frames, limits=self.config.limits)
            if msg.sender != SERVER or msg.receiver != self.client_id:
                raise ProtocolError(f"message from {msg.sender} to {msg.receiver}")
            if msg.kind in session.SESSION_KINDS:
                session.SCHEMAS[msg.kind].validate(msg)
        except ProtocolError as exc:
            self._drop(exc)
            return None
        self.bytes_received += wire_size(frames)
        return msg

    def _check_monitor(self, registering: bool) -> None:
        while True:
            try:
                event = self._monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            event_id = int.from_bytes(event[0][:2], "little") if event and len(event[0]) == 6 else 0
            if event_id == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                raise RegistrationError(f"client {self.client_id}: the server refused our key")
            if event_id in (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL):
                raise RegistrationError(f"client {self.client_id}: security handshake failed")
            if event_id == zmq.EVENT_DISCONNECTED and not registering:
                raise _ServerGone()

    def _drop(self, why: object) -> None:
        self.rejected += 1
        log.warning("client %d dropped a message: %s", self.client_id, str(why)[:200])

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._monitor is not None:
            self._sock.disable_monitor()
            self._monitor.close(linger=0)
        self._sock.close(linger=None if self._registered else 0)  # unsent hellos are worthless
        if self._own_context:
            self._ctx.term()

    def __enter__(self) -> ClientSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _ServerGone(Exception):
    pass
