"""The round engine: one state machine, two drivers, separate roles, group sums, relays."""
import numpy as np
import pytest

from dp.distributed import DistributedDPConfig
from dp.ledger import Ledger, LedgerConfig
from dp.sketches import DPSketcher, SketchConfig
from fl_algorithms.api import (AggregateView, Broadcast, Masked, RoundPlan, Sealed, SumSpec, Upload)
from fl_algorithms.algorithms.ditto import Ditto
from fl_algorithms.algorithms.fedavg import FedAvg
from fl_algorithms.algorithms.group_fedavg import GroupFedAvg
from fl_algorithms.engine.deploy import ClientSetupError, DeployedClient, DeployedServer, DeploymentConfig
from fl_algorithms.engine.sim import RunConfig, SimulationRunner
from fl_algorithms.engine.secure_sum import SecureAggregationConfig
from fl_algorithms.experiments.task import Task
from fl_algorithms.tasks.toy import toy_trainer
from transport.simulation import InprocFederation


class RelayingFedAvg(FedAvg):
    """FedAvg whose clients also send a Sealed note to the next client and keep what they receive."""

    name = "relaying_fedavg"

    def client_update(self, *, broadcast, client):
        upload, state = super().client_update(broadcast=broadcast, client=client)
        inbox = list(client.state.get("inbox", [])) + [[r.sender, r.round, r.ciphertext.decode()] for r in broadcast.inbox]
        receiver = client.client_id % 3 + 1
        note = Sealed(receiver=receiver, ciphertext=f"from {client.client_id} in {client.round}".encode())
        return Upload(masked=upload.masked, sealed=(note,), metrics=upload.metrics), {"inbox": inbox}


def _ddp_config(exact_noise=False, mechanism="skellam", **kw):
    ddp = DistributedDPConfig(l2_clip=1.0, noise_multiplier=0.8, expected_clients=3, min_clients=2, bits=20,
                              mechanism=mechanism, exact_noise=exact_noise)
    return RunConfig(rounds=2, secure=SecureAggregationConfig(protocol="secagg+", clip=4.0, max_weight=100,
                                                             max_clients=8, distributed_dp=ddp, insecure_seed=7), **kw)


def _task(algorithm):
    return Task(algorithm=algorithm, make_trainer=lambda c: toy_trainer(c, seed=0),
                initial=lambda: toy_trainer(1, seed=0).get_shared())


def _deploy(algorithm, config, *, ledger=None, n=3, client_config=None, deployment=DeploymentConfig()):
    clients = {c: DeployedClient(client_id=c, task=_task(algorithm), config=client_config or config) for c in range(1, n + 1)}
    with InprocFederation(client_ids=clients, factory=lambda c, r: clients[c].protocol_for(r),
                          handlers=lambda c: clients[c].handlers()) as driver:
        server = DeployedServer(task=_task(algorithm), config=config, driver=driver, ledger=ledger, deployment=deployment)
        server.run()
    return server, clients


@pytest.mark.parametrize("exact_noise, mechanism", [(False, "skellam"), (True, "skellam"), (True, "discrete_gaussian")])
def test_simulation_and_deployment_give_the_same_parameters_ledger_and_relays(exact_noise, mechanism):
    config = _ddp_config(exact_noise, mechanism)
    sim_ledger, dep_ledger = Ledger(LedgerConfig(delta=1e-5)), Ledger(LedgerConfig(delta=1e-5))
    sim = SimulationRunner(algorithm=RelayingFedAvg(), trainers={c: toy_trainer(c, seed=0) for c in (1, 2, 3)},
                           config=config, ledger=sim_ledger)
    sim.run(progress=False)
    server, clients = _deploy(RelayingFedAvg(), config, ledger=dep_ledger)
    sim_params, dep_params = sim.server.shared_parameters(sim.state), server.server.shared_parameters(server.state)
    assert sim_params.keys() == dep_params.keys()
    for k in sim_params:
        np.testing.assert_array_equal(sim_params[k], dep_params[k])
    assert sim_ledger.state_dict() == dep_ledger.state_dict()
    assert sim_ledger.report() == dep_ledger.report() and sim_ledger.clients() == [1, 2, 3]
    # XNoise: all three survived, so the one layer (count 2) was removed in both runtimes: the noise is the target.
    noise = dep_ledger.noise_records()
    assert [r["layer_index"] for r in noise] == ([0, 0] if exact_noise else [-1, -1])
    # (the discrete Gaussian to a unit: 3 survivors keep ceil(2 x 16 / 3) = 11 of the floor's 16 units each)
    exact = 3 * 11 / 32 if mechanism == "discrete_gaussian" else 1
    assert all(r["realised_variance"] == pytest.approx(r["target_variance"] * (exact if exact_noise else 1.5)) for r in noise)
    # The round's update really is the Released noisy mean (not an exact one): the ledger was charged twice.
    assert all(len(sim_ledger.entries(c)) == 2 for c in (1, 2, 3))
    # Round-1 notes reached their receivers in round 2, naming the sender, in both runtimes.
    for c in (1, 2, 3):
        sender = (c - 2) % 3 + 1
        expected = [[sender, 1, f"from {sender} in 1"]]
        assert sim.clients[c].state["inbox"] == expected
        assert clients[c].state["inbox"] == expected
    assert [r.metrics for r in sim.history] == [r.metrics for r in server.history]


