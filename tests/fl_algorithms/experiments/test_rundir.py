import csv
import dataclasses
import enum
import json
import math
import os
import re
import sys
import tomllib
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from fl_algorithms.engine.sim import RunConfig
from fl_algorithms.experiments import rundir
from fl_algorithms.experiments.rundir import RunDirectory


def csv_rows(run):
    with open(run.path / "metrics.csv", newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        return reader.fieldnames, list(reader)


# ---- creating and opening ------------------------------------------------------------------------
def test_create_makes_fresh_time_stamped_directories(tmp_path):
    a = RunDirectory.create(tmp_path / "runs")
    b = RunDirectory.create(tmp_path / "runs")
    assert a.path.is_dir() and b.path.is_dir() and a.path != b.path
    assert re.fullmatch(r"\d{8}-\d{6}(-\d+)?", a.path.name) and a.path.parent == tmp_path / "runs"


def test_create_with_a_name_refuses_an_existing_one_and_odd_names(tmp_path):
    run = RunDirectory.create(tmp_path, name="r1")
    assert run.path == tmp_path / "r1" and run.path.is_dir()
    with pytest.raises(FileExistsError, match="already exists.*--resume"):
        RunDirectory.create(tmp_path, name="r1")
    for bad in ("", ".", "..", "../x", "a/b"):
        with pytest.raises(ValueError, match="plain directory name"):
            RunDirectory.create(tmp_path, name=bad)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r1"]


def test_open_is_for_run_directories_only(tmp_path):
    run = RunDirectory.create(tmp_path, name="r1")
    with pytest.raises(FileNotFoundError, match="not a run directory.*config.toml"):
        RunDirectory.open(run.path)  # no config written yet: nothing to resume
    run.write_config({"rounds": 3})
    assert RunDirectory.open(run.path).read_config() == {"rounds": 3}
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        RunDirectory.open(tmp_path)
    with pytest.raises(FileNotFoundError, match="no such directory"):
        RunDirectory.open(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileNotFoundError, match=r"file is not a run directory"):
        RunDirectory.open(tmp_path / "file")


# ---- config.toml ---------------------------------------------------------------------------------
class Mode(enum.Enum):
    FAST = "fast"


@dataclasses.dataclass(frozen=True)
class Inner:
    lr: float = 0.1
    clip: float | None = None


@dataclasses.dataclass(frozen=True)
class Settings:
    name: str = "x"
    seed: int | None = None
    inner: Inner = dataclasses.field(default_factory=Inner)
    sizes: tuple[int, ...] = (1, 2)


def test_config_round_trips_through_toml_restoring_none(tmp_path):
    run = RunDirectory.create(tmp_path)
    config = {"settings": Settings(), "run": RunConfig(rounds=3, clients_per_round=None), "note": "x",
              "a.b": None, "deep": {"x": {"y": None, "z": 1}, "all_none": {"k": None}},
              "list": [None, 1, None, {"q": None, "r": 2}, None], "inf": math.inf,
              "path": Path("/data/x.csv"), "mode": Mode.FAST, "np": np.float32(0.5), "t": torch.tensor([1, 2])}
    path = run.write_config(config)
    doc = tomllib.loads(path.read_text())  # plain TOML, None values listed under _none
    assert "seed" not in doc["settings"] and "settings.seed" in doc["_none"] and ["a.b"] in doc["_none"]
    back = run.read_config()
    assert back == {
        "settings": {"name": "x", "seed": None, "inner": {"lr": 0.1, "clip": None}, "sizes": [1, 2]},
        "run": json.loads(json.dumps(dataclasses.asdict(RunConfig(rounds=3, clients_per_round=None)))),
        "note": "x", "a.b": None, "deep": {"x": {"y": None, "z": 1}, "all_none": {"k": None}},
        "list": [None, 1, None, {"q": None, "r": 2}, None], "inf": math.inf,
        "path": "/data/x.csv", "mode": "fast", "np": 0.5, "t": [1, 2]}
    assert back["run"]["clients_per_round"] is None and back["run"]["secure"]["protocol"] == "secagg+"
    run.write_config({"rounds": 4})  # rewriting replaces it whole
    assert run.read_config() == {"rounds": 4} and not list(run.path.glob(".*tmp"))


def test_config_refuses_what_toml_cannot_hold(tmp_path):
    run = RunDirectory.create(tmp_path)
    with pytest.raises(ValueError, match="reserved"):
        run.write_config({"_none": ["x"]})
    with pytest.raises(TypeError, match="mapping or a dataclass"):
        run.write_config([1, 2])
    assert not (run.path / "config.toml").exists()


# ---- per-round metrics ---------------------------------------------------------------------------
def test_each_round_reaches_jsonl_and_csv_before_log_round_returns(tmp_path, monkeypatch):
    run = RunDirectory.create(tmp_path)
    synced = []
    real_fsync = rundir.os.fsync
    monkeypatch.setattr(rundir.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    for t in (1, 2):
        before = len(synced)
        run.log_round({"round": t, "accuracy": t / 10, "sums": {"all": {"n": 3}}, "ids": [1, 2],
                       "loss": np.float64(0.25), "clients": torch.tensor(4)})
        assert len(synced) - before >= 2  # the JSON line and the CSV rows were each fsynced
        assert [r["round"] for r in run.rounds()] == list(range(1, t + 1))
        header, rows = csv_rows(run)
        assert [r["round"] for r in rows] == [str(k) for k in range(1, t + 1) for _ in range(5)]
    assert header == ["round", "client", "split", "metric", "value"]
    assert [(r["metric"], r["value"]) for r in rows[5:]] == [("accuracy", "0.2"), ("sums.all.n", "3"),
                                                             ("ids_count", "2"), ("loss", "0.25"), ("clients", "4")]
    assert {r["client"] for r in rows} == {"all"} and {r["split"] for r in rows} == {""}
    assert run.rounds()[0] == {"round": 1, "accuracy": 0.1, "sums": {"all": {"n": 3}}, "ids": [1, 2],
                               "loss": 0.25, "clients": 4}


def test_metrics_csv_is_long_one_number_per_row_with_client_split_and_the_series_it_belongs_to(tmp_path):
    """A round record as the examples log it: its strings and seed lead each row; per-client metrics
    (keyed by client id, as JSON gives them back) name their client and split; the rest is 'all'."""
    run = RunDirectory.create(tmp_path)
    record = {"seed": 0, "method": "fedavg", "round": 2, "cohort": [1, 3], "contributors": [1, 3],
              "metrics": {1: {"validation_accuracy": 0.5, "train_loss": 1.25, "examples": 7}, 3: {"accuracy": 0.75}},
              "bytes_uploaded": {1: 100, 3: 120}, "failed": {"all": "too, \"small\""}, "ok": True,
              "mean_accuracy": 0.75}
    run.log_round(record)
    header, rows = csv_rows(run)
    assert header == ["seed", "method", "round", "client", "split", "metric", "value"]
    assert [tuple(r.values()) for r in rows] == [
        ("0", "fedavg", "2", "all", "", "cohort_count", "2"), ("0", "fedavg", "2", "all", "", "contributors_count", "2"),
        ("0", "fedavg", "2", "1", "validation", "accuracy", "0.5"), ("0", "fedavg", "2", "1", "train", "loss", "1.25"),
        ("0", "fedavg", "2", "1", "", "examples", "7"), ("0", "fedavg", "2", "3", "", "accuracy", "0.75"),
        ("0", "fedavg", "2", "1", "", "bytes_uploaded", "100"), ("0", "fedavg", "2", "3", "", "bytes_uploaded", "120"),
        ("0", "fedavg", "2", "all", "", "mean_accuracy", "0.75")]  # strings and booleans are not numbers
    assert rundir.long_rows(json.loads(json.dumps(record))) == rundir.long_rows(record)  # "1" keys as 1


def test_a_new_identity_column_rewrites_the_csv_with_the_union_header(tmp_path):
    run = RunDirectory.create(tmp_path)
    run.log_round({"round": 1, "accuracy": 0.5, "sums": {"all": 3}})
    run.log_round({"round": 2, "method": "fedprox", "accuracy": 0.6})
    header, rows = csv_rows(run)
    assert header == ["method", "round", "client", "split", "metric", "value"]
    assert [(r["method"], r["round"], r["metric"], r["value"]) for r in rows] == [
        ("", "1", "accuracy", "0.5"), ("", "1", "sums.all", "3"), ("fedprox", "2", "accuracy", "0.6")]


def test_an_old_wide_csv_is_rewritten_long_from_the_jsonl_by_the_next_writer(tmp_path):
    run = RunDirectory.create(tmp_path)
    (run.path / "metrics.jsonl").write_text('{"round": 1, "accuracy": 0.1, "metrics": {"2": {"test_accuracy": 0.4}}}\n')
    (run.path / "metrics.csv").write_text("round,accuracy,metrics.2.test_accuracy\r\n1,0.1,0.4\r\n")  # the old format
    RunDirectory(run.path).log_round({"round": 2, "accuracy": 0.2})  # a new process picks the run up
    header, rows = csv_rows(run)
    assert header == ["round", "client", "split", "metric", "value"]
    assert [(r["round"], r["client"], r["split"], r["metric"], r["value"]) for r in rows] == [
        ("1", "all", "", "accuracy", "0.1"), ("1", "2", "test", "accuracy", "0.4"), ("2", "all", "", "accuracy", "0.2")]


def test_a_record_that_is_not_json_leaves_the_files_untouched(tmp_path):
    run = RunDirectory.create(tmp_path)
    run.log_round({"round": 1, "accuracy": 0.5})
    before = (run.path / "metrics.jsonl").read_bytes(), (run.path / "metrics.csv").read_bytes()
    with pytest.raises(TypeError, match="not JSON serializable"):
        run.log_round({"round": 2, "blob": b"\x00"})
    assert ((run.path / "metrics.jsonl").read_bytes(), (run.path / "metrics.csv").read_bytes()) == before


def test_a_torn_last_line_is_ignored_and_cut_off_by_the_next_round(tmp_path):
    run = RunDirectory.create(tmp_path)
    for t in (1, 2, 3):
        run.log_round({"round": t, "accuracy": t / 10})
    with open(run.path / "metrics.jsonl", "a") as fh:
        fh.write('{"round": 4, "accur')  # the crash came mid-write
    assert [r["round"] for r in run.rounds()] == [1, 2, 3]
    resumed = RunDirectory(run.path)  # a new process picks the run up
    resumed.log_round({"round": 4, "accuracy": 0.4})
    assert [r["round"] for r in resumed.rounds()] == [1, 2, 3, 4]
    assert (run.path / "metrics.jsonl").read_text().count("\n") == 4
    assert [r["round"] for r in csv_rows(resumed)[1]] == ["1", "2", "3", "4"]


def test_a_bad_line_before_the_last_is_an_error_not_silently_dropped(tmp_path):
    run = RunDirectory.create(tmp_path)
    (run.path / "metrics.jsonl").write_text('{"round": 1}\n{"round": 2, oops\n{"round": 3}\n')
    with pytest.raises(ValueError, match="line 2"):
        run.rounds()


def test_a_csv_behind_the_jsonl_after_a_crash_is_rebuilt_by_the_next_writer(tmp_path):
    run = RunDirectory.create(tmp_path)
    for t in (1, 2):
        run.log_round({"round": t, "accuracy": t / 10})
    (run.path / "metrics.csv").write_text("round,accuracy\r\n1,0.1\r\n")  # died between the JSONL and the CSV
    again = RunDirectory(run.path)
    again.log_round({"round": 3, "accuracy": 0.3})
    assert [r["round"] for r in csv_rows(again)[1]] == ["1", "2", "3"]


def test_resume_truncates_rounds_logged_after_the_last_checkpoint(tmp_path):
    run = RunDirectory.create(tmp_path)
    run.write_config({"rounds": 5})
    for t in (1, 2, 3):
        run.log_round({"round": t, "accuracy": t / 10, **({"extra": 1} if t == 3 else {})})
    run.log_round({"note": "no round field"})
    with open(run.path / "metrics.jsonl", "a") as fh:
        fh.write('{"round": 4, "accur')
    resumed = RunDirectory.open(run.path)
    resumed.truncate_rounds(after=2)  # the checkpoint holds rounds 1-2: round 3 will run again
    assert resumed.rounds() == [{"round": 1, "accuracy": 0.1}, {"round": 2, "accuracy": 0.2}, {"note": "no round field"}]
    header, rows = csv_rows(resumed)
    assert header == ["note", "round", "client", "split", "metric", "value"] and [r["round"] for r in rows] == ["1", "2"]
    resumed.log_round({"round": 3, "accuracy": 0.35})
    assert [r.get("round") for r in resumed.rounds()] == [1, 2, None, 3]
    assert [r["round"] for r in csv_rows(resumed)[1]] == ["1", "2", "3"]
    resumed.truncate_rounds(after=0)
    assert [r.get("round") for r in resumed.rounds()] == [None]


# ---- TensorBoard ---------------------------------------------------------------------------------
class FakeWriter:
    made: list["FakeWriter"] = []

    def __init__(self, log_dir, purge_step=None):
        self.log_dir, self.purge_step, self.scalars, self.closed = log_dir, purge_step, [], False
        FakeWriter.made.append(self)

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, value, step))

    def flush(self):
        pass

    def close(self):
        self.closed = True


