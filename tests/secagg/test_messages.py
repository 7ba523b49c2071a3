"""Message envelope, wire types and schema validation: everything received is checked before use."""
from __future__ import annotations

import numpy as np
import pytest

from secagg.messages import (
    MAX_CLIENT_ID, SERVER, AbortError, Array, Bytes, BytesMap, Int, IntList, Message, ProtocolError, Schema,
    check_envelope,
)


def msg(**fields) -> Message:
    return Message(kind="k", round=3, sender=1, receiver=SERVER, fields=fields)


SCHEMA = Schema("k", {
    "n": Int(0, 10),
    "b": Bytes(4),
    "e": Bytes(3, exact=True),
    "ids": IntList(3, 1, 100),
    "m": BytesMap(2, 5, exact=True),
    "v": Array("uint32", 8),
})


def good_fields() -> dict:
    return dict(n=5, b=b"ab", e=b"xyz", ids=(1, 2), m={1: b"12345"}, v=np.zeros(8, dtype=np.uint32))


def test_good_message_validates():
    SCHEMA.validate(msg(**good_fields()))


@pytest.mark.parametrize(
    "name, value",
    [
        ("n", -1), ("n", 11), ("n", True), ("n", 5.0), ("n", np.int64(5)), ("n", "5"), ("n", None),
        ("b", b"abcde"), ("b", bytearray(b"ab")), ("b", "ab"), ("b", memoryview(b"ab")),
        ("e", b"xy"), ("e", b"wxyz"),
        ("ids", [1, 2]), ("ids", (1, 1)), ("ids", (0,)), ("ids", (101,)), ("ids", (1, 2, 3, 4)), ("ids", (1, True)),
        ("ids", (1.0,)), ("ids", 1),
        ("m", {1: b"1234"}), ("m", {1: b"123456"}), ("m", {-1: b"12345"}), ("m", {"1": b"12345"}),
        ("m", {True: b"12345"}), ("m", {1: "12345"}), ("m", {1: b"12345", 2: b"12345", 3: b"12345"}),
        ("m", [(1, b"12345")]), ("m", {MAX_CLIENT_ID + 1: b"12345"}),
        ("v", np.zeros(8, dtype=np.int32)), ("v", np.zeros(8, dtype=np.uint64)), ("v", np.zeros(8, dtype=">u4")),
        ("v", np.zeros((2, 4), dtype=np.uint32)), ("v", np.zeros(9, dtype=np.uint32)), ("v", [0] * 8),
        ("v", np.zeros(8, dtype=np.float32)), ("v", b"\0" * 32),
    ],
)
def test_each_wrong_value_is_refused(name, value):
    fields = good_fields()
    fields[name] = value
    with pytest.raises(ProtocolError, match=f"field '{name}' "):
        SCHEMA.validate(msg(**fields))


def test_missing_and_extra_fields_are_refused():
    fields = good_fields()
    del fields["n"]
    with pytest.raises(ProtocolError, match="missing"):
        SCHEMA.validate(msg(**fields))
    with pytest.raises(ProtocolError, match="extra"):
        SCHEMA.validate(msg(**good_fields(), spare=1))


def test_wrong_kind_is_refused():
    m = Message(kind="other", round=3, sender=1, receiver=SERVER, fields=good_fields())
    with pytest.raises(ProtocolError, match="expected a 'k' message, got 'other'"):
        SCHEMA.validate(m)


def test_short_array_is_allowed_by_schema_length_is_checked_by_the_protocol():
    SCHEMA.validate(msg(**{**good_fields(), "v": np.zeros(3, dtype=np.uint32)}))


@pytest.mark.parametrize(
    "m, kwargs, message",
    [
        (Message("k", 4, 1, SERVER), {}, "message for round 4, current round is 3"),
        (Message("k", 3, 1, 7), {}, "message addressed to 7, not 0"),
        (Message("k", 3, 2, SERVER), {"sender": 1}, "message from 2, expected 1"),
        (Message("j", 3, 1, SERVER), {}, "unexpected 'j' message, expected 'k'"),
        ("not a message", {}, "not a Message"),
        (None, {}, "not a Message"),
        ({"kind": "k", "round": 3, "sender": 1, "receiver": 0}, {}, "not a Message"),
    ],
)
def test_envelope_checks(m, kwargs, message):
    args = dict(kind="k", round_id=3, sender=None, receiver=SERVER) | kwargs
    with pytest.raises(ProtocolError, match=message):
        check_envelope(m, **args)


def test_envelope_accepts_a_matching_message():
    check_envelope(Message("k", 3, 1, SERVER), kind="k", round_id=3, sender=1, receiver=SERVER)
    check_envelope(Message("k", 3, 9, SERVER), kind="k", round_id=3, sender=None, receiver=SERVER)


def test_message_fields_are_read_only():
    src = {"a": 1}
    m = Message("k", 1, 1, 0, src)
    src["a"] = 2  # the message keeps its own copy
    assert m["a"] == 1
    with pytest.raises(TypeError, match="does not support item assignment"):
        m.fields["a"] = 3  # type: ignore[index]
    with pytest.raises(AttributeError, match="cannot assign to field 'round'"):
        m.round = 2  # type: ignore[misc]


def test_nbytes_counts_payload():
    m = Message("k", 1, 1, 0, {
        "v": np.zeros(10, dtype=np.uint32),   # 40
        "b": b"abc",                          # 3
        "t": (1, 2),                          # 16
        "m": {1: b"12345", 2: b""},           # 8 + 5 + 8 + 0
        "n": 7,                               # 8
    })
    assert m.nbytes() == 40 + 3 + 16 + 21 + 8
    assert Message("k", 1, 1, 0).nbytes() == 0


def test_abort_error_carries_stage_and_counts():
    e = AbortError(stage="unmask", survivors=3, required=5, detail="why")
    assert (e.stage, e.survivors, e.required) == ("unmask", 3, 5)
    assert "unmask" in str(e) and "3" in str(e) and "5" in str(e) and "why" in str(e)
    assert isinstance(e, RuntimeError) and not isinstance(e, ProtocolError)
