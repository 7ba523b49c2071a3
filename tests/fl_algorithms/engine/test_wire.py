"""The engine's deployment messages: a client's answer survives the wire exactly, and anything
malformed is a ProtocolError before the engine uses it."""
import json
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp.released import ReleaseRecord
from fl_algorithms.api import ClientBroadcast, Relayed, Sealed
from fl_algorithms.engine.round import MAX_RELAY_QUEUE, MAX_RELEASES_PER_CLIENT, MAX_SEALED_PER_CLIENT, ClientReady
from fl_algorithms.engine.secure_sum import Layout
from fl_algorithms.engine.wire import broadcast_fields, max_ready_bytes, parse_broadcast, parse_ready, ready_fields
from secagg.messages import ProtocolError
from transport.framing import DEFAULT_LIMITS, decode, encode, wire_size
from secagg.messages import Message

finite = st.floats(allow_nan=False, allow_infinity=False, width=64)


def record(payload, *, key="sketch", round_id=3, **mechanism) -> ReleaseRecord:
    return ReleaseRecord(payload=np.asarray(payload, dtype=np.float64), unit="example", summary_key=key,
                         mechanism={"name": "jl_sketch_gaussian", "sigma": 0.25, "n_documents": 40, **mechanism},
                         round_id=round_id)


def over_the_wire(fields):
    msg = Message(kind="fl_ready", round=192, sender=1, receiver=0, fields=fields)
    return decode(encode(msg)).fields


@settings(max_examples=40, deadline=None)
@given(payloads=st.lists(st.lists(finite, min_size=1, max_size=20), max_size=4))
def test_releases_cross_the_wire_bit_for_bit(payloads):
    ready = ClientReady(layouts={"all": Layout((("w", 0, 3),))}, sealed=(Sealed(receiver=2, ciphertext=b"x"),),
                        released={f"r{k}": record(p, key=f"r{k}") for k, p in enumerate(payloads)})
    got = parse_ready(over_the_wire(ready_fields(ready)))
    assert sorted(got.released) == sorted(ready.released)
    for name, want in ready.released.items():
        have = got.released[name]
        assert have.payload.tobytes() == want.payload.tobytes()
        assert (have.unit, have.summary_key, dict(have.mechanism), have.round_id) == \
            (want.unit, want.summary_key, dict(want.mechanism), want.round_id)


def good_fields():
    ready = ClientReady(layouts={"all": Layout((("w", 0, 3),))}, released={"sketch": record([1.0, 2.0])})
    return over_the_wire(ready_fields(ready))


def changed(before, after) -> bool:
    """Whether a tampering did anything (a key added or removed, a value replaced by a different one)."""
    if before.keys() != after.keys():
        return True
    return any(after[k] is not v and not (type(v) is bytes and type(after[k]) is bytes and after[k] == v)
               for k, v in before.items())


def test_good_fields_parse():  # the baseline the tampering cases below start from
    assert parse_ready(dict(good_fields())).released["sketch"].payload.tolist() == [1.0, 2.0]


@pytest.mark.parametrize("tamper", [
    lambda f: f.pop("r"),                                                          # payloads missing
    lambda f: f.__setitem__("r", np.zeros(3)),                                     # more values than declared
    lambda f: f.__setitem__("r", np.zeros(1)),                                     # fewer
    lambda f: f.__setitem__("r/0", np.zeros(2)),                                   # a field of another layout
    lambda f: f.__setitem__("r", np.zeros(2, np.float32)),                         # not float64
    lambda f: f.__setitem__("r", np.zeros((1, 2))),                                # not 1-D
    lambda f: f.__setitem__("r", np.array([np.inf, 0.0])),                         # not finite
    lambda f: f.__setitem__("r", b"bytes"),
    lambda f: f.__setitem__("meta", f["meta"].replace(b", 3, 2]]", b", 3, 2.0]]")),    # size not an int
    lambda f: f.__setitem__("meta", f["meta"].replace(b", 3, 2]]", b", 3]]")),         # size missing
    lambda f: f.__setitem__("meta", f["meta"].replace(b'"n_documents": 40', b'"n_documents": {"a": 1}')),
    lambda f: f.__setitem__("meta", f["meta"].replace(b'"example"', b'"household"')),
    lambda f: f.__setitem__("meta", f["meta"].replace(b'"released": [["sketch"', b'"released": [[7')),
])
def test_a_malformed_release_is_a_protocol_error(tamper):
    fields = dict(good_fields())
    before = dict(fields)
    tamper(fields)
    assert changed(before, fields), "the tampering changed nothing"
    with pytest.raises(ProtocolError, match="malformed ready message|unexpected field 'r/0'"):
        parse_ready(fields)


