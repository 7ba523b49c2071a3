"""Wire framing of `Message`s: a small versioned header frame plus one raw frame per field.

No pickle, no per-element Python work for vectors. A message becomes the multipart frames

    [header, payload_1, ..., payload_k]

header   = PREFIX kind FIELD name FIELD name ...   (little-endian structs, <= max_header_bytes)
PREFIX   = magic "SAGW", wire version u8, flags u8 (0), len(kind) u8, field count u8,
           round i64, sender i64, receiver i64
FIELD    = len(name) u8, type tag u8, dtype code u8, value i64
           value is the int itself (tag INT, no payload frame) or the element count
           (bytes length, tuple length, map size, array length) of the field's payload frame.

Payload frames, in field order, one per non-int field:
  bytes  -> the raw bytes
  tuple  -> n little-endian int64
  map    -> n int64 keys, n uint32 value lengths, then the values concatenated
  array  -> the array's raw little-endian buffer (1-D, whitelisted dtype), sent zero-copy

`decode` checks every count against the frame sizes and the configured limits before it
allocates anything, and raises `ProtocolError` -- never another exception -- on anything
malformed, truncated, oversized or from another wire version. What a decoded message costs in
memory, per wire byte: arrays nothing (views), bytes 1, tuples at most about 8 (Python ints),
maps at most about 13 (a dict entry, an int and a bytes object per item; tiny items are the worst
case), plus some 100 KiB; a receiver bounds its memory by bounding a message's size before
calling `decode` (tests/transport/test_framing.py measures these factors). Decoded arrays are
read-only, zero-copy views of the received frames (kept alive by the array). Sent arrays are not copied
either: the sender must not modify an array it has sent while receivers may still hold it
(over inproc:// the receivers' arrays are views of the very same memory).
"""
from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from secagg.messages import MAX_CLIENT_ID, Message, ProtocolError

MAGIC = b"SAGW"
WIRE_VERSION = 1

PREFIX = struct.Struct("<4sBBBBqqq")
FIELD = struct.Struct("<BBBq")

TAG_INT, TAG_BYTES, TAG_INTS, TAG_MAP, TAG_ARRAY = 1, 2, 3, 4, 5

DTYPES: Mapping[int, np.dtype] = {
    1: np.dtype("<u1"), 2: np.dtype("<i1"), 3: np.dtype("<u2"), 4: np.dtype("<i2"),
    5: np.dtype("<u4"), 6: np.dtype("<i4"), 7: np.dtype("<u8"), 8: np.dtype("<i8"),
    9: np.dtype("<f4"), 10: np.dtype("<f8"),
}
"""Whitelisted array dtypes by wire code (little-endian on the wire)."""
_DTYPE_CODES = {dt: code for code, dt in DTYPES.items()}

MAX_NAME = 64
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class FrameLimits:
    """Upper bounds a receiver enforces before looking inside a message."""

    max_message_bytes: int = 64 << 20
    """Total bytes over all frames (also the per-frame socket limit, ZMQ_MAXMSGSIZE). 64 MiB by
    default (16M uint32 or float32 values); a deployment sending bigger models or vectors raises it
    explicitly on the side that receives them (`ClientConfig.limits`, `ServerConfig.limits`)."""
    max_frames: int = 64
    max_header_bytes: int = 16 << 10

    def __post_init__(self) -> None:
        if self.max_message_bytes < 1 or self.max_frames < 1 or self.max_header_bytes < PREFIX.size:
            raise ValueError("frame limits must be positive and leave room for the header prefix")


DEFAULT_LIMITS = FrameLimits()

Frames = list[Any]
"""Frames ready for `socket.send_multipart(..., copy=False)`: bytes or array buffers."""


# ---- encode ------------------------------------------------------------------------------

def encode(msg: Message) -> Frames:
    """Frames of one message. Raises TypeError/ValueError if `msg` has an unsupported value."""
    header, payload = _encode_fields(msg)
    return [header, *payload]


def encode_header(msg: Message) -> bytes:
    """Header frame only; with `encode_payload` lets a broadcast reuse one payload for all receivers."""
    return _encode_fields(msg, header_only=True)[0]


def encode_payload(msg: Message) -> Frames:
    return _encode_fields(msg)[1]


def _encode_fields(msg: Message, *, header_only: bool = False) -> tuple[bytes, Frames]:
    if not (isinstance(msg.kind, str) and msg.kind.isascii() and msg.kind.isprintable()
            and 0 < len(msg.kind) <= MAX_NAME):
        raise ValueError(f"message kind must be 1..{MAX_NAME} printable ASCII characters: {msg.kind!r}")
    kind = msg.kind.encode("ascii")
    _check_envelope_ints(msg.round, msg.sender, msg.receiver, exc=ValueError)
    if len(msg.fields) > 255:
        raise ValueError("at most 255 fields per message")
    parts = [PREFIX.pack(MAGIC, WIRE_VERSION, 0, len(kind), len(msg.fields),
                         msg.round, msg.sender, msg.receiver), kind]
    payload: Frames = []
    for name, value in msg.fields.items():
        if not isinstance(name, str):
            raise TypeError(f"field names are str, got {type(name).__name__}")
        raw_name = name.encode("utf-8")
        if not 0 < len(raw_name) <= MAX_NAME:
            raise ValueError(f"field name must be 1..{MAX_NAME} bytes: {name!r}")
        tag, code, count, frame = _encode_value(name, value, header_only)
        parts.append(FIELD.pack(len(raw_name), tag, code, count))
        parts.append(raw_name)
        if tag != TAG_INT:
            payload.append(frame)
    return b"".join(parts), payload


