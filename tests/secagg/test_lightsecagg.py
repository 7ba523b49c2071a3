"""LightSecAgg: exact sums, dropouts at every stage, message validation, sealed relay."""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from secagg.crypto import DecryptionError, KeyPair, agree, open_sealed, seal
from secagg.messages import SERVER, AbortError, Message, ProtocolError
from secagg.prg import random_vector
from secagg.protocols import registry
from secagg.protocols.lightsecagg import (
    LightSecAggClient,
    LightSecAggServer,
    _piece_aad,
    _piece_key_info,
)
from secagg.protocols.plain import PlainClient, PlainServer
from secagg.ring import FIELD_P31, RING_2_32
from secagg.simulate import run_round

ROUND = 11
STAGES = ("advertise", "share", "check", "masked_input", "recovery")


def make_round(n: int, d: int, *, target=None, privacy=None, round_id: int = ROUND, ids=None):
    ids = list(ids or range(1, n + 1))
    inputs = {c: random_vector(FIELD_P31, d) for c in ids}
    kw = {k: v for k, v in (("target_survivors", target), ("privacy", privacy)) if v is not None}
    server = LightSecAggServer(round_id=round_id, clients=ids, length=d, **kw)
    clients = {c: LightSecAggClient(client_id=c, round_id=round_id, input_fn=lambda c=c: inputs[c]) for c in ids}
    return server, clients, inputs


def field_sum(vectors) -> np.ndarray:
    vectors = list(vectors)
    acc = np.zeros_like(vectors[0])
    for v in vectors:
        FIELD_P31.add_(acc, v)
    return acc


def deliver(server, clients, requests, *, skip=()):
    """Run one stage by hand: every request answered and accepted; returns the replies."""
    replies = {}
    for c, req in requests.items():
        if c in skip:
            continue
        replies[c] = clients[c].handle(req)
        server.accept(replies[c])
    return replies


def advance_to(stage: str, server, clients):
    """Run the round by hand up to (not including) the replies of `stage`; returns its requests."""
    requests = server.start()
    while server.stage != stage:
        deliver(server, clients, requests)
        requests = server.advance()
    return requests


def finish(server, clients, requests):
    while requests:
        deliver(server, clients, requests)
        requests = server.advance()
    return server.result()


# ---- correctness ---------------------------------------------------------------------------

rounds = st.integers(3, 12).flatmap(
    lambda n: st.integers(2, n).flatmap(
        lambda u: st.tuples(st.just(n), st.just(u), st.integers(1, u - 1), st.integers(1, 300))
    )
)


@settings(max_examples=25, deadline=None)
@given(params=rounds)
def test_sum_equals_plain_sum_without_dropouts(params):
    n, u, t, d = params
    server, clients, inputs = make_round(n, d, target=u, privacy=t)
    result = run_round(server, clients)
    assert result.contributors == frozenset(inputs)
    assert np.array_equal(result.ring_sum, field_sum(inputs.values()))
    plain = PlainServer(round_id=ROUND, clients=list(inputs), length=d, ring=FIELD_P31)
    plain_clients = {c: PlainClient(client_id=c, round_id=ROUND, input_fn=lambda c=c: inputs[c]) for c in inputs}
    assert np.array_equal(run_round(plain, plain_clients).ring_sum, result.ring_sum)


@settings(max_examples=30, deadline=None)
@given(params=rounds, data=st.data())
def test_dropouts_up_to_tolerance_give_the_sum_over_the_committed_set(params, data):
    n, u, t, d = params
    server, clients, inputs = make_round(n, d, target=u, privacy=t)
    ids = list(inputs)
    dropping = data.draw(st.lists(st.sampled_from(ids), unique=True, max_size=n - u))
    stage_of = {c: data.draw(st.sampled_from(STAGES)) for c in dropping}
    drop_at = {s: {c for c in dropping if stage_of[c] == s} for s in STAGES}
    result = run_round(server, clients, drop_at=drop_at)
    committed = set(ids) - {c for c in dropping if stage_of[c] != "recovery"}
    assert result.contributors == frozenset(committed)
    assert np.array_equal(result.ring_sum, field_sum(inputs[c] for c in committed))
    for stage in STAGES:
        assert result.dropped.get(stage, frozenset()) == frozenset(drop_at[stage])


@pytest.mark.parametrize("stage", STAGES)
def test_one_dropout_more_than_tolerated_aborts(stage):
    n, u = 8, 5
    server, clients, _ = make_round(n, 20, target=u, privacy=2)
    with pytest.raises(AbortError, match=f"round aborted at stage '{stage}': 4 clients left, 5 required") as info:
        run_round(server, clients, drop_at={stage: set(range(1, n - u + 2))})
    assert (info.value.stage, info.value.survivors, info.value.required) == (stage, u - 1, u)
    assert stage in str(info.value)


