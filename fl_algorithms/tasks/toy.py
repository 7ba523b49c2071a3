"""A tiny deterministic federated task (softmax regression on Gaussian blobs with label skew).

Used by tests and by the deployment CLI's smoke run; each client builds only its own shard.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from fl_algorithms.algorithms.fedavg import FedAvg
from fl_algorithms.experiments.task import Task
from fl_algorithms.training.trainer import OptimizerConfig, TorchTrainer


class ToyModel(nn.Module):
    def __init__(self, d: int = 6, k: int = 3) -> None:
        super().__init__()
        self.body = nn.Linear(d, 8)
        self.head = nn.Linear(8, k)

    def forward(self, x):
        return self.head(torch.tanh(self.body(x)))


def _loss(model, batch):
    return nn.functional.cross_entropy(model(batch["x"]), batch["y"])


def _metric(model, batches):
    correct = total = 0
    for b in batches:
        correct += int((model(b["x"]).argmax(-1) == b["y"]).sum())
        total += len(b["y"])
    return {"accuracy": correct / max(total, 1)}


def toy_trainer(client_id: int, *, seed: int = 0, n: int = 60, lr: float = 0.05, private_head: bool = False) -> TorchTrainer:
    """Client `client_id`'s shard: label-skewed towards class client_id % 3; same initial model everywhere."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(3, 6, generator=g) * 2
    g.manual_seed(seed * 1000 + client_id)
    torch.manual_seed(seed)
    model = ToyModel()
    probs = torch.full((3,), 0.15)
    probs[client_id % 3] = 0.7
    y = torch.multinomial(probs, n, replacement=True, generator=g)
    x = centres[y] + torch.randn(n, 6, generator=g)
    yt = torch.multinomial(torch.full((3,), 1 / 3), 60, replacement=True, generator=g)
    xt = centres[yt] + torch.randn(60, 6, generator=g)
    shared = {"body": ["body.weight", "body.bias"]}
    if not private_head:
        shared["head"] = ["head.weight", "head.bias"]
    return TorchTrainer(
        model=model, shared=shared,
        train_batches=lambda: [{"x": x[i:i + 20], "y": y[i:i + 20]} for i in range(0, n, 20)],
        eval_batches={"test": lambda: [{"x": xt, "y": yt}]},
        num_examples=n, loss_fn=_loss, metric_fn=_metric, optimizer=OptimizerConfig(name="sgd", lr=lr),
    )


def build(options: Mapping[str, Any]) -> Task:
    seed = int(options.get("seed", 0))
    return Task(algorithm=FedAvg(local_epochs=1), make_trainer=lambda cid: toy_trainer(cid, seed=seed),
                initial=lambda: toy_trainer(1, seed=seed).get_shared())
