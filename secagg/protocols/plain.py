"""Insecure plain sum with the secure protocols' interface: the baseline and the reference.

The server sees every client's (encoded) vector. Used for overhead baselines and to check that
the secure protocols produce exactly the same ring sum. With `chunk` the vectors travel in chunks
folded as they arrive, as SecAgg+'s masked inputs do (`secagg.protocols.chunks`), so that the
baseline streams too and the comparison stays fair: collect -> [resend] when a stream breaks.
"""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from secagg.messages import AbortError, Array, Int, IntList, Message, ProtocolError, Schema
from secagg.protocols.base import MAX_VECTOR_LENGTH, ClientProtocol, RoundResult, ServerProtocol
from secagg.protocols.chunks import MIN_CHUNK, ChunkFolder, ChunkPlan, check_max_streams, plan_for, stream_window
from secagg.ring import RING_2_32, Ring

MAX_LEN = MAX_VECTOR_LENGTH

REQUEST = Schema("plain_request", {"length": Int(1, MAX_LEN), "modulus": Int(3, 1 << 32), "chunk": Int(0, MAX_LEN)})
INPUT = Schema("plain_input", {"vector": Array("uint32", MAX_LEN)})
CHUNK = Schema("plain_chunk", {"index": Int(0, MAX_LEN), "vector": Array("uint32", MAX_LEN)})
RESEND = Schema("plain_resend", {"chunks": IntList(MAX_LEN, 0, MAX_LEN)})


class PlainServer(ServerProtocol):
    name = "plain"
    schemas = {"collect": INPUT}

    def __init__(self, *, round_id: int, clients, length: int, ring: Ring = RING_2_32, min_clients: int = 1,
                 chunk: int | str | None = "auto", max_streams: int | None = None) -> None:
        """`chunk`: inputs in chunks of this many values, each folded as it arrives (None, or at least the
        length: one message; "auto", the default: chunks from 2^22 values on, `chunks.plan_for`).
        `max_streams`: at most this many clients stream at once, as SecAgg+'s (`chunks.stream_window`)."""
        super().__init__(round_id=round_id, clients=clients, length=length, ring=ring)
        self.min_clients = min_clients
        self.max_streams = check_max_streams(max_streams)
        self.chunks = plan_for(chunk, length, max_length=MAX_LEN)
        self._folder: ChunkFolder | None = ChunkFolder(self.chunks, ring) if self.chunks is not None else None
        self.resent: tuple[int, ...] = ()
        self._kept: frozenset[int] = frozenset()
        if self.chunks is not None:
            self.schemas = {"collect": CHUNK, "resend": CHUNK}
        self._result: RoundResult | None = None

    def start(self) -> dict[int, Message]:
        chunk = self.chunks.size if self.chunks is not None else 0
        return self._enter("collect", {
            c: self._request("plain_request", c, length=self.length, modulus=self.ring.modulus, chunk=chunk)
            for c in self.clients
        })

    def check_reply(self, msg: Message) -> None:
        try:
            self.ring.validate(msg["vector"], length=self.length)
        except ValueError as exc:
            raise ProtocolError(str(exc)) from exc

    def max_reply_bytes(self) -> int:
        """One input, or one chunk of it when chunked."""
        return 4 * (self.chunks.size if self.chunks is not None else self.length) + (64 << 10)

    def replies_expected(self, client: int) -> int:
        return self._folder.need if self._folder is not None else 1

    def send_window(self) -> int | None:
        return stream_window(self.max_streams, streaming=self._folder is not None and self.stage == "collect",
                             expected=len(self._expected))

    def quorum(self) -> int:
        return len(self._expected)

    def accept(self, msg: Message) -> None:
        """Validate, then add the input into the running sum at once and keep only its envelope: the
        server holds O(d), not O(N d). Chunks are validated and folded one by one."""
        if self._folder is None:
            super().accept(msg)
            self.fold_input(msg)
            return
        self.accept_chunk(msg, schema=CHUNK, folder=self._folder)

    def on_stage_complete(self, replies: dict[int, Message]) -> dict[int, Message]:
        if self.stage == "resend":
            if set(replies) != self._kept:
                raise AbortError(stage="resend", survivors=len(replies), required=len(self._kept),
                                 detail="a client did not resend its chunks: the sum cannot be rebuilt")
            return self._done(self._kept)
        if len(replies) < self.min_clients:
            raise AbortError(stage="collect", survivors=len(replies), required=self.min_clients)
        kept = frozenset(replies)
        tainted = self._folder.tainted(kept) if self._folder is not None else []
        if tainted:  # a stream broke: rebuild its chunks' slices from the complete clients' resends
            self._folder.clear(self.running_sum, tainted)
            self._folder = ChunkFolder(self.chunks, self.ring, wanted=tainted)
            self._kept, self.resent = kept, tuple(tainted)
            return self._enter("resend", {c: self._request("plain_resend", c, chunks=tuple(tainted)) for c in kept})
        return self._done(kept)

    def _done(self, contributors: frozenset[int]) -> dict[int, Message]:
        self._folder = None
        self._result = self._finish(self.take_running_sum(), contributors)
        return {}

    def result(self) -> RoundResult:
        if self._result is None:
            raise RuntimeError("round not finished")
        return self._result


class PlainClient(ClientProtocol):
    name = "plain"
    schemas = {"plain_request": REQUEST, "plain_resend": RESEND}

    def first_kind(self) -> str:
        return "plain_request"

    def handle(self, msg: Message):
        reply = super().handle(msg)
        if self._next_kinds == ("plain_resend",):
            self.finished = True  # its input is delivered; it still answers a resend if a stream broke
        return reply

    def respond(self, msg: Message):
        if msg.kind == "plain_resend":
            plan, x = self._stream
            chunks = msg["chunks"]
            if not chunks or any(i >= plan.count for i in chunks):
                raise ProtocolError(f"resend asks for chunks {list(chunks)[:5]} of an input in {plan.count} chunks")
            return _chunks(self, plan, x, sorted(chunks)), ()
        if msg["length"] > self.max_length:
            raise ProtocolError("requested length exceeds this client's limit")
        chunk = msg["chunk"]
        if 0 < chunk < MIN_CHUNK and chunk < msg["length"]:
            raise ProtocolError(f"chunks of {chunk} values: fewer than {MIN_CHUNK}, this client's floor")
        try:
            ring = Ring(msg["modulus"])
        except ValueError as exc:
            raise ProtocolError(str(exc)) from exc
        x = self._input(msg["length"], ring)
        if 0 < chunk < msg["length"]:
            self._stream = (ChunkPlan(msg["length"], chunk), x)
            return _chunks(self, *self._stream, range(self._stream[0].count)), ("plain_resend",)
        return self._reply("plain_input", vector=x), ()


def _chunks(client: PlainClient, plan: ChunkPlan, x: np.ndarray, indices) -> Iterator[Message]:
    for index in indices:
        start, end = plan.bounds(index)
        yield client._reply("plain_chunk", index=index, vector=np.ascontiguousarray(x[start:end]))
