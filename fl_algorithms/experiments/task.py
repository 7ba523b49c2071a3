"""What a deployment needs to know about an experiment, importable by name from a CLI."""
from __future__ import annotations

import dataclasses
import importlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from fl_algorithms.api import Algorithm
from fl_algorithms.training.trainer import LocalTrainer

T = TypeVar("T")


@dataclass(frozen=True)
class Task:
    algorithm: Algorithm
    make_trainer: Callable[[int], LocalTrainer]
    """Client side: build the trainer over this client's own shard only."""
    initial: Callable[[], Mapping[str, np.ndarray]]
    """Server side: the initial shared parameters."""


def load_task(spec: str, options: Mapping[str, Any] | None = None) -> Task:
    """`spec` is 'module:function'; the function takes an options mapping and returns a Task."""
    module, _, func = spec.partition(":")
    if not module or not func:
        raise ValueError(f"task must be 'module:function', got {spec!r}")
    return getattr(importlib.import_module(module), func)(dict(options or {}))


# ---- parsing a task's string options (deploy_cli --option key=value) ---------------------------------

def check_options(options: Mapping[str, Any], known: Iterable[str], *, task: str) -> None:
    """Unknown option names are errors (a typo would otherwise run with a default silently)."""
    unknown = set(options) - set(known)
    if unknown:
        raise ValueError(f"unknown {task} task options {sorted(unknown)}; known: {', '.join(sorted(known))}")


def settings_option(cls: type[T], options: Mapping[str, Any], key: str = "settings") -> T:
    """The frozen-dataclass settings `cls` from the JSON object in option `key` (default: all defaults)."""
    try:
        raw = json.loads(options.get(key, "{}"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"option {key} is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"option {key} must be a JSON object of {cls.__name__} fields")
    bad = set(raw) - {f.name for f in dataclasses.fields(cls)}
    if bad:
        raise ValueError(f"unknown settings {sorted(bad)}")
    try:
        return cls(**raw)
    except TypeError as exc:  # a wrongly typed value fails its range check with a TypeError
        raise ValueError(f"bad settings: {exc}") from None


def int_option(options: Mapping[str, Any], key: str, *, default: int, minimum: int) -> int:
    text = str(options.get(key, default))
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"option {key} must be an integer, got {text!r}") from None
    if value < minimum:
        raise ValueError(f"option {key} must be at least {minimum}, got {value}")
    return value
