"""The adapter sentiment task (nlp_models.adapter_sentiment) on a tiny random BERT and a synthetic corpus
with movie groups: shapes, determinism, the public split and the shadow clients."""
import numpy as np
import pytest
import torch

from nlp_models.adapter_sentiment import (ADAPTERS_PART, HEAD_PART, AdapterTaskConfig, build_adapter_task,
                                          shadow_clients, shared_parts)
from nlp_models.backbone import tiny_bert
from nlp_models.data.dataset import TextDataset
from nlp_models.data.partition import movie_clients, split_off_public_groups
from nlp_models.data.partition import client_splits, natural_partition
from nlp_models.frozen_prefix import build_prefix_cache

HIDDEN, BOTTLENECK = 32, 4


def synthetic_corpus(n: int = 240, movies: int = 40, seed: int = 0) -> TextDataset:
    rng = np.random.default_rng(seed)
    words = ("good bad great awful fine dull superb boring fun slow").split()
    texts, labels, groups = [], [], []
    for i in range(n):
        y = int(rng.integers(2))
        texts.append(" ".join(rng.choice(words[y::2], int(rng.integers(2, 20)))) + f" film{i % movies} take {i}")
        labels.append(y)
        groups.append(f"movie {i % movies}")
    return TextDataset(name="synthetic", texts=tuple(texts), labels=tuple(labels), label_names=("rotten", "fresh"),
                       groups=tuple(groups))


def build(tokenizer, **overrides):
    config = AdapterTaskConfig(**{"num_clients": 4, "bottleneck": BOTTLENECK, "backbone": "tiny", "max_length": 24,
                                  "public_fraction": 0.2, **overrides})
    backbone = tiny_bert(layers=3, hidden=HIDDEN, heads=2)
    return build_adapter_task(config, dataset=synthetic_corpus(), backbone=backbone, tokenizer=tokenizer,
                              progress=False)


@pytest.fixture(scope="module")
def task(tokenizer):
    return build(tokenizer)


def adapter_size(layers: int) -> int:
    return layers * 2 * (HIDDEN * BOTTLENECK + BOTTLENECK + BOTTLENECK * HIDDEN + HIDDEN)


def test_shared_parts_are_the_adapters_and_head_and_the_cache_is_fp16_at_each_splits_length(task):
    assert {k: v.shape for k, v in task.initial.items()} == {ADAPTERS_PART: (adapter_size(1),),
                                                             HEAD_PART: (HIDDEN * 2 + 2,)}
    assert all(v.dtype == np.float32 for v in task.initial.values())
    assert task.summary()["parameters"] == adapter_size(1) + HIDDEN * 2 + 2 and task.split == 2
    model = task.new_model()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {n for names in shared_parts(model).values() for n in names}
    for data in task.clients.values():
        for split in (data.train, data.test):
            lengths = split.attention_mask.sum(dim=1)
            assert split.hidden.dtype == torch.float16 and split.hidden.shape[-1] == HIDDEN
            assert split.hidden.shape[1] == int(lengths.max())  # padded to this split's longest snippet only
            assert torch.all(split.hidden[~split.attention_mask.bool()] == 0)
    with torch.inference_mode():
        out = model(task.clients[1].test.hidden, task.clients[1].test.attention_mask)
    assert out.shape == (len(task.clients[1].test), 2) and out.dtype == torch.float32


def test_cached_states_are_the_frozen_prefix_up_to_fp16(task, tokenizer):
    data = task.clients[2].train
    texts = [task.corpus.texts[i] for i in task.clients[2].train_index]
    enc = tokenizer(texts, truncation=True, max_length=24, padding="longest", return_tensors="pt",
                    return_token_type_ids=False)
    direct = build_prefix_cache(task.backbone, enc["input_ids"], enc["attention_mask"], split=task.split,
                                progress=False)
    torch.testing.assert_close(data.attention_mask, enc["attention_mask"].long()[:, : data.hidden.shape[1]])
    real = data.attention_mask.bool()
    torch.testing.assert_close(data.hidden.float()[real], direct.hidden[:, : data.hidden.shape[1]][real],
                               atol=5e-3, rtol=5e-3)
    assert torch.equal(data.labels, torch.as_tensor(task.corpus.label_array()[task.clients[2].train_index]))


def test_task_is_deterministic_and_adapters_start_near_but_not_at_identity(task, tokenizer):
    again = build(tokenizer)
    for part, vec in task.initial.items():
        np.testing.assert_array_equal(vec, again.initial[part])
    for c, data in task.clients.items():
        assert torch.equal(data.train.hidden, again.clients[c].train.hidden)
        np.testing.assert_array_equal(data.test_index, again.clients[c].test_index)
    model = task.new_model()
    named = dict(model.named_parameters())
    up = [p for n, p in named.items() if n.endswith("up.weight")]
    assert len(up) == 2 and all(0 < float(p.detach().std()) < 0.02 for p in up)
    assert all(not p.any() for n, p in named.items() if n.endswith("up.bias"))
    other_seed = build(tokenizer, seed=1)
    assert not np.array_equal(other_seed.initial[HEAD_PART], task.initial[HEAD_PART])


def test_two_adapter_layers_cache_one_layer_less_and_double_the_adapters(tokenizer):
    two = build(tokenizer, adapter_layers=2)
    assert two.split == 1 and two.initial[ADAPTERS_PART].shape == (adapter_size(2),)


