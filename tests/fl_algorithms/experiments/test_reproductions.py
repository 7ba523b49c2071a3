"""The reproductions ledger and page: verdicts from paired intervals, collection from run records, --check."""
import json
import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp.leakage.stats import mean_ci
from fl_algorithms.experiments import reproductions as rp

GREATER = rp.CLAIM_BY_ID["fednlp-fedopt-over-fedavg"]
MATCH = rp.CLAIM_BY_ID["fednlp-fedprox-matches-fedavg"]  # margin 1 point
LINE = re.compile(r"^reproductions claims=(\d+) reproduced=(\d+) refuted=(\d+) underpowered=(\d+) "
                  r"protocol_declared=(\d+)$")


def test_the_claims_cover_every_paper_twice_and_at_least_ten():
    assert len(rp.CLAIMS) >= 10 and len({c.id for c in rp.CLAIMS}) == len(rp.CLAIMS)
    per_paper = {}
    for claim in rp.CLAIMS:
        per_paper[claim.paper] = per_paper.get(claim.paper, 0) + 1
    assert len(per_paper) == 5 and min(per_paper.values()) >= 2
    assert all(c.experiment in rp.EXTRACTORS or c.experiment in {"fedmcp", "atc", "fedseit", "adafedselectkd"}
               for c in rp.CLAIMS)


@pytest.mark.parametrize("values, expected", [
    ([2.0, 2.5, 3.0], "reproduced"),        # interval above 0
    ([-2.0, -2.5, -3.0], "refuted"),        # interval below 0: the paper's direction excluded
    ([-3.0, 1.0, 4.0], "underpowered"),     # contains 0
    ([5.0], "underpowered"),                # one seed: no interval
])
def test_greater_claims(values, expected):
    assert rp.verdict(GREATER, values) == expected


@pytest.mark.parametrize("values, expected", [
    ([0.1, -0.1, 0.0, 0.05], "reproduced"),   # inside +-1
    ([3.0, 3.2, 2.9], "refuted"),             # wholly above +1
    ([-3.0, -3.2, -2.9], "refuted"),          # wholly below -1
    ([0.5, 1.5, 0.9], "underpowered"),        # straddles the margin
])
def test_match_claims(values, expected):
    assert rp.verdict(MATCH, values) == expected


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-5, 5, allow_nan=False), min_size=2, max_size=8))
def test_verdicts_follow_the_interval(values):
    _, low, high = mean_ci(values)
    got = rp.verdict(GREATER, values)
    if math.isnan(low):  # identical values within float noise still give a (zero-width) interval
        assert got == "underpowered"
    else:
        assert got == ("reproduced" if low > 0 else "refuted" if high < 0 else "underpowered")


@pytest.mark.parametrize("values", [[1.0, 3.0, -0.5], [0.4, 0.9, 0.1, 1.2], [2.0, -1.0]])
def test_seeds_needed_is_the_first_count_whose_interval_would_exclude_zero(values):
    n = rp.seeds_needed(values)
    mean, sd = sum(values) / len(values), float(__import__("statistics").stdev(values))
    from scipy import stats

    def half(k):
        return stats.t.ppf(0.975, df=k - 1) * sd / math.sqrt(k)
    assert half(n) < abs(mean) and (n == 2 or half(n - 1) >= abs(mean))
    assert rp.seeds_needed([1.0]) is None and rp.seeds_needed([1.0, 1.0]) == 2


def test_a_claim_is_checked_when_declared():
    with pytest.raises(ValueError, match="kind must be one of"):
        rp.Claim(id="x", paper="p", source="s", claim="c", kind="less", paper_value=1, metric="m",
                 experiment="e", ours="a", theirs="b")
    with pytest.raises(ValueError, match="positive margin"):
        rp.Claim(id="x", paper="p", source="s", claim="c", kind="match", paper_value=0, metric="m",
                 experiment="e", ours="a", theirs="b")
    with pytest.raises(ValueError, match="must be positive"):
        rp.Claim(id="x", paper="p", source="s", claim="c", kind="greater", paper_value=-1, metric="m",
                 experiment="e", ours="a", theirs="b")


