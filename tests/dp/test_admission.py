"""The server's side of a client's own DP release: a claim is checked against the declared
mechanism before anything is charged or used, and the charge is the server's own derivation."""
from dataclasses import replace

import numpy as np
import pytest

from dp.admission import ReleaseRejected, admit
from dp.ledger import Budget, Ledger, LedgerConfig
from dp.released import Released, ReleaseRecord
from dp.sketches import DPSketcher, SketchConfig

DIM = 32


def sketcher(**kw) -> DPSketcher:
    return DPSketcher(SketchConfig(**{"epsilon": 4.0, "unit": "example", "sketch_dim": 16, **kw}), dim=DIM)


def client_release(spec: DPSketcher, *, client_id: int = 3, round_id: int = 2, n: int = 500, name: str = "sketch"):
    docs = np.random.default_rng(client_id).normal(size=(n, DIM))
    own = Ledger()
    rel = spec.release(client_id=client_id, ledger=own, documents=docs, round_id=round_id, summary_key=name)
    return rel, own


def forged(record: ReleaseRecord, **mechanism) -> ReleaseRecord:
    return replace(record, mechanism={**record.mechanism, **mechanism})


def test_an_honest_release_is_admitted_with_the_clients_payload_and_the_same_charges():
    spec = sketcher()
    rel, own = client_release(spec)
    server = Ledger()
    out = admit({"sketch": rel.record()}, specs={"sketch": spec}, client_id=3, round_id=2, ledger=server)
    got = out["sketch"]
    assert isinstance(got, Released) and got.contributors == {3} and got.round_id == 2
    np.testing.assert_array_equal(got.payload, rel.payload)
    assert server.entries(3) == own.entries(3)
    assert {c.observer.value for c in got.charges} == {"server", "outsider"} and all(server.holds(c) for c in got.charges)


@pytest.mark.parametrize("attack, match", [
    (dict(sigma=1e-6), "claimed sigma"),                       # claims the configured noise, added less
    (dict(sensitivity=1e-9), "claimed sensitivity"),
    (dict(epsilon=100.0), "this run declares"),                # another privacy level than declared
    (dict(sketch_dim=8), "this run declares"),
    (dict(name="laplace"), "expected a jl_sketch_gaussian"),
    (dict(n_documents=None), "needs its document count"),
    (dict(n_documents=True), "needs its document count"),
    (dict(n_documents=0), "needs its document count"),
    (dict(n_documents=5000), "claimed sigma"),                 # more documents than the noise was drawn for
])
def test_a_forged_mechanism_is_refused_and_nothing_is_charged(attack, match):
    spec = sketcher()
    rel, _ = client_release(spec)
    server = Ledger()
    with pytest.raises(ReleaseRejected, match=match):
        admit({"sketch": forged(rel.record(), **attack)}, specs={"sketch": spec}, client_id=3, round_id=2,
              ledger=server)
    assert server.clients() == []


def test_another_shape_unit_round_or_name_is_refused():
    spec = sketcher()
    rel, _ = client_release(spec)
    record = rel.record()
    cases = [
        ({"sketch": replace(record, payload=np.zeros(15))}, 2, "a sketch has 16 values"),
        ({"sketch": replace(record, unit="client")}, 2, "client-level"),
        ({"sketch": record}, 3, "expected 'sketch' for round 3"),
        ({"other": record}, 2, r"releases \['other'\]; the run declares \['sketch'\]"),
        ({"sketch": replace(record, summary_key="stolen")}, 2, "release of 'stolen'"),
    ]
    for records, round_id, match in cases:
        with pytest.raises(ReleaseRejected, match=match):
            admit(records, specs={"sketch": spec}, client_id=3, round_id=round_id, ledger=Ledger())


def test_one_bad_release_among_two_charges_neither():
    spec = sketcher()
    good, _ = client_release(spec, name="a")
    bad, _ = client_release(spec, name="b")
    server = Ledger()
    with pytest.raises(ReleaseRejected, match="client 3's release 'b': claimed sigma 1e-06"):
        admit({"a": good.record(), "b": forged(bad.record(), sigma=1e-6)}, specs={"a": spec, "b": spec},
              client_id=3, round_id=2, ledger=server)
    assert server.clients() == []


def test_a_received_release_is_charged_past_the_servers_budget():
    """The value has reached the server: the ledger must show it even if it overruns a budget."""
    spec = sketcher()
    rel, _ = client_release(spec)
    server = Ledger(LedgerConfig(budgets=(Budget(unit="example", observer="server", epsilon=1.0),)))
    admit({"sketch": rel.record()}, specs={"sketch": spec}, client_id=3, round_id=2, ledger=server)
    assert server.epsilon(3, unit="example", observer="server") > 1.0


def test_a_records_own_checks_bound_what_it_may_hold():
    base = dict(unit="client", summary_key="s", mechanism={"name": "x"}, round_id=1)
    for payload in (np.array([np.nan]), np.zeros(3, np.float32), np.zeros((2, 2)), np.zeros(0), [0.0]):
        with pytest.raises(ValueError, match="finite 1-D float64"):
            ReleaseRecord(payload=payload, **base)
    for mechanism in ({"nested": {"a": 1}}, {f"k{i}": 1 for i in range(33)}, {"s": "x" * 257}, {1: 2}):
        with pytest.raises(ValueError, match="flat mapping"):
            ReleaseRecord(payload=np.zeros(2), **{**base, "mechanism": mechanism})
    with pytest.raises(ValueError, match="'household' is not a valid PrivacyUnit"):
        ReleaseRecord(payload=np.zeros(2), **{**base, "unit": "household"})
    with pytest.raises(ValueError, match="summary key"):
        ReleaseRecord(payload=np.zeros(2), **{**base, "summary_key": ""})
    with pytest.raises(ValueError, match="round"):
        ReleaseRecord(payload=np.zeros(2), **{**base, "round_id": -1})
    record = ReleaseRecord(payload=np.arange(3.0), **base)
    with pytest.raises(ValueError, match="read-only"):
        record.payload[0] = 7.0  # read-only copy
