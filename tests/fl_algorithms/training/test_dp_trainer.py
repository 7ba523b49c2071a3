import math

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from dp.ledger import Ledger, LedgerConfig, Observer, PrivacyUnit
from dp.opacus_client import DPSGDConfig, OpacusClient
from fl_algorithms.training.dp_trainer import DPTorchTrainer
from fl_algorithms.algorithms.fedavg import FedAvg
from fl_algorithms.algorithms.fedprox import FedProx
from fl_algorithms.engine.sim import RunConfig, SimulationRunner
from fl_algorithms.engine.secure_sum import SecureAggregationConfig
from fl_algorithms.tasks.toy import ToyModel, _metric


def _dp_trainers(ledger, n_clients=3, n=64):
    trainers = {}
    for c in range(1, n_clients + 1):
        g = torch.Generator().manual_seed(c)
        torch.manual_seed(0)
        x = torch.randn(n, 6, generator=g)
        y = (x[:, 0] > 0).long()
        ds = TensorDataset(x, y)
        trainers[c] = DPTorchTrainer(
            dp_client=OpacusClient(client_id=c, config=DPSGDConfig(noise_multiplier=1.0, batch_size=16), ledger=ledger),
            train_dataset=ds,
            per_example_loss=lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1], reduction="none"),
            model=ToyModel(), shared={"all": ["body.weight", "body.bias", "head.weight", "head.bias"]},
            train_batches=lambda: [], eval_batches={"test": lambda x=x, y=y: [{"x": x, "y": y}]},
            num_examples=n, loss_fn=None, metric_fn=_metric)
    return trainers


def test_dp_fedavg_epsilon_grows_with_rounds_and_matches_the_ledger():
    ledger = Ledger(LedgerConfig(delta=1e-5))
    cfg = RunConfig(rounds=3, secure=SecureAggregationConfig(protocol="secagg+", clip=4.0, max_weight=100, max_clients=8, min_release_group=2))
    runner = SimulationRunner(algorithm=FedAvg(), trainers=_dp_trainers(ledger), config=cfg)
    history = runner.run(progress=False)
    for c in (1, 2, 3):
        eps = [r.metrics[c]["epsilon"] for r in history]
        assert all(e > 0 and math.isfinite(e) for e in eps)
        assert eps[0] < eps[1] < eps[2]
        assert eps[-1] == pytest.approx(ledger.epsilon(c, unit=PrivacyUnit.EXAMPLE, observer=Observer.SERVER))


def test_dp_with_fedprox_is_refused_clearly():
    ledger = Ledger(LedgerConfig(delta=1e-5))
    cfg = RunConfig(rounds=1, secure=SecureAggregationConfig(protocol="plain", clip=4.0, max_weight=100, max_clients=8, min_release_group=2))
    runner = SimulationRunner(algorithm=FedProx(mu=0.1), trainers=_dp_trainers(ledger, 2), config=cfg)
    with pytest.raises(NotImplementedError, match="proximal"):
        runner.run(progress=False)
