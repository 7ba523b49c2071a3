"""The measurement pipeline (dp.leakage.pipeline) on hand-built transcripts with known token sets."""
import json
import math

import numpy as np
import pytest

from dp.leakage import Transcript
from dp.leakage.pipeline import ledger_epsilons, measure_leakage, recoverable_updates, token_advantage, token_leakage
from dp.ledger import GaussianMechanism, Ledger, LedgerConfig, NonPrivateMechanism, Observer, PrivacyUnit

V, D = 300, 4
TRUTH = {1: frozenset(range(10, 40)) | {200}, 2: frozenset(range(30, 70)) | {250}, 3: frozenset({5}),
         4: frozenset({6})}


def _plain_and_aggregate_round() -> Transcript:
    tr = Transcript(protocol="plain")
    total = np.zeros((V, D))
    for c in (1, 2):
        upd = np.zeros((V, D))
        upd[sorted(TRUTH[c])] = 0.01
        total += upd / 2
        tr.record_individual(1, c, "embedding", upd.ravel())
    tr.record_aggregate(1, "embedding", total.ravel(), contributors=[1, 2], total_weight=2.0)
    return tr


def test_token_leakage_on_a_hand_built_transcript():
    tr = _plain_and_aggregate_round()
    out = token_leakage(tr, part="embedding", truth=TRUTH, shape=(V, D))
    assert out["server_view"] == "individual"
    assert out["individual"]["f1"] == pytest.approx(1.0) and out["aggregate"]["f1"] == pytest.approx(1.0)
    assert out["individual"]["attribution"]["precision"] == pytest.approx(1.0)
    assert out["individual"]["advantage"] == pytest.approx(1.0)
    rec = recoverable_updates(tr, [1, 2, 3, 4], part="embedding")
    assert rec["per_round"] == 2 and rec["if_fixed"] == 2  # both individual uploads are seen
    secure = Transcript(protocol="secagg+")
    secure.record_aggregate(1, "head", np.ones(3), contributors=[1, 2], total_weight=2.0)
    secure.record_aggregate(2, "head", np.ones(3), contributors=[1, 2, 3], total_weight=3.0)
    rec = recoverable_updates(secure, [1, 2, 3, 4], part="head")
    assert rec["per_round"] == 0 and rec["if_fixed"] == 1  # S(A + {3}) - S(A) exposes client 3


def test_token_advantage_is_zero_at_chance_and_one_at_exact_recovery():
    assert token_advantage(1.0, 0.2) == pytest.approx(1.0)
    assert token_advantage(0.2, 0.2) == pytest.approx(0.0)
    assert token_advantage(0.5, None) == pytest.approx(0.5)
    assert token_advantage(1.0, 1.0) == 0.0


def test_ledger_epsilons_take_the_max_over_clients():
    ledger = Ledger(LedgerConfig(delta=1e-5))
    for c, z in ((1, 1.0), (2, 2.0)):
        ledger.debit(c, GaussianMechanism(noise_multiplier=z), unit=PrivacyUnit.EXAMPLE, observer=Observer.SERVER)
    ledger.debit(3, NonPrivateMechanism(reason="plaintext"), unit=PrivacyUnit.CLIENT, observer=Observer.SERVER)
    eps = ledger_epsilons(ledger)
    assert eps["example/server"] == pytest.approx(ledger.epsilon(1, unit="example", observer="server"))
    assert math.isinf(eps["client/server"])


def test_measure_leakage_reports_on_the_exported_transcript(tmp_path):
    tr = _plain_and_aggregate_round()
    ledger = Ledger(LedgerConfig(delta=1e-5))
    ledger.debit_many([1, 2], NonPrivateMechanism(reason="plaintext"), unit=PrivacyUnit.CLIENT,
                      observer=Observer.SERVER)
    rng = np.random.default_rng(0)
    out = measure_leakage(tr, embedding_part="embedding", vector_part="embedding", truth=TRUTH, shape=(V, D),
                          member_losses=rng.uniform(0.0, 0.5, 50), nonmember_losses=rng.uniform(0.4, 1.0, 50),
                          ledger=ledger, unit="client", export=tmp_path / "transcript")
    assert (tmp_path / "transcript.json").is_file()
    assert out["token_f1"] == pytest.approx(1.0) and out["tokens"]["server_view"] == "individual"
    assert out["membership"]["auc"] > 0.8
    assert out["epsilon"] == {"client/server": "inf"} and out["epsilon_unit"] == "client"
    report = out["report"]
    assert report["server_view"] == "plain" and report["epsilon"] == "inf"
    assert report["recoverable_clients"] == 2 and report["recoverable_fraction"] == pytest.approx(0.5)


