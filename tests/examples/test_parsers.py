"""The examples' command lines: help text on every option, one spelling of the shared ones (`--algorithms`,
with `--methods` still accepted), and only the options an example can honour."""
import argparse
import importlib
import sys
from pathlib import Path

import pytest

from fl_algorithms.experiments.flags import help_missing

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

PARSERS = {"adafedselectkd": "_parser", "atc_secure": "_parser", "fedmcp_secure": "_parser",
           "fednlp_classification": "_parser", "fedseit_continual": "_parser", "privacy_frontier": "_parser",
           "secagg_demo": "parser"}
"""Each example's parser builder (examples/fednlp_benchmark.py is being changed elsewhere: not yet here)."""


def _parser(name: str):
    return getattr(importlib.import_module(name), PARSERS[name])()


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_every_option_has_help_text(name):
    assert help_missing(_parser(name)) == []


@pytest.mark.parametrize("name", ["adafedselectkd", "atc_secure", "fedmcp_secure", "fednlp_classification",
                                  "fedseit_continual"])
def test_algorithms_is_the_methods_axis_and_methods_still_works(name):
    parser = _parser(name)
    choices = {"adafedselectkd": "adafedavg,local", "atc_secure": "fedavg,ditto", "fedmcp_secure": "fedmcp,local",
               "fednlp_classification": "fedavg,fedprox", "fedseit_continual": "fedweit,local"}[name]
    expected = tuple(choices.split(","))
    assert parser.parse_args(["--algorithms", choices]).algorithms == expected
    assert parser.parse_args(["--methods", choices]).algorithms == expected
    shown = {flag for a in parser._actions if a.help != argparse.SUPPRESS for flag in a.option_strings}
    assert "--methods" not in shown  # hidden: the help names one spelling


@pytest.mark.parametrize("name, refused", [
    ("fedseit_continual", ["--runtime", "deploy"]),  # its clients are a simulation's (a trusted dealer's keys)
    ("atc_secure", ["--protocol", "secagg"]),        # its plan fixes SecAgg+
    ("privacy_frontier", ["--algorithms", "fedavg"]),  # its axis is --mechanisms
    ("fednlp_classification", ["--workers", "2"]),   # one process runs every method
    ("secagg_demo", ["--no-progress"]),              # it draws no progress bars
])
def test_an_option_an_example_cannot_honour_is_refused(name, refused, capsys):
    with pytest.raises(SystemExit) as exit:
        _parser(name).parse_args(refused)
    assert exit.value.code == 2 and "unrecognized arguments" in capsys.readouterr().err


def test_privacy_frontier_resume_is_only_for_report(capsys):
    frontier = importlib.import_module("privacy_frontier")
    assert frontier.parse_args(["--seeds", "0", "1,2"]).seeds == (0, 1, 2)
    for argv, message in ((["--resume", "x"], "--resume is for --report here"),
                          (["--report"], "give --resume RUN_DIR")):
        with pytest.raises(SystemExit) as exit:
            frontier.parse_args(argv)
        assert exit.value.code == 2 and message in capsys.readouterr().err