def test_dropouts_spread_over_stages_add_up_to_an_abort():
    server, clients, _ = make_round(8, 20, target=5, privacy=2)
    with pytest.raises(AbortError, match="round aborted at stage 'recovery': 4 clients left, 5 required") as info:
        run_round(server, clients, drop_at={"advertise": {1}, "masked_input": {2, 3}, "recovery": {4}})
    assert info.value.stage == "recovery"


def test_parameters_from_fractions_and_validation():
    server = LightSecAggServer(round_id=1, clients=range(1, 11), length=5, target_survivors=0.75, privacy=0.3)
    assert (server.target, server.privacy) == (8, 3)
    assert (LightSecAggServer(round_id=1, clients=[1, 2, 3], length=5).target,) == (3,)
    order = "need 1 <= privacy T < target survivors U <= N"
    for bad, message in ((dict(target_survivors=11), order), (dict(privacy=8, target_survivors=8), order),
                         (dict(target_survivors=1.5), r"target_survivors must be an int or a fraction in \(0, 1\]")):
        with pytest.raises(ValueError, match=message):
            LightSecAggServer(round_id=1, clients=range(1, 11), length=5, **bad)
    with pytest.raises(TypeError, match="privacy must be an int or a fraction, not bool"):
        LightSecAggServer(round_id=1, clients=range(1, 11), length=5, privacy=True)
    with pytest.raises(ValueError, match="LightSecAgg codes masks over F_p"):
        LightSecAggServer(round_id=1, clients=range(1, 11), length=5, ring=RING_2_32)


def test_registry_resolves_lightsecagg():
    assert registry.server_class("lightsecagg") is LightSecAggServer
    assert registry.client_class("lightsecagg") is LightSecAggClient


def test_upload_is_four_bytes_per_coordinate():
    server, clients, _ = make_round(4, 1000, target=3, privacy=1)
    requests = advance_to("masked_input", server, clients)
    replies = deliver(server, clients, requests)
    assert all(r.nbytes() == 4 * 1000 for r in replies.values())


# ---- the relay is sealed -------------------------------------------------------------------

def test_server_relays_ciphertext_it_cannot_open_and_tampering_is_detected():
    server, clients, _ = make_round(5, 64, target=4, privacy=2)
    requests = advance_to("share", server, clients)
    shares = deliver(server, clients, requests)
    sender, receiver = 2, 4
    assert sender not in shares[sender]["pieces"], "a client's own coded piece must stay local"
    blob = shares[sender]["pieces"][receiver]
    aad = _piece_aad(ROUND, sender, receiver)
    plaintext = open_sealed(clients[receiver]._peer_keys[sender], blob, aad)  # the receiver can
    assert plaintext[:16] not in blob
    # The server knows every public key but no private key: its best guess fails authentication.
    stranger = KeyPair.generate()
    for guess in (agree(stranger, server._keys[sender], _piece_key_info(ROUND, sender, receiver)),
                  agree(stranger, server._keys[receiver], _piece_key_info(ROUND, sender, receiver))):
        with pytest.raises(DecryptionError, match="failed authentication"):
            open_sealed(guess, blob, aad)
    # Rebinding to another receiver or round breaks authentication too.
    with pytest.raises(DecryptionError, match="failed authentication"):
        open_sealed(clients[receiver]._peer_keys[sender], blob, _piece_aad(ROUND, sender, 3))
    with pytest.raises(DecryptionError, match="failed authentication"):
        open_sealed(clients[receiver]._peer_keys[sender], blob, _piece_aad(ROUND + 1, sender, receiver))



def _finish_with_relay(server, clients, relays, receiver, relay):
    """Deliver `relay` to `receiver` instead of its genuine one, then run the round to its end."""
    replies = {c: clients[c].handle(relay if c == receiver else r) for c, r in relays.items()}
    for r in replies.values():
        server.accept(r)
    return replies, finish(server, clients, server.advance())


@pytest.mark.parametrize("tamper", ["flipped", "wrong_key"])
def test_a_piece_that_fails_authentication_drops_both_ends_not_the_round(tamper):
    server, clients, inputs = make_round(6, 64, target=4, privacy=2)
    requests = advance_to("share", server, clients)
    deliver(server, clients, requests)
    relays = server.advance()
    sender, receiver = 2, 4
    good = relays[receiver]
    blob = bytearray(good["pieces"][sender])
    if tamper == "flipped":
        blob[20] ^= 1
    else:  # sealed under a key the server made up (it knows every public key, no private one)
        blob = bytearray(seal(agree(KeyPair.generate(), server._keys[receiver], b"guess"), bytes(len(blob) - 28), b""))
    bad = Message(good.kind, good.round, SERVER, receiver, {"pieces": {**good["pieces"], sender: bytes(blob)}})
    replies, result = _finish_with_relay(server, clients, relays, receiver, bad)
    assert replies[receiver]["bad_pieces"] == (sender,)
    assert result.faulty.keys() == {sender, receiver} and all("disputed" in w for w in result.faulty.values())
    assert result.disputes == ((receiver, sender),)
    assert result.contributors == frozenset(range(1, 7)) - {sender, receiver}
    assert np.array_equal(result.ring_sum, field_sum(inputs[c] for c in result.contributors))


