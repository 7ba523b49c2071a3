import dataclasses
import json
import math

import pytest

from dp.leakage.intersection import AttributionScores
from dp.leakage.membership import score_attack
from dp.leakage.recoverability import recoverable_clients
from dp.leakage.report import LeakageReport
from dp.leakage.token_recovery import score_tokens


def _full() -> LeakageReport:
    return LeakageReport.from_results(
        server_view="secure",
        tokens=score_tokens({1, 2, 3, 9}, {1, 2, 3, 4}, vocab_size=100),
        attribution=AttributionScores(private_tokens=10, attributed=7, correct=6, wrong=1, rate=0.6, precision=6 / 7),
        membership=score_attack([3.0, 4.0, 5.0], [0.0, 1.0, 3.5]),
        recoverability=recoverable_clients([[1, 2, 3], [1, 2]], clients=[1, 2, 3, 4]),
        epsilon=7.9)


def test_from_results_carries_every_number():
    r = _full()
    assert r.token_precision == 0.75 and r.token_recall == 0.75 and r.token_f1 == 0.75
    assert r.token_chance_f1 == pytest.approx(0.04)
    assert r.intersection_attribution_rate == 0.6
    assert r.mia_auc == pytest.approx(8 / 9)
    assert r.recoverable_clients == 1 and r.recoverable_fraction == 0.25
    assert r.epsilon == 7.9


def test_to_dict_is_json_and_summary_is_one_line():
    r = _full()
    d = r.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert set(d) == {f.name for f in dataclasses.fields(LeakageReport)}
    line = r.summary()
    assert "\n" not in line
    for piece in ("eps=7.90", "tokenF1=0.750", "attributed=0.600", "AUC=0.889", "recoverable=1 (25.0%)"):
        assert piece in line


def test_unmeasured_fields_are_none_and_printed_as_na():
    r = LeakageReport(server_view="plain", token_f1=1.0)
    assert r.to_dict()["mia_auc"] is None and r.to_dict()["epsilon"] is None
    assert "eps=n/a" in r.summary() and "recoverable=n/a" in r.summary() and "view=plain" in r.summary()


def test_infinite_epsilon_serialises():
    r = LeakageReport(epsilon=math.inf)
    assert r.to_dict()["epsilon"] == "inf"
    assert "eps=inf" in r.summary()


def test_frozen_and_validated():
    r = LeakageReport()
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'token_f1'"):
        r.token_f1 = 0.5
    with pytest.raises(ValueError, match=r"token_f1 must be in \[0, 1\]"):
        LeakageReport(token_f1=1.5)
    with pytest.raises(ValueError, match="recoverable_clients must be >= 0"):
        LeakageReport(recoverable_clients=-1)
    with pytest.raises(ValueError, match="epsilon must be >= 0"):
        LeakageReport(epsilon=-0.1)
