"""The one checkpoint format: nested run state as safetensors + JSON, written atomically, no pickle.

A checkpoint is a directory holding `state.json` (the structure, as typed nodes) and
`tensors.safetensors` (every torch tensor and numpy array). Neither file can make the loader run
code: the JSON is read as data and checked node by node, the tensors file is safetensors. Anything
malformed raises `CheckpointError` naming the file and the place inside the structure.

Leaves: torch tensors (dtype and shape kept, loaded on the cpu), numpy arrays and numpy scalars
(same dtype and shape, 0-d and empty included), Python int (any size), float (inf and nan too),
bool, str, None, bytes. Containers: dict with str or int keys (torch optimiser states use int
keys), list, tuple. Subclasses come back as the base type (an OrderedDict as a dict, an
nn.Parameter as a tensor). Anything else raises TypeError naming where it is, e.g.
`state['clients'][3]['foo']`.

`save_state(path, state)` writes a sibling temporary directory and fsyncs it, moves an intact
previous checkpoint to `.NAME.old`, renames the new one into place, then deletes the old one. A
crash at any point leaves a complete checkpoint at `path` or at `.NAME.old`; `load_state` reads
whichever is there, and the next `save_state` never deletes the only intact copy.
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

# torch dtypes safetensors stores natively; others (complex128, ...) are stored as raw bytes.
_SAFETENSORS_DTYPES = frozenset({
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16,
    torch.uint32, torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64,
    torch.complex64, torch.float8_e4m3fn, torch.float8_e5m2,
})
# Names a checkpoint may give for a raw-bytes tensor: a fixed table, never getattr(torch, name).
_TORCH_DTYPES = {str(d).removeprefix("torch."): d for d in vars(torch).values() if isinstance(d, torch.dtype)}
# Native-order numpy dtypes stored as typed tensors; any other dtype is stored as raw bytes.
_NUMPY_TYPED = frozenset(np.dtype(n) for n in (
    "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64"))
# Decimal strings past a few thousand digits hit Python's int/str conversion limit: use hex.
_DECIMAL_BITS = 8000

# node tag -> the other fields that node may carry
_NODES: dict[str, frozenset[str]] = {
    "n": frozenset(), "b": frozenset(), "i": frozenset(), "f": frozenset(), "s": frozenset(),
    "y": frozenset(), "T": frozenset({"dtype", "shape"}), "N": frozenset({"dtype", "shape", "scalar"}),
    "d": frozenset(), "l": frozenset(), "u": frozenset(),
}


class CheckpointError(ValueError):
    """A checkpoint is missing, malformed, or of an unknown format version."""


# ---- encoding ----------------------------------------------------------------------------------
def _key_path(where: str, key: Any) -> str:
    return f"{where}[{key!r}]"


def _encode_tensor(obj: torch.Tensor, tensors: dict[str, torch.Tensor], where: str) -> dict[str, Any]:
    odd = [what for what, yes in ((str(obj.layout), obj.layout != torch.strided), ("quantized", obj.is_quantized),
                                  ("meta", obj.is_meta), ("nested", obj.is_nested)) if yes]
    if odd:
        raise TypeError(f"{where}: cannot checkpoint a {' '.join(odd)} tensor")
    # A fresh contiguous cpu copy: safetensors refuses views and tensors sharing storage.
    t = obj.detach().to("cpu").resolve_conj().resolve_neg().contiguous().clone()
    key = f"t{len(tensors)}"
    if t.dtype in _SAFETENSORS_DTYPES:
        tensors[key] = t
        return {"T": key}
    try:
        tensors[key] = t.reshape(-1).view(torch.uint8).clone()
    except RuntimeError as exc:
        raise TypeError(f"{where}: cannot checkpoint a tensor of dtype {t.dtype}") from exc
    return {"T": key, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}


def _encode_numpy(obj: np.ndarray | np.generic, tensors: dict[str, torch.Tensor], where: str) -> dict[str, Any]:
    arr = np.asarray(obj)
    dtype = arr.dtype
    if dtype.hasobject:
        raise TypeError(f"{where}: numpy arrays of Python objects cannot be checkpointed")
    if np.dtype(dtype.str) != dtype:  # structured or third-party dtypes: the name would not bring it back
        raise TypeError(f"{where}: cannot checkpoint numpy dtype {dtype!r}")
    key = f"t{len(tensors)}"
    if dtype in _NUMPY_TYPED:  # a typed tensor that other safetensors readers understand
        tensors[key] = torch.from_numpy(np.array(arr, order="C", copy=True))
    else:
        raw = arr.tobytes(order="C")
        tensors[key] = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.zeros(0, dtype=torch.uint8)
    return {"N": key, "dtype": dtype.str, "shape": list(arr.shape), "scalar": isinstance(obj, np.generic)}


def _encode(obj: Any, tensors: dict[str, torch.Tensor], where: str, active: set[int]) -> Any:
    if obj is None:
        return {"n": None}
    if isinstance(obj, torch.Tensor):
        return _encode_tensor(obj, tensors, where)
    if isinstance(obj, (np.ndarray, np.generic)):  # before float: np.float64 is a float subclass
        return _encode_numpy(obj, tensors, where)
    if isinstance(obj, bool):
        return {"b": obj}
    if isinstance(obj, int):
        return {"i": str(int(obj)) if obj.bit_length() <= _DECIMAL_BITS else hex(obj)}
    if isinstance(obj, float):
        return {"f": repr(float(obj))}
    if isinstance(obj, str):
        return {"s": str(obj)}
    if isinstance(obj, bytes):
        return {"y": base64.b64encode(obj).decode("ascii")}
    if isinstance(obj, (dict, list, tuple)):
        if id(obj) in active:
            raise TypeError(f"{where}: the structure contains itself (a cycle)")
        active.add(id(obj))
        try:
            if isinstance(obj, dict):
                items = []
                for k, v in obj.items():
                    if isinstance(k, bool) or not isinstance(k, (str, int)):
                        raise TypeError(f"{where}: dict keys must be str or int, got {type(k).__name__} {k!r}")
                    items.append([_encode(k, tensors, where, active), _encode(v, tensors, _key_path(where, k), active)])
                return {"d": items}
            tag = "l" if isinstance(obj, list) else "u"
            return {tag: [_encode(v, tensors, f"{where}[{i}]", active) for i, v in enumerate(obj)]}
        finally:
            active.discard(id(obj))
    raise TypeError(f"{where}: cannot checkpoint a {type(obj).__module__}.{type(obj).__qualname__}")


# ---- decoding ----------------------------------------------------------------------------------
def _shape(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(type(s) is int and s >= 0 for s in value):
        raise CheckpointError(f"{where}: shape {value!r} is not a list of non-negative ints")
    return tuple(value)


def _tensor(tensors: dict[str, torch.Tensor], key: Any, where: str) -> torch.Tensor:
    if not isinstance(key, str):
        raise CheckpointError(f"{where}: tensor key {key!r} is not a string")
    if key not in tensors:
        raise CheckpointError(f"{where}: tensor {key!r} is missing from {TENSORS}")
    return tensors[key]


def _decode_tensor(node: dict[str, Any], tensors: dict[str, torch.Tensor], where: str) -> torch.Tensor:
    t = _tensor(tensors, node["T"], where)
    if "dtype" not in node and "shape" not in node:
        return t
    dtype = _TORCH_DTYPES.get(node.get("dtype"))  # type: ignore[arg-type]
    if dtype is None:
        raise CheckpointError(f"{where}: unknown torch dtype {node.get('dtype')!r}")
    shape = _shape(node.get("shape"), where)
    if t.dtype != torch.uint8 or t.dim() != 1 or t.numel() != dtype.itemsize * math.prod(shape):
        raise CheckpointError(f"{where}: stored bytes do not hold a {dtype} tensor of shape {list(shape)}")
    try:
        return t.view(dtype).reshape(shape)
    except RuntimeError as exc:  # e.g. a quantized dtype named in a hand-made file
        raise CheckpointError(f"{where}: cannot rebuild a {dtype} tensor: {exc}") from exc


def _decode_numpy(node: dict[str, Any], tensors: dict[str, torch.Tensor], where: str) -> np.ndarray | np.generic:
    t = _tensor(tensors, node["N"], where)
    name = node.get("dtype")
    if not isinstance(name, str):
        raise CheckpointError(f"{where}: numpy dtype {name!r} is not a string")
    try:
        dtype = np.dtype(name)  # parses the name only; object dtypes are refused below
    except Exception as exc:
        raise CheckpointError(f"{where}: unknown numpy dtype {name!r}") from exc
    if dtype.hasobject:
        raise CheckpointError(f"{where}: numpy dtype {name!r} holds Python objects: not allowed")
    shape = _shape(node.get("shape"), where)
    scalar = node.get("scalar", False)
    if not isinstance(scalar, bool) or (scalar and shape):
        raise CheckpointError(f"{where}: bad 'scalar' field {scalar!r} for shape {list(shape)}")
    raw = t.contiguous().reshape(-1).view(torch.uint8).numpy()  # typed or raw-bytes storage alike
    if raw.size != dtype.itemsize * math.prod(shape):
        raise CheckpointError(f"{where}: stored bytes do not hold a {dtype} array of shape {list(shape)}")
    arr = np.empty(shape, dtype=dtype) if dtype.itemsize == 0 else raw.view(dtype).reshape(shape).copy()
    return arr[()] if scalar else arr


def _decode(node: Any, tensors: dict[str, torch.Tensor], where: str) -> Any:
    if not isinstance(node, dict):
        raise CheckpointError(f"{where}: expected a node object, got {type(node).__name__}")
    tags = [k for k in node if k in _NODES]
    if len(tags) != 1:
        raise CheckpointError(f"{where}: unknown node type with fields {sorted(node)[:8]}")
    tag = tags[0]
    extra = set(node) - {tag} - _NODES[tag]
    if extra:
        raise CheckpointError(f"{where}: unexpected fields {sorted(extra)} in a '{tag}' node")
    value = node[tag]

    def want(kind: type | tuple[type, ...], what: str) -> None:
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise CheckpointError(f"{where}: a '{tag}' node holds {what}, got {type(value).__name__}")

    if tag == "n":
        if value is not None:
            raise CheckpointError(f"{where}: a 'n' node holds null")
        return None
    if tag == "b":
        want(bool, "a boolean")
        return value
    if tag == "s":
        want(str, "a string")
        return value
    if tag == "i":
        want(str, "a decimal or hex string")
        try:
            return int(value, 16) if value.lstrip("-").startswith("0x") else int(value)
        except ValueError as exc:
            raise CheckpointError(f"{where}: bad integer: {exc}") from exc
    if tag == "f":
        want(str, "a float literal string")
        try:
            return float(value)
        except ValueError as exc:
            raise CheckpointError(f"{where}: bad float: {exc}") from exc
    if tag == "y":
        want(str, "base64 text")
        try:
            return base64.b64decode(value, validate=True)
        except ValueError as exc:
            raise CheckpointError(f"{where}: bad base64: {exc}") from exc
    if tag == "T":
        return _decode_tensor(node, tensors, where)
    if tag == "N":
        return _decode_numpy(node, tensors, where)
    want(list, "a list")
    if tag == "l":
        return [_decode(v, tensors, f"{where}[{i}]") for i, v in enumerate(value)]
    if tag == "u":
        return tuple(_decode(v, tensors, f"{where}[{i}]") for i, v in enumerate(value))
    out: dict[Any, Any] = {}
    for pair in value:  # tag == "d"
        if not isinstance(pair, list) or len(pair) != 2:
            raise CheckpointError(f"{where}: a dict entry is not a [key, value] pair")
        key = _decode(pair[0], tensors, f"{where}.<key>")
        if isinstance(key, bool) or not isinstance(key, (str, int)):
            raise CheckpointError(f"{where}: dict key {key!r} is not a str or int")
        if key in out:
            raise CheckpointError(f"{where}: dict key {key!r} appears twice")
        out[key] = _decode(pair[1], tensors, _key_path(where, key))
    return out


# ---- files -------------------------------------------------------------------------------------
def fsync_dir(path: Path) -> None:
    """Make a rename or a new file in `path` durable (the run directory uses it too)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _old(path: Path) -> Path:
    return path.with_name(f".{path.name}.old")