def test_a_client_reporting_two_bad_pieces_costs_one_honest_seat_at_most():
    """Swapping two senders' pieces (or a liar) makes one receiver report both: it goes with the
    first it named (the server cannot tell who lied), the other stays."""
    server, clients, inputs = make_round(6, 64, target=4, privacy=2)
    deliver(server, clients, advance_to("share", server, clients))
    relays = server.advance()
    receiver, good = 4, relays[4]
    swapped = Message(good.kind, good.round, SERVER, receiver,
                      {"pieces": {**good["pieces"], 2: good["pieces"][1], 1: good["pieces"][2]}})
    replies, result = _finish_with_relay(server, clients, relays, receiver, swapped)
    assert replies[receiver]["bad_pieces"] == (1, 2)
    assert result.faulty.keys() == {receiver, 1} and result.disputes == ((receiver, 1),)
    assert result.contributors == frozenset(range(1, 7)) - {receiver, 1}
    assert np.array_equal(result.ring_sum, field_sum(inputs[c] for c in result.contributors))


def test_a_low_order_public_key_drops_its_sender_at_advertise():
    server, clients, inputs = make_round(5, 16, target=3, privacy=1)
    requests = server.start()
    for c, req in requests.items():
        reply = clients[c].handle(req)
        if c == 3:
            with pytest.raises(ProtocolError, match="low-order"):
                server.accept(Message(reply.kind, reply.round, 3, SERVER, {"public_key": bytes(32), "signature": b""}))
            continue
        server.accept(reply)
    result = finish(server, clients, server.advance())
    assert result.faulty.keys() == {3} and result.faulty[3].startswith("advertise: ")
    assert result.contributors == {1, 2, 4, 5}
    assert np.array_equal(result.ring_sum, field_sum(inputs[c] for c in (1, 2, 4, 5)))


# ---- server-side validation ----------------------------------------------------------------

def reply(kind: str, sender: int, *, round_id: int = ROUND, **fields) -> Message:
    return Message(kind=kind, round=round_id, sender=sender, receiver=SERVER, fields=fields)


def test_envelope_errors_are_discarded_and_malformed_replies_drop_their_sender():
    server, clients, inputs = make_round(7, 30, target=3, privacy=2)
    requests = server.start()
    first = clients[1].handle(requests[1])
    server.accept(first)
    waiting = server.waiting_for()
    for msg, message in (
            (first, "duplicate 'lsa_public_key' from client 1"),                                      # replay
            (reply("lsa_public_key", 2, round_id=ROUND + 1, public_key=b"\x02" * 32, signature=b""),
             "message for round 12, current round is 11"),                                           # another round
            (reply("lsa_coded_pieces", 2, pieces={}), "unexpected 'lsa_coded_pieces' message"),     # another kind
            (reply("lsa_public_key", 99, public_key=b"\x03" * 32, signature=b""),
             "client 99 is not expected in stage 'advertise'")):                                     # not in the round
        with pytest.raises(ProtocolError, match=message):
            server.accept(msg)
        assert server.waiting_for() == waiting
    with pytest.raises(ProtocolError, match="fields wrong|bytes"):
        server.accept(reply("lsa_public_key", 2, public_key=b"\x01" * 31, signature=b""))  # wrong size
    assert 2 not in server.waiting_for() and server._faulty[2].startswith("advertise: ")
    server.accept(reply("lsa_public_key", 3, public_key=first["public_key"], signature=b""))  # someone else's key
    deliver(server, clients, {c: r for c, r in requests.items() if c not in (1, 2, 3)})
    requests = server.advance()
    assert "all advertised" in server._faulty[3] and "all advertised" in server._faulty[1]  # both go
    assert set(requests) == {4, 5, 6, 7}

    shares = {c: clients[c].handle(requests[c]) for c in requests}
    good = shares[4]["pieces"]
    missing = {k: v for k, v in good.items() if k != 5}
    with pytest.raises(ProtocolError, match="one piece to every other"):
        server.accept(reply("lsa_coded_pieces", 4, pieces=missing))
    for c in (5, 6, 7):
        server.accept(shares[c])
    requests = server.advance()
    assert set(requests) == {5, 6, 7}
    deliver(server, clients, requests)  # the relayed pieces open: no accusation
    requests = server.advance()
    assert set(requests) == {5, 6, 7}

    masked = {c: clients[c].handle(requests[c]) for c in requests}
    with pytest.raises(ProtocolError, match="outside|range|F_p|modulus"):
        server.accept(reply("lsa_masked_input", 6, vector=np.full(30, 2**31 - 1, dtype=np.uint32)))
    with pytest.raises(ProtocolError, match="not expected"):
        server.accept(masked[6])  # dropped: its genuine reply comes too late
    with pytest.raises(AbortError,  # two left, three needed: too few honest clients to finish
                       match="round aborted at stage 'masked_input': 2 clients left, 3 required"):
        for c in (5, 7):
            server.accept(masked[c])
        server.advance()
    assert server._faulty.keys() == {1, 2, 3, 4, 6}