def test_scalars_go_to_tensorboard_when_it_is_installed(tmp_path, monkeypatch):
    FakeWriter.made = []
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=FakeWriter))
    with RunDirectory.create(tmp_path) as run:
        run.log_round({"round": 1, "accuracy": 0.5, "ok": True, "method": "x", "sums": {"all": 3},
                       "metrics": {"2": {"validation_accuracy": 0.25}}})
        run.log_round({"round": 2, "accuracy": 0.6})
        (w,) = FakeWriter.made
        assert w.log_dir == str(run.path / "tb") and w.purge_step is None
        assert w.scalars == [("x/accuracy", 0.5, 1), ("x/sums.all", 3, 1), ("x/validation_accuracy/client_2", 0.25, 1),
                             ("accuracy", 0.6, 2)]  # integer steps: the round
        run.truncate_rounds(after=1)  # on resume TensorBoard drops its events after the checkpoint
        run.log_round({"round": 2, "accuracy": 0.61})
        assert w.closed and FakeWriter.made[1].purge_step == 2 and FakeWriter.made[1].scalars == [("accuracy", 0.61, 2)]
    assert FakeWriter.made[1].closed


def test_without_tensorboard_logging_goes_on_and_says_so_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import raises ImportError
    monkeypatch.setattr(rundir, "_tensorboard_noted", False)
    for name in ("a", "b"):  # two runs in one process: one note
        run = RunDirectory.create(tmp_path, name=name)
        run.log_round({"round": 1, "accuracy": 0.5})
        run.log_round({"round": 2, "accuracy": 0.6})
        assert [r["round"] for r in run.rounds()] == [1, 2] and not (run.path / "tb").exists()
    err = capsys.readouterr().err
    assert err.count("TensorBoard is not installed") == 1 and "fedsecure-nlp[tensorboard]" in err


