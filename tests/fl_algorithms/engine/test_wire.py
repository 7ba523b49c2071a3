"""The engine's deployment messages: a client's answer survives the wire exactly, and anything
malformed is a ProtocolError before the engine uses it."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp.released import ReleaseRecord
from fl_algorithms.api import Sealed
from fl_algorithms.engine.round import MAX_RELEASES_PER_CLIENT, ClientReady
from fl_algorithms.engine.secure_sum import Layout
from fl_algorithms.engine.wire import parse_ready, ready_fields
from secagg.messages import ProtocolError
from transport.framing import decode, encode
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


@pytest.mark.parametrize("tamper", [
    lambda f: f.pop("r/0"),                                                        # payload missing
    lambda f: f.__setitem__("r/1", np.zeros(2)),                                   # payload without an entry
    lambda f: f.__setitem__("r/0", np.zeros(2, np.float32)),                       # not float64
    lambda f: f.__setitem__("r/0", np.array([np.inf, 0.0])),                       # not finite
    lambda f: f.__setitem__("r/0", b"bytes"),
    lambda f: f.__setitem__("meta", f["meta"].replace(b'"n_documents": 40', b'"n_documents": {"a": 1}')),
    lambda f: f.__setitem__("meta", f["meta"].replace(b'"example"', b'"household"')),
    lambda f: f.__setitem__("meta", f["meta"].replace(b'"released": [["sketch"', b'"released": [[7')),
])
def test_a_malformed_release_is_a_protocol_error(tamper):
    fields = dict(good_fields())
    tamper(fields)
    with pytest.raises(ProtocolError):
        parse_ready(fields)


def test_too_many_releases_are_refused_before_they_are_built():
    released = {f"r{k}": record([1.0], key=f"r{k}") for k in range(MAX_RELEASES_PER_CLIENT + 1)}
    fields = over_the_wire(ready_fields(ClientReady(layouts={}, released=released)))
    with pytest.raises(ProtocolError):
        parse_ready(fields)