def test_an_accusation_against_a_client_that_relayed_nothing_drops_the_accuser():
    server, clients, inputs = make_round(6, 16, target=4, privacy=2)
    requests = advance_to("share", server, clients)
    deliver(server, clients, requests, skip={6})  # 6 never shares: nobody was relayed a piece from it
    relays = server.advance()
    assert set(relays) == {1, 2, 3, 4, 5}
    with pytest.raises(ProtocolError, match="bad pieces from clients that sent it none"):
        server.accept(Message("lsa_piece_check", ROUND, 5, SERVER, {"bad_pieces": (6,)}))
    assert server._faulty[5].startswith("check: ")
    deliver(server, clients, {c: r for c, r in relays.items() if c != 5})
    result = finish(server, clients, server.advance())
    assert result.contributors == frozenset({1, 2, 3, 4})
    assert np.array_equal(result.ring_sum, field_sum(inputs[c] for c in (1, 2, 3, 4)))


def test_masked_inputs_are_folded_as_they_arrive_and_no_input_is_kept():
    """The accusations are settled before any input is asked for, so the server adds each masked input
    into one running sum on arrival: it holds O(d) of inputs, not O(N d)."""
    server, clients, inputs = make_round(5, 40, target=3, privacy=1)
    requests = advance_to("masked_input", server, clients)
    assert all(r.kind == "lsa_input_request" and not r.fields for r in requests.values())
    replies = deliver(server, clients, requests)
    assert all("vector" not in m.fields for m in server._replies.values())  # envelopes only
    masked_sum = field_sum(r["vector"] for r in replies.values())
    assert np.array_equal(server.running_sum, masked_sum)
    result = finish(server, clients, server.advance())
    assert np.array_equal(result.ring_sum, field_sum(inputs.values()))


@pytest.mark.parametrize("spill", [True, False])
def test_relayed_pieces_wait_in_the_store_and_each_relay_is_built_when_sent(spill):
    """The server keeps no sealed piece in its replies: they go to the relay store (an unlinked file when
    spilled), and a client's relay is read back only when a driver asks for it."""
    server, clients, inputs = make_round(6, 50, target=4, privacy=2)
    server.spill = spill
    deliver(server, clients, advance_to("share", server, clients))
    assert all(not m.fields for m in server._replies.values())
    assert server._store.spill is spill
    assert all(isinstance(w, tuple) is spill for w in server._store._where.values())
    assert server._store.bytes_held == 6 * 5 * server.blob_bytes
    relays = server.advance()
    assert not isinstance(relays, dict) and sorted(relays) == [1, 2, 3, 4, 5, 6]
    result = finish(server, clients, relays)
    assert server._store._file is None and not server._store._where  # closed once the check stage is over
    assert np.array_equal(result.ring_sum, field_sum(inputs.values()))


def test_a_piece_altered_on_disk_is_reported_like_one_altered_in_transit():
    server, clients, inputs = make_round(6, 50, target=4, privacy=2)
    server.spill = True
    deliver(server, clients, advance_to("share", server, clients))
    relays = server.advance()
    offset, size = server._store._where[(2, 4)]
    fd = server._store._file.fileno()
    os.pwrite(fd, bytes([os.pread(fd, 1, offset + 20)[0] ^ 1]), offset + 20)
    replies = deliver(server, clients, relays)
    assert replies[4]["bad_pieces"] == (2,)
    result = finish(server, clients, server.advance())
    assert result.disputes == ((4, 2),) and result.contributors == frozenset({1, 3, 5, 6})
    assert np.array_equal(result.ring_sum, field_sum(inputs[c] for c in (1, 3, 5, 6)))


def test_spill_auto_spills_only_past_the_threshold(monkeypatch):
    from secagg.protocols import lightsecagg
    server, clients, _ = make_round(5, 40, target=3, privacy=1)
    deliver(server, clients, advance_to("share", server, clients))
    assert server._store.spill is False  # 5 x 4 small pieces
    monkeypatch.setattr(lightsecagg, "SPILL_FROM", 1)
    server, clients, _ = make_round(5, 40, target=3, privacy=1)
    deliver(server, clients, advance_to("share", server, clients))
    assert server._store.spill is True
    with pytest.raises(ValueError, match="spill must be"):
        LightSecAggServer(round_id=1, clients=[1, 2, 3], length=4, spill="yes")


