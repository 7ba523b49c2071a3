"""Opacus DP-SGD per client: accountant persists across rounds, epsilon matches dp_accounting."""
import os

import dp_accounting
import pytest
import torch
from dp_accounting import rdp
from torch import nn
from torch.utils.data import TensorDataset

from dp.ledger import Ledger
from dp.opacus_client import DPSGDConfig, OpacusClient, StaleParametersError, fix_hf_batch, tied_parameters

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
DELTA = 1e-5


def tiny_task(n: int = 64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = (x[:, 0] > 0).long()
    return TensorDataset(x, y)


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


def ce_loss(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x), y, reduction="none")


def sgd(params):
    return torch.optim.SGD(params, lr=0.1)


def dp_accounting_epsilon(z: float, q: float, steps: int) -> float:
    acc = rdp.RdpAccountant()
    acc.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), steps))
    return acc.get_epsilon(DELTA)


def test_epsilon_grows_per_round_and_matches_dp_accounting():
    ledger = Ledger()
    client = OpacusClient(client_id=3, config=DPSGDConfig(noise_multiplier=1.1, batch_size=8, local_epochs=2,
                                                           delta=DELTA), ledger=ledger)
    model, data = mlp(), tiny_task()
    epsilons = []
    for r in range(3):
        report = client.train_round(model=model, optimizer_factory=sgd, dataset=data, loss_fn=ce_loss, round_id=r)
        assert report.steps == 16 and report.sample_rate == 1 / 8 and report.unmoved == ()
        epsilons.append(report.epsilon)
        assert report.epsilon == pytest.approx(dp_accounting_epsilon(1.1, 1 / 8, 16 * (r + 1)), rel=1e-12)
        # Opacus's own RDP accountant agrees (it uses its own order grid, hence the tolerance).
        assert report.opacus_epsilon == pytest.approx(report.epsilon, rel=0.03)
    assert epsilons == sorted(epsilons) and epsilons[0] < epsilons[-1]
    assert ledger.epsilon(3, unit="example", observer="outsider") == pytest.approx(epsilons[-1])
    assert not any(hasattr(p, "grad_sample") for p in model.parameters())  # hooks removed: plain module again


def test_state_dict_resumes_the_accountant():
    config = DPSGDConfig(noise_multiplier=1.0, batch_size=8)
    first = OpacusClient(client_id=1, config=config)
    model, data = mlp(), tiny_task()
    first.train_round(model=model, optimizer_factory=sgd, dataset=data, loss_fn=ce_loss, round_id=0)
    resumed = OpacusClient(client_id=1, config=config)
    resumed.load_state_dict(first.state_dict())
    assert resumed.epsilon() == pytest.approx(first.epsilon())
    resumed.train_round(model=model, optimizer_factory=sgd, dataset=data, loss_fn=ce_loss, round_id=1)
    assert resumed.epsilon() > first.epsilon()
    with pytest.raises(ValueError, match="state belongs to another client"):
        OpacusClient(client_id=2, config=config).load_state_dict(first.state_dict())


def test_target_epsilon_is_spread_over_the_planned_rounds():
    ledger = Ledger()
    config = DPSGDConfig(target_epsilon=3.0, planned_rounds=3, batch_size=8, delta=DELTA)
    client = OpacusClient(client_id=5, config=config, ledger=ledger)
    model, data = mlp(), tiny_task()
    reports = [client.train_round(model=model, optimizer_factory=sgd, dataset=data, loss_fn=ce_loss, round_id=r)
               for r in range(3)]
    assert len({r.noise_multiplier for r in reports}) == 1
    assert reports[0].epsilon < 3.0
    assert reports[-1].epsilon == pytest.approx(3.0, abs=0.02)


def test_parameters_that_never_move_are_reported():
    client = OpacusClient(client_id=1, config=DPSGDConfig(noise_multiplier=1.0, batch_size=8))
    with pytest.raises(StaleParametersError, match="820"):
        client.train_round(model=mlp(), optimizer_factory=lambda p: torch.optim.SGD(p, lr=0.0),
                           dataset=tiny_task(), loss_fn=ce_loss, round_id=0)


def test_ghost_clipping_with_tied_weights_is_refused():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.out = nn.Linear(4, 10, bias=False)
            self.out.weight = self.emb.weight

        def forward(self, x):
            return self.out(self.emb(x)).mean(1)

    model = Tied()
    assert tied_parameters(model) == [("emb.weight", "out.weight")]
    client = OpacusClient(client_id=1, config=DPSGDConfig(noise_multiplier=1.0, grad_sample_mode="ghost"))
    data = TensorDataset(torch.randint(0, 10, (32, 5)), torch.randint(0, 10, (32,)))
    with pytest.raises(ValueError, match="tied parameters.*hooks"):
        client.train_round(model=model, optimizer_factory=sgd, dataset=data, loss_fn=ce_loss, round_id=0)


def test_ghost_clipping_trains_an_untied_model():
    ledger = Ledger()
    client = OpacusClient(client_id=2, config=DPSGDConfig(noise_multiplier=1.0, grad_sample_mode="ghost",
                                                          batch_size=8), ledger=ledger)
    report = client.train_round(model=mlp(), optimizer_factory=sgd, dataset=tiny_task(), loss_fn=ce_loss, round_id=0)
    assert report.unmoved == () and report.epsilon == pytest.approx(dp_accounting_epsilon(1.0, 1 / 8, 8), rel=1e-12)


def test_hf_bert_trains_with_batch_sized_position_and_token_type_ids():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16, num_labels=2)
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config)
    ids = torch.randint(1, 40, (32, 8))
    labels = torch.randint(0, 2, (32,))
    data = [{"input_ids": i, "attention_mask": torch.ones(8, dtype=torch.long), "labels": l}
            for i, l in zip(ids, labels)]
    fixed = fix_hf_batch({"input_ids": ids[:4]}, model)
    assert fixed["position_ids"].shape == (4, 8) and fixed["position_ids"].is_contiguous()
    assert fixed["token_type_ids"].shape == (4, 8)

    def loss(m, batch):
        logits = m(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   position_ids=batch["position_ids"], token_type_ids=batch["token_type_ids"]).logits
        return nn.functional.cross_entropy(logits, batch["labels"], reduction="none")

    client = OpacusClient(client_id=9, config=DPSGDConfig(noise_multiplier=1.0, batch_size=8))
    report = client.train_round(model=model, optimizer_factory=sgd, dataset=data, loss_fn=loss, round_id=0)
    assert report.steps == 4 and report.unmoved == ()


def test_cached_epsilon_is_opacus_own_number():
    """OpacusClient.epsilon caches each (q, z)'s one-step RDP curve; the epsilon is Opacus's to the bit,
    whatever the history (several rates and multipliers, repeated entries)."""
    from dp.opacus_client import DPSGDConfig, OpacusClient

    client = OpacusClient(client_id=1, config=DPSGDConfig(noise_multiplier=1.1, delta=1e-5))
    assert client.epsilon() == 0.0
    client.accountant.history = [(1.1, 0.01, 40), (0.8, 0.05, 7), (1.1, 0.01, 3)]
    for _ in range(2):  # the second time from the cache
        assert client.epsilon() == client.accountant.get_epsilon(delta=1e-5) > 0
    client.accountant.history.append((2.0, 0.2, 1))
    assert client.epsilon() == client.accountant.get_epsilon(delta=1e-5)
