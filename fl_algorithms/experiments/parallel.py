"""A grid's cells in several processes on one machine: one GPU is kept busy only by several of them.

A model of MiniLM's size leaves a GPU idle between kernel launches when one process drives it; the
FedMCP grid on an H200 reached 99% of the GPU's time with nine processes. So a grid example given
``--workers N`` starts N copies of itself on its own run directory (``--resume RUN_DIR --worker``),
each claiming the next unfinished cell when it is free, and writes the tables once they are done:

    grid = start_grid(parser, argv, script=__file__, ...)   # cli: run directory, plan.json, and under
                                                            # --workers N the workers' run_workers
    for cell in grid.todo():                                # pending(): a worker runs only the cells it claimed
        row = grid.record(cell, lambda: run_cell(cell, ...))

A claim is a file created exclusively under ``RUN_DIR/claims/``; the starting process clears them,
so cells claimed by a worker that died run again on the next start (finished cells are in
cells.jsonl and are never rerun). ``file_lock`` serialises work several workers would otherwise
repeat at once (a shared cache they would all build).
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

CLAIMS = "claims"


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on `path` (created if absent) for the block: other processes wait."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def claim(run: Path, unit: str) -> bool:
    """Claim `unit` of the grid in `run` for this process: True for the first process to ask, else False."""
    folder = run / CLAIMS
    folder.mkdir(exist_ok=True)
    name = hashlib.sha256(unit.encode()).hexdigest()[:24]
    try:
        fd = os.open(folder / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as handle:
        handle.write(f"{unit}\n{os.getpid()}\n")
    return True


def pending(cells: Iterable[Mapping[str, Any]], done: Mapping[str, Any], *, key: Callable[[Any], str],
            unit: Callable[[Any], str] | None = None, run: Path | None = None) -> Iterator[Mapping[str, Any]]:
    """The unfinished cells in plan order. A worker (`run` given) gets only the cells whose unit it claims
    first, claiming each unit when it reaches it; `unit` (default: the cell's key) groups cells that
    must run in one process, e.g. a secure run and the plaintext twin compared with it."""
    mine: set[str] = set()
    theirs: set[str] = set()
    for cell in cells:
        if key(cell) in done:
            continue
        if run is not None:
            part = (unit or key)(cell)
            if part in theirs:
                continue
            if part not in mine:
                if not claim(run, part):
                    theirs.add(part)
                    continue
                mine.add(part)
        yield cell


def _count_lines(path: Path) -> int:
    try:
        return sum(1 for line in path.read_text().splitlines() if line.strip())
    except FileNotFoundError:
        return 0


def _run_children(commands: Sequence[Sequence[str]], *, workers: int, logs: Sequence[Path], poll: float,
                  tick: Callable[[int], None]) -> dict[int, int]:
    """Run `commands` as child processes, at most `workers` at a time in list order, each one's output to
    its log; `tick(finished)` after every poll. Returns each command's exit code; on an interrupt the
    running children are terminated."""
    queue = list(range(len(commands)))
    running: dict[int, tuple[subprocess.Popen, Any]] = {}
    codes: dict[int, int] = {}
    try:
        while queue or running:
            while queue and len(running) < workers:
                i = queue.pop(0)
                Path(logs[i]).parent.mkdir(parents=True, exist_ok=True)
                log = open(logs[i], "w")
                running[i] = (subprocess.Popen(list(commands[i]), stdout=log, stderr=subprocess.STDOUT), log)
            time.sleep(poll)
            for i, (child, log) in list(running.items()):
                if child.poll() is not None:
                    log.close()
                    del running[i]
                    codes[i] = child.returncode
            tick(len(codes))
    except BaseException:
        for child, log in running.values():
            child.terminate()
            log.close()
        raise
    return codes


def run_workers(run: Path, *, script: str | Path, workers: int, forward: Sequence[str], total: int,
                progress: bool = True, poll: float = 2.0) -> None:
    """Run the unfinished cells of the grid in `run` in `workers` child processes of `script` and wait.

    Each child is ``script --resume run --worker *forward`` (forward: what the saved plan does not hold,
    e.g. --device, --threads, --backbone) with its output in run/logs/worker-I.log; progress counts
    cells.jsonl's lines against `total` cells. A failed child ends the run with its log's tail; the
    finished cells stay, and ``--resume run`` finishes the grid.
    """
    if workers < 2:
        raise ValueError("run_workers needs at least 2 workers")
    shutil.rmtree(run / CLAIMS, ignore_errors=True)  # claims of an interrupted start: their cells are unfinished
    (run / CLAIMS).mkdir()
    logs = [run / "logs" / f"worker-{i}.log" for i in range(workers)]
    cells = run / "cells.jsonl"
    command = [sys.executable, str(script), "--resume", str(run), "--worker", *forward]
    print(f"{workers} worker processes: logs in {run / 'logs'}", flush=True)
    bar = tqdm(total=total, initial=_count_lines(cells), desc="cells", disable=None if progress else True)
    try:
        codes = _run_children([command] * workers, workers=workers, logs=logs, poll=poll,
                              tick=lambda _: bar.update(_count_lines(cells) - bar.n))
    finally:
        bar.close()
    failed = {i: code for i, code in sorted(codes.items()) if code}
    if failed:
        for i, code in failed.items():
            tail = logs[i].read_text().splitlines()[-15:]
            print(f"--- worker {i} exited with {code}; the end of its log:\n" + "\n".join(tail), file=sys.stderr)
        raise SystemExit(f"error: worker(s) {list(failed)} failed; the cells they finished are kept: "
                         f"--resume {run} finishes the grid")


def run_pool(commands: Sequence[Sequence[str]], *, workers: int, logs: Sequence[Path], progress: bool = True,
             poll: float = 1.0, desc: str = "runs") -> list[int]:
    """Run `commands` as child processes, at most `workers` at a time in list order, each one's output to
    its log; wait for all and return the indices of those that failed."""
    if len(logs) != len(commands) or workers < 1:
        raise ValueError("one log per command and at least one worker")
    bar = tqdm(total=len(commands), desc=desc, disable=None if progress else True)
    try:
        codes = _run_children(commands, workers=workers, logs=logs, poll=poll, tick=lambda done: bar.update(done - bar.n))
    finally:
        bar.close()
    return sorted(i for i, code in codes.items() if code)


__all__ = ["CLAIMS", "claim", "file_lock", "pending", "run_pool", "run_workers"]
