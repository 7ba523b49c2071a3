import argparse
import re

import pytest

from fl_algorithms.experiments.cli import comma_list
from fl_algorithms.experiments.task import check_options, int_option, settings_option
from fl_algorithms.tasks.fednlp import FedNLPSettings


def test_comma_list_parses_checks_choices_and_repeats():
    seeds = comma_list(int, what="seed")
    assert seeds(" 0, 1,2 ") == (0, 1, 2)
    methods = comma_list(str, what="method", choices=("a", "b"))
    assert methods("b,a") == ("b", "a")
    for parse, text, message in ((seeds, ",", "at least one seed"), (seeds, "0,x", "comma list of seeds"),
                                 (methods, "a,c", "unknown method(s) ['c']"), (methods, "a,a", "repeated methods")):
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape(message)):
            parse(text)


def test_task_option_helpers_name_what_is_wrong():
    check_options({"a": "1"}, ("a", "b"), task="t")
    with pytest.raises(ValueError, match=r"unknown t task options \['z'\]"):
        check_options({"z": "1"}, ("a",), task="t")
    assert settings_option(FedNLPSettings, {}) == FedNLPSettings()
    assert settings_option(FedNLPSettings, {"settings": '{"clients": 5, "clients_per_round": 2}'}).clients == 5
    for text, message in (("{", "not JSON"), ("[]", "JSON object"), ('{"x": 1}', "unknown settings")):
        with pytest.raises(ValueError, match=message):
            settings_option(FedNLPSettings, {"settings": text})
    assert int_option({}, "threads", default=1, minimum=1) == 1
    assert int_option({"threads": "3"}, "threads", default=1, minimum=1) == 3
    for text, message in (("x", "must be an integer"), ("0", "at least 1")):
        with pytest.raises(ValueError, match=message):
            int_option({"threads": text}, "threads", default=1, minimum=1)


def test_open_run_creates_a_new_run_and_resumes_it(tmp_path, capsys):
    import argparse

    from fl_algorithms.experiments.cli import open_run, read_cells

    parser = argparse.ArgumentParser()
    new = argparse.Namespace(resume=None, out=str(tmp_path), run_name="r")
    run, plan = open_run(parser, new, default_out=tmp_path / "unused", build=lambda: {"rounds": 3},
                         load=dict, record=lambda p: {**p, "saved": True})
    assert run == tmp_path / "r" and plan == {"rounds": 3}
    # no message: argparse exits with status 2; the reason is asserted on stderr below
    with pytest.raises(SystemExit):  # an existing directory is never overwritten
        open_run(parser, new, default_out=tmp_path, build=dict, load=dict, record=dict)
    assert "exists: choose another --run-name or --resume it" in capsys.readouterr().err
    again, loaded = open_run(parser, argparse.Namespace(resume=str(run), out=None, run_name=None),
                             default_out=tmp_path, build=lambda: pytest.fail("built again"), load=dict, record=dict)
    assert again == run and loaded == {"rounds": 3, "saved": True}
    # no message: argparse exits with status 2; the reason is asserted on stderr below
    with pytest.raises(SystemExit):
        open_run(parser, argparse.Namespace(resume=str(tmp_path / "none"), out=None, run_name=None),
                 default_out=tmp_path, build=dict, load=dict, record=dict)
    assert "no readable plan.json" in capsys.readouterr().err
    assert read_cells(run / "cells.jsonl", key=lambda r: r["k"]) == {}
    (run / "cells.jsonl").write_text('{"k": "a", "v": 1}\n{"k": "b", "v": 2}\n')
    assert read_cells(run / "cells.jsonl", key=lambda r: r["k"]) == {"a": {"k": "a", "v": 1}, "b": {"k": "b", "v": 2}}


