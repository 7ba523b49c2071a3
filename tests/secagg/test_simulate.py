"""The in-memory driver: scripted dropouts, stage timing, byte accounting, error propagation."""
from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from secagg.messages import AbortError, ProtocolError
from secagg.prg import random_vector
from secagg.protocols import registry
from secagg.ring import RING_2_32
from secagg.simulate import run_round

SECURE_STAGES = ["advertise", "share", "check", "masked", "consistency", "unmask"]


class Spy:
    """Wraps a client, recording the kind of every request it was asked to handle."""

    def __init__(self, inner):
        self.inner = inner
        self.seen: list[str] = []

    def handle(self, msg):
        self.seen.append(msg.kind)
        return self.inner.handle(msg)


def make(name, n, d, **server_kwargs):
    ids = list(range(1, n + 1))
    inputs = {c: random_vector(RING_2_32, d) for c in ids}
    server = registry.server_class(name)(round_id=1, clients=ids, length=d, **server_kwargs)
    clients = {c: Spy(registry.client_class(name)(client_id=c, round_id=1, input_fn=lambda c=c: inputs[c])) for c in ids}
    return server, clients, inputs


def expected(inputs, ids):
    acc = np.zeros(next(iter(inputs.values())).shape[0], dtype=np.uint32)
    for c in ids:
        RING_2_32.add_(acc, inputs[c])
    return acc


@pytest.mark.parametrize("name", ["plain", "secagg", "secagg+"])
def test_no_dropouts_everyone_contributes(name):
    server, clients, inputs = make(name, 6, 33)
    res = run_round(server, clients)
    assert res.contributors == frozenset(inputs)
    assert np.array_equal(res.ring_sum, expected(inputs, inputs))
    assert res.dropped == {}
    assert server.finished


@pytest.mark.parametrize("stage_index", range(6))
def test_a_dropped_client_is_never_asked_anything_from_its_stage_on(stage_index):
    server, clients, inputs = make("secagg", 8, 16)
    stage = SECURE_STAGES[stage_index]
    res = run_round(server, clients, drop_at={stage: {3}})
    kinds = ["advertise_request", "share_request", "check_request", "masked_request", "consistency_request",
             "unmask_request"]
    assert clients[3].seen == kinds[:stage_index]
    assert clients[4].seen == kinds
    assert res.dropped == {stage: frozenset({3})}
    contributors = set(inputs) - ({3} if stage not in ("consistency", "unmask") else set())
    assert res.contributors == frozenset(contributors)
    assert np.array_equal(res.ring_sum, expected(inputs, contributors))


def test_drops_accumulate_across_stages():
    server, clients, inputs = make("secagg", 10, 8)
    res = run_round(server, clients, drop_at={"advertise": {1}, "masked": {2}, "unmask": {3}})
    assert res.dropped == {"advertise": frozenset({1}), "masked": frozenset({2}), "unmask": frozenset({3})}
    assert clients[1].seen == []
    assert res.contributors == frozenset(set(inputs) - {1, 2})


def test_stage_times_are_recorded_and_accumulated():
    server, clients, _ = make("secagg+", 5, 16)
    times = {"advertise": 10.0}
    run_round(server, clients, stage_times=times)
    assert set(times) == set(SECURE_STAGES)
    assert times["advertise"] > 10.0
    assert all(t >= 0 for t in times.values())
    server, clients, _ = make("plain", 3, 16)
    times = {}
    run_round(server, clients, stage_times=times)
    assert set(times) == {"collect"}


@pytest.mark.parametrize("name", ["plain", "secagg", "secagg+"])
def test_bytes_sent_match_the_replies_and_stay_near_4_bytes_per_parameter(name):
    d, n = 10_000, 8
    server, clients, _ = make(name, n, d)
    per_reply: dict[int, int] = defaultdict(int)
    real = server.accept

    def count(msg):
        per_reply[msg.sender] += msg.nbytes()
        real(msg)

    server.accept = count
    sent: dict[int, int] = {}
    run_round(server, clients, bytes_sent=sent, drop_at={"unmask": {2}} if name != "plain" else None)
    assert sent == dict(per_reply)
    for c, b in sent.items():
        assert b >= 4 * d
        # masked vector + keys + one ciphertext and two shares per neighbour
        assert b <= 4 * d + 64 + (n - 1) * (8 + 92 + 2 * (8 + 32))


def test_abort_propagates_from_the_protocol():
    server, clients, _ = make("secagg", 4, 8)
    with pytest.raises(AbortError, match="round aborted at stage 'share'") as e:
        run_round(server, clients, drop_at={"share": {1, 2}})
    assert e.value.stage == "share"


class Refusing(Spy):
    """A client that refuses one kind of request (as a client refuses an unsafe one)."""

    def __init__(self, inner, kind: str):
        super().__init__(inner)
        self.kind = kind

    def handle(self, msg):
        if msg.kind == self.kind:
            self.seen.append(msg.kind)
            raise ProtocolError(f"refusing {msg.kind}")
        return super().handle(msg)


def test_a_client_refusal_is_counted_and_the_round_goes_on_without_it():
    server, clients, inputs = make("secagg", 6, 8)
    clients[3] = Refusing(clients[3].inner, "share_request")
    rejected: dict[str, int] = {}
    res = run_round(server, clients, rejected=rejected)
    assert rejected == {"client": 1}
    assert clients[3].seen == ["advertise_request", "share_request"]
    assert res.contributors == frozenset(set(inputs) - {3})
    assert np.array_equal(res.ring_sum, expected(inputs, set(inputs) - {3}))


def test_when_every_client_refuses_the_round_aborts_naming_the_stage():
    server, clients, _ = make("secagg", 6, 8, threshold_fraction=0.2)  # every client finds t unsafe
    rejected: dict[str, int] = {}
    with pytest.raises(AbortError, match="round aborted at stage 'advertise': 0 clients left") as e:
        run_round(server, clients, rejected=rejected)
    assert e.value.stage == "advertise" and e.value.survivors == 0
    assert rejected == {"client": 6}
