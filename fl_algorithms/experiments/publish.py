"""Results pages from run records: `fedsecure report RUN_DIR --publish [PAGE]` and `--check PAGE...`.

A results page (docs/results/*.md) keeps its hand-written prose; what a run measured is pasted into it by
this module, never by hand, so every published table says which command, device, date and commit made it:

    <!-- generated from results/fedmcp_issue55/kept-fp32 by fedsecure report --publish: regenerate, do not edit -->
    ### kept-fp32 (`results/fedmcp_issue55/kept-fp32`)

    Command: `python examples/fedmcp_secure.py ...` · device: 2-core CPU (...) · date: 2026-11-29 · commit: 2eb1c6c

    ```text
    (what `--resume RUN_DIR --report` printed)
    ```

    (the run's table.md, verbatim, when it has one)
    <!-- end generated: results/fedmcp_issue55/kept-fp32 -->

The block is keyed by the run directory's path relative to the repository: publishing the same run again
replaces its block in place (the same record gives the same file), a new run's block is appended under
`## Generated from run records` (created at the end of the page when missing). The report text is what the
experiment's own report command prints (`run_report`: a subprocess of this Python, as `fedsecure report`
runs it), with progress-bar carriage returns and ANSI codes removed and the repository's absolute path made
relative. A run whose results.json carries no `provenance` (command, device, date) is refused, and a report
that fails writes nothing. This module imports nothing heavy: `fedsecure --help` stays fast.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
"""The checkout: block keys are run paths relative to it, and its package is what the report subprocess imports."""
SECTION = "## Generated from run records"
SECTION_NOTE = ("Each block below is written by `fedsecure report RUN_DIR --publish` from that run directory's "
                "records (its report command's output and its results.json's provenance); regenerate a block "
                "rather than editing it, and `fedsecure report --check` checks the page.")
BEGIN = "<!-- generated from {run} by fedsecure report --publish: regenerate, do not edit -->"
END = "<!-- end generated: {run} -->"
BEGIN_LINE = re.compile(r"^<!-- generated from (?P<run>\S+) by fedsecure report --publish: regenerate, do not edit -->$")
END_LINE = re.compile(r"^<!-- end generated: (?P<run>\S+) -->$")
ANY_MARKER = re.compile(r"^<!-- (generated from|end generated:) ")
PROVENANCE_LINE = re.compile(r"^Command: .+ · device: .+ · date: .+ · commit: .+$")
ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
STDERR_TAIL = 20
"""Lines of a failed report's stderr shown in the error."""
REQUIRED = ("command", "device", "date")
"""What a result must say to be published: without them a table cannot be traced to how it was made."""


class PublishError(Exception):
    """A run cannot be published (no provenance, a failed report, a malformed page); the page is untouched."""


@dataclass(frozen=True)
class Provenance:
    """Where a run's result came from, as results.json's `provenance` records it (`rundir.provenance()`)."""

    command: str
    device: str
    date: str
    commit: str | None = None

    @classmethod
    def of(cls, run: Path) -> Provenance:
        """`run`'s results.json provenance; PublishError when the file, the entry or one of command, device and
        date is missing: a result that cannot be traced is not published."""
        path = run / "results.json"
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise PublishError(f"{run}: no results.json, so no provenance (command, device, date): a run is "
                               "published only from a finished run's record") from None
        except (OSError, ValueError) as error:
            raise PublishError(f"{path} cannot be read ({error})") from None
        found = doc.get("provenance") if isinstance(doc, dict) else None
        if not isinstance(found, dict):
            raise PublishError(f"{path} has no provenance (command, device, date): a result that does not say how, "
                               "where and when it was made is not published")
        missing = [k for k in REQUIRED if not found.get(k)]
        if missing:
            raise PublishError(f"{path}: its provenance lacks {', '.join(missing)}; not published")
        return cls(command=str(found["command"]), device=str(found["device"]), date=str(found["date"]),
                   commit=None if found.get("commit") is None else str(found["commit"]))

    def line(self) -> str:
        """The block's one provenance line (what `check_page` looks for)."""
        return (f"Command: {_code(self.command)} · device: {self.device} · date: {self.date} · "
                f"commit: {self.commit or 'none'}")


@dataclass(frozen=True)
class Report:
    """What a run's report command did: its exit status, its output and how long it took."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float


@dataclass(frozen=True)
class Published:
    """One publication: the page written, the run's key, whether an existing block was replaced, the cleaned
    report text and the report's seconds."""

    page: Path
    key: str
    replaced: bool
    text: str
    seconds: float


