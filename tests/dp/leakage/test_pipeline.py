"""The measurement pipeline (dp.leakage.pipeline) on hand-built transcripts with known token sets."""
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