class SketchingFedAvg(FedAvg):
    """FedAvg whose clients also release a client-level DP sketch of a summary of their own; the
    server keeps (round, client, norm) of each sketch it is shown."""

    name = "sketching_fedavg"

    def __init__(self, *, epsilon: float = 8.0) -> None:
        super().__init__()
        self.releases = {"sketch": DPSketcher(SketchConfig(epsilon=epsilon, unit="client", sketch_dim=8,
                                                           max_cosine_noise_std=1e6), dim=5)}

    def client_update(self, *, broadcast, client):
        upload, state = super().client_update(broadcast=broadcast, client=client)
        summary = np.arange(5.0) * client.client_id / 10.0
        sketch = client.release("sketch", summary=summary)
        return Upload(masked=upload.masked, released={"sketch": sketch}, metrics=upload.metrics), state

    def server_update(self, *, state, view):
        new = super().server_update(state=state, view=view)
        seen = [[view.round, c, float(np.linalg.norm(r.payload))] for c, r in view.released["sketch"].items()]
        new["seen.sketch"] = np.concatenate([state.get("seen.sketch", np.zeros((0, 3))), np.array(seen)])
        return new


@pytest.mark.parametrize("runtime", ["sim", "deploy"])
def test_a_clients_own_release_reaches_the_server_and_is_charged_to_its_ledger(runtime):
    config = RunConfig(rounds=2, secure=SecureAggregationConfig(protocol="secagg+", clip=4.0, max_weight=100,
                                                               max_clients=8, min_release_group=2))
    ledger = Ledger(LedgerConfig(delta=1e-5))
    if runtime == "sim":
        sim = SimulationRunner(algorithm=SketchingFedAvg(), trainers={c: toy_trainer(c, seed=0) for c in (1, 2, 3)},
                               config=config, ledger=ledger)
        sim.run(progress=False)
        state, endpoints = sim.state, {c: sim.clients[c] for c in (1, 2, 3)}
    else:
        server, clients = _deploy(SketchingFedAvg(), config, ledger=ledger)
        state, endpoints = server.state, {c: clients[c].endpoint for c in (1, 2, 3)}
    seen = state["seen.sketch"]
    assert sorted((int(t), int(c)) for t, c, _ in seen) == [(t, c) for t in (1, 2) for c in (1, 2, 3)]
    assert np.all(seen[:, 2] > 0)
    entries = {c: ledger.entries(c) for c in (1, 2, 3)}
    for c in (1, 2, 3):
        assert [(e.summary_key, e.observer.value, e.count, e.rounds) for e in entries[c]] == [
            ("sketch", "server", 2, (1, 2)), ("sketch", "outsider", 2, (1, 2))]
        # the client's own ledger holds the same charges as the server's re-derived ones
        assert endpoints[c].ledger.clients() == [c] and endpoints[c].ledger.entries(c) == entries[c]
        assert ledger.epsilon(c, unit="client", observer="server") > 8.0  # two releases at epsilon 8 each


def test_simulation_and_deployment_charge_the_same_release_ledger():
    config = RunConfig(rounds=2, secure=SecureAggregationConfig(protocol="secagg+", clip=4.0, max_weight=100,
                                                               max_clients=8, min_release_group=2))
    sim_ledger, dep_ledger = Ledger(), Ledger()
    SimulationRunner(algorithm=SketchingFedAvg(), trainers={c: toy_trainer(c, seed=0) for c in (1, 2, 3)},
                     config=config, ledger=sim_ledger).run(progress=False)
    _deploy(SketchingFedAvg(), config, ledger=dep_ledger)
    assert sim_ledger.state_dict() == dep_ledger.state_dict() and sim_ledger.clients() == [1, 2, 3]


