"""A tiny deterministic federated task: softmax regression on Gaussian blobs, per-client label skew."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fl_algorithms.trainer import OptimizerConfig, TorchTrainer


class Toy(nn.Module):
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


def make_trainers(n_clients: int = 4, *, seed: int = 0, n: int = 60, lr: float = 0.05, private_head: bool = False):
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(3, 6, generator=g) * 2
    trainers = {}
    for c in range(1, n_clients + 1):
        torch.manual_seed(seed)  # identical initial models on every client
        model = Toy()
        probs = torch.full((3,), 0.15)
        probs[c % 3] = 0.7
        y = torch.multinomial(probs, n, replacement=True, generator=g)
        x = centres[y] + torch.randn(n, 6, generator=g)
        yt = torch.multinomial(torch.full((3,), 1 / 3), 60, replacement=True, generator=g)
        xt = centres[yt] + torch.randn(60, 6, generator=g)
        shared = {"body": ["body.weight", "body.bias"]}
        if not private_head:
            shared["head"] = ["head.weight", "head.bias"]
        trainers[c] = TorchTrainer(
            model=model, shared=shared,
            train_batches=lambda x=x, y=y: [{"x": x[i:i + 20], "y": y[i:i + 20]} for i in range(0, len(y), 20)],
            eval_batches={"test": lambda x=xt, y=yt: [{"x": x, "y": y}]},
            num_examples=n, loss_fn=_loss, metric_fn=_metric, optimizer=OptimizerConfig(name="sgd", lr=lr),
        )
    return trainers


@pytest.fixture
def toy_trainers():
    return make_trainers
