"""SecAgg and SecAgg+ under dropouts, hostile messages and an eavesdropping server.

Properties checked:
* correctness: the secure sum equals the plain ring sum over exactly the reported contributors;
* liveness: any dropout pattern within the threshold budget finishes; beyond it the round aborts
  with the stage and counts;
* robustness: every malformed, replayed or misaddressed message raises ProtocolError and leaves
  the receiver's state untouched, after which the round still completes correctly;
* privacy: the server never holds t seed shares and t key shares of one client, reconstructs
  exactly the secrets it needs, and a masked upload is uniform whatever the input.
"""
from __future__ import annotations

import copy

import os
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from secagg import crypto, shamir
from secagg.encoding import EncodingConfig, FixedPointEncoder
from secagg.graph import is_connected
from secagg.messages import SERVER, AbortError, Message, ProtocolError
from secagg.prg import apply_mask_, random_vector
from secagg.protocols import secagg as sa
from secagg.protocols.base import accusation_matching
from secagg.protocols.secagg import (
    ClientPolicy, SecAggClient, SecAggPlusClient, SecAggPlusServer, SecAggServer,
)
from secagg.ring import FIELD_P31, RING_2_32
from secagg.simulate import run_round

PROTOCOLS = {"secagg": (SecAggServer, SecAggClient), "secagg+": (SecAggPlusServer, SecAggPlusClient)}
STAGES = ("advertise", "share", "check", "masked", "consistency", "unmask")
PROPS = settings(max_examples=25, deadline=None)


# ---- helpers -------------------------------------------------------------------------------------
@dataclass
class Setup:
    server: SecAggPlusServer
    clients: dict
    inputs: dict
    accepted: dict = field(default_factory=lambda: defaultdict(dict))  # stage -> sender -> Message

    def expected_sum(self, contributors) -> np.ndarray:
        acc = np.zeros(self.server.length, dtype=np.uint32)
        for c in contributors:
            RING_2_32.add_(acc, self.inputs[c])
        return acc

    @property
    def t(self) -> int:
        return self.server.threshold


def make(protocol: str, n: int, d: int, *, round_id: int = 1, ids=None, inputs=None,
         server_kwargs=None, client_kwargs=None) -> Setup:
    server_cls, client_cls = PROTOCOLS[protocol]
    ids = list(ids) if ids is not None else list(range(1, n + 1))
    inputs = inputs if inputs is not None else {c: random_vector(RING_2_32, d) for c in ids}
    server = server_cls(round_id=round_id, clients=ids, length=d, **(server_kwargs or {}))
    clients = {c: client_cls(client_id=c, round_id=round_id, input_fn=lambda c=c: inputs[c], **(client_kwargs or {}))
               for c in ids}
    s = Setup(server, clients, inputs)
    real_accept = server.accept

    def recording_accept(msg):
        real_accept(msg)
        s.accepted[server.stage][msg.sender] = msg

    server.accept = recording_accept  # type: ignore[method-assign]
    return s


def budget(server: SecAggPlusServer) -> int:
    """Drops any pattern of which is always survivable: k + 1 - t (k = degree)."""
    k = len(next(iter(server.graph.values())))
    return k + 1 - server.threshold


def snapshot(obj) -> dict:
    out = {}
    for k, v in vars(obj).items():
        content = dict(v) if isinstance(v, dict) else (frozenset(v) if isinstance(v, set) else None)
        out[k] = (v, content)
    return out


def assert_unchanged(obj, snap: dict) -> None:
    now = vars(obj)
    assert now.keys() == snap.keys(), f"attributes added/removed: {now.keys() ^ snap.keys()}"
    for k, (v, content) in snap.items():
        assert now[k] is v, f"attribute '{k}' was rebound"
        if isinstance(content, dict):
            assert now[k].keys() == content.keys() and all(now[k][x] is content[x] for x in content), k
        elif content is not None:
            assert frozenset(now[k]) == content, k


# what the envelope checks and the schema say (patterns for pytest.raises' match)
ROUND, TO, FROM = "message for round", "message addressed to", r"message from \d+, expected 0"
KIND, EXTRA, MISSING = r"unexpected '\w+' message", r"fields wrong: missing \[\], extra \['extra'\]", \
    r"fields wrong: missing \['"


def refuse(receiver, action, bad, match: str) -> None:
    """`action(bad)` must raise ProtocolError matching `match` and leave `receiver` exactly as it was."""
    snap = snapshot(receiver)
    with pytest.raises(ProtocolError, match=match):
        action(bad)
    assert_unchanged(receiver, snap)


def faulted(server, bad: Message, cid: int, match: str) -> None:
    """`bad` raises ProtocolError matching `match` and drops client `cid` at once, with the stage and
    reason recorded; then the server's bookkeeping is put back, to test the next variant."""
    saved = {k: copy.copy(getattr(server, k)) for k in ("_expected", "_replies", "_faulty", "_dropped")}
    assert cid in server.waiting_for()
    with pytest.raises(ProtocolError, match=match):
        server.accept(bad)
    assert cid not in server.waiting_for()
    assert server._faulty[cid].startswith(f"{server.stage}: ")
    assert cid in server._dropped[server.stage]
    for k, v in saved.items():
        setattr(server, k, v)


def remake(m: Message, *, fields=None, **env) -> Message:
    return Message(kind=env.get("kind", m.kind), round=env.get("round", m.round), sender=env.get("sender", m.sender),
                   receiver=env.get("receiver", m.receiver), fields=dict(m.fields) if fields is None else fields)


def with_field(m: Message, name: str, value) -> Message:
    return remake(m, fields={**m.fields, name: value})


def drive(s: Setup, *, drop_at=None, bad_requests=None, bad_replies=None):
    """run_round, plus hooks that feed hostile variants before each genuine message."""
    drop_at = drop_at or {}
    gone: set[int] = set()
    requests = s.server.start()
    while requests:
        stage = s.server.stage
        gone |= drop_at.get(stage, set())
        for cid, req in requests.items():
            if cid in gone:
                continue
            client = s.clients[cid]
            if bad_requests:
                for bad, match in bad_requests(stage, cid, req):
                    refuse(client, client.handle, bad, match)
            reply = client.handle(req)
            if bad_replies:
                for bad, faults, match in bad_replies(stage, cid, reply):
                    if faults:
                        faulted(s.server, bad, cid, match)
                    else:
                        refuse(s.server, s.server.accept, bad, match)
            s.server.accept(reply)
        requests = s.server.advance()
    return s.server.result()


