import sys

import numpy as np
import pytest

from fl_algorithms.algorithms.fedavg import FedAvg
from fl_algorithms.algorithms.fedopt import FedOpt
from fl_algorithms.algorithms.fedprox import FedProx
from fl_algorithms.algorithms.local import Local
from fl_algorithms.engine.sim import RunConfig, SimulationRunner
from fl_algorithms.engine.secure_sum import SecureAggregationConfig


def _run(make, protocol, algorithm=None, rounds=3, **kw):
    trainers = make(4)
    cfg = RunConfig(rounds=rounds, secure=SecureAggregationConfig(protocol=protocol, clip=4.0, max_weight=100, max_clients=8, min_release_group=2), **kw)
    runner = SimulationRunner(algorithm=algorithm or FedAvg(local_epochs=1), trainers=trainers, config=cfg)
    runner.run(progress=False)
    return runner


@pytest.mark.parametrize("protocol", ["secagg+", "secagg"])
def test_fedavg_secure_equals_plaintext_within_quantisation(toy_trainers, protocol):
    secure = _run(toy_trainers, protocol)
    plain = _run(toy_trainers, "plain")
    bound = secure.aggregator.encoder.mean_error_bound(n_clients=4, total_weight=240)
    for k, v in secure.algorithm.shared_parameters(secure.state).items():
        diff = np.abs(v - plain.algorithm.shared_parameters(plain.state)[k]).max()
        # Quantisation noise of each round propagates through later local training; a few rounds
        # of SGD on a smooth model keep it within a small multiple of the per-round bound.
        assert diff < 1e3 * bound + 1e-5, (k, diff, bound)


@pytest.mark.parametrize("protocol", ["secagg+", "lightsecagg"])
def test_the_in_run_plain_twin_checks_every_secure_sum_against_the_plaintext_sum_of_its_inputs(toy_trainers, protocol):
    runner = _run(toy_trainers, protocol, plain_twin=True, clients_per_round=4, dropout=0.25, seed=2, sampler="seeded")
    assert all(set(r.plain_twin) == set(r.sums) and all(r.plain_twin.values()) for r in runner.history)
    if protocol == "secagg+":  # (the simulated dropout stage is SecAgg's)
        assert any(len(r.contributors) < 4 for r in runner.history)  # checked over the survivors only
    assert all(r.plain_twin == {} for r in _run(toy_trainers, protocol).history)  # not checked unless asked


def test_the_in_run_plain_twin_holds_under_exact_distributed_dp(toy_trainers):
    """The noised inputs, layers included, sum to the secure sum before the server removes the excess."""
    from dp.distributed import DistributedDPConfig

    ddp = DistributedDPConfig(l2_clip=1.0, noise_multiplier=1.0, expected_clients=4, min_clients=3, bits=20,
                              exact_noise=True)
    secure = SecureAggregationConfig(protocol="secagg+", clip=4.0, max_clients=4, distributed_dp=ddp)
    from dp.ledger import Ledger

    runner = SimulationRunner(algorithm=FedAvg(local_epochs=1), trainers=toy_trainers(4), ledger=Ledger(),
                              config=RunConfig(rounds=2, secure=secure, plain_twin=True))
    runner.run(progress=False)
    assert all(r.plain_twin and all(r.plain_twin.values()) for r in runner.history)


@pytest.mark.parametrize("protocol", ["secagg+", "lightsecagg"])
def test_exact_noise_layers_are_sized_by_the_sum_not_the_ring_and_stay_exact(toy_trainers, protocol, monkeypatch):
    """A cohort of 4 under a ring sized for 8: every client draws 4 - n_min layers (not 8 - n_min), the server's
    protocol and decoder use the same count, and each release carries exactly the target noise (the ledger)."""
    from dp.distributed import DistributedDPConfig
    from dp.ledger import Ledger
    from fl_algorithms.engine.secure_sum import SecureAggregator

    ddp = DistributedDPConfig(l2_clip=1.0, noise_multiplier=1.0, expected_clients=8, min_clients=2, bits=20,
                              exact_noise=True)
    secure = SecureAggregationConfig(protocol=protocol, clip=4.0, max_clients=8, distributed_dp=ddp,
                                     **({"protocol_params": {"target_survivors": 3, "privacy": 1}} if protocol == "lightsecagg" else {}))
    counts = []
    real = SecureAggregator.client_encode

    def spy(self, upload, **kw):
        enc = real(self, upload, **kw)
        counts.append(enc.noise_layers.spec.count)
        return enc

    monkeypatch.setattr(SecureAggregator, "client_encode", spy)
    ledger = Ledger()
    runner = SimulationRunner(algorithm=FedAvg(local_epochs=1), trainers=toy_trainers(4), ledger=ledger,
                              config=RunConfig(rounds=2, secure=secure, plain_twin=True))
    runner.run(progress=False)
    assert counts and set(counts) == {4 - 2}
    assert all(r.plain_twin and all(r.plain_twin.values()) for r in runner.history)
    records = ledger.noise_records()
    assert len(records) == 2 and all(r["layers"] == 2 and r["survivors"] == 4 for r in records)
    assert all(r["realised_variance"] == pytest.approx(r["target_variance"]) for r in records)


