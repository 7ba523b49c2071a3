"""Argument types the examples share (argparse turns their errors into exit code 2)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any


def comma_list(kind: type, *, what: str, choices: Sequence[Any] | None = None) -> Callable[[str], tuple]:
    """An argparse type: a comma list of `kind` (e.g. `--seeds 0,1,2`), each in `choices`, none repeated."""
    def parse(text: str) -> tuple:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"give at least one {what}")
        try:
            values = [kind(t) for t in items]
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a comma list of {what}s: {text!r}") from None
        if choices is not None and (bad := [v for v in values if v not in choices]):
            raise argparse.ArgumentTypeError(f"unknown {what}(s) {bad}; choose from {', '.join(choices)}")
        if len(set(values)) != len(values):
            raise argparse.ArgumentTypeError(f"repeated {what}s in {text!r}")
        return tuple(values)
    return parse


def add_training_protocol_arg(parser: argparse.ArgumentParser, *, default: str | None) -> None:
    """--training-protocol PRESET: how the clients train (`fl_algorithms.training.protocol.PRESETS`: the
    optimiser per algorithm, its lifetime, schedule and clipping). `default` None leaves the choice to the
    example (e.g. a resumed run's saved protocol)."""
    from fl_algorithms.training.protocol import PRESETS

    choices = "; ".join(f"{name}: {p.summary}" for name, p in PRESETS.items()).replace("%", "%%")  # argparse formats help
    parser.add_argument("--training-protocol", choices=tuple(PRESETS), default=default, metavar="PRESET",
                        help=f"the clients' declared training protocol (default {default or 'see above'}); {choices}")


def protocol_lines(protocols: Mapping[str, Any]) -> list[str]:
    """One header line per algorithm: 'training protocol (fedavg): protocol=fednlp optimizer=sgd(...) ...'."""
    return [f"training protocol ({algorithm}): {protocol.describe()}" for algorithm, protocol in protocols.items()]


def parse_grid_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> tuple[argparse.Namespace, str]:
    """The grid examples' shared start: parse, check the run location and --threads, resolve --device
    ('auto' -> 'cuda' when present); returns (args, device). On a GPU it asks for deterministic kernels:
    every grid compares a secure run with its plaintext twin, which must train bit for bit alike to
    show that they differ by the secure sum's encoding alone (CUDA's atomic-add reductions, e.g. an
    embedding's backward, otherwise differ from run to run)."""
    from nlp_models.device import deterministic_kernels, resolve_device

    args = parser.parse_args(argv)
    args.given = given_options(parser, argv)
    check_run_location(parser, args)
    if args.threads < 1:
        parser.error("--threads must be at least 1")
    if getattr(args, "workers", 1) < 1:
        parser.error("--workers must be at least 1")
    if getattr(args, "worker", False) and (not args.resume or args.workers > 1):
        parser.error("--worker is how --workers starts its processes: it needs --resume and no --workers")
    try:
        device = str(resolve_device(args.device))
    except ValueError as error:  # e.g. --device cuda where torch sees no GPU: a usage error, not a traceback
        parser.error(str(error))
    if device.startswith("cuda"):
        deterministic_kernels()
    return args, device


def add_run_args(parser: argparse.ArgumentParser, *, resume_help: str = "", cache_help: str | None = None) -> None:
    """The options every grid example takes that say where and how it runs, not what it computes
    (RUN_OPTIONS, which `--resume` accepts): --device, --backbone, --threads, --out, --run-name,
    --resume, --no-progress, --workers (and `--cache DIR` where the grid keeps a pre-trained cache)."""
    from fl_algorithms.choices import BACKBONES
    from nlp_models.device import DEVICES

    parser.add_argument("--device", choices=DEVICES, default="auto",
                        help="torch device: auto (CUDA when a GPU is visible), cpu or cuda (default auto)")
    parser.add_argument("--backbone", choices=BACKBONES, default="minilm",
                        help="minilm (default) or tiny: a small random BERT for smoke runs and tests")
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1),
                        help="torch threads (default: 2, or 1 on a one-core machine)")
    if cache_help is not None:
        parser.add_argument("--cache", metavar="DIR", help=cache_help)
    parser.add_argument("--out", metavar="DIR", help="parent directory of the run directory (default: the "
                                                      "example's folder under results/)")
    parser.add_argument("--run-name", metavar="NAME", help="the run directory's name (default: a time stamp)")
    parser.add_argument("--resume", metavar="RUN_DIR",
                        help="finish a grid: its saved plan, finished cells skipped; it refuses options that would "
                             f"change the plan{resume_help}")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (for logs and tests)")
    add_worker_args(parser)


