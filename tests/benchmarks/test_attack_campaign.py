"""The attack campaign: its schedule is what it claims, the colluding insiders' planning and scoring
agree with the protocols' own state machines, and a short campaign against a real enrolled deployment
meets the goal (every round that can finish does, with the exact sum; no input recovered; accusations
never cost more honest than colluding clients; stalls bounded)."""
from __future__ import annotations

import sys
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import attack_campaign as ac  # noqa: E402
from benchmarks import insider_attacks as ia  # noqa: E402
from secagg.messages import AbortError, Message, ProtocolError  # noqa: E402
from secagg.prg import random_vector  # noqa: E402
from secagg.protocols.lightsecagg import LightSecAggClient, LightSecAggServer  # noqa: E402
from secagg.protocols.secagg import SecAggClient, SecAggPlusClient, SecAggPlusServer, SecAggServer  # noqa: E402
from secagg.ring import FIELD_P31, RING_2_32  # noqa: E402
from transport.adversary import ATTACKS, COUNTED, DROPPED, Coalition  # noqa: E402
from transport.server import StallPolicy  # noqa: E402

COALITION = set(ac.COALITION_ATTACKS) | {"stall", "honest"}


@pytest.mark.parametrize("protocol", ac.QUICK.protocols)
def test_the_quick_schedule_runs_every_attack_and_every_crash_stage_in_rounds_that_can_finish(protocol):
    plans = ac.schedule(ac.QUICK, protocol)
    need = ac.requirement(protocol, ac.QUICK)
    finishing = [p for p in plans[1:] if not p.starved]
    assert [p.starved for p in plans].count(True) == 1 and plans[0].crashes == {}
    expected = set(ac.DROP_ATTACKS) | set(ac.KEEP_ATTACKS) | COALITION
    if protocol == "lightsecagg":
        expected -= {"duplicate_half_key"}  # a single key
    assert {a for p in finishing for a in p.attacks.values()} == expected
    assert {s for p in finishing for s in p.crashes.values()} == set(range(ac.stage_count(protocol)))
    for p in plans:
        if p.simulated:
            assert set(p.attacks.values()) <= {"accuse_classic", "accuse_search"} and not p.crashes
            continue
        live, removed = ac.expected_live(p, ac.QUICK.clients, ac.QUICK.insiders)
        assert need.finishable(live=live, removed=removed) != p.starved
        if p.starved:
            assert need.hopeless(live=live)
    stallers = [p for p in plans if "stall" in p.attacks.values()]
    assert [p.round_id for p in stallers] == [p.round_id for p in plans[-ac.STALL_ROUNDS:]]
    assert ac.STALL_ROUNDS == StallPolicy().evict_after  # stalled long enough to be evicted


def test_the_five_schedule_sets_every_colluder_on_a_victim():
    five = ac.QUICK.five()
    assert len(five.insiders) == 5 and five.honest == 6
    for protocol in ac.QUICK.five_protocols:
        plans = ac.five_schedule(five, protocol)
        assert [set(p.attacks.values()) for p in plans] == [{"honest"}, {"accuse_classic"}, {"accuse_search"}]
        assert ac.server_params(protocol, five)[-2] == "colluders=5"


def test_the_requirement_is_read_from_the_protocol():
    assert ac.requirement("lightsecagg", ac.QUICK) == ac.Requirement(need=6, slack=None)  # max(U, g + c)
    assert ac.requirement("secagg", ac.QUICK) == ac.Requirement(need=6, slack=None)  # max(t, g + c)
    sparse = ac.requirement("secagg+", ac.QUICK)  # degree 6: t = 4, 3 partners, g + c = 5; a cut needs 4 gone
    assert sparse == ac.Requirement(need=5, slack=3)
    assert not sparse.finishable(live=6, removed=4)
    assert ac.server_params("secagg", ac.QUICK) == ("colluders=2", "min_clients=3")
    assert ac.server_params("lightsecagg", ac.QUICK)[-1] == "min_group=3"
    assert ac.client_floors("secagg+", ac.QUICK)["policy"].min_colluders == 2
    assert ac.client_floors("lightsecagg", ac.QUICK) == {"min_colluders": 2, "min_group": 3}


