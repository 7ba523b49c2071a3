"""The server driver against honest clients and a raw, hostile DEALER: it never crashes and the
round result stays exact."""
from __future__ import annotations

import hashlib
import threading
from dataclasses import replace

import numpy as np
import pytest

from secagg.messages import Bytes, Message, Schema
from secagg.protocols.plain import PlainServer
from transport import session
from transport.cli import synthetic_input, synthetic_sum as plain_sum
from transport.framing import WIRE_VERSION, FrameLimits, encode
from transport.server import ServerConfig, ServerDriver
from transport.session import reply_to

D = 64
TCP = "tcp://127.0.0.1:*"


def raw(frames: list) -> list[bytes]:
    return [bytes(memoryview(f).cast("B")) for f in frames]


def test_hostile_messages_are_dropped_and_the_round_is_still_exact(plain_clients, raw_peer) -> None:
    limits = FrameLimits(max_message_bytes=1 << 20, max_frames=8)
    with ServerDriver(TCP, config=ServerConfig(limits=limits)) as driver:
        plain_clients(driver.endpoint, [1, 2], D)
        attacker = raw_peer(driver.endpoint, hello_as=3)
        silent = raw_peer(driver.endpoint, hello_as=4)
        stranger = raw_peer(driver.endpoint)  # never registers
        giant = raw_peer(driver.endpoint)
        assert driver.wait_for_clients(ids=[1, 2, 3, 4], timeout=20) == {1, 2, 3, 4}
        attacker.expect(session.WELCOME)
        silent.expect(session.WELCOME)

        good = Message(kind="plain_input", round=1, sender=3, receiver=0,
                       fields={"vector": synthetic_input(3, 1, D)})
        bad_version = raw(encode(good))
        bad_version[0] = bad_version[0][:4] + bytes([WIRE_VERSION + 1]) + bad_version[0][5:]
        sent_all = threading.Event()

        def attack() -> None:
            attacker.expect("plain_request")
            attacker.send_frames([b"garbage"])                                           # malformed
            attacker.send_frames(raw(encode(good))[:1])                                  # malformed: no payload
            attacker.send_frames(bad_version)                                            # malformed: version
            attacker.send_frames(raw(encode(replace(good, fields={
                "a": np.zeros(150_000, np.float32), "b": np.zeros(150_000, np.float32)}))))  # malformed: > 1 MiB
            attacker.send(replace(good, fields={f"f{i}": b"x" for i in range(9)}))      # malformed: > 8 frames
            attacker.send(replace(good, round=0))                                        # protocol: round
            attacker.send(replace(good, round=2))                                        # protocol: round
            attacker.send(replace(good, kind="plain_request"))                           # protocol: kind
            attacker.send(replace(good, sender=1))                                       # spoofed_sender
            attacker.send(replace(good, receiver=2))                                     # misaddressed
            attacker.send(session.hello(1, wire_version=WIRE_VERSION))                  # registration
            attacker.send(good)                                                          # accepted
            attacker.send(good)                                                          # protocol: replay
            # the sender's own malformed reply: it is dropped as faulty (after its genuine one: a
            # duplicate is refused before it is looked at, so client 3 still counts)
            attacker.send(replace(good, fields={"vector": np.zeros(D, np.float32)}))    # protocol: duplicate
            stranger.send(replace(good, sender=2))                                       # unregistered
            giant.send_frames([b"x" * (2 << 20)])  # above ZMQ_MAXMSGSIZE: libzmq cuts the connection
            sent_all.set()

        thread = threading.Thread(target=attack)
        thread.start()
        report = driver.run_round(PlainServer(round_id=1, clients=[1, 2, 3, 4], length=D), stage_timeout=2.0)
        thread.join(10)
        assert sent_all.is_set()

        assert report.result.contributors == {1, 2, 3}
        assert report.result.dropped == {"collect": frozenset({4})}  # silent until the deadline
        assert np.array_equal(report.result.ring_sum, plain_sum([1, 2, 3], 1, D))
        assert report.rejected == {"malformed": 5, "protocol": 5, "spoofed_sender": 1, "misaddressed": 1,
                                   "registration": 1, "unregistered": 1}
        assert set(report.bytes_received) == {1, 2, 3}
        assert attacker.expect(session.REJECT)["reason"].startswith(b"connection already registered")

        # Next round over the same connections: a replay of round 1 is refused, the rest is exact.
        def replay() -> None:
            attacker.expect("plain_request")
            attacker.send(good)                                                          # protocol: old round
            attacker.send(replace(good, round=2, fields={"vector": synthetic_input(3, 2, D)}))

        thread = threading.Thread(target=replay)
        thread.start()
        report = driver.run_round(PlainServer(round_id=2, clients=[1, 2, 3], length=D), stage_timeout=10.0)
        thread.join(10)
        assert report.result.contributors == {1, 2, 3} and report.rejected == {"protocol": 1}
        assert np.array_equal(report.result.ring_sum, plain_sum([1, 2, 3], 2, D))
        assert driver.clients == {1, 2, 3, 4}
    del silent


