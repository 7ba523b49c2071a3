"""Wire framing: exact round trips, ProtocolError (never anything else) on bad input, and what
decoding costs in memory."""
from __future__ import annotations

import tracemalloc
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from secagg.messages import MAX_CLIENT_ID, Message, ProtocolError
from transport.framing import (DTYPES, FIELD, PREFIX, TAG_INT, WIRE_VERSION,
                               FrameLimits, decode, encode, encode_header, encode_payload, wire_size)

I64 = st.integers(-(2**63), 2**63 - 1)
names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=16)
arrays = st.sampled_from(sorted(DTYPES.values(), key=str)).flatmap(
    lambda dt: hnp.arrays(dt, st.integers(0, 40)))
values = st.one_of(
    I64,
    st.binary(max_size=64),
    st.lists(I64, max_size=20).map(tuple),
    st.dictionaries(I64, st.binary(max_size=24), max_size=8),
    arrays,
)
messages = st.builds(
    Message,
    kind=st.text(st.characters(min_codepoint=32, max_codepoint=126), min_size=1, max_size=64),
    round=st.integers(0, 2**63 - 1),
    sender=st.integers(0, MAX_CLIENT_ID),
    receiver=st.integers(0, MAX_CLIENT_ID),
    fields=st.dictionaries(names, values, max_size=8),
)


def same_value(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, dict):
        return isinstance(b, dict) and a == b and all(type(k) is int for k in b)
    return type(a) is type(b) and a == b


def assert_same(a: Message, b: Message) -> None:
    assert (a.kind, a.round, a.sender, a.receiver) == (b.kind, b.round, b.sender, b.receiver)
    assert list(a.fields) == list(b.fields)
    for name in a.fields:
        assert same_value(a.fields[name], b.fields[name]), name


@settings(max_examples=50, deadline=None)
@given(messages)
def test_round_trip_through_bytes(msg: Message) -> None:
    encoded = encode(msg)
    frames = [bytes(memoryview(f).cast("B")) for f in encoded]  # what a socket would carry
    assert_same(msg, decode(frames))
    assert wire_size(encoded) == sum(len(f) for f in frames)  # bytes, not elements, of array frames


@settings(max_examples=30, deadline=None)
@given(messages)
def test_broadcast_header_plus_shared_payload_equals_full_encoding(msg: Message) -> None:
    frames = [encode_header(msg), *encode_payload(msg)]
    assert_same(msg, decode(frames))


def test_array_payload_is_zero_copy_both_ways() -> None:
    x = np.arange(10_000, dtype=np.uint32)
    frames = encode(Message(kind="v", round=1, sender=2, receiver=0, fields={"x": x}))
    assert frames[1] is x or np.shares_memory(frames[1], x)
    y = decode(frames)["x"]
    assert np.shares_memory(x, y) and not y.flags.writeable  # receivers cannot corrupt a shared buffer


def test_big_endian_and_strided_arrays_are_sent_as_little_endian_values() -> None:
    x = np.arange(12, dtype=">i8")[::2]
    out = decode([bytes(memoryview(f).cast("B")) for f in encode(Message(kind="v", round=0, sender=1, receiver=0,
                                                                           fields={"x": x}))])["x"]
    assert out.dtype == np.dtype("<i8") and out.tolist() == x.tolist()


@pytest.mark.parametrize(("fields", "message"), [
    ({"x": np.zeros((2, 2), dtype=np.uint32)}, "must be one-dimensional"),
    ({"x": np.zeros(3, dtype=bool)}, "not one of the wire dtypes"),        # dtype not on the whitelist
    ({"x": np.zeros(3, dtype=np.complex64)}, "not one of the wire dtypes"),
    ({"x": 2**63}, "does not fit in 64 bits"),
    ({"x": True}, "unsupported type bool"),                                # bool is not an int on the wire
    ({"x": (1, 2.0)}, "must hold ints only"),
    ({"x": {1: "text"}}, "must map ints to bytes"),
    ({"x": 1.5}, "unsupported type float"),
    ({"x": [1, 2]}, "unsupported type list"),
    ({"": 1}, r"field name must be 1\.\.64 bytes"),
    ({"n" * 65: 1}, r"field name must be 1\.\.64 bytes"),
])
def test_encode_refuses_values_outside_the_wire_types(fields, message) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        encode(Message(kind="k", round=0, sender=1, receiver=0, fields=fields))


