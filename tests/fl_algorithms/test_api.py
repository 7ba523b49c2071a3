import pickle

import numpy as np
import pytest

from fl_algorithms.api import AggregateView, Masked, PrivacyBoundaryError, Upload
from fl_algorithms.algorithms.fedavg import FedAvg
from fl_algorithms.engine.sim import RunConfig, SimulationRunner
from fl_algorithms.engine.secure_sum import SecureAggregationConfig


def test_masked_payload_is_unreadable_outside_the_secure_layer():
    m = Masked(np.arange(5.0), weight=2.0)
    summed = "a Masked vector can only be summed by secure aggregation"
    for attempt, message in ((lambda: np.asarray(m), summed), (lambda: m[0], summed),
                             (lambda: pickle.dumps(m), "cannot be serialised in the clear"),
                             (lambda: m.unwrap(object()), "only the secure-aggregation layer may unwrap")):
        with pytest.raises(PrivacyBoundaryError, match=message):
            attempt()
    with pytest.raises(AttributeError, match="Masked is immutable"):
        m.weight = 3.0
    assert "hidden" in repr(m) and "0.0" not in repr(m)


def test_aggregate_view_cannot_be_forged():
    with pytest.raises(PrivacyBoundaryError, match="an AggregateView is built only by the secure-aggregation layer"):
        AggregateView(round=1, groups={}, released={}, contributors=frozenset(), capability=object())


def test_upload_rejects_raw_arrays_as_parts():
    with pytest.raises(TypeError, match="masked part 'w' must be a Masked, got ndarray"):
        Upload(masked={"w": np.zeros(3)})
    with pytest.raises(TypeError, match="released part 's' must be built by a dp mechanism"):
        Upload(released={"s": np.zeros(3)})


class SpyFedAvg(FedAvg):
    """A curious server: records every object its server_update can reach."""

    def __init__(self):
        super().__init__()
        self.seen = []
        self.client_deltas = []

    def client_update(self, *, broadcast, client):
        up, st = super().client_update(broadcast=broadcast, client=client)
        # test-only: remember the true per-client updates to compare with what the server sees
        self.client_deltas.append({k: m.unwrap(__import__("fl_algorithms.api", fromlist=["_SECURE_LAYER"])._SECURE_LAYER)
                                   for k, m in up.masked.items()})
        return up, st

    def server_update(self, *, state, view):
        def walk(obj, depth=0):
            if depth > 4:
                return
            self.seen.append(obj)
            if isinstance(obj, AggregateView):
                for name in obj.__slots__:
                    walk(getattr(obj, name), depth + 1)
            elif isinstance(obj, dict) or hasattr(obj, "items"):
                for v in obj.values():
                    walk(v, depth + 1)
            elif hasattr(obj, "__dataclass_fields__"):
                for f in obj.__dataclass_fields__:
                    walk(getattr(obj, f), depth + 1)
        walk(view)
        return super().server_update(state=state, view=view)


def test_server_update_never_reaches_a_per_client_vector(toy_trainers):
    cfg = RunConfig(rounds=2, secure=SecureAggregationConfig(protocol="secagg+", clip=4.0, max_weight=100, max_clients=8, min_release_group=2))
    runner = SimulationRunner(algorithm=SpyFedAvg(), trainers=toy_trainers(4), config=cfg)
    runner.run(progress=False)
    server = runner.server.algorithm
    # The engine runs the two sides on separate copies: what a client stashes on `self` stays there.
    assert server.client_deltas == [] and server is not runner.algorithm
    client_deltas = [d for e in runner.clients.values() for d in e.role.algorithm.client_deltas]
    assert len(client_deltas) == 2 * 4 and all(e.role.algorithm.seen == [] for e in runner.clients.values())
    arrays = [o for o in server.seen if isinstance(o, np.ndarray)]
    assert arrays, "the spy saw the aggregate means"
    assert not any(isinstance(o, (Upload, Masked)) for o in server.seen)
    for delta in client_deltas:
        for v in delta.values():
            for a in arrays:
                if a.shape == v.shape:
                    assert not np.allclose(a, v, atol=1e-6), "server saw an individual client's update"
