"""The grid's plan, algorithms and aggregation (the runs themselves: tests/examples/test_fednlp_benchmark.py)."""
import numpy as np
import pytest

from fl_algorithms.algorithms.fedavg import FedAvg
from fl_algorithms.algorithms.fedopt import FedAvgM, FedYogi
from fl_algorithms.algorithms.fedprox import FedProx
from fl_algorithms.experiments.fednlp_grid import (SGD_LRS_2026_11_29, TASK_DEFAULTS, AlgorithmSettings, GridPlan,
                                                   aggregate, cell_key, make_algorithm, paired_comparisons,
                                                   plan_from_record, plan_record, selected_sgd_lrs, untwinned,
                                                   write_paired)


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
    # within a (task, partition, seed) the twin follows the first protocol's FedAvg at once
    unit = [(c["protocol"], c["algorithm"]) for c in cells[:5]]
    assert unit == [("secagg+", "fedavg"), ("plain", "fedavg"), ("secagg+", "fedprox"), ("lightsecagg", "fedavg"),
                    ("lightsecagg", "fedprox")]
    assert {(c["task"], c["partition"], c["seed"]) for c in cells[:5]} == {("classification", "iid", 0)}
    no_fedavg = GridPlan(tasks=("qa",), algorithms=("fedprox",)).cells()
    assert [(c["protocol"], c["algorithm"]) for c in no_fedavg] == [("secagg+", "fedprox"), ("plain", "fedavg")]


def test_per_task_settings_override_the_common_ones_for_that_task_only_and_survive_the_saved_plan():
    plan = GridPlan(tasks=("tagging", "qa"), formulation=dict(max_examples=100, clients=3),
                    per_task={"tagging": dict(max_examples=800)})
    assert plan.settings("tagging", partition="iid", seed=0).max_examples == 800
    assert plan.settings("qa", partition="iid", seed=0).max_examples == 100
    assert plan.settings("tagging", partition="iid", seed=0).clients == 3
    again = plan_from_record(plan_record(plan))
    assert again.settings("tagging", partition="iid", seed=1) == plan.settings("tagging", partition="iid", seed=1)
    old = {k: v for k, v in plan_record(plan).items() if k != "per_task"}  # a plan saved before the field
    assert plan_from_record(old).settings("tagging", partition="iid", seed=0).max_examples == 100


@pytest.mark.parametrize("bad, match", [(dict(tasks=("translation",)), "tasks"), (dict(protocols=("plain",)), "plain"),
                                        (dict(per_task={"translation": {}}), "per_task"),
                                        (dict(partitions=("label:0",)), "positive"), (dict(rounds=0), "rounds")])
def test_bad_plans_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        GridPlan(**bad)


def test_a_widened_plan_keeps_every_finished_cell_and_its_first_seed_and_partition():
    plan = GridPlan(tasks=("classification",), algorithms=("fedavg", "fedopt"), partitions=("label:0.1", "iid"),
                    seeds=(2, 0))
    wider = plan.widened(algorithms=("fedprox", "fedavg"), partitions=("iid", "label:0.10", "quantity:1"), seeds=(1,))
    assert wider.algorithms == ("fedavg", "fedopt", "fedprox")
    assert wider.partitions == ("label:0.1", "iid", "quantity:1")  # 'label:0.10' is the saved 'label:0.1'
    assert wider.seeds == (2, 0, 1) and wider.rounds == plan.rounds and wider.formulation == plan.formulation
    old = {cell_key(c) for c in plan.cells()}
    new = {cell_key(c) for c in wider.cells()}
    assert old < new and len(new) == 3 * 3 * (3 + 1)
    assert plan.widened() == plan and plan.widened(seeds=(0, 2)) == plan


@pytest.mark.parametrize("change, match", [(dict(rounds=(9,)), "only tasks"), (dict(algorithms=("scaffold",)), "algorithm"),
                                           (dict(partitions=("dirichlet:1",)), "partition"),
                                           (dict(protocols=("plain",)), "plain")])
def test_a_plan_grows_only_by_valid_list_values(change, match):
    with pytest.raises(ValueError, match=match):
        GridPlan(tasks=("classification",)).widened(**change)


