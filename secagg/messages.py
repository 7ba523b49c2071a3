"""Protocol messages and their schemas.

A message is a kind, a round, a sender, a receiver and named fields. Field values are restricted
to five wire types (int, bytes, tuple of ints, map int -> bytes, 1-D numpy array) so that the
transport can frame them without pickle. Every kind has a schema; `validate` checks a received
message against it (field set, types, sizes, ranges) before any protocol code looks at it.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Union

import numpy as np

SERVER = 0
"""Party id of the server; clients are 1, 2, ... (positive ids)."""
MAX_CLIENT_ID = 2**31 - 1

Value = Union[int, bytes, tuple, Mapping, np.ndarray]


class ProtocolError(Exception):
    """A received message is malformed, unexpected, replayed or from the wrong party.

    Raised before any state changes; the driver logs it and drops the message.
    """


class AbortError(RuntimeError):
    """The round cannot produce a correct sum (too few clients survived a stage)."""

    def __init__(self, *, stage: str, survivors: int, required: int, detail: str = "") -> None:
        self.stage, self.survivors, self.required = stage, survivors, required
        msg = f"round aborted at stage '{stage}': {survivors} clients left, {required} required"
        super().__init__(msg + (f" ({detail})" if detail else ""))


@dataclass(frozen=True)
class Message:
    kind: str
    round: int
    sender: int
    receiver: int
    fields: Mapping[str, Value] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", MappingProxyType(dict(self.fields)))

    def __getitem__(self, name: str) -> Value:
        return self.fields[name]

    def nbytes(self) -> int:
        """Payload size (what the transport carries beyond its fixed header)."""
        total = 0
        for v in self.fields.values():
            if isinstance(v, np.ndarray):
                total += v.nbytes
            elif isinstance(v, bytes):
                total += len(v)
            elif isinstance(v, tuple):
                total += 8 * len(v)
            elif isinstance(v, Mapping):
                total += sum(8 + len(b) for b in v.values())
            else:
                total += 8
        return total


# ---- field specifications -------------------------------------------------------------------

@dataclass(frozen=True)
class Int:
    lo: int = -(2**63)
    hi: int = 2**63 - 1

    def check(self, name: str, v: Value) -> None:
        if type(v) is not int or not self.lo <= v <= self.hi:
            raise ProtocolError(f"field '{name}' must be an int in [{self.lo}, {self.hi}]")


@dataclass(frozen=True)
class Bytes:
    max_len: int
    exact: bool = False

    def check(self, name: str, v: Value) -> None:
        if type(v) is not bytes:
            raise ProtocolError(f"field '{name}' must be bytes")
        if len(v) > self.max_len or (self.exact and len(v) != self.max_len):
            raise ProtocolError(f"field '{name}' has {len(v)} bytes (limit {self.max_len})")


@dataclass(frozen=True)
class IntList:
    max_len: int
    lo: int = 0
    hi: int = MAX_CLIENT_ID
    distinct: bool = True

    def check(self, name: str, v: Value) -> None:
        if type(v) is not tuple or len(v) > self.max_len:
            raise ProtocolError(f"field '{name}' must be a tuple of at most {self.max_len} ints")
        if any(type(i) is not int or not self.lo <= i <= self.hi for i in v):
            raise ProtocolError(f"field '{name}' has a non-int or out-of-range entry")
        if self.distinct and len(set(v)) != len(v):
            raise ProtocolError(f"field '{name}' has repeated entries")


@dataclass(frozen=True)
class BytesMap:
    max_items: int
    max_len: int
    exact: bool = False

    def check(self, name: str, v: Value) -> None:
        if not isinstance(v, Mapping) or len(v) > self.max_items:
            raise ProtocolError(f"field '{name}' must be a map of at most {self.max_items} items")
        for k, b in v.items():
            if type(k) is not int or not 0 <= k <= MAX_CLIENT_ID:
                raise ProtocolError(f"field '{name}' has an invalid key")
            if type(b) is not bytes or len(b) > self.max_len or (self.exact and len(b) != self.max_len):
                raise ProtocolError(f"field '{name}' has an invalid value for key {k}")


@dataclass(frozen=True)
class Array:
    dtype: str
    max_len: int

    def check(self, name: str, v: Value) -> None:
        if not isinstance(v, np.ndarray) or v.dtype != np.dtype(self.dtype) or v.ndim != 1:
            raise ProtocolError(f"field '{name}' must be a 1-D {self.dtype} array")
        if v.shape[0] > self.max_len:
            raise ProtocolError(f"field '{name}' has {v.shape[0]} entries (limit {self.max_len})")


FieldSpec = Union[Int, Bytes, IntList, BytesMap, Array]


@dataclass(frozen=True)
class Schema:
    kind: str
    fields: Mapping[str, FieldSpec]

    def validate(self, msg: Message) -> None:
        if msg.kind != self.kind:
            raise ProtocolError(f"expected a '{self.kind}' message, got '{msg.kind}'")
        if set(msg.fields) != set(self.fields):
            missing = set(self.fields) - set(msg.fields)
            extra = set(msg.fields) - set(self.fields)
            raise ProtocolError(f"'{self.kind}' fields wrong: missing {sorted(missing)}, extra {sorted(extra)}")
        for name, spec in self.fields.items():
            spec.check(name, msg.fields[name])


def check_envelope(msg: Message, *, kind: str, round_id: int, sender: int | None, receiver: int) -> None:
    """The checks every protocol does first: kind, round, addressee and (if known) sender."""
    if not isinstance(msg, Message):
        raise ProtocolError("not a Message")
    if msg.round != round_id:
        raise ProtocolError(f"message for round {msg.round}, current round is {round_id}")
    if msg.receiver != receiver:
        raise ProtocolError(f"message addressed to {msg.receiver}, not {receiver}")
    if sender is not None and msg.sender != sender:
        raise ProtocolError(f"message from {msg.sender}, expected {sender}")
    if msg.kind != kind:
        raise ProtocolError(f"unexpected '{msg.kind}' message, expected '{kind}'")