def _fednlp_run(path, *, accs, seeds, protocol=True):
    """A results.json as examples/fednlp_classification.py writes it."""
    path.mkdir(parents=True)
    methods = {m: {"final_accuracy_per_seed": v} for m, v in accs.items()}
    summary = {"methods": methods, "seeds": seeds, "accuracy_definition": "mean over clients"}
    if protocol:
        summary["training_protocol"] = {m: {"name": "fednlp"} for m in accs}
    path.joinpath("results.json").write_text(json.dumps({
        "summary": summary, "provenance": {"command": "python examples/fednlp_classification.py --quick",
                                           "device": "2-core CPU", "date": "2026-11-29"}}))
    return path


def test_collect_reads_paired_differences_and_keeps_hand_written_notes(tmp_path):
    run = _fednlp_run(tmp_path / "run", accs={"fedavg": [0.50, 0.52, 0.49], "fedprox": [0.501, 0.521, 0.491],
                                              "fedopt": [0.55, 0.56, 0.53]}, seeds=[0, 1, 2])
    old = {"fednlp-fedopt-over-fedavg": {"note": "a known cause", "values": [9.0]}}
    ledger, found = rp.collect([run], old)
    assert sorted(found) == ["fednlp-fedopt-over-fedavg", "fednlp-fedprox-matches-fedavg"]
    entry = ledger["fednlp-fedopt-over-fedavg"]
    assert entry["seeds"] == [0, 1, 2] and entry["values"] == pytest.approx([5.0, 4.0, 4.0])
    assert entry["note"] == "a known cause" and entry["protocol_declared"] is True
    assert entry["device"] == "2-core CPU" and entry["date"] == "2026-11-29" and entry["run"] == str(run)
    table = rp.rows(ledger)
    verdicts = {r["claim"].id: r["verdict"] for r in table}
    assert verdicts["fednlp-fedopt-over-fedavg"] == "reproduced"
    assert verdicts["fednlp-fedprox-matches-fedavg"] == "reproduced"
    assert all(r["verdict"] == "underpowered" and r["n"] == 0 for r in table if r["claim"].id not in verdicts
               or r["claim"].experiment != "fednlp_classification")
    line = rp.summary_line(table)
    m = LINE.match(line)
    assert m and int(m[1]) == len(rp.CLAIMS) and int(m[2]) == 2 and int(m[5]) == 2, line


def test_a_run_without_a_declared_protocol_is_counted_as_such(tmp_path):
    run = _fednlp_run(tmp_path / "old", accs={"fedavg": [0.5, 0.6], "fedopt": [0.6, 0.7]}, seeds=[0, 1],
                      protocol=False)
    ledger, _ = rp.collect([run], {})
    assert ledger["fednlp-fedopt-over-fedavg"]["protocol_declared"] is False
    assert "not declared" in rp.render(ledger)


def test_collect_refuses_what_it_cannot_read(tmp_path):
    with pytest.raises(FileNotFoundError, match="no results.json"):
        rp.collect([tmp_path], {})
    (tmp_path / "results.json").write_text(json.dumps({"summary": {}}))
    with pytest.raises(ValueError, match="cannot tell which experiment"):
        rp.collect([tmp_path], {})
    (tmp_path / "results.json").write_text(json.dumps({"experiment": "mystery"}))
    with pytest.raises(ValueError, match="no extractor for experiment 'mystery'"):
        rp.collect([tmp_path], {})