def test_aggregate_is_mean_and_sample_std_over_seeds():
    base = dict(task="qa", partition="iid", protocol="secagg+", algorithm="fedavg", metric="f1", trivial=0.1,
                round_seconds=1.0, secure_seconds_per_round=0.1, parameters=10, bytes_uploaded_per_client_round=40.0)
    rows = aggregate([{**base, "seed": 0, "score": 0.2}, {**base, "seed": 1, "score": 0.4}])
    assert len(rows) == 1
    assert rows[0]["mean"] == pytest.approx(0.3) and rows[0]["std"] == pytest.approx(0.1414213562)
    assert rows[0]["seeds"] == 2
    assert np.isnan(rows[0]["pooled_mean"])  # cells written before pooled scores were recorded
    pooled = aggregate([{**base, "seed": 0, "score": 0.2, "pooled_score": 0.3},
                        {**base, "seed": 1, "score": 0.4, "pooled_score": 0.5}])
    assert pooled[0]["pooled_mean"] == pytest.approx(0.4) and pooled[0]["pooled_std"] == pytest.approx(0.1414213562)


def test_curves_give_each_algorithm_one_colour_in_every_panel(tmp_path, monkeypatch):
    from matplotlib.axes import Axes

    from fl_algorithms.experiments.fednlp_grid import plot_curves

    drawn = []
    original = Axes.plot
    monkeypatch.setattr(Axes, "plot", lambda self, *a, **k: drawn.append((k["label"], k["color"])) or original(self, *a, **k))
    row = dict(task="classification", metric="accuracy", protocol="secagg+", curve=[0.5, 0.6])
    rows = [{**row, "partition": "iid", "algorithm": a} for a in ("fedavg", "fedprox", "fedopt")]
    rows += [{**row, "partition": "label:0.1", "algorithm": a} for a in ("fedavg", "fedopt")]  # no FedProx here
    assert plot_curves(rows, path=tmp_path / "c.png").stat().st_size > 0
    assert len(drawn) == 5 and len(set(drawn)) == 3  # fedopt has the same colour in both panels
    assert len({colour for _, colour in drawn}) == 3


def test_partition_curves_draw_each_partition_in_one_colour_with_its_seed_count(tmp_path, monkeypatch):
    from matplotlib.axes import Axes

    from fl_algorithms.experiments.fednlp_grid import plot_partition_curves

    drawn = []
    original = Axes.plot
    monkeypatch.setattr(Axes, "plot", lambda self, *a, **k: drawn.append((k["label"], k["color"], list(a[1])))
                        or original(self, *a, **k))
    row = dict(task="classification", metric="accuracy", protocol="secagg+")
    rows = [{**row, "algorithm": a, "partition": p, "seed": s, "curve": [0.2 + s, 0.4 + s]}
            for a in ("fedavg", "fedopt") for p in ("iid", "label:0.1") for s in (0, 1)]
    rows.append({**row, "protocol": "plain", "algorithm": "fedavg", "partition": "iid", "seed": 0, "curve": [9, 9]})
    assert plot_partition_curves(rows, path=tmp_path / "p.png", protocol="secagg+").stat().st_size > 0
    assert len(drawn) == 4  # two algorithms x two partitions; the plaintext twin is not drawn
    assert {label for label, _, _ in drawn} == {"iid (2 seeds)", "label:0.1 (2 seeds)"}
    assert len({(label, colour) for label, colour, _ in drawn}) == 2
    assert all(y == pytest.approx([0.7, 0.9]) for _, _, y in drawn)  # the mean over seeds