def _encode_value(name: str, v: Any, header_only: bool) -> tuple[int, int, int, Any]:
    if type(v) is int:
        if not _I64_MIN <= v <= _I64_MAX:
            raise ValueError(f"int field '{name}' does not fit in 64 bits")
        return TAG_INT, 0, v, None
    if isinstance(v, bytes):
        return TAG_BYTES, 0, len(v), v
    if isinstance(v, tuple):
        if any(type(i) is not int for i in v):
            raise TypeError(f"tuple field '{name}' must hold ints only")
        if header_only:
            return TAG_INTS, 0, len(v), None
        try:
            arr = np.array(v, dtype="<i8") if v else np.empty(0, dtype="<i8")
        except OverflowError as exc:
            raise ValueError(f"tuple field '{name}' has an entry outside int64") from exc
        return TAG_INTS, 0, len(v), arr
    if isinstance(v, np.ndarray):
        if v.ndim != 1:
            raise ValueError(f"array field '{name}' must be one-dimensional")
        wire = v.dtype.newbyteorder("<")
        code = _DTYPE_CODES.get(wire)
        if code is None:
            raise TypeError(f"array field '{name}' has dtype {v.dtype}, not one of the wire dtypes")
        if header_only:
            return TAG_ARRAY, code, v.shape[0], None
        return TAG_ARRAY, code, v.shape[0], np.ascontiguousarray(v, dtype=wire)
    if isinstance(v, Mapping):
        return TAG_MAP, 0, len(v), None if header_only else _encode_map(name, v)
    raise TypeError(f"field '{name}' has unsupported type {type(v).__name__}")


def _encode_map(name: str, v: Mapping) -> bytes:
    keys, values = list(v.keys()), list(v.values())
    if any(type(k) is not int for k in keys) or any(not isinstance(b, bytes) for b in values):
        raise TypeError(f"map field '{name}' must map ints to bytes")
    try:
        key_arr = np.array(keys, dtype="<i8")
        len_arr = np.array([len(b) for b in values], dtype="<u4")
    except OverflowError as exc:
        raise ValueError(f"map field '{name}' has a key outside int64 or a value over 4 GiB") from exc
    return b"".join([key_arr.tobytes(), len_arr.tobytes(), *values])


def wire_size(frames: Sequence[Any]) -> int:
    """Bytes carried by a list of frames (as produced by `encode`, or as received)."""
    return sum(memoryview(f).nbytes for f in frames)


# ---- decode ------------------------------------------------------------------------------

def decode(frames: Sequence[Any], *, limits: FrameLimits = DEFAULT_LIMITS) -> Message:
    """Parse received frames (bytes, memoryviews or zmq.Frame). Raises ProtocolError if invalid."""
    try:
        return _decode(frames, limits)
    except ProtocolError:
        raise
    except Exception as exc:  # defence in depth: malformed input must never escape as another type
        raise ProtocolError(f"malformed message ({type(exc).__name__}: {exc})") from exc


def _decode(frames: Sequence[Any], limits: FrameLimits) -> Message:
    if not 1 <= len(frames) <= limits.max_frames:
        raise ProtocolError(f"message has {len(frames)} frames (limit {limits.max_frames})")
    views = [memoryview(f).cast("B") for f in frames]
    total = sum(v.nbytes for v in views)
    if total > limits.max_message_bytes:
        raise ProtocolError(f"message of {total} bytes exceeds the limit of {limits.max_message_bytes}")
    head = views[0]
    if head.nbytes > limits.max_header_bytes:
        raise ProtocolError(f"header of {head.nbytes} bytes exceeds the limit of {limits.max_header_bytes}")
    if head.nbytes < PREFIX.size:
        raise ProtocolError("truncated header")
    magic, version, flags, kind_len, n_fields, rnd, sender, receiver = PREFIX.unpack_from(head, 0)
    if magic != MAGIC:
        raise ProtocolError("bad magic: not a framed message")
    if version != WIRE_VERSION:
        raise ProtocolError(f"unsupported wire version {version} (this side speaks {WIRE_VERSION})")
    if flags != 0:
        raise ProtocolError("unknown header flags")
    _check_envelope_ints(rnd, sender, receiver, exc=ProtocolError)
    pos = PREFIX.size
    kind = _ascii(head, pos, kind_len, "kind")
    pos += kind_len

    fields: dict[str, Any] = {}
    next_frame = 1
    for _ in range(n_fields):
        if pos + FIELD.size > head.nbytes:
            raise ProtocolError("truncated field table")
        name_len, tag, code, value = FIELD.unpack_from(head, pos)
        pos += FIELD.size
        name = _name(head, pos, name_len)
        pos += name_len
        if name in fields:
            raise ProtocolError(f"field '{name}' appears twice")
        if tag == TAG_INT:
            if code != 0:
                raise ProtocolError(f"int field '{name}' carries a dtype code")
            fields[name] = value
            continue
        if next_frame >= len(views):
            raise ProtocolError(f"field '{name}' has no payload frame")
        fields[name] = _decode_value(name, tag, code, value, views[next_frame])
        next_frame += 1
    if pos != head.nbytes:
        raise ProtocolError("trailing bytes after the field table")
    if next_frame != len(views):
        raise ProtocolError(f"{len(views) - next_frame} unexpected extra frames")
    return Message(kind=kind, round=rnd, sender=sender, receiver=receiver, fields=fields)


