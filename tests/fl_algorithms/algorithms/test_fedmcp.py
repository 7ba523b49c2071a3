import numpy as np
import pytest
import torch
from torch.nn import functional as F

from fl_algorithms.api import ClientContext
from fl_algorithms.algorithms.fedmcp import (GLOBAL, GLOBAL_PART, HEAD_FULL, HEAD_GLOBAL, PRIVATE, REFERENCE, FedMCP,
                                  contrastive_loss, fedmcp_objective)
from fl_algorithms.engine.secure_sum import SecureAggregationConfig, SecureAggregator
from fl_algorithms.training.trainer import flatten, unflatten_
from nlp_models.losses import linear_cka
from tests.fl_algorithms.algorithms.toy_adapters import ToyAdapterModel as _Toy


def ToyAdapterModel(*, seed: int = 0):
    """FedMCP's three adapter sets (the reference one frozen) and its two heads."""
    return _Toy(sets=(GLOBAL, PRIVATE, REFERENCE), frozen=(REFERENCE,), heads=(HEAD_FULL, HEAD_GLOBAL), seed=seed)


class ToyFedMCPTrainer:
    def __init__(self, *, seed: int, n: int):
        self.model = ToyAdapterModel(seed=0)  # same initial adapters everywhere
        g = torch.Generator().manual_seed(seed)
        self.x, self.y = torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)
        self.num_examples = n
        params = [p for s in (GLOBAL, PRIVATE) for p in self.model.adapters[s].parameters()]
        self.optimizer = torch.optim.SGD(params + list(self.model.heads.parameters()), lr=0.5)

    def _set(self, name):
        return list(self.model.adapters[name].parameters())

    def get_shared(self):
        return {GLOBAL_PART: flatten(self._set(GLOBAL))}

    def set_shared(self, params):
        unflatten_(self._set(GLOBAL), params[GLOBAL_PART])

    def load_adapter_set(self, name, vector):
        unflatten_(self._set(name), vector)

    def fit(self, *, epochs, objective, round=None):
        for _ in range(epochs):
            for i in range(0, self.num_examples, 8):
                self.optimizer.zero_grad()
                objective(self.model, {"x": self.x[i:i + 8], "y": self.y[i:i + 8]}).total().backward()
                self.optimizer.step()
        return {"steps": 1.0}

    def private_state(self):
        return {k: v.clone() for k, v in self.model.state_dict().items()
                if k.startswith(("heads.", f"adapters.{PRIVATE}."))}


def _batch(n=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(n, 6, generator=g), "y": torch.randint(0, 3, (n,), generator=g)}


@pytest.mark.parametrize("gamma,mu", [(0.5, 0.05), (0.0, 0.2), (1.0, 0.0), (0.3, 1.0)])
def test_loss_is_eq_8_with_gamma_and_mu(gamma, mu):
    model, batch = ToyAdapterModel(), _batch()
    with torch.no_grad():  # make the reference (averaged) adapter differ from the local global one
        for p in model.adapters[REFERENCE].parameters():
            p.add_(0.3)
    terms = fedmcp_objective(model, batch, gamma=gamma, mu=mu)
    y = batch["y"]
    z1 = model.represent(batch, mixing={GLOBAL: 0.5, PRIVATE: 0.5})
    x = model.represent(batch, mixing={GLOBAL: 1.0})
    loss_a = F.cross_entropy(model.classify(HEAD_FULL, z1), y)
    loss_b = F.cross_entropy(model.classify(HEAD_GLOBAL, x), y)
    loss_c = linear_cka(x, model.represent(batch, mixing={PRIVATE: 1.0})) - linear_cka(
        x, model.represent(batch, mixing={REFERENCE: 1.0}))
    expected = (1 - gamma) * loss_a + gamma * loss_b + mu * loss_c
    assert float(terms.total().detach()) == pytest.approx(float(expected.detach()), rel=1e-5, abs=1e-6)
    assert terms.parts["loss_a"] == pytest.approx(float(loss_a.detach()), rel=1e-5)
    assert terms.parts["loss_b"] == pytest.approx(float(loss_b.detach()), rel=1e-5)
    if mu:
        assert terms.parts["loss_c"] == pytest.approx(float(loss_c.detach()), rel=1e-4, abs=1e-6)
    assert terms.per_example.shape == (10,)


