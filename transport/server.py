"""Server driver: runs protocol rounds, and generic broadcasts, over one ZeroMQ ROUTER socket.

Lifecycle (see `ServerDriver`):

    with ServerDriver("tcp://127.0.0.1:*") as driver:
        driver.wait_for_clients(count=n, timeout=30)           # clients say hello
        report = driver.run_round(PlainServer(round_id=1, clients=sorted(driver.clients),
                                              length=d), stage_timeout=10)
        driver.broadcast("model", {"weights": w}, round_id=2)   # higher layers reuse the socket
        replies = driver.collect("ack", round_id=2, timeout=5)
        driver.shutdown()                                       # tells clients to exit

Every received message is checked before protocol code sees it. Before it is decoded, its
frame count and bytes must fit its sender's limit: a handshake-sized `hello` for a connection that
has not registered (anything else from it is dropped undecoded), the running round's largest
legitimate reply (`max_reply_bytes`) or `collect`'s `max_bytes` for one that has. Then it must
decode (wire version, dtypes), come from a registered routing identity whose client id equals its
`sender`, and be addressed to the server; the protocol (or `collect`) then checks kind, stage,
round, schema and duplicates. Anything failing is logged, counted in the report and dropped;
it never stops the driver. A client that stays silent until the stage deadline, or whose TCP
connection closes, is counted as dropped for that stage by the protocol's `advance`.

Stalls are bounded (`StallPolicy`, in `ServerConfig.stalls`). A stage closes at the first of:
(a) every live client it asked has answered; (b) at least `protocol.quorum()` replies have been
accepted and a grace has passed since the quorum was reached, where

    grace = max(stalls.min_grace_s, stalls.grace_factor * (quorum reached - stage requests sent))

so the wait after a quorum follows the honest replies' own speed, not the stage timeout; (c) the
stage timeout. A client still owed a reply when rule (b) closes the stage is *late* for the round
(`RoundReport.late`) and dropped for that stage as a silent one is; a protocol whose `quorum()` is
every expected client (the base default) never closes early. Per client, the driver counts the
consecutive rounds in which it was late or silent in some stage it was asked in (a round in which
it answers every stage it was asked resets the count); after `stalls.evict_after` such rounds it
is evicted for the driver's session: removed from `clients`, told to shut down, listed in
`evicted` (and in `RoundReport.evicted`), its further messages dropped undecoded (reason
'evicted') and its hellos refused, from any connection. `collect` applies rule (b) only when
called with `quorum=` (training replies may legitimately take minutes) and evicts nobody.

Bytes that libzmq buffers before the driver reads them are bounded per connection by a watchdog
thread (tcp:// on Linux), since no socket option bounds them; see `ServerConfig` for the bound.
"""
from __future__ import annotations

import logging
import math
import os
import socket
import struct
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

import zmq

from secagg.messages import MAX_CLIENT_ID, SERVER, AbortError, Message, ProtocolError, Schema, Value
from secagg.protocols.base import RoundResult, ServerProtocol
from transport import session
from transport.framing import (DEFAULT_LIMITS, WIRE_VERSION, FrameLimits, decode, encode,
                               encode_header, encode_payload, wire_size)
from transport.sockets import (CurveServerKeys, SocketOptions, apply_options, is_inproc, send_whole,
                               make_curve_server, start_authenticator)

log = logging.getLogger(__name__)

LARGEST_HELLO = wire_size(encode(session.hello(MAX_CLIENT_ID, wire_version=255,
                                               session="x" * session.MAX_SESSION_BYTES)))
"""Wire bytes of the largest valid hello (270)."""


@dataclass(frozen=True)
class QueueLimits:
    """Bytes a tcp:// connection may have delivered that the driver has not read yet.

    libzmq reads a connection into memory until a multipart message is complete, however many
    frames it has: ZMQ_MAXMSGSIZE caps each frame and RCVHWM counts complete messages, so no socket
    option bounds these bytes (one 2,000-frame message of 1 MiB frames costs 2 GB). A watchdog
    thread compares the kernel's count of bytes received on each connection (TCP_INFO) with what
    the driver has read from it and shuts down a connection over its budget; libzmq then drops
    it, frees its partial message, and the driver sees a disconnect (reject reason 'overflow').
    """

    pending_bytes: int = 16 << 10
    """Budget of a connection that has not registered: its ZMTP/CURVE handshake and hellos."""
    slack_bytes: int = 64 << 10
    """Budget of a registered connection that owes no reply; each owed one (up to two) adds a
    maximum-size reply (see ServerConfig)."""
    max_pending: int = 256
    """Unregistered connections kept at once; beyond it the oldest are cut."""
    total_bytes: int | None = None
    """If set, connections are also cut, largest first, while all of them together hold more."""
    interval: float = 0.005
    """How often the watchdog reads the process's resident memory; every connection is checked
    when it has grown by RSS_STEP since the last check, and at least every SWEEP_EVERY seconds."""
    enabled: bool = True

    def __post_init__(self) -> None:
        if self.pending_bytes < 4 * LARGEST_HELLO or self.slack_bytes < 0 or self.max_pending < 1:
            raise ValueError("queue limits must leave room for a handshake and a few hellos")
        if self.total_bytes is not None and self.total_bytes < self.pending_bytes:
            raise ValueError("total_bytes must be at least pending_bytes")
        if not 0 < self.interval <= 1:
            raise ValueError("interval must be in (0, 1] seconds")


