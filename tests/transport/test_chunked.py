"""Masked inputs in chunks over tcp://127.0.0.1: folded as they arrive, exact, within the queue guard's
budget for a stream, and a stream cut half way repaired by resends across real sockets."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from secagg.protocols import registry
from secagg.protocols.base import WrappedClient, reply_messages
from transport.cli import synthetic_input, synthetic_sum
from transport.server import ServerConfig
from transport.simulation import InprocFederation

D = 1 << 20
CHUNK = 1 << 16


class CutStream(WrappedClient):
    """Sends the first `keep` chunks of its input, then nothing more this round."""

    def __init__(self, inner, keep: int) -> None:
        super().__init__(inner)
        self.keep = keep

    def handle(self, msg):
        reply = self.inner.handle(msg)
        if msg.kind in ("masked_request", "plain_request"):
            return itertools.islice(reply_messages(reply), self.keep)
        return reply


@pytest.mark.parametrize("name", ["plain", "secagg+"])
@pytest.mark.parametrize("cut", [False, True])
def test_chunked_rounds_over_tcp_are_exact_and_no_connection_is_cut(name, cut):
    server_cls, client_cls = registry.server_class(name), registry.client_class(name)
    ids = [1, 2, 3, 4, 5]

    def factory(cid: int, round_id: int):
        client = client_cls(client_id=cid, round_id=round_id, input_fn=lambda: synthetic_input(cid, round_id, D))
        return CutStream(client, keep=5) if cut and cid == 3 else client

    with InprocFederation(client_ids=ids, factory=factory, endpoint="tcp://127.0.0.1:*",
                          server_config=ServerConfig()) as driver:
        protocol = server_cls(round_id=1, clients=ids, length=D, chunk=CHUNK)
        assert protocol.max_reply_bytes() < 4 * D  # no message may carry a whole input
        report = driver.run_round(protocol, stage_timeout=2.0 if cut else 60.0)  # the cut client stays silent
    kept = [c for c in ids if not (cut and c == 3)]
    assert report.result.contributors == frozenset(kept)
    ring = protocol.ring
    assert np.array_equal(report.result.ring_sum, synthetic_sum(kept, 1, D, ring=ring))
    assert "overflow" not in report.rejected and not report.evicted
    assert protocol.resent == (tuple(range(5)) if cut else ())
    assert all(report.bytes_received[c] >= 4 * D for c in kept)


def test_the_queue_guard_budgets_a_stream_by_its_window_and_returns_to_two_replies():
    from transport.server import QueueLimits, _Conn, _QueueGuard

    guard = _QueueGuard(port=0, limits=QueueLimits(), collect_limit=1 << 20, stream_window=18)
    guard._conns[7] = _Conn(fd=-1, ino=7, since=0.0, checked=0.0, registered=True)
    guard.sent(7)
    assert (guard._conns[7].owed, guard._conns[7].window) == (1, 2)
    guard.sent(7, replies=40)  # a chunked masked input: 40 messages owed, at most 18 of them queued
    assert (guard._conns[7].owed, guard._conns[7].window) == (41, 18)
    for _ in range(39):
        guard.answered(7)
    assert (guard._conns[7].owed, guard._conns[7].window) == (2, 2)