def test_a_server_that_understates_a_sums_size_leaves_more_noise_not_less(toy_trainers, monkeypatch):
    """The attack on `sum_sizes`: a server announcing 3 members for a sum of 4 (so that the clients draw fewer
    removable layers) gets a release carrying more than the target noise, never less: the clients reveal
    only the layers their own announced size gave them."""
    from dp.distributed import DistributedDPConfig
    from dp.ledger import Ledger
    from fl_algorithms.engine.round import RoundMachine

    real = RoundMachine.__init__

    def understating(self, **kw):
        real(self, **kw)
        self.sizes = {name: n - 1 for name, n in self.sizes.items()}

    monkeypatch.setattr(RoundMachine, "__init__", understating)
    ddp = DistributedDPConfig(l2_clip=1.0, noise_multiplier=1.0, expected_clients=8, min_clients=2, bits=20,
                              exact_noise=True)
    ledger = Ledger()
    SimulationRunner(algorithm=FedAvg(local_epochs=1), trainers=toy_trainers(4), ledger=ledger,
                     config=RunConfig(rounds=2, secure=SecureAggregationConfig(protocol="secagg+", clip=4.0,
                                                                                max_clients=8, distributed_dp=ddp))
                     ).run(progress=False)
    records = ledger.noise_records()
    assert len(records) == 2 and all(r["layers"] == 1 and r["survivors"] == 4 for r in records)
    assert all(r["realised_variance"] == pytest.approx(4 / 3 * r["target_variance"]) for r in records)


def test_the_in_run_plain_twin_flags_a_secure_sum_that_differs(toy_trainers, monkeypatch):
    """A protocol whose sum is off by one in one coordinate (a mask that does not cancel) is caught."""
    from fl_algorithms.engine.secure_sum import SecureAggregator

    real = SecureAggregator.run_sum

    def off_by_one(self, **kw):
        result = real(self, **kw)
        result.ring_sum[0] += 1
        return result

    monkeypatch.setattr(SecureAggregator, "run_sum", off_by_one)
    runner = _run(toy_trainers, "secagg+", plain_twin=True)
    assert all(r.plain_twin and not any(r.plain_twin.values()) for r in runner.history)
    with pytest.raises(ValueError, match="already sums in plaintext"):
        RunConfig(plain_twin=True, secure=SecureAggregationConfig(protocol="plain"))


def test_a_participation_cap_leaves_clients_out_once_they_reached_it(toy_trainers):
    runner = _run(toy_trainers, "secagg+", rounds=5, max_participations=2)  # everyone drawn every round
    drawn = {c: sum(c in r.cohort for r in runner.history) for c in runner.trainers}
    assert drawn == {c: 2 for c in runner.trainers}
    assert [len(r.cohort) for r in runner.history] == [4, 4, 0, 0, 0]
    assert [sorted(r.capped) for r in runner.history] == [[], [], [1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]]
    assert all(not r.contributors for r in runner.history[2:])  # nothing released without participants


@pytest.mark.parametrize("kept", [True, False], ids=["cap-kept", "cap-ignored"])
def test_the_ledger_shows_whether_the_cap_held_ddp_calibrated_for_it(toy_trainers, monkeypatch, kept):
    """DDP calibrated for 2 participations against the server: with the cap kept every client's server epsilon
    is within the target; a sampler that ignores the cap (the attack on the bound) shows in the ledger."""
    from dp.distributed import DistributedDPConfig
    from dp.ledger import Ledger

    if not kept:
        monkeypatch.setattr(SimulationRunner, "within_cap", lambda self, cohort: (cohort, []))
    ddp = DistributedDPConfig(l2_clip=1.0, target_epsilon=4.0, expected_clients=4, min_clients=3, bits=20, rounds=2,
                              target_observer="server")
    secure = SecureAggregationConfig(protocol="secagg+", clip=4.0, max_clients=4, distributed_dp=ddp)
    ledger = Ledger()
    runner = SimulationRunner(algorithm=FedAvg(local_epochs=1), trainers=toy_trainers(4), ledger=ledger,
                              config=RunConfig(rounds=4, secure=secure, max_participations=2))
    runner.run(progress=False)
    spent = max(ledger.epsilon(c, unit="client", observer="server") for c in ledger.clients())
    assert (spent <= 4.0 + 1e-6) if kept else (spent > 4.0)