def sealed_fields():
    ready = ClientReady(layouts={}, sealed=(Sealed(receiver=2, ciphertext=b"abc"), Sealed(receiver=3, ciphertext=b"de")))
    return over_the_wire(ready_fields(ready))


def test_sealed_messages_cross_the_wire_packed_in_one_frame():
    fields = sealed_fields()
    assert fields["s"] == b"abcde"
    got = parse_ready(dict(fields))
    assert [(s.receiver, s.ciphertext) for s in got.sealed] == [(2, b"abc"), (3, b"de")]


@pytest.mark.parametrize("tamper", [
    lambda f: f.pop("s"),                                                          # ciphertexts missing
    lambda f: f.__setitem__("s", b"abcdef"),                                       # more bytes than declared
    lambda f: f.__setitem__("s", b"abcd"),                                         # fewer
    lambda f: f.__setitem__("s", np.frombuffer(b"abcde", np.uint8)),               # not bytes
    lambda f: f.__setitem__("s/0", b"x"),                                          # a field of another layout
    lambda f: f.__setitem__("meta", f["meta"].replace(b"[[2, 3], [3, 2]]", b"[[2, 5], [3, 0]]")),  # an empty one
    lambda f: f.__setitem__("meta", f["meta"].replace(b"[[2, 3], [3, 2]]", b"[[2, 3], [3, -2], [4, 4]]")),
    lambda f: f.__setitem__("meta", f["meta"].replace(b"[[2, 3], [3, 2]]", b"[[2, 3], [3, true]]")),
    lambda f: f.__setitem__("meta", f["meta"].replace(b"[[2, 3], [3, 2]]", b"[[2, 3], [3]]")),
])
def test_malformed_sealed_messages_are_a_protocol_error(tamper):
    fields = dict(sealed_fields())
    before = dict(fields)
    tamper(fields)
    assert changed(before, fields), "the tampering changed nothing"
    with pytest.raises(ProtocolError, match="malformed ready message|unexpected field 's/0'"):
        parse_ready(fields)


def test_the_largest_ready_message_fits_in_four_frames():
    """64 sealed messages and 16 releases: one frame each would be 82 frames, over the transport's
    default of 64; packed, a ready message is header, meta and two payload frames."""
    sealed = tuple(Sealed(receiver=2 + k, ciphertext=bytes([k]) * (k + 1)) for k in range(MAX_SEALED_PER_CLIENT))
    released = {f"r{k}": record(np.arange(k + 1.0), key=f"r{k}") for k in range(MAX_RELEASES_PER_CLIENT)}
    ready = ClientReady(layouts={"all": Layout((("w", 0, 3),))}, sealed=sealed, released=released)
    frames = encode(Message(kind="fl_ready", round=192, sender=1, receiver=0, fields=ready_fields(ready)))
    assert 1 + MAX_SEALED_PER_CLIENT + MAX_RELEASES_PER_CLIENT + 1 > DEFAULT_LIMITS.max_frames
    assert len(frames) == 4
    got = parse_ready(decode(frames).fields)
    assert [(s.receiver, s.ciphertext) for s in got.sealed] == [(s.receiver, s.ciphertext) for s in sealed]
    assert {n: r.payload.tolist() for n, r in got.released.items()} == {n: r.payload.tolist() for n, r in released.items()}
    assert wire_size(frames) <= max_ready_bytes(releases=MAX_RELEASES_PER_CLIENT, sealed_bytes=sum(len(s.ciphertext) for s in sealed))


def test_too_many_sealed_messages_are_refused():
    sealed = tuple(Sealed(receiver=2, ciphertext=b"x") for _ in range(MAX_SEALED_PER_CLIENT + 1))
    with pytest.raises(ProtocolError, match="malformed ready message"):
        parse_ready(over_the_wire(ready_fields(ClientReady(layouts={}, sealed=sealed))))


def broadcast_with(inbox):
    b = ClientBroadcast(round=3, common={"w": np.ones(3, np.float32)}, inbox=tuple(inbox), sums={"all": None})
    return broadcast_fields(b, round_ids={"all": 193}, config={"protocol": "secagg+"})


def test_a_full_relay_inbox_crosses_the_wire_in_one_frame():
    inbox = [Relayed(sender=1 + k % 7, round=2, ciphertext=bytes([k % 256]) * (1 + k % 5)) for k in range(MAX_RELAY_QUEUE)]
    frames = encode(Message(kind="fl_train", round=192, sender=0, receiver=9, fields=broadcast_with(inbox)))
    assert len(frames) == 4  # header, 'c/w', 'i', 'meta': was one frame per relay (over 255 fields: unencodable)
    got, round_ids, config = parse_broadcast(decode(frames).fields)
    assert got.inbox == tuple(inbox) and round_ids == {"all": 193} and config == {"protocol": "secagg+"}


