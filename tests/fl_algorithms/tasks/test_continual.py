"""Continual task sequences from the offline corpora: non-IID, deterministic, no document held twice."""
from __future__ import annotations

import numpy as np
import pytest

from fl_algorithms.tasks.continual import (POOL_NAMES, ContinualSettings, assign_tasks, build_tasks, encode,
                                           task_examples, task_statistics)
from nlp_models.backbone import load_tokenizer


@pytest.fixture(scope="module")
def settings():
    return ContinualSettings(clients=4, tasks_per_client=5, max_train=40, max_test=20)


@pytest.fixture(scope="module")
def tasks(settings):
    return build_tasks(settings)


def test_sequences_are_distinct_seeded_and_non_iid(settings):
    sequences = assign_tasks(settings)
    assert sorted(sequences) == [1, 2, 3, 4]
    assert all(len(set(s)) == 5 and set(s) <= set(POOL_NAMES) for s in sequences.values())
    assert len({s for s in sequences.values()}) == 4                  # clients hold different sequences
    assert assign_tasks(settings) == sequences
    assert assign_tasks(ContinualSettings(clients=4, seed=1)) != sequences


def test_shared_tasks_are_split_without_overlap(tasks):
    holders: dict[str, list] = {}
    for client, sequence in tasks.items():
        for task in sequence:
            holders.setdefault(task.name, []).append(task)
    shared = [name for name, held in holders.items() if len(held) > 1]
    assert shared, "the fixture should have a task drawn by two clients"
    for name in shared:
        texts = [set(t.train_texts) | set(t.test_texts) for t in holders[name]]
        for i in range(len(texts)):
            for j in range(i + 1, len(texts)):
                assert not texts[i] & texts[j], f"{name}: two clients hold the same document"


def test_caps_balance_and_train_test_disjoint(tasks, settings):
    for sequence in tasks.values():
        for task in sequence:
            assert 0 < len(task.train_texts) <= settings.max_train and 0 < len(task.test_texts) <= settings.max_test
            assert set(np.unique(task.train_labels)) == {0, 1} and set(np.unique(task.test_labels)) == {0, 1}
            assert abs(task.train_labels.mean() - 0.5) <= 0.1        # alternating classes while both last
            assert not set(task.train_texts) & set(task.test_texts)
            assert task.num_classes == 2


def test_pool_tasks_are_what_they_say():
    texts, labels, names = task_examples("bbc_business_tech")
    assert names == ("business", "tech") and 800 < len(texts) <= 510 + 401 and len(set(texts)) == len(texts)
    texts, labels, names = task_examples("tweets_person")
    assert names == ("no person", "person") and len(texts) <= 2 * 345 and abs(labels.mean() - 0.5) < 0.02
    texts, labels, names = task_examples("debates_party")
    assert set(labels) == {0, 1} and 700 < len(texts) <= 802 and len(set(texts)) == len(texts)


def test_statistics_and_encoding(tasks):
    rows = task_statistics(tasks)
    assert len(rows) == 20 and {r["position"] for r in rows} == set(range(5))
    task = tasks[1][0]
    split = encode(load_tokenizer(), task.train_texts, task.train_labels, max_length=16)
    assert tuple(split.input_ids.shape) == (len(task.train_texts), 16) and len(split) == len(task.train_texts)
    assert split.attention_mask.sum(1).min() >= 3


@pytest.mark.parametrize("bad", [dict(clients=1), dict(tasks_per_client=11), dict(pool=("nope",)),
                                 dict(max_train=2), dict(max_length=3), dict(seed=-1),
                                 dict(pool=("rt_polarity", "rt_polarity"))])
def test_settings_validation(bad):
    with pytest.raises(ValueError):
        ContinualSettings(**bad)