def test_a_malformed_aggregate_piece_is_dropped_and_recovery_uses_the_others():
    server, clients, inputs = make_round(5, 30, target=3, privacy=1)
    requests = advance_to("recovery", server, clients)
    m = server.code.piece_length
    with pytest.raises(ProtocolError, match="ring vector has length 16, expected 15"):
        server.accept(reply("lsa_aggregate_piece", 2, piece=np.zeros(m + 1, dtype=np.uint32), layer_shares={}, layer_index=-1,
                                    excess=np.zeros(0, np.uint32)))
    result = finish(server, clients, {c: r for c, r in requests.items() if c != 2})
    assert result.faulty.keys() == {2} and result.faulty[2].startswith("recovery: ")
    assert result.contributors == frozenset(range(1, 6))  # its masked input was already in U1
    assert np.array_equal(result.ring_sum, field_sum(inputs.values()))
    with pytest.raises(ProtocolError, match="round already finished"):
        server.accept(reply("lsa_aggregate_piece", 2, piece=np.zeros(m, dtype=np.uint32), layer_shares={}, layer_index=-1,
                                    excess=np.zeros(0, np.uint32)))


def test_server_ignores_replies_from_clients_that_dropped_earlier():
    server, clients, _ = make_round(6, 10, target=4, privacy=2)
    setup = server.start()
    deliver(server, clients, setup, skip={6})
    requests = server.advance()
    assert 6 not in requests
    with pytest.raises(RuntimeError, match="the round has already started"):
        server.start()  # a round starts once
    late_key = clients[6].handle(setup[6])  # answers the first stage after it closed
    with pytest.raises(ProtocolError, match="unexpected 'lsa_public_key' message, expected 'lsa_coded_pieces'"):
        server.accept(late_key)
    with pytest.raises(ProtocolError, match="client 6 is not expected in stage 'share'"):
        server.accept(reply("lsa_coded_pieces", 6, pieces={}))


# ---- client-side validation ----------------------------------------------------------------

def request(kind: str, receiver: int, *, round_id: int = ROUND, **fields) -> Message:
    return Message(kind=kind, round=round_id, sender=SERVER, receiver=receiver, fields=fields)


SETUP = dict(length=10, modulus=2**31 - 1, roster=(1, 2, 3, 4), target=3, privacy=1, colluders=0, min_group=1, layers=0)


@pytest.mark.parametrize(("change", "message"), [
    (dict(modulus=2**32), r"runs over F_p with p = 2\^31 - 1"),
    (dict(roster=(2, 3, 4, 5)), "not in the round's roster"),
    (dict(target=5), "inconsistent parameters T=1, U=5, N=4"),
    (dict(privacy=3), "inconsistent parameters T=3, U=3, N=4"),
    (dict(length=2**20), "requested length exceeds this client's limit"),
])
def test_client_refuses_inconsistent_setup(change, message):
    client = LightSecAggClient(client_id=1, round_id=ROUND, input_fn=lambda: None, max_length=1000)
    with pytest.raises(ProtocolError, match=message):
        client.handle(request("lsa_setup", 1, **{**SETUP, **change}))
    assert client.handle(request("lsa_setup", 1, **SETUP)).kind == "lsa_public_key"  # state unchanged


def test_client_enforces_its_own_privacy_floor():
    client = LightSecAggClient(client_id=1, round_id=ROUND, input_fn=lambda: None, min_privacy=2)
    with pytest.raises(ProtocolError, match=r"below this client's floor \(T >= 2, U >= 2\)"):
        client.handle(request("lsa_setup", 1, **SETUP))


