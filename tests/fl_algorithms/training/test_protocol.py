"""The declared training protocol (fl_algorithms.training.protocol) and the trainers honouring it: the
optimiser's lifetime, the per-round schedule, clipping, and FedNLP's per-algorithm optimiser."""
import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from fl_algorithms.tasks.toy import toy_trainer
from fl_algorithms.training.loop import run_epochs
from fl_algorithms.training.protocol import (CITED, FEDERATED_NORM, FEDNLP, FRESH, KEPT, KEPT_ADAMW, PRESETS,
                                             OptimizerConfig, TrainingProtocol, fednlp_protocol, kept_protocol, preset)
from fl_algorithms.training.trainer import TorchTrainer

CITES = {aspect: f"why {aspect}" for aspect in CITED}


def _protocol(**changes) -> TrainingProtocol:
    fields = dict(name="test", optimizer=OptimizerConfig(name="sgd", lr=0.1), lifetime=FRESH,
                  lifetime_reason="a test", cite=CITES)
    return TrainingProtocol(**{**fields, **changes})


@pytest.mark.parametrize("changes, message", [
    (dict(lifetime="forever"), "lifetime must be one of"),
    (dict(lifetime_reason="  "), "lifetime_reason must say why"),
    (dict(schedule="cosine"), "schedule must be one of"),
    (dict(warmup_fraction=1.0), r"warmup_fraction must be in \[0, 1\)"),
    (dict(warmup_steps=-1), "warmup_steps must be non-negative"),
    (dict(warmup_fraction=0.1, warmup_steps=3), "not both"),
    (dict(max_grad_norm=0.0), "max_grad_norm must be a positive number or None"),
    (dict(local_epochs=None), "exactly one of local_epochs and local_steps"),
    (dict(local_steps=5), "exactly one of local_epochs and local_steps"),
    (dict(local_epochs=0), "must be at least 1"),
    (dict(evaluation="whenever"), "evaluation must be one of"),
    (dict(selection="best test round"), "selection must be one of"),
    (dict(precision="int8"), "precision must be one of"),
    (dict(cite={k: v for k, v in CITES.items() if k != "clipping"}), r"missing \['clipping'\]"),
    (dict(cite={**CITES, "clipping": " "}), r"missing \['clipping'\]"),
    (dict(cite={**CITES, "colour": "blue"}), r"unknown \['colour'\]"),
    (dict(name=""), "needs a name"),
])
def test_the_protocol_refuses_bad_fields_with_a_clear_error(changes, message):
    with pytest.raises(ValueError, match=message):
        _protocol(**changes)


@pytest.mark.parametrize("kwargs, message", [
    (dict(name="lamb"), "unknown optimizer 'lamb'"),
    (dict(lr=0.0), "lr must be a positive number"),
    (dict(name="adamw", momentum=0.9), "momentum is an SGD argument"),
    (dict(betas=(0.9, 1.0)), "betas must be two numbers"),
    (dict(weight_decay=-1.0), "weight_decay must be non-negative"),
])
def test_the_optimizer_config_refuses_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        OptimizerConfig(**kwargs)


def test_construction_is_keyword_only_and_the_protocol_is_frozen():
    with pytest.raises(TypeError, match="positional"):
        TrainingProtocol("x")  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign"):
        _protocol().lifetime = KEPT  # type: ignore[misc]


def test_fednlp_preset_gives_sgd_for_fedavg_and_fedprox_and_adamw_for_fedopt():
    made = {a: FEDNLP.for_algorithm(a, lr=1e-2) for a in ("fedavg", "fedprox", "fedopt")}
    assert [made[a].optimizer.name for a in ("fedavg", "fedprox", "fedopt")] == ["sgd", "sgd", "adamw"]
    for p in made.values():
        assert p.optimizer.lr == 1e-2 and p.optimizer.weight_decay == 0 and p.optimizer.momentum == 0
        assert p.lifetime == FRESH and p.fresh and p.schedule == "linear" and p.warmup_fraction == 0.06
        assert p.max_grad_norm == 1.0 and p.local_epochs == 1 and p.precision == "fp32"
        assert "tc_transformer_trainer.py" in p.cite["optimizer"] and "Sec. 2.2" in p.cite["optimizer"]
    assert made["fedopt"].optimizer.eps == 1e-8
    assert fednlp_protocol("fedavg", lr=1e-2) == made["fedavg"] and preset("fednlp") is FEDNLP


def test_the_other_presets_and_an_unknown_name():
    norm, kept = FEDERATED_NORM.for_algorithm("fedavg", lr=3e-3), KEPT_ADAMW.for_algorithm("fedopt", lr=3e-3)
    assert (norm.optimizer.name, norm.lifetime, norm.schedule, norm.max_grad_norm) == ("adamw", FRESH, "constant", None)
    assert (kept.optimizer.name, kept.lifetime, kept.scheduled, kept.max_grad_norm) == ("adamw", KEPT, False, None)
    assert set(PRESETS) == {"fednlp", "federated-norm", "kept-adamw"}
    with pytest.raises(ValueError, match="unknown training protocol 'sgd'; choose from fednlp"):
        preset("sgd")