def test_the_tensorboard_extra_is_declared_in_pyproject():
    meta = tomllib.loads((Path(__file__).resolve().parents[3] / "pyproject.toml").read_text())
    assert meta["project"]["optional-dependencies"]["tensorboard"] == ["tensorboard>=2.15"]


# ---- the learning curve --------------------------------------------------------------------------
def test_the_curve_is_the_mean_over_clients_per_round_per_series_with_integer_ticks(tmp_path):
    run = RunDirectory.create(tmp_path)
    assert run.write_curve() is None  # nothing logged: no plot
    for method, shift in (("fedavg", 0.0), ("plain", 0.1)):
        for t in (1, 2, 3):
            run.log_round({"seed": 0, "method": method, "round": t, "mean_accuracy": 9.0,
                           "metrics": {"1": {"validation_accuracy": 0.1 * t + shift, "accuracy": 0.0},
                                       "2": {"validation_accuracy": 0.3 * t + shift}}})
    metric, series = run.curve()
    assert metric == "validation_accuracy" and list(series) == ["seed=0 fedavg", "seed=0 plain"]
    assert series["seed=0 fedavg"] == pytest.approx({1: 0.2, 2: 0.4, 3: 0.6})
    assert run.curve(metric="accuracy")[1]["seed=0 plain"] == {1: 0.0, 2: 0.0, 3: 0.0}
    assert run.write_curve() == run.path / "curve.png" and (run.path / "curve.png").stat().st_size > 1000


