import json
import math
import os
import pickle
import shutil

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from fl_algorithms.experiments import checkpoint
from fl_algorithms.experiments.checkpoint import CheckpointError, checkpoint_exists, load_state, save_state

NUMPY_DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64", "float16",
                "float32", "float64", "complex64", "complex128", ">i4", "<U3", "S2", "datetime64[ns]"]
TORCH_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128]

numpy_arrays = st.sampled_from(NUMPY_DTYPES).flatmap(
    lambda dt: hnp.arrays(np.dtype(dt), hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3)))
torch_tensors = st.tuples(st.sampled_from(TORCH_DTYPES), hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3),
                          st.integers(0, 2**16)).map(
    lambda a: (torch.randn(a[1], generator=torch.Generator().manual_seed(a[2])) * 50).to(a[0]))
leaves = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=-(2**200), max_value=2**200),
    st.floats(), st.text(max_size=20), st.binary(max_size=20), numpy_arrays, torch_tensors,
    st.builds(np.float32, st.floats(width=32)), st.builds(np.int64, st.integers(-2**63, 2**63 - 1)),
)
trees = st.recursive(leaves, lambda kids: st.one_of(
    st.lists(kids, max_size=4), st.lists(kids, max_size=3).map(tuple),
    st.dictionaries(st.one_of(st.text(max_size=8), st.integers()), kids, max_size=4)), max_leaves=25)


def _bytes(t):
    return t.detach().resolve_conj().contiguous().reshape(-1).view(torch.uint8)


def same(a, b):
    """Equal values AND equal types all the way down (nan equal to nan, int keys stay ints)."""
    if isinstance(a, torch.Tensor):
        return (type(b) is torch.Tensor and a.dtype == b.dtype and a.shape == b.shape and b.device.type == "cpu"
                and torch.equal(_bytes(a), _bytes(b)))
    if isinstance(a, np.ndarray):  # bytewise, so every nan payload and -0.0 is checked too
        return (type(b) is np.ndarray and a.dtype == b.dtype and a.shape == b.shape
                and np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes())
    if isinstance(a, np.generic):
        return type(b) is type(a) and a.dtype == b.dtype and a.tobytes() == b.tobytes()
    if isinstance(a, dict):
        return (type(b) is dict and list(a) == list(b) and all(type(k) is type(k2) for k, k2 in zip(a, b))
                and all(same(a[k], b[k]) for k in a))
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return type(b) is float and math.isnan(b)
    return type(a) is type(b) and a == b


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees)
def test_any_nested_state_round_trips_exactly(tmp_path_factory, tree):
    path = tmp_path_factory.mktemp("ck") / "latest"
    save_state(path, tree)
    assert same(load_state(path), tree)


def test_special_leaves_keep_their_types(tmp_path):
    base = torch.arange(12.0)
    state = {"nan": float("nan"), "inf": float("-inf"), "neg0": -0.0, "big": 2**127 + 3, "neg_big": -(2**1000) - 1,
             0: "int key", -7: {1: [2]}, "t": (1, [2.5, None], ()), "empty": ([], {}, (), b"", ""),
             "bf16": torch.tensor([1.5, -2.0, 3.25], dtype=torch.bfloat16), "bool": torch.tensor([True, False]),
             "i64": torch.tensor([2**62, -(2**62)]), "t0d": torch.tensor(3.5), "t_empty": torch.zeros(0, 5),
             "c128": torch.tensor([1 + 2j, -3.5j], dtype=torch.complex128),
             "strided": torch.arange(12.0).reshape(3, 4).t(), "shared": (base[:4], base[2:6], base),
             "param": torch.nn.Parameter(torch.ones(2)), "on_grad": torch.ones(2, requires_grad=True) * 2,
             "np_empty": np.zeros((0, 4), dtype=np.uint32), "np0d": np.array(7, dtype=np.int16),
             "np_scalar": np.float32(1.5), "np_f64": np.float64(2.5), "np_bool": np.bool_(True),
             "np_nan": np.array([np.nan, -np.inf]), "np_view": np.arange(10)[::3], "big_endian": np.arange(3, dtype=">f8"),
             "u32": np.arange(5, dtype=np.uint32), "text": np.array(["a", "bcd"]), "when": np.datetime64("2024-01-02"),
             "bytes": bytes(range(256)), "uni": "é\u2603\ud800"}
    back = load_state(save_state(tmp_path / "c", state))
    expected = {**state, "param": state["param"].detach(), "on_grad": state["on_grad"].detach()}
    assert same(back, expected)
    assert not back["param"].requires_grad and back["np_view"].flags.writeable and back["np_view"].flags.owndata


