import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from fl_algorithms.api import ClientContext
from fl_algorithms.algorithms.fedrep import FedRep
from fl_algorithms.engine.sim import RunConfig, SimulationRunner
from fl_algorithms.engine.secure_sum import SecureAggregationConfig
from fl_algorithms.training.trainer import flatten, unflatten_


class ToyRepTrainer:
    """Body (shared representation) + head (personal); logs which phase ran and what it changed."""

    def __init__(self, client_id: int, *, n: int = 30):
        torch.manual_seed(0)
        self.body, self.head = nn.Linear(5, 6), nn.Linear(6, 3)
        g = torch.Generator().manual_seed(client_id)
        self.x = torch.randn(n, 5, generator=g)
        self.y = (self.x[:, 0] > 0).long() + (client_id % 2)  # client-specific label map
        self.num_examples = n
        self.log: list[tuple[str, int, bool, bool]] = []

    def _loss(self):
        return F.cross_entropy(self.head(torch.tanh(self.body(self.x))), self.y)

    def _phase(self, name: str, params, epochs: int):
        body0, head0 = flatten(list(self.body.parameters())), flatten(list(self.head.parameters()))
        optimizer = torch.optim.SGD(params, lr=0.3)
        for _ in range(epochs):
            optimizer.zero_grad()
            self._loss().backward()
            optimizer.step()
        body_moved = not np.array_equal(body0, flatten(list(self.body.parameters())))
        head_moved = not np.array_equal(head0, flatten(list(self.head.parameters())))
        self.log.append((name, epochs, body_moved, head_moved))
        return {"loss": float(self._loss().detach())}

    def train_head(self, *, epochs, round=None):
        return self._phase("head", list(self.head.parameters()), epochs)

    def train_body(self, *, epochs, round=None):
        return self._phase("body", list(self.body.parameters()), epochs)

    def train(self, *, epochs, proximal=None, mu=0.0, round=None):
        raise AssertionError("FedRep trains head and body separately")

    def get_shared(self):
        return {"body": flatten(list(self.body.parameters()))}

    def set_shared(self, params):
        unflatten_(list(self.body.parameters()), params["body"])

    def evaluate(self, *, split="test"):
        with torch.no_grad():
            pred = self.head(torch.tanh(self.body(self.x))).argmax(-1)
        return {"accuracy": float((pred == self.y).float().mean())}

    def state_dict(self):
        return {"body": self.body.state_dict(), "head": self.head.state_dict()}

    def load_state_dict(self, state):
        self.body.load_state_dict(state["body"])
        self.head.load_state_dict(state["head"])


def test_head_is_trained_first_with_the_body_frozen_then_the_body_with_the_head_frozen():
    trainer = ToyRepTrainer(1)
    algorithm = FedRep(head_epochs=4, body_epochs=2)
    state = algorithm.init_state(initial=trainer.get_shared())
    broadcast = algorithm.configure_round(round=1, state=state)
    upload, _ = algorithm.client_update(broadcast=broadcast,
                                        client=ClientContext(client_id=1, state={}, trainer=trainer, round=1))
    assert trainer.log == [("head", 4, False, True), ("body", 2, True, False)]
    assert set(upload.masked) == {"body"}  # the head never leaves the client
    assert upload.masked["body"].weight == 30
    assert {"head_loss", "body_loss"} <= set(upload.metrics)


def test_runs_under_secure_aggregation_and_keeps_personal_heads():
    trainers = {c: ToyRepTrainer(c) for c in (1, 2, 3)}
    runner = SimulationRunner(algorithm=FedRep(head_epochs=3), trainers=trainers,
                              config=RunConfig(rounds=3, secure=SecureAggregationConfig(protocol="secagg+", clip=4.0,
                                                                                         max_weight=100, max_clients=3,
                                                                                         min_release_group=3)))
    history = runner.run(progress=False)
    bodies = {c: t.get_shared()["body"] for c, t in trainers.items()}
    np.testing.assert_allclose(bodies[1], bodies[2], atol=1e-6)  # the representation is shared
    np.testing.assert_allclose(bodies[1], runner.algorithm.shared_parameters(runner.state)["body"], atol=1e-6)
    assert not torch.allclose(trainers[1].head.weight, trainers[2].head.weight)  # heads are personal
    assert history[-1].mean("accuracy") > 0.6


def test_epochs_are_validated():
    with pytest.raises(ValueError, match="head_epochs and body_epochs must be at least 1"):
        FedRep(head_epochs=0)
    with pytest.raises(ValueError, match="head_epochs and body_epochs must be at least 1"):
        FedRep(body_epochs=0)