def test_a_resumed_run_refuses_plan_options_and_accepts_run_options_and_growable_ones(tmp_path, capsys):
    from fl_algorithms.experiments.cli import given_options, open_run, plan_options_given

    parser = argparse.ArgumentParser()
    for flag, default in (("--seeds", None), ("--rounds", 5), ("--quick", False), ("--device", "auto"),
                          ("--threads", 2), ("--resume", None)):
        parser.add_argument(flag, default=default, **({"action": "store_true"} if default is False else {}))
    run = tmp_path / "r"
    run.mkdir()
    (run / "plan.json").write_text('{"rounds": 5}')
    assert plan_options_given(parser, parser.parse_args(["--device", "cpu", "--threads", "1"])) == []
    argv = ["--resume", str(run), "--rounds", "9", "--quick", "--seeds", "1", "--device", "cpu"]
    given = parser.parse_args(argv)
    assert plan_options_given(parser, given) == ["--seeds", "--rounds", "--quick"]  # away from their defaults
    # written on the command line, even at its default value: the saved plan may hold another
    assert given_options(parser, ["--rounds", "5", "--device", "cpu"]) == {"rounds", "device"}
    assert parser.get_default("rounds") == 5 and parser.parse_args([]).rounds == 5  # defaults restored
    same = parser.parse_args(["--rounds", "5"])
    same.given = given_options(parser, ["--rounds", "5"])
    assert plan_options_given(parser, same) == ["--rounds"]
    assert plan_options_given(parser, given, allowed=("seeds",)) == ["--rounds", "--quick"]
    given.out = given.run_name = None
    # no message: argparse exits with status 2; the reason is asserted on stderr below
    with pytest.raises(SystemExit):
        open_run(parser, given, default_out=tmp_path, build=dict, load=dict, record=dict)
    assert "its saved plan fixes --seeds, --rounds, --quick" in capsys.readouterr().err
    grows = parser.parse_args(["--resume", str(run), "--seeds", "1"])
    grows.out = grows.run_name = None
    assert open_run(parser, grows, default_out=tmp_path, build=dict, load=dict, record=dict,
                    growable=("seeds",)) == (run, {"rounds": 5})


def test_append_cell_round_trips_through_read_cells(tmp_path):
    from fl_algorithms.experiments.cli import append_cell, read_cells

    path = tmp_path / "cells.jsonl"
    append_cell(path, {"seed": 0, "method": "a", "x": 1.5})
    append_cell(path, {"seed": 1, "method": "a", "x": 2.5})
    done = read_cells(path, key=lambda r: f"{r['seed']}/{r['method']}")
    assert done == {"0/a": {"seed": 0, "method": "a", "x": 1.5}, "1/a": {"seed": 1, "method": "a", "x": 2.5}}


def _grid_parser():
    import argparse

    parser = argparse.ArgumentParser()
    for flag, default in (("--threads", 1), ("--device", "cpu"), ("--run-name", None), ("--out", None),
                          ("--resume", None)):
        parser.add_argument(flag, default=default, type=int if flag == "--threads" else None)
    return parser


def test_parse_grid_args_checks_threads_and_resolves_the_device(capsys):
    import pytest

    from fl_algorithms.experiments.cli import parse_grid_args

    parser = _grid_parser()
    args, device = parse_grid_args(parser, [])
    assert device == "cpu" and args.threads == 1
    # no message: argparse exits with status 2; the reason is asserted on stderr below
    with pytest.raises(SystemExit):
        parse_grid_args(parser, ["--threads", "0"])
    assert "--threads must be at least 1" in capsys.readouterr().err


def test_parse_grid_args_reports_a_missing_gpu_as_a_usage_error(monkeypatch, capsys):
    import pytest
    import torch

    from fl_algorithms.experiments.cli import parse_grid_args

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    parser = _grid_parser()
    # no message: argparse exits with status 2; the reason is asserted on stderr below
    with pytest.raises(SystemExit) as exc:
        parse_grid_args(parser, ["--device", "cuda"])
    assert exc.value.code == 2 and "no CUDA device" in capsys.readouterr().err


def test_parse_grid_args_asks_for_deterministic_kernels_on_a_gpu_only(monkeypatch):
    import nlp_models.device as device_module
    from fl_algorithms.experiments import cli

    asked = []
    monkeypatch.setattr(device_module, "deterministic_kernels", lambda: asked.append(True))
    cli.parse_grid_args(_grid_parser(), [])
    assert asked == []  # the CPU is deterministic already
    monkeypatch.setattr(device_module, "resolve_device", lambda name: "cuda:0")
    cli.parse_grid_args(_grid_parser(), [])
    assert asked == [True]


