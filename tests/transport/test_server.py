"""The server driver against honest clients and a raw, hostile DEALER: it never crashes, the round
result stays exact, and what a peer can make it hold is bounded."""
from __future__ import annotations

import hashlib
import struct
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import transport.server as server_module
from secagg.messages import Bytes, Message, Schema
from secagg.protocols.plain import PlainServer
from transport.adversary import zmtp_connect
from transport import session
from transport.cli import synthetic_input, synthetic_sum as plain_sum
from transport.framing import WIRE_VERSION, FrameLimits, encode, wire_size
from transport.server import LARGEST_HELLO, QueueLimits, ServerConfig, ServerDriver, peak_rss_mb
from transport.session import reply_to

D = 64
TCP = "tcp://127.0.0.1:*"


def _wait_for(condition, timeout: float = 60.0) -> None:
    """Poll `condition` until it holds; fail after `timeout` seconds (generous: a loaded machine is slow)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{condition.__name__} did not hold within {timeout} s"
        time.sleep(0.01)


def raw(frames: list) -> list[bytes]:
    return [bytes(memoryview(f).cast("B")) for f in frames]


def test_hostile_messages_are_dropped_and_the_round_is_still_exact(plain_clients, raw_peer) -> None:
    limits = FrameLimits(max_message_bytes=1 << 20, max_frames=8)
    with ServerDriver(TCP, config=ServerConfig(limits=limits)) as driver:
        plain_clients(driver.endpoint, [1, 2], D)
        attacker = raw_peer(driver.endpoint, hello_as=3)
        silent = raw_peer(driver.endpoint, hello_as=4)
        faulty = raw_peer(driver.endpoint, hello_as=5)
        stranger = raw_peer(driver.endpoint)  # never registers
        giant = raw_peer(driver.endpoint)
        assert driver.wait_for_clients(ids=[1, 2, 3, 4, 5], timeout=20) == {1, 2, 3, 4, 5}
        for peer in (attacker, silent, faulty):
            peer.expect(session.WELCOME)

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
            attacker.send_frames(raw(encode(replace(good, fields={  # oversized: over the round's limit (but
                "a": np.zeros(40_000, np.float32), "b": np.zeros(40_000, np.float32)}))))  # not the watchdog's)
            attacker.send(replace(good, fields={f"f{i}": b"x" for i in range(9)}))      # oversized: > 8 frames
            attacker.send(replace(good, round=0))                                        # protocol: round
            attacker.send(replace(good, round=2))                                        # protocol: round
            attacker.send(replace(good, kind="plain_request"))                           # protocol: kind
            attacker.send(replace(good, sender=1))                                       # spoofed_sender
            attacker.send(replace(good, receiver=2))                                     # misaddressed
            attacker.send(session.hello(1, wire_version=WIRE_VERSION))                  # registration
            attacker.send(good)                                                          # accepted
            attacker.send(good)                                                          # protocol: replay
            faulty.expect("plain_request")
            bad = replace(good, sender=5, fields={"vector": np.zeros(D, np.float32)})
            faulty.send(bad)                                                             # protocol: dtype -> faulty
            faulty.send(replace(bad, fields={"vector": synthetic_input(5, 1, D)}))       # protocol: dropped already
            stranger.send(replace(good, sender=2))                                       # unregistered
            stranger.send_frames([b"x" * 4096])  # unregistered: over the hello size, dropped undecoded
            giant.send_frames([b"x" * (2 << 20)])  # above ZMQ_MAXMSGSIZE: libzmq cuts the connection
            sent_all.set()

        thread = threading.Thread(target=attack)
        thread.start()
        report = driver.run_round(PlainServer(round_id=1, clients=[1, 2, 3, 4, 5], length=D), stage_timeout=2.0)
        thread.join(10)
        assert sent_all.is_set()

        assert report.result.contributors == {1, 2, 3}
        assert report.result.dropped == {"collect": frozenset({4, 5})}  # 4 silent until the deadline
        assert set(report.result.faulty) == {5} and "uint32" in report.result.faulty[5]
        assert np.array_equal(report.result.ring_sum, plain_sum([1, 2, 3], 1, D))
        assert report.rejected == {"malformed": 3, "oversized": 2, "protocol": 6, "spoofed_sender": 1,
                                   "misaddressed": 1, "registration": 1, "unregistered": 2}
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
        assert driver.clients == {1, 2, 3, 4, 5}
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
        deadline = 60.0
        report = driver.run_round(PlainServer(round_id=1, clients=[1, 2, 3], length=D), stage_timeout=deadline)
        thread.join(10)
        assert report.result.contributors == {1, 2} and report.result.faulty.keys() == {3}
        assert report.stage_seconds["collect"] < deadline  # closed on the last reply, before its deadline fired
        assert np.array_equal(report.result.ring_sum, plain_sum([1, 2], 1, D))
        if Path("/proc/self/status").exists():  # the server's peak memory as each stage ended
            assert report.stage_peak_rss_mb.keys() == report.stage_seconds.keys()
            assert 0 < report.stage_peak_rss_mb["collect"] <= peak_rss_mb()


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
        deadline = 60.0
        report = driver.run_round(PlainServer(round_id=1, clients=[1, 5], length=D), stage_timeout=deadline)
        assert report.dropped == {"collect": frozenset({5})}
        assert report.stage_seconds["collect"] < deadline  # ended by the disconnect, before its deadline fired
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


# ---- bounded resources -------------------------------------------------------------------------

@pytest.fixture
def decode_calls(monkeypatch) -> list[int]:
    """Wire bytes of every message the server decodes."""
    calls: list[int] = []
    real = server_module.decode

    def counting(frames, **kw):
        calls.append(wire_size(frames))
        return real(frames, **kw)

    monkeypatch.setattr(server_module, "decode", counting)
    return calls


def test_an_unregistered_connection_gets_nothing_but_a_small_hello_decoded(raw_peer, decode_calls) -> None:
    with ServerDriver(TCP) as driver:
        stranger = raw_peer(driver.endpoint)
        stranger.send(Message(kind="plain_input", round=1, sender=7, receiver=0,
                              fields={"vector": np.zeros(1000, np.uint32)}))           # 4 KB: over the hello size
        stranger.send_frames([b"x"] * 5)                                                 # 5 frames: more than a hello
        stranger.send(Message(kind="m", round=0, sender=7, receiver=0,
                              fields={"m": {i: b"" for i in range(50)}}))               # 650 bytes: over it too
        stranger.send(Message(kind="plain_input", round=1, sender=7, receiver=0, fields={"v": b"x"}))  # small
        stranger.hello(7)
        assert driver.wait_for_clients(count=1, timeout=10) == {7}
        assert driver.rejected_total == {"unregistered": 4}
        assert len(decode_calls) == 2 and max(decode_calls) <= driver.config.max_hello_bytes  # the small two
        assert stranger.expect(session.WELCOME).receiver == 7


class _NoBound(PlainServer):
    max_reply_bytes = None  # a protocol without its own bound: the driver's fallback applies


@pytest.mark.parametrize("protocol, limit", [(PlainServer, 4 * D + (64 << 10)), (_NoBound, 16 * D + (1 << 20))])
def test_replies_over_the_rounds_limit_are_dropped_undecoded(plain_clients, raw_peer, decode_calls,
                                                             protocol, limit) -> None:
    with ServerDriver(TCP) as driver:
        plain_clients(driver.endpoint, [1], D)
        big = raw_peer(driver.endpoint, hello_as=2)
        assert driver.wait_for_clients(count=2, timeout=20) == {1, 2}
        big.expect(session.WELCOME)
        over = Message(kind="plain_input", round=1, sender=2, receiver=0,
                       fields={"vector": synthetic_input(2, 1, D), "pad": b"x" * (limit - 4 * D)})
        assert wire_size(encode(over)) > limit
        thread = threading.Thread(target=lambda: (big.expect("plain_request"), big.send(over)))
        thread.start()
        report = driver.run_round(protocol(round_id=1, clients=[1, 2], length=D), stage_timeout=2.0)
        thread.join(10)
        assert report.rejected == {"oversized": 1} and report.result.contributors == {1}
        assert max(decode_calls) < limit  # the oversized reply was never decoded


def test_collect_drops_replies_over_max_bytes_and_its_default(raw_peer) -> None:
    config = ServerConfig(collect_max_bytes=2000)
    with ServerDriver(TCP, config=config) as driver:
        peers = {cid: raw_peer(driver.endpoint, hello_as=cid) for cid in (1, 2)}
        assert driver.wait_for_clients(count=2, timeout=10) == {1, 2}
        for size, max_bytes in ((1000, None), (3000, None), (3000, 4000), (5000, 4000)):
            driver.broadcast("model", {"w": np.zeros(4, np.float32)}, round_id=size)
            for cid, peer in peers.items():
                msg = peer.expect("model")
                peer.send(reply_to(msg, "ack", blob=b"x" * (size if cid == 1 else 10)))
            fits = size < (max_bytes or config.collect_max_bytes)
            got = driver.collect("ack", round_id=size, timeout=5 if fits else 1, max_bytes=max_bytes)
            assert set(got.replies) == ({1, 2} if fits else {2}), (size, max_bytes)
            assert got.rejected == ({} if fits else {"oversized": 1})


def test_limits_above_the_outer_cap_are_refused_before_anything_is_sent(plain_clients) -> None:
    config = ServerConfig(limits=FrameLimits(max_message_bytes=1 << 20), collect_max_bytes=4 << 20)
    with ServerDriver(TCP, config=config) as driver:
        plain_clients(driver.endpoint, [1], D)
        driver.wait_for_clients(count=1, timeout=20)
        with pytest.raises(ValueError, match="raise it"):
            driver.run_round(PlainServer(round_id=1, clients=[1], length=1 << 18), stage_timeout=1)
        with pytest.raises(ValueError, match="raise it"):
            driver.collect("ack", round_id=1, timeout=0.1, max_bytes=2 << 20)
        assert driver.collect("ack", round_id=1, timeout=0.1).missing == {1}  # default: capped at 1 MiB
        report = driver.run_round(PlainServer(round_id=1, clients=[1], length=D), stage_timeout=10)
        assert np.array_equal(report.result.ring_sum, plain_sum([1], 1, D))  # round 1 was not used up


def test_configs_that_cannot_hold_a_hello_are_refused() -> None:
    with pytest.raises(ValueError, match="max_hello_bytes"):
        ServerConfig(max_hello_bytes=LARGEST_HELLO - 1)
    with pytest.raises(ValueError, match="max_hello_bytes"):
        ServerConfig(limits=FrameLimits(max_message_bytes=256))
    with pytest.raises(ValueError, match="handshake"):
        QueueLimits(pending_bytes=1000)
    assert LARGEST_HELLO == wire_size(encode(session.hello(2**31 - 1, wire_version=255, session="x" * 192)))


def test_a_message_that_never_ends_gets_its_connection_cut(raw_peer) -> None:
    """libzmq would buffer it without bound (each frame is under ZMQ_MAXMSGSIZE, and an unfinished
    message counts nothing against RCVHWM); the watchdog cuts the connection instead."""
    with ServerDriver(TCP) as driver:
        member = raw_peer(driver.endpoint, hello_as=1)
        assert driver.wait_for_clients(count=1, timeout=10) == {1}
        frame = bytes([0x03]) + struct.pack(">Q", 1 << 20) + bytes(1 << 20)  # MORE | LONG: 1 MiB, never the last
        sent = 0
        with zmtp_connect(driver.endpoint) as sock:
            # no message: the OS reports the cut connection (reset or broken pipe), not our code
            with pytest.raises(OSError):  # reset or broken pipe once cut
                while sent < 1 << 30:
                    sock.sendall(frame)
                    sent += len(frame)
        assert sent < 256 << 20
        driver.wait_for_clients(count=2, timeout=1.0)  # lets the driver see the disconnect
        assert driver.rejected_total["overflow"] >= 1 and driver.clients == {1}
        assert member.expect(session.WELCOME).receiver == 1  # the registered client is untouched


def test_a_registered_client_may_queue_the_replies_it_owes_but_not_more(raw_peer) -> None:
    with ServerDriver(TCP) as driver:
        asked, unasked = raw_peer(driver.endpoint, hello_as=1), raw_peer(driver.endpoint, hello_as=2)
        assert driver.wait_for_clients(count=2, timeout=10) == {1, 2}
        driver.send(Message(kind="model", round=1, sender=0, receiver=1, fields={}))
        asked.expect("model")
        reply = b"x" * (8 << 20)  # under collect's default limit: owed, so within its budget
        asked.send(Message(kind="ack", round=1, sender=1, receiver=0, fields={"blob": reply}))
        unasked.send(Message(kind="ack", round=1, sender=2, receiver=0, fields={"blob": reply}))
        # the driver is not reading: wait until 1's reply (owed) has arrived whole and the watchdog has cut
        # 2's connection (owed nothing) and libzmq has closed it; the driver learns both when it reads again
        one, two = driver._by_id[1], driver._by_id[2]

        def swept() -> bool:
            return (bool(driver._guard._cuts) and server_module._bytes_received(two.fd, two.ino) is None
                    and (server_module._bytes_received(one.fd, one.ino) or 0) >= len(reply))

        _wait_for(swept)
        got = driver.collect("ack", round_id=1, timeout=5, expect=[1])
        assert set(got.replies) == {1} and got.replies[1]["blob"] == reply
        assert driver.clients == {1} and driver.rejected_total["overflow"] == 1  # 2 owed nothing: cut
