"""benchmarks/mutants.py: the catalog is well formed, outcomes are classified from pytest's exit status
and output (an import error is 'broken', never 'killed'), and the quick subset is killed for real."""
from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.mutants import (BROKEN, KILLED, SURVIVED, Outcome, PytestRun, Report, classify, run, run_pytest,
                                select)
from tests.mutants import registry

ROOT = Path(__file__).resolve().parents[2]


def test_the_catalog_names_at_least_20_mutants_with_existing_killing_tests() -> None:
    """Every mutant says what it breaks and names test files that exist; about four are quick."""
    mutants = registry()
    assert len(mutants) >= 20
    for m in mutants.values():
        assert m.breaks and m.tests, m.name
        for node in m.tests:
            path, _, test = node.partition("::")
            assert (ROOT / path).is_file(), node
            if test:
                assert f"def {test}(" in (ROOT / path).read_text(), node
    assert 3 <= len(select(quick=True)) <= 5
    with pytest.raises(KeyError, match="unknown mutants"):
        select(["no_such_mutant"])


@pytest.mark.parametrize("code, output, acknowledged, status", [
    (1, "F\nFAILED tests/x.py::test_a - assert 0\n", True, KILLED),
    (0, ".\n", True, SURVIVED),
    (1, "E\nERROR tests/x.py::test_a - RuntimeError: fixture\n", True, BROKEN),     # not a test failure
    (2, "ERROR tests/x.py - ImportError: cannot import name\n", True, BROKEN),      # collection error
    (4, "ImportError while loading conftest\n", False, BROKEN),                     # the mutant did not load
    (1, "FAILED tests/x.py::test_a - assert 0\n", False, BROKEN),                   # failed, but unmutated
    (None, "timed out after 600 s", True, BROKEN),
])
def test_outcomes_come_from_the_exit_status_and_the_failed_tests(code: int | None, output: str, acknowledged: bool,
                                                                  status: str) -> None:
    """Only a run that installed the mutant and had a test FAIL counts as killed."""
    assert classify(PytestRun(code, output, 1.0, acknowledged))[0] == status


def test_the_last_line_names_the_survivors() -> None:
    report = Report((Outcome("a", KILLED, 1.0, ""), Outcome("b", SURVIVED, 1.0, ""), Outcome("c", BROKEN, 1.0, ""),
                     Outcome("d", SURVIVED, 1.0, "")), clean_ok=True, seconds=4.0)
    assert report.last_line() == "mutants total=4 killed=1 survived=b,d"
    assert not report.ok
    assert Report((Outcome("a", KILLED, 1.0, ""),), clean_ok=True, seconds=1.0).last_line() == \
        "mutants total=1 killed=1 survived=-"


@pytest.mark.slow
def test_the_quick_subset_is_killed_and_an_unknown_mutant_is_broken() -> None:
    """The quick mutants run in subprocesses exactly as `python -m benchmarks.mutants --quick` runs them."""
    lines: list[str] = []
    report = run(quick=True, log=lines.append)
    assert report.clean_ok, lines
    assert report.killed == [m.name for m in select(quick=True)] and report.ok, lines
    unknown = run_pytest(["tests/secagg/test_ring.py"], mutant="no_such_mutant", timeout=300)
    status, detail = classify(unknown)
    assert status == BROKEN and "not installed" in detail, unknown.output[-2000:]