def test_a_cap_must_be_positive_and_cover_what_ddp_noise_is_calibrated_for():
    from dp.distributed import DistributedDPConfig

    with pytest.raises(ValueError, match="max_participations must be at least 1"):
        RunConfig(max_participations=0)
    ddp = DistributedDPConfig(l2_clip=1.0, target_epsilon=8.0, expected_clients=8, min_clients=4, rounds=3,
                              target_observer="server")
    secure = SecureAggregationConfig(protocol="secagg+", clip=4.0, max_clients=8, distributed_dp=ddp)
    with pytest.raises(ValueError, match="calibrated for 3 participations"):
        RunConfig(rounds=10, max_participations=4, secure=secure)
    assert RunConfig(rounds=10, max_participations=3, secure=secure).max_participations == 3


def test_fedavg_learns(toy_trainers):
    runner = _run(toy_trainers, "secagg+", rounds=8)
    first, last = runner.history[0].mean("accuracy"), runner.history[-1].mean("accuracy")
    assert last > 0.6 and last >= first


def test_fedavg_is_exactly_weighted_mean_of_client_updates(toy_trainers):
    """One round, plain protocol: the server's new params equal w + sum n_i Delta_i / sum n_i."""
    trainers = toy_trainers(3)
    import copy
    shadow = {c: copy.deepcopy(t) for c, t in trainers.items()}
    cfg = RunConfig(rounds=1, secure=SecureAggregationConfig(protocol="plain", clip=4.0, max_weight=100, max_clients=4, min_release_group=2))
    runner = SimulationRunner(algorithm=FedAvg(), trainers=trainers, config=cfg)
    w0 = {k: v.copy() for k, v in runner.algorithm.shared_parameters(runner.state).items()}
    runner.run(progress=False)
    deltas = []
    for t in shadow.values():
        t.set_shared(w0)
        t.train(epochs=1)
        deltas.append({k: t.get_shared()[k] - w0[k] for k in w0})
    for k in w0:
        expected = w0[k] + np.mean([d[k] for d in deltas], axis=0)
        np.testing.assert_allclose(runner.algorithm.shared_parameters(runner.state)[k], expected, atol=1e-5)


def test_fedprox_and_fedopt_run_and_differ_from_fedavg(toy_trainers):
    avg = _run(toy_trainers, "plain")
    prox = _run(toy_trainers, "plain", algorithm=FedProx(mu=1.0))
    opt = _run(toy_trainers, "plain", algorithm=FedOpt(server_optimizer="adam", server_lr=0.05))
    pa = avg.algorithm.shared_parameters(avg.state)["body"]
    assert not np.allclose(pa, prox.algorithm.shared_parameters(prox.state)["body"])
    assert not np.allclose(pa, opt.algorithm.shared_parameters(opt.state)["body"])
    for opt_name in ("sgdm", "yogi"):
        r = _run(toy_trainers, "plain", algorithm=FedOpt(server_optimizer=opt_name, server_lr=0.5), rounds=6)
        assert r.history[-1].mean("accuracy") > 0.5


def test_local_uploads_nothing(toy_trainers):
    runner = _run(toy_trainers, "secagg+", algorithm=Local())
    assert all(r.bytes_uploaded == {} and r.secure_seconds == 0 for r in runner.history)


def test_dropouts_and_sampling(toy_trainers):
    trainers = toy_trainers(8)
    cfg = RunConfig(rounds=3, clients_per_round=6, dropout=0.2, seed=3, sampler="seeded",
                    secure=SecureAggregationConfig(protocol="secagg+", clip=4.0, max_weight=100, max_clients=8, min_release_group=2))
    runner = SimulationRunner(algorithm=FedAvg(), trainers=trainers, config=cfg)
    runner.run(progress=False)
    assert all(len(r.cohort) == 6 for r in runner.history)
    assert any(len(r.contributors) < len(r.cohort) for r in runner.history)
    assert all(set(r.contributors) <= set(r.cohort) for r in runner.history)


def test_resume_after_crash_continues_from_last_round(toy_trainers, tmp_path):
    cfg = RunConfig(rounds=4, checkpoint_dir=str(tmp_path), clients_per_round=3, seed=5, sampler="seeded",
                    secure=SecureAggregationConfig(protocol="plain", clip=4.0, max_weight=100, max_clients=8, min_release_group=2))
    straight = SimulationRunner(algorithm=FedAvg(), trainers=toy_trainers(4), config=RunConfig(
        **{**cfg.__dict__, "checkpoint_dir": None}))
    straight.run(progress=False)

    class Crash(Exception):
        pass

    def crash_after_two(rec):
        if rec.round == 2:
            raise Crash

    crashing = SimulationRunner(algorithm=FedAvg(), trainers=toy_trainers(4), config=cfg, on_round=crash_after_two)
    # no message: Crash is this test's own sentinel, raised without one
    with pytest.raises(Crash):
        crashing.run(progress=False)
    resumed = SimulationRunner(algorithm=FedAvg(), trainers=toy_trainers(4), config=cfg)
    resumed.run(resume=True, progress=False)
    assert [r.round for r in resumed.history] == [1, 2, 3, 4]
    assert [r.cohort for r in resumed.history] == [r.cohort for r in straight.history]
    for k, v in straight.state.items():
        # plain protocol: only stochastic rounding differs between the two runs
        np.testing.assert_allclose(resumed.state[k], v, atol=1e-4)


