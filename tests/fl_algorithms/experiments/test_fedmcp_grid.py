"""FedMCP's experiment library (fl_algorithms.experiments.fedmcp_grid): both evaluation points summarised,
tabled, paired by seed and put on the last line, from hand-made round records (no model is trained)."""
import math

import numpy as np
import pytest

from fl_algorithms.engine.round import RoundRecord
from fl_algorithms.experiments.fedmcp_grid import (MethodRun, final_line, format_paired, format_point_differences,
                                                   format_point_table, paired_differences, point_differences,
                                                   summarise)
from fl_algorithms.tasks.fedmcp import ClientInfo
from fl_algorithms.training.adapter_trainer import BEFORE_AGGREGATION

CLIENTS = [ClientInfo(client_id=c, key=f"k{c}", title=f"client {c}", num_labels=2,
                      sizes={"train": 10, "validation": 5, "test": 8}) for c in (1, 2)]


def _run(method: str, seed: int, after: tuple[float, float], before: tuple[float, float] | None,
         ratio: float | None = None) -> MethodRun:
    """Two rounds; the last one carries the test accuracies at both points (`before` None: not reported)."""
    history = []
    for t in (1, 2):
        metrics = {}
        for c, (a, b) in enumerate(zip(after, before or after), start=1):
            m = {"validation_accuracy": a, "train_loss": 0.5}
            if before is not None:
                m[f"validation_{BEFORE_AGGREGATION}"] = b
            if ratio is not None:
                m["grad_ratio_mu_c_to_a"] = ratio * t * c
            if t == 2:
                m["accuracy"] = a
                if before is not None:
                    m[BEFORE_AGGREGATION] = b
            metrics[c] = m
        history.append(RoundRecord(round=t, cohort=[1, 2], contributors=[1, 2], metrics=metrics, seconds=1.0,
                                   secure_seconds=0.1, bytes_uploaded={1: 8, 2: 8}, clipped=0))
    return MethodRun(method=method, seed=seed, history=history, trainable=10.0, shared=4, epsilon={})


def _summary():
    runs = {"fedmcp": [_run("fedmcp", 0, (0.80, 0.60), (0.90, 0.70), ratio=0.01),
                       _run("fedmcp", 1, (0.70, 0.60), (0.80, 0.80), ratio=0.01)],
            "local": [_run("local", 0, (0.75, 0.65), (0.75, 0.65)), _run("local", 1, (0.60, 0.60), (0.60, 0.60))],
            "fedavg_peft": [_run("fedavg_peft", 0, (0.5, 0.5), None), _run("fedavg_peft", 1, (0.5, 0.5), None)]}
    return summarise(runs, CLIENTS, dp=False)


def test_both_evaluation_points_are_summarised_per_client_per_seed_and_averaged():
    summary = _summary()
    fedmcp = summary["fedmcp"]
    after, before = fedmcp["points"]["after_aggregation"], fedmcp["points"]["before_aggregation"]
    assert after["average_by_seed"] == pytest.approx({"0": 70.0, "1": 65.0})
    assert before["average_by_seed"] == pytest.approx({"0": 80.0, "1": 80.0})
    assert before["per_client_by_seed"]["k1"] == pytest.approx({"0": 90.0, "1": 80.0})
    assert before["per_client"]["k2"]["mean"] == pytest.approx(75.0)
    assert before["per_client"]["k2"]["std"] == pytest.approx(np.std([70, 80], ddof=1))
    # the top-level keys stay the after-aggregation point, as before
    assert (fedmcp["average"], fedmcp["per_client"]) == (after["average"], after["per_client"])
    assert fedmcp["curve_before_aggregation"] == pytest.approx([80.0, 80.0])
    # the gradient ratio per round: median, min and max over clients and seeds
    assert fedmcp["grad_ratio_mu_c_to_a"]["median"] == pytest.approx([0.015, 0.03])
    assert fedmcp["grad_ratio_mu_c_to_a"]["max"] == pytest.approx([0.02, 0.04])
    # a method whose clients did not report the second point (an older run) has only the first
    assert set(summary["fedavg_peft"]["points"]) == {"after_aggregation"}
    assert summary["fedavg_peft"]["curve_before_aggregation"] == [] and summary["local"]["grad_ratio_mu_c_to_a"] == {}