def test_a_schedule_that_cannot_be_judged_is_refused(monkeypatch):
    monkeypatch.setitem(ac.PROTOCOL_PARAMS, "lightsecagg", ("target_survivors=0.9",))  # U = 9 of 10
    with pytest.raises(ValueError, match="neither clearly finishable nor clearly starved"):
        ac.schedule(ac.QUICK, "lightsecagg")  # a crash, a dropped insider and its accuser leave 7


def test_expected_live_counts_crashes_dropping_insiders_and_their_accusers_only_among_participants():
    plan = ac.RoundPlan(5, {1: 2, 3: 0}, {9: "malformed", 10: "replay"})
    assert ATTACKS["replay"].outcome == COUNTED
    assert ac.expected_live(plan, range(1, 11), (9, 10)) == (7, 3)
    assert ac.expected_live(plan, [2, 4, 5, 9, 10], (9, 10)) == (4, 1)
    accused = ac.RoundPlan(6, {1: 2}, {9: "corrupt_shares", 10: "stall"})
    assert ATTACKS["corrupt_shares"].accused_by_honest and ATTACKS["stall"].outcome == DROPPED
    assert ac.expected_live(accused, range(1, 11), (9, 10)) == (6, 4)


# ---- the coalition's planning and scoring, against the protocols in memory ---------------------------

def with_field(m: Message, name: str, value) -> Message:
    return Message(m.kind, m.round, m.sender, m.receiver, {**m.fields, name: value})


def run(server, clients, view, *, rewrite=None, on_stage=None):
    """Drive a round in memory, recording every request in `view`; `on_stage(stage, requests)` sees a
    stage's requests before any client answers, and `rewrite(stage, cid, reply, request)` lets
    colluders change their replies. Returns the result or the AbortError."""
    requests = server.start()
    try:
        while requests:
            stage = server.stage
            for cid, req in requests.items():
                view.observe(cid, req)
            if on_stage is not None:
                on_stage(stage, requests)
            for cid, req in requests.items():
                try:
                    reply = clients[cid].handle(req)
                except ProtocolError:
                    continue
                if rewrite is not None:
                    reply = rewrite(stage, cid, reply, req)
                try:
                    server.accept(reply)
                except ProtocolError:
                    continue
            requests = server.advance()
    except AbortError as exc:
        return exc
    return server.result()


def secagg_round(protocol: str, *, n=10, colluders=(9, 10), **kw):
    server_cls, client_cls = {"secagg": (SecAggServer, SecAggClient),
                              "secagg+": (SecAggPlusServer, SecAggPlusClient)}[protocol]
    ids = list(range(1, n + 1))
    inputs = {c: random_vector(RING_2_32, 8) for c in ids}
    server = server_cls(round_id=5, clients=ids, length=8, colluders=len(colluders), min_clients=3, **kw)
    clients = {c: client_cls(client_id=c, round_id=5, input_fn=lambda c=c: inputs[c]) for c in ids}
    return server, clients, inputs


class Colluders:
    """Plans the colluders' accusations once, from their check requests, and adds them to their replies."""

    def __init__(self, planner, members):
        self.planner, self.members, self.plan = planner, frozenset(members), {}

    def on_stage(self, stage, requests):
        if stage == "check":
            self.plan = self.planner(5, {m: requests[m] for m in self.members if m in requests})

    def rewrite(self, stage, cid, reply, req):
        if stage == "check" and cid in self.members:
            return with_field(reply, "bad_shares", tuple(sorted(self.plan.get(cid, ()))))
        return reply


