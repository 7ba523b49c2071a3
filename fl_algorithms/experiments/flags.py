"""The options the examples share, added by one function with one spelling and one help text each.

    add_common_flags(parser, quick="4 clients, 2 rounds", algorithms=METHODS, seeds="0", rounds="default 10",
                     protocols=SECURE_PROTOCOLS, grid=True, report=True)

Each example says which shared options it takes and what they mean there (its choices, its defaults);
an option it does not name is not added, so argparse refuses it instead of the example ignoring it.
`--algorithms` is the one name of the methods axis; `--methods`, its older name in three examples, is
kept as a hidden alias (the same destination), so old commands and docs still work. The grid examples'
run options (--device, --out, --resume, --workers, ...) come from `cli.add_run_args`; the other
examples get the same names here with their own defaults.

Nothing here imports torch: the parsers must answer `--help` before a heavy import (`fedsecure run X
--help`), so examples import their heavy modules after `parse_args`.
"""
from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from typing import Any

from fl_algorithms.choices import BACKENDS, RUNTIMES
from fl_algorithms.experiments.cli import add_run_args, comma_list
from nlp_models.device import DEVICES

CATALOG = "catalog"
"""`algorithms=CATALOG`: any algorithm of `fl_algorithms.catalog` by name, or an importable 'module:Class'."""
_TARGET = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def catalog_algorithms(text: str) -> tuple[str, ...]:
    """An argparse type: a comma list of catalog algorithm names or 'module:Class' targets (not imported here,
    so that parsing stays fast; the example loads them)."""
    from fl_algorithms.catalog import ALGORITHMS

    names = tuple(e.name for e in ALGORITHMS)
    values = comma_list(str, what="algorithm")(text)
    bad = [v for v in values if v not in names and not _TARGET.match(v)]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown algorithm(s) {bad}; give names of `python -m fl_algorithms --list` "
                                         f"({', '.join(names)}) or module:Class")
    return values