def test_paired_differences_at_each_point_and_between_the_points():
    summary = _summary()
    after = paired_differences(summary)
    before = paired_differences(summary, point="before_aggregation")
    assert after["local"]["mean"] == pytest.approx(np.mean([70 - 70, 65 - 60]))
    assert before["local"]["mean"] == pytest.approx(np.mean([80 - 70, 80 - 60]))
    assert before["local"]["low"] < before["local"]["mean"] < before["local"]["high"]
    assert "fedavg_peft" in after and "fedavg_peft" not in before  # it has no second point
    points = point_differences(summary)
    assert set(points) == {"fedmcp"}  # Local coincides by construction; FedAvg (PEFT) did not report it
    assert points["fedmcp"]["mean"] == pytest.approx(np.mean([10, 15])) and points["fedmcp"]["seeds"] == 2
    assert format_paired(before, summary, point="before_aggregation").startswith(
        "FedMCP minus each method, both before aggregation, average accuracy paired by seed (95% t-interval, 2 seeds): "
        "Local +15.00 [")
    assert format_point_differences(points, summary).startswith("before minus after aggregation")
    assert paired_differences({"local": summary["local"]}) == {}


def test_the_point_table_and_the_last_lines_extra_keys():
    summary = _summary()
    table = format_point_table(summary, CLIENTS, seeds=2)
    lines = table.splitlines()
    assert lines[0].startswith("Test accuracy (%) before aggregation")
    assert lines[1].split() == ["Method", "client", "1", "client", "2", "Avg."]
    assert any(line.startswith("Local (= after agg.)") for line in lines)
    assert not any(line.startswith("FedAvg (PEFT)") for line in lines)  # no second point recorded
    fedmcp_row = next(line for line in lines if line.startswith("FedMCP"))
    assert fedmcp_row.split()[1:] == ["85.00±7.07", "75.00±7.07", "80.00±0.00"]
    assert format_point_table({"fedavg_peft": summary["fedavg_peft"]}, CLIENTS, seeds=2) == ""
    # the usual keys, in the usual order, then the before-aggregation point where it can differ (not Local)
    assert final_line(summary) == ("avg_acc fedmcp=67.50 fedavg_peft=50.00 local=65.00 secure_vs_plain_diff=n/a "
                                   "fedmcp_local_eval=80.00")
    assert not math.isnan(summary["local"]["points"]["before_aggregation"]["average"]["mean"])


def _saved_run(tmp_path, *, recorded: dict[str, str] | None):
    from fl_algorithms.experiments.fedmcp_grid import Plan
    from fl_algorithms.experiments.rundir import RunDirectory
    from fl_algorithms.tasks.fedmcp import FedMCPSettings

    run = RunDirectory.create(tmp_path, name="r")
    config = {"settings": FedMCPSettings(precision="auto", backbone="tiny"), "plan": Plan(algorithms=("fedmcp", "local"))}
    if recorded is not None:
        config["training_protocol"] = {m: {"name": "fedmcp", "precision": p} for m, p in recorded.items()}
    run.write_config(config)
    return run.path


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_a_saved_auto_run_resumes_in_the_precision_its_protocol_recorded(tmp_path, precision):
    from fl_algorithms.experiments.fedmcp_grid import read_saved

    settings, _ = read_saved(_saved_run(tmp_path, recorded={"fedmcp": precision, "local": precision}))
    assert settings.precision == precision


def test_a_saved_auto_run_without_a_recorded_protocol_resumes_under_the_rule_of_its_time(tmp_path, monkeypatch):
    import torch

    from fl_algorithms.experiments.fedmcp_grid import read_saved

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    for avx512_bf16, expected in ((True, "bf16"), (False, "fp32")):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v)
        settings, _ = read_saved(_saved_run(tmp_path / expected, recorded=None))
        assert settings.precision == expected


def test_a_saved_run_whose_methods_recorded_different_precisions_is_refused(tmp_path):
    from fl_algorithms.experiments.fedmcp_grid import read_saved

    with pytest.raises(ValueError, match="different precisions"):
        read_saved(_saved_run(tmp_path, recorded={"fedmcp": "bf16", "local": "fp32"}))
