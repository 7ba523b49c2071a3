"""FedSeIT's continual client builds its optimiser through a declared `TrainingProtocol`: the default
(`fedseit_protocol`) cites every aspect and trains bit for bit as the Adam the trainer built itself
before; a fresh lifetime rebuilds at every local run, a kept one once per task; the protocol's
optimiser, schedule and clipping are the ones used."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from fl_algorithms.tasks.continual import TaskData
from fl_algorithms.training.continual_trainer import (BASE_PART, ContinualTrainer, ContinualTrainerConfig,
                                                      fedseit_protocol)
from fl_algorithms.training.protocol import CITED, FRESH, KEPT, OptimizerConfig, TrainingProtocol, kept_protocol
from nlp_models.backbone import load_tokenizer
from nlp_models.decomposed_cnn import DecomposedConfig

DIM = 16


def _task(name: str, seed: int) -> TaskData:
    rng = np.random.default_rng(seed)
    words = ("good great fine lovely", "bad awful poor dreadful")

    def docs(n: int) -> tuple[tuple[str, ...], np.ndarray]:
        labels = np.arange(n) % 2
        return tuple(" ".join(rng.choice(words[y].split(), 6)) + f" doc {i}" for i, y in enumerate(labels)), labels

    train, test = docs(24), docs(8)
    return TaskData(name=name, label_names=("a", "b"), train_texts=train[0], train_labels=train[1],
                    test_texts=test[0], test_labels=test[1])


@pytest.fixture(scope="module")
def parts():
    tokenizer = load_tokenizer()
    embeddings = torch.randn(tokenizer.vocab_size, DIM, generator=torch.Generator().manual_seed(0))
    return dict(tokenizer=tokenizer, embeddings=embeddings, tasks=[_task("t0", 1), _task("t1", 2)])


def _trainer(parts, *, protocol: TrainingProtocol | None = None, mode: str = "fedseit") -> ContinualTrainer:
    return ContinualTrainer(client_id=1, tasks=parts["tasks"], tokenizer=parts["tokenizer"],
                            embeddings=parts["embeddings"], model=DecomposedConfig(filters=4, mode=mode, foreign_slots=2,
                                                                                  seed=3),
                            config=ContinualTrainerConfig(lr=3e-3, batch_size=8, max_length=12), protocol=protocol)


def _train_two_tasks(trainer: ContinualTrainer) -> list[dict[str, float]]:
    out = []
    for task in (0, 1):
        trainer.start_task(task)
        out += [trainer.train(epochs=2) for _ in range(2)]   # two rounds per task
    return out


def test_fedseit_protocol_declares_and_cites_every_aspect():
    p = fedseit_protocol(lr=1e-3, local_epochs=2)
    assert (p.optimizer.name, p.optimizer.lr, p.lifetime, p.schedule, p.max_grad_norm, p.local_epochs) == \
        ("adam", 1e-3, FRESH, "constant", None, 2)
    assert (p.evaluation, p.selection, p.precision) == ("after aggregation", "last round", "fp32")
    assert set(p.cite) == set(CITED) and all(p.cite[a].strip() for a in CITED)
    assert "Table 4" in p.cite["optimizer"] and "1e-4" in p.cite["optimizer"]
    assert fedseit_protocol(personal=True).evaluation == "personal model"
    assert TrainingProtocol.from_dict(p.to_dict()) == p
    assert p.describe().startswith("protocol=fedseit-cpu optimizer=adam(lr=0.001) fresh-each-round schedule=constant "
                                   "clip=none epochs=2")


def test_default_protocol_trains_bit_for_bit_as_the_adam_built_before(parts, monkeypatch):
    """The trainer's own `torch.optim.Adam(trainable_parameters, lr=config.lr)` each local run (its code
    before the protocol) and the declared default give the same parameters, bit for bit."""
    declared = _trainer(parts)
    assert declared.protocol == fedseit_protocol(lr=3e-3)
    losses = _train_two_tasks(declared)
    before = _trainer(parts)
    monkeypatch.setattr(before, "optimizer_for",
                        lambda task: torch.optim.Adam(before.model.trainable_parameters(task), lr=before.config.lr))
    assert _train_two_tasks(before) == losses
    for (name, a), (_, b) in zip(declared.model.state_dict().items(), before.model.state_dict().items()):
        assert torch.equal(a, b), name
    assert np.array_equal(declared.get_shared()[BASE_PART], before.get_shared()[BASE_PART])


def test_the_trainer_builds_through_the_protocol_fresh_each_run_or_kept_per_task(parts, monkeypatch):
    built: list[tuple[str, int]] = []
    original = TrainingProtocol.build_optimizer

    def spy(self, params):
        optimizer = original(self, params)
        built.append((self.lifetime, type(optimizer).__name__))
        return optimizer

    monkeypatch.setattr(TrainingProtocol, "build_optimizer", spy)
    _train_two_tasks(_trainer(parts))
    assert built == [(FRESH, "Adam")] * 4                         # every local run (2 tasks x 2 rounds)
    built.clear()
    kept = kept_protocol(OptimizerConfig(name="sgd", lr=0.05), name="kept-sgd")
    trainer = _trainer(parts, protocol=kept)
    _train_two_tasks(trainer)
    assert built == [(KEPT, "SGD")] * 2                           # once per task, kept over its rounds
    assert all(isinstance(o, torch.optim.SGD) for o in trainer._kept.values()) and sorted(trainer._kept) == [0, 1]


def test_the_protocols_clipping_and_schedule_reach_the_loop(parts):
    """A protocol with clipping and a linear schedule trains differently from the constant default (the
    trainer hands its protocol to `run_epochs`), and a non-protocol is refused."""
    plain = _trainer(parts)
    plain.start_task(0)
    plain.train(epochs=2)
    clipped = _trainer(parts, protocol=dataclasses.replace(fedseit_protocol(lr=3e-3), max_grad_norm=1e-3,
                                                           schedule="linear"))
    clipped.start_task(0)
    clipped.train(epochs=2)
    assert not np.array_equal(plain.get_shared()[BASE_PART], clipped.get_shared()[BASE_PART])
    start = _trainer(parts).get_shared()[BASE_PART]
    assert np.abs(clipped.get_shared()[BASE_PART] - start).max() < np.abs(plain.get_shared()[BASE_PART] - start).max()
    with pytest.raises(TypeError, match="protocol must be a TrainingProtocol, got OptimizerConfig"):
        _trainer(parts, protocol=OptimizerConfig(name="adam", lr=1e-3))
