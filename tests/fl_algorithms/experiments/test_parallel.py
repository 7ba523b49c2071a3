"""Cells of a grid in several processes: each cell runs once, a unit stays in one process, failures are
reported with the finished cells kept."""
import json
import multiprocessing
import textwrap
import time
from pathlib import Path

import pytest

from fl_algorithms.experiments.cli import read_cells
from fl_algorithms.experiments.parallel import CLAIMS, claim, file_lock, pending, run_workers

CELLS = [{"seed": s, "method": m} for s in (0, 1) for m in ("a", "b", "c")]


def key(cell):
    return f"{cell['method']} seed {cell['seed']}"


def _claim_all(run: str, units: list[str], out) -> None:
    out.put([u for u in units if claim(Path(run), u)])


def test_each_unit_is_claimed_by_exactly_one_process(tmp_path):
    units = [f"cell {i}" for i in range(40)]
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_claim_all, args=(str(tmp_path), units, out)) for _ in range(4)]
    for p in procs:
        p.start()
    won = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    flat = [u for w in won for u in w]
    assert sorted(flat) == sorted(units)  # every unit once, none twice
    assert len(list((tmp_path / CLAIMS).iterdir())) == len(units)


def test_pending_skips_finished_cells_and_splits_the_rest_between_workers(tmp_path):
    done = {key(CELLS[0]): {}}
    assert list(pending(CELLS, done, key=key)) == CELLS[1:]  # no run: every unfinished cell, in order
    first = pending(CELLS, done, key=key, run=tmp_path)
    second = pending(CELLS, done, key=key, run=tmp_path)
    taken: list[list[dict]] = [[], []]
    for _ in range(5):  # the workers take turns, each claiming when it is free
        for i, worker in enumerate((first, second)):
            cell = next(worker, None)
            if cell is not None:
                taken[i].append(cell)
    assert sorted(map(key, taken[0] + taken[1])) == sorted(map(key, CELLS[1:]))
    assert taken[0] and taken[1] and not {key(c) for c in taken[0]} & {key(c) for c in taken[1]}


def test_a_unit_runs_in_the_process_that_claimed_it(tmp_path):
    by_seed = lambda cell: f"seed {cell['seed']}"  # noqa: E731
    first = pending(CELLS, {}, key=key, unit=by_seed, run=tmp_path)
    second = pending(CELLS, {}, key=key, unit=by_seed, run=tmp_path)
    a = [next(first)]
    b = list(second)  # seed 0 is the first's: the second runs every cell of seed 1
    a += list(first)
    assert {c["seed"] for c in a} == {0} and len(a) == 3
    assert {c["seed"] for c in b} == {1} and len(b) == 3


def _append_under_lock(lock: str, path: str, tag: str) -> None:
    for _ in range(5):
        with file_lock(Path(lock)):
            with open(path, "a") as handle:
                handle.write(f"{tag} start\n")
                handle.flush()
                time.sleep(0.01)
                handle.write(f"{tag} end\n")


def test_file_lock_serialises_processes(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    log = tmp_path / "log"
    procs = [ctx.Process(target=_append_under_lock, args=(str(tmp_path / "x.lock"), str(log), t)) for t in "pq"]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    lines = log.read_text().splitlines()
    assert len(lines) == 20
    for start, end in zip(lines[::2], lines[1::2]):  # nobody wrote inside another's locked block
        assert start.endswith("start") and end == start.replace("start", "end")


FAKE_GRID = textwrap.dedent('''
    import json, os, sys, time
    from pathlib import Path
    from fl_algorithms.experiments.parallel import pending
    args = sys.argv[1:]
    run = Path(args[args.index("--resume") + 1])
    assert "--worker" in args and args[-2:] == ["--tag", "forwarded"], args
    cells = [{"i": i} for i in range(8)]
    for cell in pending(cells, {}, key=lambda c: str(c["i"]), run=run):
        if cell["i"] == int(os.environ.get("FAIL_AT", "-1")):
            sys.exit(3)
        time.sleep(0.05)
        with open(run / "cells.jsonl", "a") as handle:
            handle.write(json.dumps({"i": cell["i"], "pid": os.getpid()}) + "\\n")
''')


def test_run_workers_runs_every_cell_once_across_processes(tmp_path, monkeypatch):
    script = tmp_path / "grid.py"
    script.write_text(FAKE_GRID)
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[3]))
    run = tmp_path / "run"
    run.mkdir()
    (run / CLAIMS).mkdir()
    (run / CLAIMS / "stale").write_text("a claim left by a killed start\n")
    run_workers(run, script=script, workers=3, forward=["--tag", "forwarded"], total=8, progress=False, poll=0.05)
    rows = read_cells(run / "cells.jsonl", key=lambda r: str(r["i"]))
    assert sorted(int(k) for k in rows) == list(range(8))
    assert len((run / "cells.jsonl").read_text().splitlines()) == 8  # none ran twice
    assert not (run / CLAIMS / "stale").exists()
    assert sorted(p.name for p in (run / "logs").iterdir()) == ["worker-0.log", "worker-1.log", "worker-2.log"]


def test_a_failed_worker_stops_the_run_and_keeps_the_finished_cells(tmp_path, monkeypatch, capsys):
    script = tmp_path / "grid.py"
    script.write_text(FAKE_GRID)
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[3]))
    monkeypatch.setenv("FAIL_AT", "5")
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(SystemExit, match=r"worker\(s\) \[\d\] failed.*--resume"):
        run_workers(run, script=script, workers=2, forward=["--tag", "forwarded"], total=8, progress=False, poll=0.05)
    assert "exited with 3" in capsys.readouterr().err
    finished = [json.loads(x)["i"] for x in (run / "cells.jsonl").read_text().splitlines()]
    assert 5 not in finished and len(finished) == len(set(finished)) >= 1
    with pytest.raises(ValueError, match="run_workers needs at least 2 workers"):
        run_workers(run, script=script, workers=1, forward=[], total=8)


def test_run_pool_runs_at_most_n_at_a_time_and_reports_failures(tmp_path):
    import sys

    from fl_algorithms.experiments.parallel import run_pool

    script = ("import sys, time, pathlib; d = pathlib.Path(sys.argv[1]); i = sys.argv[2]; "
              "(d / f'{i}.start').write_text(str(time.time())); time.sleep(0.3); "
              "(d / f'{i}.end').write_text(str(time.time())); print('ran', i); sys.exit(int(i) == 3)")
    commands = [[sys.executable, "-c", script, str(tmp_path), str(i)] for i in range(6)]
    logs = [tmp_path / "logs" / f"{i}.log" for i in range(6)]
    assert run_pool(commands, workers=2, logs=logs, progress=False, poll=0.02) == [3]
    spans = [(float((tmp_path / f"{i}.start").read_text()), float((tmp_path / f"{i}.end").read_text())) for i in range(6)]
    for t, _ in spans:  # at any start, at most 2 commands are running
        assert sum(start <= t < end for start, end in spans) <= 2
    assert all(log.read_text().strip() == f"ran {i}" for i, log in enumerate(logs))
    with pytest.raises(ValueError, match="one log per command"):
        run_pool(commands, workers=2, logs=logs[:2])