def test_start_workers_starts_none_when_at_most_one_cell_is_left(tmp_path, monkeypatch):
    import argparse
    import json

    from fl_algorithms.experiments import cli, parallel

    started = []
    monkeypatch.setattr(parallel, "run_workers", lambda *a, **k: started.append(k["workers"]))
    cells = [{"i": i} for i in range(3)]
    path = tmp_path / "cells.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in cells[:2]))
    args = argparse.Namespace(workers=4, threads=1, no_progress=True)
    done = cli.start_workers(args, tmp_path, script="x.py", device="cpu", cells=cells, cells_path=path,
                             key=lambda c: str(c["i"]))
    assert set(done) == {"0", "1"} and started == []  # one cell left: the caller runs it itself
    path.write_text("")
    cli.start_workers(args, tmp_path, script="x.py", device="cpu", cells=cells, cells_path=path,
                      key=lambda c: str(c["i"]))
    assert started == [3]  # no more workers than cells left


def test_every_run_option_is_one_resume_accepts():
    from fl_algorithms.experiments.cli import RUN_OPTIONS, add_run_args

    parser = argparse.ArgumentParser()
    add_run_args(parser, cache_help="cache")
    dests = {a.dest for a in parser._actions} - {"help"}
    assert dests <= RUN_OPTIONS and {"device", "threads", "workers", "worker", "cache"} <= dests
    args = parser.parse_args(["--device", "cpu", "--threads", "1", "--workers", "3", "--no-progress"])
    assert args.threads == 1 and args.workers == 3 and args.backbone == "minilm"


class _ToyPlan:
    """A plan of three cells, as the grid examples' plans look to `start_grid`."""

    protocol = "plain"

    def __init__(self, record=None):
        self.rounds = (record or {}).get("rounds", 2)

    def cells(self):
        return [{"i": i} for i in range(3)]

    def record(self):
        return {"rounds": self.rounds}


def test_start_grid_runs_records_resumes_and_summarises_a_grid(tmp_path, monkeypatch, capsys):
    from fl_algorithms.experiments import cli, parallel

    parser = argparse.ArgumentParser()
    cli.add_run_args(parser, cache_help="cache")
    forwarded = []
    monkeypatch.setattr(parallel, "run_workers", lambda *a, **k: forwarded.append(k["forward"]))
    key = lambda c: str(c["i"])  # noqa: E731
    options = dict(script="x.py", default_out=tmp_path, build=lambda args: _ToyPlan(), load=_ToyPlan,
                   record=_ToyPlan.record, key=key)
    grid = cli.start_grid(parser, ["--out", str(tmp_path), "--run-name", "g", "--device", "cpu"], **options)
    assert grid.run == tmp_path / "g" and grid.device == "cpu" and grid.done == {}
    todo = grid.todo()
    first = next(todo)
    assert grid.record(first, lambda: {"i": first["i"], "score": 0.5}) == {"i": 0, "score": 0.5}
    second = next(todo)
    with pytest.raises(SystemExit, match="error: no data"):  # a bad setting: its message, no traceback
        grid.record(second, lambda: (_ for _ in ()).throw(ValueError("no data")))
    assert cli.read_cells(grid.cells_path, key=key) == {"0": {"i": 0, "score": 0.5}}  # the failed cell is not saved
    # resumed, the finished cell is skipped; --workers forwards the options that are set
    again = cli.start_grid(parser, ["--resume", str(grid.run), "--workers", "2", "--cache", "c", "--device", "cpu"],
                           **{**options, "forward": ("backbone", "cache", "run_name")})
    assert forwarded == [["--device", "cpu", "--threads", str(again.args.threads), "--no-progress",
                          "--backbone", "minilm", "--cache", "c"]]
    assert [c["i"] for c in again.todo()] == [1, 2]
    for cell in (again.plan.cells()[1], again.plan.cells()[2]):
        again.record(cell, lambda: {"i": cell["i"], "score": 1.0})
    written = {}
    rows = again.summarise(write_table=lambda rows, csv_path, md_path: (md_path.write_text("| table |"),
                                                                       written.update(csv=csv_path)),
                           plot=lambda rows, path: written.update(plot=path))
    assert [r["i"] for r in rows] == [0, 1, 2] and written == {"csv": grid.run / "summary.csv",
                                                               "plot": grid.run / "curves.png"}
    assert "| table |" in capsys.readouterr().out


def test_the_training_protocol_option_formats_its_help():
    """Preset summaries mention percentages ('warmup (6%)'): argparse %-formats help text."""
    import argparse

    from fl_algorithms.experiments.cli import add_training_protocol_arg

    parser = argparse.ArgumentParser()
    add_training_protocol_arg(parser, default="fednlp")
    assert "warmup (6%)" in " ".join(parser.format_help().split())