@pytest.mark.parametrize("tamper", [
    lambda f: f.pop("i"),
    lambda f: f.__setitem__("i", f["i"] + b"!"),
    lambda f: f.__setitem__("i/0", b"x"),
    lambda f: f.__setitem__("meta", f["meta"].replace(b'"inbox": [[1, 2, 2]]', b'"inbox": [[1, 2, 2], [1, 2, 0]]')),
    lambda f: f.__setitem__("meta", f["meta"].replace(b'"inbox": [[1, 2, 2]]', b'"inbox": [[1, 2]]')),
])
def test_a_malformed_relay_inbox_is_a_protocol_error(tamper):
    fields = dict(over_the_wire(broadcast_with([Relayed(sender=1, round=2, ciphertext=b"hi")])))
    assert parse_broadcast(dict(fields))[0].inbox[0].ciphertext == b"hi"
    before = dict(fields)
    tamper(fields)
    assert changed(before, fields), "the tampering changed nothing"
    with pytest.raises(ProtocolError, match="malformed broadcast metadata|unexpected field 'i/0'"):
        parse_broadcast(fields)


def test_an_inbox_over_the_relay_queue_is_refused():
    inbox = [Relayed(sender=1, round=2, ciphertext=b"x")] * (MAX_RELAY_QUEUE + 1)
    with pytest.raises(ProtocolError, match="malformed broadcast metadata"):
        parse_broadcast(over_the_wire(broadcast_with(inbox)))


def test_too_many_releases_are_refused_before_they_are_built():
    released = {f"r{k}": record([1.0], key=f"r{k}") for k in range(MAX_RELEASES_PER_CLIENT + 1)}
    fields = over_the_wire(ready_fields(ClientReady(layouts={}, released=released)))
    with pytest.raises(ProtocolError, match="malformed ready message"):
        parse_ready(fields)


def test_the_end_of_a_run_crosses_the_wire_and_a_malformed_one_is_refused():
    import json

    from fl_algorithms.engine.wire import MAX_END_DETAIL, RunEnd, end_fields, parse_end

    end = RunEnd(reason="stopped", round=4, detail="only 2 clients are still connected")
    assert parse_end(over_the_wire(end_fields(end))) == end
    long = parse_end(over_the_wire(end_fields(RunEnd(reason="failed", round=0, detail="x" * 5000))))
    assert long.detail == "x" * MAX_END_DETAIL  # cut to size by the sender
    for meta in ({"reason": "bored", "round": 1}, {"reason": "finished", "round": -1}, {"reason": "finished"},
                 {"reason": "finished", "round": 1.5}, {"reason": "finished", "round": 1, "detail": 7},
                 {"reason": "finished", "round": 1, "detail": "x" * (MAX_END_DETAIL + 1)}):
        with pytest.raises(ProtocolError, match="end-of-run"):
            parse_end({"meta": json.dumps(meta).encode()})
    with pytest.raises(ProtocolError, match="unexpected field"):
        parse_end({**end_fields(end), "p/w": np.zeros(1, dtype=np.float32)})
    with pytest.raises(ValueError, match="end reason"):
        RunEnd(reason="bored", round=1)


@pytest.mark.parametrize("size", [0, -3, True, 1.5, "4", 1 << 21])
def test_a_sums_size_crosses_the_wire_and_a_malformed_one_is_refused(size):
    """`sum_sizes` sizes the client's exact-noise layers: it arrives as sent, and anything but a whole count in
    1 .. MAX_SUM_SIZE is malformed (an absent size leaves the ring's default)."""
    b = ClientBroadcast(round=3, common={"w": np.ones(3, np.float32)}, sums={"all": None, "g": ("w",)},
                        sum_sizes={"all": 17})
    got = parse_broadcast(over_the_wire(broadcast_fields(b, round_ids={"all": 193, "g": 194}, config={})))[0]
    assert got.sum_sizes == {"all": 17} and got.sums == {"all": None, "g": ("w",)}
    fields = dict(over_the_wire(broadcast_fields(b, round_ids={"all": 193, "g": 194}, config={})))
    meta = json.loads(fields["meta"])
    meta["sums"]["all"][2] = size
    fields["meta"] = json.dumps(meta).encode()
    with pytest.raises(ProtocolError, match="malformed broadcast metadata"):
        parse_broadcast(fields)