def test_a_client_releasing_under_another_mechanism_is_refused_naming_both_sides():
    config = RunConfig(rounds=1, secure=SecureAggregationConfig(protocol="secagg+", clip=4.0, max_weight=100,
                                                               max_clients=8, min_release_group=2))
    clients = {c: DeployedClient(client_id=c, task=_task(SketchingFedAvg(epsilon=2.0)), config=config) for c in (1, 2)}
    with InprocFederation(client_ids=clients, factory=lambda c, r: clients[c].protocol_for(r),
                          handlers=lambda c: clients[c].handlers()) as driver:
        server = DeployedServer(task=_task(SketchingFedAvg()), config=config, driver=driver, ledger=Ledger())
        with pytest.raises(ClientSetupError, match=r"releases: server .*'epsilon': 8\.0.*client .*'epsilon': 2\.0"):
            server.run()
    assert server.ledger.clients() == []


def test_a_release_the_algorithm_does_not_declare_fails_on_the_client():
    class Undeclared(SketchingFedAvg):
        def client_update(self, *, broadcast, client):
            upload, state = super().client_update(broadcast=broadcast, client=client)
            return Upload(masked=upload.masked, released={"other": upload.released["sketch"]}), state

    config = RunConfig(rounds=1, secure=SecureAggregationConfig(protocol="secagg+", clip=4.0, max_weight=100,
                                                               max_clients=8, min_release_group=2))
    sim = SimulationRunner(algorithm=Undeclared(), trainers={c: toy_trainer(c, seed=0) for c in (1, 2)},
                           config=config, ledger=Ledger())
    with pytest.raises(ValueError, match=r"releases \['other'\] are not declared"):
        sim.run(progress=False)


def test_the_seedless_default_draws_fresh_noise_each_run():
    config = _ddp_config()
    config = RunConfig(rounds=1, secure=SecureAggregationConfig(**{**config.secure.__dict__, "insecure_seed": None}))
    finals = []
    for _ in range(2):
        sim = SimulationRunner(algorithm=FedAvg(), trainers={c: toy_trainer(c, seed=0) for c in (1, 2, 3)},
                               config=config, ledger=Ledger(LedgerConfig(delta=1e-5)))
        sim.run(progress=False)
        finals.append(sim.server.shared_parameters(sim.state)["body"])
    assert not np.array_equal(finals[0], finals[1])


class PerClientProbe(FedAvg):
    """Sends each client a private per-client part and its group's part; clients record what they got."""

    name = "probe"

    def configure_round(self, *, round, state, cohort=()):
        params = super().configure_round(round=round, state=state, cohort=cohort)
        return RoundPlan(broadcast=Broadcast(
            common=params, groups={"odd": {"g": np.ones(2)}, "even": {"g": np.zeros(2)}},
            group_of={c: "odd" if c % 2 else "even" for c in cohort},
            per_client={c: {"secret": np.full(3, float(c))} for c in cohort}))

    def client_update(self, *, broadcast, client):
        upload, _ = super().client_update(broadcast={k: broadcast.common[k] for k in broadcast.common}, client=client)
        seen = {"keys": sorted(broadcast), "secret": broadcast["secret"].tolist(), "group": broadcast.group,
                "g": broadcast["g"].tolist()}
        return upload, {"seen": seen}


@pytest.mark.parametrize("runtime", ["sim", "deploy"])
def test_each_client_receives_only_its_own_and_its_groups_parts(runtime):
    config = RunConfig(rounds=1, secure=SecureAggregationConfig(protocol="secagg+", clip=4.0, max_weight=100, max_clients=8, min_release_group=2))
    if runtime == "sim":
        sim = SimulationRunner(algorithm=PerClientProbe(), trainers={c: toy_trainer(c) for c in (1, 2, 3, 4)}, config=config)
        sim.run(progress=False)
        states = {c: e.state for c, e in sim.clients.items()}
    else:
        _, clients = _deploy(PerClientProbe(), config, n=4)
        states = {c: cl.state for c, cl in clients.items()}
    for c, st in states.items():
        seen = st["seen"]
        assert seen["keys"] == ["body", "g", "head", "secret"]
        assert seen["secret"] == [float(c)] * 3
        assert seen["group"] == ("odd" if c % 2 else "even") and seen["g"] == [float(c % 2)] * 2