def test_a_registered_clients_malformed_reply_drops_it_at_once(plain_clients, raw_peer) -> None:
    """Over the wire, as in memory: the sender is authenticated by its connection, so a reply that
    fails the protocol's checks is its own fault; the round goes on without it, without waiting."""
    with ServerDriver(TCP) as driver:
        plain_clients(driver.endpoint, [1, 2], D)
        attacker = raw_peer(driver.endpoint, hello_as=3)
        assert driver.wait_for_clients(ids=[1, 2, 3], timeout=20) == {1, 2, 3}
        good = Message(kind="plain_input", round=1, sender=3, receiver=0, fields={"vector": synthetic_input(3, 1, D)})

        def attack() -> None:
            attacker.expect("plain_request")
            attacker.send(replace(good, fields={"vector": np.zeros(D - 1, np.uint32)}))  # wrong length
            attacker.send(good)                                                           # too late now

        thread = threading.Thread(target=attack)
        thread.start()
        report = driver.run_round(PlainServer(round_id=1, clients=[1, 2, 3], length=D), stage_timeout=30.0)
        thread.join(10)
        assert report.result.contributors == {1, 2} and report.result.faulty.keys() == {3}
        assert report.stage_seconds["collect"] < 20.0  # not held until the deadline
        assert np.array_equal(report.result.ring_sum, plain_sum([1, 2], 1, D))


def test_round_ids_must_increase(plain_clients) -> None:
    with ServerDriver(TCP) as driver:
        plain_clients(driver.endpoint, [1], D)
        driver.wait_for_clients(count=1, timeout=20)
        driver.run_round(PlainServer(round_id=5, clients=[1], length=D), stage_timeout=10)
        with pytest.raises(ValueError, match="round id"):
            driver.run_round(PlainServer(round_id=5, clients=[1], length=D), stage_timeout=10)


def test_silent_client_counts_as_dropped_after_the_stage_timeout(plain_clients, raw_peer) -> None:
    with ServerDriver(TCP) as driver:
        plain_clients(driver.endpoint, [1, 2], D)
        raw_peer(driver.endpoint, hello_as=9)  # registers, then never answers
        assert driver.wait_for_clients(count=3, timeout=20) == {1, 2, 9}
        report = driver.run_round(PlainServer(round_id=1, clients=[1, 2, 9], length=D), stage_timeout=0.5)
        assert report.result.contributors == {1, 2}
        assert report.dropped == {"collect": frozenset({9})}
        assert np.array_equal(report.result.ring_sum, plain_sum([1, 2], 1, D))


def test_a_closed_connection_is_dropped_without_waiting_for_the_deadline(plain_clients, raw_peer) -> None:
    with ServerDriver(TCP) as driver:
        plain_clients(driver.endpoint, [1], D)
        quitter = raw_peer(driver.endpoint, hello_as=5)
        assert driver.wait_for_clients(count=2, timeout=20) == {1, 5}
        quitter.expect(session.WELCOME)
        quitter.close()  # crashes before the round: the TCP connection closes
        report = driver.run_round(PlainServer(round_id=1, clients=[1, 5], length=D), stage_timeout=60.0)
        assert report.dropped == {"collect": frozenset({5})}
        assert report.stage_seconds["collect"] < 30.0  # ended by the disconnect, not by the 60 s deadline
        assert driver.clients == {1}


