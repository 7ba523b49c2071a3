"""The sans-IO protocol interface every secure-sum protocol implements.

A round is driven by the server, stage by stage. The server emits one request per live client;
each client answers with at most one reply (a chunked reply is one reply in several messages, complete
when its last chunk is in: `secagg.protocols.chunks`); when all replies are in (or the stage's deadline
passes, and the silent clients count as dropped) the driver calls `advance`, which either emits
the next stage's requests or finishes.

One faulty client never sinks a round: a reply from an expected client that fails its schema or
the protocol's own checks (a low-order key, shares for the wrong peers, a vector out of range)
drops that client at that stage at once, with the reason in `RoundResult.faulty`, and the round
goes on with the others whenever enough remain. (Envelope errors, such as a reply for another
round or of another stage's kind, only discard the message: they may be late or replayed.)
Drivers authenticate the sender before `accept` (the transport binds each connection to one id),
so a client can only fault itself. The same objects run in the in-memory simulator, over
ZeroMQ inproc:// and over tcp:// between processes: drivers only move `Message`s.

Protocols sum uint32 ring vectors of a fixed length; encoding floats to the ring is a separate
layer (`secagg.encoding`, or distributed-DP encoders in `dp`).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from secagg.messages import SERVER, Message, ProtocolError, Schema, check_envelope
from secagg.protocols.chunks import ChunkFolder
from secagg.ring import Ring

InputFn = Callable[[], np.ndarray]
"""Called once, when the client must mask its input: returns its uint32 ring vector."""


@dataclass(frozen=True)
class RoundResult:
    ring_sum: np.ndarray
    """Sum (mod the ring) of the inputs of exactly the clients in `contributors`."""
    contributors: frozenset[int]
    dropped: Mapping[str, frozenset[int]] = field(default_factory=dict)
    """Clients first found missing (silent or faulty) at each stage."""
    faulty: Mapping[int, str] = field(default_factory=dict)
    """Clients dropped for a bad reply or for a bad message to a peer, with the stage and reason."""
    disputes: tuple[tuple[int, int], ...] = ()
    """(accuser, accused) pairs both dropped because the server cannot tell which lied: blame for a
    dispute is not recorded against either end (`accusation_matching`)."""
    layer_index: int = -1
    """XNoise: the highest removable noise layer the survivors revealed (-1: none)."""
    layer_secrets: Mapping[int, int] = field(default_factory=dict)
    """XNoise: the revealed layer secret s_{layer_index} (`secagg.noise_layers`) of each contributor that
    did not send its own excess (it dropped during the removal), from which the layers 0..layer_index
    of its noise are regenerated and subtracted from `ring_sum`."""
    layer_excess: np.ndarray | None = None
    """XNoise: the ring sum of the excess noise (layers 0..layer_index) the other contributors sent
    themselves, to subtract from `ring_sum` (None: none sent)."""


def reply_messages(reply: Message | Iterable[Message] | None) -> Iterator[Message]:
    """The messages of a client's answer (`ClientProtocol.handle`), in order: none, one, or each of a
    chunked reply's, made one at a time."""
    if reply is None:
        return iter(())
    if isinstance(reply, Message):
        return iter((reply,))
    return iter(reply)