def test_public_movies_are_held_by_no_client(task):
    public = set(task.public.index.tolist())
    seen: set[int] = set()
    for data in task.clients.values():
        mine = set(data.train_index.tolist()) | set(data.test_index.tolist())
        assert not mine & public and not mine & seen
        assert not set(data.train_index.tolist()) & set(data.test_index.tolist())
        seen |= mine
    assert seen | public == set(range(len(task.corpus)))
    groups = task.corpus.groups
    public_movies = {groups[i] for i in public}
    assert len(public_movies) == task.public.movies == round(0.2 * 40)
    assert not public_movies & {groups[i] for i in seen}
    assert torch.equal(task.public.examples.labels, torch.as_tensor(task.corpus.label_array()[task.public.index]))


def test_split_off_public_groups_takes_whole_groups_and_nothing_at_zero():
    groups = [f"g{i % 7}" for i in range(50)]
    private, public = split_off_public_groups(groups, fraction=0.3, seed=0)
    assert len({groups[i] for i in public}) == 2 and not {groups[i] for i in public} & {groups[i] for i in private}
    assert sorted(np.concatenate([private, public]).tolist()) == list(range(50))
    again = split_off_public_groups(groups, fraction=0.3, seed=0)
    np.testing.assert_array_equal(public, again[1])
    private0, public0 = split_off_public_groups(groups, fraction=0.0, seed=0)
    assert len(public0) == 0 and len(private0) == 50
    with pytest.raises(ValueError, match=r"fraction must be in \[0, 1\)"):
        split_off_public_groups(groups, fraction=1.0, seed=0)


def test_without_public_movies_the_clients_are_the_bag_tasks():
    data = synthetic_corpus()
    parts = movie_clients(data, num_clients=5, test_fraction=0.2, public_fraction=0.0, seed=3)
    partition = natural_partition(data.groups, num_clients=5, seed=3, min_size=2)  # load_bag_task's rule
    expected = client_splits(partition, ratios=(0.8, 0.0, 0.2), seed=3, labels=data.label_array())
    assert len(parts.public) == 0
    for got, want in zip(parts.clients, expected, strict=True):
        np.testing.assert_array_equal(got.train, want.train)
        np.testing.assert_array_equal(got.test, want.test)


def test_shadow_clients_are_disjoint_subsets_of_the_public_split(task):
    shadows = shadow_clients(task, n_clients=3, examples_per_client=10, seed=5)
    public = set(task.public.index.tolist())
    seen: set[int] = set()
    for data in shadows.values():
        mine = data.train_index.tolist() + data.test_index.tolist()
        assert len(mine) == 10 and len(data.test) >= 1 and len(data.train) == len(data.train_index)
        assert set(mine) <= public and not set(mine) & seen
        seen |= set(mine)
        assert torch.equal(data.train.labels, torch.as_tensor(task.corpus.label_array()[data.train_index]))
    again = shadow_clients(task, n_clients=3, examples_per_client=10, seed=5)
    np.testing.assert_array_equal(again[2].train_index, shadows[2].train_index)
    other = shadow_clients(task, n_clients=3, examples_per_client=10, seed=6)
    assert not np.array_equal(other[1].train_index, shadows[1].train_index)
    with pytest.raises(ValueError, match="exceed"):
        shadow_clients(task, n_clients=len(task.public), examples_per_client=2, seed=0)


def test_config_is_validated():
    with pytest.raises(ValueError, match="two clients"):
        AdapterTaskConfig(num_clients=1)
    with pytest.raises(ValueError, match="optimizer"):
        AdapterTaskConfig(optimizer="lamb")
    with pytest.raises(ValueError, match="public_fraction"):
        AdapterTaskConfig(public_fraction=1.0)
    with pytest.raises(ValueError, match="backbone"):
        AdapterTaskConfig(backbone="bert-base-uncased")


def test_an_empty_poisson_batch_gives_a_zero_per_example_gradient_and_a_noise_only_dp_step(task):
    """Opacus' Poisson sampler can draw an empty batch, which BERT's layers cannot take: the loss runs a
    dummy row whose per-example gradient is exactly zero, so the DP-SGD step adds noise and nothing else."""
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    from nlp_models.adapter_sentiment import per_example_loss

    model = GradSampleModule(task.new_model())
    trainable = [p for p in model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in trainable]
    optimizer = DPOptimizer(torch.optim.SGD(trainable, lr=0.5), noise_multiplier=0.0, max_grad_norm=1.0,
                            expected_batch_size=8)
    empty = [torch.zeros(0, 7, HIDDEN, dtype=torch.float16), torch.zeros(0, 7, dtype=torch.long),
             torch.zeros(0, dtype=torch.long)]
    loss = per_example_loss(model, empty)
    assert loss.shape == (0,)
    (loss.sum() / max(loss.shape[0], 1)).backward()
    assert all(p.grad_sample.shape[0] == 1 and not p.grad_sample.any() for p in trainable)
    optimizer.step()
    assert all(torch.equal(p.detach(), b) for p, b in zip(trainable, before))  # no noise: nothing moves
    # a real batch still trains
    optimizer.zero_grad()
    batch = task.clients[1].train.batch(torch.arange(4))
    per_example_loss(model, batch).mean().backward()
    optimizer.step()
    assert any(not torch.equal(p.detach(), b) for p, b in zip(trainable, before))