def test_group_sums_update_each_group_and_skip_a_group_below_its_minimum():
    groups = {1: "a", 2: "a", 3: "a", 4: "b"}
    config = RunConfig(rounds=1, secure=SecureAggregationConfig(protocol="secagg+", clip=4.0, max_weight=100, max_clients=8, min_release_group=2))
    sim = SimulationRunner(algorithm=GroupFedAvg(groups=groups), trainers={c: toy_trainer(c) for c in groups}, config=config)
    initial = sim.state
    sim.run(progress=False)
    rec = sim.history[0]
    assert rec.sums == {"a": [1, 2, 3]} and "b" in rec.failed and "minimum 2" in rec.failed["b"]
    # group b kept its model; group a moved by the mean of its members' updates
    for k, v in initial.items():
        if k.startswith("b/"):
            np.testing.assert_array_equal(sim.state[k], v)
    deltas = []
    for c in (1, 2, 3):
        t = toy_trainer(c)
        t.set_shared({k.split("/", 1)[1]: v for k, v in initial.items() if k.startswith("a/")})
        before = t.get_shared()
        t.train(epochs=1)
        deltas.append({k: t.get_shared()[k] - before[k] for k in before})
    bound = sim.aggregator.encoder.mean_error_bound(n_clients=3, total_weight=180)
    for k in ("body", "head"):
        expected = initial[f"a/{k}"] + np.mean([d[k] for d in deltas], axis=0)
        np.testing.assert_allclose(sim.state[f"a/{k}"], expected, atol=bound + 1e-6)


class ClusterProbe(FedAvg):
    """Each client puts a fixed vector in the cluster it picks locally; the server sees per-cluster means."""

    name = "cluster_probe"

    def configure_round(self, *, round, state, cohort=()):
        return RoundPlan(broadcast=Broadcast(), sums=(SumSpec(name="all", members=frozenset(cohort)),))

    def client_update(self, *, broadcast, client):
        c = client.client_id
        return Upload(masked={"x": Masked(np.full(4, 0.1 * c), weight=1.0, cluster=c % 2, clusters=3)}), client.state

    def init_state(self, *, initial):
        return {}

    def server_update(self, *, state, view: AggregateView):
        return {k: np.asarray(v.mean) for k, v in view.groups.items()} | {
            f"w{k}": np.array([v.total_weight]) for k, v in view.groups.items()}

    def shared_parameters(self, state):
        return {}


def test_cluster_indexed_parts_give_per_cluster_means_without_assignments():
    config = RunConfig(rounds=1, secure=SecureAggregationConfig(protocol="secagg+", clip=4.0, max_weight=100, max_clients=8, min_release_group=2))
    sim = SimulationRunner(algorithm=ClusterProbe(), trainers={c: toy_trainer(c) for c in (1, 2, 3, 4, 5)}, config=config)
    sim.run(progress=False)
    st = sim.state
    np.testing.assert_allclose(st["x[0]"], np.full(4, 0.3), atol=1e-6)         # clients 2, 4
    np.testing.assert_allclose(st["x[1]"], np.full(4, 0.3), atol=1e-6)         # clients 1, 3, 5
    assert st["wx[0]"][0] == pytest.approx(2) and st["wx[1]"][0] == pytest.approx(3)
    assert np.all(np.isnan(st["x[2]"])) and st["wx[2]"][0] == 0


def test_ditto_keeps_a_private_personal_model_and_evaluates_with_it():
    config = RunConfig(rounds=3, secure=SecureAggregationConfig(protocol="secagg+", clip=4.0, max_weight=100, max_clients=8, min_release_group=2))
    sim = SimulationRunner(algorithm=Ditto(lam=0.5), trainers={c: toy_trainer(c, lr=0.1) for c in (1, 2, 3)}, config=config)
    sim.run(progress=False)
    glob = sim.server.shared_parameters(sim.state)
    for c, endpoint in sim.clients.items():
        personal = endpoint.state["personal"]
        assert personal.keys() == glob.keys()
        assert not np.allclose(personal["body"], glob["body"])  # personalised, not the global model
        endpoint.trainer.set_shared(personal)
        assert sim.history[-1].metrics[c]["accuracy"] == endpoint.trainer.evaluate(split="test")["accuracy"]
    assert not any("personal" in k for k in sim.state)  # nothing per client on the server