def test_main_renders_then_check_passes_and_fails_when_stale(tmp_path, capsys):
    run = _fednlp_run(tmp_path / "run", accs={"fedavg": [0.5, 0.6], "fedprox": [0.5, 0.6], "fedopt": [0.6, 0.8]},
                      seeds=[0, 1])
    ledger, page = tmp_path / "ledger.json", tmp_path / "page.md"
    assert rp.main(["--collect", str(run), "--ledger", str(ledger), "--page", str(page)]) == 0
    assert rp.main(["--check", "--ledger", str(ledger), "--page", str(page)]) == 0
    assert LINE.match(capsys.readouterr().out.strip().splitlines()[-1])
    page.write_text(page.read_text() + "edited by hand\n")
    assert rp.main(["--check", "--ledger", str(ledger), "--page", str(page)]) == 1
    assert "stale" in capsys.readouterr().err
    ledger.write_text(json.dumps({"no-such-claim": {}}))
    with pytest.raises(SystemExit):
        rp.main(["--check", "--ledger", str(ledger), "--page", str(page)])
    assert "unknown claims" in capsys.readouterr().err


def test_the_tracked_page_is_the_ledgers_rendering():
    """docs/reproductions.md is generated: a hand edit or a ledger change without re-rendering fails here."""
    assert rp.PAGE.read_text() == rp.render(rp.load_ledger())


def test_runs_of_one_experiment_are_pooled_by_seed_and_a_seed_measured_twice_is_refused(tmp_path):
    first = _fednlp_run(tmp_path / "a", accs={"fedavg": [0.5, 0.6], "fedopt": [0.6, 0.7]}, seeds=[0, 1])
    more = _fednlp_run(tmp_path / "b", accs={"fedavg": [0.4], "fedopt": [0.45]}, seeds=[2])
    ledger, _ = rp.collect([first, more], {})
    entry = ledger["fednlp-fedopt-over-fedavg"]
    assert entry["seeds"] == [0, 1, 2] and entry["values"] == pytest.approx([10.0, 10.0, 5.0])
    assert entry["run"] == f"{first}; {more}" and entry["date"] == "2026-11-29"
    again = _fednlp_run(tmp_path / "c", accs={"fedavg": [0.4], "fedopt": [0.45]}, seeds=[1])
    with pytest.raises(ValueError, match=r"fedavg seed\(s\) \[1\] already measured"):
        rp.collect([first, again], {})


def test_one_method_under_two_protocols_is_not_pooled(tmp_path):
    first = _fednlp_run(tmp_path / "a", accs={"fedavg": [0.5], "fedopt": [0.6]}, seeds=[0])
    other = _fednlp_run(tmp_path / "b", accs={"fedavg": [0.5], "fedopt": [0.6]}, seeds=[1])
    doc = json.loads((other / "results.json").read_text())
    doc["summary"]["training_protocol"]["fedavg"] = {"name": "kept-adamw"}
    (other / "results.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="fedavg ran under protocol 'kept-adamw' here and 'fednlp'"):
        rp.collect([first, other], {})


def test_one_protocol_at_two_settings_is_not_pooled_but_reworded_reasons_are(tmp_path):
    """Seeds run at another lr (or any other setting) under the same protocol name are another experiment;
    a citation or a stated reason reworded between two runs of the same settings is not."""
    def run(name, seed, lr, reason):
        path = _fednlp_run(tmp_path / name, accs={"fedavg": [0.5], "fedopt": [0.6]}, seeds=[seed])
        doc = json.loads((path / "results.json").read_text())
        doc["summary"]["training_protocol"]["fedavg"] = {
            "name": "fednlp", "optimizer": {"name": "sgd", "lr": lr}, "lifetime_reason": reason, "cite": {"lr": reason}}
        (path / "results.json").write_text(json.dumps(doc))
        return path

    first, reworded, other_lr = run("a", 0, 1.0, "why"), run("b", 1, 1.0, "why, reworded"), run("c", 2, 3.0, "why")
    ledger, _ = rp.collect([first, reworded], {})
    assert ledger["fednlp-fedopt-over-fedavg"]["seeds"] == [0, 1]
    with pytest.raises(ValueError, match=r"fedavg ran protocol 'fednlp' with other settings .*\(optimizer\)"):
        rp.collect([first, other_lr], {})