def test_client_rejects_replays_bad_key_lists_and_inconsistent_survivor_sets():
    server, clients, inputs = make_round(5, 12, target=3, privacy=1)
    requests = server.start()
    setup = requests[1]
    deliver(server, clients, requests)
    with pytest.raises(ProtocolError, match="client 1 did not expect 'lsa_setup' now"):
        clients[1].handle(setup)  # replayed setup
    requests = server.advance()

    keys = dict(requests[1]["keys"])
    own = "the key list does not carry this client's public key"
    for bad, message in (({**keys, 1: keys[2]}, own), ({k: v for k, v in keys.items() if k != 1}, own),
                         ({**keys, 9: b"\x05" * 32}, "names clients outside the roster"),
                         ({1: keys[1], 2: keys[2]}, "2 clients left, the round needs 3")):
        with pytest.raises(ProtocolError, match=message):  # the genuine request with only its keys changed
            clients[1].handle(request("lsa_keys", 1, **{**requests[1].fields, "keys": bad}))
    with pytest.raises(ProtocolError, match="message for round 12, current round is 11"):
        clients[1].handle(request("lsa_keys", 1, round_id=ROUND + 1, keys=keys))
    deliver(server, clients, requests, skip={5})  # client 5 never shares
    requests = server.advance()
    for _ in ("check", "masked_input"):
        deliver(server, clients, requests)
        requests = server.advance()

    survivors = requests[1]["survivors"]
    assert survivors == (1, 2, 3, 4)
    for bad, message in (((1, 2, 3, 5), r"survivors \[5\] did not share a coded piece with this client"),
                         ((2, 3, 4), "the survivor set leaves out this client"),
                         ((1, 2), "survivor set of 2 is below U=3")):
        with pytest.raises(ProtocolError, match=message):
            clients[1].handle(request(requests[1].kind, 1, survivors=bad))
    result = finish(server, clients, requests)
    assert np.array_equal(result.ring_sum, field_sum(inputs[c] for c in survivors))
    with pytest.raises(ProtocolError, match="client 1 did not expect 'lsa_survivors' now"):
        clients[1].handle(requests[1])  # a second recovery request (e.g. another survivor set)


def test_a_relay_from_a_previous_round_fails_authentication_and_its_receiver_reports_every_sender():
    old_server, old_clients, _ = make_round(5, 8, target=3, privacy=1, round_id=1)
    old_relays = advance_to("check", old_server, old_clients)
    server, clients, inputs = make_round(5, 8, target=3, privacy=1, round_id=2)
    relays = advance_to("check", server, clients)
    stale = Message(old_relays[1].kind, 2, SERVER, 1, old_relays[1].fields)
    replies, result = _finish_with_relay(server, clients, relays, 1, stale)
    assert replies[1]["bad_pieces"] == (2, 3, 4, 5)  # nothing from round 1 opens in round 2
    assert result.faulty.keys() == {1, 2}             # the accuser and the first it named, not four senders
    assert np.array_equal(result.ring_sum, field_sum(inputs[c] for c in (3, 4, 5)))


@pytest.mark.parametrize("spill", [True, False])
def test_aggregate_pieces_wait_in_a_row_store_and_one_altered_on_disk_is_left_out(spill):
    """At recovery the server writes each aggregate piece into its row store (an unlinked file when spilled)
    and reads it back a block of columns at a time; a row changed there is located like a lying helper."""
    server, clients, inputs = make_round(7, 60, target=4, privacy=2)
    server.spill = spill
    deliver(server, clients, advance_to("recovery", server, clients))
    store = server._coded
    assert store.spill is spill and store.shape == (7, server.code.piece_length)
    if spill:
        fd, offset = store._file.fileno(), 4 * (2 * server.code.piece_length + 3)  # row of client 3
        os.pwrite(fd, bytes([os.pread(fd, 1, offset)[0] ^ 1]), offset)
    assert server.advance() == {}
    result = server.result()
    assert store._file is None and store._data is None  # closed once the mask is removed
    assert set(result.faulty) == ({3} if spill else set())
    assert np.array_equal(result.ring_sum, field_sum(inputs.values()))


@pytest.mark.parametrize("spill", [True, False])
def test_clients_keep_their_pieces_sealed_in_a_store_opened_at_recovery(spill):
    """Each client keeps the pieces it received sealed (in an unlinked file when spilled) and opens them
    again only for the survivors' sum at recovery; the store is closed afterwards."""
    server, clients, inputs = make_round(6, 50, target=4, privacy=2)
    for c in clients.values():
        c.spill = spill
    deliver(server, clients, advance_to("share", server, clients))
    requests = server.advance()
    deliver(server, clients, requests)
    store = clients[3]._store
    assert store.spill is spill and sorted(s for s, _ in store._where) == [1, 2, 4, 5, 6]
    assert all(isinstance(w, tuple) is spill for w in store._where.values())
    result = finish(server, clients, server.advance())
    assert store._file is None and not store._where
    assert np.array_equal(result.ring_sum, field_sum(inputs.values()))


def test_a_piece_altered_on_the_clients_disk_makes_it_refuse_recovery_and_the_rest_finish():
    server, clients, inputs = make_round(6, 50, target=4, privacy=2)
    for c in clients.values():
        c.spill = True
    deliver(server, clients, advance_to("share", server, clients))
    deliver(server, clients, server.advance())
    offset, _ = clients[4]._store._where[(2, 4)]
    fd = clients[4]._store._file.fileno()
    os.pwrite(fd, bytes([os.pread(fd, 1, offset + 20)[0] ^ 1]), offset + 20)
    requests = server.advance()
    while server.stage != "recovery":
        deliver(server, clients, requests)
        requests = server.advance()
    with pytest.raises(ProtocolError, match="fails authentication when read back"):
        clients[4].handle(requests[4])
    result = finish(server, clients, {c: r for c, r in requests.items() if c != 4})
    assert result.contributors == frozenset(range(1, 7))  # its input is in; its recovery piece is not needed
    assert np.array_equal(result.ring_sum, field_sum(inputs.values()))