@dataclass(frozen=True)
class StallPolicy:
    """How long a stage waits for stragglers once a quorum has answered, and when to evict a staller.

    Without it, one enrolled client answering each stage just before its timeout holds every round
    for (stages x timeout) and is still counted as honest. See the module docstring for the rule.
    """

    grace_factor: float = 3.0
    """Grace after the quorum, as a multiple of the time the quorum took to arrive."""
    min_grace_s: float = 1.0
    """Least grace, so that a quorum arriving in microseconds does not cut normal jitter."""
    evict_after: int | None = 3
    """Consecutive rounds late or silent after which a client is evicted (None: never evict)."""
    enabled: bool = True
    """False: stages close only when all have answered or at the timeout, and nobody is evicted."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.grace_factor) and self.grace_factor >= 0):
            raise ValueError("grace_factor must be a finite number >= 0")
        if not (math.isfinite(self.min_grace_s) and self.min_grace_s >= 0):
            raise ValueError("min_grace_s must be a finite number of seconds >= 0")
        if self.evict_after is not None and (type(self.evict_after) is not int or self.evict_after < 1):
            raise ValueError("evict_after must be a positive int (or None)")

    def grace(self, quorum_seconds: float) -> float:
        """Seconds to keep waiting after a quorum that took `quorum_seconds` to arrive."""
        return max(self.min_grace_s, self.grace_factor * max(0.0, quorum_seconds))


@dataclass(frozen=True)
class ServerConfig:
    """How much a server accepts, and from whom.

    Memory bound. Let L be the reply limit of the running call (`run_round`: the protocol's
    `max_reply_bytes()`, else 16 * length + 1 MiB; `collect`: `max_bytes`, else
    `collect_max_bytes`), L' that of the call before, C = collect_max_bytes, P =
    queues.pending_bytes, S = queues.slack_bytes, k a connection's unanswered requests (messages
    from `run_round`, `send` or `broadcast` minus its messages other than hellos), R the number of
    registered connections. Bytes received on tcp:// and not yet read by the driver (libzmq's
    queues and partial messages, and the kernel's receive buffer) stay below

        per unregistered connection   P                        (at most queues.max_pending of them)
        per registered connection     S + min(k, w) * max(L, L', C)  <=  Q = S + w * max(L, L', C)
        in total                      queues.max_pending * P + R * Q   (or queues.total_bytes if set)

    with w = 2, or sockets.rcvhwm + 2 while the connection owes more than two messages of a chunked
    reply (`replies_expected`: a masked input in chunks, each at most L; TCP holds back the rest),
    except for what arrives between two watchdog checks: a check runs within queues.interval of
    the process growing by RSS_STEP (4 MiB), so the excess is about RSS_STEP plus the peers' total
    bandwidth times queues.interval (more while the watchdog thread is short of CPU; measured: tens
    of MiB over loopback, tests/transport/test_resources.py), and 128 bytes per second per
    connection credited for ZMTP heartbeats the driver never reads. Each queued wire byte costs
    about 1 byte of memory in frames of a few hundred bytes or more and at most 32 in empty ones
    (libzmq's 64-byte message struct), plus a few tens of KiB of buffers per connection. The driver
    reads one message at a time and keeps its frames only while they fit (`max_hello_bytes` and 4
    frames unregistered, L and limits.max_frames registered), so decoding adds at most about
    13 * L (see `transport.framing`). Outgoing, each peer holds at most sockets.sndhwm messages.
    ipc:// and inproc:// peers are local (file permissions, same process) and have no watchdog:
    there, queued bytes are bounded only per frame.
    """

    limits: FrameLimits = DEFAULT_LIMITS
    """Outer caps on any message. libzmq cuts a connection that sends a frame over
    limits.max_message_bytes (ZMQ_MAXMSGSIZE) before buffering it; every per-call limit must fit
    under it (raise it for rounds or collections with bigger replies)."""
    sockets: SocketOptions = SocketOptions(sndhwm=64, rcvhwm=16, linger_ms=2000)
    allowed_clients: frozenset[int] | None = None
    """If set, only these client ids may register."""
    max_clients: int = 100_000
    session: str = ""
    """What this server runs (protocol and round parameters), e.g. 'secagg+ length=1000'. A client
    whose hello expects another session is refused with a reason naming both ('': accept any)."""
    max_hello_bytes: int = 512
    """Largest message read from a connection that has not registered (a hello is at most
    LARGEST_HELLO bytes); bigger ones are dropped without being decoded."""
    collect_max_bytes: int = 16 << 20
    """Largest reply `collect` accepts unless told otherwise (`max_bytes=`)."""
    queues: QueueLimits = QueueLimits()
    stalls: StallPolicy = StallPolicy()
    """When a stage may close before its timeout, and when a client that keeps stalling is evicted."""

    def __post_init__(self) -> None:
        session.session_bytes(self.session)  # fits a hello, or ValueError now rather than per client
        if not LARGEST_HELLO <= self.max_hello_bytes <= self.limits.max_message_bytes:
            raise ValueError(f"max_hello_bytes must be in [{LARGEST_HELLO}, limits.max_message_bytes]")
        if self.collect_max_bytes < 1:
            raise ValueError("collect_max_bytes must be positive")


def peak_rss_mb() -> float | None:
    """This process's peak resident memory so far (VmHWM, MiB), where /proc has it."""
    try:
        with open("/proc/self/status") as f:
            return round(int(next(line for line in f if line.startswith("VmHWM:")).split()[1]) / 1024, 1)
    except (OSError, StopIteration, ValueError):
        return None


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
    late: frozenset[int] = frozenset()
    """Clients still owed a reply when a stage closed early on its quorum (`StallPolicy`)."""
    evicted: frozenset[int] = frozenset()
    """Clients evicted at the end of this round (reasons in `ServerDriver.evicted`)."""
    stage_peak_rss_mb: Mapping[str, float] = field(default_factory=dict)
    """This process's peak resident memory (VmHWM, MiB) when each stage ended: where it first reaches its
    round's value is the stage that set the peak (empty where /proc has no VmHWM)."""

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
    late: frozenset[int] = frozenset()
    """Expected clients that had not answered when a `quorum=` collection closed early."""


@dataclass
class _Peer:
    identity: bytes
    client_id: int
    fd: int
    ino: int | None = None
    """Inode of its TCP socket, as the queue guard tracks it (None without a guard)."""
    connected: bool = True


Handle = Callable[[int, Message, int], None]
"""(client id, message, wire bytes) for a message that passed the driver's own checks."""


class _StageClock:
    """When one stage (or collection) closes: at `deadline`, or earlier by rule (b) of the module
    docstring, once `replies()` reaches `quorum()` and the policy's grace has passed since."""

    def __init__(self, policy: StallPolicy, *, sent_at: float, deadline: float,
                 replies: Callable[[], int], quorum: Callable[[], int] | None) -> None:
        self._policy, self._sent_at, self.deadline = policy, sent_at, deadline
        self._replies, self._quorum = replies, quorum if policy.enabled else None
        self.quorum_at: float | None = None
        self.update()

    def update(self) -> None:
        """Note the moment the quorum is first reached (forgotten if the count falls back under it)."""
        if self._quorum is None:
            return
        if self._replies() >= self._quorum():
            if self.quorum_at is None:
                self.quorum_at = time.monotonic()
        else:
            self.quorum_at = None

    def close_at(self) -> float:
        self.update()
        if self.quorum_at is None:
            return self.deadline
        return min(self.deadline, self.quorum_at + self._policy.grace(self.quorum_at - self._sent_at))

    def closed_early(self) -> bool:
        """Whether rule (b) has closed it: its grace ended before the deadline and has passed."""
        end = self.close_at()
        return end < self.deadline and time.monotonic() >= end


MMAP_THRESHOLD = 2 << 20
"""Allocations of at least this many bytes (2 MiB: above a 1 MiB streamed chunk, which the heap reuses at once)
come straight from the OS and go back to it when freed
(`release_large_buffers`)."""


def release_large_buffers(threshold: int = MMAP_THRESHOLD) -> bool:
    """Make a server process hand large freed buffers back to the OS (glibc only; False elsewhere).

    glibc serves big allocations with mmap until one is freed, then raises its threshold (up to 32 MiB)
    and serves them from the heap, where freed rounds of pieces, inputs and messages stay resident and
    fragment: a LightSecAgg server at d = 1e7 grew from 126 to 211 MiB of resident heap between two rounds.
    A fixed threshold (mallopt M_MMAP_THRESHOLD) keeps every such buffer mapped only while it is in use.
    Called by the command-line servers; a library user may call it too."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(name)
        return bool(libc.mallopt(-3, int(threshold)))  # -3: M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        return False


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
        self._monitor = None
        self._guard: _QueueGuard | None = None
        try:
            # Sends to unknown or vanished peers fail loudly instead of being silently dropped.
            sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
            apply_options(sock, config.sockets, max_message_bytes=config.limits.max_message_bytes)
            if curve is not None:
                make_curve_server(sock, curve)
            if not is_inproc(endpoint):
                self._monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            sock.bind(endpoint)
            self.endpoint: str = sock.getsockopt(zmq.LAST_ENDPOINT).decode()
            """The bound endpoint, with the actual port when bound to `*`."""
            if self.endpoint.startswith("tcp://") and config.queues.enabled:
                port = int(self.endpoint.rsplit(":", 1)[1])
                self._guard = _QueueGuard.start(port=port, limits=config.queues,
                                                collect_limit=self._collect_limit(None),
                                                stream_window=config.sockets.rcvhwm + 2)
        except BaseException:
            if self._monitor is not None:
                sock.disable_monitor()
                self._monitor.close(linger=0)
            sock.close(linger=0)
            if self._auth is not None:
                self._auth.stop()
            if self._own_context:
                self._ctx.term()
            raise
        self._sock = sock
        self._frame_overhead = _CURVE_FRAME_OVERHEAD if curve is not None else _FRAME_OVERHEAD
        self._hello_limits = FrameLimits(max_message_bytes=config.max_hello_bytes, max_frames=4,
                                         max_header_bytes=config.max_hello_bytes)
        self._reply_limits = replace(config.limits, max_message_bytes=self._collect_limit(None))
        self._poller = zmq.Poller()
        self._poller.register(sock, zmq.POLLIN)
        if self._monitor is not None:
            self._poller.register(self._monitor, zmq.POLLIN)
        self._peers: dict[bytes, _Peer] = {}
        self._by_id: dict[int, _Peer] = {}
        self._last_round = -1
        self._streaks: dict[int, list[int]] = {}
        """Client -> the ids of its latest consecutive rounds late or silent (see StallPolicy)."""
        self._evicted: dict[int, str] = {}
        self._rejected: Counter[str] = Counter()
        self.rejected_total: Counter[str] = Counter()
        """Dropped messages by reason over the driver's lifetime."""
        self._closed = False

    # ---- registration ---------------------------------------------------------------------
    @property
    def clients(self) -> frozenset[int]:
        """Ids of the registered clients whose connection is (as far as we know) alive."""
        return frozenset(self._by_id)

    @property
    def evicted(self) -> Mapping[int, str]:
        """Clients evicted for this driver's session, with why and after which round (StallPolicy)."""
        return dict(self._evicted)

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
        deadline of named stages. A stage may close before its deadline once `protocol.quorum()`
        replies are in (`ServerConfig.stalls`); clients still owed a reply then are `late`, and a
        client late or silent in too many consecutive rounds is evicted when the round ends (also
        when it aborts).
        """
        if protocol.round_id <= self._last_round:
            raise ValueError(f"round id {protocol.round_id} is not above the last one ({self._last_round})")
        limit = self._round_limit(protocol)
        self._last_round = protocol.round_id
        self._begin(limit)
        stage_seconds: Counter[str] = Counter()
        stage_peak: dict[str, float] = {}
        server_seconds: Counter[str] = Counter()
        received: Counter[int] = Counter()
        sent: Counter[int] = Counter()
        asked: set[int] = set()
        """Clients a request of this round reached (in any stage)."""
        missed: set[int] = set()
        """Clients that had not answered a request that reached them when its stage closed."""
        late: set[int] = set()
        answered: set[int] = set()
        """Clients whose reply the protocol accepted in the current stage."""
        t = time.perf_counter()
        requests = protocol.start()
        server_seconds[protocol.stage] += time.perf_counter() - t
        quorum = getattr(protocol, "quorum", None)
        clock: _StageClock | None = None

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
                if protocol.replied(cid):  # its whole reply (every chunk of a chunked one)
                    answered.add(cid)
            server_seconds[stage] += time.perf_counter() - t
            if clock is not None:
                clock.update()  # the quorum's time is that of the reply completing it

        try:
            while requests:
                stage = protocol.stage
                t0 = time.perf_counter()
                answered.clear()
                sent_at = time.monotonic()
                window = getattr(protocol, "send_window", lambda: None)()
                order = list(requests)
                pending = deque(order if window is not None and window < len(order) else ())
                first = order if not pending else [pending.popleft() for _ in range(window)]
                unreachable = set(self._send_requests(requests, sent, protocol, ids=first))
                reached_ids = set(first) - unreachable

                def refill() -> None:
                    """Paced stage: send the next requests while fewer than `window` sent ones are still owed (a
                    reply that dropped its sender, or a lost connection, frees its place too)."""
                    while pending and len((reached_ids & protocol.waiting_for()) - self._lost(reached_ids)) < window:
                        cid = pending.popleft()
                        if self._send_requests(requests, sent, protocol, ids=(cid,)):
                            unreachable.add(cid)
                        else:
                            reached_ids.add(cid)

                timeout = (stage_timeouts or {}).get(stage, stage_timeout)
                clock = _StageClock(self.config.stalls, sent_at=sent_at, deadline=sent_at + timeout,
                                    replies=lambda: len(answered),
                                    quorum=quorum if callable(quorum) and not pending else None)

                def stage_done() -> bool:
                    refill()
                    waiting = protocol.waiting_for() - unreachable
                    return waiting <= self._lost(waiting)

                self._pump(clock.close_at, accept, stage_done)
                self._drain(accept)  # replies already queued when the stage closed still count
                reached = frozenset(reached_ids)
                asked |= reached
                missing = protocol.waiting_for() & reached
                missed |= missing
                if missing and clock.closed_early():
                    late |= missing & self._by_id.keys()
                    log.info("round %d stage '%s' closed on its quorum; late: %s", protocol.round_id,
                             stage, sorted(missing & self._by_id.keys()))
                clock = None
                t = time.perf_counter()
                requests = protocol.advance()
                server_seconds[stage] += time.perf_counter() - t
                stage_seconds[stage] += time.perf_counter() - t0
                peak = peak_rss_mb()
                if peak is not None:
                    stage_peak[stage] = peak
        except AbortError:
            self._settle_stalls(protocol.round_id, asked=asked, missed=missed)
            raise
        evicted = self._settle_stalls(protocol.round_id, asked=asked, missed=missed)
        return RoundReport(result=protocol.result(), stage_seconds=dict(stage_seconds),
                           server_seconds=dict(server_seconds), bytes_received=dict(received),
                           bytes_sent=dict(sent), rejected=dict(self._rejected), late=frozenset(late),
                           evicted=evicted, stage_peak_rss_mb=stage_peak)

    def _settle_stalls(self, round_id: int, *, asked: set[int], missed: set[int]) -> frozenset[int]:
        """End of a round: extend or reset each asked client's run of late-or-silent rounds, and evict
        those whose run reached `StallPolicy.evict_after`. Returns the evicted."""
        policy = self.config.stalls
        if not policy.enabled:
            return frozenset()
        out = set()
        for cid in sorted(asked):
            if cid not in missed:
                self._streaks.pop(cid, None)
                continue
            streak = self._streaks.setdefault(cid, [])
            streak.append(round_id)
            if policy.evict_after is not None and len(streak) >= policy.evict_after:
                self._evict(cid, f"late or silent in {len(streak)} consecutive rounds "
                                  f"({', '.join(map(str, streak))}); evicted after round {round_id}")
                out.add(cid)
        return frozenset(out)

    def _evict(self, cid: int, reason: str) -> None:
        """Remove a client for the rest of the session and tell it to exit; its connection stays known
        so that what it still sends is recognised and dropped undecoded."""
        self._streaks.pop(cid, None)
        self._evicted[cid] = reason
        if cid in self._by_id:
            self._send_to(cid, encode(session.to_client(session.SHUTDOWN, cid)))
            self._by_id.pop(cid, None)
        log.warning("client %d evicted: %s", cid, reason)

    # ---- generic messages for higher layers ------------------------------------------------
    def send(self, msg: Message) -> int | None:
        """Send one message to client `msg.receiver`; wire bytes, or None if it is unreachable."""
        self._check_app_kind(msg.kind)
        return self._send_to(msg.receiver, encode(msg), expects_reply=True)

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
            frames = [encode_header(replace(template, receiver=cid)), *payload]
            n = self._send_to(cid, frames, expects_reply=True)
            if n is not None:
                sent[cid] = n
        return sent

    def collect(self, kind: str, *, round_id: int, timeout: float, expect: Iterable[int] | None = None,
                schema: Schema | None = None, max_bytes: int | None = None,
                quorum: int | None = None) -> CollectResult:
        """Receive one `kind` message for `round_id` from each expected client (default: all registered).

        Stops when all have answered or at the timeout; with `quorum`, also once that many have
        answered and the stall grace has passed (`StallPolicy`, measured from this call: send the
        requests just before), the others being `late`. Messages over `max_bytes` (default
        `ServerConfig.collect_max_bytes`) are dropped undecoded; messages of another kind or
        round, duplicates, and (if given) messages failing `schema` are dropped.
        """
        if quorum is not None and (type(quorum) is not int or quorum < 0):
            raise ValueError(f"quorum must be a non-negative int, not {quorum!r}")
        start = time.monotonic()
        self._begin(self._collect_limit(max_bytes))
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
            clock.update()

        def done() -> bool:
            waiting = expected - replies.keys()
            return waiting <= self._lost(waiting)

        clock = _StageClock(self.config.stalls, sent_at=start, deadline=start + timeout,
                            replies=lambda: len(replies), quorum=None if quorum is None else lambda: quorum)
        self._pump(clock.close_at, take, done)
        self._drain(take)
        missing = expected - replies.keys()
        late = missing & self._by_id.keys() if missing and clock.closed_early() else frozenset()
        return CollectResult(replies=replies, missing=missing, bytes_received=dict(received),
                             rejected=dict(self._rejected), late=frozenset(late))

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
        if self._guard is not None:
            self._guard.stop()
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
    def _begin(self, reply_limit: int) -> None:
        """Start of a round or collection: forget closed connections, reset per-call counters, set
        the largest message a registered client may send during the call."""
        self._drain_monitor()
        self._peers = {ident: p for ident, p in self._peers.items() if p.connected}
        self._rejected = Counter()
        self._reply_limits = replace(self.config.limits, max_message_bytes=reply_limit)
        if self._guard is not None:
            self._guard.set_reply_limit(reply_limit)

    def _round_limit(self, protocol: ServerProtocol) -> int:
        """Largest reply of this round: the protocol's own bound, else a generous one from its length."""
        bound = getattr(protocol, "max_reply_bytes", None)
        limit = int(bound()) if callable(bound) else 16 * int(protocol.length) + (1 << 20)
        return self._checked_limit(limit, f"round {protocol.round_id} ({protocol.name}) replies")

    def _collect_limit(self, max_bytes: int | None) -> int:
        if max_bytes is None:  # the default never exceeds the outer cap
            return min(self.config.collect_max_bytes, self.config.limits.max_message_bytes)
        return self._checked_limit(max_bytes, "collect max_bytes")

    def _checked_limit(self, limit: int, what: str) -> int:
        if limit < 1:
            raise ValueError(f"{what}: a limit of {limit} bytes")
        if limit > self.config.limits.max_message_bytes:
            raise ValueError(f"{what} may need {limit} bytes, over ServerConfig.limits.max_message_bytes "
                             f"({self.config.limits.max_message_bytes}): raise it")
        return limit

    def _lost(self, ids: Iterable[int]) -> frozenset[int]:
        """Those of `ids` we cannot hear from any more (never registered or disconnected)."""
        return frozenset(i for i in ids if i not in self._by_id)

    def _send_requests(self, requests: Mapping[int, Message], sent: Counter[int],
                       protocol: ServerProtocol | None = None, *, ids: Iterable[int] | None = None) -> frozenset[int]:
        """Send a stage's requests (those of `ids` only, if given: a paced stage); each may be answered by
        the number of messages the protocol expects (`replies_expected`: a chunked masked input), which the
        queue guard budgets for. Each request is built and encoded only as it is sent (`relay.LazyRequests`)."""
        expected = getattr(protocol, "replies_expected", None)
        unreachable = set()
        for cid in (requests if ids is None else ids):
            n = self._send_to(cid, encode(requests[cid]), expects_reply=True,
                              replies=int(expected(cid)) if expected else 1)
            if n is None:
                unreachable.add(cid)
            else:
                sent[cid] += n
        return frozenset(unreachable)

    def _send_to(self, cid: int, frames: list, *, expects_reply: bool = False, replies: int = 1) -> int | None:
        peer = self._by_id.get(cid)
        if peer is None:
            return None
        if expects_reply and self._guard is not None:  # before sending: the answer may come at once
            self._guard.sent(peer.ino, replies=replies)
        try:
            send_whole(self._sock, [peer.identity, *frames], flags=zmq.NOBLOCK)
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

    def _pump(self, deadline: float | Callable[[], float], handle: Handle, done: Callable[[], bool]) -> None:
        """Dispatch incoming messages to `handle` until `done()` or the deadline (a time.monotonic()
        value, or a function giving the current one: a stage's close moves earlier on its quorum)."""
        while not done():
            now_deadline = deadline() if callable(deadline) else deadline
            remaining = now_deadline - time.monotonic()
            if remaining <= 0:
                return
            events = dict(self._poller.poll(max(1, math.ceil(remaining * 1000))))
            if self._monitor is not None and self._monitor in events:
                self._drain_monitor()
            if self._sock in events:
                self._drain(handle, deadline=now_deadline)

    def _drain(self, handle: Handle, *, deadline: float | None = None, max_messages: int = 100_000) -> None:
        """Dispatch what is queued now without waiting; stops at the deadline or after max_messages."""
        for _ in range(max_messages):
            if deadline is not None and time.monotonic() >= deadline:
                return
            try:
                identity = self._sock.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._dispatch(identity, handle)

    def _dispatch(self, identity_frame: zmq.Frame, handle: Handle) -> None:
        """Read the rest of one message, keeping its frames only while they fit its sender's limit,
        then check and decode it."""
        identity = identity_frame.bytes
        peer = self._peers.get(identity)
        who = peer.client_id if peer is not None else None
        evicted = who is not None and who in self._evicted
        limits = self._hello_limits if peer is None else self._reply_limits
        body: list[zmq.Frame] = []
        first: zmq.Frame | None = None
        size = count = 0
        more = identity_frame.more
        while more:  # all parts of a message are there once its first one is (atomic delivery)
            frame = self._sock.recv(copy=False)
            more = frame.more
            size += len(frame)
            count += 1
            if first is None:
                first = frame
            if not evicted and count <= limits.max_frames and size <= limits.max_message_bytes:
                body.append(frame)
            elif body:
                body = []  # over the limit: release what was kept; the rest is read and dropped
        if first is None:
            return self._reject("malformed", who, "a message without frames")
        if self._guard is not None:
            ino = peer.ino if peer is not None else self._guard.track(_source_fd(first))
            self._guard.consumed(ino, size + count * self._frame_overhead)
        if evicted:
            self._answered(peer)
            return self._reject("evicted", who, f"{size} bytes in {count} frames after its eviction")
        if count > limits.max_frames or size > limits.max_message_bytes:
            self._answered(peer)
            reason = "unregistered" if peer is None else "oversized"
            return self._reject(reason, who, f"{size} bytes in {count} frames, over the limit of "
                                f"{limits.max_message_bytes} bytes in {limits.max_frames} frames")
        try:
            msg = decode(body, limits=limits)
        except ProtocolError as exc:
            self._answered(peer)
            return self._reject("malformed", who, exc)
        if msg.kind == session.HELLO:
            return self._register(identity, msg, first)
        self._answered(peer)
        if peer is None:
            return self._reject("unregistered", None, f"'{msg.kind}' from an unknown connection")
        if msg.sender != peer.client_id:
            return self._reject("spoofed_sender", who, f"claims to be client {msg.sender}")
        if msg.receiver != SERVER:
            return self._reject("misaddressed", who, f"addressed to {msg.receiver}")
        if msg.kind in session.SESSION_KINDS:
            return self._reject("unexpected_kind", who, msg.kind)
        handle(peer.client_id, msg, wire_size(body))

    def _answered(self, peer: _Peer | None) -> None:
        """A registered peer's message other than a hello: one fewer reply it may still owe."""
        if self._guard is not None and peer is not None:
            self._guard.answered(peer.ino)

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
            evicted = cid in self._evicted and reason == self._eviction_notice(cid)
            self._reject("evicted" if evicted else "registration", cid, reason)
            refusal = session.to_client(session.REJECT, cid, reason=reason.encode()[:256])
            try:
                send_whole(self._sock, [identity, *encode(refusal)], flags=zmq.NOBLOCK, copy=True)
            except zmq.ZMQError:
                pass  # the refused peer is gone or not reading: nothing more to tell it
            return
        if identity not in self._peers:
            peer = _Peer(identity=identity, client_id=cid, fd=_source_fd(first_frame))
            self._peers[identity] = self._by_id[cid] = peer
            if self._guard is not None:
                peer.ino = self._guard.track(peer.fd)
                self._guard.registered(peer.ino)
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
        if cid in self._evicted:
            return self._eviction_notice(cid)
        known = self._peers.get(identity)
        if known is not None:
            return "" if known.client_id == cid else f"connection already registered as client {known.client_id}"
        if cid in self._by_id:
            return f"client id {cid} is already registered"
        if len(self._by_id) >= self.config.max_clients:
            return "server is full"
        return ""

    def _eviction_notice(self, cid: int) -> str:
        return f"client {cid} was evicted from this session: {self._evicted[cid]}"

    def _drain_monitor(self) -> None:
        if self._guard is not None:
            for ino, why in self._guard.take_cuts():
                cid = next((p.client_id for p in self._by_id.values() if p.ino == ino), None)
                self._reject("overflow", cid, why)
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
                    # connected peers: the registered ones and the evicted ones still connected
                    for peer in [p for p in self._peers.values() if p.connected and p.fd == fd]:
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


# ---- the queue watchdog (tcp://, Linux) ----------------------------------------------------------

_FRAME_OVERHEAD = 16
"""Wire bytes credited per received frame beyond its payload: a ZMTP frame header is 2 or 9 bytes."""
_CURVE_FRAME_OVERHEAD = 48
"""The same under CURVE: header, MESSAGE command name, nonce, MAC and flags (42 bytes)."""
_HEARTBEAT_ALLOWANCE = 128
"""Bytes per second credited to each connection for ZMTP commands (heartbeats) the driver never
reads; a peer can grow its queue by at most this rate without being cut."""
RSS_STEP = 4 << 20
SWEEP_EVERY = 0.5
_TCP_INFO_BYTES_RECEIVED = 128
"""Offset of tcpi_bytes_received (u64) in Linux's struct tcp_info (Linux >= 4.1)."""


@dataclass
class _Conn:
    fd: int
    ino: int
    since: float
    checked: float
    registered: bool = False
    credited: int = 0
    """Wire bytes the driver has read from this connection (estimated from its messages)."""
    owed: int = 0
    """Messages sent to it that it has not answered yet: the replies it may have in flight."""
    window: int = 2
    """Of those, how many may be in flight at once: 2, or a stream's window while one is owed."""
    unread: int = 0
    cut: bool = False


class _QueueGuard:
    """Watchdog thread that cuts tcp:// connections holding more unread bytes than their budget.

    It finds the ROUTER's connections among the process's file descriptors (TCP sockets whose
    local port is the bound one), keyed by socket inode so that a reused descriptor number is never
    mistaken for the connection it replaced. The driver reports the bytes it reads from each
    (`consumed`); the kernel reports the bytes received (TCP_INFO); the difference is what libzmq
    and the kernel hold. Cutting is shutdown(2) on the descriptor: libzmq's I/O thread sees the
    end of stream, closes (and so resets) the connection, discards its partial message and reports
    a disconnect.
    """

    def __init__(self, *, port: int, limits: QueueLimits, collect_limit: int, stream_window: int = 18) -> None:
        self._port = port
        self._stream_window = stream_window
        self._limits = limits
        self._collect_limit = collect_limit
        self._lock = threading.Lock()
        self._conns: dict[int, _Conn] = {}
        self._foreign: set[int] = set()
        """Inodes of descriptors that are not connections of the bound port."""
        self._reply_limits: deque[int] = deque(maxlen=2)
        """Reply limits of the running call and the one before."""
        self._cuts: deque[tuple[int, str]] = deque()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"queue-guard-{port}", daemon=True)

    @classmethod
    def start(cls, *, port: int, limits: QueueLimits, collect_limit: int, stream_window: int = 18) -> _QueueGuard | None:
        """A running guard, or None (with a warning) where /proc or TCP_INFO is unavailable."""
        if not (os.path.isdir("/proc/self/fd") and os.path.exists("/proc/self/statm")
                and hasattr(socket, "TCP_INFO")):
            log.warning("no /proc or TCP_INFO here: bytes queued per connection are bounded only per frame")
            return None
        guard = cls(port=port, limits=limits, collect_limit=collect_limit, stream_window=stream_window)
        guard._thread.start()
        return guard

    # ---- called by the driver (its thread); connections are named by socket inode -----------------
    def track(self, fd: int) -> int | None:
        """The inode of the connection on `fd` (tracked from now on), None if it is not one of ours."""
        with self._lock:
            conn = self._lookup(fd)
            return conn.ino if conn is not None else None

    def consumed(self, ino: int | None, nbytes: int) -> None:
        with self._lock:
            conn = self._conns.get(ino)
            if conn is not None:
                conn.credited += nbytes

    def registered(self, ino: int | None) -> None:
        with self._lock:
            conn = self._conns.get(ino)
            if conn is not None:
                conn.registered = True

    def sent(self, ino: int | None, *, replies: int = 1) -> None:
        """A request or application message went to this connection: it may answer, with `replies`
        messages (a chunked stream: up to the receive high-water mark of them queued, plus two, may be
        unread at once while the driver folds; TCP holds back the rest)."""
        with self._lock:
            conn = self._conns.get(ino)
            if conn is not None:
                conn.owed += replies
                if replies > 1:
                    conn.window = self._stream_window

    def answered(self, ino: int | None) -> None:
        """A message other than a hello came from this connection."""
        with self._lock:
            conn = self._conns.get(ino)
            if conn is not None:
                conn.owed = max(0, conn.owed - 1)
                if conn.owed <= 2:
                    conn.window = 2

    def set_reply_limit(self, limit: int) -> None:
        with self._lock:
            self._reply_limits.append(limit)

    def take_cuts(self) -> list[tuple[int, str]]:
        """(inode, why) of the connections cut since the last call."""
        out = []
        while self._cuts:
            out.append(self._cuts.popleft())
        return out

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    # ---- the thread ---------------------------------------------------------------------------------
    def _run(self) -> None:
        statm = os.open("/proc/self/statm", os.O_RDONLY)
        try:
            step = RSS_STEP // os.sysconf("SC_PAGE_SIZE")
            low, last_sweep, cost = _pages(statm), time.monotonic(), 0.0
            while not self._stop.is_set():
                time.sleep(self._limits.interval)  # cheaper than Event.wait(timeout) at this rate
                try:
                    pages = _pages(statm)
                    low = min(low, pages)  # growth counts from the lowest point: freed memory is no credit
                    # growth: sweep now; otherwise now and then, at most 5% of the time
                    if pages - low >= step or time.monotonic() - last_sweep >= max(SWEEP_EVERY, 20 * cost):
                        started = time.monotonic()
                        self.sweep()
                        low, last_sweep, cost = _pages(statm), time.monotonic(), time.monotonic() - started
                except Exception:  # the guard must outlive surprises; the driver goes on regardless
                    log.exception("queue guard sweep failed")
        finally:
            os.close(statm)

    def sweep(self) -> None:
        """Check every connection against its budget; cut those over it."""
        with self._lock:
            self._discover()
            now = time.monotonic()
            reply = max([self._collect_limit, *self._reply_limits])
            for ino, conn in list(self._conns.items()):
                received = _bytes_received(conn.fd, ino)
                if received is None:  # closed; its descriptor may already be another file
                    del self._conns[ino]
                    continue
                heartbeats = int(_HEARTBEAT_ALLOWANCE * (now - conn.checked))
                conn.credited = min(conn.credited + heartbeats, received)
                conn.checked = now
                conn.unread = received - conn.credited
                budget = (self._limits.slack_bytes + min(conn.owed, conn.window) * reply if conn.registered
                          else self._limits.pending_bytes)
                if conn.unread > budget and not conn.cut:
                    self._cut(conn, f"{conn.unread} bytes received and not read, over the budget of {budget}")
            live = [c for c in self._conns.values() if not c.cut]
            pending = sorted((c for c in live if not c.registered), key=lambda c: c.since)
            for conn in pending[: max(0, len(pending) - self._limits.max_pending)]:
                self._cut(conn, f"more than {self._limits.max_pending} unregistered connections")
            if self._limits.total_bytes is not None:
                total = sum(c.unread for c in live if not c.cut)
                for conn in sorted(live, key=lambda c: -c.unread):
                    if total <= self._limits.total_bytes or conn.unread == 0:
                        break
                    if not conn.cut:
                        total -= conn.unread
                        self._cut(conn, f"{conn.unread} bytes unread while all connections "
                                  f"hold over {self._limits.total_bytes}")

    def _cut(self, conn: _Conn, why: str) -> None:
        conn.cut = True
        if _inode(conn.fd) != conn.ino:
            return
        self._cuts.append((conn.ino, why))
        log.warning("cutting connection (fd %d): %s", conn.fd, why)
        _shutdown(conn.fd)

    def _discover(self) -> None:
        try:
            names = os.listdir("/proc/self/fd")
        except OSError:
            return
        if len(self._foreign) > 4 * len(names) + 1024:
            self._foreign.clear()  # forget inodes of long-closed sockets
        for name in names:
            self._lookup(int(name))

    def _lookup(self, fd: int) -> _Conn | None:
        """The tracked connection on this descriptor, tracking it now if it is one of ours."""
        ino = _inode(fd)
        if ino is None or ino in self._foreign:
            return None
        conn = self._conns.get(ino)
        if conn is None:
            if not _accepted_on(fd, self._port):
                self._foreign.add(ino)
                return None
            now = time.monotonic()
            conn = self._conns[ino] = _Conn(fd=fd, ino=ino, since=now, checked=now)
        return conn


