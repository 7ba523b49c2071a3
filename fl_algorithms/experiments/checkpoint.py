"""The one checkpoint format: nested run state as safetensors + JSON, written atomically, no pickle.

A checkpoint is a directory holding `state.json` (the structure, with typed nodes) and
`tensors.safetensors` (every torch tensor and numpy array). Loading executes no code whatever the
files contain: a malformed checkpoint raises `CheckpointError`.

Leaves: torch tensors (dtype and shape kept), numpy arrays (as raw bytes with dtype and shape, so
any non-object dtype round trips), Python int (any size), float (inf and nan too), bool, str, None,
bytes. Containers: dict with str or int keys (torch optimiser states use int keys), list, tuple.

`save_state(path, state)` writes a sibling temporary directory, fsyncs it, moves the previous
checkpoint aside, renames the new one into place, then deletes the old one; a crash at any point
leaves a complete checkpoint at `path` or at its `.old` sibling, and `load_state` finds it.
"""
from __future__ import annotations

import base64
import json
import math
import os
import secrets
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

FORMAT = "fedsecure-checkpoint"
VERSION = 1
STATE, TENSORS = "state.json", "tensors.safetensors"


class CheckpointError(ValueError):
    """A checkpoint is missing, malformed, or of an unknown format version."""


def _encode(obj: Any, tensors: dict[str, torch.Tensor], where: str) -> Any:
    if obj is None:
        return {"n": None}
    if isinstance(obj, bool):
        return {"b": obj}
    if isinstance(obj, int):
        return {"i": str(obj)}
    if isinstance(obj, float):
        return {"f": repr(obj)}
    if isinstance(obj, str):
        return {"s": obj}
    if isinstance(obj, bytes):
        return {"y": base64.b64encode(obj).decode("ascii")}
    if isinstance(obj, torch.Tensor):
        key = f"t{len(tensors)}"
        tensors[key] = obj.detach().to("cpu").contiguous().clone()
        return {"T": key}
    if isinstance(obj, (np.ndarray, np.generic)):
        arr = np.asarray(obj)
        if arr.dtype.hasobject:
            raise TypeError(f"{where}: numpy arrays of Python objects cannot be checkpointed")
        key = f"t{len(tensors)}"
        raw = np.ascontiguousarray(arr).tobytes()
        tensors[key] = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.zeros(0, dtype=torch.uint8)
        return {"N": key, "dtype": arr.dtype.str, "shape": list(arr.shape), "scalar": isinstance(obj, np.generic)}
    if isinstance(obj, dict):
        items = []
        for k, v in obj.items():
            if isinstance(k, bool) or not isinstance(k, (str, int)):
                raise TypeError(f"{where}: dict keys must be str or int, got {type(k).__name__}")
            items.append([{"s": k} if isinstance(k, str) else {"i": str(k)}, _encode(v, tensors, f"{where}[{k!r}]")])
        return {"d": items}
    if isinstance(obj, list):
        return {"l": [_encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]}
    if isinstance(obj, tuple):
        return {"u": [_encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]}
    raise TypeError(f"{where}: cannot checkpoint a {type(obj).__name__}")


def _decode(node: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if not isinstance(node, dict) or not node:
        raise CheckpointError(f"malformed node {str(node)[:80]}")
    tag = next(iter(node))
    value = node[tag]
    try:
        if tag == "n":
            return None
        if tag == "b":
            if not isinstance(value, bool):
                raise ValueError
            return value
        if tag == "i":
            return int(value)
        if tag == "f":
            return float(value)
        if tag == "s":
            if not isinstance(value, str):
                raise ValueError
            return value
        if tag == "y":
            return base64.b64decode(value, validate=True)
        if tag == "T":
            return tensors[value]
        if tag == "N":
            dtype = np.dtype(node["dtype"])
            if dtype.hasobject:
                raise ValueError
            shape = tuple(int(s) for s in node["shape"])
            raw = tensors[value].numpy().tobytes()
            if len(raw) != dtype.itemsize * math.prod(shape):
                raise ValueError
            arr = np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
            return arr[()] if node.get("scalar") else arr
        if tag == "d":
            out = {}
            for k, v in value:
                key = _decode(k, tensors)
                if not isinstance(key, (str, int)):
                    raise ValueError
                out[key] = _decode(v, tensors)
            return out
        if tag == "l":
            return [_decode(v, tensors) for v in value]
        if tag == "u":
            return tuple(_decode(v, tensors) for v in value)
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"malformed '{tag}' node: {exc!r}") from exc
    raise CheckpointError(f"unknown node type '{tag}'")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _old(path: Path) -> Path:
    return path.with_name(f".{path.name}.old")


def save_state(path: str | Path, state: Any) -> Path:
    """Write `state` as a checkpoint directory at `path`, atomically (see the module doc)."""
    path = Path(path)
    tensors: dict[str, torch.Tensor] = {}
    doc = {"format": FORMAT, "version": VERSION, "state": _encode(state, tensors, "state")}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(4)}")
    tmp.mkdir()
    try:
        save_file(tensors, str(tmp / TENSORS))
        with open(tmp / STATE, "w", encoding="utf-8") as fh:
            json.dump(doc, fh)
            fh.flush()
            os.fsync(fh.fileno())
        with open(tmp / TENSORS, "rb") as fh:
            os.fsync(fh.fileno())
        _fsync_dir(tmp)
        old = _old(path)
        if old.exists():
            shutil.rmtree(old)
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def _complete(path: Path) -> bool:
    return (path / STATE).is_file() and (path / TENSORS).is_file()


def checkpoint_exists(path: str | Path) -> bool:
    path = Path(path)
    return _complete(path) or _complete(_old(path))


def load_state(path: str | Path) -> Any:
    """Read a checkpoint written by `save_state` (or the intact `.old` one after a crash)."""
    path = Path(path)
    if not _complete(path):
        if not _complete(_old(path)):
            raise CheckpointError(f"no checkpoint at {path}")
        path = _old(path)  # the crash came between the two renames of save_state
    try:
        doc = json.loads((path / STATE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"{path / STATE} is not readable JSON: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a {FORMAT}")
    if doc.get("version") != VERSION:
        raise CheckpointError(f"{path}: format version {doc.get('version')!r}, this code reads {VERSION}")
    try:
        tensors = load_file(str(path / TENSORS))
    except Exception as exc:  # safetensors raises its own error types on corrupt files
        raise CheckpointError(f"{path / TENSORS} is not a readable safetensors file: {exc}") from exc
    return _decode(doc.get("state"), tensors)