def test_paired_comparisons_pair_by_seed_within_the_secure_protocol_only():
    def row(algorithm, partition, seed, score, protocol="secagg+"):
        return dict(task="tagging", partition=partition, protocol=protocol, algorithm=algorithm, seed=seed, score=score)

    rows = [row("fedavg", "iid", 0, 0.40), row("fedavg", "iid", 1, 0.50), row("fedavg", "iid", 2, 0.60),
            row("fedopt", "iid", 0, 0.30), row("fedopt", "iid", 1, 0.45),  # seed 2 not finished
            row("fedavg", "cluster:0.1", 0, 0.45), row("fedavg", "cluster:0.1", 1, 0.40),
            row("fedavg", "iid", 0, 0.99, protocol="plain"), row("fedopt", "cluster:0.1", 3, 0.1)]
    found = {(r["comparison"], r["within"]): r for r in paired_comparisons(rows, protocol="secagg+")}
    assert set(found) == {("fedopt - fedavg", "iid"), ("iid - cluster:0.1", "fedavg")}  # no common seed: none
    opt = found["fedopt - fedavg", "iid"]
    assert opt["by_seed"] == pytest.approx({0: -0.10, 1: -0.05}) and opt["seeds"] == 2
    assert opt["mean"] == pytest.approx(-0.075) and opt["low"] < -0.075 < opt["high"]
    gap = found["iid - cluster:0.1", "fedavg"]
    assert gap["by_seed"] == pytest.approx({0: -0.05, 1: 0.10}) and gap["mean"] == pytest.approx(0.025)


def test_paired_table_is_in_points_with_each_seed(tmp_path):
    rows = [dict(task="qa", comparison="fedprox - fedavg", within="iid", by_seed={0: 0.012, 1: -0.004},
                 mean=0.004, low=-0.1, high=0.108, seeds=2),
            dict(task="qa", comparison="iid - label:0.1", within="fedavg", by_seed={0: 0.05},
                 mean=0.05, low=float("nan"), high=float("nan"), seeds=1)]
    write_paired({"mean over clients": rows, "pooled": rows[:1]}, md_path=tmp_path / "paired.md")
    lines = (tmp_path / "paired.md").read_text().splitlines()
    assert lines[0] == "## mean over clients" and lines[7] == "## pooled"
    assert lines[4] == "| qa | fedprox - fedavg | iid | +0.4 | -10.0 .. +10.8 | +1.2, -0.4 |"
    assert lines[5] == "| qa | iid - label:0.1 | fedavg | +5.0 | n/a (one seed) | +5.0 |"
    assert lines[11:] == ["| qa | fedprox - fedavg | iid | +0.4 | -10.0 .. +10.8 | +1.2, -0.4 |"]


def test_paired_comparisons_of_the_pooled_score_skip_runs_that_lack_it():
    rows = [dict(task="qa", partition="iid", protocol="secagg+", algorithm=a, seed=s, score=0.5, **pooled)
            for a, s, pooled in (("fedavg", 0, {"pooled_score": 0.40}), ("fedopt", 0, {"pooled_score": 0.43}),
                                 ("fedavg", 1, {}), ("fedopt", 1, {"pooled_score": 0.9}))]
    (found,) = paired_comparisons(rows, protocol="secagg+", value="pooled_score")
    assert found["by_seed"] == pytest.approx({0: 0.03}) and found["seeds"] == 1
    (mean,) = paired_comparisons(rows, protocol="secagg+")
    assert mean["by_seed"] == {0: 0.0, 1: 0.0}


def test_a_secure_fedavg_run_cut_off_from_its_twin_is_named_for_a_rerun_and_only_that_one():
    plan = GridPlan(tasks=("qa",), algorithms=("fedavg", "fedopt"), partitions=("iid", "label:1"),
                    protocols=("secagg+",), seeds=(0, 1))
    assert untwinned(plan, {}) == set()
    done = {cell_key(c): {} for c in plan.cells()}
    assert untwinned(plan, done) == set()  # every twin finished
    twin = dict(task="qa", partition="label:1", seed=0, protocol="plain", algorithm="fedavg")
    del done[cell_key(twin)]
    assert untwinned(plan, done) == {cell_key(dict(twin, protocol="secagg+"))}
    del done[cell_key(dict(twin, seed=1))]  # a later seed's twin is not compared: nothing to rerun for it
    assert untwinned(plan, done) == {cell_key(dict(twin, protocol="secagg+"))}
    del done[cell_key(dict(twin, protocol="secagg+"))]  # neither finished: both run anyway
    assert untwinned(plan, done) == set()
    assert untwinned(GridPlan(tasks=("qa",), algorithms=("fedprox",), seeds=(0,)), {}) == set()


