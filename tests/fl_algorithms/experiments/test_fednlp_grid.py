"""The grid's plan, algorithms and aggregation (the runs themselves: tests/examples/test_fednlp_benchmark.py)."""
import pytest

from fl_algorithms.algorithms.fedavg import FedAvg
from fl_algorithms.algorithms.fedopt import FedAvgM, FedYogi
from fl_algorithms.algorithms.fedprox import FedProx
from fl_algorithms.experiments.fednlp_grid import AlgorithmSettings, GridPlan, aggregate, cell_key, make_algorithm


def test_fedopt_is_fednlps_server_sgd_with_momentum_and_the_others_are_named():
    assert isinstance(make_algorithm("fedopt"), FedAvgM)
    assert type(make_algorithm("fedavg")) is FedAvg
    prox = make_algorithm("fedprox", AlgorithmSettings(fedprox_mu=0.5))
    assert isinstance(prox, FedProx) and prox.mu == 0.5
    assert isinstance(make_algorithm("fedyogi"), FedYogi)
    with pytest.raises(ValueError, match="unknown algorithm"):
        make_algorithm("scaffold")


def test_plan_lists_every_cell_and_a_plain_fedavg_twin_per_task_partition_seed():
    plan = GridPlan(tasks=("classification", "qa"), algorithms=("fedavg", "fedprox"), partitions=("iid", "label:1"),
                    protocols=("secagg+", "lightsecagg"), seeds=(0, 1))
    cells = plan.cells()
    assert len(cells) == 2 * 2 * 2 * (2 * 2 + 1)
    assert len({cell_key(c) for c in cells}) == len(cells)
    plain = [c for c in cells if c["protocol"] == "plain"]
    assert len(plain) == 8 and all(c["algorithm"] == "fedavg" for c in plain)


@pytest.mark.parametrize("bad, match", [(dict(tasks=("translation",)), "tasks"), (dict(protocols=("plain",)), "plain"),
                                        (dict(partitions=("label:0",)), "positive"), (dict(rounds=0), "rounds")])
def test_bad_plans_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        GridPlan(**bad)


def test_aggregate_is_mean_and_sample_std_over_seeds():
    base = dict(task="qa", partition="iid", protocol="secagg+", algorithm="fedavg", metric="f1", trivial=0.1,
                round_seconds=1.0, secure_seconds_per_round=0.1, parameters=10, bytes_uploaded_per_client_round=40.0)
    rows = aggregate([{**base, "seed": 0, "score": 0.2}, {**base, "seed": 1, "score": 0.4}])
    assert len(rows) == 1
    assert rows[0]["mean"] == pytest.approx(0.3) and rows[0]["std"] == pytest.approx(0.1414213562)
    assert rows[0]["seeds"] == 2
