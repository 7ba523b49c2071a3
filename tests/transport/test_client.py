"""The client loop against a hand-driven ROUTER playing the server."""
from __future__ import annotations

import threading
from dataclasses import replace

import numpy as np
import pytest
import zmq

from secagg.messages import Message
from secagg.protocols.plain import PlainClient
from transport import session
from transport.cli import synthetic_input
from transport.client import ClientConfig, RegistrationError, run_client
from transport.framing import decode, encode

D = 32


class FakeServer:
    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind("tcp://127.0.0.1:*")
        self.endpoint = self.sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.identity = b""

    def recv(self, timeout: float = 10.0) -> Message:
        assert self.sock.poll(int(timeout * 1000)), "client sent nothing"
        ident, *frames = self.sock.recv_multipart(copy=False)
        self.identity = ident.bytes
        return decode(frames)

    def send(self, msg: Message) -> None:
        self.send_frames(encode(msg))

    def send_frames(self, frames: list) -> None:
        self.sock.send_multipart([self.identity, *frames], copy=False)

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()


def start_client(endpoint: str, client_id: int, out: dict, **config) -> threading.Thread:
    def factory(r: int) -> PlainClient:
        return PlainClient(client_id=client_id, round_id=r, input_fn=lambda: synthetic_input(client_id, r, D))

    def body() -> None:
        try:
            out["summary"] = run_client(endpoint=endpoint, client_id=client_id, factory=factory,
                                        config=ClientConfig(**{"idle_timeout": 20.0, **config}))
        except BaseException as exc:
            out["error"] = exc

    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t


def request(round_id: int, to: int = 7) -> Message:
    return Message(kind="plain_request", round=round_id, sender=0, receiver=to,
                   fields={"length": D, "modulus": 1 << 32, "chunk": 0})


def test_client_answers_valid_requests_and_drops_the_rest() -> None:
    server, out = FakeServer(), {}
    try:
        t = start_client(server.endpoint, 7, out)
        hello = server.recv()
        assert (hello.kind, hello.sender, hello.receiver) == (session.HELLO, 7, 0)
        server.send(session.to_client(session.WELCOME, 7))
        server.send_frames([b"garbage"])                                   # malformed
        server.send(request(2, to=8))                                      # addressed to someone else
        server.send(replace(request(2), sender=5))                         # not from the server
        server.send(replace(request(2), fields={"length": D}))             # schema
        server.send(replace(request(2), kind="other_request"))             # cannot open a round
        server.send(request(2))                                            # answered
        server.send(request(1))                                            # older round
        server.send(request(2))                                            # replay: round already answered
        reply = server.recv()
        assert (reply.kind, reply.round, reply.sender) == ("plain_input", 2, 7)
        assert np.array_equal(reply["vector"], synthetic_input(7, 2, D))
        server.send(request(3))                                            # a new round: a new protocol
        assert server.recv().round == 3
        server.send(session.to_client(session.SHUTDOWN, 7))
        t.join(10)
        summary = out["summary"]
        assert summary.exit_reason == "shutdown" and summary.rounds == (2, 3)
        assert summary.rejected == 7 and summary.finished_rounds == 2
    finally:
        server.close()


def test_client_exits_when_the_server_goes_away() -> None:
    server, out = FakeServer(), {}
    t = start_client(server.endpoint, 7, out)
    server.recv()
    server.send(session.to_client(session.WELCOME, 7))
    server.send(request(1))
    assert server.recv().kind == "plain_input"
    server.close()
    t.join(30)
    assert out["summary"].exit_reason == "server_gone"


def test_client_exits_when_idle() -> None:
    server, out = FakeServer(), {}
    try:
        t = start_client(server.endpoint, 7, out, idle_timeout=0.3)
        server.recv()
        server.send(session.to_client(session.WELCOME, 7))
        t.join(10)
        assert out["summary"].exit_reason == "idle"
    finally:
        server.close()


def test_refused_or_unanswered_registration_raises() -> None:
    server, out = FakeServer(), {}
    try:
        t = start_client(server.endpoint, 7, out)
        server.recv()
        server.send(session.to_client(session.REJECT, 7, reason=b"go away"))
        t.join(10)
        assert isinstance(out["error"], RegistrationError) and "go away" in str(out["error"])
    finally:
        server.close()
    with pytest.raises(RegistrationError, match="no welcome"):
        run_client(endpoint="tcp://127.0.0.1:9", client_id=1, factory=lambda r: None,
                   config=ClientConfig(hello_timeout=0.3, hello_retry=0.1))