def add_worker_args(parser: argparse.ArgumentParser) -> None:
    """--workers N (cells in N processes sharing the machine and its GPU) and the hidden --worker of each."""
    parser.add_argument("--workers", type=int, default=1,
                        help="run the unfinished cells in N processes sharing this machine and its GPU (one process "
                             "leaves a GPU idle between small kernels); this one waits and writes the tables")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)


def start_workers(args: argparse.Namespace, run: Path, *, script: str | Path, device: str, cells: Sequence[Any],
                  cells_path: Path, key: Callable[[Any], str], forward: Sequence[str] = ()) -> dict[str, dict[str, Any]]:
    """Under --workers N > 1: run the grid's unfinished cells in N processes (`parallel.run_workers`; no more
    processes than cells left) and return the finished cells as recorded; else the finished cells as they are."""
    from fl_algorithms.experiments.parallel import run_workers

    done = read_cells(cells_path, key=key)
    workers = min(args.workers, sum(key(cell) not in done for cell in cells))
    if workers > 1:  # (one cell left: this process runs it)
        run_workers(run, script=script, workers=workers, total=len(cells), progress=not args.no_progress,
                    forward=["--device", device, "--threads", str(args.threads), "--no-progress", *forward])
        done = read_cells(cells_path, key=key)
    return done


