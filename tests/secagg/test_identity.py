"""Enrolled identities: signed key advertisements stop a server from substituting round keys."""
from __future__ import annotations

import numpy as np
import pytest

from secagg.crypto import KeyPair
from secagg.identity import Identity, Roster, SigningKey, advertisement
from secagg.messages import ProtocolError
from secagg.prg import random_vector
from secagg.protocols.lightsecagg import LightSecAggClient, LightSecAggServer
from secagg.protocols.secagg import SecAggClient, SecAggPlusClient, SecAggPlusServer, SecAggServer
from secagg.ring import FIELD_P31, RING_2_32
from secagg.simulate import run_round

PROTOCOLS = {
    "secagg": (SecAggServer, SecAggClient, RING_2_32, "keys"),
    "secagg+": (SecAggPlusServer, SecAggPlusClient, RING_2_32, "keys"),
    "lightsecagg": (LightSecAggServer, LightSecAggClient, FIELD_P31, "keys"),
}
FIRST_KEYS_STAGE = {"secagg": "share_request", "secagg+": "share_request", "lightsecagg": "lsa_keys"}


def enrol(ids):
    keys = {c: SigningKey.generate() for c in ids}
    roster = Roster({c: k.public_bytes for c, k in keys.items()})
    return {c: Identity(client_id=c, signing_key=keys[c], roster=roster) for c in ids}, roster


def make(protocol, n=6, d=16, *, round_id=3, identities=None, roster=None):
    server_cls, client_cls, ring, _ = PROTOCOLS[protocol]
    ids = list(range(1, n + 1))
    inputs = {c: random_vector(ring, d) for c in ids}
    server = server_cls(round_id=round_id, clients=ids, length=d, roster=roster)
    clients = {c: client_cls(client_id=c, round_id=round_id, input_fn=lambda c=c: inputs[c],
                             identity=(identities or {}).get(c)) for c in ids}
    return server, clients, inputs, ring


def test_signatures_bind_the_round_the_client_and_the_keys():
    ids, roster = enrol([1, 2])
    keys = KeyPair.generate().public_bytes
    sig = ids[1].signing_key.sign(advertisement("secagg", 4, 1, keys))
    assert roster.verify(1, sig, advertisement("secagg", 4, 1, keys))
    assert not roster.verify(2, sig, advertisement("secagg", 4, 2, keys))            # another client
    assert not roster.verify(1, sig, advertisement("secagg", 5, 1, keys))            # another round
    assert not roster.verify(1, sig, advertisement("lightsecagg", 4, 1, keys))       # another protocol
    assert not roster.verify(1, sig, advertisement("secagg", 4, 1, bytes(32)))       # other keys
    assert not roster.verify(3, sig, advertisement("secagg", 4, 3, keys))            # not enrolled
    assert not roster.verify(1, sig[:-1], advertisement("secagg", 4, 1, keys))
    with pytest.raises(ValueError, match="not the one the roster lists"):
        Identity(client_id=2, signing_key=ids[1].signing_key, roster=roster)
    with pytest.raises(ValueError, match="share a verify key"):
        Roster({1: roster.keys[1], 2: roster.keys[1]})
    with pytest.raises(ValueError, match="roster client ids are ints in 1..2147483647, got 0"):
        Roster({0: roster.keys[1]})


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_enrolled_clients_sum_exactly(protocol):
    identities, roster = enrol(range(1, 7))
    server, clients, inputs, ring = make(protocol, identities=identities, roster=roster)
    result = run_round(server, clients)
    total = np.zeros(16, np.uint32)
    for v in inputs.values():
        ring.add_(total, v)
    assert result.contributors == frozenset(range(1, 7)) and np.array_equal(result.ring_sum, total)


def _run_until(server, clients, kind):
    """Answer every request until the server sends `kind`; returns those requests."""
    requests = server.start()
    while next(iter(requests.values())).kind != kind:
        for c, r in requests.items():
            server.accept(clients[c].handle(r))
        requests = server.advance()
    return requests


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_a_server_substituting_a_peers_round_key_is_caught_by_the_client(protocol):
    """The active attack signatures exist for: the server puts its own key where client 2's was."""
    identities, roster = enrol(range(1, 7))
    server, clients, _, _ = make(protocol, identities=identities, roster=roster)
    requests = _run_until(server, clients, FIRST_KEYS_STAGE[protocol])
    req = requests[1]
    keys = dict(req["keys"])
    mine = KeyPair.generate().public_bytes
    keys[2] = mine + KeyPair.generate().public_bytes if len(keys[2]) == 64 else mine
    for signatures in (dict(req["signatures"]),                                    # 2's signature kept
                       {**req["signatures"], 2: SigningKey.generate().sign(        # signed by the server
                           advertisement("lightsecagg" if protocol == "lightsecagg" else "secagg", 3, 2, keys[2]))}):
        forged = type(req)(kind=req.kind, round=req.round, sender=req.sender, receiver=req.receiver,
                           fields={**req.fields, "keys": keys, "signatures": signatures})
        with pytest.raises(ProtocolError, match=r"clients \[2\] are not signed by their enrolled keys"):
            clients[1].handle(forged)
    assert clients[1].handle(req) is not None  # the genuine relay is still answered


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_the_server_drops_an_unsigned_or_misattributed_advertisement(protocol):
    identities, roster = enrol(range(1, 11))
    impostor = Identity(client_id=5, signing_key=identities[6].signing_key, roster=Roster(
        {**roster.keys, 5: identities[6].signing_key.public_bytes, 6: SigningKey.generate().public_bytes}))
    server, clients, inputs, ring = make(protocol, n=10, identities={**identities, 4: None, 5: impostor},
                                         roster=roster)
    result = run_round(server, clients)
    assert result.faulty.keys() == {4, 5}
    assert all("not signed by its enrolled key" in r for r in result.faulty.values())
    total = np.zeros(16, np.uint32)
    for c in result.contributors:
        ring.add_(total, inputs[c])
    assert result.contributors == set(range(1, 11)) - {4, 5} and np.array_equal(result.ring_sum, total)


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_a_signed_advertisement_from_another_round_is_refused(protocol):
    identities, roster = enrol(range(1, 7))
    old_server, old_clients, _, _ = make(protocol, round_id=3, identities=identities, roster=roster)
    old = _run_until(old_server, old_clients, FIRST_KEYS_STAGE[protocol])[1]
    server, clients, _, _ = make(protocol, round_id=4, identities=identities, roster=roster)
    req = _run_until(server, clients, FIRST_KEYS_STAGE[protocol])[1]
    keys, sigs = dict(req["keys"]), dict(req["signatures"])
    keys[2], sigs[2] = old["keys"][2], old["signatures"][2]  # client 2's genuine round-3 advertisement
    replayed = type(req)(kind=req.kind, round=req.round, sender=req.sender, receiver=req.receiver,
                         fields={**req.fields, "keys": keys, "signatures": sigs})
    with pytest.raises(ProtocolError, match="not signed"):
        clients[1].handle(replayed)
