"""Insecure plain sum with the secure protocols' interface: the baseline and the reference.

The server sees every client's (encoded) vector. Used for overhead baselines and to check that
the secure protocols produce exactly the same ring sum.
"""
from __future__ import annotations


from secagg.messages import AbortError, Array, Int, Message, ProtocolError, Schema
from secagg.protocols.base import MAX_VECTOR_LENGTH, ClientProtocol, RoundResult, ServerProtocol
from secagg.ring import RING_2_32, Ring

MAX_LEN = MAX_VECTOR_LENGTH

REQUEST = Schema("plain_request", {"length": Int(1, MAX_LEN), "modulus": Int(3, 1 << 32)})
INPUT = Schema("plain_input", {"vector": Array("uint32", MAX_LEN)})


class PlainServer(ServerProtocol):
    name = "plain"
    schemas = {"collect": INPUT}

    def __init__(self, *, round_id: int, clients, length: int, ring: Ring = RING_2_32, min_clients: int = 1) -> None:
        super().__init__(round_id=round_id, clients=clients, length=length, ring=ring)
        self.min_clients = min_clients
        self._result: RoundResult | None = None

    def start(self) -> dict[int, Message]:
        return self._enter("collect", {
            c: self._request("plain_request", c, length=self.length, modulus=self.ring.modulus) for c in self.clients
        })

    def check_reply(self, msg: Message) -> None:
        try:
            self.ring.validate(msg["vector"], length=self.length)
        except ValueError as exc:
            raise ProtocolError(str(exc)) from exc

    def accept(self, msg: Message) -> None:
        """Validate, then add the input into the running sum at once and keep only its envelope: the
        server holds O(d), not O(N d)."""
        super().accept(msg)
        self.fold_input(msg)

    def on_stage_complete(self, replies: dict[int, Message]) -> dict[int, Message]:
        if len(replies) < self.min_clients:
            raise AbortError(stage="collect", survivors=len(replies), required=self.min_clients)
        self._result = self._finish(self.take_running_sum(), replies)
        return {}

    def result(self) -> RoundResult:
        if self._result is None:
            raise RuntimeError("round not finished")
        return self._result


class PlainClient(ClientProtocol):
    name = "plain"
    schemas = {"plain_request": REQUEST}

    def first_kind(self) -> str:
        return "plain_request"

    def respond(self, msg: Message):
        if msg["length"] > self.max_length:
            raise ProtocolError("requested length exceeds this client's limit")
        try:
            ring = Ring(msg["modulus"])
        except ValueError as exc:
            raise ProtocolError(str(exc)) from exc
        return self._reply("plain_input", vector=self._input(msg["length"], ring)), ()