# ---- realistic attacks (shadow-calibrated token recovery, differencing) beside the oracle -------------

from dp.leakage.differencing import random_cohorts, simulate_differencing_shadow  # noqa: E402


def _ledger(clients):
    ledger = Ledger(LedgerConfig(delta=1e-5))
    ledger.debit_many(list(clients), NonPrivateMechanism(reason="test"), unit=PrivacyUnit.CLIENT,
                      observer=Observer.SERVER)
    return ledger


def _measure(tr, truth, shape, *, part="emb", **kw):
    rng = np.random.default_rng(0)
    return measure_leakage(tr, embedding_part=part, vector_part=part, truth=truth, shape=shape,
                           member_losses=rng.uniform(0.0, 0.6, 40), nonmember_losses=rng.uniform(0.3, 1.0, 40),
                           ledger=_ledger(truth), unit="client", **kw)


def _clip(vec, clip):
    return vec * min(1.0, clip / float(np.linalg.norm(vec))) if clip else vec


def _secure(updates, cohorts, *, clip, noise_std, rng):
    tr = Transcript(protocol="secagg+")
    size = next(iter(updates.values())).size
    for t, cohort in enumerate(cohorts):
        total = sum(_clip(updates[c], clip) for c in cohort) + rng.normal(0.0, noise_std, size)
        tr.record_aggregate(t, "emb", total / len(cohort), contributors=cohort, total_weight=float(len(cohort)))
    return tr