def test_round_axes_get_integer_ticks():
    from fl_algorithms.experiments.tables import pyplot, save_figure

    fig, (rounds, other) = pyplot().subplots(1, 2)
    for ax, label in ((rounds, "round"), (other, "epsilon")):
        ax.plot([1, 2, 3], [0.1, 0.2, 0.3], label="x")
        ax.set_xlabel(label)
    save_figure(fig, Path(os.devnull))
    assert all(float(t).is_integer() for t in rounds.get_xticks())
    assert not all(float(t).is_integer() for t in other.get_xticks())  # other axes keep matplotlib's ticks


# ---- results and layout --------------------------------------------------------------------------
def test_results_are_written_atomically_as_json(tmp_path):
    run = RunDirectory.create(tmp_path)
    path = run.write_results({"summary": {"acc": 0.7, "cfg": Inner()}, "ids": (1, 2), "w": np.arange(2)})
    assert path == run.path / "results.json"
    saved = json.loads(path.read_text())
    made = saved.pop("provenance")  # where the result came from: command, device, UTC date, commit
    assert saved == {"summary": {"acc": 0.7, "cfg": {"lr": 0.1, "clip": None}}, "ids": [1, 2], "w": [0, 1]}
    assert made["command"].startswith("python ") and "CPU" in made["device"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", made["date"])
    given = {"command": "python x.py", "device": "d", "date": "2026-01-01", "commit": None}
    run.write_results({"provenance": given})  # a document bringing its own keeps it
    assert json.loads(path.read_text())["provenance"] == given
    run.write_results({"summary": {"acc": 0.7, "cfg": Inner()}, "ids": (1, 2), "w": np.arange(2)})
    rewritten = json.loads(path.read_text())  # a rewrite (resume, --report) keeps how the run was made
    assert rewritten["provenance"] == given and rewritten["rewritten_by"]["command"].startswith("python ")
    with pytest.raises(TypeError, match="not JSON serializable"):
        run.write_results({"bad": b"x"})
    assert json.loads(path.read_text())["ids"] == [1, 2]  # the failed write left the previous file
    assert sorted(p.name for p in run.path.iterdir()) == ["results.json"]


def test_layout_paths(tmp_path):
    run = RunDirectory.create(tmp_path, name="r")
    assert run.ledger_path == tmp_path / "r" / "ledger.json"
    assert run.checkpoint_dir == tmp_path / "r" / "checkpoints"
    assert run.plots_dir == tmp_path / "r" / "plots" and run.plots_dir.is_dir()


def test_provenance_names_the_commit_the_process_started_from_not_a_later_head(monkeypatch):
    """A run outlives commits made while it runs, and writes results.json at its end: its commit is the
    newest one made before the process started (a run of 2026-11-29 was stamped with a commit made an hour
    after it started)."""
    import subprocess
    import time

    from fl_algorithms.experiments import rundir

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=rundir.Path(rundir.__file__).parent,
                              timeout=10).stdout.strip()

    head, parent = git("rev-parse", "--short", "HEAD"), git("rev-parse", "--short", "HEAD~1")
    if not head or not parent:
        pytest.skip("needs a git checkout with two commits")
    head_time = int(git("log", "-1", "--format=%ct", "HEAD"))
    parent_time = int(git("log", "-1", "--format=%ct", "HEAD~1"))
    monkeypatch.setattr(rundir, "_process_start", lambda: time.time())
    assert rundir.provenance()["commit"] == head
    if parent_time < head_time:
        monkeypatch.setattr(rundir, "_process_start", lambda: head_time - 0.5)
        earlier = rundir.provenance()["commit"]
        assert earlier != head and earlier == git("rev-list", "-1", "--abbrev-commit", f"--before=@{head_time - 1}", "HEAD")
    assert rundir._process_start() is None or rundir._process_start() <= time.time()