def check_result(s: Setup, res, *, contributors=None) -> None:
    if contributors is not None:
        assert res.contributors == frozenset(contributors)
    assert np.array_equal(res.ring_sum, s.expected_sum(res.contributors))


def share_counts(s: Setup) -> tuple[dict, dict]:
    seeds, keys = defaultdict(int), defaultdict(int)
    for m in s.accepted.get("unmask", {}).values():
        for u in m["seed_shares"]:
            seeds[u] += 1
        for u in m["key_shares"]:
            keys[u] += 1
    return seeds, keys


def assert_never_both(s: Setup) -> None:
    seeds, keys = share_counts(s)
    for c in s.clients:
        assert not (seeds[c] >= s.t and keys[c] >= s.t), f"server can unmask client {c} twice"
        assert seeds[c] == 0 or keys[c] == 0, f"an honest server asked for both secrets of {c}"


# ---- correctness and liveness --------------------------------------------------------------------
@st.composite
def dropout_scenario(draw, *, within_budget: bool):
    protocol = draw(st.sampled_from(sorted(PROTOCOLS)))
    n = draw(st.integers(3, 30))
    d = draw(st.integers(1, 300))
    round_id = draw(st.integers(0, 2**40))
    s = make(protocol, n, d, round_id=round_id)
    cap = budget(s.server) if within_budget else n
    k = draw(st.integers(0, cap))
    dropped = draw(st.permutations(list(s.clients)))[:k]
    stages = [draw(st.sampled_from(STAGES)) for _ in dropped]
    drop_at = defaultdict(set)
    for c, stg in zip(dropped, stages):
        drop_at[stg].add(c)
    return s, dict(drop_at)


@PROPS
@given(dropout_scenario(within_budget=True))
def test_secure_sum_equals_plain_sum_for_any_dropouts_within_budget(scenario):
    s, drop_at = scenario
    res = run_round(s.server, s.clients, drop_at=drop_at)
    gone_before_unmask = set().union(*(drop_at.get(x, set()) for x in ("advertise", "share", "check", "masked")))  # noqa: E501
    check_result(s, res, contributors=set(s.clients) - gone_before_unmask)
    for stage, ids in drop_at.items():
        assert res.dropped[stage] == frozenset(ids)
    assert_never_both(s)


@PROPS
@given(dropout_scenario(within_budget=False))
def test_any_dropout_pattern_gives_a_correct_sum_or_an_abort(scenario):
    s, drop_at = scenario
    try:
        res = run_round(s.server, s.clients, drop_at=drop_at)
    except AbortError as e:
        assert e.stage in STAGES
        # either too few clients, or a disconnected survivor graph, or one survivor whose live
        # neighbourhood fell below t after it had uploaded (it can then be unmasked by nobody)
        assert (e.survivors < e.required or "disconnected" in str(e) or "masking partners" in str(e)
                or "could cut" in str(e))
    else:
        gone = set().union(*drop_at.values()) - drop_at.get("consistency", set()) - drop_at.get("unmask", set())
        assert not res.contributors & gone
        assert len(res.contributors) >= s.server.min_clients
        assert is_connected(s.server.graph, res.contributors)
        check_result(s, res)
    assert_never_both(s)