class _FlatList(argparse.Action):
    """`--seeds 0 1 2` and `--seeds 0,1,2` alike: each word a comma list, all of them one tuple, none repeated."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        flat = tuple(v for part in values for v in part)
        if len(set(flat)) != len(flat):
            parser.error(f"argument {option_string}: repeated values in {' '.join(map(str, flat))}")
        setattr(namespace, self.dest, flat)


def add_common_flags(parser: argparse.ArgumentParser, *, quick: str | None = None, full: str | None = None,
                     algorithms: Sequence[str] | str | None = None, default_algorithms: Sequence[str] | None = None,
                     algorithm_word: str = "algorithm", seeds: str | None = None, seeds_spaces: bool = False,
                     rounds: str | None = None, protocols: Sequence[str] | None = None,
                     protocol_default: str | None = None, runtime: bool = False, backend: bool = False,
                     data: bool = False, grid: bool = False, resume: str | None = None, cache: str | None = None,
                     out: str | None = None, out_default: Any = None, device: str | None = None, device_note: str = "",
                     workers: str | None = None, progress: bool = False, report: bool = False) -> None:
    """Add the shared options an example takes; each argument names one (None / False: not taken) and
    says what it means there.

    quick / full: what the small preset (`--quick`) and the paper-sized one (`--full`) run; given both, they
    exclude each other. algorithms: the choices of `--algorithms` (hidden alias `--methods`), or CATALOG;
    default_algorithms / algorithm_word: for its help and messages ('unknown method(s) ...'). seeds: the
    default, in words (`seeds_spaces`: also `--seeds 0 1 2`). rounds: what `--rounds` defaults to, in words.
    protocols / protocol_default: `--protocol`'s choices and default (None: the example's plan decides).
    runtime, backend, data: `--runtime sim|deploy`, `--backend memory|ray`, `--data PATH` (+ columns).
    grid: the grid examples' run options (`cli.add_run_args`: --device, --backbone, --threads, --out,
    --run-name, --resume, --no-progress, --workers; `cache`: the help of --cache DIR); otherwise `resume`,
    `out` (+ --run-name), `device` (its default; `device_note` follows its help), `workers` name those options' meaning one by one, and
    `progress` adds --no-progress. report: `--report` (with --resume: report what a run finished, run nothing).
    Defaults stay None where the example fills them in from its preset (`--quick` or not)."""
    if quick is not None or full is not None:
        size = parser.add_mutually_exclusive_group() if quick is not None and full is not None else parser
        if quick is not None:
            size.add_argument("--quick", action="store_true", help=f"a small, fast run: {quick}")
        if full is not None:
            size.add_argument("--full", action="store_true", help=full)
    if algorithms is not None:
        add_algorithms(parser, choices=algorithms, default=default_algorithms, word=algorithm_word)
    if seeds is not None:
        if seeds_spaces:
            parser.add_argument("--seeds", type=comma_list(int, what="seed"), nargs="+", action=_FlatList,
                                metavar="SEED", help=f"seeds, comma- or space-separated; each runs in full and the "
                                                     f"tables give mean and interval over them (default {seeds})")
        else:
            parser.add_argument("--seeds", type=comma_list(int, what="seed"), metavar="S,S,..",
                                help=f"comma list of seeds; each runs in full and the tables give mean and spread "
                                     f"over them (default {seeds})")
    if rounds is not None:
        parser.add_argument("--rounds", type=int, metavar="N", help=f"federated rounds ({rounds})")
    if protocols is not None:
        shown = protocol_default or "secagg+"
        parser.add_argument("--protocol", choices=tuple(protocols), default=protocol_default,
                            help=f"secure-aggregation protocol (default {shown}; each upload is summed with it; "
                                 f"`python -m fl_algorithms --list` describes them)")
    if runtime:
        parser.add_argument("--runtime", choices=RUNTIMES,
                            help="sim: every client in this process (default); deploy: this process is the server "
                                 "and each client its own process over tcp on loopback")
    if backend:
        parser.add_argument("--backend", choices=BACKENDS,
                            help="--runtime sim's clients: in this process (memory, default) or as Ray actors over "
                                 "every core (ray: same results; pip install -e '.[ray]')")
    if data:
        from nlp_models.data.own import add_data_arguments

        add_data_arguments(parser)
    if grid:
        add_run_args(parser, resume_help=resume or "", cache_help=cache)
    else:
        if device is not None:
            parser.add_argument("--device", choices=DEVICES, default=device,
                                help=f"torch device: auto (CUDA when a GPU is visible), cpu or cuda (default {device})"
                                     f"{device_note}")
        if out is not None:
            parser.add_argument("--out", metavar="DIR", default=out_default,
                                help=f"parent directory of the run directory (default {out})")
            parser.add_argument("--run-name", metavar="NAME", help="the run directory's name (default: a time stamp)")
        if resume is not None:
            parser.add_argument("--resume", metavar="RUN_DIR", help=resume)
        if workers is not None:
            parser.add_argument("--workers", type=int, default=1, metavar="N", help=workers)
        if progress:
            parser.add_argument("--no-progress", action="store_true", help="no progress bars (for logs and tests)")
    if report:
        parser.add_argument("--report", action="store_true",
                            help="with --resume RUN_DIR: report what RUN_DIR has finished (tables, plots, the last "
                                 "line) and run nothing; `fedsecure report RUN_DIR` calls this")


def add_algorithms(parser: argparse.ArgumentParser, *, choices: Sequence[str] | str,
                   default: Sequence[str] | None = None, word: str = "algorithm") -> None:
    """`--algorithms A,B,..` (a comma list from `choices`, or CATALOG) and its hidden older name `--methods`."""
    if choices == CATALOG:
        kind, listed = catalog_algorithms, "algorithms of `python -m fl_algorithms --list`, or module:Class"
    else:
        kind, listed = comma_list(str, what=word, choices=tuple(choices)), ", ".join(choices)
    shown = "" if not default else " (default: all)" if tuple(default) == tuple(choices) else f" (default {','.join(default)})"
    parser.add_argument("--algorithms", type=kind, metavar="A,B,..",
                        help=f"comma list of {word}s to run: {listed}{shown}; --methods is its older name")
    parser.add_argument("--methods", dest="algorithms", type=kind, help=argparse.SUPPRESS)


def help_missing(parser: argparse.ArgumentParser) -> list[str]:
    """The options of `parser` without help text (hidden ones, help=SUPPRESS, count as documented)."""
    return [a.option_strings[0] for a in parser._actions if a.option_strings and not a.help]


__all__ = ["CATALOG", "add_algorithms", "add_common_flags", "catalog_algorithms", "help_missing"]