def run_report(script: Path, *, run: str, cwd: Path, no_progress: bool, timeout: float = 1800.0) -> Report:
    """Run `script --resume RUN --report [--no-progress]` as `fedsecure report` does, in a subprocess of this
    Python (from `cwd`, this package importable), capturing its output; nothing is trained."""
    args = [sys.executable, str(script), "--resume", run, "--report", *(["--no-progress"] if no_progress else [])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPOSITORY), os.environ.get("PYTHONPATH"))
                                                       if p)}
    start = time.perf_counter()
    try:
        done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as error:
        stderr = error.stderr.decode(errors="replace") if isinstance(error.stderr, bytes) else (error.stderr or "")
        return Report(returncode=124, stdout="", stderr=stderr + f"\n(timed out after {timeout:.0f} s)",
                      seconds=time.perf_counter() - start)
    return Report(returncode=done.returncode, stdout=done.stdout, stderr=done.stderr,
                  seconds=time.perf_counter() - start)


def clean(text: str, *, root: Path = REPOSITORY) -> str:
    """Terminal output as a page shows it: ANSI codes removed, each line as a terminal leaves it after its
    carriage returns (a progress bar's last state; an empty one dropped), `root`'s absolute path made relative,
    trailing blanks trimmed."""
    lines = []
    for raw in ANSI.sub("", text).replace("\r\n", "\n").split("\n"):
        line = raw.rstrip("\r")
        if "\r" in line:
            line = line.rsplit("\r", 1)[-1]
            if not line.strip():
                continue  # a progress bar that cleared itself
        lines.append(line.rstrip())
    out = "\n".join(lines).strip("\n")
    for prefix in dict.fromkeys((str(root), str(root.resolve()))):
        out = out.replace(prefix + "/", "")
        out = re.sub(re.escape(prefix) + r"(?![\w.-])", ".", out)
    return out


def run_key(run: Path, *, root: Path = REPOSITORY) -> str:
    """The run directory as the page names it: its path relative to `root`, with forward slashes;
    PublishError for a run outside `root` (a page never shows a machine's absolute paths)."""
    try:
        return Path(run).resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        raise PublishError(f"{run} is not inside {root}: a published run is named by its path in the repository "
                           "(results/...)") from None


def render_block(*, key: str, provenance: Provenance, text: str, table: str | None = None) -> list[str]:
    """A run's generated block, markers included, as lines."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)  # longer than any backtick run in the text: the fence cannot be closed early
    lines = [BEGIN.format(run=key), f"### {key.rsplit('/', 1)[-1]} ({_code(key)})", "", provenance.line(), "",
             f"{fence}text", *text.split("\n"), fence]
    if table and table.strip():
        lines += ["", *table.strip("\n").split("\n")]
    return [*lines, END.format(run=key)]


def place(page: str, *, key: str, block: Sequence[str]) -> tuple[str, bool]:
    """`page` with `block` as run `key`'s generated block: replacing the run's block where it is, else appended
    to the `SECTION` (made at the end when missing); and whether a block was replaced. PublishError when the
    run's block has no end marker (the page needs a look first)."""
    lines = page.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    begin = BEGIN.format(run=key)
    if begin in lines:
        start = lines.index(begin)
        end = next((i for i in range(start + 1, len(lines)) if lines[i] == END.format(run=key)), None)
        stray = next((i for i in range(start + 1, end if end is not None else len(lines))
                      if ANY_MARKER.match(lines[i])), None)
        if end is None or stray is not None:
            raise PublishError(f"the page's block for {key} (line {start + 1}) has no end marker "
                               f"{END.format(run=key)!r} before the next marker: fix the page by hand first")
        return "\n".join([*lines[:start], *block, *lines[end + 1:]]) + "\n", True
    if SECTION not in _outside_blocks(lines):
        while lines and not lines[-1].strip():
            lines.pop()
        return "\n".join([*lines, "", SECTION, "", SECTION_NOTE, "", *block]) + "\n", False
    section = _outside_blocks(lines).index(SECTION)
    after = _section_end(lines, section)
    head, tail = lines[:after], lines[after:]
    while head and not head[-1].strip():
        head.pop()
    return "\n".join([*head, "", *block, *([""] + tail if tail else [])]) + "\n", False


def _outside_blocks(lines: Sequence[str]) -> list[str | None]:
    """`lines` with those inside generated blocks or code fences replaced by None (so a report's own text
    never counts as a heading of the page)."""
    out: list[str | None] = []
    inside = fenced = False
    for line in lines:
        if BEGIN_LINE.match(line):
            inside = True
        if not inside and line.lstrip().startswith("```"):
            fenced = not fenced
            out.append(None)
            continue
        out.append(None if inside or fenced else line)
        if END_LINE.match(line):
            inside = False
    return out


