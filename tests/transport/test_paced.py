"""Paced stages over real sockets: a protocol whose messages are large (LightSecAgg's share replies,
relays and masked inputs) has at most `send_window()` requests unanswered at once, and the round is
still exact when a client crashes inside a paced stage."""
from __future__ import annotations

import numpy as np
import pytest

from secagg.protocols import lightsecagg
from secagg.protocols.lightsecagg import LightSecAggClient, LightSecAggServer
from secagg.protocols.chunks import MIN_CHUNK
from secagg.protocols.plain import PlainClient, PlainServer
from secagg.protocols.secagg import SecAggPlusClient, SecAggPlusServer
from transport.cli import synthetic_input, synthetic_sum
from transport.server import ServerDriver
from transport.simulation import InprocFederation

D = 4096
PACED = ("share", "check", "masked_input")


class Crash(Exception):
    """A client dying when it is asked for its masked input."""


class Logged(LightSecAggServer):
    """Records every accepted reply, by stage, next to the driver's sends (`log`)."""

    log: list[tuple[str, str, int]] = []

    def accept(self, msg):
        stage = f"{self.stage}:{self._part}"  # the share and check stages may run in parts
        super().accept(msg)
        self.log.append(("replied", stage, msg.sender))


def most_unanswered(log, stage: str) -> int:
    sent, replied, most = set(), set(), 0
    for what, st, cid in log:
        if st != stage:
            continue
        (sent if what == "sent" else replied).add(cid)
        most = max(most, len(sent - replied))
    return most


def log_sends(monkeypatch, log: list, stage_of) -> None:
    """Record every request the driver sends, as ("sent", stage_of(protocol), client), in `log`."""
    send = ServerDriver._send_requests

    def logged_send(self, requests, sent, protocol=None, *, ids=None):
        ids = list(requests if ids is None else ids)
        log.extend(("sent", stage_of(protocol), cid) for cid in ids)
        return send(self, requests, sent, protocol, ids=ids)

    monkeypatch.setattr(ServerDriver, "_send_requests", logged_send)


def crashing_factory(client_cls, length: int, crashing: int | None):
    """Clients of `client_cls` with synthetic inputs; `crashing` dies when asked for its input."""
    def factory(cid: int, round_id: int):
        def input_fn():
            if cid == crashing:
                raise Crash(cid)
            return synthetic_input(cid, round_id, length)
        return client_cls(client_id=cid, round_id=round_id, input_fn=input_fn)
    return factory


@pytest.mark.parametrize("parts", [False, True])
@pytest.mark.parametrize("crash", [False, True])
def test_a_paced_lightsecagg_round_keeps_its_window_and_is_exact(monkeypatch, tmp_path, crash, parts):
    monkeypatch.setattr(lightsecagg, "WINDOW_BYTES", 1)  # every message larger than the window: the floors
    log: list[tuple[str, str, int]] = []
    monkeypatch.setattr(Logged, "log", log)
    log_sends(monkeypatch, log, lambda protocol: f"{protocol.stage}:{protocol._part}")
    ids, crashing = [1, 2, 3, 4, 5, 6, 7], 3
    factory = crashing_factory(LightSecAggClient, D, crashing if crash else None)
    fed = InprocFederation(client_ids=ids, factory=factory, endpoint=f"ipc://{tmp_path}/lsa.sock")
    with fed as driver:
        protocol = Logged(round_id=1, clients=ids, length=D, target_survivors=5, privacy=2)
        if parts:  # share and check in parts of two pieces a message: three stage rounds each
            protocol.part_size = 2
        report = driver.run_round(protocol, stage_timeout=30.0)
    kept = [c for c in ids if not (crash and c == crashing)]
    assert report.result.contributors == frozenset(kept)
    assert np.array_equal(report.result.ring_sum, synthetic_sum(kept, 1, D, ring=lightsecagg.FIELD_P31))
    rounds = sorted({st for _, st, _ in log})
    for stage in PACED:
        mine = [st for st in rounds if st.startswith(stage + ":")]
        assert len(mine) == (4 if parts and stage != "masked_input" else 1), mine  # 7 clients in parts of 2
        for st in mine:
            assert sum(1 for what, s, _ in log if what == "sent" and s == st) == len(ids)  # every request sent
            floor = 1 if stage == "masked_input" else 2  # every message larger than the window
            assert most_unanswered(log, st) <= floor + (crash and stage == "masked_input"), st
    assert most_unanswered(log, "advertise:0") == len(ids)  # small messages: all at once