KIND = r"message kind must be 1\.\.64 printable ASCII characters"


@pytest.mark.parametrize(("envelope", "message"), [
    (dict(kind="", round=0, sender=1, receiver=0), KIND),
    (dict(kind="k" * 65, round=0, sender=1, receiver=0), KIND),
    (dict(kind="caf\u00e9", round=0, sender=1, receiver=0), KIND),
    (dict(kind="k", round=-1, sender=1, receiver=0), "round must be a non-negative 64-bit int"),
    (dict(kind="k", round=0, sender=-1, receiver=0), "sender must be a party id"),
    (dict(kind="k", round=0, sender=1, receiver=MAX_CLIENT_ID + 1), "receiver must be a party id"),
])
def test_encode_refuses_bad_envelopes(envelope, message) -> None:
    with pytest.raises(ValueError, match=message):
        encode(Message(**envelope))


# ---- hostile input -------------------------------------------------------------------------

def valid_frames() -> list[bytes]:
    msg = Message(kind="masked_input", round=7, sender=3, receiver=0, fields={
        "vector": np.arange(16, dtype=np.uint32), "n": 5, "ids": (1, 2, 3),
        "shares": {1: b"a", 2: b"bb"}, "key": b"k" * 32})
    return [bytes(memoryview(f).cast("B")) for f in encode(msg)]


def header_with(**changes) -> list[bytes]:
    frames = valid_frames()
    head = bytearray(frames[0])
    values = list(PREFIX.unpack_from(head, 0))
    keys = ["magic", "version", "flags", "kind_len", "n_fields", "round", "sender", "receiver"]
    for k, v in changes.items():
        values[keys.index(k)] = v
    PREFIX.pack_into(head, 0, *values)
    return [bytes(head), *frames[1:]]


def first_field_with(**changes) -> list[bytes]:
    """Rewrite the first field record ('vector', an array) of the valid message."""
    frames = valid_frames()
    head = bytearray(frames[0])
    pos = PREFIX.size + len(b"masked_input")
    values = list(FIELD.unpack_from(head, pos))
    keys = ["name_len", "tag", "code", "value"]
    for k, v in changes.items():
        values[keys.index(k)] = v
    FIELD.pack_into(head, pos, *values)
    return [bytes(head), *frames[1:]]


BAD = {
    "empty": [],
    "empty header": [b""],
    "garbage": [b"\x00" * 40],
    "bad magic": header_with(magic=b"XXXX"),
    "wrong version": header_with(version=WIRE_VERSION + 1),
    "flags set": header_with(flags=1),
    "kind too long": header_with(kind_len=200),
    "zero-length kind": header_with(kind_len=0),
    "more fields than table": header_with(n_fields=9),
    "fewer fields than table": header_with(n_fields=4),
    "negative round": header_with(round=-5),
    "sender out of range": header_with(sender=MAX_CLIENT_ID + 1),
    "negative receiver": header_with(receiver=-1),
    "wrong dtype code": first_field_with(code=99),
    "dtype size mismatch": first_field_with(code=10),   # float64 needs twice the bytes
    "array length mismatch": first_field_with(value=17),
    "negative length": first_field_with(value=-1),
    "unknown tag": first_field_with(tag=42),
    "int with dtype": first_field_with(tag=TAG_INT, code=5),
    "bad name length": first_field_with(name_len=0),
    "missing payload frame": valid_frames()[:-1],
    "extra frame": [*valid_frames(), b"x"],
    "trailing header bytes": [valid_frames()[0] + b"\x00", *valid_frames()[1:]],
    "truncated header": [valid_frames()[0][:-3], *valid_frames()[1:]],
    "truncated array frame": [valid_frames()[0], valid_frames()[1][:-1], *valid_frames()[2:]],
}


