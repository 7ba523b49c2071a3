import math
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from fl_algorithms.experiments.checkpoint import CheckpointError, checkpoint_exists, load_state, save_state

leaves = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**130), max_value=2**130),
    st.floats(allow_nan=False), st.text(max_size=20), st.binary(max_size=20),
    st.builds(lambda xs: np.asarray(xs, dtype=np.float32), st.lists(st.floats(-1e6, 1e6, width=32), max_size=6)),
    st.builds(lambda xs: torch.tensor(xs, dtype=torch.int64), st.lists(st.integers(-2**40, 2**40), max_size=6)),
)
trees = st.recursive(leaves, lambda kids: st.one_of(
    st.lists(kids, max_size=4), st.tuples(kids, kids),
    st.dictionaries(st.one_of(st.text(max_size=8), st.integers(-5, 5)), kids, max_size=4)), max_leaves=20)


def same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=True)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(type(k) is type(k2) for k, k2 in zip(a, b)) \
            and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return type(a) is type(b) and a == b


@settings(max_examples=60, deadline=None)
@given(trees)
def test_any_nested_state_round_trips_exactly(tmp_path_factory, tree):
    path = tmp_path_factory.mktemp("ck") / "latest"
    save_state(path, {"x": tree})
    assert same(load_state(path), {"x": tree})


def test_special_leaves_keep_their_types(tmp_path):
    state = {"nan": float("nan"), "inf": float("-inf"), "big": 2**127 + 3, 0: "int key", "t": (1, [2.5, None]),
             "bf16": torch.ones(3, dtype=torch.bfloat16), "bool": torch.tensor([True, False]),
             "empty": np.zeros((0, 4), dtype=np.uint32), "scalar": np.float32(1.5), "zero_d": np.array(7, dtype=np.int16),
             "strided": torch.arange(12.0).reshape(3, 4).t(), "u32": np.arange(5, dtype=np.uint32)}
    assert same(load_state(save_state(tmp_path / "c", state)), state)


def test_optimizer_state_round_trips_and_continues_identically(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    save_state(tmp_path / "c", {"model": model.state_dict(), "opt": opt.state_dict()})
    blob = load_state(tmp_path / "c")
    twin = torch.nn.Linear(4, 2)
    twin.load_state_dict(blob["model"])
    twin_opt = torch.optim.AdamW(twin.parameters(), lr=0.1)
    twin_opt.load_state_dict(blob["opt"])
    x = torch.randn(3, 4)
    for m, o in ((model, opt), (twin, twin_opt)):
        o.zero_grad()
        m(x).sum().backward()
        o.step()
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)


def test_numpy_generator_state_reproduces_the_same_draws(tmp_path):
    rng = np.random.default_rng(1)
    rng.random(5)
    save_state(tmp_path / "c", {"rng": rng.bit_generator.state})
    twin = np.random.default_rng()
    twin.bit_generator.state = load_state(tmp_path / "c")["rng"]
    assert np.array_equal(rng.random(10), twin.random(10))


def test_unsupported_objects_are_refused_naming_where(tmp_path):
    with pytest.raises(TypeError, match=r"state\['a'\]\[1\]"):
        save_state(tmp_path / "c", {"a": [1, object()]})
    assert not checkpoint_exists(tmp_path / "c")


@pytest.mark.parametrize("damage", ["truncate_json", "bad_version", "bad_tensors", "unknown_node", "missing"])
def test_damaged_checkpoints_raise_checkpoint_error(tmp_path, damage):
    path = save_state(tmp_path / "c", {"w": np.ones(3), "n": 1})
    if damage == "truncate_json":
        (path / "state.json").write_text((path / "state.json").read_text()[:20])
    elif damage == "bad_version":
        (path / "state.json").write_text((path / "state.json").read_text().replace('"version": 1', '"version": 99'))
    elif damage == "bad_tensors":
        (path / "tensors.safetensors").write_bytes(b"\x00" * 7)
    elif damage == "unknown_node":
        (path / "state.json").write_text((path / "state.json").read_text().replace('{"i": "1"}', '{"pickle": "x"}'))
    else:
        (path / "tensors.safetensors").unlink()
    with pytest.raises(CheckpointError):
        load_state(path)


def test_a_crash_between_the_renames_leaves_the_old_checkpoint_loadable(tmp_path):
    path = save_state(tmp_path / "latest", {"round": 1})
    path.rename(tmp_path / ".latest.old")  # what a crash after the first rename leaves behind
    assert checkpoint_exists(path) and load_state(path) == {"round": 1}
    save_state(path, {"round": 2})
    assert load_state(path) == {"round": 2} and not (tmp_path / ".latest.old").exists()


def test_loading_never_unpickles(tmp_path, monkeypatch):
    path = save_state(tmp_path / "c", {"w": torch.ones(2), "a": np.arange(3)})
    monkeypatch.setattr(pickle, "loads", lambda *a, **k: pytest.fail("pickle used"))
    monkeypatch.setattr(pickle, "load", lambda *a, **k: pytest.fail("pickle used"))
    assert same(load_state(path), {"w": torch.ones(2), "a": np.arange(3)})
