import pytest
import torch

from nlp_models.adapters import attach_adapters, flatten_set, freeze_backbone, load_set_
from nlp_models.backbone import tiny_bert
from nlp_models.frozen_prefix import build_prefix_cache, cache_splits, suffix_forward


def _inputs(n=6, length=10, vocab=100):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, vocab, (n, length), generator=g)
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0
    mask[3, 2:] = 0
    return ids, mask


def test_cached_prefix_plus_suffix_equals_full_forward_with_adapters():
    model = tiny_bert(vocab_size=100, layers=3, hidden=32)
    attach_adapters(model, {"global": 4}, seed=0, layers=[2])
    freeze_backbone(model)
    vec = flatten_set(model, "global")
    load_set_(model, "global", vec + 0.1)  # make the adapter non-identity
    model.eval()
    ids, mask = _inputs()
    cache = build_prefix_cache(model, ids, mask, split=2, progress=False)
    out = suffix_forward(model, cache.hidden, cache.attention_mask, split=2)
    from nlp_models.heads import batch_position_ids, batch_token_type_ids
    full = model(input_ids=ids, attention_mask=mask, position_ids=batch_position_ids(ids),
                 token_type_ids=batch_token_type_ids(ids)).last_hidden_state
    torch.testing.assert_close(out[mask.bool()], full[mask.bool()], atol=1e-5, rtol=1e-4)


def test_prefix_with_adapters_is_refused_and_gradients_reach_suffix_adapters():
    model = tiny_bert(vocab_size=100, layers=2, hidden=32)
    attach_adapters(model, {"global": 4}, seed=0, layers=[1])
    ids, mask = _inputs()
    with pytest.raises(ValueError, match="adapters"):
        build_prefix_cache(model, ids, mask, split=2, progress=False)
    freeze_backbone(model)
    cache = build_prefix_cache(model, ids, mask, split=1, progress=False)
    out = suffix_forward(model, cache.hidden, cache.attention_mask, split=1)
    out.sum().backward()
    grads = [p.grad for n, p in model.named_parameters() if "adapters.global" in n]
    assert grads and all(g is not None for g in grads)
    assert all(p.grad is None for n, p in model.named_parameters() if "adapters" not in n)


def test_length_sorted_cache_matches_the_plain_one_on_real_tokens_and_is_zero_past_them():
    from nlp_models.frozen_prefix import build_prefix_cache

    model = tiny_bert(vocab_size=100, layers=3, hidden=32)
    ids, mask = _inputs(n=9)
    mask[:, 9:] = 0  # no row uses the last position: no batch computes it
    plain = build_prefix_cache(model, ids, mask, split=2, progress=False, batch_size=4)
    sorted_ = build_prefix_cache(model, ids, mask, split=2, progress=False, batch_size=4, by_length=True)
    assert plain.hidden.shape == sorted_.hidden.shape and sorted_.split == 2
    real = mask.bool()
    torch.testing.assert_close(sorted_.hidden[real], plain.hidden[real], atol=1e-5, rtol=1e-4)
    assert torch.all(sorted_.hidden[:, 9:] == 0)
    assert model.training  # the backbone's mode is restored


def test_top_encoder_shares_frozen_weights_and_owns_its_adapters():
    from nlp_models.frozen_prefix import TopEncoder, build_prefix_cache

    model = tiny_bert(vocab_size=100, layers=3, hidden=32, dropout=0.1)
    with pytest.raises(ValueError, match="freeze"):
        TopEncoder(model, split=1)
    top = TopEncoder(model, split=1, freeze=True, dropout=False)
    other = TopEncoder(model, split=1)
    assert len(top.encoder.layer) == 2
    assert top.encoder.layer[0].output.dense.weight is model.encoder.layer[1].output.dense.weight
    assert not model.encoder.layer[1].output.dense.weight.requires_grad
    assert model.encoder.layer[0].output.dense.weight.requires_grad  # below the split: untouched
    assert all(m.p == 0.0 for m in top.modules() if isinstance(m, torch.nn.Dropout))
    assert any(m.p > 0.0 for m in other.modules() if isinstance(m, torch.nn.Dropout))
    attach_adapters(top, {"global": 4}, seed=0)
    assert not any("adapters" in n for n, _ in model.named_parameters())
    assert not any("adapters" in n for n, _ in other.named_parameters())
    # the cached prefix + the top layers = the full model
    model.eval()
    top.eval()
    ids, mask = _inputs()
    cache = build_prefix_cache(model, ids, mask, split=1, progress=False)
    full = suffix_forward(model, cache.hidden, cache.attention_mask, split=1)
    torch.testing.assert_close(top(cache.hidden, cache.attention_mask), full)


def test_cached_split_batches_trim_padding_and_keep_labels():
    from nlp_models.frozen_prefix import CachedSplit, build_prefix_cache, prefix_split

    model = tiny_bert(vocab_size=100, layers=2, hidden=32)
    assert prefix_split(model, 1) == 1
    with pytest.raises(ValueError, match="adapter_layers"):
        prefix_split(model, 3)
    ids, mask = _inputs()
    cache = build_prefix_cache(model, ids, mask, split=1, progress=False)
    labels = torch.arange(6) % 2
    split = CachedSplit.take(cache, labels, [3, 0])
    assert len(split) == 2 and split.labels.tolist() == [1, 0]
    (batch,) = split.batches(2)
    assert batch.hidden.shape == (2, 6, 32) and batch.attention_mask.shape == (2, 6)  # row 0 has 6 real tokens
    only3 = split.batch(torch.tensor([0]))
    assert only3.hidden.shape[1] == 2  # row 3 has 2 real tokens
    with pytest.raises(ValueError, match="token ids"):
        split.batch(torch.tensor([0]), tokens=True)
    assert len(split.dataset()) == 2