def test_algorithm_settings_refuse_values_no_run_could_use():
    lrs, local = "server lrs must be positive", "need local_epochs >= 1, fedprox_mu >= 0 and 0 <= fedavgm_momentum < 1"
    for bad, message in ((dict(fedavgm_lr=0.0), lrs), (dict(fedavgm_lr=float("nan")), lrs),
                         (dict(adaptive_lr=-1e-2), lrs), (dict(fedavgm_momentum=1.0), local),
                         (dict(fedprox_mu=-0.1), local), (dict(local_epochs=0), local)):
        with pytest.raises(ValueError, match=message):
            AlgorithmSettings(**bad)
    assert AlgorithmSettings(fedavgm_lr=1.0, fedavgm_momentum=0.0).fedavgm_lr == 1.0


def test_sgd_clients_use_the_lr_chosen_for_sgd_and_older_grids_keep_their_one_lr():
    plan = GridPlan(tasks=("classification", "tagging"))
    assert plan.sgd_lrs == selected_sgd_lrs() == {t: d["sgd_lr"] for t, d in TASK_DEFAULTS.items() if "sgd_lr" in d}
    # each chosen on validation (docs/protocols.md, 2026-11-29): classification's for the classification example
    # (the mean over seeds 0-2), the other three from the quick grid's pilots
    assert selected_sgd_lrs() == {"classification": 1.0, "tagging": 3.0, "qa": 3.0, "seq2seq": 3.0}
    cls = plan.settings("classification", partition="iid", seed=0)
    assert (cls.lr, cls.sgd_lr) == (1e-2, 1.0)
    assert plan.protocol_for("fedavg", cls).optimizer.lr == 1.0 and plan.protocol_for("fedavg", cls).optimizer.name == "sgd"
    assert plan.protocol_for("fedopt", cls).optimizer.lr == 1e-2  # AdamW keeps the task's lr
    record = plan_record(plan)
    assert record["sgd_lrs"] == plan.sgd_lrs and plan_from_record(record) == plan  # saved with the plan
    # a grid saved on 2026-11-29 before plans recorded the lrs: classification's 3.0, every other task one lr
    day = {**{k: v for k, v in record.items() if k != "sgd_lrs"}, "selected_sgd_lrs": True}
    assert plan_from_record(day).sgd_lrs == SGD_LRS_2026_11_29 == {"classification": 3.0}
    tag = plan_from_record(day).settings("tagging", partition="iid", seed=0)
    assert tag.sgd_lr is None and plan.protocol_for("fedavg", tag).optimizer.lr == tag.lr == 1e-2
    # and one saved before 2026-11-29 (no such field, or False): one lr for every client
    for old in ({k: v for k, v in record.items() if k != "sgd_lrs"}, {**day, "selected_sgd_lrs": False}):
        older = plan_from_record(old)
        assert older.sgd_lrs == {} and older.settings("classification", partition="iid", seed=0).sgd_lr is None
        assert older.protocol_for("fedavg", older.settings("classification", partition="iid", seed=0)).optimizer.lr == 1e-2


def test_a_plans_sgd_lrs_set_one_tasks_sgd_clients_and_are_checked():
    plan = GridPlan(tasks=("tagging", "qa"), sgd_lrs={**selected_sgd_lrs(), "tagging": 0.25})
    tag = plan.settings("tagging", partition="iid", seed=0)
    assert (tag.lr, tag.sgd_lr) == (TASK_DEFAULTS["tagging"]["lr"], 0.25)
    assert plan.protocol_for("fedprox", tag).optimizer.lr == 0.25 and plan.protocol_for("fedopt", tag).optimizer.lr == tag.lr
    assert plan.settings("qa", partition="iid", seed=0).sgd_lr == selected_sgd_lrs().get("qa")
    assert plan_from_record(plan_record(plan)) == plan
    one_lr = GridPlan(tasks=("tagging",), sgd_lrs={})  # no task named: SGD at the task's lr
    assert one_lr.protocol_for("fedavg", one_lr.settings("tagging", partition="iid", seed=0)).optimizer.lr == 1e-2
    for bad, match in (({"translation": 1.0}, "unknown tasks"), ({"tagging": 0.0}, "positive finite"),
                       ({"tagging": float("nan")}, "positive finite"), ({"tagging": "1"}, "positive finite")):
        with pytest.raises(ValueError, match=match):
            GridPlan(tasks=("tagging",), sgd_lrs=bad)
