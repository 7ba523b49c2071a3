"""Named Houlsby adapter sets: identity at init, mixing, freezing, flat upload vectors, Opacus."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nlp_models.adapters import (
    AdapterConfig,
    AdapterSite,
    active,
    adapter_set_names,
    adapter_sites,
    attach_adapters,
    count_trainable,
    flatten_set,
    freeze_backbone,
    get_mixing,
    load_set_,
    set_mixing,
    set_size,
    set_trainable_sets,
    trainable_parameters,
)
from nlp_models.backbone import tiny_bert

HIDDEN, LAYERS, BOTTLENECK = 32, 2, 4


def inputs(batch=3, length=7, seed=0):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 5000, (batch, length), generator=generator)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def encode(model, **kwargs):
    with torch.no_grad():
        return model(**inputs(**kwargs)).last_hidden_state


def perturb(model, name, scale=0.5, seed=1):
    """Give a set non-zero up-projections so it changes the output."""
    rng = np.random.default_rng(seed)
    load_set_(model, name, rng.normal(scale=scale, size=set_size(model, name)).astype(np.float32))


@pytest.fixture
def adapted():
    model = tiny_bert(seed=0)
    attach_adapters(model, {"global": BOTTLENECK, "private": AdapterConfig(bottleneck=2 * BOTTLENECK)}, seed=0)
    return model


def test_sites_after_attention_and_ffn_output_of_every_layer(adapted):
    sites = adapter_sites(adapted)
    assert len(sites) == 2 * LAYERS
    for layer in adapted.encoder.layer:
        assert isinstance(layer.attention.output.dropout, AdapterSite)
        assert isinstance(layer.output.dropout, AdapterSite)
    assert adapter_set_names(adapted) == ("global", "private")
    assert sites[0].adapters["private"].down.out_features == 2 * BOTTLENECK


def test_zero_up_projection_is_exactly_the_frozen_backbone():
    plain = tiny_bert(seed=0)
    adapted = attach_adapters(tiny_bert(seed=0), {"global": 8, "private": 8}, seed=0)
    assert torch.equal(encode(plain), encode(adapted))


def test_set_size_matches_houlsby_formula(adapted):
    per_site = lambda r: HIDDEN * r + r + r * HIDDEN + HIDDEN  # noqa: E731
    assert set_size(adapted, "global") == 2 * LAYERS * per_site(BOTTLENECK)
    assert set_size(adapted, "private") == 2 * LAYERS * per_site(2 * BOTTLENECK)


def test_freeze_leaves_only_adapters_trainable(adapted):
    freeze_backbone(adapted)
    names = [name for name, _ in trainable_parameters(adapted)]
    assert names and all(".adapters." in name for name in names)
    assert count_trainable(adapted) == set_size(adapted, "global") + set_size(adapted, "private")
    set_trainable_sets(adapted, ["global"])
    assert count_trainable(adapted) == set_size(adapted, "global")
    assert all(".adapters.global." in name for name, _ in trainable_parameters(adapted))


def test_flatten_load_round_trip_touches_only_that_set(adapted):
    private_before = flatten_set(adapted, "private")
    vector = np.random.default_rng(0).normal(size=set_size(adapted, "global")).astype(np.float32)
    load_set_(adapted, "global", vector)
    assert flatten_set(adapted, "global").dtype == np.float32
    np.testing.assert_array_equal(flatten_set(adapted, "global"), vector)
    np.testing.assert_array_equal(flatten_set(adapted, "private"), private_before)


def test_flatten_order_is_the_same_across_model_instances():
    first = attach_adapters(tiny_bert(seed=0), {"global": 4}, seed=7)
    second = attach_adapters(tiny_bert(seed=0), {"global": 4}, seed=7)
    perturb(first, "global")
    load_set_(second, "global", flatten_set(first, "global"))
    assert torch.equal(encode(first), encode(second))


def test_set_init_does_not_depend_on_the_order_sets_are_added():
    ab = attach_adapters(tiny_bert(), {"global": 4, "private": 4}, seed=5)
    ba = attach_adapters(tiny_bert(), {"private": 4, "global": 4}, seed=5)
    np.testing.assert_array_equal(flatten_set(ab, "global"), flatten_set(ba, "global"))
    assert not np.array_equal(flatten_set(ab, "global"), flatten_set(ab, "private"))


@pytest.mark.parametrize(
    "bad", [np.zeros(3, np.float32), np.zeros((2, 2), np.float32), "nan", np.zeros(1, np.int64)]
)
def test_load_rejects_malformed_vectors(adapted, bad):
    size = set_size(adapted, "global")
    if isinstance(bad, str):
        bad = np.full(size, np.nan, dtype=np.float32)
    elif bad.dtype == np.int64:
        bad = np.zeros(size, dtype=np.int64)
    with pytest.raises(ValueError, match="needs a 1-D vector of length|must be finite floating point"):
        load_set_(adapted, "global", bad)


def test_unknown_names_are_rejected(adapted):
    with pytest.raises(KeyError, match=r"unknown adapter sets \['glboal'\]"):
        set_mixing(adapted, {"glboal": 1.0})
    with pytest.raises(KeyError, match="no adapter set 'local'"):
        flatten_set(adapted, "local")
    with pytest.raises(ValueError, match="adapter set 'global' already exists"):
        attach_adapters(adapted, {"global": 4})
    with pytest.raises(ValueError, match="must be an identifier"):
        attach_adapters(adapted, {"not-an-identifier": 4})


def test_default_mixing_is_the_mean_and_active_restores_it(adapted):
    assert get_mixing(adapted) == {"global": 0.5, "private": 0.5}
    with active(adapted, {"global": 1.0}):
        assert get_mixing(adapted) == {"global": 1.0}
    assert get_mixing(adapted) == {"global": 0.5, "private": 0.5}


@settings(max_examples=20, deadline=None)
@given(w_global=st.floats(-2, 2), w_private=st.floats(-2, 2))
def test_site_output_is_h_plus_weighted_sum(w_global, w_private):
    torch.manual_seed(0)
    site = AdapterSite(torch.nn.Identity())
    from nlp_models.adapters import BottleneckAdapter

    site.adapters["global"] = BottleneckAdapter(8, AdapterConfig(bottleneck=3, up_init_std=0.5))
    site.adapters["private"] = BottleneckAdapter(8, AdapterConfig(bottleneck=2, up_init_std=0.5))
    site.mixing = (("global", w_global), ("private", w_private))
    h = torch.randn(2, 5, 8)
    expected = h + w_global * site.adapters["global"](h) + w_private * site.adapters["private"](h)
    torch.testing.assert_close(site(h), expected)


def test_mixing_weights_change_the_output(adapted):
    perturb(adapted, "global", seed=1)
    perturb(adapted, "private", seed=2)
    with active(adapted, {"global": 0.5, "private": 0.5}):
        both = encode(adapted)
    with active(adapted, {"global": 1.0}):
        global_only = encode(adapted)
    with active(adapted, {}):
        backbone_only = encode(adapted)
    assert not torch.allclose(both, global_only)
    assert not torch.allclose(global_only, backbone_only)
    assert torch.equal(backbone_only, encode(tiny_bert(seed=0)))


def test_fedmcp_two_pass_gradients_reach_the_right_sets(adapted):
    """Pass 1: h + A_g/2 + A_p/2; pass 2: h + A_g. Pass 2's loss must not touch the private set."""
    freeze_backbone(adapted)
    perturb(adapted, "global", scale=0.1)
    perturb(adapted, "private", scale=0.1, seed=3)
    with active(adapted, {"global": 0.5, "private": 0.5}):
        z1 = adapted(**inputs()).last_hidden_state
    with active(adapted, {"global": 1.0}):
        z2 = adapted(**inputs()).last_hidden_state
    z2.pow(2).mean().backward()
    site = adapter_sites(adapted)[0]
    assert site.adapters["global"].up.weight.grad.abs().sum() > 0
    assert site.adapters["private"].up.weight.grad is None
    z1.pow(2).mean().backward()
    assert site.adapters["private"].up.weight.grad.abs().sum() > 0