def test_averaged_adapter_gets_no_gradient_and_mu_zero_skips_the_extra_passes():
    model, batch = ToyAdapterModel(), _batch()
    model.adapters[REFERENCE].requires_grad_(True)  # even if trainable, Z is computed under no_grad
    fedmcp_objective(model, batch, gamma=0.5, mu=0.05).total().backward()
    assert all(p.grad is None for p in model.adapters[REFERENCE].parameters())
    assert all(p.grad is not None for s in (GLOBAL, PRIVATE) for p in model.adapters[s].parameters())
    assert all(p.grad is not None for p in model.heads.parameters())
    model.calls.clear()
    terms = fedmcp_objective(model, batch, gamma=0.5, mu=0.0)
    assert terms.batch is None
    assert model.calls == [{GLOBAL: 0.5, PRIVATE: 0.5}, {GLOBAL: 1.0}]


def test_eq_5_reading_pushes_global_from_private_and_pulls_it_to_the_average():
    g = torch.Generator().manual_seed(1)
    x, other = torch.randn(16, 5, generator=g), torch.randn(16, 5, generator=g)
    # global == private and far from the average: the worst case; global == average, far from private: the best
    assert float(contrastive_loss(x, x, other)) > 0.5
    assert float(contrastive_loss(x, other, x)) < -0.5


def _round(trainers, algorithm, state, round_id=1):
    broadcast = algorithm.configure_round(round=round_id, state=state)
    uploads = {}
    for cid, trainer in trainers.items():
        uploads[cid], _ = algorithm.client_update(
            broadcast=broadcast, client=ClientContext(client_id=cid, state={}, trainer=trainer, round=round_id))
    return broadcast, uploads


def test_client_uploads_only_the_global_adapter_and_loads_the_reference():
    trainer = ToyFedMCPTrainer(seed=1, n=16)
    algorithm = FedMCP()
    state = algorithm.init_state(initial=trainer.get_shared())
    before = trainer.get_shared()[GLOBAL_PART]
    broadcast, uploads = _round({1: trainer}, algorithm, state)
    upload = uploads[1]
    assert set(upload.masked) == {GLOBAL_PART}
    assert len(upload.masked[GLOBAL_PART]) == before.size == 8 * 8 + 8
    assert upload.masked[GLOBAL_PART].weight == 16
    assert not upload.released and not upload.sealed
    np.testing.assert_array_equal(flatten(trainer._set(REFERENCE)), broadcast[GLOBAL_PART])
    assert not np.allclose(trainer.get_shared()[GLOBAL_PART], before)  # it trained


@pytest.mark.parametrize("protocol", ["plain", "secagg+"])
def test_server_update_is_the_weighted_mean_of_global_deltas_and_private_parts_stay(protocol):
    trainers = {1: ToyFedMCPTrainer(seed=1, n=8), 2: ToyFedMCPTrainer(seed=2, n=24), 3: ToyFedMCPTrainer(seed=3, n=16)}
    algorithm = FedMCP()
    state = algorithm.init_state(initial=trainers[1].get_shared())
    broadcast, uploads = _round(trainers, algorithm, state)
    deltas = {c: t.get_shared()[GLOBAL_PART] - broadcast[GLOBAL_PART] for c, t in trainers.items()}
    private = {c: t.private_state() for c, t in trainers.items()}
    aggregator = SecureAggregator(SecureAggregationConfig(protocol=protocol, clip=4.0, max_weight=100, max_clients=3,
                                                          min_release_group=3))
    view = aggregator.aggregate(round=1, uploads=uploads)
    assert set(view.groups) == {GLOBAL_PART}
    new = algorithm.server_update(state=state, view=view)
    weights = {c: t.num_examples for c, t in trainers.items()}
    expected = broadcast[GLOBAL_PART] + sum(weights[c] * deltas[c] for c in trainers) / sum(weights.values())
    got = algorithm.shared_parameters(new)[GLOBAL_PART]
    np.testing.assert_allclose(got, expected, atol=view.groups[GLOBAL_PART].error_bound + 1e-6)
    assert not np.allclose(got, broadcast[GLOBAL_PART] + np.mean(list(deltas.values()), axis=0), atol=1e-4)
    for cid, trainer in trainers.items():  # the next broadcast replaces A_g only
        trainer.set_shared(algorithm.shared_parameters(new))
        for key, value in trainer.private_state().items():
            torch.testing.assert_close(value, private[cid][key])
        np.testing.assert_allclose(trainer.get_shared()[GLOBAL_PART], got, atol=1e-6)


def test_hyperparameters_and_parts_are_validated():
    with pytest.raises(ValueError, match="gamma"):
        FedMCP(gamma=1.5)
    with pytest.raises(ValueError, match="mu"):
        FedMCP(mu=-0.1)
    with pytest.raises(ValueError, match="exactly"):
        FedMCP().init_state(initial={GLOBAL_PART: np.zeros(3), "private": np.zeros(3)})