def test_client_spill_auto_spills_only_past_the_threshold_and_bad_values_are_refused(monkeypatch):
    from secagg.protocols import lightsecagg
    server, clients, _ = make_round(5, 40, target=3, privacy=1)
    deliver(server, clients, advance_to("share", server, clients))
    assert clients[1]._store.spill is False
    monkeypatch.setattr(lightsecagg, "CLIENT_SPILL_FROM", 1)
    server, clients, _ = make_round(5, 40, target=3, privacy=1)
    deliver(server, clients, advance_to("share", server, clients))
    assert clients[1]._store.spill is True
    with pytest.raises(ValueError, match="spill must be"):
        LightSecAggClient(client_id=1, round_id=1, input_fn=lambda: np.zeros(1, np.uint32), spill="yes")


def test_the_window_keeps_two_messages_in_flight_unless_one_masked_input_alone_is_larger(monkeypatch):
    """`send_window`: WINDOW_BYTES of a paced stage's messages at a time, at least two (the next is on its
    way while the last is handled), but masked inputs one at a time when one is larger than the window (a
    400 MB input at d = 1e8 is folded in memory); share parts keep two in flight (they go to the store)."""
    from secagg.protocols import lightsecagg

    server, clients, _ = make_round(8, 1000, target=6, privacy=3)
    advance_to("masked_input", server, clients)  # the masked-input stage: inputs of 4 kB
    monkeypatch.setattr(lightsecagg, "WINDOW_BYTES", 4000 * 3)
    assert server.send_window() == 3
    monkeypatch.setattr(lightsecagg, "WINDOW_BYTES", 4000)
    assert server.send_window() == 2
    monkeypatch.setattr(lightsecagg, "WINDOW_BYTES", 3999)
    assert server.send_window() == 1
    monkeypatch.setattr(lightsecagg, "WINDOW_BYTES", 4000 * 8)
    assert server.send_window() is None  # all eight fit
    server.pace = False
    assert server.send_window() is None
    server, clients, _ = make_round(8, 1000, target=6, privacy=3)
    advance_to("share", server, clients)
    monkeypatch.setattr(lightsecagg, "WINDOW_BYTES", 1)
    assert server.stage == "share" and server.send_window() == 2  # larger parts, still two encoding at once


# ---- share and check in parts (large pieces) ----------------------------------------------------

def _parts(monkeypatch, part_size: int, n: int = 7, d: int = 40, **kw):
    """A round whose sealed pieces travel `part_size` to a message (U - T = 2: a piece is half a vector)."""
    from secagg.protocols import lightsecagg

    server, clients, inputs = make_round(n, d, target=4, privacy=2, **kw)
    monkeypatch.setattr(lightsecagg, "PART_FLOOR", 1)
    server.part_size = part_size  # 4 d // blob is 1 here; set the size under test directly
    return server, clients, inputs


