"""Colluding insiders and a server that chooses who drops: the attacks of the colluding-insiders issue,
each tried for real against the protocol state machines, and the bounds they must meet.

Threat model under test: a server honest-but-curious in its computation that may drop or withhold
any message, colluding with up to c enrolled clients (`colluders`), and the guarantee that no input
and no sum over fewer than g (`min_clients` / `min_group`) honest clients is opened.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from secagg import shamir
from secagg import protocols  # noqa: F401  (package import for the registry)
from secagg.graph import harary_graph, smallest_isolable_group
from secagg.identity import Identity, Roster, SigningKey
from secagg.messages import SERVER, AbortError, Message, ProtocolError
from secagg.prg import random_vector
from secagg.protocols.lightsecagg import LightSecAggClient, LightSecAggServer
from secagg.protocols.secagg import SecAggClient, SecAggPlusClient, SecAggPlusServer, SecAggServer
from secagg.ring import FIELD_P31, RING_2_32

SECAGG = {"secagg": (SecAggServer, SecAggClient), "secagg+": (SecAggPlusServer, SecAggPlusClient)}


def with_field(m: Message, name: str, value) -> Message:
    return Message(m.kind, m.round, m.sender, m.receiver, {**m.fields, name: value})


def ring_sum(ring, vectors) -> np.ndarray:
    vectors = list(vectors)
    acc = np.zeros_like(vectors[0])
    for v in vectors:
        ring.add_(acc, v)
    return acc


def run(server, clients, *, rewrite=None, withhold=None):
    """Drive a round: `rewrite(stage, cid, reply)` lets colluders change their replies (None: stay
    silent), `withhold(stage) -> ids` lets the server drop whomever it likes. Returns (result or the
    AbortError, every reply the server accepted by stage)."""
    seen: dict[str, dict[int, Message]] = {}
    requests = server.start()
    try:
        while requests:
            stage = server.stage
            gone = set(withhold(stage)) if withhold else set()
            for cid, req in requests.items():
                if cid in gone:
                    continue
                try:
                    reply = clients[cid].handle(req)
                except ProtocolError:
                    continue
                if rewrite is not None:
                    reply = rewrite(stage, cid, reply, req)
                if reply is None:
                    continue
                try:
                    server.accept(reply)
                except ProtocolError:
                    continue
                seen.setdefault(stage, {})[cid] = reply
            requests = server.advance()
    except AbortError as exc:
        return exc, seen
    return server.result(), seen


def make_secagg(protocol, n, d=8, **server_kwargs):
    server_cls, client_cls = SECAGG[protocol]
    ids = list(range(1, n + 1))
    inputs = {c: random_vector(RING_2_32, d) for c in ids}
    server = server_cls(round_id=5, clients=ids, length=d, **server_kwargs)
    clients = {c: client_cls(client_id=c, round_id=5, input_fn=lambda c=c: inputs[c]) for c in ids}
    return server, clients, inputs


def exposed(server, result, colluders) -> set[int]:
    """Contributors whose live masking partners are all colluders: the server (holding their
    self-mask seeds) and the colluders (holding the pairwise keys) could subtract every mask."""
    if isinstance(result, Exception):
        return set()
    return {c for c in result.contributors - colluders if not (server._mask_with[c] & result.contributors) - colluders}


def honest_vs_colluders_dropped(result, colluders) -> tuple[int, int]:
    if isinstance(result, Exception):
        return 0, 0
    return len(set(result.faulty) - colluders), len(set(result.faulty) & colluders)


# ---- the ring check against brute force ----------------------------------------------------------
def _components(order, half, nodes):
    pos = {c: i for i, c in enumerate(order)}
    n, nodes, out = len(order), set(nodes), []
    while nodes:
        stack, comp = [nodes.pop()], set()
        while stack:
            u = stack.pop()
            comp.add(u)
            for v in list(nodes):
                if min((pos[u] - pos[v]) % n, (pos[v] - pos[u]) % n) <= half:
                    nodes.discard(v)
                    stack.append(v)
        out.append(comp)
    return out


@settings(max_examples=150, deadline=None)
@given(st.integers(5, 12), st.integers(1, 3), st.data())
def test_smallest_isolable_group_is_exact_on_the_ring(n, half, data):
    """The O(n) check agrees with trying every coalition: some coalition of at most c survivors
    leaves a component of 1..g-1 honest survivors iff the check finds an arc, or too few survivors
    are left overall (the caller's part)."""
    if 2 * half + 1 > n:
        return
    order = data.draw(st.permutations(list(range(1, n + 1))))
    survivors = data.draw(st.frozensets(st.sampled_from(order), min_size=1))
    c = data.draw(st.integers(0, 2))
    g = data.draw(st.integers(2, 4))
    brute = any(any(1 <= len(comp) < g for comp in _components(order, half, survivors - set(coal)))
                for k in range(c + 1) for coal in itertools.combinations(sorted(survivors), k))
    total = len(survivors) - min(c, len(survivors) - 1) < g
    witness = smallest_isolable_group(order=order, half=half, survivors=survivors, colluders=c, min_group=g)
    assert brute == (witness is not None or total)
    if witness is not None:
        assert set(witness) <= survivors


# ---- accusations ---------------------------------------------------------------------------------
def test_two_colluders_next_to_a_victim_cannot_isolate_it_in_secagg_plus():
    """The issue's attack: SecAgg+ with 10 clients, degree 4, t = 3; two colluders next to a victim
    accuse its other two neighbours, hoping it masks only with them. Declared c = 2: nobody ends up
    masked only with colluders, and the accusations cost no more honest seats than colluding ones."""
    for _ in range(8):  # several random graphs
        server, clients, inputs = make_secagg("secagg+", 10, degree=4, colluders=2, min_clients=2)
        victim = 1
        a, b = sorted(server.graph[victim])[:2]
        colluders = {a, b}
        others = sorted(server.graph[victim] - colluders)

        def rewrite(stage, cid, reply, req):
            if stage == "check" and cid in colluders:
                targets = tuple(sorted(set(others) & set(req["ciphertexts"])))
                return with_field(reply, "bad_shares", targets[:1] if cid == a else targets[1:2])
            return reply

        result, _ = run(server, clients, rewrite=rewrite)
        assert not exposed(server, result, colluders)
        honest, bad = honest_vs_colluders_dropped(result, colluders)
        assert honest <= bad
        if not isinstance(result, Exception):
            assert np.array_equal(result.ring_sum, ring_sum(RING_2_32, (inputs[c] for c in result.contributors)))


@pytest.mark.parametrize("protocol", ["secagg", "lightsecagg"])
def test_five_colluders_accusing_five_victims_cannot_leave_one_victim_in_the_sum(protocol):
    """The issue's attack: 11 clients, five colluders each accuse a different honest client, leaving
    a round of the five plus one victim (subtracting their inputs gives the victim's). Both ends of
    every accusation go now: the round aborts before anything is unmasked."""
    colluders = {1, 2, 3, 4, 5}
    if protocol == "secagg":
        server, clients, _ = make_secagg("secagg", 11, min_clients=2)
        stage, field = "check", "bad_shares"
    else:
        ids = list(range(1, 12))
        inputs = {c: random_vector(FIELD_P31, 8) for c in ids}
        server = LightSecAggServer(round_id=5, clients=ids, length=8, target_survivors=2, privacy=1)
        clients = {c: LightSecAggClient(client_id=c, round_id=5, input_fn=lambda c=c: inputs[c]) for c in ids}
        stage, field = "check", "bad_pieces"

    def rewrite(st_, cid, reply, req):
        if st_ == stage and cid in colluders:
            return with_field(reply, field, (cid + 5,))
        return reply

    result, seen = run(server, clients, rewrite=rewrite)
    if isinstance(result, AbortError):
        assert not seen.get("unmask") and not seen.get("recovery")
    else:  # what is left: six honest clients, none alone with the colluders
        assert not (result.contributors & colluders)
        assert len(result.contributors) >= 1 and set(result.faulty) == colluders | {6, 7, 8, 9, 10}
    honest, bad = honest_vs_colluders_dropped(result, colluders) if not isinstance(result, Exception) else (0, 0)
    assert honest <= bad


# ---- a server that chooses who drops --------------------------------------------------------------
@pytest.mark.parametrize("protocol", sorted(SECAGG))
def test_the_server_withholding_a_victims_partners_cannot_open_its_input(protocol):
    """The server, with c = 1 colluder, drops (withholds) every masked input of the victim's partners
    but the colluder's: it refuses to open the round; and a client told so refuses its shares."""
    kw = {"degree": 4} if protocol == "secagg+" else {}
    server, clients, _ = make_secagg(protocol, 10, colluders=1, min_clients=3, **kw)
    victim = 1
    colluder = min(server.graph[victim])
    withheld = (set(server.graph[victim]) - {colluder}) if protocol == "secagg+" else set(range(3, 11)) - {colluder}
    result, seen = run(server, clients, withhold=lambda stage: withheld if stage == "masked" else ())
    assert isinstance(result, AbortError) and not seen.get("unmask")

    # A server that skipped its own check: the victim refuses to sign, hence to reveal anything.
    server, clients, _ = make_secagg(protocol, 10, colluders=1, min_clients=3, **kw)
    requests = server.start()
    while server.stage != "masked":
        for c, r in requests.items():
            server.accept(clients[c].handle(r))
        requests = server.advance()
    for c, r in requests.items():
        clients[c].handle(r)
    partners = sorted(clients[victim].masked_with)
    lie = Message("consistency_request", 5, SERVER, victim, {"survivors": tuple(sorted({victim, partners[0]}))})
    with pytest.raises(ProtocolError, match="survivors|survived"):
        clients[victim].handle(lie)
    small = tuple(sorted({victim, *partners[: server.partners]}))
    lie = Message("consistency_request", 5, SERVER, victim, {"survivors": small})
    if len(small) < server.min_clients:
        with pytest.raises(ProtocolError, match="survivors"):
            clients[victim].handle(lie)


def test_lightsecagg_needs_g_plus_c_survivors_on_both_sides():
    ids = list(range(1, 9))
    inputs = {c: random_vector(FIELD_P31, 8) for c in ids}
    server = LightSecAggServer(round_id=5, clients=ids, length=8, target_survivors=3, privacy=2, colluders=2,
                               min_group=3)
    assert server.min_survivors == 5
    clients = {c: LightSecAggClient(client_id=c, round_id=5, input_fn=lambda c=c: inputs[c]) for c in ids}
    result, seen = run(server, clients, withhold=lambda stage: {5, 6, 7, 8} if stage == "masked_input" else ())
    assert isinstance(result, AbortError) and not seen.get("recovery")
    with pytest.raises(ValueError, match="exceeds the privacy"):
        LightSecAggServer(round_id=5, clients=ids, length=8, target_survivors=3, privacy=1, colluders=2)


def test_colluders_must_stay_below_the_threshold():
    with pytest.raises(ValueError, match="below the threshold"):
        SecAggServer(round_id=1, clients=list(range(1, 11)), length=4, colluders=6)


# ---- the consistency check ---------------------------------------------------------------------
def enrol(ids):
    keys = {c: SigningKey.generate() for c in ids}
    roster = Roster({c: k.public_bytes for c, k in keys.items()})
    return {c: Identity(client_id=c, signing_key=keys[c], roster=roster) for c in ids}, roster


@pytest.mark.parametrize("protocol", ["secagg", "lightsecagg"])
def test_a_server_showing_two_survivor_sets_gets_no_unmasking_material(protocol):
    """Bonawitz et al.'s consistency check: the server tells half the clients that client 1 dropped
    and the other half that it survived (to collect both its seed and its key). Each client checks t
    (U) valid signatures over the set it signed: neither half has them, so nobody reveals anything."""
    ids = list(range(1, 9))
    identities, roster = enrol(ids)
    if protocol == "secagg":
        inputs = {c: random_vector(RING_2_32, 8) for c in ids}
        server = SecAggServer(round_id=5, clients=ids, length=8, roster=roster)
        clients = {c: SecAggClient(client_id=c, round_id=5, input_fn=lambda c=c: inputs[c], identity=identities[c])
                   for c in ids}
        consistency, reveal = "consistency_request", "unmask_request"
    else:
        inputs = {c: random_vector(FIELD_P31, 8) for c in ids}
        server = LightSecAggServer(round_id=5, clients=ids, length=8, target_survivors=5, privacy=2, roster=roster)
        clients = {c: LightSecAggClient(client_id=c, round_id=5, input_fn=lambda c=c: inputs[c],
                                        identity=identities[c]) for c in ids}
        consistency, reveal = "lsa_survivors", "lsa_recover"
    requests = server.start()
    while next(iter(requests.values())).kind != consistency:
        for c, r in requests.items():
            server.accept(clients[c].handle(r))
        requests = server.advance()
    full = tuple(ids)
    without_1 = tuple(c for c in ids if c != 1)
    views = {c: (full if c <= 4 else without_1) for c in ids}
    signatures = {}
    for c, r in requests.items():
        shown = views[c] if c != 1 else full
        signatures[c] = clients[c].handle(with_field(r, "survivors", shown))["signature"]
    for c in ids:
        shown = views[c] if c != 1 else full
        if protocol == "secagg":
            req = Message(reveal, 5, SERVER, c, {"signatures": {v: signatures[v] for v in ids if v != c}})
        else:
            req = Message(reveal, 5, SERVER, c, {"survivors": shown, "signatures": signatures})
        with pytest.raises(ProtocolError, match="valid signatures"):
            clients[c].handle(req)


# ---- wrong unmasking material --------------------------------------------------------------------
@pytest.mark.parametrize("protocol", sorted(SECAGG))
def test_a_wrong_unmasking_share_is_corrected_and_its_sender_named(protocol):
    kw = {"degree": 6} if protocol == "secagg+" else {}
    server, clients, inputs = make_secagg(protocol, 10, **kw)
    liar = 2

    def rewrite(stage, cid, reply, req):
        if stage == "unmask" and cid == liar:
            seeds = dict(reply["seed_shares"])
            u = next(u for u in seeds if u != liar)
            seeds[u] = shamir.to_bytes((shamir.from_bytes(seeds[u]) + 1) % shamir.PRIME)
            return with_field(reply, "seed_shares", seeds)
        return reply

    result, _ = run(server, clients, rewrite=rewrite)
    assert not isinstance(result, Exception)
    assert np.array_equal(result.ring_sum, ring_sum(RING_2_32, (inputs[c] for c in result.contributors)))
    assert liar in result.faulty and "wrong seed shares" in result.faulty[liar]


def test_a_wrong_lightsecagg_recovery_piece_is_located_and_left_out():
    ids = list(range(1, 9))
    inputs = {c: random_vector(FIELD_P31, 40) for c in ids}
    server = LightSecAggServer(round_id=5, clients=ids, length=40, target_survivors=4, privacy=2)
    clients = {c: LightSecAggClient(client_id=c, round_id=5, input_fn=lambda c=c: inputs[c]) for c in ids}
    liar = 3

    def rewrite(stage, cid, reply, req):
        if stage == "recovery" and cid == liar:
            piece = reply["piece"].copy()
            piece[0] = (int(piece[0]) + 1) % FIELD_P31.modulus
            return with_field(reply, "piece", piece)
        return reply

    result, _ = run(server, clients, rewrite=rewrite)
    assert not isinstance(result, Exception)
    assert np.array_equal(result.ring_sum, ring_sum(FIELD_P31, inputs.values()))
    assert liar in result.faulty and "wrong aggregate coded piece" in result.faulty[liar]


def test_harary_graph_keeps_the_ring_order_it_is_given():
    order = [3, 1, 4, 2, 5, 6]
    g = harary_graph(sorted(order), 2, order=order)
    assert g[3] == {1, 6} and g[4] == {1, 2}
    with pytest.raises(ValueError, match="every client once"):
        harary_graph([1, 2, 3, 4, 5], 2, order=[1, 2, 3, 4, 4])


def test_secagg_plus_planned_from_the_threat_model_survives_its_planned_dropout():
    """Degree and threshold from N, the planned dropout and the corrupt fraction (Bell et al.): 30%
    of 100 clients dropping before masking no longer aborts the round, and the plan is printed."""
    n, d = 100, 4
    ids = list(range(1, n + 1))
    inputs = {c: random_vector(RING_2_32, d) for c in ids}
    server = SecAggPlusServer(round_id=5, clients=ids, length=d, planned_dropout=0.3, corrupt_fraction=0.05)
    assert "dropout=0.30" in server.describe() and server.threshold > (len(server.graph[1]) + 1) / 2
    clients = {c: SecAggPlusClient(client_id=c, round_id=5, input_fn=lambda c=c: inputs[c]) for c in ids}
    gone = set(ids[::10]) | set(ids[1::10]) | set(ids[2::10])  # 30%, spread over the ring at random
    result, _ = run(server, clients, withhold=lambda stage: gone if stage == "masked" else ())
    assert not isinstance(result, Exception), result
    assert result.contributors == frozenset(ids) - gone
    assert np.array_equal(result.ring_sum, ring_sum(RING_2_32, (inputs[c] for c in result.contributors)))
    with pytest.raises(ValueError, match="not both"):
        SecAggPlusServer(round_id=5, clients=ids, length=d, planned_dropout=0.3, degree=10)
