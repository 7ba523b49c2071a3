"""Mutants: each breaks one privacy guarantee in memory, and names the tests that must then fail.

A mutant is a NAME, a one-line statement of the guarantee (or equation) it breaks, a patch (a function
that applies monkeypatches through a `pytest.MonkeyPatch`-like object) and the test node ids that
must kill it. `catalog.py` holds them. A test process breaks one when the environment variable
FEDSECURE_MUTANT=NAME is set: `tests/conftest.py` calls `install_from_env` before anything else, so
the patch is in place for the whole run (and never undone). A test may also apply one itself, through
its `monkeypatch` fixture, to show that an attack it runs is real (`registry()[name].apply(monkeypatch)`).

`python -m benchmarks.mutants` runs every mutant's tests with and without it (`benchmarks/mutants.py`).
"""
from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

ENV = "FEDSECURE_MUTANT"
"""Names the mutant a test process installs at start-up."""
ACK_ENV = "FEDSECURE_MUTANT_ACK"
"""A file the installed mutant's name is written to: the runner's proof that the patch was applied."""


class Patcher(Protocol):
    """What a mutant's patch uses: `pytest.MonkeyPatch` (or its fixture)."""

    def setattr(self, target: Any, name: str, value: Any, raising: bool = True) -> None: ...


@dataclass(frozen=True)
class Mutant:
    name: str
    breaks: str
    """One line: the guarantee or equation it breaks."""
    apply: Callable[[Patcher], None]
    tests: tuple[str, ...]
    """Node ids (paths from the repository root, or path::test) that must fail under it."""
    quick: bool = False
    """In the `--quick` subset (cheap to kill)."""


REGISTRY: dict[str, Mutant] = {}


def mutant(name: str, *, breaks: str, tests: tuple[str, ...], quick: bool = False) -> Callable:
    """Register the decorated patch function as mutant `name`."""
    if not name.isidentifier():
        raise ValueError(f"mutant names are identifiers, got {name!r}")
    if not tests:
        raise ValueError(f"mutant {name} names no killing tests")

    def register(apply: Callable[[Patcher], None]) -> Callable[[Patcher], None]:
        if name in REGISTRY:
            raise ValueError(f"mutant {name} is registered twice")
        REGISTRY[name] = Mutant(name=name, breaks=breaks, apply=apply, tests=tuple(tests), quick=quick)
        return apply

    return register


def registry() -> dict[str, Mutant]:
    """Every mutant, by name (imports `catalog.py`, which registers them, on first use)."""
    import importlib

    importlib.import_module(f"{__name__}.catalog")
    return REGISTRY


def install_from_env(environ: Mapping[str, str] = os.environ) -> Mutant | None:
    """Apply the mutant named by FEDSECURE_MUTANT for the rest of this process (None when unset).

    KeyError for an unknown name: the test run then fails to start, which the runner reports as
    'broken', never as 'killed'."""
    name = environ.get(ENV)
    if not name:
        return None
    known = registry()
    if name not in known:
        raise KeyError(f"{ENV}={name!r} names no mutant; known: {', '.join(sorted(known))}")
    import pytest

    chosen = known[name]
    chosen.apply(pytest.MonkeyPatch())  # never undone: the whole test process runs mutated
    ack = environ.get(ACK_ENV)
    if ack:
        Path(ack).write_text(name)
    return chosen


__all__ = ["ACK_ENV", "ENV", "Mutant", "Patcher", "REGISTRY", "install_from_env", "mutant", "registry"]