def test_duplicate_registration_is_rejected(plain_clients, raw_peer) -> None:
    with ServerDriver(TCP) as driver:
        plain_clients(driver.endpoint, [1], D)
        assert driver.wait_for_clients(count=1, timeout=20) == {1}
        impostor = raw_peer(driver.endpoint, hello_as=1)
        wrong_version = raw_peer(driver.endpoint)
        wrong_version.send(session.hello(2, wire_version=WIRE_VERSION + 1))
        driver.wait_for_clients(count=3, timeout=1.0)  # only to process the two hellos
        assert impostor.expect(session.REJECT)["reason"] == b"client id 1 is already registered"
        assert b"wire version" in wrong_version.expect(session.REJECT)["reason"]
        assert driver.clients == {1} and driver.rejected_total["registration"] == 2


def test_allowed_clients_limits_registration(raw_peer) -> None:
    with ServerDriver(TCP, config=ServerConfig(allowed_clients=frozenset({1}))) as driver:
        outsider = raw_peer(driver.endpoint, hello_as=2)
        member = raw_peer(driver.endpoint, hello_as=1)
        assert driver.wait_for_clients(count=1, timeout=10) == {1}
        driver.wait_for_clients(count=2, timeout=0.3)
        assert member.expect(session.WELCOME).receiver == 1
        assert b"not allowed" in outsider.expect(session.REJECT)["reason"]


def test_a_hello_expecting_another_session_is_refused_and_an_unspecified_one_is_not(raw_peer) -> None:
    with ServerDriver(TCP, config=ServerConfig(session="secagg+ length=8")) as driver:
        other = raw_peer(driver.endpoint)
        other.send(session.hello(1, wire_version=WIRE_VERSION, session="secagg length=8"))
        same = raw_peer(driver.endpoint)
        same.send(session.hello(2, wire_version=WIRE_VERSION, session="secagg+ length=8"))
        anything = raw_peer(driver.endpoint, hello_as=3)
        assert driver.wait_for_clients(count=3, timeout=2.0) == {2, 3}
        reason = other.expect(session.REJECT)["reason"].decode()
        assert reason == ("session mismatch: the server runs 'secagg+ length=8' but this client expects "
                          "'secagg length=8'")
        assert same.expect(session.WELCOME).receiver == 2 and anything.expect(session.WELCOME).receiver == 3


def test_a_session_description_too_long_for_a_hello_is_refused_when_configured() -> None:
    with pytest.raises(ValueError, match="at most 192"):
        ServerConfig(session="x" * 193)
    with pytest.raises(ValueError, match="at most 192"):
        session.hello(1, wire_version=WIRE_VERSION, session="x" * 193)


def test_broadcast_and_collect_reuse_the_connection(plain_clients, raw_peer) -> None:
    ack = Schema("model_ack", {"digest": Bytes(32, exact=True)})

    def on_model(msg: Message) -> Message:
        return reply_to(msg, "model_ack", digest=hashlib.sha256(msg["weights"].tobytes()).digest())

    with ServerDriver(TCP) as driver:
        plain_clients(driver.endpoint, [1, 2, 3], D, handlers={"model": on_model})
        liar = raw_peer(driver.endpoint, hello_as=4)
        assert driver.wait_for_clients(count=4, timeout=20) == {1, 2, 3, 4}
        liar.expect(session.WELCOME)
        weights = np.linspace(-1, 1, 10_000, dtype=np.float32)
        sent = driver.broadcast("model", {"weights": weights, "version": 7}, round_id=3)
        assert set(sent) == {1, 2, 3, 4} and min(sent.values()) > weights.nbytes
        got = liar.expect("model")
        assert got["version"] == 7 and np.array_equal(got["weights"], weights)
        liar.send(reply_to(got, "model_ack", digest=b"short"))                 # schema
        liar.send(reply_to(got, "other", digest=bytes(32)))                     # unexpected kind
        result = driver.collect("model_ack", round_id=3, timeout=1.0, schema=ack)
        assert set(result.replies) == {1, 2, 3} and result.missing == {4}
        digest = hashlib.sha256(weights.tobytes()).digest()
        assert all(m["digest"] == digest for m in result.replies.values())
        assert result.rejected == {"schema": 1, "unexpected_kind": 1}
        # and a secure round right after, on the same sockets
        report = driver.run_round(PlainServer(round_id=4, clients=[1, 2, 3], length=D), stage_timeout=10)
        assert np.array_equal(report.result.ring_sum, plain_sum([1, 2, 3], 4, D))
        with pytest.raises(ValueError, match="reserved"):
            driver.broadcast(session.SHUTDOWN, {}, round_id=5)