class LoggedReplies:
    """Records each client whose whole (chunked) reply is in, by stage, next to the driver's sends."""

    log: list[tuple[str, str, int]] = []

    def accept(self, msg):
        stage = self.stage
        super().accept(msg)
        if self.replied(msg.sender):
            self.log.append(("replied", stage, msg.sender))


class LoggedPlus(LoggedReplies, SecAggPlusServer):
    pass


class LoggedPlain(LoggedReplies, PlainServer):
    pass


@pytest.mark.parametrize("crash", [False, True])
@pytest.mark.parametrize("protocol", ["secagg+", "plain"])
def test_chunked_uploads_paced_by_max_streams_keep_their_window_and_are_exact(monkeypatch, tmp_path, crash, protocol):
    """`max_streams=2`: the upload stage asks two clients at a time for their chunks (and the next as one
    finishes, or dies), so at most two streams are owed at once, whatever N; the sum stays exact."""
    server_cls, client_cls, stage = {"secagg+": (LoggedPlus, SecAggPlusClient, "masked"),
                                     "plain": (LoggedPlain, PlainClient, "collect")}[protocol]
    log: list[tuple[str, str, int]] = []
    monkeypatch.setattr(server_cls, "log", log)
    log_sends(monkeypatch, log, lambda protocol: protocol.stage)
    ids, crashing = [1, 2, 3, 4, 5, 6, 7], 3
    factory = crashing_factory(client_cls, 4 * MIN_CHUNK, crashing if crash else None)
    fed = InprocFederation(client_ids=ids, factory=factory, endpoint=f"ipc://{tmp_path}/{protocol}.sock")
    with fed as driver:
        server = server_cls(round_id=1, clients=ids, length=4 * MIN_CHUNK, chunk=MIN_CHUNK, max_streams=2)
        report = driver.run_round(server, stage_timeout=30.0)
    kept = [c for c in ids if not (crash and c == crashing)]
    assert report.result.contributors == frozenset(kept)
    assert np.array_equal(report.result.ring_sum, synthetic_sum(kept, 1, 4 * MIN_CHUNK))
    assert sum(1 for what, st, _ in log if what == "sent" and st == stage) == len(ids)  # every request sent
    assert most_unanswered(log, stage) == 2 + crash  # paced: two streams (a dead one holds its place a moment)


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_a_server_can_hand_large_freed_buffers_back_to_the_os():
    """glibc serves a freed 12 MB buffer's successors from its heap once a larger one was freed, and a live
    buffer at the heap's top keeps them all resident (241 MiB here without the call, measured 2026-11-30);
    `release_large_buffers` maps each one and unmaps it when freed. In a child, so this process keeps
    glibc's default."""
    import subprocess
    import sys

    code = (
        "import sys, numpy as np\n"
        "from transport.server import release_large_buffers\n"
        "on = release_large_buffers() if sys.argv[1] == 'on' else False\n"
        "def rss():\n"
        "    return int([l for l in open('/proc/self/status') if l.startswith('VmRSS')][0].split()[1]) // 1024\n"
        "first = np.ones(4_000_000, np.uint32); del first\n"
        "base = rss()\n"
        "held = [np.ones(3_000_000, np.uint32) for _ in range(20)]\n"
        "pin = np.ones(3_000_000, np.uint32)\n"
        "del held\n"
        "print(on, rss() - base)\n"
    )
    runs = {mode: subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, timeout=120,
                                 check=True).stdout.split() for mode in ("off", "on")}
    assert runs["on"][0] == "True"
    assert int(runs["on"][1]) < 60 < int(runs["off"][1])  # of 240 MB freed: returned, against kept
