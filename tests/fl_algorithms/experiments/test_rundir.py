import csv
import json

import pytest

from fl_algorithms.engine.sim import RunConfig
from fl_algorithms.experiments.rundir import RunDirectory


def test_config_round_trips_through_toml_including_none(tmp_path):
    run = RunDirectory.create(tmp_path, name="r1")
    run.write_config({"run": RunConfig(rounds=3, clients_per_round=None), "note": "x"})
    doc = run.read_config()
    assert doc["run"]["rounds"] == 3 and doc["run"]["clients_per_round"] is None and doc["note"] == "x"
    assert doc["run"]["secure"]["protocol"] == "secagg+"
    with pytest.raises(FileExistsError):
        RunDirectory.create(tmp_path, name="r1")
    with pytest.raises(ValueError):
        RunDirectory.create(tmp_path, name="../x")
    assert RunDirectory.open(run.path).path == run.path
    with pytest.raises(FileNotFoundError):
        RunDirectory.open(tmp_path)


def test_rounds_are_logged_as_jsonl_and_csv_with_growing_columns(tmp_path):
    run = RunDirectory.create(tmp_path)
    run.log_round({"round": 1, "accuracy": 0.5, "sums": {"all": 3}})
    run.log_round({"round": 2, "accuracy": 0.6, "sums": {"all": 3}, "failed": {"b": "too small"}})
    assert [r["round"] for r in run.rounds()] == [1, 2]
    with open(run.path / "metrics.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["round"] for r in rows] == ["1", "2"] and rows[0]["sums.all"] == "3"
    assert rows[0]["failed.b"] == "" and rows[1]["failed.b"] == "too small"


def test_torn_last_line_is_ignored_and_resume_truncates(tmp_path):
    run = RunDirectory.create(tmp_path)
    for t in (1, 2, 3):
        run.log_round({"round": t, "accuracy": t / 10})
    with open(run.path / "metrics.jsonl", "a") as fh:
        fh.write('{"round": 4, "accur')
    assert [r["round"] for r in run.rounds()] == [1, 2, 3]
    run.truncate_rounds(after=2)
    assert [r["round"] for r in run.rounds()] == [1, 2]
    with open(run.path / "metrics.csv", newline="") as fh:
        assert [r["round"] for r in csv.DictReader(fh)] == ["1", "2"]


def test_results_are_written_atomically_as_json(tmp_path):
    run = RunDirectory.create(tmp_path)
    path = run.write_results({"summary": {"acc": 0.7}, "ids": (1, 2)})
    assert json.loads(path.read_text()) == {"summary": {"acc": 0.7}, "ids": [1, 2]}
    assert not (run.path / "results.json.tmp").exists()
