"""The line an interrupted run prints: the round it reached and the command that resumes it."""
import shlex
from pathlib import Path

import pytest

from fl_algorithms.experiments.interrupt import (carried_options, exit_interrupted, interrupted_line, reached,
                                                 resume_command, script_command, shown)


def test_only_the_options_that_say_where_a_run_executes_are_carried():
    argv = ["--quick", "--device", "cpu", "--rounds", "5", "--threads=2", "--no-progress", "--out", "x", "--threads"]
    assert carried_options(argv) == ["--device", "cpu", "--threads=2", "--no-progress"]  # a dangling option: dropped


def test_the_resume_command_names_the_run_relative_to_here_and_parses_back(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "results" / "my run"
    command = resume_command(program=script_command(tmp_path / "examples" / "x.py"), run_dir=run,
                             argv=["--quick", "--device", "cpu", "--sampler", "seeded"])
    assert command == "python examples/x.py --resume 'results/my run' --device cpu"
    assert shlex.split(command)[2:4] == ["--resume", "results/my run"]
    assert shown(Path("/elsewhere/run")) == "/elsewhere/run"


def test_the_round_reached_is_the_last_logged_one():
    records = [{"seed": 0, "method": "fedavg", "round": 8}, {"seed": 0, "method": "fedprox", "round": 3},
               {"note": "no round"}]
    assert reached(records, rounds=8) == "fedprox (seed 0) reached round 3 of 8"
    assert reached([{"round": 2}]) == "reached round 2"
    assert reached([]) == "no round had finished"


def test_the_interrupted_line_is_one_line_and_exits_130(capsys):
    line = interrupted_line(what="reached round 2 of 5", command="python x.py --resume r")
    assert line == "interrupted: reached round 2 of 5; resume with: python x.py --resume r"
    assert "cannot be resumed" in interrupted_line(what="reached round 2", command=None)
    with pytest.raises(SystemExit) as exc:
        exit_interrupted(what="reached round 2 of 5", command="python x.py --resume r")
    assert exc.value.code == 130 and capsys.readouterr().err == line + "\n"