def test_a_client_with_another_protocol_is_refused_naming_both_sides():
    server_config = RunConfig(rounds=1, secure=SecureAggregationConfig(protocol="secagg+", clip=4.0, max_weight=100, max_clients=8, min_release_group=2))
    client_config = RunConfig(rounds=1, secure=SecureAggregationConfig(protocol="plain", clip=4.0, max_weight=100, max_clients=8, min_release_group=2))
    with pytest.raises(ClientSetupError, match=r"protocol: server 'secagg\+', client 'plain'"):
        _deploy(FedAvg(), server_config, client_config=client_config, n=2)


def test_a_client_with_another_model_size_is_refused_naming_both_sizes():
    config = RunConfig(rounds=1, secure=SecureAggregationConfig(protocol="secagg+", clip=4.0, max_weight=100, max_clients=8, min_release_group=2))
    clients = {c: DeployedClient(client_id=c, task=_task(FedAvg()), config=config) for c in (1, 2)}
    small = toy_trainer(1)
    small_initial = {k: v[:-1] for k, v in small.get_shared().items()}
    task = Task(algorithm=FedAvg(), make_trainer=lambda c: toy_trainer(c), initial=lambda: small_initial)
    with InprocFederation(client_ids=clients, factory=lambda c, r: clients[c].protocol_for(r),
                          handlers=lambda c: clients[c].handlers()) as driver:
        server = DeployedServer(task=task, config=config, driver=driver)
        with pytest.raises(ClientSetupError, match=r"the server sends \d+ values, client \d's model has \d+"):
            server.run()


def test_a_poisson_cohort_below_the_floor_releases_nothing_and_counts_for_the_boundary_delta(monkeypatch):
    """Cohorts of 0, 1 and 3 clients under distributed DP amplified by Poisson sampling at q = 0.5 over
    6 clients, floor n_min = 2: the small rounds are skipped (state unchanged, no error), every round is
    in the ledger, and the outsider epsilon is the released rounds' at delta minus the boundary terms."""
    from scipy import stats

    from dp.ledger import NoReleaseMechanism
    from fl_algorithms.engine import sim

    cohorts = iter([[], [4], [1, 2, 5]])
    monkeypatch.setattr(sim, "make_sampler", lambda *a, **k: type("S", (), {
        "sample": lambda self, ids: next(cohorts), "record": lambda self, n: sim.SamplingRecord("poisson", n, 0.5)})())
    ddp = DistributedDPConfig(l2_clip=1.0, noise_multiplier=3.0, expected_clients=6, min_clients=2, bits=20,
                              sampling_rate=0.5, population=6, delta=0.5)
    config = RunConfig(rounds=3, clients_per_round=3, sampler="poisson",
                       secure=SecureAggregationConfig(protocol="secagg+", clip=4.0, max_weight=100, max_clients=8,
                                                      distributed_dp=ddp))
    ledger = Ledger(LedgerConfig(delta=0.5))
    runner = SimulationRunner(algorithm=FedAvg(), trainers={c: toy_trainer(c, seed=0) for c in range(1, 7)},
                              config=config, ledger=ledger)
    initial = {k: v.copy() for k, v in runner.algorithm.shared_parameters(runner.state).items()}
    runner.run_round(1)
    runner.run_round(2)
    after_skips = runner.algorithm.shared_parameters(runner.state)
    assert all(np.array_equal(after_skips[k], initial[k]) for k in initial)
    rec = runner.run_round(3)
    assert rec.contributors == [1, 2, 5] and not rec.failed
    for c in range(1, 7):
        outsider = [e for e in ledger.entries(c) if e.observer.value == "outsider"]
        assert sorted(e.rounds for e in outsider) == [(1, 2), (3,)]
        skip = next(e for e in outsider if isinstance(e.mechanism, NoReleaseMechanism))
        assert skip.sampling.min_cohort == 2 and skip.count == 2
    plan = runner.aggregator.ddp_encoder(sum(v.size for v in initial.values())).plan
    boundary = stats.binom.pmf(1, 5, 0.5)
    assert ledger.epsilon(6, unit="client", observer="outsider") == pytest.approx(
        plan.epsilon(observer="outsider", rounds=1, delta=0.5 - 2 * boundary))  # 3 rounds' terms in all


