"""All parties in one process over inproc:// (and ipc://): same drivers, exact results."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from secagg.messages import Message
from secagg.protocols import registry
from secagg.protocols.plain import PlainClient, PlainServer
from transport.cli import synthetic_input, synthetic_sum
from transport.session import reply_to
from transport.simulation import InprocFederation

D = 257


def plain_factory(cid: int, round_id: int) -> PlainClient:
    return PlainClient(client_id=cid, round_id=round_id, input_fn=lambda: synthetic_input(cid, round_id, D))


def test_inproc_rounds_give_the_exact_sum() -> None:
    fed = InprocFederation(client_ids=range(1, 41), factory=plain_factory)
    with fed as driver:
        assert driver.endpoint.startswith("inproc://") and driver.clients == frozenset(range(1, 41))
        for r in (1, 2, 3):
            report = driver.run_round(PlainServer(round_id=r, clients=sorted(driver.clients), length=D),
                                      stage_timeout=30)
            assert report.result.contributors == frozenset(range(1, 41))
            assert np.array_equal(report.result.ring_sum, synthetic_sum(range(1, 41), r, D))
            assert report.rejected == {} and sum(report.bytes_received.values()) > 40 * 4 * D
    assert not fed.errors
    assert {s.exit_reason for s in fed.summaries.values()} == {"shutdown"}
    assert all(s.rounds == (1, 2, 3) for s in fed.summaries.values())


def test_a_client_sitting_out_a_round_is_dropped_from_it() -> None:
    def factory(cid: int, round_id: int):
        return None if (cid, round_id) == (2, 2) else plain_factory(cid, round_id)

    with InprocFederation(client_ids=[1, 2, 3], factory=factory) as driver:
        first = driver.run_round(PlainServer(round_id=1, clients=[1, 2, 3], length=D), stage_timeout=10)
        second = driver.run_round(PlainServer(round_id=2, clients=[1, 2, 3], length=D), stage_timeout=0.4)
    assert first.result.contributors == {1, 2, 3}
    assert second.result.contributors == {1, 3} and second.dropped == {"collect": frozenset({2})}
    assert np.array_equal(second.result.ring_sum, synthetic_sum([1, 3], 2, D))


def test_broadcast_collect_in_simulation_and_over_ipc(tmp_path) -> None:
    def handlers(cid: int):
        def on_model(msg: Message) -> Message:
            return reply_to(msg, "ack", digest=hashlib.sha256(msg["w"].tobytes()).digest(), client=cid)
        return {"model": on_model}

    for endpoint in (None, f"ipc://{tmp_path}/sa.sock"):
        fed = InprocFederation(client_ids=[1, 2, 3], factory=plain_factory, handlers=handlers, endpoint=endpoint)
        with fed as driver:
            w = np.arange(1000, dtype=np.float64)
            driver.broadcast("model", {"w": w}, round_id=1, to=[1, 3])
            got = driver.collect("ack", round_id=1, timeout=10, expect=[1, 3])
            report = driver.run_round(PlainServer(round_id=1, clients=[1, 2, 3], length=D), stage_timeout=10)
        assert {cid: m["client"] for cid, m in got.replies.items()} == {1: 1, 3: 3} and not got.missing
        assert all(m["digest"] == hashlib.sha256(w.tobytes()).digest() for m in got.replies.values())
        assert np.array_equal(report.result.ring_sum, synthetic_sum([1, 2, 3], 1, D))
        assert not fed.errors


class Crash(Exception):
    """A client dying in the masked-input stage."""


PROTOCOLS = ["lightsecagg", "plain", "secagg", "secagg+"]


def test_the_registry_names_exactly_the_protocols_run_below() -> None:
    """The parametrisation below cannot shrink silently: every protocol is registered and importable."""
    assert registry.names() == PROTOCOLS
    for name in PROTOCOLS:
        assert registry.server_class(name).name == name and registry.client_class(name).name == name


@pytest.mark.parametrize("name", PROTOCOLS)
def test_every_registered_protocol_runs_unchanged_over_the_transport(name: str, tmp_path) -> None:
    server_cls, client_cls = registry.server_class(name), registry.client_class(name)
    ids, crashing = [1, 2, 3, 4, 5, 6], 4

    def factory(cid: int, round_id: int):
        def input_fn():
            if cid == crashing and round_id == 2:
                raise Crash(cid)
            return synthetic_input(cid, round_id, D)
        return client_cls(client_id=cid, round_id=round_id, input_fn=input_fn)

    # ipc:// rather than inproc:// so that the crash closes a connection the server notices at once
    fed = InprocFederation(client_ids=ids, factory=factory, endpoint=f"ipc://{tmp_path}/sa.sock")
    with fed as driver:
        reports = [driver.run_round(server_cls(round_id=r, clients=ids, length=D), stage_timeout=30.0)
                   for r in (1, 2)]
    ring = server_cls(round_id=0, clients=ids, length=D).ring
    assert reports[0].result.contributors == frozenset(ids)
    assert np.array_equal(reports[0].result.ring_sum, synthetic_sum(ids, 1, D, ring=ring))
    survivors = [c for c in ids if c != crashing]
    assert reports[1].result.contributors == frozenset(survivors)
    assert crashing in set().union(*reports[1].dropped.values())
    assert np.array_equal(reports[1].result.ring_sum, synthetic_sum(survivors, 2, D, ring=ring))
    assert set(fed.errors) == {crashing} and isinstance(fed.errors[crashing], Crash)
