"""The sans-IO protocol interface every secure-sum protocol implements.

A round is driven by the server, stage by stage. The server emits one request per live client;
each client answers with at most one reply; when all replies are in (or the stage's deadline
passes, and the silent clients count as dropped) the driver calls `advance`, which either emits
the next stage's requests or finishes. The same objects run in the in-memory simulator, over
ZeroMQ inproc:// and over tcp:// between processes: drivers only move `Message`s.

Protocols sum uint32 ring vectors of a fixed length; encoding floats to the ring is a separate
layer (`secagg.encoding`, or distributed-DP encoders in `dp`).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from secagg.messages import SERVER, Message, ProtocolError, Schema, check_envelope
from secagg.ring import Ring

InputFn = Callable[[], np.ndarray]
"""Called once, when the client must mask its input: returns its uint32 ring vector."""


@dataclass(frozen=True)
class RoundResult:
    ring_sum: np.ndarray
    """Sum (mod the ring) of the inputs of exactly the clients in `contributors`."""
    contributors: frozenset[int]
    dropped: Mapping[str, frozenset[int]] = field(default_factory=dict)
    """Clients first found missing at each stage."""


class ServerProtocol(ABC):
    """Server side of one secure-sum round."""

    name: str = ""
    schemas: Mapping[str, Schema] = {}
    """Schema of the reply expected in each stage, by stage name."""

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
        self._expected: frozenset[int] = frozenset()
        self._dropped: dict[str, frozenset[int]] = {}

    # ---- driver interface ---------------------------------------------------------------
    @abstractmethod
    def start(self) -> dict[int, Message]:
        """Requests of the first stage, by client id."""

    def waiting_for(self) -> frozenset[int]:
        """Clients whose reply to the current stage has not arrived yet."""
        return self._expected - self._replies.keys()

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
        self.schemas[self.stage].validate(msg)
        self.check_reply(msg)
        self._replies[msg.sender] = msg

    def advance(self) -> dict[int, Message]:
        """Close the current stage with the replies received; return the next requests ({} when done).

        Raises AbortError if too few clients are left to finish correctly.
        """
        replies, missing = dict(self._replies), self._expected - self._replies.keys()
        if missing:
            self._dropped[self.stage] = frozenset(missing)
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

    def _enter(self, stage: str, requests: dict[int, Message]) -> dict[int, Message]:
        self.stage = stage
        self._expected = frozenset(requests)
        return requests

    def _request(self, kind: str, to: int, **fields) -> Message:
        return Message(kind=kind, round=self.round_id, sender=SERVER, receiver=to, fields=fields)


MAX_VECTOR_LENGTH = 1 << 28
"""Longest vector a secure-sum round accepts (2^28 ring elements = 1 GiB of uint32): every protocol
and the engine's layouts refuse more before allocating for it."""


class ClientProtocol(ABC):
    """Client side of one secure-sum round: answers each server request with at most one reply."""

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

    def handle(self, msg: Message) -> Message | None:
        """Validate a server request and answer it. Raises ProtocolError (state unchanged) if bad."""
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
