"""Client models over a frozen backbone (nlp_models.classifiers)."""
import torch

from nlp_models.adapters import attach_adapters
from nlp_models.backbone import tiny_bert
from nlp_models.classifiers import (KEY_BIAS, AdapterClassifier, FullModel, SuffixClassifier, build_suffix_classifier,
                                   make_head, tuned_top)
from nlp_models.frozen_prefix import TopEncoder, build_prefix_cache
from nlp_models.heads import TextClassifier


def _batch(n=5, length=7):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 100, (n, length), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    return ids, mask, torch.arange(n) % 2


def test_heads_depend_on_their_seed_only():
    torch.manual_seed(0)
    a = make_head(16, 3, seed=4)
    torch.manual_seed(1)
    b = make_head(16, 3, seed=4)
    c = make_head(16, 3, mlp_hidden=8, dropout=0.0, seed=4)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert len(list(c.parameters())) == 4 and c.dropout.p == 0.0


def test_suffix_classifier_trains_only_its_adapters_and_head():
    backbone = tiny_bert(vocab_size=100, layers=3, hidden=32)
    model = build_suffix_classifier(backbone, num_labels=2, adapter_layers=1, bottleneck=4, seed=1)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".adapters.adapter." in n or n.startswith("head.") for n in trainable)
    ids, mask, _ = _batch()
    cache = build_prefix_cache(backbone, ids, mask, split=2, progress=False)
    assert model(cache.hidden, cache.attention_mask).shape == (5, 2)


def test_tuned_top_trains_its_own_copy_of_the_top_layers_and_leaves_the_backbone_alone():
    backbone = tiny_bert(vocab_size=100, layers=3, hidden=32).requires_grad_(False)
    before = {n: p.clone() for n, p in backbone.named_parameters()}
    model = SuffixClassifier(suffix=tuned_top(backbone, layers=2), head=make_head(32, 2, seed=0))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert {n.split(".")[3] for n in trainable if n.startswith("suffix.")} == {"0", "1"}  # both top layers, whole
    assert not any(p.requires_grad for p in backbone.parameters())
    ids, mask, labels = _batch()
    cache = build_prefix_cache(backbone, ids, mask, split=1, progress=False)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    torch.nn.functional.cross_entropy(model(cache.hidden.clone(), cache.attention_mask), labels).backward()
    opt.step()
    top = dict(model.suffix.named_parameters())
    assert not torch.equal(top["encoder.layer.0.attention.self.query.weight"],
                           before["encoder.layer.1.attention.self.query.weight"])  # the copy moved...
    assert all(torch.equal(p, before[n]) for n, p in backbone.named_parameters())  # ...the backbone did not


def test_tuned_top_freezes_only_the_key_biases_whose_gradient_is_zero():
    backbone = tiny_bert(vocab_size=100, layers=3, hidden=32).requires_grad_(False)
    model = SuffixClassifier(suffix=tuned_top(backbone, layers=2), head=make_head(32, 2, seed=0)).double()
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen == {f"suffix.encoder.layer.{i}.{KEY_BIAS}" for i in (0, 1)}
    model.requires_grad_(True)
    ids, mask, labels = _batch()
    cache = build_prefix_cache(backbone, ids, mask, split=1, progress=False)
    torch.nn.functional.cross_entropy(model(cache.hidden.double(), cache.attention_mask), labels).backward()
    grads = {n: p.grad.abs().max().item() for n, p in model.named_parameters()}
    assert max(grads[n] for n in frozen) < 1e-12  # float64: the softmax ignores them exactly
    assert min(g for n, g in grads.items() if n not in frozen) > 1e-8


def test_adapter_classifier_and_full_model_classify_the_same_way():
    backbone = tiny_bert(vocab_size=100, layers=2, hidden=32).requires_grad_(False).eval()
    ids, mask, labels = _batch()
    top = attach_adapters(TopEncoder(backbone, split=0), {"g": 4}, seed=0)  # identity adapters at init
    heads = {"h": make_head(32, 2, dropout=0.0, seed=0)}
    cached = AdapterClassifier(top, heads).eval()
    full = FullModel(TextClassifier(backbone, {"h": make_head(32, 2, dropout=0.0, seed=0)})).eval()
    with torch.no_grad():
        hidden = backbone.embeddings(input_ids=ids, token_type_ids=torch.zeros_like(ids))
        a = cached.classify("h", cached.represent((hidden, mask, labels), mixing={"g": 1.0}))
        b = full.classify("h", full.represent((ids, mask, labels), mixing={}))
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert torch.equal(cached.labels((hidden, mask, labels)), labels)
    cached.train()
    cached.represent((hidden, mask, labels), mixing={"g": 1.0})
    assert cached.timer["forward g"] > 0  # training forward passes are timed per mixing