def _section_end(lines: Sequence[str], section: int) -> int:
    """The index just past the `SECTION` starting at `section`: the next heading of level 1 or 2, or the end."""
    visible = _outside_blocks(lines)
    for i in range(section + 1, len(lines)):
        line = visible[i]
        if line is not None and re.match(r"^#{1,2} ", line):
            return i
    return len(lines)


def check_page(page: Path | str, *, root: Path = REPOSITORY) -> list[str]:
    """What is wrong with a page's generated blocks (empty: nothing): a begin marker without its end (or an end
    without its begin, or for another run), a run published twice, a block without its Command/device/date line,
    an absolute path of `root` in a block. `page` is a path or the page's text."""
    text = page.read_text(encoding="utf-8") if isinstance(page, Path) else page
    name = str(page) if isinstance(page, Path) else "page"
    problems: list[str] = []
    seen: dict[str, int] = {}
    open_key: str | None = None
    opened = 0
    body: list[str] = []

    def close() -> None:
        if not any(PROVENANCE_LINE.match(line) for line in body):
            problems.append(f"{name}:{opened}: the block for {open_key} has no 'Command: ... · device: ... · "
                            "date: ... · commit: ...' line")
        if any(str(root) in line for line in body):
            problems.append(f"{name}:{opened}: the block for {open_key} shows the absolute path {root}")

    for number, line in enumerate(text.split("\n"), start=1):
        begin, end = BEGIN_LINE.match(line), END_LINE.match(line)
        if begin:
            if open_key is not None:
                problems.append(f"{name}:{opened}: the block for {open_key} has no end marker (another block "
                                f"begins at line {number})")
            open_key, opened, body = begin["run"], number, []
            if open_key in seen:
                problems.append(f"{name}:{number}: {open_key} is published twice (first at line {seen[open_key]})")
            seen.setdefault(open_key, number)
        elif end:
            if open_key is None:
                problems.append(f"{name}:{number}: an end marker for {end['run']} without its begin marker")
            elif end["run"] != open_key:
                problems.append(f"{name}:{number}: the end marker names {end['run']}, but the block open since "
                                f"line {opened} is {open_key}")
                open_key = None
            else:
                close()
                open_key = None
        elif open_key is not None:
            body.append(line)
    if open_key is not None:
        problems.append(f"{name}:{opened}: the block for {open_key} has no end marker")
    return problems


def publish(run: Path, page: Path, *, script: Path, no_progress: bool = True, root: Path = REPOSITORY) -> Published:
    """Write run `run`'s generated block into `page` (module doc), atomically; PublishError, with nothing written,
    when the run has no provenance, its report fails or the page's block for it is malformed. `script` is the
    example whose `--resume RUN --report` prints the report; `no_progress`: whether it takes --no-progress."""
    run = Path(run)
    if not page.is_file():
        raise PublishError(f"{page}: no such page (a results page is created by hand, with its prose)")
    key = run_key(run, root=root)
    provenance = Provenance.of(run)
    results = run / "results.json"
    before = results.read_bytes()
    report = run_report(script, run=key, cwd=root, no_progress=no_progress)
    _restore(results, before)
    if report.returncode != 0:
        tail = "\n".join(clean(report.stderr, root=root).split("\n")[-STDERR_TAIL:])
        flags = " --no-progress" if no_progress else ""
        raise PublishError(f"the report of {key} failed (exit {report.returncode}: {script.name} --resume {key} "
                           f"--report{flags}); nothing written. Its stderr ends:\n{tail}")
    text = clean(report.stdout, root=root)
    table = clean(read, root=root) if (read := _text(run / "table.md")) is not None else None
    block = render_block(key=key, provenance=provenance, text=text, table=table)
    updated, replaced = place(page.read_text(encoding="utf-8"), key=key, block=block)
    problems = check_page(updated, root=root)
    if problems:
        raise PublishError(f"{page} would have malformed generated blocks; nothing written:\n" + "\n".join(problems))
    write_atomically(page, updated)
    return Published(page=page, key=key, replaced=replaced, text=text, seconds=report.seconds)


def _restore(results: Path, before: bytes) -> None:
    """Put back results.json as the run wrote it when its report rewrote it: a report runs nothing, but the grids'
    reports rewrite the file from their cells with the report's own provenance (and fedseit's with the report's
    wall time), and the record must keep the command and numbers of the run that made it."""
    try:
        if results.read_bytes() == before:
            return
    except OSError:
        pass
    write_atomically(results, before)


def _text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


def _code(text: str) -> str:
    """`text` as inline code, fenced by more backticks than it holds."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    tick = "`" * (longest + 1)
    return f"{tick} {text} {tick}" if longest else f"`{text}`"


def write_atomically(path: Path, content: str | bytes) -> None:
    """Temp file beside `path`, fsync, rename: the file is the old one or the new one, never half of one."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    data = content.encode("utf-8") if isinstance(content, str) else content
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