def test_draw_cohort_records_the_sampler_that_drew_it():
    from fl_algorithms.engine.sim import draw_cohort

    ids = list(range(1, 21))
    assert RunConfig().sampler == "poisson"  # the default: the only sampler that justifies amplification
    seeded = RunConfig(clients_per_round=5, seed=1, sampler="seeded")
    a, rec = draw_cohort(seeded, np.random.default_rng(1), ids)
    b, _ = draw_cohort(seeded, np.random.default_rng(1), ids)
    assert a == b and len(a) == 5 and (rec.scheme, rec.rate, rec.amplification_rate) == ("seeded", 0.25, 1.0)
    cohort, rec = draw_cohort(RunConfig(clients_per_round=5, sampler="poisson"), np.random.default_rng(1), ids)
    assert set(cohort) <= set(ids) and (rec.scheme, rec.rate, rec.amplification_rate) == ("poisson", 0.25, 0.25)
    cohort, rec = draw_cohort(RunConfig(clients_per_round=5, sampler="fixed_size"), np.random.default_rng(1), ids)
    assert len(cohort) == 5 and rec.amplification_rate == 1.0
    cohort, rec = draw_cohort(RunConfig(clients_per_round=None, sampler="poisson"), np.random.default_rng(1), ids)
    assert cohort == ids and rec.scheme == "everyone"
    with pytest.raises(ValueError, match="sampler"):
        RunConfig(sampler="uniform")


def test_a_curve_split_is_evaluated_every_round_and_the_test_split_in_the_last_only(toy_trainers):
    trainers = toy_trainers(3)
    asked = []
    for t in trainers.values():
        real = t.evaluate

        def evaluate(*, split="test", real=real):
            asked.append(split)
            return {"accuracy": real(split="test")["accuracy"] + (0.5 if split == "validation" else 0.0)}
        t.evaluate = evaluate
    cfg = RunConfig(rounds=3, curve_split="validation",
                    secure=SecureAggregationConfig(protocol="plain", clip=4.0, max_weight=100, max_clients=8))
    runner = SimulationRunner(algorithm=FedAvg(local_epochs=1), trainers=trainers, config=cfg)
    runner.run(progress=False)
    assert asked == ["validation"] * 3 * 2 + ["validation", "test"] * 3
    for rec in runner.history[:-1]:
        assert all(set(m) >= {"validation_accuracy"} and "accuracy" not in m for m in rec.metrics.values())
    last = runner.history[-1]
    assert last.mean("validation_accuracy") == pytest.approx(last.mean("accuracy") + 0.5)
    with pytest.raises(ValueError, match="curve_split must differ"):
        RunConfig(rounds=2, curve_split="test")


def _curve_runner(toy_trainers):
    cfg = RunConfig(rounds=2, curve_split="validation",
                    secure=SecureAggregationConfig(protocol="plain", clip=4.0, max_weight=100, max_clients=8,
                                                   min_release_group=2))
    trainers = toy_trainers(3)
    for t in trainers.values():
        t.evaluate = lambda *, split="test", real=t.evaluate: real(split="test")  # the toy has one split
    return SimulationRunner(algorithm=FedAvg(local_epochs=1), trainers=trainers, config=cfg)


@pytest.mark.parametrize("metric", ["validation_accuracy", "accuracy"])
def test_the_progress_bar_shows_the_metric_it_is_given(toy_trainers, capsys, monkeypatch, metric):
    """With a curve split, rounds before the last report only 'validation_*' keys: the grid names that
    metric (or the bar adds the split to 'accuracy'), and the bar shows its value instead of nan."""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # bars are drawn on a terminal only
    runner = _curve_runner(toy_trainers)
    runner.run(progress=True, metric=metric)
    shown = capsys.readouterr().err
    first = runner.history[0].mean("validation_accuracy")
    assert f"validation_accuracy={first:.3f}" in shown and "nan" not in shown


def test_no_progress_bar_when_stderr_is_not_a_terminal(toy_trainers, capsys):
    """A redirected log gets no carriage returns (tqdm's disable=None)."""
    runner = _curve_runner(toy_trainers)
    assert not sys.stderr.isatty()
    runner.run(progress=True)
    assert capsys.readouterr().err == "" and len(runner.history) == 2
