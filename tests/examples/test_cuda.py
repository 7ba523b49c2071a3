"""The CUDA path of every example that takes ``--device``: tiny runs on the GPU, checked against the CPU.

These run only where torch sees a CUDA device (the GPU machine; CI has none and skips them with the
reason). Each example is run end to end on ``--device cuda`` with the tiny random backbone: the run
must say it used the GPU, finish every round, and print its machine-readable last line with finite
values. FedMCP is also run on the CPU with the same seed in fp32, and the two must agree to within
a few test examples (GPU kernels reduce in another order, so bit-equality is not expected).
"""
from __future__ import annotations

import importlib.util
import json
import math
import re
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the GPU machine runs these")]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _example(name: str):
    spec = importlib.util.spec_from_file_location(f"cuda_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _values(line: str) -> dict[str, str]:
    return dict(re.findall(r"(\w+)=(\S+)", line))


def _finite_numbers(line: str) -> list[float]:
    numbers = []
    for value in _values(line).values():
        try:
            numbers.append(float(value))
        except ValueError:
            continue  # paths, names, n/a
    assert numbers, f"no numeric results in {line!r}"
    assert all(math.isfinite(v) for v in numbers), line
    return numbers


def _run(name: str, argv: list[str], capsys) -> tuple[dict, list[str]]:
    out = _example(name).main(argv)
    lines = capsys.readouterr().out.strip().splitlines()
    assert any("device cuda" in line for line in lines), f"{name} did not report running on cuda"
    return out, lines


FEDMCP_TINY = ["--backbone", "tiny", "--train-cap", "18", "--test-cap", "12", "--rounds", "2", "--adapter-layers", "1",
               "--batch-size", "8", "--no-progress", "--threads", "1", "--precision", "fp32"]


def test_fedmcp_on_cuda_matches_the_cpu(tmp_path, capsys):
    cuda, lines = _run("fedmcp_secure", FEDMCP_TINY + ["--device", "cuda", "--out", str(tmp_path), "--run-name", "g"],
                       capsys)
    assert cuda["device"] == "cuda" and lines[-1].startswith("avg_acc fedmcp=")
    _finite_numbers(lines[-1])
    assert abs(float(_values(lines[-1])["secure_vs_plain_diff"])) <= 0.05
    cpu = _example("fedmcp_secure").main(FEDMCP_TINY + ["--device", "cpu", "--out", str(tmp_path), "--run-name", "c"])
    capsys.readouterr()
    for method, stats in cpu["methods"].items():
        # percent; 4 clients x 12 test examples: 10 points is about five examples of one client
        assert cuda["methods"][method]["average"]["mean"] == pytest.approx(stats["average"]["mean"], abs=10), method


def test_fedmcp_deterministic_on_cuda_repeats_itself_exactly(tmp_path, capsys):
    """With --deterministic two runs of one seed give the same numbers on the GPU (without it the
    paper-scale grid's secure and plaintext twins differed by up to 0.16 points)."""
    argv = FEDMCP_TINY + ["--device", "cuda", "--deterministic", "--out", str(tmp_path)]
    try:
        first = _example("fedmcp_secure").main(argv + ["--run-name", "d1"])
        second = _example("fedmcp_secure").main(argv + ["--run-name", "d2"])
    finally:
        torch.use_deterministic_algorithms(False)
    capsys.readouterr()
    assert first["deterministic"] and first["device"] == "cuda"
    for method, stats in first["methods"].items():
        assert second["methods"][method]["average_by_seed"] == stats["average_by_seed"], method


def test_fednlp_classification_on_cuda(tmp_path, capsys):
    argv = ["--backbone", "tiny", "--max-docs", "60", "--clients", "3", "--min-client-docs", "10", "--rounds", "2",
            "--max-length", "32", "--min-release-group", "3", "--adapter-layers", "1", "--batch-size", "8",
            "--threads", "1", "--no-progress", "--device", "cuda", "--out", str(tmp_path), "--run-name", "g"]
    out = _example("fednlp_classification").main(argv)
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert out["summary"]["device"] == "cuda"
    _finite_numbers(last)


@pytest.mark.parametrize(("name", "argv", "prefix"), [
    ("fednlp_benchmark", ["--quick", "--backbone", "tiny", "--rounds", "1", "--clients", "3", "--max-examples", "90",
                          "--algorithms", "fedavg,fedopt"], "fednlp task="),
    ("atc_secure", ["--quick", "--backbone", "tiny"], "atc avg"),
    ("adafedselectkd", ["--quick", "--backbone", "tiny", "--fraction", "0.05"], "summ setting="),
    ("fedseit_continual", ["--quick", "--backbone", "tiny"], "fcl "),
])
def test_grid_examples_on_cuda(name, argv, prefix, tmp_path, capsys):
    extra = ["--cache", str(tmp_path / "cache")] if name == "adafedselectkd" else []
    _, lines = _run(name, argv + extra + ["--device", "cuda", "--no-progress", "--out", str(tmp_path),
                                          "--run-name", "g"], capsys)
    results = [line for line in lines if line.startswith(prefix)]
    assert results, f"{name} printed no {prefix!r} line"
    for line in results:
        _finite_numbers(line)
    if name == "fednlp_benchmark":  # its secure-vs-plain twins need bit-reproducible kernels on a GPU
        rows = [json.loads(x) for x in (tmp_path / "g" / "cells.jsonl").read_text().splitlines()]
        assert rows and all(r["deterministic_kernels"] for r in rows)
        assert all("round1_within_bound=true" in line for line in results), results


FRONTIER_TINY = ["--model", "adapter", "--backbone", "tiny", "--clients", "16", "--cohorts", "6", "--rounds", "2",
                 "--local-epochs", "1", "--max-examples", "1200", "--epsilons", "8", "--seeds", "0", "--sampler",
                 "seeded", "--no-progress"]


def test_privacy_frontier_adapter_on_cuda_matches_the_cpu(tmp_path, capsys):
    """The adapter model of the privacy frontier on the GPU: every setting runs, its ledger entries are
    finite, and with seeded cohorts the plaintext run's accuracy is the CPU's up to kernel order."""
    cuda = _example("privacy_frontier").main(FRONTIER_TINY + ["--device", "cuda", "--out", str(tmp_path),
                                                              "--run-name", "g"])
    cpu = _example("privacy_frontier").main(FRONTIER_TINY + ["--device", "cpu", "--out", str(tmp_path),
                                                             "--run-name", "c"])
    capsys.readouterr()
    [run] = cuda["runs"]
    assert run["task"]["device"] == "cuda"
    assert set(run["results"]) == {"plain", "secagg", "ddp_eps8", "central_eps8", "dpsgd_eps8"}
    _finite_numbers(cuda["last_line"])
    plain = {out["runs"][0]["task"]["device"]: next(r for r in out["rows"] if r["setting"] == "plain")["accuracy"]
             for out in (cuda, cpu)}
    assert plain["cuda"] == pytest.approx(plain["cpu"], abs=0.02)


def test_adapter_sentiment_trainer_on_cuda_matches_the_cpu():
    """One client's local epoch and the membership scores, on the GPU against the CPU."""
    import numpy as np

    from fl_algorithms.training.adapter_sentiment_trainer import example_losses, public_losses, sentiment_trainer
    from nlp_models.adapter_sentiment import AdapterTaskConfig, build_adapter_task
    from nlp_models.backbone import load_tokenizer, tiny_bert
    from nlp_models.data.dataset import TextDataset

    words = "good bad great awful fine dull superb boring fun slow".split()
    rng = np.random.default_rng(0)
    labels = [int(rng.integers(2)) for _ in range(120)]
    texts = tuple(" ".join(rng.choice(words[y::2], 6)) + f" film{i % 20}" for i, y in enumerate(labels))
    data = TextDataset(name="synthetic", texts=texts, labels=tuple(labels), label_names=("rotten", "fresh"),
                       groups=tuple(f"movie {i % 20}" for i in range(120)))
    # No head dropout: CUDA draws its masks from its own generator (Philox), not the CPU's, so with dropout a
    # seeded GPU run is another draw than the CPU's and the two part by far more than kernel rounding (seen
    # on an H200: 12% of the adapter values off by up to 0.09 after one epoch). Without it, the device path
    # (cached prefix, adapters, head, SGD) must agree to rounding.
    config = AdapterTaskConfig(num_clients=3, bottleneck=4, backbone="tiny", max_length=16, public_fraction=0.2,
                               batch_size=8, head_dropout=0.0)
    tasks = {device: build_adapter_task(config, dataset=data, backbone=tiny_bert(layers=2, hidden=32, heads=2),
                                        tokenizer=load_tokenizer(), progress=False, device=device)
             for device in ("cpu", "cuda")}
    assert tasks["cuda"].public.examples.hidden.is_cuda and next(tasks["cuda"].new_model().parameters()).is_cuda
    shared = {}
    for device, task in tasks.items():
        trainer = sentiment_trainer(task, client_id=1)
        trainer.train(epochs=1)
        shared[device] = trainer.get_shared()
        losses = example_losses(task, shared[device], split="train"), public_losses(task, shared[device])
        shared[device]["losses"] = np.concatenate(losses)
    for part, values in shared["cpu"].items():
        np.testing.assert_allclose(shared["cuda"][part], values, atol=1e-4, err_msg=part)
    # Opacus builds an empty Poisson batch on the CPU: the loss must still run on the GPU model
    from nlp_models.adapter_sentiment import per_example_loss

    empty = [torch.zeros(0, 1, 32), torch.zeros(0, 1, dtype=torch.long), torch.zeros(0, dtype=torch.long)]
    assert per_example_loss(tasks["cuda"].new_model(), empty).shape == (0,)