class ServerProtocol(ABC):
    """Server side of one secure-sum round."""

    name: str = ""
    schemas: Mapping[str, Schema] = {}
    """Schema of the reply expected in each stage, by stage name."""
    release_buffers: bool = False
    """Whether a server process running this protocol should hand large freed buffers back to the OS
    (`transport.server.release_large_buffers`): worth it where large messages come and go every round;
    a streaming protocol reuses its 1 MiB chunks and only pays for the extra mappings."""

    def __init__(self, *, round_id: int, clients: Sequence[int], length: int, ring: Ring) -> None:
        clients = tuple(sorted(clients))
        if len(set(clients)) != len(clients) or any(c <= SERVER for c in clients):
            raise ValueError("client ids must be distinct positive ints")
        if length < 1:
            raise ValueError("vector length must be positive")
        self.round_id = round_id
        self.clients = clients
        self.length = length
        self.ring = ring
        self.stage = "init"
        self.finished = False
        self._replies: dict[int, Message] = {}
        self.running_sum: np.ndarray | None = None
        """Inputs folded so far in the current stage (`fold_input`)."""
        self._expected: frozenset[int] = frozenset()
        self._dropped: dict[str, frozenset[int]] = {}
        self._faulty: dict[int, str] = {}
        """Client -> 'stage: reason' for every client dropped for misbehaving."""
        self._disputes: list[tuple[int, int]] = []
        self.excess_sum: np.ndarray | None = None
        """XNoise: the ring sum of the excess noise survivors sent themselves (`fold_excess`)."""
        self.excess_from: frozenset[int] = frozenset()

    # ---- driver interface ---------------------------------------------------------------
    @abstractmethod
    def start(self) -> dict[int, Message]:
        """Requests of the first stage, by client id."""

    def waiting_for(self) -> frozenset[int]:
        """Clients whose reply to the current stage has not arrived yet."""
        return self._expected - self._replies.keys()

    def replied(self, client: int) -> bool:
        """Whether `client`'s whole reply to the current stage is in (every chunk of a chunked one)."""
        return client in self._replies

    def accept(self, msg: Message) -> None:
        """Validate and store one reply. Raises ProtocolError (state unchanged) if it is bad."""
        if self.finished:
            raise ProtocolError("round already finished")
        if self.stage not in self.schemas:
            raise ProtocolError(f"no stage is open (stage '{self.stage}')")
        check_envelope(msg, kind=self.schemas[self.stage].kind, round_id=self.round_id,
                       sender=None, receiver=SERVER)
        if msg.sender not in self._expected:
            raise ProtocolError(f"client {msg.sender} is not expected in stage '{self.stage}'")
        if msg.sender in self._replies:
            raise ProtocolError(f"duplicate '{msg.kind}' from client {msg.sender}")
        try:
            self.schemas[self.stage].validate(msg)
            self.check_reply(msg)
        except ProtocolError as exc:
            self.mark_faulty(msg.sender, str(exc))
            raise
        self._replies[msg.sender] = msg

    def fold_input(self, msg: Message) -> None:
        """Add an accepted reply's `vector` into the stage's running sum (`running_sum`) and keep only
        its envelope: the server then holds O(d) of inputs instead of O(N d). Only for a stage after
        which no accepted client can be dropped (its vector could not be taken back out)."""
        if self.running_sum is None:
            self.running_sum = np.zeros(self.length, dtype=np.uint32)
        self.ring.add_(self.running_sum, msg["vector"])
        self._replies[msg.sender] = Message(kind=msg.kind, round=msg.round, sender=msg.sender, receiver=msg.receiver)

    def accept_chunk(self, msg: Message, *, schema: Schema, folder: "ChunkFolder") -> None:
        """Validate one chunk of a chunked reply before it costs memory (round, addressee, a sender still owed
        chunks, the schema, then `ChunkFolder.fold`'s index, repeat, length and range checks) and add it into
        the running sum at once. A bad chunk drops its sender (the chunks it already sent are repaired by
        the protocol's resend); the reply counts as in once every chunk asked for has arrived."""
        if self.finished:
            raise ProtocolError("round already finished")
        check_envelope(msg, kind=schema.kind, round_id=self.round_id, sender=None, receiver=SERVER)
        if msg.sender not in self._expected:
            raise ProtocolError(f"client {msg.sender} is not expected in stage '{self.stage}'")
        if msg.sender in self._replies:
            raise ProtocolError(f"client {msg.sender} already sent every chunk asked for")
        try:
            schema.validate(msg)
            if self.running_sum is None:
                self.running_sum = np.zeros(self.length, dtype=np.uint32)
            done = folder.fold(self.running_sum, msg.sender, msg["index"], msg["vector"])
        except ProtocolError as exc:
            self.mark_faulty(msg.sender, str(exc))
            raise
        if done:
            self._replies[msg.sender] = Message(kind=msg.kind, round=msg.round, sender=msg.sender, receiver=msg.receiver)

    def fold_excess(self, msg: Message) -> None:
        """XNoise: add an accepted reply's `excess` (its sender's own layers 0..index, as a ring vector)
        into `excess_sum` and keep the reply without it, so the server holds O(d) of excess noise."""
        excess = msg["excess"]
        if excess.shape[0] == 0:
            return
        if self.excess_sum is None:
            self.excess_sum = np.zeros(self.length, dtype=np.uint32)
        self.ring.add_(self.excess_sum, excess)
        self.excess_from = self.excess_from | {msg.sender}
        # an empty array, not excess[:0]: a view would keep the whole received buffer alive
        self._replies[msg.sender] = Message(kind=msg.kind, round=msg.round, sender=msg.sender, receiver=msg.receiver,
                                            fields={**msg.fields, "excess": np.zeros(0, dtype=np.uint32)})

    def check_excess(self, msg: Message, index: int) -> None:
        """An `excess` is empty (the sender leaves its removal to the shares) or one ring vector, and only
        when layers are removed."""
        n = msg["excess"].shape[0]
        if n not in ((0, self.length) if index >= 0 else (0,)):
            raise ProtocolError(f"client {msg.sender} sent {n} excess-noise values (expected 0 or {self.length})")
        try:
            self.ring.validate(msg["excess"], length=n)
        except ValueError as exc:
            raise ProtocolError(str(exc)) from exc

    def take_running_sum(self) -> np.ndarray:
        """The folded sum of the stage (zeros if nothing arrived), reset for the next use."""
        out = self.running_sum if self.running_sum is not None else np.zeros(self.length, dtype=np.uint32)
        self.running_sum = None
        return out

    def mark_faulty(self, client: int, reason: str) -> None:
        """Drop `client` at the current stage for `reason` (its reply, if any, is discarded)."""
        self._faulty.setdefault(client, f"{self.stage}: {reason}"[:300])
        self._expected = self._expected - {client}
        self._replies.pop(client, None)
        self._dropped[self.stage] = self._dropped.get(self.stage, frozenset()) | {client}

    def quorum(self) -> int:
        """Fewest replies with which the current stage can still lead to a finished round. Drivers may
        close a stage early once this many have arrived and a grace period has passed (a staller then
        counts as dropped); the default, every expected client, never closes early."""
        return len(self._expected)

    def send_window(self) -> int | None:
        """How many of the current stage's requests a driver may have unanswered at once (None: all). A
        stage whose requests or replies are large paces them, so that a server over a network holds a few
        of them in its queues, not N (`transport.server` sends the next as replies arrive)."""
        return None

    def max_reply_bytes(self) -> int:
        """Largest reply (all frames) this round can legitimately receive: drivers refuse bigger
        messages before decoding them. Protocols with larger replies than one vector override it."""
        return 4 * self.length + (64 << 10)

    def advance(self) -> dict[int, Message]:
        """Close the current stage with the replies received; return the next requests ({} when done).

        Raises AbortError if too few clients are left to finish correctly.
        """
        replies, missing = dict(self._replies), self._expected - self._replies.keys()
        if missing:
            self._dropped[self.stage] = self._dropped.get(self.stage, frozenset()) | missing
        self._replies = {}
        out = self.on_stage_complete(replies)
        self._expected = frozenset(out)
        if not out:
            self.finished = True
        return out

    @abstractmethod
    def result(self) -> RoundResult:
        """The round's result, once finished."""

    # ---- for subclasses -----------------------------------------------------------------
    def check_reply(self, msg: Message) -> None:
        """Protocol-specific validation beyond the schema (lengths, key sizes, addressees)."""

    @abstractmethod
    def on_stage_complete(self, replies: dict[int, Message]) -> dict[int, Message]:
        """Consume the stage's replies, move to the next stage and return its requests."""

    def _finish(self, ring_sum: np.ndarray, contributors) -> RoundResult:
        """The round's result, with who dropped (and who was faulty) at each stage."""
        self.stage = "done"
        return RoundResult(ring_sum, frozenset(contributors), dict(self._dropped), dict(self._faulty),
                           tuple(self._disputes))

    def settle_accusations(self, accused_by: Mapping[int, frozenset[int]]) -> None:
        """Drop both ends of a maximal matching of the accusations (`accusation_matching`)."""
        drop, matched = accusation_matching(accused_by)
        for c, reason in drop.items():
            self.mark_faulty(c, reason)
        self._disputes.extend(matched)

    def _enter(self, stage: str, requests: Mapping[int, Message]) -> Mapping[int, Message]:
        self.stage = stage
        self._expected = frozenset(requests)
        return requests

    def _request(self, kind: str, to: int, **fields) -> Message:
        return Message(kind=kind, round=self.round_id, sender=SERVER, receiver=to, fields=fields)