@settings(max_examples=15, deadline=None)
@given(st.sampled_from(sorted(PROTOCOLS)), st.integers(3, 20), st.integers(1, 64), st.data())
def test_decoded_weighted_mean_over_contributors(protocol, n, d, data):
    enc = FixedPointEncoder(EncodingConfig(clip=data.draw(st.floats(0.1, 100.0)), max_weight=10.0, max_clients=64))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))  # test data only
    xs = {c: rng.normal(0, enc.config.clip, size=d) for c in range(1, n + 1)}
    ws = {c: float(rng.uniform(0.1, 10.0)) for c in xs}
    inputs = {c: enc.encode(xs[c], weight=ws[c])[0] for c in xs}
    s = make(protocol, n, d + 1, inputs=inputs)
    drop = data.draw(st.permutations(list(xs)))[: budget(s.server)]
    drop_at = {"masked": set(drop[: len(drop) // 2]), "unmask": set(drop[len(drop) // 2:])}
    res = run_round(s.server, s.clients, drop_at=drop_at)
    out = enc.decode(res.ring_sum)
    contrib = sorted(res.contributors)
    assert set(contrib) == set(xs) - drop_at["masked"]
    W = sum(ws[c] for c in contrib)
    exact = sum(ws[c] * np.clip(xs[c], -enc.config.clip, enc.config.clip) for c in contrib) / W
    assert np.max(np.abs(out.mean - exact)) <= enc.mean_error_bound(n_clients=len(contrib), total_weight=W)


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
@pytest.mark.parametrize("stage", STAGES)
def test_single_dropout_at_each_stage(protocol, stage):
    s = make(protocol, 12, 50)
    res = run_round(s.server, s.clients, drop_at={stage: {5}})
    check_result(s, res, contributors=set(range(1, 13)) - ({5} if stage not in ("consistency", "unmask") else set()))
    assert res.dropped == {stage: frozenset({5})}
    assert_never_both(s)


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_dropouts_at_every_stage_in_one_round(protocol):
    s = make(protocol, 30, 40)
    b = budget(s.server)
    assert b >= 4
    drop_at = {"advertise": {1}, "share": {2}, "masked": {3}, "unmask": {4}}
    res = run_round(s.server, s.clients, drop_at=drop_at)
    check_result(s, res, contributors=set(range(5, 31)) | {4})
    assert_never_both(s)


def test_secagg_tolerates_exactly_n_minus_t_drops_and_no_more():
    s = make("secagg", 10, 8)
    assert s.t == 6 and budget(s.server) == 4
    res = run_round(s.server, s.clients, drop_at={"masked": {1, 2, 3, 4}})
    check_result(s, res, contributors=range(5, 11))
    for stage in STAGES:
        s = make("secagg", 10, 8)
        with pytest.raises(AbortError, match=f"round aborted at stage '{stage}': [0-5] clients left, 6 required") as e:
            run_round(s.server, s.clients, drop_at={stage: {1, 2, 3, 4, 5}})
        assert e.value.stage == stage
        assert e.value.required == 6 and e.value.survivors < 6
        if stage in ("masked", "unmask"):
            assert e.value.survivors == 5


def test_too_many_drops_spread_over_stages_abort_where_the_budget_runs_out():
    s = make("secagg", 10, 8)
    with pytest.raises(AbortError, match="round aborted at stage 'masked': 5 clients left, 6 required") as e:
        run_round(s.server, s.clients, drop_at={"advertise": {1, 2}, "share": {3, 4}, "masked": {5}})
    assert (e.value.stage, e.value.survivors, e.value.required) == ("masked", 5, 6)
    assert_never_both(s)


def test_unmask_abort_when_a_dropped_clients_key_holders_are_gone():
    """Cycle (k=2, t=2): v and one neighbour drop at 'masked', so v's key has a single live holder."""
    s = make("secagg+", 10, 8, server_kwargs=dict(degree=2))
    assert s.t == 2
    v = 1
    a, b = sorted(s.server.graph[v])
    with pytest.raises(AbortError, match=r"stage 'unmask': .*\(not enough shares to unmask client 1\)") as e:
        run_round(s.server, s.clients, drop_at={"masked": {v, a}})
    assert e.value.stage == "unmask" and (e.value.survivors, e.value.required) == (1, 2)
    assert_never_both(s)


def test_secagg_plus_refuses_to_unmask_a_disconnected_survivor_set():
    """Partial sums over components would leak: the server must abort instead."""
    s = make("secagg+", 10, 8, server_kwargs=dict(degree=2))
    g = s.server.graph
    order = [1]
    while len(order) < 10:  # walk the cycle
        order.append(next(v for v in sorted(g[order[-1]]) if v not in order))
    cut = {order[0], order[5]}
    with pytest.raises(AbortError, match="disconnected") as e:
        run_round(s.server, s.clients, drop_at={"masked": cut})
    assert e.value.stage == "masked"
    assert "unmask" not in s.accepted  # nothing was revealed


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_too_few_clients_abort_at_start(protocol):
    s = make(protocol, 1, 4)
    with pytest.raises(AbortError, match="round aborted at stage 'advertise': 1 clients left, 2 required") as e:
        s.server.start()
    assert e.value.stage == "advertise" and e.value.survivors == 1
    s = make(protocol, 5, 4, server_kwargs=dict(min_clients=6))
    with pytest.raises(AbortError, match="round aborted at stage 'advertise': 5 clients left, 6 required"):
        s.server.start()


def test_two_clients_are_the_minimum_and_any_drop_aborts():
    s = make("secagg", 2, 4)
    check_result(s, run_round(s.server, s.clients), contributors={1, 2})
    s = make("secagg", 2, 4)
    with pytest.raises(AbortError, match="round aborted at stage 'masked': 1 clients left, 2 required"):
        run_round(s.server, s.clients, drop_at={"masked": {2}})


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
@pytest.mark.parametrize("which", ["both", "masking_half"])
def test_duplicate_public_keys_drop_every_advertiser_and_the_round_goes_on(protocol, which):
    """Two insiders advertising the same round keys (each may sign them with its own identity):
    nobody can tell whose keys they are, so both are dropped and the others finish."""
    s = make(protocol, 10, 4)
    real = s.server.accept
    seen: dict[int, bytes] = {}

    def copy(msg):
        if s.server.stage == "advertise":
            seen[msg.sender] = msg["keys"]
            if msg.sender == 3 and 2 in seen:
                keys = seen[2] if which == "both" else msg["keys"][:32] + seen[2][32:]
                msg = with_field(msg, "keys", keys)
        real(msg)

    s.server.accept = copy  # type: ignore[method-assign]
    res = run_round(s.server, s.clients)
    assert {2, 3} <= set(res.faulty) and all("all advertised" in res.faulty[c] for c in (2, 3))
    check_result(s, res, contributors=set(range(1, 11)) - {2, 3})


def test_server_configuration_is_validated():
    with pytest.raises(ValueError, match="use LightSecAgg for a prime field"):
        SecAggServer(round_id=1, clients=[1, 2, 3], length=4, ring=FIELD_P31)
    for f in (-0.1, 1.0, 1.5):
        with pytest.raises(ValueError, match=r"threshold_fraction must be in \[0, 1\)"):
            SecAggPlusServer(round_id=1, clients=[1, 2, 3], length=4, threshold_fraction=f)
    with pytest.raises(ValueError, match="client ids must be distinct positive ints"):
        SecAggServer(round_id=1, clients=[1, 1, 2], length=4)
    with pytest.raises(ValueError, match="client ids must be distinct positive ints"):
        SecAggServer(round_id=1, clients=[0, 1, 2], length=4)
    with pytest.raises(ValueError, match="vector length must be positive"):
        SecAggServer(round_id=1, clients=[1, 2], length=0)


@pytest.mark.parametrize("n", [10, 30])
def test_graph_guarantees_at_the_sizes_used(n):
    s = make("secagg+", n, 4)
    g = s.server.graph
    degrees = {len(v) for v in g.values()}
    assert len(degrees) == 1
    (k,) = degrees
    assert k == min(n - 1, sa.default_degree(n))
    assert all(c not in g[c] and all(c in g[v] for v in g[c]) for c in g)
    assert s.t > (k + 1) / 2  # honest majority of every neighbourhood is needed to unmask
    rnd = np.random.default_rng(0)  # test sampling only
    for _ in range(50):
        removed = set(rnd.choice(list(g), size=k - 1, replace=False).tolist())
        assert is_connected(g, set(g) - removed)
    c = SecAggServer(round_id=1, clients=range(1, n + 1), length=4).graph
    assert all(len(v) == n - 1 for v in c.values())


def test_masked_upload_structure_self_masks_hide_the_total():
    """Before unmasking, sum(y) = sum(x) + sum PRG(b_u): pairwise masks cancel, self masks do not."""
    s = make("secagg", 5, 64)
    requests = s.server.start()
    while s.server.stage != "unmask":
        for cid, req in requests.items():
            s.server.accept(s.clients[cid].handle(req))
        requests = s.server.advance()
    total = np.zeros(64, dtype=np.uint32)
    for m in s.accepted["masked"].values():
        RING_2_32.add_(total, m["vector"])
    assert not np.array_equal(total, s.expected_sum(s.clients))
    for c, cl in s.clients.items():
        apply_mask_(total, sa._self_mask_key(s.server.round_id, c, cl.seed), RING_2_32, sign=-1)
    assert np.array_equal(total, s.expected_sum(s.clients))


def test_client_does_not_modify_its_input_buffer():
    s = make("secagg+", 6, 32)
    before = {c: v.copy() for c, v in s.inputs.items()}
    run_round(s.server, s.clients)
    assert all(np.array_equal(s.inputs[c], before[c]) for c in before)


def test_rounds_are_independent():
    """Same ids and inputs, two rounds: different masked uploads, same sums."""
    inputs = {c: random_vector(RING_2_32, 32) for c in range(1, 6)}
    ups = []
    for r in (1, 2):
        s = make("secagg", 5, 32, round_id=r, inputs=inputs)
        check_result(s, run_round(s.server, s.clients), contributors=range(1, 6))
        ups.append(s.accepted["masked"][1]["vector"])
    assert not np.array_equal(ups[0], ups[1])


# ---- hostile replies to the server ----------------------------------------------------------------
def _bad_replies_for(s: Setup):
    other_stage_kind = {"advertise": "shares", "share": "share_check", "check": "masked_input",
                        "masked": "unmask_shares", "consistency": "unmask_shares", "unmask": "advertise_keys"}

    def bad(stage, cid, reply):
        """(variant, whether it drops its sender, what the refusal says): envelope errors (late, replayed,
        misaddressed or from someone else) are discarded; a reply that is the sender's own and malformed
        drops it."""
        envelope = [
            (remake(reply, round=reply.round + 1), ROUND),
            (remake(reply, round=reply.round - 1), ROUND),
            (remake(reply, receiver=cid), TO),
            (remake(reply, sender=999), "client 999 is not expected"),
            (remake(reply, sender=SERVER), "client 0 is not expected"),
            (remake(reply, kind=other_stage_kind[stage]), KIND),
        ]
        out = [
            (with_field(reply, "extra", 1), EXTRA),
            (remake(reply, fields={}), MISSING),
        ]
        if stage == "advertise":
            k = reply["keys"]
            out += [(with_field(reply, "keys", k[:-1]), r"field 'keys' has \d+ bytes"),
                    (with_field(reply, "keys", k + b"\0"), r"field 'keys' has \d+ bytes"),
                    (with_field(reply, "keys", k.hex()), "field 'keys' must be bytes")]
        elif stage == "share":
            cts = dict(reply["ciphertexts"])
            some = next(iter(cts))
            wrong, invalid = "sent shares for the wrong set of neighbours", "sent shares of the wrong size"
            out += [
                (with_field(reply, "ciphertexts", {v: c for v, c in cts.items() if v != some}), wrong),
                (with_field(reply, "ciphertexts", {**cts, 10_000: cts[some]}), wrong),
                (with_field(reply, "ciphertexts", {**cts, cid: cts[some]}), wrong),
                (with_field(reply, "ciphertexts", {**cts, some: cts[some][:-1]}), invalid),
                (with_field(reply, "ciphertexts", {**cts, some: cts[some] + b"\0"}), invalid),
            ]
        elif stage == "check":
            bad_ = reply["bad_shares"]
            none = "reports bad shares from clients that sent it none"
            out += [
                (with_field(reply, "bad_shares", bad_ + (10_000,)), none),   # a client that sent it nothing
                (with_field(reply, "bad_shares", bad_ + (cid,)), none),      # itself
                (with_field(reply, "bad_shares", list(bad_)), "field 'bad_shares' must be a tuple"),
            ]
        elif stage == "masked":
            v = reply["vector"]
            length, array = "masked input of length", "field 'vector' must be a 1-D uint32 array"
            out += [
                (with_field(reply, "vector", v[:-1]), length),
                (with_field(reply, "vector", np.concatenate([v, v[:1]])), length),
                (with_field(reply, "vector", v.astype(np.int64)), array),
                (with_field(reply, "vector", v.astype(np.float32)), array),
                (with_field(reply, "vector", v.reshape(1, -1)), array),
                (with_field(reply, "vector", v.tolist()), array),
                (with_field(reply, "vector", v.tobytes()), array),
            ]
        elif stage == "consistency":
            out += [(with_field(reply, "signature", b"\1" * 65), "field 'signature' has 65 bytes"),
                    (with_field(reply, "signature", "sig"), "field 'signature' must be bytes")]
        elif stage == "unmask":
            seeds, keys = dict(reply["seed_shares"]), dict(reply["key_shares"])
            some = next(iter(seeds))
            wrong = "returned shares for the wrong clients"
            out += [
                (with_field(reply, "seed_shares", {u: b for u, b in seeds.items() if u != some}), wrong),
                (with_field(reply, "seed_shares", {**seeds, 10_000: seeds[some]}), wrong),
                (with_field(reply, "seed_shares", {**seeds, some: b"\xff" * 32}), "field element out of range"),  # >= q
                (with_field(reply, "seed_shares", {**seeds, some: seeds[some][:31]}),
                 "field 'seed_shares' has an invalid value"),
                (with_field(reply, "key_shares", {**keys, some: seeds[some]}), wrong),  # both secrets of one client
                (with_field(reply, "key_shares", {**keys, cid: seeds[some]}), wrong),
            ]
            if keys:
                k0 = next(iter(keys))
                out += [(with_field(reply, "key_shares", {u: b for u, b in keys.items() if u != k0}), wrong),
                        (with_field(reply, "seed_shares", {**seeds, k0: keys[k0]}), wrong)]
        return [(m, False, why) for m, why in envelope] + [(m, True, why) for m, why in out]

    return bad


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_server_refuses_malformed_replies_and_still_finishes(protocol):
    s = make(protocol, 7, 16)
    res = drive(s, drop_at={"masked": {7}}, bad_replies=_bad_replies_for(s))
    check_result(s, res, contributors=range(1, 7))


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_server_refuses_replays_late_replies_and_replies_after_the_end(protocol):
    s = make(protocol, 6, 16)
    history: list[Message] = []
    requests = s.server.start()
    while requests:
        stage = s.server.stage
        for cid, req in requests.items():
            if stage == "share" and cid == 6:
                continue  # 6 drops at 'share' ...
            reply = s.clients[cid].handle(req)
            s.server.accept(reply)
            refuse(s.server, s.server.accept, reply, "duplicate '")  # exact replay within the stage
            for old in history:                                       # replies from earlier stages
                refuse(s.server, s.server.accept, old, f"duplicate '|{KIND}")
            history.append(reply)
            if stage == "masked" and cid == 1:
                # ... and its late masked input is not accepted
                late = Message("masked_input", s.server.round_id, 6, SERVER, {"vector": s.inputs[6].copy()})
                refuse(s.server, s.server.accept, late, "client 6 is not expected in stage 'masked'")
        requests = s.server.advance()
    check_result(s, s.server.result(), contributors=range(1, 6))
    for old in history[-3:]:
        with pytest.raises(ProtocolError, match="round already finished"):
            s.server.accept(old)


def test_replies_from_another_round_are_refused():
    s1, s2 = make("secagg", 4, 8, round_id=1), make("secagg", 4, 8, round_id=2)
    r1 = s1.server.start()
    r2 = s2.server.start()
    foreign = {c: s1.clients[c].handle(r1[c]) for c in r1}
    for c, req in r2.items():
        refuse(s2.server, s2.server.accept, foreign[c], "message for round 1, current round is 2")
        s2.server.accept(s2.clients[c].handle(req))


def test_reply_before_the_round_starts_is_a_protocol_error():
    s = make("secagg", 3, 4)
    with pytest.raises(ProtocolError, match=r"no stage is open \(stage 'init'\)"):
        s.server.accept(Message("advertise_keys", 1, 1, SERVER, {"keys": os.urandom(64)}))


def test_server_refuses_low_order_advertised_keys():
    good_c = crypto.KeyPair.generate().public_bytes
    for keys in (bytes(64), good_c + bytes(32)):
        s = make("secagg", 3, 4)  # a fresh round each: the first refusal drops client 1
        s.server.start()
        with pytest.raises(ProtocolError, match=r"client 1 advertised an invalid \(low-order\) public key"):
            s.server.accept(Message("advertise_keys", 1, 1, SERVER, {"keys": keys, "signature": b""}))


# ---- hostile requests to a client -----------------------------------------------------------------
def _bad_requests_for(s: Setup, foreign: dict, exercised: set):
    """Variants of every request; `foreign` holds ciphertexts of the same clients from another round.
    The names of the ciphertext attacks actually mounted are added to `exercised`."""
    other_kind = {"advertise": "share_request", "share": "check_request", "check": "masked_request",
                  "masked": "unmask_request", "consistency": "unmask_request", "unmask": "advertise_request"}
    sent: dict[tuple[int, int], bytes] = {}  # (sender, receiver) -> ciphertext, learned at 'share'

    def bad(stage, cid, req):
        cl = s.clients[cid]
        others = [c for c in s.clients if c != cid]
        out = [
            (remake(req, round=req.round + 1), ROUND),
            (remake(req, receiver=others[0]), TO),
            (remake(req, sender=others[0]), FROM),
            (remake(req, kind=other_kind[stage]), r"did not expect '\w+' now"),
            (with_field(req, "extra", b""), EXTRA),
            (remake(req, fields={}), MISSING),
        ]
        if stage == "advertise":
            nb = req["neighbours"]
            size = len(nb) + 1
            unsafe, length = r"threshold \d+ unsafe for a neighbourhood", "field 'length' must be an int"
            out += [
                (with_field(req, "neighbours", tuple(sorted(nb + (cid,)))), "contains the client itself"),
                (with_field(req, "neighbours", list(nb)), "field 'neighbours' must be a tuple"),
                (with_field(req, "neighbours", nb + (nb[0],)), "field 'neighbours' has repeated entries"),
                (with_field(req, "threshold", size // 2), unsafe),                             # t <= half: unsafe
                (with_field(req, "colluders", req["threshold"]), "colluders would reach the threshold"),  # c >= t
                (with_field(req, "min_group", 0), "field 'min_group' must be an int"),
                (with_field(req, "threshold", 1), unsafe),
                (with_field(req, "threshold", size + 1), unsafe),
                (with_field(req, "length", cl.max_length + 1), length),
                (with_field(req, "length", 0), length),
            ]
        elif stage == "share":
            keys = dict(req["keys"])
            v0 = next(iter(keys))
            own = cl.c_pair.public_bytes + cl.s_pair.public_bytes
            out += [
                (with_field(req, "keys", {**keys, 10_000: crypto.KeyPair.generate().public_bytes * 2}),
                 "share request names clients that are not neighbours"),
                (with_field(req, "keys", {**keys, v0: own}), "repeated public keys"),                    # own keys
                (with_field(req, "keys", {**keys, next(k for k in keys if k != v0): keys[v0]}), "repeated public keys"),
                (with_field(req, "keys", dict(list(keys.items())[: s.t - 2])), r"only \d+ neighbours left"),  # below t
                (with_field(req, "keys", {**keys, v0: keys[v0][:-1]}), "field 'keys' has an invalid value"),
            ]
        elif stage == "check":
            # (ciphertexts that fail authentication are not refused but reported: see
            # test_a_share_that_fails_authentication_drops_its_sender_not_the_round)
            cts = dict(req["ciphertexts"])
            u0 = next(iter(cts))
            out += [
                (with_field(req, "ciphertexts", {**cts, 10_000: cts[u0]}),                   # unannounced sender
                 "ciphertexts from clients whose keys were not announced"),
                (with_field(req, "ciphertexts", dict(list(cts.items())[: s.t - 2])), r"only \d+ neighbours shared"),
                (with_field(req, "ciphertexts", {**cts, u0: cts[u0][:-1]}),                  # wrong size
                 "relayed ciphertexts of the wrong size"),
            ]
            exercised.add("check")
        elif stage == "masked":
            mask_with = req["mask_with"]
            no_share = "names clients whose shares this client does not hold"
            out += [
                (with_field(req, "mask_with", tuple(sorted(mask_with + (10_000,)))), no_share),  # holds no share
                (with_field(req, "mask_with", tuple(sorted(mask_with + (cid,)))), no_share),     # itself
                (with_field(req, "mask_with", mask_with[: s.t - 2]), r"only \d+ neighbours to mask with"),  # below t
                (with_field(req, "mask_with", list(mask_with)), "field 'mask_with' must be a tuple"),
            ]
            exercised.add("masked")
        elif stage == "consistency":
            survivors = req["survivors"]
            masked_with = sorted(cl.masked_with)
            left_out, few = "the survivor set leaves out this client", r"only \d+ survivors"
            out += [
                (with_field(req, "survivors", tuple(c for c in survivors if c != cid)), left_out),   # leaves it out
                (with_field(req, "survivors", tuple(c for c in survivors if c not in masked_with)),  # partners gone
                 f"{left_out}|{few}"),
                (with_field(req, "survivors", tuple(sorted(set(survivors[: s.server.min_clients - 1]) | {cid}))[
                    : s.server.min_clients - 1]), f"{left_out}|{few}"),                              # below the minimum
                (with_field(req, "survivors", list(survivors)), "field 'survivors' must be a tuple"),
            ]
            exercised.add("consistency")
        elif stage == "unmask":
            sigs = dict(req["signatures"])
            out += [
                (with_field(req, "signatures", {**sigs, 10_000: b"\0" * 64, "x": b""}),
                 "field 'signatures' has an invalid key"),
                (with_field(req, "signatures", list(sigs.items())), "field 'signatures' must be a map"),
            ]
        return out

    return bad


def _foreign_ciphertexts(protocol: str, ids) -> dict:
    """Share ciphertexts (sender, receiver) -> blob from a round 2 among the same client ids."""
    f = make(protocol, len(ids), 8, round_id=2, ids=ids)
    reqs = f.server.start()
    for c, r in reqs.items():
        f.server.accept(f.clients[c].handle(r))
    reqs = f.server.advance()
    out = {}
    for c, r in reqs.items():
        m = f.clients[c].handle(r)
        for v, ct in m["ciphertexts"].items():
            out[(c, v)] = ct
    return out


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_client_refuses_hostile_requests_and_the_round_still_finishes(protocol):
    ids = list(range(1, 8))
    s = make(protocol, 7, 16, ids=ids)
    exercised: set[str] = set()
    res = drive(s, drop_at={"masked": {7}},
                bad_requests=_bad_requests_for(s, _foreign_ciphertexts(protocol, ids), exercised))
    check_result(s, res, contributors=range(1, 7))
    assert exercised == {"check", "masked", "consistency"}


def _tampered(variant: str, *, cts: dict, cid: int, u0: int, sent: dict, foreign: dict) -> bytes:
    """A ciphertext presented to `cid` as u0's share that must fail authentication there."""
    if variant == "flipped":
        flipped = bytearray(cts[u0])
        flipped[len(flipped) // 2] ^= 0x01
        return bytes(flipped)
    if variant == "reflected":
        return sent[(cid, u0)]                   # what cid itself sent to u0
    if variant == "redirected":
        return next(ct for (snd, rcv), ct in sent.items() if snd == u0 and rcv != cid)
    return foreign[(u0, cid)]                    # u0's share for cid in another round


@pytest.mark.parametrize("variant", ["flipped", "reflected", "redirected", "replayed"])
@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_a_share_that_fails_authentication_drops_both_ends_not_the_round(protocol, variant):
    """The server cannot tell whether the sender spoiled the share or the receiver lies: both go,
    recorded as a dispute (neither is blamed), and the round goes on."""
    ids = list(range(1, 8))
    s = make(protocol, 7, 16, ids=ids)
    foreign = _foreign_ciphertexts(protocol, ids)
    victim, u0 = 1, None
    requests = s.server.start()
    while requests:
        if s.server.stage == "check":
            sent = {(snd, rcv): ct for rcv, r in requests.items() for snd, ct in r["ciphertexts"].items()}
            cts = dict(requests[victim]["ciphertexts"])
            u0 = max(cts)
            cts[u0] = _tampered(variant, cts=cts, cid=victim, u0=u0, sent=sent, foreign=foreign)
            requests[victim] = with_field(requests[victim], "ciphertexts", cts)
        for cid, req in requests.items():
            s.server.accept(s.clients[cid].handle(req))
        requests = s.server.advance()
    res = s.server.result()
    assert s.accepted["check"][victim]["bad_shares"] == (u0,)
    assert res.faulty.keys() == {u0, victim} and all("disputed" in why for why in res.faulty.values())
    assert res.disputes == ((victim, u0),)
    assert res.dropped == {"check": frozenset({u0, victim})}
    check_result(s, res, contributors=set(ids) - {u0, victim})
    assert_never_both(s)  # u0's masking key was rebuilt, its self-mask seed never asked for


@pytest.mark.parametrize("spoiled", ["all", "all_but_one", "half"])
@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_a_client_whose_shares_fail_for_many_neighbours_costs_one_honest_seat_at_most(protocol, spoiled):
    """The attack campaign's case: u0 corrupts its sealed shares for every neighbour (then nobody
    holds a share of its masking key, so nobody may have masked with it), all but one, or half:
    u0 goes with the first of its accusers, the others stay."""
    s = make(protocol, 9, 16)
    u0 = 4
    requests = s.server.start()
    victims: set[int] = set()
    while requests:
        if s.server.stage == "check":
            senders_to = {rcv for rcv, r in requests.items() if u0 in r["ciphertexts"]}
            victims = set(sorted(senders_to)[: {"all": len(senders_to), "all_but_one": len(senders_to) - 1,
                                                "half": len(senders_to) // 2}[spoiled]])
            for rcv in victims:
                cts = dict(requests[rcv]["ciphertexts"])
                cts[u0] = _tampered("flipped", cts=cts, cid=rcv, u0=u0, sent={}, foreign={})
                requests[rcv] = with_field(requests[rcv], "ciphertexts", cts)
        for cid, req in requests.items():
            s.server.accept(s.clients[cid].handle(req))
        requests = s.server.advance()
    res = s.server.result()
    first = min(victims)
    assert victims and res.faulty.keys() == {u0, first} and res.disputes == ((first, u0),)
    check_result(s, res, contributors=set(s.clients) - {u0, first})
    assert_never_both(s)


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_one_client_accusing_many_costs_one_honest_seat_at_most(protocol):
    """A liar naming every neighbour as a bad sharer goes, with the first it named; the rest stay."""
    s = make(protocol, 7, 16)
    liar = 3
    requests = s.server.start()
    while requests:
        for cid, req in requests.items():
            reply = s.clients[cid].handle(req)
            if s.server.stage == "check" and cid == liar:
                reply = with_field(reply, "bad_shares", tuple(sorted(req["ciphertexts"])))
            s.server.accept(reply)
        requests = s.server.advance()
    res = s.server.result()
    first = min(s.accepted["check"][liar]["bad_shares"])
    assert res.faulty.keys() == {liar, first} and res.disputes == ((liar, first),)
    check_result(s, res, contributors=set(s.clients) - {liar, first})
    assert_never_both(s)


def test_the_accusation_rule_drops_both_ends_of_a_matching():
    drop, matched = accusation_matching({1: frozenset({2}), 3: frozenset({2}), 4: frozenset({5, 6, 7})})
    assert matched == ((1, 2), (4, 5))  # (3, 2) and (4, 6), (4, 7) have a dropped end already
    assert set(drop) == {1, 2, 4, 5} and all("disputed" in why for why in drop.values())
    assert accusation_matching({}) == ({}, ())


@settings(max_examples=80, deadline=None)
@given(st.dictionaries(st.integers(1, 12), st.frozensets(st.integers(1, 12), max_size=5), max_size=8),
       st.frozensets(st.integers(1, 12), max_size=4))
def test_accusations_never_cost_more_honest_seats_than_colluding_ones(accused_by, colluders):
    """Whatever colluders accuse (honest clients accuse only colluders: an honest sender's shares
    always open at an honest receiver), no accusation is left between two kept clients, and the
    honest clients dropped never outnumber the colluders dropped."""
    accused_by = {a: frozenset(u for u in us if u != a and (a in colluders or u in colluders))
                  for a, us in accused_by.items()}
    drop, matched = accusation_matching(accused_by)
    assert all(a in drop or u in drop for a, us in accused_by.items() for u in us)
    honest = set(drop) - colluders
    assert len(honest) <= len(set(drop) & colluders)
    assert {c for pair in matched for c in pair} == set(drop)


def test_client_refuses_replayed_and_out_of_order_requests():
    s = make("secagg", 4, 8)
    seen: list[Message] = []
    requests = s.server.start()
    while requests:
        for cid, req in requests.items():
            cl = s.clients[cid]
            for old in seen:
                if old.receiver == cid:
                    refuse(cl, cl.handle, old, r"did not expect '\w+' now")
            s.server.accept(cl.handle(req))
            refuse(cl, cl.handle, req, r"did not expect '\w+' now")  # the same request again
            seen.append(req)
        requests = s.server.advance()
    check_result(s, s.server.result(), contributors=range(1, 5))
    assert all(cl.finished for cl in s.clients.values())


def test_client_refuses_unsafe_threshold_from_a_misconfigured_server():
    s = make("secagg", 6, 8, server_kwargs=dict(threshold_fraction=0.2))
    reqs = s.server.start()
    assert reqs[1]["threshold"] <= 7 / 2
    for c, r in reqs.items():
        refuse(s.clients[c], s.clients[c].handle, r, "threshold 2 unsafe for a neighbourhood of 6")


def test_client_refuses_a_neighbour_list_containing_itself():
    s = make("secagg+", 10, 8)
    reqs = s.server.start()
    req = reqs[1]
    nb = tuple(sorted(req["neighbours"] + (1,)))
    # the threshold is made safe for the enlarged list, so only the self-entry is wrong
    bad = remake(req, fields={**req.fields, "neighbours": nb, "threshold": len(nb) // 2 + 1})
    with pytest.raises(ProtocolError, match="itself"):
        s.clients[1].handle(bad)
    s.clients[1].handle(req)  # the genuine request is still answered


def test_client_policy_limits_neighbours_and_length():
    s = make("secagg", 6, 8, client_kwargs=dict(policy=ClientPolicy(max_neighbours=3)))
    reqs = s.server.start()
    with pytest.raises(ProtocolError, match="too many"):
        s.clients[1].handle(reqs[1])
    s = make("secagg", 3, 100, client_kwargs=dict(max_length=99))
    reqs = s.server.start()
    with pytest.raises(ProtocolError, match="length"):
        s.clients[1].handle(reqs[1])


def test_client_input_of_the_wrong_shape_is_a_local_error():
    s = make("secagg", 3, 8, inputs={1: np.zeros(7, np.uint32), 2: np.zeros(8, np.uint32), 3: np.zeros(8, np.uint32)})
    with pytest.raises(ValueError, match="ring vector has length 7, expected 8"):
        run_round(s.server, s.clients)


@pytest.mark.parametrize("junk", [b"\x00\x01", None, {"kind": "advertise_request"}])
def test_client_refuses_non_messages(junk):
    s = make("secagg", 3, 4)
    with pytest.raises(ProtocolError, match="not a Message"):
        s.clients[1].handle(junk)


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_client_refuses_low_order_peer_keys_without_changing_state(protocol):
    s = make(protocol, 5, 4)
    reqs = s.server.start()
    for c, r in reqs.items():
        s.server.accept(s.clients[c].handle(r))
    reqs = s.server.advance()
    keys = dict(reqs[1]["keys"])
    v0 = next(iter(keys))
    # a low-order encryption key beside v0's genuine masking key (all-zero halves would be refused as repeated)
    low_order = bytes(crypto.PUBLIC_KEY_BYTES) + keys[v0][crypto.PUBLIC_KEY_BYTES:]
    refuse(s.clients[1], s.clients[1].handle, with_field(reqs[1], "keys", {**keys, v0: low_order}),
           r"peer public key is invalid \(low order\)")


# ---- what the server holds ------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_after_a_masked_dropout_the_server_reconstructs_the_key_only(protocol, monkeypatch):
    s = make(protocol, 12, 32)
    v = 4
    reconstructed: list[int] = []
    real_combine = shamir.combine
    real_decode = sa.reed_solomon.decode_many

    def spy(xs, rows, **kw):
        values, bad = real_decode(xs, rows, **kw)
        reconstructed.extend(values)
        return values, bad

    monkeypatch.setattr(sa.reed_solomon, "decode_many", spy)
    res = run_round(s.server, s.clients, drop_at={"masked": {v}})
    check_result(s, res, contributors=set(range(1, 13)) - {v})
    seeds = {c: cl.seed for c, cl in s.clients.items()}
    keys = {c: cl.s_secret for c, cl in s.clients.items()}
    # exactly: every survivor's self-mask seed, the dropped client's masking key, nothing else
    assert sorted(reconstructed) == sorted([seeds[c] for c in res.contributors] + [keys[v]])
    assert seeds[v] not in reconstructed
    assert not {keys[c] for c in res.contributors} & set(reconstructed)
    seed_n, key_n = share_counts(s)
    assert seed_n[v] == 0 and key_n[v] >= s.t
    assert all(key_n[c] == 0 and seed_n[c] >= s.t for c in res.contributors)
    # the key shares the server holds do reconstruct v's masking key, and v's upload never arrived
    holders = sorted(h for h, m in s.accepted["unmask"].items() if v in m["key_shares"])[: s.t]
    rows = [[shamir.from_bytes(s.accepted["unmask"][h]["key_shares"][v]) for h in holders]]
    assert real_combine(holders, rows) == [keys[v]]
    assert v not in s.accepted["masked"]
    # t - 1 shares are not enough, for the key of v and for the seed of a survivor
    assert real_combine(holders[:-1], [rows[0][:-1]]) != [keys[v]]
    u = min(res.contributors)
    seed_holders = sorted(h for h, m in s.accepted["unmask"].items() if u in m["seed_shares"])[: s.t - 1]
    part = [[shamir.from_bytes(s.accepted["unmask"][h]["seed_shares"][u]) for h in seed_holders]]
    assert real_combine(seed_holders, part) != [seeds[u]]


def test_clients_forget_peer_shares_once_they_have_answered():
    s = make("secagg", 6, 8)
    run_round(s.server, s.clients, drop_at={"masked": {2}})
    assert all(not cl.held for c, cl in s.clients.items() if c != 2)
    assert all(cl.finished for c, cl in s.clients.items() if c != 2)


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_without_dropouts_no_key_share_is_ever_sent(protocol):
    s = make(protocol, 10, 8)
    run_round(s.server, s.clients)
    seeds, keys = share_counts(s)
    assert sum(keys.values()) == 0
    assert all(seeds[c] >= s.t for c in s.clients)


def test_a_client_that_dropped_before_masking_is_never_unmasked_at_all():
    s = make("secagg", 8, 8)
    run_round(s.server, s.clients, drop_at={"share": {3}})
    seeds, keys = share_counts(s)
    assert seeds[3] == 0 and keys[3] == 0


def test_share_ciphertexts_are_the_advertised_size():
    s = make("secagg+", 10, 8)
    run_round(s.server, s.clients)
    for m in s.accepted["share"].values():
        assert all(len(ct) == sa.SHARE_CIPHERTEXT <= 100 for ct in m["ciphertexts"].values())
    for m in s.accepted["advertise"].values():
        assert len(m["keys"]) == 64


# ---- an eavesdropping server learns nothing from masked uploads ---------------------------------------
def _masked_uploads(protocol: str, x1: np.ndarray, rounds: int, n: int = 3) -> list[dict]:
    """Run `rounds` rounds up to the masked stage; return each round's uploads by client."""
    d = x1.shape[0]
    out = []
    for r in range(rounds):
        inputs = {c: x1 if c == 1 else random_vector(RING_2_32, d) for c in range(1, n + 1)}
        s = make(protocol, n, d, round_id=r, inputs=inputs)
        reqs = s.server.start()
        while s.server.stage != "unmask":
            for c, q in reqs.items():
                s.server.accept(s.clients[c].handle(q))
            reqs = s.server.advance()
        out.append({c: m["vector"] for c, m in s.accepted["masked"].items()})
    return out


ZEROS = np.zeros(512, dtype=np.uint32)
HALF = np.full(512, 2**31, dtype=np.uint32)


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_masked_upload_is_uniform_whatever_the_input(protocol):
    for x in (ZEROS, HALF):
        ups = np.concatenate([u[1] for u in _masked_uploads(protocol, x, rounds=40)])
        counts = np.bincount(ups.view(np.uint8), minlength=256)
        assert stats.chisquare(counts).pvalue > 1e-6
        assert stats.kstest(ups / 2.0**32, "uniform").pvalue > 1e-6
        top = int((ups >> np.uint32(31)).sum())
        assert abs(top - ups.size / 2) < 6 * np.sqrt(ups.size / 4)


def test_distinguisher_guessing_the_input_from_the_upload_is_a_coin_flip():
    """Guess 'all 2^31' when most top bits are set, else 'all zeros'. Masking makes it ~50% right."""
    trials = 150
    x = np.zeros(64, dtype=np.uint32)
    y = np.full(64, 2**31, dtype=np.uint32)
    correct = 0
    for truth, vec in ((0, x), (1, y)):
        for u in _masked_uploads("secagg", vec, rounds=trials):
            guess = int((u[1] >> np.uint32(31)).mean() > 0.5)
            correct += guess == truth
    acc = correct / (2 * trials)
    # unmasked, this distinguisher is always right; masked, |acc - 1/2| < 6 sigma (sigma = 0.029)
    assert abs(acc - 0.5) < 6 * 0.5 / np.sqrt(2 * trials)


def test_partial_sums_and_the_total_are_uniform_before_unmasking():
    """The sum over a strict subset of uploads, and even the sum of all of them, hide the inputs."""
    rounds = _masked_uploads("secagg", ZEROS, rounds=30, n=4)
    pair = np.concatenate([(u[1] + u[2]).astype(np.uint32) for u in rounds])
    total = np.concatenate([(u[1] + u[2] + u[3] + u[4]).astype(np.uint32) for u in rounds])
    for v in (pair, total):
        assert stats.chisquare(np.bincount(v.view(np.uint8), minlength=256)).pvalue > 1e-6


def test_upload_is_uncorrelated_with_the_input():
    d = 4096
    x = random_vector(RING_2_32, d)
    (u,) = [r[1] for r in _masked_uploads("secagg+", x, rounds=1, n=4)]
    r = np.corrcoef(x.astype(np.float64), u.astype(np.float64))[0, 1]
    assert abs(r) < 6 / np.sqrt(d)