@pytest.mark.parametrize("attack", ["accuse_classic", "accuse_search"])
@pytest.mark.parametrize("protocol", ["secagg", "secagg+"])
def test_the_replayed_rule_is_the_servers_and_no_accusation_map_exposes_a_victim(protocol, attack):
    """The coalition plans on the server's view; what the real server then does with the accusations
    is exactly `settle`'s prediction, and nobody is left masked only with colluders."""
    colluders = frozenset({9, 10})
    for _ in range(3):  # several random graphs
        server, clients, inputs = secagg_round(protocol, **({"degree": 6} if protocol == "secagg+" else {}))
        view = ia.ServerView()
        planners = ia.Planners(view=view, colluders=colluders, threat=ia.Threat.of(server))
        coalition = Colluders(planners.as_dict()[attack], colluders)
        result = run(server, clients, view, rewrite=coalition.rewrite, on_stage=coalition.on_stage)
        accusations = ia.accusations_made({(5, attack): coalition.plan}, round_id=5)
        rule = ia.settle(graph=view.graph(5), alive=range(1, 11), accusations=accusations, colluders=colluders,
                         threat=ia.Threat.of(server))
        assert planners.log.maps[5] >= 1 and not rule.exposed
        if isinstance(result, AbortError):
            assert not rule.opens
            continue
        assert rule.opens and set(result.faulty) == rule.disputed and result.contributors == rule.kept
        honest_dropped = len(set(result.faulty) - colluders)
        assert honest_dropped <= len(set(result.faulty) & colluders)
        assert not ia.recovered_inputs(contributors=result.contributors, colluders=colluders,
                                       mask_with=server._mask_with, group=3, opened=result.ring_sum,
                                       inputs=inputs.__getitem__, ring=RING_2_32)


def test_the_search_finds_a_victim_where_the_server_would_open_too_few_survivors():
    """Against a server whose survivor minimum ignored the colluders (2 instead of g + c), one
    accusation leaves one honest client among five colluders: the search finds such a map."""
    graph = {c: frozenset(range(1, 8)) - {c} for c in range(1, 8)}  # complete, 7 clients, 5 colluders
    threat = ia.Threat(colluders=5, group=2, survivors=2, partners=1, sparse=False)
    colluders = frozenset({3, 4, 5, 6, 7})
    weak = ia.settle(graph=graph, alive=graph, accusations={3: {1}}, colluders=colluders, threat=threat)
    assert weak.disputed == {1, 3} and weak.kept == {2, 4, 5, 6, 7} and weak.opens
    assert weak.exposed == {2}  # a server opening 2 survivors leaves one honest client among colluders
    view = ia.ServerView()
    for c in graph:
        view.observe(c, Message("advertise_request", 1, 0, c, {"neighbours": tuple(sorted(graph[c]))}))
        view.observe(c, Message("share_request", 1, 0, c, {}))
    requests = {m: Message("check_request", 1, 0, m, {"ciphertexts": {v: b"" for v in graph[m]}}) for m in colluders}
    planners = ia.Planners(view=view, colluders=colluders, threat=threat)
    best = planners.search(1, requests)
    assert planners.log.best[1].exposed == {2} and sum(map(len, best.values())) == 1
    assert planners.log.maps[1] <= ia.MAX_MAPS


def test_the_scoring_catches_the_rule_the_protocols_had_before(monkeypatch):
    """With the accusation rule the protocols replaced (drop only the accused) and no colluders declared,
    five colluders each accusing a different honest client leave one victim among them in an opened
    round: `recovered_inputs` names it, by its partners and by subtraction."""
    from secagg.protocols import base

    def accused_only(accused_by):
        return {u: "accused" for us in accused_by.values() for u in us}, ()

    monkeypatch.setattr(base, "accusation_matching", accused_only)
    ids, colluders = list(range(1, 12)), frozenset(range(7, 12))
    inputs = {c: random_vector(RING_2_32, 8) for c in ids}
    server = SecAggServer(round_id=5, clients=ids, length=8)  # c = 0, g = 2: the old defaults
    clients = {c: SecAggClient(client_id=c, round_id=5, input_fn=lambda c=c: inputs[c]) for c in ids}
    view = ia.ServerView()
    coalition = Colluders(ia.Planners(view=view, colluders=colluders, threat=ia.Threat.of(server)).classic, colluders)
    result = run(server, clients, view, rewrite=coalition.rewrite, on_stage=coalition.on_stage)
    assert coalition.plan == {7: (1,), 8: (2,), 9: (3,), 10: (4,), 11: (5,)}
    assert result.contributors == colluders | {6}
    found = ia.recovered_inputs(contributors=result.contributors, colluders=colluders, mask_with=server._mask_with,
                                group=2, opened=result.ring_sum, inputs=inputs.__getitem__, ring=RING_2_32)
    assert found == {6}


