"""Argument types the examples share (argparse turns their errors into exit code 2)."""
from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
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


def check_run_location(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The run-directory options every example takes: `--run-name` is a plain directory name, and
    `--resume RUN_DIR` (which names the directory itself) excludes `--out` and `--run-name`."""
    if args.run_name is not None and (not args.run_name or Path(args.run_name).name != args.run_name
                                      or args.run_name in (".", "..")):
        parser.error("--run-name must be a plain directory name")
    if args.resume and (args.out or args.run_name):
        parser.error("--resume RUN_DIR already names the run directory; drop --out/--run-name")


__all__ = ["check_run_location", "comma_list"]