def test_amplified_accounting_is_refused_for_group_sums():
    ddp = DistributedDPConfig(l2_clip=1.0, noise_multiplier=1.0, expected_clients=6, min_clients=2, bits=20,
                              sampling_rate=0.5, population=6, delta=0.5)
    config = RunConfig(rounds=1, clients_per_round=3, sampler="poisson",
                       secure=SecureAggregationConfig(protocol="secagg+", clip=4.0, max_weight=100, max_clients=8,
                                                      distributed_dp=ddp))
    runner = SimulationRunner(algorithm=GroupFedAvg(groups={1: 0, 2: 0, 3: 1, 4: 1, 5: 0, 6: 1}),
                              trainers={c: toy_trainer(c, seed=0) for c in range(1, 7)}, config=config,
                              ledger=Ledger(LedgerConfig(delta=0.5)))
    with pytest.raises(ValueError, match="one secure sum over the whole cohort"):
        for t in range(1, 6):  # until Poisson draws a non-empty cohort
            runner.run_round(t)


def test_central_dp_releases_a_noisy_mean_of_clipped_updates_and_the_ledger_says_who_it_protects():
    from dp.central import CentralDPConfig

    central = CentralDPConfig(l2_clip=0.5, noise_multiplier=1.0)
    config = RunConfig(rounds=1, secure=SecureAggregationConfig(protocol="secagg+", clip=4.0, max_weight=100,
                                                                max_clients=8, min_release_group=2, central_dp=central))
    ledger = Ledger()
    runner = SimulationRunner(algorithm=FedAvg(), trainers={c: toy_trainer(c, seed=0) for c in (1, 2, 3)},
                              config=config, ledger=ledger)
    before = {k: v.copy() for k, v in runner.algorithm.shared_parameters(runner.state).items()}
    runner.run_round(1)
    view = runner.last_view
    released = view.released["model-update"][0]
    assert released.mechanism["trusted_aggregator"] is True and released.contributors == frozenset({1, 2, 3})
    after = runner.algorithm.shared_parameters(runner.state)
    step = np.concatenate([after[k] - before[k] for k in sorted(after)])
    # each update clipped to 0.5; the mean moves by noise of std z C / 3 per coordinate
    assert abs(step.std() - 0.5 / 3) < 0.05 and np.linalg.norm(step) > 0.5
    for c in (1, 2, 3):
        assert ledger.epsilon(c, unit="client", observer="server") == float("inf")
        assert 0 < ledger.epsilon(c, unit="client", observer="outsider") < float("inf")
    with pytest.raises(ValueError, match="not both"):
        SecureAggregationConfig(central_dp=central, distributed_dp=DistributedDPConfig(l2_clip=1.0, noise_multiplier=1.0))


def test_central_dp_over_fixed_size_cohorts_is_charged_without_replacement_and_samplers_must_agree():
    from dp.central import CentralDPConfig

    central = CentralDPConfig(l2_clip=0.5, noise_multiplier=1.0, sampling_rate=0.5, population=6, sampler="fixed_size")
    secure = SecureAggregationConfig(protocol="secagg+", clip=4.0, max_weight=100, max_clients=8, min_release_group=2,
                                     central_dp=central)
    for sampler, size in (("poisson", 3), ("seeded", 3), ("fixed_size", 2)):  # refused before any training
        with pytest.raises(ValueError, match="claims amplification"):
            RunConfig(rounds=1, clients_per_round=size, sampler=sampler, secure=secure)
    ledger = Ledger()
    runner = SimulationRunner(algorithm=FedAvg(), trainers={c: toy_trainer(c, seed=0) for c in range(1, 7)},
                              config=RunConfig(rounds=2, clients_per_round=3, sampler="fixed_size", secure=secure),
                              ledger=ledger)
    runner.run_round(1)
    runner.run_round(2)
    for c in range(1, 7):  # every client of the population is charged the sampled mechanism, twice
        [entry] = [e for e in ledger.entries(c) if e.observer.value == "outsider"]
        assert entry.count == 2 and entry.sampling.scheme == "fixed_size"
        assert (entry.mechanism.population, entry.mechanism.sample_size) == (6, 3)
        assert entry.mechanism.noise_multiplier == 0.5 and entry.mechanism.sensitivity == 1.0  # z/2 at 2C
    assert ledger.report()["clients"]["1"]["neighbouring"]["client/outsider"] == "replace_one"