def test_recovered_inputs_finds_the_lone_honest_contributor_and_the_exposed_one():
    inputs = {c: random_vector(RING_2_32, 8) for c in range(1, 6)}
    opened = np.zeros(8, np.uint32)
    for c in (1, 4, 5):
        RING_2_32.add_(opened, inputs[c])
    found = ia.recovered_inputs(contributors={1, 4, 5}, colluders={4, 5}, mask_with=None, group=1, opened=opened,
                                inputs=inputs.__getitem__, ring=RING_2_32)
    assert found == {1}
    masks = {1: frozenset({4, 5}), 2: frozenset({3, 4}), 3: frozenset({2}), 4: frozenset({1, 2}), 5: frozenset({1})}
    assert ia.exposed(contributors=frozenset({1, 2, 3, 4, 5}), colluders=frozenset({4, 5}), mask_with=masks,
                      group=2) == {1}
    small = ia.exposed(contributors=frozenset({1, 2, 3, 9}), colluders=frozenset({9}), mask_with=None, group=4)
    assert small == {1, 2, 3}  # LightSecAgg: fewer than g honest contributors
    assert ia.small_groups(contributors={1, 2, 3, 4, 5}, colluders={4, 5}, mask_with=masks, group=2) == [frozenset({1})]


@pytest.mark.parametrize("unchecked", [False, True])
@pytest.mark.parametrize("protocol", ["secagg", "secagg+", "lightsecagg"])
def test_a_server_withholding_the_victims_partners_opens_nothing(protocol, unchecked):
    colluders = (9, 10)
    if protocol == "lightsecagg":
        ids = list(range(1, 11))
        inputs = {c: random_vector(FIELD_P31, 8) for c in ids}
        cls = ia.withholding_server(LightSecAggServer, colluders=colluders, unchecked=unchecked)
        server = cls(round_id=5, clients=ids, length=8, target_survivors=0.6, colluders=2, min_group=3)
        clients = {c: LightSecAggClient(client_id=c, round_id=5, input_fn=lambda c=c: inputs[c]) for c in ids}
    else:
        base = {"secagg": SecAggServer, "secagg+": SecAggPlusServer}[protocol]
        _, clients, inputs = secagg_round(protocol, **({"degree": 6} if protocol == "secagg+" else {}))
        cls = ia.withholding_server(base, colluders=colluders, unchecked=unchecked)
        server = cls(round_id=5, clients=list(range(1, 11)), length=8, colluders=2, min_clients=3,
                     **({"degree": 6} if protocol == "secagg+" else {}))
    result = run(server, clients, ia.ServerView())
    assert server.victim is not None and server.withheld and not server.withheld & set(colluders)
    assert isinstance(result, AbortError), result  # honest clients (and the server, if it checks) refuse
    assert "withhold" in cls.__name__.lower()


def test_the_campaign_judges_silent_stages_and_bounds_round_time_by_the_honest_clients():
    faulty = {9: "check: disputed: ...", 4: "advertise: advertised a public key ..."}
    assert ia.silent_stages(dropped={"check": [9], "masked": [3], "advertise": [4]}, faulty=faulty) == ["masked"]
    policy = StallPolicy(grace_factor=3.0, min_grace_s=1.0)
    honest = {"advertise": 0.01, "share": 0.02}

    def bound(honest_seconds, server_seconds, waited):
        return ia.round_time_bound(honest_seconds=honest_seconds, server_seconds=server_seconds, waited=waited,
                                   policy=policy)

    assert bound(honest, {"share": 0.01}, []) == pytest.approx(0.08)  # twice the honest round
    assert bound(honest, {}, ["advertise"]) == pytest.approx(1.06)  # and the least grace
    assert bound({"share": 0.5}, {}, ["share"]) == pytest.approx(1.0 + 3.0)  # a grace of 3 x 2 x 0.5

    view = ia.ServerView()
    for kind, received, sent in (("advertise_request", 0.0, 0.01), ("advertise_request", 0.002, 0.012),
                                 ("share_request", 0.05, 0.06), ("check_request", 2.0, 2.01)):
        view.replied(Message(kind, 7, 0, 1, {}), received, sent)
    # each stage from the slowest honest reply of the one before, unless that one held on for a silent client
    assert view.honest_stage_seconds(7) == pytest.approx({"advertise": 0.012, "share": 0.048, "check": 1.95})
    assert view.honest_stage_seconds(7, waited=["share"])["check"] == pytest.approx(0.01)


