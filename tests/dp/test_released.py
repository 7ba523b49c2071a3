"""Released values can be made only by the DP mechanisms in dp/, and are immutable."""
import copy
import dataclasses
import pickle

import numpy as np
import pytest

from dp.ledger import GaussianMechanism, Ledger
from dp.released import Released, ReleaseForbidden
from dp.sketches import DPSketcher, SketchConfig


def _charge():
    return Ledger().debit(1, GaussianMechanism(noise_multiplier=1.0), unit="client", observer="server")


def _a_release() -> Released:
    sketcher = DPSketcher(SketchConfig(epsilon=4.0, unit="example", sketch_dim=8), dim=16)
    docs = np.random.default_rng(0).normal(size=(500, 16))
    return sketcher.release(client_id=1, ledger=Ledger(), documents=docs)


@pytest.mark.parametrize("token", [None, object(), "MINT"])
def test_direct_construction_is_forbidden(token):
    kwargs = dict(payload=np.zeros(3), unit="client", contributors=frozenset({1}), summary_key="k",
                  mechanism={"name": "fake"}, charges=(_charge(),))
    with pytest.raises(ReleaseForbidden, match="constructed only by the DP mechanisms"):
        Released(**kwargs) if token is None else Released(**kwargs, _capability=token)


def test_replace_and_pickle_cannot_forge_or_leak():
    r = _a_release()
    with pytest.raises(ReleaseForbidden, match="constructed only by the DP mechanisms"):
        dataclasses.replace(r, payload=np.ones(8))  # the capability is an InitVar: replace cannot pass it on
    with pytest.raises(TypeError, match="not picklable"):
        pickle.dumps(r)
    assert copy.deepcopy(r) is r


def test_released_is_frozen_and_read_only():
    r = _a_release()
    assert isinstance(r, Released) and r.unit.value == "example" and r.contributors == frozenset({1})
    with pytest.raises(ValueError, match="read-only"):
        r.payload[0] = 1.0
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'payload'"):
        r.payload = np.zeros(8)
    with pytest.raises(TypeError, match="does not support item assignment"):
        r.mechanism["epsilon"] = 100.0
    assert r.describe()["mechanism"]["epsilon"] == 4.0
    assert {c.observer.value for c in r.charges} == {"server", "outsider"}
