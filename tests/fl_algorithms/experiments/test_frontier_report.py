"""fl_algorithms/experiments/frontier_report.py: rows over seeds, the paired cost against plaintext, and
runs made in parts combined (on hand-made run records: the frontier itself is tested in tests/examples)."""
import math

import pytest

from fl_algorithms.experiments import frontier_report as fr
from fl_algorithms.experiments.tables import paired_difference

CONFIG = ("FrontierConfig(task=BagTaskConfig(num_clients=200, max_examples=None, seed={seed}), rounds={rounds}, "
          "cohort={cohort}, sampler='poisson', local_epochs=5, epsilons=(8.0,), mechanisms=('ddp',), clip=1.0, "
          "save_transcripts=False, seed={seed})")


def result(name: str, acc: float, *, eps: float | None = None, adv: float = 0.0) -> dict:
    unit = "client"
    return {"setting": {"name": name, "label": name, "epsilon": eps}, "accuracy": acc, "realistic_advantage": adv,
            "oracle_advantage": adv, "membership": {"calibrated": {"advantage": 0.0}, "auc": 0.5,
                                                    "tpr_at_1pct_fpr": 0.01, "tpr_at_01pct_fpr": 0.001},
            "epsilon": {f"{unit}/server": "inf" if eps is None else eps * 0.9,
                        f"{unit}/outsider": "inf" if eps is None else eps * 0.5},
            "epsilon_unit": unit, "skipped_rounds": 0}


def run(cohort: int, seed: int, accs: dict[str, float], *, rounds: int = 20) -> dict:
    results = {name: result(name, a, eps=None if name in ("plain", "secagg") else float(name.split("_eps")[1]),
                            adv=1.0 if name == "plain" else 0.0)
               for name, a in accs.items()}
    return {"model": "bag", "cohort": cohort, "seed": seed, "config": CONFIG.format(seed=seed, rounds=rounds, cohort=cohort),
            "results": results, "task": {}}


def test_paired_difference_pairs_by_key_and_needs_a_common_key():
    d = paired_difference({0: 10.0, 1: 12.0, 2: 11.0}, {0: 9.0, 1: 10.0, 5: 0.0})
    assert d["seeds"] == 2 and d["mean"] == pytest.approx(1.5)
    assert d["low"] < 1.5 < d["high"]
    one = paired_difference({0: 3.0}, {0: 1.0})
    assert one["mean"] == 2.0 and math.isnan(one["low"])
    assert paired_difference({0: 1.0}, {1: 1.0}) is None


def test_cost_against_plaintext_is_paired_by_seed_in_points():
    runs = [run(20, 0, {"plain": 0.70, "ddp_eps8": 0.60}), run(20, 1, {"plain": 0.60, "ddp_eps8": 0.56}),
            run(20, 2, {"plain": 0.65, "ddp_eps8": 0.58})]
    rows = {r["setting"]: r for r in fr.summarise(runs)}
    assert rows["plain"]["cost_vs_plain"] is None
    ddp = rows["ddp_eps8"]
    assert ddp["cost_vs_plain"] == pytest.approx((10 + 4 + 7) / 3)
    low, high = ddp["cost_vs_plain_ci"]
    assert low < ddp["cost_vs_plain"] < high
    # an unpaired interval would be wider: the seeds' spread cancels in the differences
    assert high - low < 100 * (rows["plain"]["accuracy_ci"][1] - rows["plain"]["accuracy_ci"][0])
    assert ddp["eps_server"] == pytest.approx(7.2) and ddp["eps_outsider"] == pytest.approx(4.0)
    table = fr.markdown(list(rows.values()))
    assert "| 20 | ddp_eps8 | 0.580 ± " in table and f"| {ddp['cost_vs_plain']:.1f} [{low:.1f}, {high:.1f}] |" in table
    assert fr.csv_text(list(rows.values())).splitlines()[0].split(",")[6] == "cost_vs_plain"


def test_rows_are_per_cohort_and_a_single_seed_has_no_interval():
    rows = fr.summarise([run(5, 0, {"plain": 0.6, "ddp_eps8": 0.5}), run(50, 0, {"plain": 0.7, "ddp_eps8": 0.69})])
    assert [(r["cohort"], r["setting"]) for r in rows] == [(5, "plain"), (5, "ddp_eps8"), (50, "plain"), (50, "ddp_eps8")]
    assert rows[1]["cost_vs_plain"] == pytest.approx(10.0) and rows[1]["cost_vs_plain_ci"] is None
    assert rows[3]["cost_vs_plain"] == pytest.approx(1.0)