def _inode(fd: int) -> int | None:
    """Inode of the socket open on `fd`, None if it is not a socket (or not open)."""
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    if not target.startswith("socket:["):
        return None
    return int(target[8:-1])


def _on_fd(fd: int, action: Callable[[socket.socket], object]) -> object:
    """`action` on a socket object borrowing `fd` (never closing it); None on any OSError."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return None
    try:
        return action(sock)
    except OSError:
        return None
    finally:
        sock.detach()


def _accepted_on(fd: int, port: int) -> bool:
    """Is `fd` a connected TCP socket whose local port is `port` (accepted by our listener)?"""
    def check(sock: socket.socket) -> bool:
        if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
            return False
        sock.getpeername()  # OSError (not connected) for the listening socket itself
        return sock.getsockname()[1] == port
    return bool(_on_fd(fd, check))


def _bytes_received(fd: int, ino: int) -> int | None:
    if _inode(fd) != ino:
        return None
    info = _on_fd(fd, lambda s: s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256))
    if not isinstance(info, bytes) or len(info) < _TCP_INFO_BYTES_RECEIVED + 8:
        return None
    return struct.unpack_from("=Q", info, _TCP_INFO_BYTES_RECEIVED)[0]


def _shutdown(fd: int) -> None:
    """End the connection on `fd`: libzmq reads end-of-stream and closes it, and with SO_LINGER 0
    the close resets it (no half-closed socket left waiting on the peer)."""
    def cut(sock: socket.socket) -> None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RDWR)
    _on_fd(fd, cut)


def _pages(statm: int) -> int:
    """Resident pages of this process, from an open /proc/self/statm."""
    return int(os.pread(statm, 128, 0).split()[1])