def test_cache_texts_keeps_token_ids_and_trims_to_the_longest_text(tokenizer):
    from nlp_models.frozen_prefix import cache_texts

    model = tiny_bert(layers=2, hidden=32)
    split = cache_texts(model, tokenizer, ["a short one", "a somewhat longer sentence than that", "x"], [0, 1, 0],
                        max_length=32, split=1, chunk=2)
    longest = int(split.attention_mask.sum(dim=1).max())
    assert split.hidden.shape == (3, longest, 32) and split.input_ids.shape == (3, longest)
    assert split.labels.tolist() == [0, 1, 0]
    batch = split.batch(torch.tensor([2]), tokens=True)
    assert batch.hidden.dtype == torch.long and batch.hidden.shape[1] == int(split.attention_mask[2].sum())


def test_cache_splits_gives_each_split_exactly_its_own_rows_of_one_pass():
    model = tiny_bert(vocab_size=100, layers=3, hidden=32)
    ids = torch.randint(1, 100, (7, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    labels = torch.arange(7)
    whole = build_prefix_cache(model, ids, mask, split=2, progress=False)
    parts = cache_splits(model, ids, mask, labels, sizes={"train": 4, "validation": 1, "test": 2}, split=2, device="cpu")
    assert [len(parts[k]) for k in ("train", "validation", "test")] == [4, 1, 2]
    assert parts["test"].labels.tolist() == [5, 6]
    assert torch.allclose(parts["validation"].hidden, whole.hidden[4:5])
    with pytest.raises(ValueError, match="do not cover"):
        cache_splits(model, ids, mask, labels, sizes={"train": 3}, split=2, device="cpu")


def _adapted_top(split: int, *, lora: bool = False):
    from nlp_models.frozen_prefix import TopEncoder

    model = tiny_bert(vocab_size=100, layers=3, hidden=32)
    top = TopEncoder(model, split=split, freeze=True, dropout=False)
    attach_adapters(top, {"global": 4}, seed=0)
    load_set_(top, "global", flatten_set(top, "global") + 0.1)  # non-identity adapters
    if lora:
        from nlp_models.lora import LoraSettings, add_lora
        add_lora(top, LoraSettings(rank=2), seed=0)
    return model, top


@pytest.mark.parametrize("split", [0, 1, 2])
def test_an_attended_cache_starts_the_first_adapted_layer_at_its_adapter_site_with_the_same_outputs_and_grads(split):
    from nlp_models.adapters import set_parameters

    model, top = _adapted_top(split)
    ids, mask = _inputs()
    plain = build_prefix_cache(model, ids, mask, split=split, progress=False, by_length=True)
    kept = build_prefix_cache(model, ids, mask, split=split, progress=False, by_length=True, attended=True)
    assert kept.hidden.shape == (*ids.shape, 64)
    torch.testing.assert_close(kept.hidden[..., :32], plain.hidden, rtol=0, atol=0)
    outputs, grads = [], []
    for cache in (plain, kept):
        top.zero_grad()
        out = top(cache.hidden, cache.attention_mask)
        (out[mask.bool()] ** 2).sum().backward()
        outputs.append(out[mask.bool()])
        grads.append(torch.cat([p.grad.flatten() for p in set_parameters(top, "global")]))
    torch.testing.assert_close(outputs[1], outputs[0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(grads[1], grads[0], atol=1e-5, rtol=1e-4)
    # the kept half is what the layer uses: changing it changes the output
    changed = kept.hidden.clone()
    changed[..., 32:] += torch.randn(changed[..., 32:].shape, generator=torch.Generator().manual_seed(1))
    assert not torch.allclose(top(changed, kept.attention_mask)[mask.bool()], outputs[1].detach(), atol=1e-3)


def test_a_layer_whose_attention_is_trained_ignores_the_kept_half_and_cannot_be_cached():
    from nlp_models.lora import LoraSettings, add_lora

    model, top = _adapted_top(1, lora=True)
    ids, mask = _inputs()
    plain = build_prefix_cache(model, ids, mask, split=1, progress=False)
    kept = build_prefix_cache(model, ids, mask, split=1, progress=False, attended=True)
    changed = kept.hidden.clone()
    changed[..., 32:] += torch.randn(changed[..., 32:].shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(top(changed, kept.attention_mask), top(plain.hidden, plain.attention_mask),
                                   rtol=0, atol=0)
    lora_model = add_lora(tiny_bert(vocab_size=100, layers=3, hidden=32), LoraSettings(rank=2), seed=0)
    with pytest.raises(ValueError, match="no plain attention block"):
        build_prefix_cache(lora_model, ids, mask, split=1, progress=False, attended=True)


def test_cached_states_of_another_width_are_refused():
    model, top = _adapted_top(1)
    with pytest.raises(ValueError, match="width 48"):
        top(torch.zeros(2, 3, 48), torch.ones(2, 3, dtype=torch.long))