def test_a_coalition_plans_once_per_round_from_every_members_request():
    calls = []

    def planner(round_id, requests):
        calls.append((round_id, sorted(requests)))
        return {m: (1,) for m in requests}

    coalition = Coalition(members=[9, 10], planners={"accuse_search": planner}, wait_s=2.0)
    req = {m: Message("check_request", 3, 0, m, {"ciphertexts": {}}) for m in (9, 10)}
    for m in (9, 10):
        coalition.post(3, m, Message("advertise_request", 3, 0, m, {}))
    out = {}

    def member(m):
        coalition.post(3, m, req[m])
        out[m] = coalition.plan(3, "accuse_search", kind="check_request")

    threads = [threading.Thread(target=member, args=(m,)) for m in (9, 10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert calls == [(3, [9, 10])] and out[9] == out[10] == {9: (1,), 10: (1,)}
    assert coalition.plans == {(3, "accuse_search"): {9: (1,), 10: (1,)}}
    with pytest.raises(ValueError, match="needs members"):
        Coalition(members=[])


# ---- a short campaign -------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_short_campaign_against_secagg_plus_meets_the_goal(tmp_path):
    """Two rotating rounds (one starved), every coalition attack and the stallers against the shipped
    server, then a server that withholds the victim's partners."""
    cfg = replace(ac.QUICK, protocols=("secagg+",), attack_rounds=2, sybils=2, squatters=1, replays=1,
                  flood_mib=128, five_protocols=(), stage_timeout=2.0)  # the starved round waits one timeout
    keys = tmp_path / "keys"
    ac.enrol(keys, clients=cfg.clients)
    phase = ac.run_phase(cfg, "secagg+", keys, tmp_path)
    withheld = ac.run_withholding_phase(cfg, "secagg+", keys)
    summary = ac.summarise([phase, withheld], cfg)
    plans = ac.schedule(cfg, "secagg+")
    assert [r["round"] for r in phase.rounds] == [p.round_id for p in plans]
    assert summary["rounds"] >= len(plans) - 4  # the warm-up and the starved round; accusations may abort
    assert summary["rounds_completed"] == summary["rounds"]
    assert summary["wrong_sums"] == summary["crashes"] == summary["sybil_accepted"] == summary["misjudged"] == 0
    assert summary["recovered_inputs"] == summary["small_groups"] == 0
    assert summary["honest_dropped"] <= summary["colluders_dropped"] and summary["colluders_dropped"] >= 4
    assert summary["rounds_over_bound"] == 0 and summary["max_round_s"] <= summary["round_time_bound_s"]
    assert summary["stallers_not_evicted"] == summary["honest_evicted"] == 0
    assert set(phase.evicted) == {cfg.insiders[-1]}
    assert summary["peak_rss_over_baseline_mb"] < ac.RSS_BOUND_MB
    assert ac.goal_met(summary)
    starved = [r for r in phase.rounds if r["starved"]]
    assert len(starved) == 1 and not starved[0]["completed"]
    assert phase.network["attempts"]["unenrolled_sybil"] == 2 and phase.network["attempts"]["session_replay"] == 1
    faulty = [why for r in phase.rounds if r["completed"] for why in r["faulty"].values()]
    assert any("disputed" in why for why in faulty)
    assert any("advertised a public key that clients" in why for why in faulty)
    assert any("sent wrong seed shares" in why for why in faulty)
    assert [r["completed"] for r in withheld.rounds] == [False, False]
    assert all(v for r in phase.rounds + withheld.rounds for v in r["verdicts"].values())