@pytest.mark.parametrize("part_size", [1, 2, 4])
def test_in_parts_every_message_carries_at_most_a_part_and_the_sum_is_exact(monkeypatch, part_size):
    server, clients, inputs = _parts(monkeypatch, part_size)
    requests, seen, sent, got = server.start(), [], {}, {}
    while requests:
        replies = deliver(server, clients, requests)
        seen.append(server.stage)
        for c, r in replies.items():
            if r.kind == "lsa_coded_pieces":
                assert len(r["pieces"]) <= part_size
                sent[c] = sent.get(c, 0) + len(r["pieces"])
        for c, r in requests.items():
            if r.kind == "lsa_relay":
                assert len(r["pieces"]) <= part_size
                got[c] = got.get(c, 0) + len(r["pieces"])
        requests = server.advance()
    assert seen.count("share") == seen.count("check") == -(-7 // part_size)  # one stage round per part
    assert sent == got == {c: 6 for c in range(1, 8)}  # every other client's piece, over the parts
    result = server.result()
    assert result.contributors == frozenset(range(1, 8))
    assert np.array_equal(result.ring_sum, field_sum(inputs.values()))


def test_a_client_encodes_only_the_part_it_is_asked_for(monkeypatch):
    """Clients never hold all N coded pieces: each share request makes one product over the code for that
    part's receivers (plus the client's own piece with the first), and the whole `encode` is not called."""
    from secagg.lcc import LagrangeCode

    server, clients, inputs = _parts(monkeypatch, 2)
    rows, encode_rows = [], LagrangeCode.encode_rows
    monkeypatch.setattr(LagrangeCode, "encode", lambda *a, **k: pytest.fail("a client encoded all N pieces"))
    monkeypatch.setattr(LagrangeCode, "encode_rows", lambda self, pos, *a: rows.append(len(pos)) or encode_rows(self, pos, *a))
    result = finish(server, clients, server.start())
    assert max(rows) <= 2 + 1 and sum(rows) == 7 * 7  # six peers' pieces and its own, per client
    assert np.array_equal(result.ring_sum, field_sum(inputs.values()))


def test_a_client_missing_a_later_part_is_dropped_and_the_rest_finish(monkeypatch):
    server, clients, inputs = _parts(monkeypatch, 2)
    requests = server.start()
    stage_parts: dict[str, int] = {}
    while requests:
        stage = server.stage
        stage_parts[stage] = stage_parts.get(stage, 0) + 1
        skip = {3} if (stage, stage_parts[stage]) == ("share", 2) else {5} if (stage, stage_parts[stage]) == ("check", 3) else set()
        deliver(server, clients, requests, skip=skip)
        requests = server.advance()
    result = server.result()
    # 3 stopped sharing half way (its pieces are never relayed); 5 stopped opening relays (it holds too few)
    assert result.contributors == frozenset({1, 2, 4, 6, 7})
    assert np.array_equal(result.ring_sum, field_sum(inputs[c] for c in (1, 2, 4, 6, 7)))


def test_an_accusation_in_a_later_check_part_drops_both_ends(monkeypatch):
    server, clients, inputs = _parts(monkeypatch, 2)
    requests = server.start()
    while server.stage != "check" or server._part < 2:
        deliver(server, clients, requests)
        requests = server.advance()
    receiver, good = 1, requests[1]  # part 2 carries the pieces of senders 5 and 6
    assert set(good["pieces"]) == {5, 6}
    blob = bytearray(good["pieces"][6])
    blob[20] ^= 1
    tampered = Message(good.kind, good.round, SERVER, receiver, {"pieces": {**good["pieces"], 6: bytes(blob)}})
    replies, result = _finish_with_relay(server, clients, requests, receiver, tampered)
    assert replies[receiver]["bad_pieces"] == (6,)
    assert result.disputes == ((1, 6),) and result.contributors == frozenset({2, 3, 4, 5, 7})
    assert np.array_equal(result.ring_sum, field_sum(inputs[c] for c in (2, 3, 4, 5, 7)))


def test_a_client_refuses_a_repeated_part(monkeypatch):
    server, clients, _ = _parts(monkeypatch, 2)
    requests = server.start()
    deliver(server, clients, requests)
    keys = server.advance()
    first = clients[1].handle(keys[1])
    assert set(first["pieces"]) == {2}  # part 0 is clients 1 and 2: client 1 seals for 2 only
    again = Message("lsa_more_pieces", ROUND, SERVER, 1, {"receivers": (2,)})
    with pytest.raises(ProtocolError, match="not sent yet"):
        clients[1].handle(again)  # a piece is sent once: a second copy would let nothing new be learned, refused anyway
    more = Message("lsa_more_pieces", ROUND, SERVER, 1, {"receivers": (3, 4)})
    assert set(clients[1].handle(more)["pieces"]) == {3, 4}


def test_a_key_list_with_a_bad_first_part_is_refused_before_the_client_changes_state(monkeypatch):
    """A refused request leaves the client as it was: the first part is checked before any key is agreed or
    any mask drawn, so the same client still answers the good key list afterwards."""
    server, clients, _ = _parts(monkeypatch, 2)
    deliver(server, clients, server.start())
    keys = server.advance()
    for receivers in ((2, 2), (9,), (1,)):  # repeated (the schema's check), outside the key list, itself
        bad = Message(keys[1].kind, ROUND, SERVER, 1, {**keys[1].fields, "receivers": receivers})
        with pytest.raises(ProtocolError, match="repeated entries|not sent yet"):
            clients[1].handle(bad)
        assert clients[1]._data is None and clients[1]._keypair is not None
    assert set(clients[1].handle(keys[1])["pieces"]) == {2}


@pytest.mark.parametrize("block", [1, 3, 7])
def test_the_aggregate_mask_is_removed_block_by_block_exactly(monkeypatch, block):
    from secagg.protocols import lightsecagg

    monkeypatch.setattr(lightsecagg, "UNMASK_BLOCK", block)
    server, clients, inputs = make_round(6, 41, target=5, privacy=2)  # 41 values in 3 data pieces of 14: padded
    result = finish(server, clients, advance_to("check", server, clients))
    assert np.array_equal(result.ring_sum, field_sum(inputs.values()))
