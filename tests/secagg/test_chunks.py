"""Masked inputs in chunks: folded as they arrive, exact sums, broken streams repaired by resends."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from secagg.messages import AbortError, Message, ProtocolError
from secagg.prg import random_vector
from secagg.protocols.base import reply_messages
from secagg.protocols.chunks import MIN_CHUNK, ChunkFolder, ChunkPlan
from secagg.protocols.secagg import SecAggClient, SecAggPlusClient, SecAggPlusServer, SecAggServer
from secagg.ring import RING_2_32
from secagg.simulate import run_round


class Stream:
    """A client whose masked stream is cut after `keep` chunks, reordered, tampered with, or whose resend
    fails, as the test asks; everything else passes through."""

    def __init__(self, inner, *, keep=None, reverse=False, tamper=None, no_resend=False, record=None):
        self.inner, self.keep, self.reverse, self.tamper = inner, keep, reverse, tamper
        self.no_resend, self.record = no_resend, record

    @property
    def finished(self):
        return self.inner.finished

    def handle(self, msg):
        reply = self.inner.handle(msg)
        kind = {"plain_request": "masked_request", "plain_resend": "resend_request"}.get(msg.kind, msg.kind)
        if kind == "resend_request" and self.no_resend:
            return None
        if kind not in ("masked_request", "resend_request"):
            return reply
        parts = reply_messages(reply)
        if self.keep is not None and kind == "masked_request":
            parts = itertools.islice(parts, self.keep)
        parts = list(parts) if self.reverse or self.tamper or self.record is not None else parts
        if self.reverse:
            parts = parts[::-1]
        if self.tamper is not None:
            parts = self.tamper(parts)
        if self.record is not None:
            self.record.setdefault(kind, []).extend(parts)
        return parts


def round_with(n, d, chunk, wrap=None, *, server_class=SecAggPlusServer, client_class=SecAggPlusClient):
    ids = list(range(1, n + 1))
    inputs = {c: random_vector(RING_2_32, d) for c in ids}
    server = server_class(round_id=1, clients=ids, length=d, chunk=chunk)
    clients = {c: client_class(client_id=c, round_id=1, input_fn=lambda c=c: inputs[c]) for c in ids}
    for c, options in (wrap or {}).items():
        clients[c] = Stream(clients[c], **options)
    return server, clients, inputs


def total(inputs, ids):
    acc = np.zeros(next(iter(inputs.values())).shape[0], dtype=np.uint32)
    for c in ids:
        RING_2_32.add_(acc, inputs[c])
    return acc


@pytest.mark.parametrize("server_class,client_class", [(SecAggPlusServer, SecAggPlusClient), (SecAggServer, SecAggClient)])
@pytest.mark.parametrize("chunk,d", [(MIN_CHUNK, 3 * MIN_CHUNK + 5), (MIN_CHUNK + 3, 2 * MIN_CHUNK), (MIN_CHUNK, MIN_CHUNK)])
def test_chunked_sums_are_exact_and_nothing_is_resent(server_class, client_class, chunk, d):
    server, clients, inputs = round_with(6, d, chunk, server_class=server_class, client_class=client_class)
    sent: dict[int, int] = {}
    result = run_round(server, clients, bytes_sent=sent)
    assert result.contributors == frozenset(inputs)
    assert np.array_equal(result.ring_sum, total(inputs, inputs))
    assert server.resent == ()
    expected_chunks = 1 if chunk >= d else -(-d // chunk)
    assert server.replies_expected(1) == 1  # after the round: no chunked stage open
    assert all(b > 4 * d for b in sent.values())  # the whole input went, in however many messages
    assert server.chunks is None if chunk >= d else server.chunks.count == expected_chunks


def test_chunks_arrive_in_any_order_and_each_is_masked_with_its_window_of_the_keystream():
    record: dict[str, list[Message]] = {}
    server, clients, inputs = round_with(5, 3 * MIN_CHUNK, MIN_CHUNK, {2: {"reverse": True, "record": record}})
    result = run_round(server, clients)
    assert np.array_equal(result.ring_sum, total(inputs, inputs))
    assert [m["index"] for m in record["masked_request"]] == [2, 1, 0]
    assert all(m["vector"].shape == (MIN_CHUNK,) for m in record["masked_request"])
    assert not any(np.array_equal(m["vector"], inputs[2][m["index"] * MIN_CHUNK:][:MIN_CHUNK])
                   for m in record["masked_request"])  # masked, not the input


@settings(max_examples=20, deadline=None)
@given(st.integers(6, 9), st.integers(MIN_CHUNK, 4 * MIN_CHUNK), st.integers(MIN_CHUNK, 2 * MIN_CHUNK), st.data())
def test_a_broken_stream_is_repaired_from_the_complete_clients_resends(n, d, chunk, data):
    count = -(-d // chunk)
    broken = data.draw(st.dictionaries(st.integers(1, n), st.integers(0, max(count - 1, 0)), max_size=2))
    record: dict[int, dict[str, list[Message]]] = {c: {} for c in range(1, n + 1)}
    wrap = {c: {"keep": broken[c]} if c in broken else {"record": record[c]} for c in range(1, n + 1)}
    server, clients, inputs = round_with(n, d, chunk, wrap)
    result = run_round(server, clients)
    if chunk >= d:
        broken = {c: k for c, k in broken.items() if k < 1}  # one message: a cut stream is a silent client
    assert result.contributors == frozenset(inputs) - broken.keys()
    assert np.array_equal(result.ring_sum, total(inputs, result.contributors))
    assert set(broken) <= result.dropped.get("masked", frozenset())
    tainted = sorted(set(itertools.chain.from_iterable(range(k) for k in broken.values())))
    assert list(server.resent) == (tainted if chunk < d else [])
    for c in result.contributors:  # a resend repeats exactly what was sent: nothing new to the server
        first = {m["index"]: m["vector"] for m in record[c].get("masked_request", []) if m.kind == "masked_chunk"}
        for m in record[c].get("resend_request", []):
            assert np.array_equal(m["vector"], first[m["index"]])


@pytest.mark.parametrize("fault", ["short", "repeat", "out_of_range"])
def test_a_bad_chunk_drops_its_sender_and_its_chunks_are_rebuilt(fault):
    def tamper(parts):
        m = parts[1]
        if fault == "short":
            bad = Message(kind=m.kind, round=m.round, sender=m.sender, receiver=m.receiver,
                          fields={"index": m["index"], "vector": m["vector"][:-1]})
        elif fault == "repeat":
            bad = parts[0]
        else:
            bad = Message(kind=m.kind, round=m.round, sender=m.sender, receiver=m.receiver,
                          fields={"index": 99, "vector": m["vector"]})
        return [parts[0], bad, *parts[2:]]

    server, clients, inputs = round_with(6, 3 * MIN_CHUNK, MIN_CHUNK, {4: {"tamper": tamper}})
    rejected: dict[str, int] = {}
    result = run_round(server, clients, rejected=rejected)
    assert 4 not in result.contributors and "masked: " in result.faulty[4]
    assert np.array_equal(result.ring_sum, total(inputs, result.contributors))
    assert server.resent == (0,) and rejected["server"] >= 1


def test_a_complete_client_that_fails_its_resend_aborts_the_round():
    server, clients, _ = round_with(6, 3 * MIN_CHUNK, MIN_CHUNK, {2: {"keep": 1}, 5: {"no_resend": True}})
    with pytest.raises(AbortError, match="did not resend chunks"):
        run_round(server, clients)
    assert server.stage == "resend" and server.resent == (0,)


def test_the_resend_stage_never_closes_early_and_asks_every_survivor_for_every_tainted_chunk():
    server, clients, _ = round_with(6, 3 * MIN_CHUNK, MIN_CHUNK, {3: {"keep": 2}})
    requests = server.start()
    while server.stage != "masked":
        for c, r in requests.items():
            for part in reply_messages(clients[c].handle(r)):
                server.accept(part)
        requests = server.advance()
    assert server.replies_expected(1) == 3
    for c, r in requests.items():
        for part in reply_messages(clients[c].handle(r)):
            server.accept(part)
    requests = server.advance()
    assert server.stage == "resend" and server.quorum() == len(requests) == 5
    assert {r["chunks"] for r in requests.values()} == {(0, 1)} and server.replies_expected(1) == 2


def test_clients_refuse_tiny_chunks_and_resends_outside_their_input():
    server, clients, _ = round_with(5, 3 * MIN_CHUNK, MIN_CHUNK)
    requests = server.start()
    while server.stage != "masked":
        requests = _answer(server, clients, requests)
    c, req = next(iter(requests.items()))
    tiny = Message(kind=req.kind, round=req.round, sender=req.sender, receiver=req.receiver,
                   fields={**req.fields, "chunk": MIN_CHUNK - 1})
    with pytest.raises(ProtocolError, match="floor"):
        clients[c].handle(tiny)
    list(reply_messages(clients[c].handle(req)))
    for chunks in ((), (3,)):
        resend = Message(kind="resend_request", round=req.round, sender=req.sender, receiver=req.receiver,
                         fields={"chunks": chunks})
        with pytest.raises(ProtocolError, match="resend asks for chunks"):
            clients[c].handle(resend)
    for bad in (MIN_CHUNK - 1, "big", True, 2.5):
        with pytest.raises(ValueError, match="chunk must be 'auto', None or in"):
            SecAggPlusServer(round_id=1, clients=[1, 2, 3], length=10 * MIN_CHUNK, chunk=bad)


def test_inputs_stream_by_default_from_2_22_values_and_travel_whole_below():
    from secagg.protocols.chunks import AUTO_FROM, DEFAULT_CHUNK, plan_for
    from secagg.protocols.plain import PlainServer

    for cls in (SecAggPlusServer, SecAggServer, PlainServer):
        assert cls(round_id=1, clients=[1, 2, 3], length=AUTO_FROM - 1).chunks is None
        big = cls(round_id=1, clients=[1, 2, 3], length=AUTO_FROM)
        assert big.chunks == ChunkPlan(AUTO_FROM, DEFAULT_CHUNK) and big.max_reply_bytes() < 4 * AUTO_FROM // 8
        assert cls(round_id=1, clients=[1, 2, 3], length=AUTO_FROM, chunk=None).chunks is None
    assert plan_for(MIN_CHUNK, MIN_CHUNK, max_length=MIN_CHUNK) is None  # one chunk is one message


def _answer(server, clients, requests):
    for c, r in requests.items():
        for part in reply_messages(clients[c].handle(r)):
            server.accept(part)
    return server.advance()


def test_the_folder_validates_before_folding_and_names_what_a_broken_stream_tainted():
    plan = ChunkPlan(10, 4)
    assert plan.count == 3 and plan.bounds(2) == (8, 10)
    folder = ChunkFolder(plan, RING_2_32)
    acc = np.zeros(10, dtype=np.uint32)
    assert not folder.fold(acc, 1, 0, np.ones(4, np.uint32))
    for bad_index, values in ((0, np.ones(4, np.uint32)), (1, np.ones(3, np.uint32)), (3, np.ones(4, np.uint32))):
        before = acc.copy()
        with pytest.raises(ProtocolError):
            folder.fold(acc, 1, bad_index, values)
        assert np.array_equal(acc, before)
    folder.fold(acc, 1, 2, np.ones(2, np.uint32))
    assert folder.fold(acc, 1, 1, np.ones(4, np.uint32))
    folder.fold(acc, 2, 1, np.full(4, 2, np.uint32))
    assert folder.tainted({1}) == [1]
    folder.clear(acc, [1])
    assert acc.tolist() == [1] * 4 + [0] * 4 + [1] * 2
    repair = ChunkFolder(plan, RING_2_32, wanted=[1])
    with pytest.raises(ProtocolError, match="not asked for"):
        repair.fold(acc, 1, 0, np.ones(4, np.uint32))
    assert repair.fold(acc, 1, 1, np.ones(4, np.uint32)) and repair.need == 1


@pytest.mark.parametrize("keep", [None, 0, 2])
def test_the_plain_baseline_streams_the_same_way(keep):
    from secagg.protocols.plain import PlainClient, PlainServer

    wrap = {} if keep is None else {3: {"keep": keep}}
    server, clients, inputs = round_with(5, 3 * MIN_CHUNK + 1, MIN_CHUNK, wrap, server_class=PlainServer,
                                         client_class=PlainClient)
    result = run_round(server, clients)
    kept = frozenset(inputs) - ({3} if keep is not None else set())
    assert result.contributors == kept and np.array_equal(result.ring_sum, total(inputs, kept))
    assert server.resent == ((0, 1) if keep == 2 else ())
    assert all(clients[c].finished for c in kept)


def test_max_streams_paces_only_a_chunked_upload_stage_and_only_below_n():
    """`max_streams`: the masked (SecAgg+) or collect (plain) stage of a chunked round asks that many clients at
    a time; other stages, whole uploads and a window of N or more are not paced."""
    from secagg.protocols.chunks import stream_window
    from secagg.protocols.plain import PlainServer

    assert stream_window(3, streaming=True, expected=10) == 3
    assert stream_window(10, streaming=True, expected=10) is None
    assert stream_window(None, streaming=True, expected=10) is None
    assert stream_window(3, streaming=False, expected=10) is None
    plain = PlainServer(round_id=1, clients=range(1, 11), length=4 * MIN_CHUNK, chunk=MIN_CHUNK, max_streams=3)
    plain.start()
    assert plain.stage == "collect" and plain.send_window() == 3
    whole = PlainServer(round_id=1, clients=range(1, 11), length=4 * MIN_CHUNK, chunk=None, max_streams=3)
    whole.start()
    assert whole.send_window() is None
    ids = list(range(1, 8))
    server = SecAggPlusServer(round_id=1, clients=ids, length=4 * MIN_CHUNK, chunk=MIN_CHUNK, max_streams=2)
    clients = {c: SecAggPlusClient(client_id=c, round_id=1, input_fn=lambda: np.zeros(4 * MIN_CHUNK, np.uint32))
               for c in ids}
    windows: dict[str, int | None] = {}
    requests = server.start()
    while requests:
        windows[server.stage] = server.send_window()
        for cid, req in requests.items():
            for part in reply_messages(clients[cid].handle(req)):
                server.accept(part)
        requests = server.advance()
    assert windows == {"advertise": None, "share": None, "check": None, "masked": 2, "consistency": None, "unmask": None}


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_max_streams_is_a_positive_integer(bad):
    with pytest.raises(ValueError, match="max_streams"):
        SecAggPlusServer(round_id=1, clients=range(1, 8), length=4 * MIN_CHUNK, chunk=MIN_CHUNK, max_streams=bad)
