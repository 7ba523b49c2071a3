"""fl_algorithms/experiments/frontier.py's config: the cohort floor DDP is calibrated for, per sampler."""
import pytest
from scipy import stats

from fl_algorithms.experiments.frontier import COHORT_TAIL, FrontierConfig
from nlp_models.bag_of_tokens import BagTaskConfig

TASK = BagTaskConfig(num_clients=200, public_fraction=0.1)


def test_poisson_floor_is_the_configured_lower_quantile_of_the_cohort_size():
    floor, ceiling = FrontierConfig(task=TASK, cohort=20).cohort_range()
    assert stats.binom.cdf(floor, 200, 0.1) >= COHORT_TAIL > stats.binom.cdf(floor - 1, 200, 0.1)
    assert floor == 8 and ceiling > 40
    wider, _ = FrontierConfig(task=TASK, cohort=20, cohort_tail=0.05).cohort_range()
    assert wider == 13  # fewer clients' noise shares assumed: less noise, about 5% of rounds release nothing
    assert FrontierConfig(task=TASK, cohort=5).cohort_range()[0] == 2  # never below two contributors


def test_fixed_size_and_seeded_cohorts_are_their_own_floor():
    assert FrontierConfig(task=TASK, cohort=20, sampler="fixed_size").cohort_range() == (20, 20)
    assert FrontierConfig(task=TASK, cohort=50, sampler="seeded").cohort_range() == (50, 50)


@pytest.mark.parametrize("tail", [0.0, 0.5, -1e-3, 1.0])
def test_cohort_tail_must_be_a_lower_quantile(tail):
    with pytest.raises(ValueError, match="cohort_tail"):
        FrontierConfig(task=TASK, cohort=20, cohort_tail=tail)


def test_run_frontier_releases_each_transcript_once_it_is_measured(monkeypatch):
    from fl_algorithms.experiments import frontier as fr

    alive = []

    class Uploads:  # stands in for a run's transcript (gigabytes in a real grid)
        pass

    def fake_run(setting, task, cfg, *, progress):
        uploads = Uploads()
        alive.append(uploads)
        return fr.RunOutput(setting, [], {}, None, uploads, 0.0, {})

    seen = []
    monkeypatch.setattr(fr, "model_kit", lambda task: fr.ModelKit("fake", (), *[None] * 5, token_attacks=False))
    monkeypatch.setattr(fr, "run_setting", fake_run)
    monkeypatch.setattr(fr, "measure", lambda run, task, cfg, *, shadow, export: {"measured": run.transcript is not None})
    cfg = FrontierConfig(task=TASK, cohort=20, epsilons=(8.0,), mechanisms=("ddp",))
    results, runs = fr.run_frontier(object(), cfg, progress=False,
                                    on_result=lambda name, run, result: seen.append(run.transcript is not None))
    assert list(results) == ["plain", "secagg", "ddp_eps8"] and all(r["measured"] for r in results.values())
    assert seen == [True, True, True]  # measured and reported with the uploads...
    assert all(run.transcript is None for run in runs.values())  # ...then released
    import gc
    import weakref

    refs = [weakref.ref(u) for u in alive]
    alive.clear()
    gc.collect()
    assert all(r() is None for r in refs)


def test_without_baselines_only_the_noised_settings_run_and_there_must_be_one():
    cfg = FrontierConfig(task=TASK, cohort=20, epsilons=(1.0, 2.0), mechanisms=("ddp", "central"), baselines=False)
    assert [s.name for s in cfg.settings()] == ["ddp_eps1", "ddp_eps2", "central_eps1", "central_eps2"]
    assert [s.name for s in FrontierConfig(task=TASK, cohort=20, epsilons=(1.0,), mechanisms=("ddp",)).settings()][:2] \
        == ["plain", "secagg"]
    for empty in ({"mechanisms": ()}, {"epsilons": ()}):
        with pytest.raises(ValueError, match="without the baselines"):
            FrontierConfig(task=TASK, cohort=20, baselines=False, **empty)


def test_a_participation_cap_calibrates_ddp_and_dpsgd_for_that_many_participations():
    from types import SimpleNamespace

    from fl_algorithms.experiments.frontier import Setting, secure_config

    task = SimpleNamespace(config=TASK, clients={1: SimpleNamespace(train=[0] * 10)})
    ddp = Setting("ddp_eps8", "ddp", "secagg+", "ddp", 8.0)
    capped = FrontierConfig(task=TASK, cohort=20, rounds=20, max_participations=6)
    secure, params = secure_config(ddp, task, capped)
    assert secure.distributed_dp.rounds == 6 == capped.participations and params["target_horizon"] == 6
    uncapped, _ = secure_config(ddp, task, FrontierConfig(task=TASK, cohort=20, rounds=20))
    assert uncapped.distributed_dp.rounds == 20
    # fewer participations to cover: less noise for the same target epsilon
    assert secure.distributed_dp.rounds < uncapped.distributed_dp.rounds
    for bad in (0, 21):
        with pytest.raises(ValueError, match="max_participations must be in 1..rounds"):
            FrontierConfig(task=TASK, cohort=20, rounds=20, max_participations=bad)
