"""fl_algorithms.experiments.flags: the shared options, one spelling each, and only those an example takes."""
import argparse

import pytest

from fl_algorithms.experiments.flags import CATALOG, add_common_flags, help_missing


def _parser(**flags) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="example")
    add_common_flags(p, **flags)
    return p


def test_algorithms_and_its_hidden_older_name_methods_fill_one_destination(capsys):
    p = _parser(algorithms=("a", "b"), default_algorithms=("a",), algorithm_word="method")
    assert p.parse_args(["--algorithms", "b,a"]).algorithms == ("b", "a")
    assert p.parse_args(["--methods", "b"]).algorithms == ("b",)
    assert p.parse_args([]).algorithms is None  # the example's preset decides
    text = p.format_help()
    assert "--algorithms" in text and "--methods is its older name" in text and "--methods METHODS" not in text
    with pytest.raises(SystemExit) as exit:
        p.parse_args(["--methods", "c"])
    assert exit.value.code == 2 and "unknown method(s) ['c']" in capsys.readouterr().err


def test_catalog_algorithms_take_catalog_names_and_module_targets(capsys):
    p = _parser(algorithms=CATALOG)
    assert p.parse_args(["--algorithms", "fedavg,fedprox,my.module:MyMethod"]).algorithms == (
        "fedavg", "fedprox", "my.module:MyMethod")
    with pytest.raises(SystemExit):
        p.parse_args(["--algorithms", "fedavg,nonsense"])
    assert "unknown algorithm(s) ['nonsense']" in capsys.readouterr().err


def test_options_an_example_does_not_take_are_refused_not_ignored(capsys):
    p = _parser(quick="small", seeds="0")
    for flag in (["--runtime", "deploy"], ["--algorithms", "fedavg"], ["--resume", "x"], ["--report"]):
        with pytest.raises(SystemExit) as exit:
            p.parse_args(flag)
        assert exit.value.code == 2 and "unrecognized arguments" in capsys.readouterr().err, flag


def test_seeds_quick_full_and_the_run_options():
    p = _parser(quick="small", full="big", seeds="0", rounds="default 5", protocols=("secagg", "secagg+"),
                runtime=True, backend=True, device="cpu", out="results/x", resume="continue it", workers="processes",
                progress=True, report=True)
    args = p.parse_args(["--quick", "--seeds", "0,2", "--rounds", "3", "--protocol", "secagg", "--runtime", "deploy",
                         "--backend", "ray", "--out", "o", "--run-name", "r", "--resume", "d", "--workers", "2",
                         "--no-progress", "--report"])
    assert (args.quick, args.seeds, args.rounds, args.protocol, args.runtime, args.backend) == (
        True, (0, 2), 3, "secagg", "deploy", "ray")
    assert (args.device, args.out, args.run_name, args.resume, args.workers, args.no_progress, args.report) == (
        "cpu", "o", "r", "d", 2, True, True)
    with pytest.raises(SystemExit):
        p.parse_args(["--quick", "--full"])
    assert help_missing(p) == []


def test_seeds_spaces_takes_both_spellings_and_refuses_repeats(capsys):
    p = _parser(seeds="0", seeds_spaces=True)
    assert p.parse_args(["--seeds", "0", "1,2"]).seeds == (0, 1, 2)
    with pytest.raises(SystemExit):
        p.parse_args(["--seeds", "0,1", "1"])
    assert "repeated" in capsys.readouterr().err


def test_the_grid_run_options_have_help():
    p = _parser(grid=True, cache="the cache", report=True)
    assert {"--device", "--backbone", "--threads", "--cache", "--out", "--run-name", "--resume", "--no-progress",
            "--workers", "--report"} <= set(p._option_string_actions)
    assert help_missing(p) == []
