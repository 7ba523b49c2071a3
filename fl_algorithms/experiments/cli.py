"""Argument types the examples share (argparse turns their errors into exit code 2)."""
from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
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


__all__ = ["comma_list"]
