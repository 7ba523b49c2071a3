"""Mutation testing of the privacy guarantees: does the suite fail when one of them breaks?

    python -m benchmarks.mutants                  # every mutant (under 15 min on 2 cores)
    python -m benchmarks.mutants --quick          # the cheap subset (under 60 s on 2 cores)
    python -m benchmarks.mutants --only NAME      # one mutant (repeat --only for more)
    python -m benchmarks.mutants --list           # the catalog: name, what it breaks, its tests

A mutant (`tests/mutants/catalog.py`) breaks one guarantee in memory: SecAgg's pairwise masks, the
distributed-DP noise, the disclosure guard's rules, ... and names the tests that must then fail. For
each selected mutant the runner runs, in a subprocess from the repository root,

    python -m pytest -x -q -p no:cacheprovider <its tests>

with FEDSECURE_MUTANT=NAME, which `tests/conftest.py` installs before anything else. First, the
union of the selected mutants' tests runs once with no mutant: they must pass clean (when they do
not, each mutant's tests are run clean on their own, and a mutant whose tests fail clean is broken).

Outcomes, from pytest's exit status and output:
* killed: exit status 1 with at least one FAILED test, and the mutant acknowledged its installation;
* survived: exit status 0 -- every test passed with the guarantee broken;
* broken: anything else (the mutant did not install, an import or collection error, an error outside
  a test, no test collected, a timeout, or tests that fail without the mutant), never counted as killed.

Ends with exactly one line:

    mutants total=N killed=K survived=NAMES

(NAMES comma-separated, '-' when none; the lines before it name broken mutants, if any, and give the wall
time). The exit
status is 1 when a mutant survived or broke, or the clean run failed; 0 when every mutant was killed.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tests.mutants import ACK_ENV, ENV, Mutant, registry

ROOT = Path(__file__).resolve().parents[1]
PYTEST_ARGS = ("-m", "pytest", "-x", "-q", "-p", "no:cacheprovider")
KILLED, SURVIVED, BROKEN = "killed", "survived", "broken"
_FAILED = re.compile(r"^FAILED (.+?)(?: - .*)?$", re.MULTILINE)
_ERROR = re.compile(r"^ERROR (.+?)(?: - .*)?$", re.MULTILINE)


@dataclass(frozen=True)
class PytestRun:
    returncode: int | None
    """None when the run was stopped at its timeout."""
    output: str
    seconds: float
    acknowledged: bool
    """The mutant wrote its name to the acknowledgement file (always False for a clean run)."""

    @property
    def failed(self) -> list[str]:
        return _FAILED.findall(self.output)

    @property
    def errors(self) -> list[str]:
        return _ERROR.findall(self.output)

    def tail(self, lines: int = 3) -> str:
        kept = [line for line in self.output.strip().splitlines() if line.strip()]
        return " | ".join(kept[-lines:])[:400]


@dataclass(frozen=True)
class Outcome:
    name: str
    status: str
    seconds: float
    detail: str


@dataclass(frozen=True)
class Report:
    outcomes: tuple[Outcome, ...]
    clean_ok: bool
    seconds: float

    def named(self, status: str) -> list[str]:
        return [o.name for o in self.outcomes if o.status == status]

    @property
    def killed(self) -> list[str]:
        return self.named(KILLED)

    @property
    def survived(self) -> list[str]:
        return self.named(SURVIVED)

    @property
    def broken(self) -> list[str]:
        return self.named(BROKEN)

    @property
    def ok(self) -> bool:
        return self.clean_ok and len(self.killed) == len(self.outcomes)

    def last_line(self) -> str:
        return (f"mutants total={len(self.outcomes)} killed={len(self.killed)} "
                f"survived={','.join(self.survived) or '-'}")


def run_pytest(tests: Sequence[str], *, mutant: str | None = None, timeout: float = 600.0,
               python: str = sys.executable) -> PytestRun:
    """`python -m pytest -x -q -p no:cacheprovider TESTS` from the repository root, with FEDSECURE_MUTANT
    set to `mutant` (or unset for a clean run)."""
    env = {k: v for k, v in os.environ.items() if k not in (ENV, ACK_ENV)}
    with tempfile.TemporaryDirectory(prefix="mutant-") as tmp:
        ack = Path(tmp) / "installed"
        if mutant is not None:
            env[ENV], env[ACK_ENV] = mutant, str(ack)
        start = time.perf_counter()
        try:
            proc = subprocess.run([python, *PYTEST_ARGS, *tests], cwd=ROOT, env=env, capture_output=True,
                                  text=True, timeout=timeout)
            code, output = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as exc:
            code = None
            output = _text(exc.stdout) + _text(exc.stderr) + f"\ntimed out after {timeout:.0f} s"
        seconds = time.perf_counter() - start
        acknowledged = mutant is not None and ack.exists() and ack.read_text() == mutant
    return PytestRun(code, output, seconds, acknowledged)


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def classify(run: PytestRun) -> tuple[str, str]:
    """(killed | survived | broken, detail) of one mutated run."""
    if run.returncode is None:
        return BROKEN, f"timeout: {run.tail()}"
    if not run.acknowledged:
        return BROKEN, f"the mutant was not installed (exit {run.returncode}): {run.tail()}"
    if run.returncode == 0:
        return SURVIVED, "every test passed"
    if run.returncode == 1 and run.failed:
        return KILLED, f"by {run.failed[0]}"
    if run.returncode == 1 and run.errors:
        return BROKEN, f"an error outside a test body ({run.errors[0]}): {run.tail()}"
    return BROKEN, f"pytest exit {run.returncode} (collection, import or usage error): {run.tail()}"


def select(names: Iterable[str] | None = None, *, quick: bool = False) -> list[Mutant]:
    """The mutants to run: `names` (KeyError for an unknown one), else the quick subset or all."""
    known = registry()
    if names:
        unknown = sorted(set(names) - set(known))
        if unknown:
            raise KeyError(f"unknown mutants {unknown}; known: {', '.join(sorted(known))}")
        return [known[n] for n in dict.fromkeys(names)]
    return [m for m in known.values() if m.quick or not quick]


def run(names: Iterable[str] | None = None, *, quick: bool = False, jobs: int = 1, timeout: float = 600.0,
        log: Callable[[str], None] = print) -> Report:
    """Run the selected mutants (see the module docstring); `log` gets one line per step."""
    start = time.perf_counter()
    chosen = select(names, quick=quick)
    tests = list(dict.fromkeys(t for m in chosen for t in m.tests))
    clean = run_pytest(tests, timeout=timeout)
    clean_ok = clean.returncode == 0
    log(f"clean run of {len(tests)} test ids: {'passed' if clean_ok else 'FAILED'} in {clean.seconds:.1f} s"
        + ("" if clean_ok else f" ({clean.tail()})"))
    dirty: dict[str, str] = {}
    if not clean_ok:  # attribute the failure: each mutant's tests on their own, still unmutated
        for m in chosen:
            own = run_pytest(m.tests, timeout=timeout)
            if own.returncode != 0:
                dirty[m.name] = f"its tests fail without the mutant: {own.tail()}"

    def one(m: Mutant) -> Outcome:
        if m.name in dirty:
            return Outcome(m.name, BROKEN, 0.0, dirty[m.name])
        mutated = run_pytest(m.tests, mutant=m.name, timeout=timeout)
        status, detail = classify(mutated)
        return Outcome(m.name, status, mutated.seconds, detail)

    outcomes = []
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for outcome in pool.map(one, chosen):
            outcomes.append(outcome)
            log(f"{outcome.name:<32} {outcome.status:<8} {outcome.seconds:6.1f} s  {outcome.detail}")
    return Report(tuple(outcomes), clean_ok, time.perf_counter() - start)


def describe(mutants: Sequence[Mutant]) -> list[str]:
    """The catalog as text: one block per mutant."""
    out = []
    for m in mutants:
        out.append(f"{m.name}{' (quick)' if m.quick else ''}\n    breaks: {m.breaks}\n    killed by: "
                   + "\n               ".join(m.tests))
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="only the mutants marked quick (cheap to kill)")
    parser.add_argument("--only", action="append", metavar="NAME", help="run this mutant (repeatable)")
    parser.add_argument("--list", action="store_true", help="print the catalog and exit")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run side by side (default 1)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per pytest run (default 600)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        chosen = [m.name for m in select(args.only, quick=args.quick)]
    except KeyError as exc:
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return 2
    if args.list:
        print("\n".join(describe(select(chosen))))
        return 0
    report = run(chosen, jobs=args.jobs, timeout=args.timeout)
    if report.broken:
        print(f"broken={','.join(report.broken)} (not killed: see their lines above)")
    print(f"wall={report.seconds:.1f}s clean={'ok' if report.clean_ok else 'FAILED'}")
    print(report.last_line())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
