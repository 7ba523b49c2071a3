"""Stalls are bounded (`StallPolicy`): a stage closes on its quorum plus a grace derived from the
honest replies' speed, a staller is `late` and dropped for the stage, and a client late or silent in
K consecutive rounds is evicted for the session. Assertions are on events, not on durations, except
'the round ended before the staller's own reply time' (seconds apart)."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import zmq

import transport.server as server_module
from secagg.messages import AbortError, Message
from secagg.protocols.plain import PlainClient, PlainServer
from transport import session
from transport.adversary import RawPeer
from transport.cli import synthetic_input, synthetic_sum
from transport.server import ServerConfig, ServerDriver, StallPolicy
from transport.session import reply_to

D = 64
TCP = "tcp://127.0.0.1:*"
TIMEOUT = 20.0
STALL = 0.9 * TIMEOUT
"""The attack: every reply correct, sent at 0.9 x the stage timeout."""


class QuorumPlain(PlainServer):
    """Plain sum whose stage can finish with `quorum` replies (the base default is everyone)."""

    def __init__(self, *, quorum: int, **kw) -> None:
        super().__init__(**kw)
        self._quorum = quorum

    def quorum(self) -> int:
        return min(self._quorum, len(self._expected))


class Staller:
    """An enrolled client that answers every request correctly, `delay` seconds after it arrives.
    Told to shut down, it sends at once every reply it still holds (an evicted client that keeps
    talking), then stops."""

    def __init__(self, endpoint: str, context: zmq.Context, client_id: int, *, delay: float) -> None:
        self.peer = RawPeer(endpoint, context)
        self.client_id, self.delay = client_id, delay
        self.kinds: list[str] = []
        self.flushed = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Staller:
        self.peer.hello(self.client_id)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.peer.close()

    def _run(self) -> None:
        pending: list[tuple[float, Message]] = []
        while not self._stop.is_set():
            wait = min([due for due, _ in pending], default=time.monotonic() + 0.05) - time.monotonic()
            msg = self.peer.recv(min(0.05, max(0.0, wait)))
            if msg is not None:
                self.kinds.append(msg.kind)
                if msg.kind == "plain_request":
                    client = PlainClient(client_id=self.client_id, round_id=msg.round,
                                         input_fn=lambda r=msg.round: synthetic_input(self.client_id, r, D))
                    pending.append((time.monotonic() + self.delay, client.handle(msg)))
                elif msg.kind == session.SHUTDOWN:
                    for _, reply in pending:
                        self.peer.send(reply)
                    self.flushed.set()
                    return
            now = time.monotonic()
            for item in [p for p in pending if p[0] <= now]:
                self.peer.send(item[1])
                pending.remove(item)


@pytest.fixture
def decoded(monkeypatch) -> list[tuple[int, str]]:
    """(sender, kind) of every message the server decodes."""
    seen: list[tuple[int, str]] = []
    real = server_module.decode

    def recording(frames, **kw):
        msg = real(frames, **kw)
        seen.append((msg.sender, msg.kind))
        return msg

    monkeypatch.setattr(server_module, "decode", recording)
    return seen


def pump_until(driver: ServerDriver, cond, timeout: float = 10.0) -> None:
    """Let the driver read its socket (registration pump) until `cond()` or the timeout."""
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        driver.wait_for_clients(count=1 << 20, timeout=0.1)


def test_a_staller_does_not_hold_rounds_and_is_evicted_after_k_of_them(plain_clients, raw_peer, decoded) -> None:
    ctx = zmq.Context()
    config = ServerConfig(stalls=StallPolicy(evict_after=3))
    try:
        with ServerDriver(TCP, config=config) as driver, \
                Staller(driver.endpoint, ctx, 4, delay=STALL) as staller:
            plain_clients(driver.endpoint, [1, 2, 3], D)
            assert driver.wait_for_clients(ids=[1, 2, 3, 4], timeout=20) == {1, 2, 3, 4}
            for r in (1, 2, 3):
                report = driver.run_round(QuorumPlain(round_id=r, clients=sorted(driver.clients), length=D,
                                                      quorum=3), stage_timeout=TIMEOUT)
                assert report.late == {4} and report.dropped == {"collect": frozenset({4})}
                assert report.result.contributors == {1, 2, 3}
                assert np.array_equal(report.result.ring_sum, synthetic_sum([1, 2, 3], r, D))
                assert report.stage_seconds["collect"] < STALL  # closed before the staller's reply was due
                assert report.evicted == (frozenset({4}) if r == 3 else frozenset())
            assert driver.clients == {1, 2, 3}
            assert set(driver.evicted) == {4} and "3 consecutive rounds (1, 2, 3)" in driver.evicted[4]

            # Honest clients are never late; the evicted one is no longer asked.
            report = driver.run_round(QuorumPlain(round_id=4, clients=sorted(driver.clients), length=D, quorum=2),
                                      stage_timeout=TIMEOUT)
            assert report.late == frozenset() and report.evicted == frozenset() and report.dropped == {}
            assert report.result.contributors == {1, 2, 3}

            # It was told to exit; what it still sends is dropped undecoded.
            assert staller.flushed.wait(10) and session.SHUTDOWN in staller.kinds
            before = len(decoded)
            pump_until(driver, lambda: driver.rejected_total["evicted"] >= 3)
            assert driver.rejected_total["evicted"] == 3
            assert (4, "plain_input") not in decoded[before:]

            # A new connection under its id is refused for the rest of the session.
            again = raw_peer(driver.endpoint, hello_as=4)
            pump_until(driver, lambda: driver.rejected_total["evicted"] >= 4)
            reason = again.expect(session.REJECT)["reason"].decode()
            assert reason.startswith("client 4 was evicted from this session")
            assert driver.clients == {1, 2, 3} and driver.rejected_total["evicted"] == 4
    finally:
        ctx.term()


def test_a_silent_client_is_evicted_after_k_consecutive_rounds_and_answering_resets_the_count(
        plain_clients, raw_peer) -> None:
    config = ServerConfig(stalls=StallPolicy(evict_after=2))
    with ServerDriver(TCP, config=config) as driver:
        plain_clients(driver.endpoint, [1, 2], D)
        quiet = raw_peer(driver.endpoint, hello_as=9)
        assert driver.wait_for_clients(ids=[1, 2, 9], timeout=20) == {1, 2, 9}
        quiet.expect(session.WELCOME)

        def answer_once() -> None:
            request = quiet.expect("plain_request")
            quiet.send(reply_to(request, "plain_input", vector=synthetic_input(9, request.round, D)))

        outcomes = []
        for r, answers in ((1, False), (2, True), (3, False), (4, False)):
            thread = threading.Thread(target=answer_once) if answers else None
            if thread is not None:
                thread.start()
            # the base quorum (everyone): no early close, the silent one waits out the timeout
            report = driver.run_round(PlainServer(round_id=r, clients=[1, 2, 9], length=D), stage_timeout=0.5)
            if thread is not None:
                thread.join(10)
            else:
                assert quiet.expect("plain_request").round == r  # it was asked, and kept quiet
            assert report.late == frozenset()  # silent, not late: the stage ran to its timeout
            outcomes.append((sorted(report.result.contributors), sorted(report.evicted)))
        assert outcomes == [([1, 2], []), ([1, 2, 9], []), ([1, 2], []), ([1, 2], [9])]
        assert driver.clients == {1, 2} and "(3, 4)" in driver.evicted[9]
        assert quiet.expect(session.SHUTDOWN).receiver == 9


def test_stalling_a_round_into_an_abort_still_counts_towards_eviction(plain_clients) -> None:
    ctx = zmq.Context()
    try:
        with ServerDriver(TCP, config=ServerConfig(stalls=StallPolicy(evict_after=1))) as driver, \
                Staller(driver.endpoint, ctx, 3, delay=STALL):
            plain_clients(driver.endpoint, [1, 2], D)
            assert driver.wait_for_clients(ids=[1, 2, 3], timeout=20) == {1, 2, 3}
            with pytest.raises(AbortError, match="2 clients left, 3 required"):
                driver.run_round(QuorumPlain(round_id=1, clients=[1, 2, 3], length=D, quorum=2, min_clients=3),
                                 stage_timeout=TIMEOUT)
            assert set(driver.evicted) == {3} and driver.clients == {1, 2}
    finally:
        ctx.term()


def test_a_disabled_policy_waits_for_the_slow_client_as_before(plain_clients) -> None:
    ctx = zmq.Context()
    config = ServerConfig(stalls=StallPolicy(enabled=False, evict_after=1))
    try:
        with ServerDriver(TCP, config=config) as driver, Staller(driver.endpoint, ctx, 3, delay=1.5):
            plain_clients(driver.endpoint, [1, 2], D)
            assert driver.wait_for_clients(ids=[1, 2, 3], timeout=20) == {1, 2, 3}
            report = driver.run_round(QuorumPlain(round_id=1, clients=[1, 2, 3], length=D, quorum=2),
                                      stage_timeout=TIMEOUT)
            assert report.result.contributors == {1, 2, 3} and report.late == frozenset()
            assert np.array_equal(report.result.ring_sum, synthetic_sum([1, 2, 3], 1, D))
            assert driver.evicted == {} and driver.clients == {1, 2, 3}
    finally:
        ctx.term()


def test_collect_closes_on_a_quorum_only_when_given_one(plain_clients, raw_peer) -> None:
    def on_ping(msg: Message) -> Message:
        return reply_to(msg, "pong")

    with ServerDriver(TCP) as driver:
        plain_clients(driver.endpoint, [1, 2, 3], D, handlers={"ping": on_ping})
        raw_peer(driver.endpoint, hello_as=4)  # registers, never answers
        assert driver.wait_for_clients(ids=[1, 2, 3, 4], timeout=20) == {1, 2, 3, 4}
        with pytest.raises(ValueError, match="quorum must be a non-negative int"):
            driver.collect("pong", round_id=1, timeout=1.0, quorum=-1)

        driver.broadcast("ping", {}, round_id=1)
        got = driver.collect("pong", round_id=1, timeout=TIMEOUT, quorum=3)
        assert set(got.replies) == {1, 2, 3} and got.missing == {4} and got.late == {4}

        driver.broadcast("ping", {}, round_id=2)
        got = driver.collect("pong", round_id=2, timeout=0.5)  # no quorum: the old rule, to the timeout
        assert set(got.replies) == {1, 2, 3} and got.missing == {4} and got.late == frozenset()
        assert driver.clients == {1, 2, 3, 4} and driver.evicted == {}  # collect evicts nobody


@pytest.mark.parametrize("kw, message", [
    ({"grace_factor": -1.0}, "grace_factor must be a finite number >= 0"),
    ({"grace_factor": float("nan")}, "grace_factor must be a finite number >= 0"),
    ({"min_grace_s": -0.1}, "min_grace_s must be a finite number of seconds >= 0"),
    ({"evict_after": 0}, "evict_after must be a positive int"),
])
def test_stall_policies_that_make_no_sense_are_refused(kw, message) -> None:
    with pytest.raises(ValueError, match=message):
        StallPolicy(**kw)


def test_the_grace_follows_the_quorums_speed_with_a_floor() -> None:
    policy = StallPolicy(grace_factor=3.0, min_grace_s=1.0)
    assert policy.grace(0.001) == 1.0 and policy.grace(2.0) == 6.0