def test_huge_integers_past_the_decimal_conversion_limit_round_trip(tmp_path):
    state = {"huge": 7**20000, "neg": -(3**9000), "small": 10**4000}
    assert load_state(save_state(tmp_path / "c", state)) == state


def test_typed_numpy_arrays_are_typed_tensors_in_the_safetensors_file(tmp_path):
    from safetensors.torch import load_file

    state = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": torch.ones(2, dtype=torch.int64)}
    path = save_state(tmp_path / "c", state)
    stored = load_file(str(path / "tensors.safetensors"))
    assert {(t.dtype, tuple(t.shape)) for t in stored.values()} == {(torch.float32, (2, 3)), (torch.int64, (2,))}
    nodes = json.loads((path / "state.json").read_text())["state"]["d"]
    assert {"N": nodes[0][1]["N"], "dtype": "<f4", "shape": [2, 3], "scalar": False} == nodes[0][1]


def test_optimizer_state_round_trips_and_continues_identically(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.01)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(5, 4)).pow(2).sum().backward()
        opt.step()
    save_state(tmp_path / "c", {"model": model.state_dict(), "opt": opt.state_dict()})
    blob = load_state(tmp_path / "c")
    assert list(blob["opt"]["state"]) == [0, 1, 2, 3] and all(type(k) is int for k in blob["opt"]["state"])
    assert blob["opt"]["param_groups"][0]["params"] == [0, 1, 2, 3]
    assert same(blob["opt"], opt.state_dict())
    twin = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    twin.load_state_dict(blob["model"])
    twin_opt = torch.optim.AdamW(twin.parameters(), lr=0.5)
    twin_opt.load_state_dict(blob["opt"])
    x = torch.randn(5, 4)
    for _ in range(3):
        for m, o in ((model, opt), (twin, twin_opt)):
            o.zero_grad()
            m(x).pow(2).sum().backward()
            o.step()
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)


def test_numpy_generator_state_reproduces_the_same_draws(tmp_path):
    rng = np.random.default_rng(1)
    rng.random(5)
    state = rng.bit_generator.state
    assert state["state"]["state"] > 2**64  # a 128-bit int
    save_state(tmp_path / "c", {"rng": state})
    back = load_state(tmp_path / "c")["rng"]
    assert same(back, state)
    twin = np.random.default_rng()
    twin.bit_generator.state = back
    assert np.array_equal(rng.random(10), twin.random(10)) and rng.integers(0, 2**62) == twin.integers(0, 2**62)


class Thing:
    pass


