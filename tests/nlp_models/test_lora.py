"""LoRA through peft on a client's top layers (nlp_models.lora): FedMCP's FedLR baseline."""
import math

import numpy as np
import pytest
import torch
from torch import nn

from nlp_models.adapters import attach_adapters, set_parameters
from nlp_models.backbone import tiny_bert
from nlp_models.frozen_prefix import TopEncoder
from nlp_models.lora import (ADAPTER, LoraSettings, add_lora, flatten_lora, load_lora_, lora_layers, lora_parameters,
                             lora_size)

pytest.importorskip("peft")

HIDDEN = 32


@pytest.fixture(scope="module")
def backbone():
    return tiny_bert(layers=3, hidden=HIDDEN, heads=2).requires_grad_(False).eval()


def _client(backbone, *, seed=0, settings=LoraSettings()):
    return add_lora(TopEncoder(backbone, split=1), settings, seed=seed)


def _states(backbone, n=3, length=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, length, HIDDEN, generator=g)
    mask = torch.ones(n, length, dtype=torch.long)
    mask[0, 4:] = 0
    return hidden, mask


def test_injection_wraps_only_query_and_value_of_the_given_module(backbone):
    top = _client(backbone)
    names = [name for name, module in top.named_modules() if module in lora_layers(top)]
    assert names == [f"encoder.layer.{i}.attention.self.{target}" for i in (0, 1) for target in ("query", "value")]
    assert all(isinstance(top.encoder.layer[i].attention.self.key, nn.Linear) for i in (0, 1))
    assert lora_layers(backbone) == [] and lora_layers(TopEncoder(backbone, split=1)) == []  # nothing else touched
    for layer in backbone.encoder.layer:
        assert type(layer.attention.self.query) is nn.Linear and type(layer.attention.self.value) is nn.Linear
    trainable = {name for name, p in top.named_parameters() if p.requires_grad}
    assert trainable == {name for name, _ in top.named_parameters() if ".lora_A." in name or ".lora_B." in name}
    assert len(trainable) == 2 * 2 * 2  # two layers, query and value, A and B
    with pytest.raises(ValueError, match="already"):
        add_lora(top, seed=0)


def test_two_clients_share_the_frozen_base_weights_unchanged_and_train_only_their_own_lora(backbone):
    before = {name: p.detach().clone() for name, p in backbone.named_parameters()}
    first, second = _client(backbone, seed=0), _client(backbone, seed=0)
    for i, layer in enumerate(backbone.encoder.layer[1:]):
        for target in ("query", "value"):
            shared = getattr(layer.attention.self, target).weight
            for client in (first, second):
                wrapped = getattr(client.encoder.layer[i].attention.self, target)
                assert wrapped.base_layer.weight is shared and not shared.requires_grad
    assert not {id(p) for p in lora_parameters(first)} & {id(p) for p in lora_parameters(second)}
    hidden, mask = _states(backbone)
    load_lora_(first, np.random.default_rng(0).normal(0, 0.1, lora_size(first)).astype(np.float32))
    optimizer = torch.optim.SGD([p for p in first.parameters() if p.requires_grad], lr=1.0)
    first(hidden, mask).pow(2).mean().backward()
    optimizer.step()
    assert all(p.grad is None for p in backbone.parameters())
    for name, p in backbone.named_parameters():
        assert torch.equal(p, before[name]) and not p.requires_grad, name
    np.testing.assert_array_equal(flatten_lora(second), flatten_lora(_client(backbone, seed=0)))


def test_flatten_and_load_round_trip_in_the_fixed_order(backbone):
    top = _client(backbone)
    settings = LoraSettings()
    assert lora_size(top) == 2 * 2 * settings.rank * (HIDDEN + HIDDEN)
    shapes = [tuple(p.shape) for p in lora_parameters(top)]
    assert shapes == [(settings.rank, HIDDEN), (HIDDEN, settings.rank)] * 4  # A then B, per layer, in module order
    vector = np.random.default_rng(1).normal(size=lora_size(top)).astype(np.float32)
    load_lora_(top, vector)
    out = flatten_lora(top)
    assert out.dtype == np.float32 and out.shape == (lora_size(top),)
    np.testing.assert_array_equal(out, vector)
    out[:] = 0  # a copy, not a view of the parameters
    np.testing.assert_array_equal(flatten_lora(top), vector)


@pytest.mark.parametrize("bad", [np.zeros(3, np.float32), np.zeros((2, 1024), np.float32),
                                 np.full(2048, np.nan, np.float32), np.zeros(2048, np.int64)])
def test_load_rejects_wrong_shape_non_finite_and_non_float_vectors(backbone, bad):
    top = _client(backbone)
    assert lora_size(top) == 2048
    before = flatten_lora(top)
    with pytest.raises(ValueError, match="needs a 1-D vector of length 2048|must be finite floating point"):
        load_lora_(top, bad)
    np.testing.assert_array_equal(flatten_lora(top), before)


def test_seeded_init_is_deterministic_differs_across_seeds_has_b_zero_and_leaves_the_global_rng(backbone):
    rng = torch.get_rng_state()
    a, b, c = (flatten_lora(_client(backbone, seed=s)) for s in (0, 0, 1))
    assert torch.equal(torch.get_rng_state(), rng)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)
    top = _client(backbone, seed=0)
    for layer in lora_layers(top):
        assert torch.count_nonzero(layer.lora_A[ADAPTER].weight) > 0
        assert torch.count_nonzero(layer.lora_B[ADAPTER].weight) == 0
        assert layer.scaling[ADAPTER] == pytest.approx(16 / 8)


def test_fresh_lora_is_an_exact_identity_and_a_loaded_one_is_not(backbone):
    hidden, mask = _states(backbone)
    plain = TopEncoder(backbone, split=1)
    top = _client(backbone, seed=3)
    with torch.no_grad():
        assert torch.equal(top(hidden, mask), plain(hidden, mask))
        load_lora_(top, np.full(lora_size(top), 0.05, np.float32))
        assert not torch.allclose(top(hidden, mask), plain(hidden, mask))


def test_existing_adapters_keep_their_trainability_and_errors_are_clear(backbone):
    top = attach_adapters(TopEncoder(backbone, split=1), {"global": 4}, seed=0)
    add_lora(top, seed=0)
    assert all(p.requires_grad for p in set_parameters(top, "global"))
    with pytest.raises(ValueError, match="no LoRA"):
        lora_parameters(TopEncoder(backbone, split=1))
    for kwargs, message in (({"rank": 0}, "rank must be >= 1"), ({"alpha": 0.0}, "alpha must be positive"),
                            ({"dropout": 1.0}, r"dropout must be in \[0, 1\)"),
                            ({"targets": ()}, "at least one target module")):
        with pytest.raises(ValueError, match=message):
            LoraSettings(**kwargs)
    assert math.isclose(LoraSettings().alpha / LoraSettings().rank, 2.0)