def test_combine_joins_parts_and_refuses_a_measurement_taken_twice():
    a = {"runs": [run(20, 0, {"plain": 0.7, "ddp_eps8": 0.6})]}
    b = {"runs": [run(50, 0, {"plain": 0.7, "ddp_eps8": 0.65})]}
    c = {"runs": [run(20, 0, {"central_eps8": 0.68})]}  # another mechanism of a cell already in a
    runs = fr.combine([("a", a), ("b", b), ("c", c)])
    assert len(runs) == 2
    cell = next(r for r in runs if r["cohort"] == 20)
    assert set(cell["results"]) == {"plain", "ddp_eps8", "central_eps8"}
    rows = {(r["cohort"], r["setting"]): r for r in fr.summarise(runs)}
    assert rows[(20, "central_eps8")]["cost_vs_plain"] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="also in a"):
        fr.combine([("a", a), ("again", {"runs": [run(20, 0, {"plain": 0.71})]})])


def test_combine_refuses_runs_whose_settings_differ():
    assert fr.settings_key(run(20, 0, {"plain": 0.7})) == fr.settings_key(run(50, 3, {"plain": 0.7}))
    other = {"runs": [run(50, 0, {"plain": 0.7}, rounds=8)]}
    with pytest.raises(ValueError, match="settings differ"):
        fr.combine([("a", {"runs": [run(20, 0, {"plain": 0.7})]}), ("b", other)])
    old = run(20, 0, {"plain": 0.7})
    new = dict(old, config=old["config"].replace("sampler='poisson', ", "sampler='poisson', cohort_tail=0.001, "))
    assert fr.settings_key(old) == fr.settings_key(new)  # recorded before the tail was configurable: the default
    assert fr.settings_key(old) != fr.settings_key(dict(old, config=new["config"].replace("0.001", "0.05")))
    with pytest.raises(ValueError, match="no runs"):
        fr.combine([("empty", {"runs": []})])


def test_a_part_run_without_baselines_joins_the_run_that_has_them():
    more = run(20, 0, {"ddp_eps1": 0.4})
    more["config"] = more["config"].replace("save_transcripts=False, ", "save_transcripts=False, baselines=False, ")
    assert fr.settings_key(more) == fr.settings_key(run(20, 0, {"plain": 0.7}))
    rows = {r["setting"]: r for r in fr.summarise(fr.combine([("a", {"runs": [run(20, 0, {"plain": 0.7})]}),
                                                              ("more", {"runs": [more]})]))}
    assert rows["ddp_eps1"]["cost_vs_plain"] == pytest.approx(30.0)
    alone = {r["setting"]: r for r in fr.summarise([more])}  # no plaintext to pair with: no cost, not a zero
    assert alone["ddp_eps1"]["cost_vs_plain"] is None


def test_load_results_reads_directories_and_says_what_is_missing(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "results.json").write_text('{"runs": []}')
    assert fr.load_results([tmp_path / "r"]) == [(str(tmp_path / "r"), {"runs": []})]
    with pytest.raises(FileNotFoundError, match="no results.json"):
        fr.load_results([tmp_path / "missing"])


def test_plots(tmp_path):
    rows = fr.summarise([run(20, s, {"plain": 0.7, "ddp_eps8": 0.6 + 0.01 * s}) for s in range(2)])
    assert fr.plot_frontier(rows, tmp_path / "f.png").stat().st_size > 0
    assert fr.plot_cost(rows, tmp_path / "c.png").stat().st_size > 0
    assert fr.plot_cost([r for r in rows if r["setting"] == "plain"], tmp_path / "none.png") is None


def test_rows_follow_mechanism_then_epsilon_whatever_order_the_parts_ran_in():
    first = run(20, 0, {"plain": 0.7, "secagg": 0.7, "ddp_eps8": 0.6, "dpsgd_eps8": 0.6})
    later = run(20, 0, {"dpsgd_eps1": 0.5, "ddp_eps1": 0.4, "ddp_eps2": 0.45})
    later["config"] = later["config"].replace("save_transcripts=False, ", "save_transcripts=False, baselines=False, ")
    rows = fr.summarise(fr.combine([("a", {"runs": [first]}), ("b", {"runs": [later]})]))
    assert [r["setting"] for r in rows] == ["plain", "secagg", "ddp_eps1", "ddp_eps2", "ddp_eps8", "dpsgd_eps1",
                                            "dpsgd_eps8"]