def _tmp_prefix(path: Path) -> str:
    return f".{path.name}.tmp-"


def _complete(path: Path) -> bool:
    return (path / STATE).is_file() and (path / TENSORS).is_file()


def _ours(path: Path) -> bool:
    """A complete checkpoint holding nothing else: safe to replace (never someone else's folder)."""
    return path.is_dir() and _complete(path) and {p.name for p in path.iterdir()} <= {STATE, TENSORS}


def checkpoint_exists(path: str | Path) -> bool:
    """Whether `load_state(path)` has a checkpoint to read (at `path` or its `.old` sibling)."""
    path = Path(path)
    return _complete(path) or _complete(_old(path))


def save_state(path: str | Path, state: Any) -> Path:
    """Write `state` as a checkpoint directory at `path`, atomically (see the module doc); returns `path`.

    Raises TypeError naming the place of anything that is not a supported leaf or container, and
    FileExistsError if `path` is something other than a checkpoint (it is never deleted).
    """
    path = Path(path)
    tensors: dict[str, torch.Tensor] = {}
    try:
        encoded = _encode(state, tensors, "state", set())
    except RecursionError:
        raise TypeError("state: nested too deeply to checkpoint") from None
    text = json.dumps({"format": FORMAT, "version": VERSION, "state": encoded})
    if path.exists() and not _ours(path) and not (path.is_dir() and not any(path.iterdir())):
        raise FileExistsError(f"{path} exists and is not a checkpoint: refusing to replace it")
    parent = path.parent
    parent.mkdir(parents=True, exist_ok=True)
    for stale in parent.iterdir():  # left by a crash during an earlier save
        if stale.name.startswith(_tmp_prefix(path)):
            shutil.rmtree(stale, ignore_errors=True)
    tmp = parent / f"{_tmp_prefix(path)}{secrets.token_hex(4)}"
    tmp.mkdir()
    old = _old(path)
    try:
        save_file(tensors, str(tmp / TENSORS))
        with open(tmp / TENSORS, "rb") as fh:
            os.fsync(fh.fileno())
        with open(tmp / STATE, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        fsync_dir(tmp)
        if _ours(path):
            # `path` is intact, so any `.old` is stale; keep `path` as `.old` until the new one is in.
            if old.exists():
                shutil.rmtree(old)
            os.replace(path, old)
            fsync_dir(parent)
        # else: `path` is absent or an empty folder and `.old` (if any) is the only intact copy: keep it.
        os.replace(tmp, path)
        fsync_dir(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)
    return path


def load_state(path: str | Path) -> Any:
    """Read a checkpoint written by `save_state` (or the intact `.old` one after a crash).

    Raises CheckpointError when there is no checkpoint or it is malformed, of another format, or
    of an unknown version.
    """
    path = Path(path)
    if not _complete(path):
        if not _complete(_old(path)):
            raise CheckpointError(f"no checkpoint at {path}")
        path = _old(path)  # the crash came between the two renames of save_state
    try:
        doc = json.loads((path / STATE).read_bytes())
    except (OSError, ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise CheckpointError(f"{path / STATE} is not readable JSON: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or "state" not in doc:
        raise CheckpointError(f"{path / STATE} is not a {FORMAT} document")
    version = doc.get("version")
    if type(version) is not int or version != VERSION:
        raise CheckpointError(f"{path}: format version {version!r}, this code reads version {VERSION}")
    try:
        tensors = load_file(str(path / TENSORS), device="cpu")
    except Exception as exc:  # safetensors raises its own error types on corrupt files
        raise CheckpointError(f"{path / TENSORS} is not a readable safetensors file: {exc}") from exc
    try:
        return _decode(doc["state"], tensors, "state")
    except CheckpointError as exc:
        raise CheckpointError(f"{path / STATE}: {exc}") from exc
    except RecursionError:
        raise CheckpointError(f"{path / STATE}: nested too deeply") from None
