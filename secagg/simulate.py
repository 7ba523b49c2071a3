"""In-memory driver: runs one round with every party in this process, no sockets.

The fastest runtime for research sweeps and protocol tests. Dropouts are scripted: a client listed
for a stage stops answering from that stage on (it never sends that stage's reply). As in the
network drivers, a request a client refuses, or a reply the server refuses (ProtocolError), is
dropped and counted in `rejected`: the client stays silent or is dropped as faulty, and the round
goes on with the others.
"""
from __future__ import annotations

import time
from collections.abc import Mapping

from secagg.messages import Message, ProtocolError
from secagg.protocols.base import ClientProtocol, RoundResult, ServerProtocol, reply_messages


def run_round(
    server: ServerProtocol,
    clients: Mapping[int, ClientProtocol],
    *,
    drop_at: Mapping[str, set[int]] | None = None,
    stage_times: dict[str, float] | None = None,
    bytes_sent: dict[int, int] | None = None,
    rejected: dict[str, int] | None = None,
) -> RoundResult:
    """Drive one round to completion. Raises AbortError if the protocol cannot finish.

    `stage_times` collects seconds per stage; `bytes_sent` the payload bytes each client sent;
    `rejected` counts refused messages ('client': requests a client refused, 'server': replies).
    """
    drop_at = drop_at or {}
    gone: set[int] = set()
    requests = server.start()
    while requests:
        stage = server.stage
        t0 = time.perf_counter()
        gone |= drop_at.get(stage, set())
        for cid, req in requests.items():
            if cid in gone:
                continue
            try:
                reply = clients[cid].handle(req)
            except ProtocolError:
                _count(rejected, "client")
                continue
            for part in reply_messages(reply):  # a chunked reply: each chunk is made as it is sent
                if bytes_sent is not None:
                    bytes_sent[cid] = bytes_sent.get(cid, 0) + part.nbytes()
                try:
                    server.accept(part)
                except ProtocolError:
                    _count(rejected, "server")
        requests = server.advance()
        if stage_times is not None:
            stage_times[stage] = stage_times.get(stage, 0.0) + time.perf_counter() - t0
    return server.result()


def _count(counter: dict[str, int] | None, key: str) -> None:
    if counter is not None:
        counter[key] = counter.get(key, 0) + 1