class WrappedClient:
    """A client protocol behind a wrapper that delegates everything: drivers see the inner one's name,
    schemas, first kind and progress. Subclasses override `handle` to act around it (refuse a
    mismatched round, crash on cue in tests and benchmarks)."""

    def __init__(self, inner: "ClientProtocol") -> None:
        self.inner = inner
        self.name, self.schemas = inner.name, inner.schemas  # what the client driver reports mismatches with

    @property
    def finished(self) -> bool:
        return self.inner.finished

    def first_kind(self) -> str:
        return self.inner.first_kind()

    def handle(self, msg: Message) -> Message | Iterator[Message] | None:
        return self.inner.handle(msg)


def accusation_matching(accused_by: Mapping[int, frozenset[int]]) -> tuple[dict[int, str], tuple[tuple[int, int], ...]]:
    """Clients to drop so that no accusation (accuser -> sender of a sealed message that failed to
    open) is left between two kept clients, and the accusations settled by dropping both ends.

    The server cannot tell which end of an accusation lies, but at least one of them misbehaved
    (an honest receiver never fails to open an honest sender's message relayed unchanged). So it
    drops BOTH ends of each accusation of a maximal matching: the matched pairs are disjoint and
    each holds at least one misbehaving client, so the honest clients dropped never outnumber the
    misbehaving ones, whatever the colluders accuse; and every accusation has a dropped end (the
    matching is maximal). A greedy cover that drops one end instead lets two colluders accusing
    one victim drop it alone (it used to). Deterministic (accusations in (accuser, accused)
    order), so every run agrees. Returns ({client: reason}, matched (accuser, accused) pairs)."""
    out: dict[int, str] = {}
    matched: list[tuple[int, int]] = []
    for a, u in sorted((a, u) for a, us in accused_by.items() for u in us):
        if a in out or u in out or a == u:
            continue
        matched.append((a, u))
        why = (f"disputed: client {a} reported that client {u}'s sealed message failed to open; the server "
               f"cannot tell which of the two lied, so both are dropped")
        out[a] = out[u] = why
    return out, tuple(matched)


