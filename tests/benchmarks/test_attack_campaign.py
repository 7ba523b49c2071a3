"""The attack campaign: its schedule is what it claims, and a short campaign against a real enrolled
deployment meets the goal (every round that can finish does, with the exact sum)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import attack_campaign as ac  # noqa: E402
from transport.adversary import ATTACKS, COUNTED  # noqa: E402


@pytest.mark.parametrize("protocol", ac.QUICK.protocols)
def test_the_quick_schedule_runs_every_attack_and_every_crash_stage_in_rounds_that_can_finish(protocol):
    plans = ac.schedule(ac.QUICK, protocol)
    need = ac.requirement(protocol, ac.QUICK.clients, ac.QUICK.dim)
    finishing = [p for p in plans[1:] if not p.starved]
    assert [p.starved for p in plans].count(True) == 1 and plans[0].crashes == {}
    assert {a for p in finishing for a in p.attacks.values()} == set(ac.DROP_ATTACKS) | set(ac.KEEP_ATTACKS)
    assert {s for p in finishing for s in p.crashes.values()} == set(range(ac.stage_count(protocol)))
    for p in plans:
        live, removed = ac.expected_live(p, ac.QUICK.clients, ac.QUICK.insiders)
        assert need.finishable(live=live, removed=removed) != p.starved
        if p.starved:
            assert need.hopeless(live=live)


def test_the_requirement_is_read_from_the_protocol():
    assert ac.requirement("lightsecagg", tuple(range(1, 11)), 10) == ac.Requirement(need=6, slack=None)
    assert ac.requirement("secagg", tuple(range(1, 11)), 10) == ac.Requirement(need=6, slack=None)
    sparse = ac.requirement("secagg+", tuple(range(1, 11)), 10)  # degree 4: t = 3, a neighbourhood of 5
    assert sparse == ac.Requirement(need=3, slack=2)
    assert not sparse.finishable(live=7, removed=3)


def test_a_schedule_that_cannot_be_judged_is_refused(monkeypatch):
    monkeypatch.setitem(ac.PROTOCOL_PARAMS, "lightsecagg", ("target_survivors=0.9",))  # U = 9 of 10
    with pytest.raises(ValueError, match="neither clearly finishable nor clearly starved"):
        ac.schedule(ac.QUICK, "lightsecagg")  # a crash and a dropped insider leave 8


def test_expected_live_counts_crashes_and_dropping_insiders_only_among_participants():
    plan = ac.RoundPlan(5, {1: 2, 3: 0}, {9: "malformed", 10: "replay"})
    assert ATTACKS["replay"].outcome == COUNTED
    assert ac.expected_live(plan, range(1, 11), (9, 10)) == (7, 3)
    assert ac.expected_live(plan, [2, 4, 5, 9, 10], (9, 10)) == (4, 1)


@pytest.mark.slow
def test_a_short_campaign_against_secagg_plus_meets_the_goal(tmp_path):
    cfg = ac.CampaignConfig(protocols=("secagg+",), attack_rounds=4, sybils=2, squatters=1, replays=1,
                            flood_mib=128)
    keys = tmp_path / "keys"
    ac.enrol(keys, clients=cfg.clients)
    phase = ac.run_phase(cfg, "secagg+", keys, tmp_path)
    summary = ac.summarise([phase], cfg)
    assert [r["round"] for r in phase.rounds] == list(range(1, 6))
    assert summary["rounds"] == 3 and summary["rounds_completed"] == 3  # 4 attack rounds, one starved
    assert summary["wrong_sums"] == summary["crashes"] == summary["sybil_accepted"] == summary["misjudged"] == 0
    assert summary["peak_rss_over_baseline_mb"] < ac.RSS_BOUND_MB
    starved = [r for r in phase.rounds if r["starved"]]
    assert len(starved) == 1 and not starved[0]["completed"]
    assert phase.rounds[-1]["completed"]  # the round after the starved one recovered
    assert phase.network["attempts"]["unenrolled_sybil"] == 2 and phase.network["attempts"]["session_replay"] == 1
    faulty = {r["round"]: r["faulty"] for r in phase.rounds if r["completed"]}
    assert any("failed authentication" in why for f in faulty.values() for why in f.values())
