import pytest
import torch

from nlp_models.adapters import attach_adapters, flatten_set, freeze_backbone, load_set_
from nlp_models.backbone import tiny_bert
from nlp_models.frozen_prefix import build_prefix_cache, suffix_forward


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