def check_run_location(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The run-directory options every example takes: `--run-name` is a plain directory name, and
    `--resume RUN_DIR` (which names the directory itself) excludes `--out` and `--run-name`."""
    if args.run_name is not None and (not args.run_name or Path(args.run_name).name != args.run_name
                                      or args.run_name in (".", "..")):
        parser.error("--run-name must be a plain directory name")
    if args.resume and (args.out or args.run_name):
        parser.error("--resume RUN_DIR already names the run directory; drop --out/--run-name")


RUN_OPTIONS = frozenset({"device", "backbone", "threads", "out", "run_name", "resume", "no_progress", "workers", "worker",
                         "cache", "report"})
"""Options of the grid examples that say where and how a run executes, not what it computes: the only
ones `--resume` accepts besides a plan's growable lists."""


def given_options(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> frozenset[str]:
    """The destinations of the options written on the command line, even where the value written is
    the default (parsed again with every default suppressed)."""
    actions = [a for a in parser._actions if a.dest != argparse.SUPPRESS]
    defaults = [a.default for a in actions]
    try:
        for action in actions:
            action.default = argparse.SUPPRESS
        return frozenset(vars(parser.parse_args(argv)))
    finally:
        for action, default in zip(actions, defaults):
            action.default = default


def plan_options_given(parser: argparse.ArgumentParser, args: argparse.Namespace, *,
                       allowed: Sequence[str] = ()) -> list[str]:
    """The command-line flags that would change a plan (every option not in RUN_OPTIONS or `allowed`)
    written on the command line (`args.given`, from `parse_grid_args`; else those away from their
    defaults): a resumed grid refuses them rather than silently running its saved plan."""
    given = getattr(args, "given", None)
    return [f"--{dest.replace('_', '-')}" for dest, value in vars(args).items()
            if dest not in RUN_OPTIONS and dest != "given" and dest not in allowed
            and (dest in given if given is not None else value != parser.get_default(dest))]


def open_run(parser: argparse.ArgumentParser, args: argparse.Namespace, *, default_out: Path,
             build: Callable[[], Any], load: Callable[[Any], Any], record: Callable[[Any], Any],
             growable: Sequence[str] = ()) -> tuple[Path, Any]:
    """The run directory and plan of a grid example: `--resume RUN_DIR` reads RUN_DIR/plan.json back
    through `load` (and refuses plan options given with it, except the `growable` ones the caller
    applies); otherwise `build()` makes the plan, and a new directory (`--out`/`--run-name`, default
    a timestamp under `default_out`) receives `record(plan)` as plan.json."""
    if args.resume:
        run = Path(args.resume)
        if fixed := plan_options_given(parser, args, allowed=growable):
            grow = f"; it can only grow by --{', --'.join(o.replace('_', '-') for o in growable)}" if growable else ""
            parser.error(f"--resume {args.resume}: its saved plan fixes {', '.join(fixed)}{grow}")
        try:
            return run, load(json.loads((run / "plan.json").read_text()))
        except (FileNotFoundError, json.JSONDecodeError, TypeError, ValueError) as error:
            parser.error(f"--resume {args.resume}: no readable plan.json ({error})")
    plan = build()
    run = (Path(args.out) if args.out else default_out) / (args.run_name or time.strftime("%Y%m%d-%H%M%S"))
    if run.exists():
        parser.error(f"{run} exists: choose another --run-name or --resume it")
    run.mkdir(parents=True)
    (run / "plan.json").write_text(json.dumps(record(plan), indent=2))
    return run, plan


def open_grid(parser: argparse.ArgumentParser, args: argparse.Namespace, device: str, *, default_out: Path,
              build: Callable[[], Any], load: Callable[[Any], Any], record: Callable[[Any], Any],
              key: Callable[[Any], str]) -> tuple[Path, Any, Path, dict[str, dict[str, Any]]]:
    """A grid example's start after `parse_grid_args`: the run directory and plan (`open_run`), torch's
    thread count from --threads, and the cells already finished there (for --resume); prints both.
    Returns (run directory, plan, path of cells.jsonl, finished cells by `key`)."""
    import torch

    from nlp_models.cpu import set_torch_threads

    run, plan = open_run(parser, args, default_out=default_out, build=build, load=load, record=record)
    threads = set_torch_threads(args.threads)
    print(f"run directory: {run}  (device {device}, torch threads {threads}, {plan.protocol})", flush=True)
    cells_path = run / "cells.jsonl"
    done = read_cells(cells_path, key=key)
    if done:
        print(f"{len(done)} already done", flush=True)
    return run, plan, cells_path, done


@dataclasses.dataclass
class Grid:
    """A grid example's open run (`start_grid`): its options, device, run directory, plan and the
    finished cells by `key`. `todo` yields the cells this process runs, `record` runs and saves one,
    `summarise` writes the tables and the plot of the finished grid."""

    args: argparse.Namespace
    device: str
    run: Path
    plan: Any
    key: Callable[[Any], str]
    done: dict[str, dict[str, Any]]
    started: float
    """`time.perf_counter()` when the grid opened."""

    @property
    def cells_path(self) -> Path:
        return self.run / "cells.jsonl"

    def todo(self) -> Iterator[Mapping[str, Any]]:
        """The unfinished cells in plan order; under --worker only those whose claim this process wins; none
        under --report."""
        from fl_algorithms.experiments.parallel import pending

        if getattr(self.args, "report", False):
            return iter(())
        return pending(self.plan.cells(), self.done, key=self.key, run=self.run if self.args.worker else None)

    def record(self, cell: Mapping[str, Any], compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Run one cell (`compute()`) and save its row (`append_cell`). A ValueError, a setting the data
        cannot meet, ends the program with its message instead of a traceback."""
        try:
            row = compute()
        except ValueError as error:
            raise SystemExit(f"error: {error}") from None
        append_cell(self.cells_path, row)
        self.done[self.key(cell)] = row
        return row

    def summarise(self, *, write_table: Callable[..., Any],
                  plot: Callable[[list[dict[str, Any]], Path], Any]) -> list[dict[str, Any]]:
        """Every cell's row in plan order, after writing summary.csv, summary.md and curves.png and
        printing the Markdown table."""
        rows = [self.done[self.key(cell)] for cell in self.plan.cells()]
        write_table(rows, csv_path=self.run / "summary.csv", md_path=self.run / "summary.md")
        plot(rows, self.run / "curves.png")
        print(f"\n{(self.run / 'summary.md').read_text()}\nwrote {self.run / 'summary.csv'}, "
              f"{self.run / 'curves.png'} ({time.perf_counter() - self.started:.0f} s)")
        return rows


def start_grid(parser: argparse.ArgumentParser, argv: Sequence[str] | None, *, script: str | Path,
               default_out: Path, build: Callable[[argparse.Namespace], Any], load: Callable[[Any], Any],
               record: Callable[[Any], Any], key: Callable[[Any], str],
               forward: Sequence[str] = ("backbone",)) -> Grid:
    """A grid example's whole start: `parse_grid_args`, `open_grid` (`build(args)` makes a new plan), then
    `start_workers`, so under --workers N the unfinished cells have run in N processes when this returns.
    `forward` names the options (their dests) that the workers get too, where set. Under `--report` (with
    --resume) it runs nothing: every cell must be finished, else it stops naming those that are not."""
    args, device = parse_grid_args(parser, argv)
    report = getattr(args, "report", False)
    if report and (not args.resume or args.workers > 1 or args.worker):
        parser.error("--report writes a grid's tables from its finished cells: give --resume RUN_DIR, without --workers")
    run, plan, cells_path, done = open_grid(parser, args, device, default_out=default_out, build=lambda: build(args),
                                            load=load, record=record, key=key)
    started = time.perf_counter()
    if report:
        if missing := [key(cell) for cell in plan.cells() if key(cell) not in done]:
            shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
            raise SystemExit(f"error: {run}: {len(missing)} of {len(plan.cells())} cells are not finished ({shown}); "
                             f"finish them with --resume {run}")
        return Grid(args=args, device=device, run=run, plan=plan, key=key, done=done, started=started)
    options = [part for name in forward if (value := getattr(args, name)) is not None
               for part in (f"--{name.replace('_', '-')}", str(value))]
    done = start_workers(args, run, script=script, device=device, cells=plan.cells(), cells_path=cells_path,
                         key=key, forward=options)
    return Grid(args=args, device=device, run=run, plan=plan, key=key, done=done, started=started)


def read_cells(path: Path, *, key: Callable[[Any], str]) -> dict[str, dict[str, Any]]:
    """The finished cells of a grid (one JSON object per line of `path`), by `key(row)`; {} before the first."""
    if not path.exists():
        return {}
    return {key(row): row for row in map(json.loads, path.read_text().splitlines()) if row}


def append_cell(path: Path, row: Mapping[str, Any]) -> None:
    """Record one finished cell (a JSON line), so that `--resume` skips it (`read_cells`). Under a lock:
    grid workers append to the same file, and a long line may take several writes."""
    from fl_algorithms.experiments.parallel import file_lock

    line = json.dumps(row) + "\n"
    with file_lock(path.with_name(path.name + ".lock")):
        with open(path, "a") as handle:
            handle.write(line)


__all__ = ["RUN_OPTIONS", "Grid", "add_run_args", "add_training_protocol_arg", "add_worker_args", "append_cell",
           "check_run_location", "comma_list", "protocol_lines",
           "open_grid", "open_run", "given_options", "parse_grid_args", "plan_options_given", "read_cells",
           "start_grid", "start_workers"]