@pytest.mark.filterwarnings("ignore")
def test_opacus_hooks_dp_step_with_two_passes_changes_only_adapters_and_heads():
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    from nlp_models.heads import SequenceClassifier, TextClassifier, batch_position_ids, batch_token_type_ids

    backbone = attach_adapters(tiny_bert(seed=0), {"global": 4, "private": 4}, seed=0)
    model = TextClassifier(backbone, {"g1": SequenceClassifier(HIDDEN, 2), "g2": SequenceClassifier(HIDDEN, 2)})
    model.freeze_backbone()
    model.train()
    frozen = [n for n, _ in model.named_parameters() if ".adapters." not in n and not n.startswith("heads.")]
    frozen_before = [model.get_parameter(n).detach().clone() for n in frozen]
    data = inputs(batch=16, length=9, seed=2)
    labels = torch.arange(16) % 2
    loader = DataLoader(TensorDataset(data["input_ids"], labels), batch_size=8)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    private, optimizer, loader = PrivacyEngine().make_private(
        module=model, optimizer=optimizer, data_loader=loader, noise_multiplier=1.0, max_grad_norm=1.0,
        grad_sample_mode="hooks", poisson_sampling=False,
    )
    before = {name: flatten_set(private, name) for name in ("global", "private")}
    ids, y = next(iter(loader))
    mask = torch.ones_like(ids)
    forward = dict(input_ids=ids, attention_mask=mask,
                   position_ids=batch_position_ids(ids), token_type_ids=batch_token_type_ids(ids))
    optimizer.zero_grad()
    with active(private, {"global": 0.5, "private": 0.5}):
        loss = torch.nn.functional.cross_entropy(private(**forward, head="g1").logits, y)
    with active(private, {"global": 1.0}):
        loss = loss + torch.nn.functional.cross_entropy(private(**forward, head="g2").logits, y)
    loss.backward()
    optimizer.step()
    for name in ("global", "private"):
        assert not np.array_equal(flatten_set(private, name), before[name])
    frozen_after = [model.get_parameter(n) for n in frozen]
    assert all(torch.equal(a, b) for a, b in zip(frozen_before, frozen_after))
