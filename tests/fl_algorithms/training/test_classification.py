"""Text-classification clients on the frozen-prefix scheme (fl_algorithms.training.classification)."""
import numpy as np
import pytest
import torch

from fl_algorithms.training.classification import ADAPTER_SET, TextTaskConfig, build_text_trainers, client_model
from nlp_models.adapters import attach_adapters, freeze_backbone
from nlp_models.backbone import tiny_bert
from nlp_models.data.partition import ClientSplit
from nlp_models.frozen_prefix import build_prefix_cache, prefix_split
from nlp_models.heads import batch_position_ids, batch_token_type_ids, mean_pool


def _toy_cache(backbone, *, n=24, length=12, split=1):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1000, 2000, (n, length), generator=g)
    mask = torch.ones_like(ids)
    mask[::3, 8:] = 0
    labels = torch.arange(n) % 3
    return ids, mask, labels, build_prefix_cache(backbone, ids, mask, split=split, progress=False)


def _splits(n):
    idx = np.arange(n)
    return [ClientSplit(train=idx[0:8], validation=idx[8:10], test=idx[10:12]),
            ClientSplit(train=idx[12:20], validation=idx[20:22], test=idx[22:24])]


def test_trainer_changes_only_adapter_and_head_parameters():
    backbone = tiny_bert(layers=3, hidden=32)
    before = {n: p.detach().clone() for n, p in backbone.named_parameters()}
    config = TextTaskConfig(adapter_layers=2, batch_size=4, lr=1e-2)
    split = prefix_split(backbone, 2)
    _, _, labels, cache = _toy_cache(backbone, split=split)
    trainers = build_text_trainers(backbone=backbone, cache=cache, labels=labels, splits=_splits(24),
                                   num_labels=3, config=config)
    trainer = trainers[1]
    model = trainer.model
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    assert set(trainer.get_shared()) == {"adapter", "head"}
    metrics = trainer.train(epochs=2)
    assert metrics["steps"] == 4.0
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, start[n])}
    assert changed, "training changed nothing"
    assert all(".adapters.adapter." in n or n.startswith("head.") for n in changed), changed
    assert any(n.startswith("head.") for n in changed) and any(".adapters." in n for n in changed)
    # the frozen top-layer weights are the backbone's own tensors (not copies), and untouched
    backbone_ids = {id(p) for p in backbone.parameters()}
    frozen = [p for n, p in model.named_parameters() if not p.requires_grad]
    assert frozen and all(id(p) in backbone_ids for p in frozen)
    assert all(torch.equal(p, before[n]) for n, p in backbone.named_parameters())
    assert not any("adapters" in n for n, _ in backbone.named_parameters())
    # clients hold independent adapters and heads
    other = dict(trainers[2].model.named_parameters())
    assert all(torch.equal(other[n], start[n]) for n in changed)


def test_suffix_classifier_matches_the_full_model_with_the_same_adapters():
    backbone = tiny_bert(layers=3, hidden=32)
    config = TextTaskConfig(adapter_layers=1, seed=3)
    ids, mask, _, cache = _toy_cache(backbone, split=2)
    client = client_model(backbone, num_labels=3, config=config).eval()
    with torch.no_grad():
        for n, p in client.named_parameters():
            if ".adapters." in n:
                p.add_(0.05)  # make the adapters non-identity
    full = tiny_bert(layers=3, hidden=32)
    attach_adapters(full, {ADAPTER_SET: config.bottleneck}, layers=[2])
    freeze_backbone(full)
    adapters = {n: p for n, p in client.named_parameters() if ".adapters." in n}
    with torch.no_grad():
        for n, p in full.named_parameters():
            if ".adapters." in n:
                p.copy_(adapters["suffix.encoder.layer.0." + n.split(".", 3)[3]])
    full.eval()
    with torch.no_grad():
        states = full(input_ids=ids, attention_mask=mask, position_ids=batch_position_ids(ids),
                      token_type_ids=batch_token_type_ids(ids)).last_hidden_state
        expected = client.head(states, mean_pool(states, mask))
        torch.testing.assert_close(client(cache.hidden, cache.attention_mask), expected, atol=1e-5, rtol=1e-4)


def test_trainer_is_seeded_resumable_and_supports_the_proximal_term():
    backbone = tiny_bert(layers=2, hidden=32)
    config = TextTaskConfig(adapter_layers=1, batch_size=4, lr=1e-2, head_dropout=0.3)
    _, _, labels, cache = _toy_cache(backbone, split=1)

    def build():
        return build_text_trainers(backbone=backbone, cache=cache, labels=labels, splits=_splits(24),
                                   num_labels=3, config=config)[1]

    a, b = build(), build()
    a.train(epochs=1)
    snapshot = a.state_dict()
    assert set(snapshot) == {"trainable", "optimizer", "calls"} and snapshot["calls"] == 1
    assert all(p.requires_grad for n, p in a.model.named_parameters() if n in snapshot["trainable"])
    assert len(snapshot["trainable"]) < len(list(a.model.parameters()))  # frozen weights are not saved
    b.load_state_dict(snapshot)
    a.train(epochs=1)
    b.train(epochs=1)
    for part, vec in a.get_shared().items():
        np.testing.assert_array_equal(vec, b.get_shared()[part])
    # FedProx: a strong proximal term keeps the shared parameters nearer the anchor
    free, tied = build(), build()
    anchor = free.get_shared()
    free.train(epochs=2)
    tied.train(epochs=2, proximal=anchor, mu=100.0)
    for part in anchor:
        tied_drift = np.abs(tied.get_shared()[part] - anchor[part]).max()
        assert tied_drift < np.abs(free.get_shared()[part] - anchor[part]).max()


def test_cache_must_match_the_adapted_layers_and_labels():
    backbone = tiny_bert(layers=3, hidden=32)
    _, _, labels, cache = _toy_cache(backbone, split=1)
    with pytest.raises(ValueError, match="split"):
        build_text_trainers(backbone=backbone, cache=cache, labels=labels, splits=_splits(24), num_labels=3,
                            config=TextTaskConfig(adapter_layers=1))
    with pytest.raises(ValueError, match="labels"):
        build_text_trainers(backbone=backbone, cache=cache, labels=labels[:5], splits=_splits(24), num_labels=3,
                            config=TextTaskConfig(adapter_layers=2))