def _shadow(shadow_updates, *, clip, noise_std, rng, rounds=30, size=4):
    """What the attacker simulates: shadow cohort means and shadow differencing estimates, same mechanism."""
    clipped = [(_clip(v, clip), t) for v, t in shadow_updates]
    means = []
    for cohort in random_cohorts(range(len(clipped)), size=size, rounds=rounds, rng=rng):
        total = sum(clipped[i][0] for i in cohort) + rng.normal(0.0, noise_std, clipped[0][0].size)
        means.append((total / size, frozenset().union(*(clipped[i][1] for i in cohort))))
    estimates = simulate_differencing_shadow(
        clipped, cohorts=random_cohorts(range(len(clipped)), size=size, rounds=rounds, rng=rng),
        shape=(clipped[0][0].size // 8, 8), noise_std=noise_std, rng=rng)
    return {"aggregate": means, "differencing": estimates}


NEW_KEYS = {"token_oracle", "oracle_advantage", "token_realistic", "differencing", "realistic_advantage",
            "realistic_attack"}


def test_without_shadow_old_keys_stay_and_realistic_numbers_are_marked_missing():
    out = _measure(_plain_and_aggregate_round(), TRUTH, (V, D), part="embedding")
    assert {"token_f1", "token_chance_f1", "token_advantage", "tokens", "recoverability", "membership", "epsilon",
            "epsilon_unit", "report"} | NEW_KEYS <= set(out)
    assert out["realistic_advantage"] is None and out["realistic_attack"] is None
    assert "shadow=None" in out["token_realistic"]["skipped"] and "shadow=None" in out["differencing"]["skipped"]
    assert out["oracle_advantage"] == out["token_advantage"] == out["token_oracle"]["advantage"]
    assert out["report"]["oracle_advantage"] == out["oracle_advantage"] and out["report"]["realistic_advantage"] is None


def test_plain_uploads_calibrated_attack_recovers_tokens_below_the_oracle(ten_client_updates, shadow_client_updates,
                                                                         bag, tmp_path):
    updates, clients = ten_client_updates
    tr = Transcript(protocol="plain")
    for c, u in updates.items():
        tr.record_individual(1, c, "emb", u)
    truth = {c: d.token_set for c, d in clients.items()}
    out = _measure(tr, truth, bag.shape, shadow={"individual": shadow_client_updates}, export=tmp_path / "tr")
    real = out["token_realistic"]
    assert real["calibrated_on"] == "individual" and real["views"] == 10 and real["n_shadow"] == 12
    assert real["advantage"] > 0.95 and out["realistic_attack"] == "token_recovery"
    assert out["realistic_advantage"] == real["advantage"] <= out["oracle_advantage"] + 1e-12
    assert "no aggregates" in out["differencing"]["skipped"]
    assert out["report"]["realistic_advantage"] == out["realistic_advantage"]


def test_secure_exact_sums_leak_through_the_union_and_through_differencing(ten_client_updates, shadow_client_updates,
                                                                          bag):
    updates, clients = ten_client_updates
    rng = np.random.default_rng(1)
    tr = _secure(updates, random_cohorts(sorted(updates), size=4, rounds=30, rng=rng), clip=None, noise_std=0.0,
                 rng=rng)
    truth = {c: d.token_set for c, d in clients.items()}
    out = _measure(tr, truth, bag.shape, shadow=_shadow(shadow_client_updates, clip=None, noise_std=0.0, rng=rng),
                   true_updates=updates)
    assert out["tokens"]["server_view"] == "aggregate"
    assert out["token_realistic"]["advantage"] > 0.9  # the cohort's union, from its exact mean
    assert out["token_realistic"]["advantage"] <= out["oracle_advantage"] + 1e-12
    diff = out["differencing"]
    assert diff["calibrated_on"] == "differencing" and diff["counts_in_headline"]
    assert diff["advantage"] > 0.9 and diff["mean_cosine"] > 0.99 and diff["identifiable"] == 10
    assert out["realistic_advantage"] == max(diff["advantage"], out["token_realistic"]["advantage"])
    assert json.loads(json.dumps(out, allow_nan=False))["differencing"] == diff  # results.json-ready


def test_secure_sums_with_dp_scale_noise_fall_to_chance(ten_client_updates, shadow_client_updates, bag):
    """Updates clipped to 0.5 (about 0.03 per coordinate), noise std 1.0 on every coordinate of a sum."""
    updates, clients = ten_client_updates
    rng = np.random.default_rng(2)
    tr = _secure(updates, random_cohorts(sorted(updates), size=4, rounds=30, rng=rng), clip=0.5, noise_std=1.0,
                 rng=rng)
    truth = {c: d.token_set for c, d in clients.items()}
    out = _measure(tr, truth, bag.shape, shadow=_shadow(shadow_client_updates, clip=0.5, noise_std=1.0, rng=rng))
    assert abs(out["token_realistic"]["advantage"]) < 0.05
    assert abs(out["differencing"]["advantage"]) < 0.05
    assert out["realistic_advantage"] < 0.05
    assert out["report"]["realistic_advantage"] == out["realistic_advantage"]


def test_missing_shadow_kinds_skip_with_a_reason_and_individual_shadows_calibrate_differencing(
        ten_client_updates, shadow_client_updates, bag):
    updates, clients = ten_client_updates
    rng = np.random.default_rng(3)
    tr = _secure(updates, random_cohorts(sorted(updates), size=4, rounds=30, rng=rng), clip=None, noise_std=0.0,
                 rng=rng)
    out = _measure(tr, {c: d.token_set for c, d in clients.items()}, bag.shape,
                   shadow={"individual": shadow_client_updates})
    assert "'aggregate'" in out["token_realistic"]["skipped"]
    assert out["differencing"]["calibrated_on"] == "individual"
    assert out["realistic_attack"] == "differencing" and out["realistic_advantage"] == out["differencing"]["advantage"]
    with pytest.raises(ValueError, match="unknown shadow kinds"):
        _measure(tr, {c: d.token_set for c, d in clients.items()}, bag.shape, shadow={"plain": []})
    with pytest.raises(ValueError, match="at least one shadow view"):
        _measure(tr, {c: d.token_set for c, d in clients.items()}, bag.shape, shadow={"aggregate": []})