_MAGIC, _KIND, _NAME = "bad magic: not a framed message", "invalid or truncated kind", "invalid or truncated field name"
REASON = {  # what each message's ProtocolError names
    "empty": r"message has 0 frames", "empty header": "truncated header", "garbage": _MAGIC, "bad magic": _MAGIC,
    "wrong version": "unsupported wire version 2", "flags set": "unknown header flags", "kind too long": _KIND,
    "zero-length kind": _KIND, "more fields than table": "truncated field table",
    "fewer fields than table": "trailing bytes after the field table",
    "negative round": "round must be a non-negative",
    "sender out of range": "sender must be a party id", "negative receiver": "receiver must be a party id",
    "wrong dtype code": "unknown dtype code 99", "dtype size mismatch": "declares 16 x float64, frame has 64 bytes",
    "array length mismatch": "declares 17 x uint32, frame has 64 bytes", "negative length": "has a negative length",
    "unknown tag": "carries a dtype code but is not an array",
    "int with dtype": "int field 'vector' carries a dtype code",
    "bad name length": _NAME, "missing payload frame": "field 'key' has no payload frame",
    "extra frame": "1 unexpected extra frames", "trailing header bytes": "trailing bytes after the field table",
    "truncated header": _NAME, "truncated array frame": "declares 16 x uint32, frame has 63 bytes",
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_malformed_messages_raise_protocol_error(name: str) -> None:
    with pytest.raises(ProtocolError, match=REASON[name]):
        decode(BAD[name])


def test_map_and_tuple_frames_are_checked() -> None:
    frames = valid_frames()
    # frame order follows field order: vector, ids, shares, key
    ids, shares = frames[2], frames[3]
    bad_ids = [frames[0], frames[1], ids[:-1], shares, frames[4]]
    dup_keys = np.array([1, 1], "<i8").tobytes() + np.array([1, 2], "<u4").tobytes() + b"abb"
    wrong_lengths = np.array([1, 2], "<i8").tobytes() + np.array([1, 5], "<u4").tobytes() + b"abb"
    huge_count = shares  # declared count is in the header; make the frame too short for it
    for bad, message in (([frames[0], frames[1], frames[2], dup_keys, frames[4]], "map field 'shares' repeats a key"),
                         ([frames[0], frames[1], frames[2], wrong_lengths, frames[4]],
                          "value lengths do not match its frame size"),
                         ([frames[0], frames[1], frames[2], huge_count[:20], frames[4]],
                          "declares 2 items, frame is too short"),
                         (bad_ids, "tuple field 'ids' declares 3 ints, frame has 23 bytes")):
        with pytest.raises(ProtocolError, match=message):
            decode(bad)


def test_duplicate_field_names_are_refused() -> None:
    one = Message(kind="k", round=0, sender=1, receiver=0, fields={"a": 1})
    head = encode(one)[0]
    prefix = list(PREFIX.unpack_from(head, 0))
    prefix[4] = 2
    record = head[PREFIX.size + 1:]
    with pytest.raises(ProtocolError, match="twice"):
        decode([PREFIX.pack(*prefix) + b"k" + record + record])


def test_limits_on_size_frames_and_header() -> None:
    msg = Message(kind="k", round=0, sender=1, receiver=0,
                  fields={"x": np.zeros(1000, np.uint32), "y": b"1", "z": b"2"})
    frames = encode(msg)
    assert decode(frames, limits=FrameLimits(max_message_bytes=5000))["x"].shape == (1000,)
    with pytest.raises(ProtocolError, match="exceeds"):
        decode(frames, limits=FrameLimits(max_message_bytes=3999))
    with pytest.raises(ProtocolError, match="frames"):
        decode(frames, limits=FrameLimits(max_frames=3))
    with pytest.raises(ProtocolError, match="header"):
        decode(frames, limits=FrameLimits(max_header_bytes=PREFIX.size + 4))


def field_with(name: str, **changes) -> list[bytes]:
    """The valid message with the header record of field `name` rewritten (its frame unchanged)."""
    frames = valid_frames()
    head = bytearray(frames[0])
    pos = PREFIX.size + len(b"masked_input")
    while True:
        values = list(FIELD.unpack_from(head, pos))
        if head[pos + FIELD.size : pos + FIELD.size + values[0]] == name.encode():
            break
        pos += FIELD.size + values[0]
    keys = ["name_len", "tag", "code", "value"]
    for k, v in changes.items():
        values[keys.index(k)] = v
    FIELD.pack_into(head, pos, *values)
    return [bytes(head), *frames[1:]]


def peak_allocated(fn: Callable[[], object]) -> int:
    """Peak bytes allocated (Python objects and numpy buffers) while `fn` runs."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        fn()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


HUGE_COUNTS = {
    "array of 2^62 elements": field_with("vector", value=2**62),
    "tuple of 2^40 ints": field_with("ids", value=2**40),
    "map of 2^40 items": field_with("shares", value=2**40),
    "map of 2^60 items": field_with("shares", value=2**60),
    "bytes of 2^40": field_with("key", value=2**40),
}


@pytest.mark.parametrize("name", sorted(HUGE_COUNTS))
def test_declared_huge_counts_are_refused_before_allocating(name: str) -> None:
    def refused() -> None:
        with pytest.raises(ProtocolError, match="declares"):
            decode(HUGE_COUNTS[name])
    assert peak_allocated(refused) < 64 << 10


def test_the_allocation_probe_sees_what_decode_allocates() -> None:
    """Control for the test above: the probe measures decoding, so a small peak there means something."""
    n = 50_000
    frames = raw_frames(Message(kind="k", round=0, sender=1, receiver=0,
                                fields={"t": tuple(range(2**40, 2**40 + n))}))
    assert peak_allocated(lambda: decode(frames)) > 32 * n  # n Python ints of 32 bytes, at least


def raw_frames(msg: Message) -> list[bytes]:
    return [bytes(memoryview(f).cast("B")) for f in encode(msg)]


@pytest.mark.parametrize("items", [1, 90, 1000, 2900, 45_000])
@pytest.mark.parametrize("value", [b"", b"a", b"ab"])
def test_decoding_a_map_costs_at_most_13_times_its_wire_size(items: int, value: bytes) -> None:
    frames = raw_frames(Message(kind="k", round=0, sender=1, receiver=0,
                                fields={"m": {2**40 + i: value for i in range(items)}}))
    limits = FrameLimits(max_message_bytes=1 << 30)
    assert peak_allocated(lambda: decode(frames, limits=limits)) <= 13 * wire_size(frames) + (128 << 10)


@pytest.mark.parametrize("items", [1, 50, 10_000, 100_000])
def test_decoding_a_tuple_costs_at_most_8_times_its_wire_size(items: int) -> None:
    frames = raw_frames(Message(kind="k", round=0, sender=1, receiver=0,
                                fields={"t": tuple(range(2**40, 2**40 + items))}))
    limits = FrameLimits(max_message_bytes=1 << 30)
    assert peak_allocated(lambda: decode(frames, limits=limits)) <= 8 * wire_size(frames) + (64 << 10)


def test_decoded_arrays_and_bytes_cost_no_more_than_their_frames() -> None:
    frames = raw_frames(Message(kind="k", round=0, sender=1, receiver=0,
                                fields={"a": np.zeros(1 << 20, np.uint32), "b": b"x" * (1 << 20)}))
    assert peak_allocated(lambda: decode(frames)) <= (1 << 20) + (64 << 10)  # the array is a view


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_random_corruption_yields_a_message_or_protocol_error(data) -> None:
    frames = valid_frames()
    i = data.draw(st.integers(0, len(frames) - 1))
    raw = bytearray(frames[i])
    for _ in range(data.draw(st.integers(1, 4))):
        if raw:
            raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    frames[i] = bytes(raw[:cut]) if data.draw(st.booleans()) else bytes(raw)
    try:
        msg = decode(frames)
    except ProtocolError:
        return
    for v in msg.fields.values():  # anything accepted is a well-formed wire value
        assert isinstance(v, (int, bytes, tuple, dict, np.ndarray))
        if isinstance(v, np.ndarray):
            assert v.ndim == 1 and v.dtype in DTYPES.values()
    assert_same(msg, decode(raw_frames(msg)))  # and encodes back to the same message
