"""Clients of the adapter sentiment task (`nlp_models.adapter_sentiment`), the twin of
`fl_algorithms.training.bag_trainer`: plain clients, Opacus DP-SGD clients, per-example losses for
membership inference, and shadow clients on the public movies.

Every client trains only its adapters and head over its own cached prefix (`CachedSplit`); the frozen
top-layer weights are the task backbone's own tensors, so 100 clients cost little memory. The
optimiser is the task's (`AdapterTaskConfig.optimizer`/`lr`): plain SGD at lr 0.3 by default, as the
bag clients use plain SGD (no state; measured to train better here than Adam in FedAvg with a
20-of-100 cohort). Batch order and head dropout are seeded by (seed, client, runs so far)
(`SeededTorchTrainer`). DP-SGD clients use the same optimiser and lr.
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
from nlp_models.adapter_sentiment import (AdapterClient, AdapterTask, mean_loss, metrics, per_example_loss,
                                          shadow_clients, shared_parts)
from nlp_models.frozen_prefix import CachedBatch, CachedSplit

EVAL_BATCH = 128


def optimizer_config(task: AdapterTask) -> OptimizerConfig:
    return OptimizerConfig(name=task.config.optimizer, lr=task.config.lr)


def training_protocol(task: AdapterTask) -> TrainingProtocol:
    """The clients' declared protocol outside DP-SGD: the task's optimiser, fresh each round (the federated
    norm; for the default plain SGD, which holds no state, the same computation as before)."""
    return fresh_protocol(optimizer_config(task), experiment="the privacy frontier")


def _eval_batches(split: CachedSplit) -> list[CachedBatch]:
    """Length-sorted batches (little padding); evaluation does not depend on the order."""
    return split.batches(EVAL_BATCH, order=torch.argsort(split.attention_mask.sum(dim=1), stable=True))


def sentiment_trainer(task: AdapterTask, *, client_id: int, data: AdapterClient | None = None,
                      seed: int | None = None) -> SeededTorchTrainer:
    """Client `client_id` on `data` (default: the task's client of that id), starting from `task.initial`;
    runs seeded by (`seed`, default the task's, client id, runs so far). Evaluation splits: 'test', 'train'."""
    data = task.clients[client_id] if data is None else data
    cfg, train = task.config, data.train
    model = task.new_model()
    evals = {name: (lambda s=split: _eval_batches(s)) for name, split in (("test", data.test), ("train", train))}
    trainer = SeededTorchTrainer(
        client_id=client_id, seed=cfg.seed if seed is None else seed, model=model, shared=shared_parts(model),
        train_batches=lambda: train.batches(cfg.batch_size, order=torch.randperm(len(train))),
        eval_batches=evals, num_examples=len(train), loss_fn=mean_loss, metric_fn=metrics,
        optimizer=optimizer_config(task), protocol=training_protocol(task))
    trainer.set_shared(task.initial)
    return trainer


def build_trainers(task: AdapterTask) -> dict[int, SeededTorchTrainer]:
    return {c: sentiment_trainer(task, client_id=c) for c in task.clients}


def calibrated_dpsgd_configs(task: AdapterTask, *, target_epsilon: float, delta: float, max_grad_norm: float,
                             local_epochs: int, planned_rounds: int,
                             grad_sample_mode: str = "hooks") -> dict[int, DPSGDConfig]:
    """Per-client DP-SGD configs at `target_epsilon` for a client in all `planned_rounds` rounds
    (`dp_trainer.calibrated_dpsgd_configs_for`). Hooks mode by default: per-sample gradients of ~26k
    adapter and head values are small."""
    return calibrated_dpsgd_configs_for({c: len(d.train) for c, d in task.clients.items()},
                                        batch_size=task.config.batch_size, target_epsilon=target_epsilon, delta=delta,
                                        max_grad_norm=max_grad_norm, local_epochs=local_epochs,
                                        planned_rounds=planned_rounds, grad_sample_mode=grad_sample_mode)


def build_dp_trainers(task: AdapterTask, *, dp_config: DPSGDConfig | Mapping[int, DPSGDConfig],
                      ledger: Ledger) -> dict[int, DPTorchTrainer]:
    """Opacus DP-SGD clients over the adapters and head (example-level DP; the task's optimiser;
    per-client accountants; Poisson batches from the cached prefix).

    `dp_config` is one config for all clients or one per client id (`calibrated_dpsgd_configs`).
    """
    out = {}
    for c, data in task.clients.items():
        config = dp_config[c] if isinstance(dp_config, Mapping) else dp_config
        model = task.new_model()
        evals = {name: (lambda s=split: _eval_batches(s))
                 for name, split in (("test", data.test), ("train", data.train))}
        trainer = DPTorchTrainer(
            dp_client=OpacusClient(client_id=c, config=config, ledger=ledger),
            train_dataset=data.train.dataset(), per_example_loss=per_example_loss, collate_fn=None,
            model=model, shared=shared_parts(model), train_batches=lambda: [], eval_batches=evals,
            num_examples=len(data.train), loss_fn=mean_loss, metric_fn=metrics, optimizer=optimizer_config(task),
            protocol=training_protocol(task))
        trainer.set_shared(task.initial)
        out[c] = trainer
    return out


def example_losses(task: AdapterTask, shared: Mapping[str, np.ndarray], *, split: str,
                   clients: Iterable[int] | None = None,
                   population: Mapping[int, AdapterClient] | None = None) -> np.ndarray:
    """Per-example loss of the model with parameters `shared` on the `split` ('train' or 'test') examples
    of `clients` (default all), client by client in id order and rows in stored order: the scores of
    the LOSS membership-inference attack. `population` defaults to the task's clients (pass
    `shadow_clients(...)` to score an attacker's shadow data)."""
    population = task.clients if population is None else population
    model = task.new_model()
    named = dict(model.named_parameters())
    for part, names in shared_parts(model).items():
        unflatten_([named[n] for n in names], np.asarray(shared[part]))
    model.eval()
    out = []
    with torch.inference_mode():
        for c in sorted(population if clients is None else set(clients)):
            data: CachedSplit = getattr(population[c], split)
            losses = torch.empty(len(data), dtype=torch.float64)
            order = torch.argsort(data.attention_mask.sum(dim=1).cpu(), stable=True)
            for index in order.split(EVAL_BATCH):
                losses[index] = per_example_loss(model, data.batch(index)).double().cpu()
            out.append(losses.numpy())
    return np.concatenate(out) if out else np.zeros(0)


def public_losses(task: AdapterTask, shared: Mapping[str, np.ndarray]) -> np.ndarray:
    """Per-example losses on the public movies (`task.public`: snippets no client holds): the known
    non-members a realistic membership attacker calibrates its threshold on."""
    public = task.public.examples
    if not len(public):
        raise ValueError("the task has no public split (AdapterTaskConfig.public_fraction = 0)")
    holder = AdapterClient(train=public, test=public, movies=task.public.movies, train_index=task.public.index,
                           test_index=task.public.index)
    return example_losses(task, shared, split="train", population={0: holder})


def shadow_trainers(task: AdapterTask, *, n_clients: int, examples_per_client: int,
                    seed: int) -> dict[int, SeededTorchTrainer]:
    """Trainers (ids 1..n) over `shadow_clients(task, ...)`: disjoint random subsets of the public
    movies' snippets, trained with the clients' recipe (model, initialisation, optimiser, batch size).
    The same arguments give the same data, so `shadow_clients` tells the attacker who holds what.

    Batch order is seeded by `seed` (not the task's), so shadows differ from the real clients' runs.
    """
    data = shadow_clients(task, n_clients=n_clients, examples_per_client=examples_per_client, seed=seed)
    return {c: sentiment_trainer(task, client_id=c, data=d, seed=seed) for c, d in data.items()}


__all__ = ["EVAL_BATCH", "optimizer_config", "sentiment_trainer", "build_trainers", "calibrated_dpsgd_configs",
           "build_dp_trainers", "example_losses", "public_losses", "shadow_trainers"]