def test_describe_is_one_line_and_to_dict_round_trips_through_json():
    p = FEDNLP.for_algorithm("fedopt", lr=1e-2, local_epochs=2)
    line = p.describe()
    assert "\n" not in line and line.startswith("protocol=fednlp optimizer=adamw(lr=0.01) fresh-each-round")
    assert "schedule=linear warmup=6%" in line and "clip=1 epochs=2" in line and line.endswith("fp32")
    record = json.loads(json.dumps(p.to_dict()))
    assert record["optimizer"]["betas"] == [0.9, 0.999] and set(record["cite"]) == set(CITED)
    assert TrainingProtocol.from_dict(record) == p and len({p, TrainingProtocol.from_dict(record)}) == 1


class StepLog:
    """Per optimiser step: the optimiser, whether its state was empty, and each group's lr."""

    def __init__(self) -> None:
        self.steps: list[tuple[torch.optim.Optimizer, bool, float]] = []

    def __enter__(self) -> "StepLog":
        def hook(optimizer, args, kwargs):
            self.steps.append((optimizer, len(optimizer.state) == 0, optimizer.param_groups[0]["lr"]))
        self.handle = register_optimizer_step_pre_hook(hook)
        return self

    def __exit__(self, *exc) -> None:
        self.handle.remove()


def _toy(protocol: TrainingProtocol) -> TorchTrainer:
    trainer = toy_trainer(1)
    trainer.protocol = protocol
    return trainer


@pytest.mark.parametrize("name", ["adamw", "sgd"])
@pytest.mark.parametrize("lifetime", [FRESH, KEPT])
def test_a_fresh_optimiser_is_rebuilt_every_round_and_a_kept_one_is_not(name, lifetime):
    opt = OptimizerConfig(name=name, lr=0.05, **({"momentum": 0.9} if name == "sgd" else {}))
    trainer = _toy(_protocol(optimizer=opt, lifetime=lifetime))
    with StepLog() as log:
        for _ in range(2):
            trainer.train(epochs=1)  # each call is one round's local run (3 batches)
    assert len(log.steps) == 6
    first, second = log.steps[0], log.steps[3]  # the first step of each round
    assert first[1]  # a new client starts empty either way
    if lifetime == FRESH:
        # no AdamW exp_avg / SGD momentum buffer at the start of round 2: a new optimiser
        assert second[1] and second[0] is not first[0]
    else:
        assert not second[1] and second[0] is first[0]  # round 1's state carries into round 2
    state = next(iter(trainer._optimizer.state.values()))
    if name == "adamw":
        assert int(state["step"]) == (3 if lifetime == FRESH else 6)
    else:
        assert "momentum_buffer" in state
    # a fresh optimiser is no client state between rounds; a kept one is checkpointed
    assert (trainer.state_dict()["optimizer"] is None) == (lifetime == FRESH)


def test_the_schedule_starts_each_round_at_the_warmup_start_and_decays_linearly():
    protocol = _protocol(schedule="linear", warmup_steps=2)
    trainer = _toy(protocol)
    with StepLog() as log:
        trainer.train(epochs=2)  # 6 steps: warmup 2, then decay to 0 at step 6
        trainer.train(epochs=2)
    lrs = [lr for _, _, lr in log.steps]
    expected = [0.0, 0.05, 0.1, 0.1 * 3 / 4, 0.1 * 2 / 4, 0.1 * 1 / 4]
    np.testing.assert_allclose(lrs, expected + expected)  # the schedule restarts every round
    assert lrs[0] == protocol.lr_at(0, 6) == 0.0  # the warmup's start at the round's first step
    fraction = _protocol(schedule="linear", warmup_fraction=0.06)
    assert fraction.warmup_for(30) == 2 and fraction.warmup_for(5) == 1  # ceil, as FedNLP's trainer
    assert _protocol(schedule="linear").lr_at(0, 6) == 0.1  # no warmup: the base lr at once
    assert _protocol(warmup_steps=2).lr_factor(5, 6) == 1.0  # constant after the warmup


def test_clipping_bounds_a_huge_gradients_step():
    def step_size(max_grad_norm):
        w = torch.nn.Parameter(torch.zeros(4))
        opt = torch.optim.SGD([w], lr=1.0)
        run_epochs(batches=lambda: [None], loss=lambda _: 1e6 * w.sum(), optimizer=opt, epochs=1,
                   protocol=_protocol(max_grad_norm=max_grad_norm))
        return float(w.detach().norm())
    assert step_size(None) == pytest.approx(2e6)  # |grad| = 1e6 per coordinate, 4 coordinates
    assert step_size(1.0) == pytest.approx(1.0, rel=1e-5)  # lr x max norm


def test_local_steps_cycle_the_batches_until_the_budget_is_spent():
    w = torch.nn.Parameter(torch.zeros(1))
    calls = []

    def batches():
        calls.append(1)
        return [None, None, None]
    out = run_epochs(batches=batches, loss=lambda _: (w - 1).pow(2).sum(), optimizer=torch.optim.SGD([w], lr=0.1),
                     epochs=1, protocol=_protocol(local_epochs=None, local_steps=7))
    assert out["steps"] == 7.0 and len(calls) == 3


def test_a_trainer_given_only_an_optimizer_keeps_it_as_before():
    trainer = toy_trainer(2)
    assert trainer.protocol == kept_protocol(OptimizerConfig(name="sgd", lr=0.05))
    assert trainer.protocol.lifetime == KEPT and not trainer.protocol.scheduled
    assert trainer.protocol.max_grad_norm is None
    assert trainer.optimizer_config == OptimizerConfig(name="sgd", lr=0.05)
    assert math.isclose(trainer.protocol.lr_at(0, 3), 0.05)