def _decode_value(name: str, tag: int, code: int, count: int, view: memoryview) -> Any:
    if tag != TAG_ARRAY and code != 0:
        raise ProtocolError(f"field '{name}' carries a dtype code but is not an array")
    if count < 0:
        raise ProtocolError(f"field '{name}' has a negative length")
    size = view.nbytes
    if tag == TAG_BYTES:
        if count != size:
            raise ProtocolError(f"bytes field '{name}' declares {count} bytes, frame has {size}")
        return view.tobytes()
    if tag == TAG_INTS:
        if count * 8 != size:
            raise ProtocolError(f"tuple field '{name}' declares {count} ints, frame has {size} bytes")
        return tuple(np.frombuffer(view, dtype="<i8").tolist())
    if tag == TAG_MAP:
        return _decode_map(name, count, view)
    if tag == TAG_ARRAY:
        dtype = DTYPES.get(code)
        if dtype is None:
            raise ProtocolError(f"array field '{name}' has unknown dtype code {code}")
        if count * dtype.itemsize != size:
            raise ProtocolError(f"array field '{name}' declares {count} x {dtype}, frame has {size} bytes")
        arr = np.frombuffer(view, dtype=dtype)  # zero-copy view of the received frame
        if not arr.flags.aligned:  # rare (tiny frames): copy rather than run slow unaligned loops
            arr = arr.copy()
        # Read-only: over inproc:// a frame may be the sender's own buffer, shared by every
        # receiver of a broadcast; copy before modifying.
        arr.flags.writeable = False
        return arr
    raise ProtocolError(f"field '{name}' has unknown type tag {tag}")


def _decode_map(name: str, count: int, view: memoryview) -> dict[int, bytes]:
    if count * 12 > view.nbytes:
        raise ProtocolError(f"map field '{name}' declares {count} items, frame is too short")
    keys = np.frombuffer(view, dtype="<i8", count=count)
    ends = np.cumsum(np.frombuffer(view, dtype="<u4", count=count, offset=8 * count), dtype=np.int64)
    ends += 12 * count
    if (int(ends[-1]) if count else 0) != view.nbytes:
        raise ProtocolError(f"map field '{name}' value lengths do not match its frame size")
    out: dict[int, bytes] = {}
    start = 12 * count
    for lo in range(0, count, _MAP_CHUNK):  # chunks: no full-size Python lists besides the result
        for k, end in zip(keys[lo : lo + _MAP_CHUNK].tolist(), ends[lo : lo + _MAP_CHUNK].tolist()):
            out[k] = view[start:end].tobytes()
            start = end
    if len(out) != count:
        raise ProtocolError(f"map field '{name}' repeats a key")
    return out


_MAP_CHUNK = 4096


def _ascii(head: memoryview, pos: int, n: int, what: str) -> str:
    if not 0 < n <= MAX_NAME or pos + n > head.nbytes:
        raise ProtocolError(f"invalid or truncated {what}")
    raw = head[pos : pos + n].tobytes()
    text = raw.decode("ascii") if raw.isascii() else ""
    if not text.isprintable() or not text:
        raise ProtocolError(f"{what} is not printable ASCII")
    return text


def _name(head: memoryview, pos: int, n: int) -> str:
    if not 0 < n <= MAX_NAME or pos + n > head.nbytes:
        raise ProtocolError("invalid or truncated field name")
    try:
        return head[pos : pos + n].tobytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError("field name is not UTF-8") from exc


def _check_envelope_ints(rnd: int, sender: int, receiver: int, *, exc: type[Exception]) -> None:
    if type(rnd) is not int or not 0 <= rnd <= _I64_MAX:
        raise exc(f"round must be a non-negative 64-bit int, got {rnd!r}")
    for who, v in (("sender", sender), ("receiver", receiver)):
        if type(v) is not int or not 0 <= v <= MAX_CLIENT_ID:
            raise exc(f"{who} must be a party id in [0, {MAX_CLIENT_ID}], got {v!r}")
