"""dp.audit.selftest and `python -m dp.audit`: the suite's report and its last line."""
import json
import re
import subprocess
import sys

import pytest

from dp.audit.__main__ import main
from dp.audit.selftest import FAULT_TRIALS, Case, default_cases, run_selftest

LAST = re.compile(r"^audit_selftest faults=(\d+) flagged=(\d+) false_alarms=(\d+)$")


def test_the_suite_holds_five_faults_and_correct_runs_over_two_seeds():
    cases = default_cases()
    faults = [c for c in cases if c.fault]
    assert sorted(c.fault for c in faults) == sorted(FAULT_TRIALS) and len(faults) == 5
    correct = [c for c in cases if not c.fault]
    assert len(correct) == 12 and {c.seed for c in correct} == {1, 2}
    assert {c.mechanism for c in correct} == {"ddp_skellam", "ddp_dgauss", "central"}


def test_a_small_suite_counts_flags_and_false_alarms(capsys):
    cases = [Case("fault:clipping_skipped", "ddp_skellam", "clipping_skipped", 60, seed=4),
             Case("correct:central", "central", None, 60, seed=4)]
    report = run_selftest(cases=cases, jobs=1)
    assert LAST.match(report.last_line()).groups() == ("1", "1", "0") and report.passed
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 2 and printed[0].startswith("case fault:clipping_skipped") and "flagged=1" in printed[0]
    assert json.loads(json.dumps(report.to_dict(), default=str))["passed"] is True


def test_a_single_audit_from_the_command_line(capsys, tmp_path):
    out = tmp_path / "audit.json"
    assert main(["--mechanism", "central", "--trials", "20", "--held-out", "20", "--json", str(out)]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.match(r"^audit mechanism=central claimed_eps=\S+ empirical_eps=\S+ eps_lower_bound=\S+ canaries=420$", line)
    assert json.loads(out.read_text())["mechanism"] == "central"


@pytest.mark.slow
def test_the_selftest_passes_from_the_command_line():
    done = subprocess.run([sys.executable, "-m", "dp.audit", "--selftest", "--quiet"], capture_output=True, text=True,
                          timeout=900)
    last = done.stdout.strip().splitlines()[-1]
    assert LAST.match(last).groups() == ("5", "5", "0"), done.stdout + done.stderr
    assert done.returncode == 0
