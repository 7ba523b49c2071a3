"""Fixtures for transport tests: honest plain clients in threads and raw (hostile) DEALER peers."""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping

import pytest
import zmq

from secagg.protocols.plain import PlainClient
from transport.cli import synthetic_input
from transport.client import ClientConfig, ClientSummary, run_client
from transport.adversary import RawPeer


@pytest.fixture
def raw_peer() -> Callable[..., RawPeer]:
    ctx = zmq.Context()
    peers: list[RawPeer] = []

    def make(endpoint: str, *, hello_as: int | None = None) -> RawPeer:
        peer = RawPeer(endpoint, ctx)
        if hello_as is not None:
            peer.hello(hello_as)
        peers.append(peer)
        return peer

    yield make
    for p in peers:
        p.close()
    ctx.term()


@pytest.fixture
def plain_clients() -> Callable[..., dict[int, ClientSummary]]:
    """start(endpoint, ids, length, ...) runs honest PlainClients in threads; joined at teardown."""
    stop = threading.Event()
    threads: list[threading.Thread] = []
    summaries: dict[int, ClientSummary] = {}
    errors: dict[int, BaseException] = {}

    def start(endpoint: str, ids: Iterable[int], length: int, *, context: zmq.Context | None = None,
              handlers: Mapping | None = None, config: ClientConfig = ClientConfig(idle_timeout=60.0),
              **kw) -> dict[int, ClientSummary]:
        for cid in ids:
            def body(cid: int = cid) -> None:
                def factory(r: int) -> PlainClient:
                    return PlainClient(client_id=cid, round_id=r, input_fn=lambda: synthetic_input(cid, r, length))
                try:
                    summaries[cid] = run_client(endpoint=endpoint, client_id=cid, factory=factory,
                                                handlers=handlers, context=context, config=config,
                                                stop=stop, **kw)
                except BaseException as exc:  # surfaced to the test through `errors`
                    errors[cid] = exc
            t = threading.Thread(target=body, daemon=True)
            t.start()
            threads.append(t)
        return summaries

    start.errors = errors  # type: ignore[attr-defined]
    start.join = lambda timeout=10.0: [t.join(timeout) for t in threads]  # type: ignore[attr-defined]
    yield start
    stop.set()
    for t in threads:
        t.join(10.0)
    assert not any(t.is_alive() for t in threads), "a client thread did not stop"
