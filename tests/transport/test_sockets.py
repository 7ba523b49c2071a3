"""CurveZMQ: only allowlisted keys connect, and a key can only register as its own client id."""
from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

from secagg.protocols.plain import PlainServer
from transport.cli import synthetic_sum
from transport.client import ClientConfig, RegistrationError, run_client
from transport.server import ServerDriver
from transport.sockets import (CurveClientKeys, CurveServerKeys, curve_keypair, load_client_keys,
                               load_server_keys, send_whole, write_keys)

D = 16


def attempt(endpoint: str, client_id: int, curve: CurveClientKeys | None, errors: dict) -> threading.Thread:
    def body() -> None:
        try:
            run_client(endpoint=endpoint, client_id=client_id, factory=lambda r: None, curve=curve,
                       config=ClientConfig(hello_timeout=1.0, idle_timeout=5.0))
        except RegistrationError as exc:
            errors[client_id] = exc

    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t


def test_curve_admits_only_allowlisted_keys_bound_to_their_ids(plain_clients) -> None:
    server_pub, server_sec = curve_keypair()
    (k1_pub, k1_sec), (k2_pub, k2_sec), (rogue_pub, rogue_sec) = curve_keypair(), curve_keypair(), curve_keypair()
    keys = CurveServerKeys(public_key=server_pub, secret_key=server_sec, client_keys={1: k1_pub, 2: k2_pub})
    with ServerDriver("tcp://127.0.0.1:*", curve=keys) as driver:
        plain_clients(driver.endpoint, [1], D, curve=CurveClientKeys(k1_pub, k1_sec, server_pub))
        errors: dict = {}
        threads = [
            attempt(driver.endpoint, 3, CurveClientKeys(rogue_pub, rogue_sec, server_pub), errors),  # unknown key
            attempt(driver.endpoint, 4, None, errors),                                             # no CURVE
            attempt(driver.endpoint, 5, CurveClientKeys(k2_pub, k2_sec, server_pub), errors),     # 2's key as 5
        ]
        deadline = time.monotonic() + 20
        while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
            driver.wait_for_clients(count=2, timeout=0.2)  # serves hellos while the attempts run
        assert driver.clients == {1}
        assert set(errors) == {3, 4, 5}
        assert "refused our key" in str(errors[3])
        assert "not the one registered for client 5" in str(errors[5])
        assert any(s in str(errors[4]) for s in ("handshake failed", "no welcome"))  # no CURVE, no entry
        report = driver.run_round(PlainServer(round_id=1, clients=[1], length=D), stage_timeout=10)
        assert np.array_equal(report.result.ring_sum, synthetic_sum([1], 1, D))
        assert driver.rejected_total["registration"] == 1


def test_key_files_round_trip(tmp_path) -> None:
    write_keys(tmp_path, clients=2)
    server = load_server_keys(tmp_path)
    client = load_client_keys(tmp_path, 2)
    assert set(server.client_keys) == {1, 2}
    assert server.client_keys[2] == client.public_key and client.server_key == server.public_key
    assert len(server.secret_key) == len(client.secret_key) == 40  # Z85 of 32 bytes
    with pytest.raises(OSError, match=r"client-3\.key_secret"):
        load_client_keys(tmp_path, 3)


# ---- send_whole: Ctrl-C cannot cut a message in two ---------------------------------------------

class _FrameRecorder:
    """A socket stand-in that records frames and, after the first, delivers SIGINT to this process (the
    moment at which a KeyboardInterrupt used to leave a partial message on the socket)."""

    def __init__(self) -> None:
        self.frames: list = []

    def send_multipart(self, frames, flags=0, copy=True):
        for i, frame in enumerate(frames):
            self.frames.append(frame)
            if i == 0:
                os.kill(os.getpid(), signal.SIGINT)
                sum(range(10_000))   # bytecode runs: a pending KeyboardInterrupt would be raised here


@pytest.fixture
def sigint_raises():
    """SIGINT as a terminal delivers it (a suite run in the background inherits it ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_a_sigint_during_a_send_is_raised_once_the_whole_message_is_sent(sigint_raises):
    sock = _FrameRecorder()
    with pytest.raises(KeyboardInterrupt):
        send_whole(sock, [b"identity", b"header", b"payload"])
    assert sock.frames == [b"identity", b"header", b"payload"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler   # the handler is restored


def test_a_sigint_during_a_send_runs_the_replaced_handler_once_afterwards():
    calls = []

    def handler(signum, frame):
        calls.append(list(sock.frames))   # what had been sent when the handler ran

    sock = _FrameRecorder()
    previous = signal.signal(signal.SIGINT, handler)
    try:
        send_whole(sock, [b"a", b"b", b"c"])
        assert signal.getsignal(signal.SIGINT) is handler   # restored
    finally:
        signal.signal(signal.SIGINT, previous)
    assert calls == [[b"a", b"b", b"c"]]


def test_a_send_without_a_sigint_leaves_the_handler_as_it_was():
    class Quiet:
        def send_multipart(self, frames, flags=0, copy=True):
            return len(frames)

    before = signal.getsignal(signal.SIGINT)
    assert send_whole(Quiet(), [b"x", b"y"]) == 2
    assert signal.getsignal(signal.SIGINT) is before