@pytest.mark.parametrize("state, where", [
    ({"clients": {3: {"foo": Thing()}}}, r"state\['clients'\]\[3\]\['foo'\]: cannot checkpoint a .*Thing"),
    ({"a": [1, {1, 2}]}, r"state\['a'\]\[1\]: cannot checkpoint a builtins.set"),
    ({"a": (1, 2.5j)}, r"state\['a'\]\[1\]"),
    ({"k": {(1, 2): 3}}, r"state\['k'\]: dict keys must be str or int"),
    ({"k": {True: 3}}, r"state\['k'\]: dict keys must be str or int"),
    ({"o": np.array([1, "x"], dtype=object)}, r"state\['o'\]: numpy arrays of Python objects"),
    ({"r": np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8")])}, r"state\['r'\]: cannot checkpoint numpy dtype"),
    ({"s": torch.zeros(3).to_sparse()}, r"state\['s'\]: cannot checkpoint a torch.sparse_coo"),
    ({"m": torch.empty(2, device="meta")}, r"state\['m'\]"),
    ([bytearray(b"x")], r"state\[0\]: cannot checkpoint a builtins.bytearray"),
])
def test_unsupported_objects_are_refused_naming_where(tmp_path, state, where):
    with pytest.raises(TypeError, match=where):
        save_state(tmp_path / "c", state)
    assert not checkpoint_exists(tmp_path / "c") and list(tmp_path.iterdir()) == []


def test_cycles_and_absurd_nesting_are_type_errors(tmp_path):
    loop: list = [1]
    loop.append({"again": loop})
    with pytest.raises(TypeError, match=r"state\[1\]\['again'\]: the structure contains itself"):
        save_state(tmp_path / "c", loop)
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(TypeError, match="nested too deeply"):
        save_state(tmp_path / "c", deep)
    shared = [1, 2]
    assert load_state(save_state(tmp_path / "c", {"a": shared, "b": shared})) == {"a": [1, 2], "b": [1, 2]}


def _replace_node(path, old, new):
    text = (path / "state.json").read_text()
    assert old in text
    (path / "state.json").write_text(text.replace(old, new, 1))


DAMAGE = {
    "truncated_json": lambda p: (p / "state.json").write_text((p / "state.json").read_text()[:40]),
    "empty_json": lambda p: (p / "state.json").write_bytes(b""),
    "binary_json": lambda p: (p / "state.json").write_bytes(b"\x80\x04\x95\xff\xfe"),
    "json_list": lambda p: (p / "state.json").write_text("[1, 2]"),
    "other_format": lambda p: _replace_node(p, '"fedsecure-checkpoint"', '"something-else"'),
    "no_state_field": lambda p: (p / "state.json").write_text('{"format": "fedsecure-checkpoint", "version": 1}'),
    "future_version": lambda p: _replace_node(p, '"version": 1', '"version": 2'),
    "string_version": lambda p: _replace_node(p, '"version": 1', '"version": "1"'),
    "bool_version": lambda p: _replace_node(p, '"version": 1', '"version": true'),
    "unknown_node": lambda p: _replace_node(p, '{"i": "1"}', '{"pickle": "cos\\nsystem"}'),
    "two_tags": lambda p: _replace_node(p, '{"i": "1"}', '{"i": "1", "s": "x"}'),
    "extra_field": lambda p: _replace_node(p, '{"i": "1"}', '{"i": "1", "dtype": "<f4"}'),
    "int_not_string": lambda p: _replace_node(p, '{"i": "1"}', '{"i": 1.5}'),
    "bad_int": lambda p: _replace_node(p, '{"i": "1"}', '{"i": "one"}'),
    "huge_decimal": lambda p: _replace_node(p, '{"i": "1"}', '{"i": "' + "9" * 5000 + '"}'),
    "bad_float": lambda p: _replace_node(p, '{"f": "2.5"}', '{"f": "two"}'),
    "bad_bool": lambda p: _replace_node(p, '{"b": true}', '{"b": "yes"}'),
    "bad_bytes": lambda p: _replace_node(p, '{"y": "AAE="}', '{"y": "!!"}'),
    "bad_list": lambda p: _replace_node(p, '{"l": [{"n": null}]}', '{"l": {"x": [{"n": null}]}}'),
    "bad_pair": lambda p: _replace_node(p, '[{"s": "n"}, {"i": "1"}]', '[{"s": "n"}]'),
    "float_key": lambda p: _replace_node(p, '[{"s": "n"}, {"i": "1"}]', '[{"f": "1.0"}, {"i": "1"}]'),
    "dup_key": lambda p: _replace_node(p, '[{"s": "n"}, {"i": "1"}]', '[{"s": "w"}, {"i": "1"}]'),
    "missing_tensor_key": lambda p: _replace_node(p, '{"N": "t0"', '{"N": "t9"'),
    "object_dtype": lambda p: _replace_node(p, '"dtype": "<f8"', '"dtype": "O"'),
    "nonsense_dtype": lambda p: _replace_node(p, '"dtype": "<f8"', '"dtype": "float99"'),
    "wrong_shape": lambda p: _replace_node(p, '"shape": [3]', '"shape": [4]'),
    "negative_shape": lambda p: _replace_node(p, '"shape": [3]', '"shape": [-3]'),
    "scalar_with_shape": lambda p: _replace_node(p, '"scalar": false', '"scalar": true'),
    "raw_tensor_bad_dtype": lambda p: _replace_node(p, '"dtype": "complex128"', '"dtype": "load"'),
    "raw_tensor_quantized": lambda p: _replace_node(p, '"dtype": "complex128"', '"dtype": "qint8"'),
    "raw_tensor_short": lambda p: _replace_node(p, '"shape": [2]', '"shape": [5]'),
    "deep_json": lambda p: (p / "state.json").write_text(
        '{"format": "fedsecure-checkpoint", "version": 1, "state": ' + '{"l": [' * 3000 + "]}" * 3000 + "}"),
    "garbage_tensors": lambda p: (p / "tensors.safetensors").write_bytes(b"\x00" * 7),
    "truncated_tensors": lambda p: (p / "tensors.safetensors").write_bytes((p / "tensors.safetensors").read_bytes()[:-9]),
    "tensor_header_cut": lambda p: (p / "tensors.safetensors").write_bytes((p / "tensors.safetensors").read_bytes()[:30]),
    "pickle_as_tensors": lambda p: (p / "tensors.safetensors").write_bytes(pickle.dumps({"w": [1.0]})),
    "missing_tensors": lambda p: (p / "tensors.safetensors").unlink(),
    "missing_json": lambda p: (p / "state.json").unlink(),
    "no_directory": lambda p: shutil.rmtree(p),
}


# what each damage's CheckpointError names
_JSON, _NOT_OURS, _TENSORS = "state.json is not readable JSON", "is not a fedsecure-checkpoint document", \
    "tensors.safetensors is not a readable safetensors file"
_VERSION, _ABSENT, _UNKNOWN = r"format version .*, this code reads version 1", "no checkpoint at", "unknown node type"
REASON = {
    "truncated_json": _JSON, "empty_json": _JSON, "binary_json": _JSON, "deep_json": _JSON,
    "json_list": _NOT_OURS, "other_format": _NOT_OURS, "no_state_field": _NOT_OURS,
    "future_version": _VERSION, "string_version": _VERSION, "bool_version": _VERSION,
    "unknown_node": _UNKNOWN, "two_tags": _UNKNOWN, "extra_field": r"unexpected fields \['dtype'\]",
    "int_not_string": "holds a decimal or hex string", "bad_int": "bad integer", "huge_decimal": "bad integer",
    "bad_float": "bad float", "bad_bool": "holds a boolean", "bad_bytes": "bad base64", "bad_list": "holds a list",
    "bad_pair": r"not a \[key, value\] pair", "float_key": "is not a str or int", "dup_key": "appears twice",
    "missing_tensor_key": "tensor 't9' is missing", "object_dtype": "holds Python objects",
    "nonsense_dtype": "unknown numpy dtype", "wrong_shape": "do not hold a float64 array of shape",
    "negative_shape": "not a list of non-negative ints", "scalar_with_shape": "bad 'scalar' field",
    "raw_tensor_bad_dtype": "unknown torch dtype", "raw_tensor_quantized": "do not hold a torch.qint8 tensor",
    "raw_tensor_short": "do not hold a torch.complex128 tensor", "garbage_tensors": _TENSORS,
    "truncated_tensors": _TENSORS, "tensor_header_cut": _TENSORS, "pickle_as_tensors": _TENSORS,
    "missing_tensors": _ABSENT, "missing_json": _ABSENT, "no_directory": _ABSENT,
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_checkpoints_raise_checkpoint_error(tmp_path, damage):
    path = save_state(tmp_path / "c", {"n": 1, "w": np.ones(3), "f": 2.5, "b": True, "y": b"\x00\x01",
                                       "l": [None], "z": torch.zeros(2, dtype=torch.complex128)})
    DAMAGE[damage](path)
    with pytest.raises(CheckpointError, match=REASON[damage]):
        load_state(path)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.sampled_from(["state.json", "tensors.safetensors"]), cut=st.integers(0, 10**6),
       flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=4))
def test_random_corruption_loads_or_raises_checkpoint_error_never_anything_else(tmp_path_factory, which, cut, flips):
    path = save_state(tmp_path_factory.mktemp("ck") / "c",
                      {"w": torch.arange(4.0), "a": np.arange(3), 1: [2**70, "x", (None, 1.5)],
                       "c": torch.ones(1, dtype=torch.complex128)})
    data = bytearray((path / which).read_bytes())
    for pos, byte in flips:
        data[pos % len(data)] = byte
    (path / which).write_bytes(bytes(data[: cut % (len(data) + 1)]))
    try:
        load_state(path)
    except CheckpointError:
        pass


def test_a_crash_between_the_renames_leaves_the_old_checkpoint_loadable(tmp_path):
    path = save_state(tmp_path / "latest", {"round": 1})
    path.rename(tmp_path / ".latest.old")  # what a crash after the first rename leaves behind
    assert checkpoint_exists(path) and load_state(path) == {"round": 1}
    save_state(path, {"round": 2})
    assert load_state(path) == {"round": 2} and sorted(p.name for p in tmp_path.iterdir()) == ["latest"]


class Crash(BaseException):
    """Stands in for the process dying: nothing after it runs."""


@pytest.mark.parametrize("step", range(9))  # save_file, 3 fsyncs, replace, fsync, replace, fsync, rmtree
def test_a_crash_at_any_step_of_a_save_leaves_old_or_new_intact(tmp_path, monkeypatch, step):
    path = tmp_path / "latest"
    save_state(path, {"round": 1, "w": torch.ones(3)})
    calls = {"n": 0}

    def crashing(real):
        def wrapped(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == step + 1:
                raise Crash
            return real(*args, **kwargs)
        return wrapped

    for name in ("replace", "fsync"):
        monkeypatch.setattr(checkpoint.os, name, crashing(getattr(os, name)))
    monkeypatch.setattr(checkpoint.shutil, "rmtree", crashing(shutil.rmtree))
    monkeypatch.setattr(checkpoint, "save_file", crashing(checkpoint.save_file))
    try:
        save_state(path, {"round": 2, "w": torch.zeros(3)})
    except Crash:
        pass
    monkeypatch.undo()
    assert calls["n"] > step  # the crash did happen
    assert load_state(path)["round"] in (1, 2)
    save_state(path, {"round": 3})  # the next save recovers from whatever the crash left
    assert load_state(path) == {"round": 3} and sorted(p.name for p in tmp_path.iterdir()) == ["latest"]


def test_a_second_crash_after_a_crash_between_renames_keeps_the_old_copy(tmp_path, monkeypatch):
    path = save_state(tmp_path / "latest", {"round": 1})
    path.rename(tmp_path / ".latest.old")  # crash 1: only the .old copy is intact

    def crash(*args):
        raise Crash

    monkeypatch.setattr(checkpoint.os, "replace", crash)
    # no message: Crash is this test's own sentinel, raised without one
    with pytest.raises(Crash):
        save_state(path, {"round": 2})  # crash 2: before the new copy is renamed into place
    monkeypatch.undo()
    assert load_state(path) == {"round": 1}


def test_leftover_temporary_directories_are_cleaned_by_the_next_save(tmp_path):
    (tmp_path / ".latest.tmp-deadbeef").mkdir()
    (tmp_path / ".latest.tmp-deadbeef" / "state.json").write_text("{half")
    (tmp_path / "other").mkdir()
    save_state(tmp_path / "latest", [1])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "other"]


def test_a_folder_that_is_not_a_checkpoint_is_never_replaced(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a checkpoint"):
        save_state(tmp_path / "run", {"x": 1})
    (tmp_path / "file").write_text("mine")
    with pytest.raises(FileExistsError, match="exists and is not a checkpoint: refusing to replace it"):
        save_state(tmp_path / "file", {"x": 1})
    assert (tmp_path / "run" / "notes.txt").read_text() == "mine" and (tmp_path / "file").read_text() == "mine"
    (tmp_path / "empty").mkdir()
    assert load_state(save_state(tmp_path / "empty", {"x": 1})) == {"x": 1}
    with pytest.raises(CheckpointError, match="no checkpoint"):
        load_state(tmp_path / "run")


def test_loading_never_unpickles(tmp_path, monkeypatch):
    state = {"w": torch.ones(2), "a": np.arange(3), "c": torch.ones(2, dtype=torch.complex128), "s": np.float64(1)}
    path = save_state(tmp_path / "c", state)
    for f in path.iterdir():
        head = f.read_bytes()[:2]
        assert head[:1] != b"\x80" and head != b"PK", f"{f.name} looks like a pickle / torch.save archive"
    assert sorted(f.name for f in path.iterdir()) == ["state.json", "tensors.safetensors"]

    def boom(*a, **k):
        raise AssertionError("pickle used while loading a checkpoint")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, boom)
    monkeypatch.setattr(torch, "load", boom)
    monkeypatch.setattr(np, "load", boom)
    assert same(load_state(path), state)
