"""The one local training loop and per-call seeding (fl_algorithms.training.loop), and SeededTorchTrainer."""
from typing import NamedTuple

import numpy as np
import pytest
import torch
from torch import nn

from fl_algorithms.tasks.toy import toy_trainer
from fl_algorithms.training.loop import run_epochs, seeded, sequence_seed, tagged_seed
from fl_algorithms.training.trainer import SeededTorchTrainer


class Terms(NamedTuple):
    value: torch.Tensor
    parts: dict

    def total(self) -> torch.Tensor:
        return self.value


def _problem():
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    return model, [(x[:4], y[:4]), (x[4:], y[4:])]


def test_run_epochs_averages_loss_and_parts_over_steps_and_times_the_step():
    model, batches = _problem()
    calls = []

    def batches_fn():
        calls.append(1)
        return batches

    def loss(batch):
        value = ((model(batch[0]) - batch[1]) ** 2).mean()
        return Terms(value, {"half": 0.5})

    timer = {"backward": 0.0, "optimizer": 0.0}
    out = run_epochs(batches=batches_fn, loss=loss, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                     epochs=3, timer=timer)
    assert len(calls) == 3  # batches() once per epoch, so it may reshuffle
    assert out["steps"] == 6.0 and out["half"] == pytest.approx(0.5) and out["train_loss"] > 0
    assert list(out) == ["train_loss", "half", "steps"]
    assert timer["backward"] > 0 and timer["optimizer"] > 0


def test_run_epochs_adds_the_penalty_and_reports_nothing_for_no_steps():
    model, batches = _problem()
    anchor = [p.detach().clone() for p in model.parameters()]
    plain, tied = [nn.Linear(3, 1) for _ in range(2)]
    for m in (plain, tied):
        m.load_state_dict(model.state_dict())

    def fit(m, penalty):
        loss = lambda b: ((m(b[0]) - b[1]) ** 2).mean()  # noqa: E731
        return run_epochs(batches=lambda: batches, loss=loss, optimizer=torch.optim.SGD(m.parameters(), lr=0.1),
                          epochs=5, penalty=penalty)

    fit(plain, None)
    fit(tied, lambda: 2.0 * sum(((p - a) ** 2).sum() for p, a in zip(tied.parameters(), anchor)))
    drift = lambda m: sum(float((p.detach() - a).abs().sum()) for p, a in zip(m.parameters(), anchor))  # noqa: E731
    assert drift(tied) < drift(plain)
    empty = run_epochs(batches=lambda: [], loss=None, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), epochs=2)
    assert empty == {"train_loss": 0.0, "steps": 0.0}


def test_seeds_are_stable_and_seeded_restores_the_global_rng():
    assert sequence_seed(0, 1, 2) == int(np.random.SeedSequence([0, 1, 2]).generate_state(1)[0])
    assert tagged_seed(0, 1, 2, "fit") == tagged_seed(0, 1, 2, "fit") != tagged_seed(0, 1, 2, "body")
    assert 0 <= tagged_seed(7, "x") < 2**31
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    with seeded(11) as generator:
        inside = torch.rand(3)
        order = torch.randperm(5, generator=generator)
    torch.testing.assert_close(torch.rand(3), expected)  # the outer stream is untouched
    with seeded(11) as generator:
        torch.testing.assert_close(torch.rand(3), inside)
        assert torch.equal(torch.randperm(5, generator=generator), order)


def test_seeded_trainer_repeats_its_runs_and_checkpoints_its_counter():
    def trainer():
        base = toy_trainer(1)
        return SeededTorchTrainer(
            client_id=1, seed=3, model=base.model, shared={"body": ["body.weight", "body.bias"]},
            train_batches=lambda: [{"x": torch.randn(4, 6), "y": torch.randint(0, 3, (4,))}],  # global RNG
            eval_batches=base.eval_batches, num_examples=4, loss_fn=base.loss_fn, metric_fn=base.metric_fn)

    a, b = trainer(), trainer()
    a.train(epochs=1)
    state = a.state_dict()
    assert state["calls"] == 1
    b.load_state_dict(state)
    a.train(epochs=1)
    b.train(epochs=1)  # the same seeded batches after the restore
    np.testing.assert_array_equal(a.get_shared()["body"], b.get_shared()["body"])