MAX_VECTOR_LENGTH = 1 << 28
"""Longest vector a secure-sum round accepts (2^28 ring elements = 1 GiB of uint32): every protocol
and the engine's layouts refuse more before allocating for it."""


class ClientProtocol(ABC):
    """Client side of one secure-sum round: answers each server request with at most one reply (one
    message, or the messages of a chunked one)."""

    name: str = ""
    schemas: Mapping[str, Schema] = {}
    """Schema of each request kind the client accepts, by kind."""

    def __init__(self, *, client_id: int, round_id: int, input_fn: InputFn, max_length: int = MAX_VECTOR_LENGTH) -> None:
        if client_id <= SERVER:
            raise ValueError("client ids are positive")
        self.client_id = client_id
        self.round_id = round_id
        self.input_fn = input_fn
        self.max_length = max_length
        self.finished = False
        self._next_kinds: tuple[str, ...] = (self.first_kind(),)

    @abstractmethod
    def first_kind(self) -> str:
        """Kind of the first request of a round."""

    def handle(self, msg: Message) -> Message | Iterator[Message] | None:
        """Validate a server request and answer it. Raises ProtocolError (state unchanged) if bad.

        The answer is one message, none, or an iterator of messages made on demand (a masked input sent
        in chunks: each chunk is masked as the driver asks for it, so masking the next chunk overlaps the
        transfer of the last); drivers go through `reply_messages`."""
        if not isinstance(msg, Message):
            raise ProtocolError("not a Message")
        if msg.kind not in self._next_kinds:
            raise ProtocolError(f"client {self.client_id} did not expect '{msg.kind}' now")
        check_envelope(msg, kind=msg.kind, round_id=self.round_id, sender=SERVER, receiver=self.client_id)
        self.schemas[msg.kind].validate(msg)
        reply, next_kinds = self.respond(msg)
        self._next_kinds = next_kinds
        if not next_kinds:
            self.finished = True
        return reply

    @abstractmethod
    def respond(self, msg: Message) -> tuple[Message | None, tuple[str, ...]]:
        """Answer a validated request; return (reply, kinds accepted next). Raise ProtocolError
        without changing state if the request is inconsistent."""

    def _reply(self, kind: str, **fields) -> Message:
        return Message(kind=kind, round=self.round_id, sender=self.client_id, receiver=SERVER, fields=fields)

    def _input(self, length: int, ring: Ring) -> np.ndarray:
        x = self.input_fn()
        ring.validate(x, length=length)
        return x
