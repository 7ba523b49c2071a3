"""dp.recompute: a written ledger's epsilons recomputed from the file alone, and tampering caught."""
import copy
import json
import math

import pytest

from dp.ledger import GaussianMechanism, Ledger, LedgerConfig, NoReleaseMechanism, NonPrivateMechanism, SkellamMechanism
from dp.recompute import check_document, main, recompute_entry
from dp.sampling import SamplingRecord


def _report() -> dict:
    """A ledger with every kind of entry the examples write, as its JSON report."""
    ledger = Ledger(LedgerConfig(delta=1e-5))
    floor = SamplingRecord("poisson", 100, 0.2, min_cohort=3)
    ledger.debit(1, GaussianMechanism(noise_multiplier=1.3, sampling_rate=0.2), unit="client", observer="outsider",
                 count=6, sampling=floor)
    ledger.debit(1, SkellamMechanism(l1_sensitivity=3e5, l2_sensitivity=1000.0, variance=1500.0**2),
                 unit="client", observer="server", count=6)
    ledger.debit(1, GaussianMechanism(noise_multiplier=0.9, sampling_rate=0.05), unit="example", observer="server",
                 count=40, sampling=SamplingRecord("poisson", 500, 0.05))
    ledger.debit(2, GaussianMechanism(noise_multiplier=1.1, neighbouring="replace_one", population=100, sample_size=20),
                 unit="client", observer="outsider", count=5, sampling=SamplingRecord("fixed_size", 100, 0.2))
    ledger.debit(2, NonPrivateMechanism("secure sum without noise"), unit="client", observer="server", count=5)
    ledger.debit(3, GaussianMechanism(noise_multiplier=1.3, sampling_rate=0.2), unit="client", observer="outsider",
                 round_id=1, sampling=floor)
    ledger.debit(3, NoReleaseMechanism("cohort below the floor", sampling_rate=0.2), unit="client",
                 observer="outsider", round_id=2, sampling=floor)
    return json.loads(ledger.to_json())


def test_every_entry_and_single_entry_label_of_an_honest_ledger_agrees():
    report = _report()
    check = check_document(report)
    assert check.mismatches == [] and check.max_rel_diff <= 1e-9
    assert (check.ledgers, check.entries, check.labels) == (1, 7, 6)
    assert check.composite_labels == 1  # client 3's released and skipped rounds: counted, not passed silently
    assert recompute_entry(report["clients"]["2"]["entries"][1]) == math.inf
    assert 0 < recompute_entry(report["clients"]["2"]["entries"][0]) < math.inf


@pytest.mark.parametrize("tamper", ["entry_epsilon", "label_epsilon", "count", "noise", "sampling_rate"])
def test_a_tampered_ledger_is_caught(tamper):
    report = _report()
    entry = report["clients"]["1"]["entries"][0]
    if tamper == "entry_epsilon":
        entry["epsilon"] *= 0.99
    elif tamper == "label_epsilon":
        report["clients"]["1"]["epsilon"]["client/server"] *= 0.99  # the headline number, not the entry
    elif tamper == "count":
        entry["count"] -= 1
    elif tamper == "noise":
        entry["mechanism"]["noise_multiplier"] *= 1.1
    else:  # claims more amplification than the sampler that drew the cohorts
        entry["mechanism"]["sampling_rate"] = 0.1
    if tamper == "sampling_rate":
        with pytest.raises(ValueError, match="sampler record disagrees"):
            check_document(report)
        return
    check = check_document(report)
    assert len(check.mismatches) >= 1 and check.max_rel_diff > 1e-3


def test_the_command_reads_runs_documents_and_fails_on_a_mismatch(tmp_path, capsys):
    honest = tmp_path / "ledger.json"
    honest.write_text(json.dumps({"format": "runs", "runs": {"a": {"ledger": _report()}, "b": {"ledger": _report()}}}))
    assert main([str(honest)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == ("recompute ledgers=1 entries=14 labels=12 composite_labels=2 max_rel_diff=0 noise_records=0 mismatches=0")
    bad = copy.deepcopy(_report())
    bad["clients"]["2"]["epsilon"]["client/outsider"] = 0.5
    tampered = tmp_path / "tampered.json"
    tampered.write_text(json.dumps(bad))
    assert main([str(honest), str(tampered)]) == 1
    out = capsys.readouterr().out
    assert "mismatch:" in out and "client 2 label client/outsider: recorded 0.5" in out
    assert out.strip().splitlines()[-1].endswith("mismatches=1")
    inflated = copy.deepcopy(_report())
    inflated["clients"]["1"]["entries"][0]["mechanism"]["sampling_rate"] = 0.1  # more amplification than sampled
    claimed = tmp_path / "inflated.json"
    claimed.write_text(json.dumps(inflated))
    assert main([str(claimed)]) == 1
    assert "sampler record disagrees" in capsys.readouterr().out


@pytest.mark.parametrize(("content", "message"), [(None, "no such file"), ("{}", "not a ledger this check reads"),
                                                  ("not json", "not a ledger this check reads")])
def test_the_command_refuses_what_is_not_a_ledger(tmp_path, capsys, content, message):
    path = tmp_path / "x.json"
    if content is not None:
        path.write_text(content)
    # no message: argparse-style exit (status 2); the reason is asserted on stderr below
    with pytest.raises(SystemExit) as exit_info:
        main([str(path)])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
