"""What a deployment needs to know about an experiment, importable by name from a CLI."""
from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from fl_algorithms.api import Algorithm
from fl_algorithms.training.trainer import LocalTrainer


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
