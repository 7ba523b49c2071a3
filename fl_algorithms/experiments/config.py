"""Frozen-dataclass configs: load them from TOML files (nested tables map to nested dataclasses) and
check the choice lists that grid plans share."""
from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def from_dict(cls: type[T], data: dict[str, Any]) -> T:
    """Build `cls` from a dict, recursing into dataclass-typed fields; unknown keys are errors."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls} is not a dataclass")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise ValueError(f"unknown {cls.__name__} keys: {sorted(unknown)}")
    kwargs = {}
    for key, value in data.items():
        typ = hints[key]
        sub = _dataclass_in(typ)
        kwargs[key] = from_dict(sub, value) if sub is not None and isinstance(value, dict) else value
    return cls(**kwargs)


def _dataclass_in(typ: Any) -> type | None:
    if dataclasses.is_dataclass(typ):
        return typ
    if isinstance(typ, types.UnionType) or typing.get_origin(typ) is typing.Union:
        for arg in typing.get_args(typ):
            if dataclasses.is_dataclass(arg):
                return arg
    return None


def load_toml(cls: type[T], path: str | Path, *, table: str | None = None) -> T:
    with open(path, "rb") as fh:
        data = tomllib.load(fh)
    if table is not None:
        data = data[table]
    return from_dict(cls, data)


def check_choices(name: str, values: Sequence[str], allowed: Sequence[str]) -> None:
    """Raise ValueError unless `values` is a non-empty list of distinct members of `allowed`."""
    if not values or set(values) - set(allowed) or len(set(values)) != len(values):
        raise ValueError(f"{name} must be distinct values from {', '.join(allowed)}, got {values}")


def check_seeds(seeds: Sequence[int]) -> None:
    """Raise ValueError unless `seeds` is a non-empty list of distinct non-negative integers."""
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise ValueError("seeds must be distinct non-negative integers")
