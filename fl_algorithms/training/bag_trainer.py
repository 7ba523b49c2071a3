"""Clients of the bag-of-tokens task (`nlp_models.bag_of_tokens`): plain-SGD clients, Opacus DP-SGD
clients, and the per-example losses that membership inference reads off a final model.

Plain SGD (no momentum, no weight decay) keeps a client's embedding update supported exactly on its
training tokens: the attacker's best case, which the leakage measurements are about.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import torch

from dp.ledger import Ledger
from dp.opacus_client import DPSGDConfig, OpacusClient
from fl_algorithms.training.dp_trainer import DPTorchTrainer, calibrated_dpsgd_configs_for
from fl_algorithms.training.protocol import TrainingProtocol, fresh_protocol
from fl_algorithms.training.trainer import OptimizerConfig, SeededTorchTrainer, unflatten_
from nlp_models.bag_of_tokens import (SHARED_PARTS, BagClient, BagTask, ExampleDataset, Examples, collate, mean_loss,
                                      metrics, per_example_loss)

EVAL_BATCH = 256
SHADOW_ID_BASE = 1_000_000


def training_protocol(task: BagTask) -> TrainingProtocol:
    """The clients' declared protocol outside DP-SGD: plain SGD at the task's lr, fresh each round (the
    federated norm; SGD without momentum holds no state, so this is what every earlier run computed)."""
    return fresh_protocol(OptimizerConfig(name="sgd", lr=task.config.lr), experiment="the privacy frontier")


def bag_trainer(task: BagTask, *, client_id: int, data: BagClient | None = None) -> SeededTorchTrainer:
    """Client `client_id` (or a shadow client on `data`): SGD at the task's lr, batch order seeded by
    (seed, client, runs so far)."""
    data, cfg = data or task.clients[client_id], task.config
    train, test, bs = data.train, data.test, cfg.batch_size
    trainer = SeededTorchTrainer(
        client_id=client_id, seed=cfg.seed, model=task.new_model(), shared=SHARED_PARTS,
        train_batches=lambda: train.batches(bs, order=torch.randperm(len(train)).tolist()),
        eval_batches={"test": lambda: test.batches(EVAL_BATCH)}, num_examples=len(train),
        loss_fn=mean_loss, metric_fn=metrics, optimizer=OptimizerConfig(name="sgd", lr=cfg.lr),
        protocol=training_protocol(task))
    trainer.set_shared(task.initial)
    return trainer


def shadow_clients(task: BagTask, *, n_clients: int, examples_per_client: int, seed: int) -> dict[int, BagClient]:
    """Disjoint random subsets of the public split: the clients an attacker can simulate (it knows their
    tokens). Ids start at SHADOW_ID_BASE so they never collide with real clients (1..num_clients)."""
    if task.public is None:
        raise ValueError("the task has no public split (BagTaskConfig.public_fraction = 0)")
    if n_clients < 1 or examples_per_client < 1:
        raise ValueError("need at least one shadow client of at least one example")
    if n_clients * examples_per_client > len(task.public):
        raise ValueError(f"{n_clients} x {examples_per_client} shadow examples exceed the {len(task.public)} public ones")
    order = np.random.default_rng(np.random.SeedSequence([seed, 0x5AD0])).permutation(len(task.public))
    out = {}
    for j in range(n_clients):
        rows = order[j * examples_per_client:(j + 1) * examples_per_client]
        part = Examples(tuple(task.public.ids[i] for i in rows), task.public.labels[rows])
        out[SHADOW_ID_BASE + j] = BagClient(train=part, test=part, movies=0)
    return out


def build_trainers(task: BagTask) -> dict[int, SeededTorchTrainer]:
    return {c: bag_trainer(task, client_id=c) for c in task.clients}


def calibrated_dpsgd_configs(task: BagTask, *, target_epsilon: float, delta: float, max_grad_norm: float,
                             local_epochs: int, planned_rounds: int,
                             clients: Mapping[int, BagClient] | None = None) -> dict[int, DPSGDConfig]:
    """Per-client DP-SGD configs at `target_epsilon` for a client in all `planned_rounds` rounds
    (`dp_trainer.calibrated_dpsgd_configs_for`; `clients` default the task's). Ghost clipping:
    per-sample gradients of a V x D embedding would be costly."""
    return calibrated_dpsgd_configs_for({c: len(d.train) for c, d in (task.clients if clients is None else clients).items()},
                                        batch_size=task.config.batch_size, target_epsilon=target_epsilon, delta=delta,
                                        max_grad_norm=max_grad_norm, local_epochs=local_epochs,
                                        planned_rounds=planned_rounds, grad_sample_mode="ghost")


def build_dp_trainers(task: BagTask, *, dp_config: DPSGDConfig | Mapping[int, DPSGDConfig],
                      ledger: Ledger, clients: Mapping[int, BagClient] | None = None) -> dict[int, DPTorchTrainer]:
    """Opacus DP-SGD clients (example-level DP; SGD with the task's lr; per-client accountants).

    `dp_config` is one config for all clients or one per client id (`calibrated_dpsgd_configs`);
    `clients` (default the task's) may be shadow clients (`shadow_clients`).
    """
    out = {}
    for c, data in (task.clients if clients is None else clients).items():
        test = data.test
        config = dp_config[c] if isinstance(dp_config, Mapping) else dp_config
        trainer = DPTorchTrainer(
            dp_client=OpacusClient(client_id=c, config=config, ledger=ledger),
            train_dataset=ExampleDataset(data.train), per_example_loss=per_example_loss, collate_fn=collate,
            model=task.new_model(), shared=SHARED_PARTS, train_batches=lambda: [],
            eval_batches={"test": lambda t=test: t.batches(EVAL_BATCH)}, num_examples=len(data.train),
            loss_fn=mean_loss, metric_fn=metrics, optimizer=OptimizerConfig(name="sgd", lr=task.config.lr),
            protocol=training_protocol(task))
        trainer.set_shared(task.initial)
        out[c] = trainer
    return out


def example_losses(task: BagTask, shared: Mapping[str, np.ndarray], *, split: str,
                   clients: Iterable[int] | None = None, population: Mapping[int, BagClient] | None = None) -> np.ndarray:
    """Per-example loss of the model with parameters `shared` on the `split` examples of `clients`
    (default all) of `population` (default the task's clients): the scores of the LOSS
    membership-inference attack."""
    population = task.clients if population is None else population
    model = task.new_model()
    named = dict(model.named_parameters())
    for part, names in SHARED_PARTS.items():
        unflatten_([named[n] for n in names], np.asarray(shared[part]))
    model.eval()
    out = []
    with torch.inference_mode():
        for c in sorted(population if clients is None else set(clients)):
            examples = getattr(population[c], split)
            for b in examples.batches(512):
                out.append(per_example_loss(model, b).double().numpy())
    return np.concatenate(out) if out else np.zeros(0)


def public_losses(task: BagTask, shared: Mapping[str, np.ndarray]) -> np.ndarray:
    """Per-example losses on the public split (`task.public`: examples no client holds): the known
    non-members a realistic membership attacker calibrates its threshold on."""
    if task.public is None or not len(task.public):
        raise ValueError("the task has no public split (BagTaskConfig.public_fraction = 0)")
    return example_losses(task, shared, split="train", population={0: BagClient(task.public, task.public, 0)})


__all__ = ["bag_trainer", "shadow_clients", "build_trainers", "calibrated_dpsgd_configs", "build_dp_trainers",
           "example_losses", "public_losses"]
