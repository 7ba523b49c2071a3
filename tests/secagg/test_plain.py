"""The insecure plain sum: the baseline, the reference for the secure protocols, and the registry."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from secagg.messages import SERVER, AbortError, Message, ProtocolError
from secagg.prg import random_vector
from secagg.protocols import registry
from secagg.protocols.plain import PlainClient, PlainServer
from secagg.ring import FIELD_P31, RING_2_32, Ring
from secagg.simulate import run_round

FAST = settings(max_examples=30, deadline=None)


def make(n, d, *, ring=RING_2_32, round_id=1, **server_kwargs):
    inputs = {c: random_vector(ring, d) for c in range(1, n + 1)}
    server = PlainServer(round_id=round_id, clients=list(inputs), length=d, ring=ring, **server_kwargs)
    clients = {c: PlainClient(client_id=c, round_id=round_id, input_fn=lambda c=c: inputs[c]) for c in inputs}
    return server, clients, inputs


def ring_sum(ring, vectors, length):
    acc = np.zeros(length, dtype=np.uint32)
    for v in vectors:
        ring.add_(acc, v)
    return acc


@FAST
@given(st.integers(1, 30), st.integers(1, 300), st.sampled_from([RING_2_32, FIELD_P31, Ring(65521)]), st.data())
def test_plain_sum_is_the_exact_ring_sum_over_contributors(n, d, ring, data):
    server, clients, inputs = make(n, d, ring=ring)
    drop = set(data.draw(st.lists(st.sampled_from(list(inputs)), max_size=n - 1, unique=True)))
    res = run_round(server, clients, drop_at={"collect": drop})
    assert res.contributors == frozenset(inputs) - drop
    assert np.array_equal(res.ring_sum, ring_sum(ring, [inputs[c] for c in res.contributors], d))
    assert res.dropped == ({"collect": frozenset(drop)} if drop else {})


def test_plain_and_secure_protocols_agree_exactly():
    d, ids = 257, list(range(1, 9))
    inputs = {c: random_vector(RING_2_32, d) for c in ids}
    sums = {}
    for name in ("plain", "secagg", "secagg+"):
        server = registry.server_class(name)(round_id=4, clients=ids, length=d)
        clients = {c: registry.client_class(name)(client_id=c, round_id=4, input_fn=lambda c=c: inputs[c]) for c in ids}
        res = run_round(server, clients, drop_at={"unmask": {3}} if name != "plain" else None)
        assert res.contributors == frozenset(ids)
        sums[name] = res.ring_sum
    assert np.array_equal(sums["plain"], sums["secagg"])
    assert np.array_equal(sums["plain"], sums["secagg+"])


def test_the_plain_server_sees_every_input_by_design():
    server, clients, inputs = make(3, 16)
    reqs = server.start()
    for c, r in reqs.items():
        reply = clients[c].handle(r)
        assert np.array_equal(reply["vector"], inputs[c])
        server.accept(reply)


def test_too_few_contributors_abort_with_counts():
    server, clients, _ = make(5, 4, min_clients=4)
    with pytest.raises(AbortError, match="round aborted at stage 'collect': 3 clients left, 4 required") as e:
        run_round(server, clients, drop_at={"collect": {1, 2}})
    assert (e.value.stage, e.value.survivors, e.value.required) == ("collect", 3, 4)


@pytest.mark.parametrize(
    "ring, vector, message",
    [
        (RING_2_32, np.zeros(8, dtype=np.int64), "field 'vector' must be a 1-D uint32 array"),
        (RING_2_32, np.zeros(8, dtype=np.float32), "field 'vector' must be a 1-D uint32 array"),
        (RING_2_32, np.zeros(7, dtype=np.uint32), "ring vector has length 7, expected 8"),
        (RING_2_32, np.zeros(9, dtype=np.uint32), "ring vector has length 9, expected 8"),
        (RING_2_32, np.zeros((2, 4), dtype=np.uint32), "field 'vector' must be a 1-D uint32 array"),
        (RING_2_32, list(range(8)), "field 'vector' must be a 1-D uint32 array"),
        (FIELD_P31, np.full(8, 2**31 - 1, dtype=np.uint32), r"entries outside \[0, p\)"),   # not a field element
    ],
)
def test_a_malformed_vector_drops_its_sender_at_once_and_the_round_finishes(ring, vector, message):
    server, clients, inputs = make(3, 8, ring=ring)
    reqs = server.start()
    bad = Message("plain_input", 1, 1, SERVER, {"vector": vector})
    with pytest.raises(ProtocolError, match=message):
        server.accept(bad)
    assert server.waiting_for() == frozenset({2, 3})  # no need to wait for client 1's deadline
    with pytest.raises(ProtocolError, match="not expected"):
        server.accept(clients[1].handle(reqs[1]))  # a second try is too late: it was dropped
    for c in (2, 3):
        server.accept(clients[c].handle(reqs[c]))
    server.advance()
    result = server.result()
    assert result.contributors == {2, 3} and result.dropped == {"collect": frozenset({1})}
    assert result.faulty.keys() == {1} and result.faulty[1].startswith("collect: ")
    assert np.array_equal(result.ring_sum, ring_sum(ring, [inputs[2], inputs[3]], 8))


def test_envelope_errors_replays_and_late_replies_are_discarded_without_dropping_anyone():
    server, clients, inputs = make(3, 8)
    reqs = server.start()
    good = clients[1].handle(reqs[1])
    variants = [
        (Message(good.kind, 2, 1, SERVER, good.fields), "message for round 2"),        # late or replayed
        (Message(good.kind, 1, 1, 2, good.fields), "message addressed to 2, not 0"),   # not to the server
        (Message(good.kind, 1, 9, SERVER, good.fields), "client 9 is not expected"),   # not a participant
        (Message("masked_input", 1, 1, SERVER, good.fields), "unexpected 'masked_input' message"),
        ("not a message", "not a Message"),
    ]
    for bad, message in variants:
        with pytest.raises(ProtocolError, match=message):
            server.accept(bad)
        assert server.waiting_for() == frozenset({1, 2, 3})
    server.accept(good)
    with pytest.raises(ProtocolError, match="duplicate"):
        server.accept(good)
    assert server.waiting_for() == frozenset({2, 3})
    # schema errors are the sender's own: the first drops client 2, so the second finds it gone
    for fields, message in (({}, r"'plain_input' fields wrong: missing \['vector'\]"),
                            ({**good.fields, "x": 1}, "client 2 is not expected in stage 'collect'")):
        with pytest.raises(ProtocolError, match=message):
            server.accept(Message(good.kind, 1, 2, SERVER, fields))
    server.advance()  # client 3 is late
    late = clients[3].handle(reqs[3])
    with pytest.raises(ProtocolError, match="round already finished"):
        server.accept(late)
    result = server.result()
    assert result.contributors == frozenset({1}) and result.faulty.keys() == {2}
    assert result.dropped == {"collect": frozenset({2, 3})}
    assert np.array_equal(result.ring_sum, ring_sum(RING_2_32, [inputs[1]], 8))


def test_result_before_the_end_is_an_error():
    server, _, _ = make(2, 4)
    with pytest.raises(RuntimeError, match="round not finished"):
        server.result()


def test_client_refuses_bad_requests():
    c = PlainClient(client_id=1, round_id=1, input_fn=lambda: np.zeros(4, np.uint32), max_length=4)
    modulus = r"field 'modulus' must be an int in \[3, 4294967296\]"
    for bad, message in (
        (Message("plain_request", 1, SERVER, 1, {"length": 5, "modulus": 2**32, "chunk": 0}), "exceeds this client's limit"),
        (Message("plain_request", 2, SERVER, 1, {"length": 4, "modulus": 2**32, "chunk": 0}), "message for round 2"),
        (Message("plain_request", 1, 2, 1, {"length": 4, "modulus": 2**32, "chunk": 0}), "message from 2, expected 0"),
        (Message("plain_request", 1, SERVER, 3, {"length": 4, "modulus": 2**32, "chunk": 0}), "message addressed to 3, not 1"),
        (Message("plain_request", 1, SERVER, 1, {"length": 0, "modulus": 2**32, "chunk": 0}), "field 'length' must be an int"),
        (Message("plain_request", 1, SERVER, 1, {"length": 4, "modulus": 2, "chunk": 0}), modulus),
        (Message("plain_request", 1, SERVER, 1, {"length": 4, "modulus": 2**32 + 1, "chunk": 0}), modulus),
        (Message("plain_input", 1, SERVER, 1, {"length": 4, "modulus": 2**32, "chunk": 0}), "did not expect 'plain_input' now"),
    ):
        with pytest.raises(ProtocolError, match=message):
            c.handle(bad)
    good = Message("plain_request", 1, SERVER, 1, {"length": 4, "modulus": 2**32, "chunk": 0})
    assert c.handle(good)["vector"].shape == (4,)
    assert c.finished
    with pytest.raises(ProtocolError, match="client 1 did not expect 'plain_request' now"):
        c.handle(good)  # replay after the end


def test_client_refuses_an_unsupported_modulus_as_a_protocol_error():
    c = PlainClient(client_id=1, round_id=1, input_fn=lambda: np.zeros(4, np.uint32))
    with pytest.raises(ProtocolError, match=r"modulus must be 2\^32 or a prime below 2\^31"):
        c.handle(Message("plain_request", 1, SERVER, 1, {"length": 4, "modulus": 2**31, "chunk": 0}))


def test_registry_resolves_every_name_and_refuses_unknown_ones():
    assert {"plain", "secagg", "secagg+"} <= set(registry.names())
    assert registry.server_class("plain") is PlainServer
    assert registry.client_class("plain") is PlainClient
    assert registry.server_class("secagg+").name == "secagg+"
    with pytest.raises(ValueError, match="unknown protocol"):
        registry.server_class("secagg++")
