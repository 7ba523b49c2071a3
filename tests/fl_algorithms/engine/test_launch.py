"""run_on_loopback: the server here, each client its own deploy_cli process over tcp on loopback."""
from pathlib import Path

import numpy as np
import pytest

from fl_algorithms.engine.launch import LaunchError, run_on_loopback, write_client_config
from fl_algorithms.engine.secure_sum import SecureAggregationConfig
from fl_algorithms.engine.sim import RunConfig, SimulationRunner
from fl_algorithms.experiments.config import load_toml
from fl_algorithms.tasks.toy import build, toy_trainer

CONFIG = RunConfig(rounds=2, clients_per_round=2, seed=3, sampler="seeded",  # cohort for cohort with the simulation
                   secure=SecureAggregationConfig(protocol="secagg+", clip=4.0, max_weight=100.0, max_clients=8, min_release_group=2))


def test_client_config_round_trips_through_toml(tmp_path):
    path = write_client_config(CONFIG, tmp_path / "c.toml")
    back = load_toml(RunConfig, path)
    assert back.secure.describe() == CONFIG.secure.describe() and back.eval_split == CONFIG.eval_split
    assert back.curve_split is None
    curved = RunConfig(rounds=7, curve_split="validation", secure=CONFIG.secure)
    back = load_toml(RunConfig, write_client_config(curved, tmp_path / "curve.toml"))
    assert (back.curve_split, back.rounds) == ("validation", 7)  # the client knows its last round


@pytest.mark.slow
def test_deployed_run_samples_the_simulations_cohorts_and_reaches_its_accuracy(tmp_path):
    seen = []
    server = run_on_loopback(task=build({}), task_spec="fl_algorithms.tasks.toy:build", options={}, config=CONFIG,
                             clients=3, log_dir=tmp_path / "logs",
                             on_round=lambda rec, srv: seen.append((rec.round, len(srv.history))))
    assert seen == [(1, 1), (2, 2)]
    sim = SimulationRunner(algorithm=build({}).algorithm, trainers={c: toy_trainer(c) for c in (1, 2, 3)},
                           config=CONFIG)
    sim.run(progress=False)
    assert [r.cohort for r in server.history] == [r.cohort for r in sim.history]
    assert all(len(r.cohort) == 2 for r in server.history)
    for d, s in zip(server.history, sim.history):
        assert d.mean("accuracy") == pytest.approx(s.mean("accuracy"), abs=0.02)
    deployed, simulated = (sim.algorithm.shared_parameters(s) for s in (server.state, sim.state))
    for part in simulated:  # only the fixed-point encoder's stochastic rounding differs
        np.testing.assert_allclose(deployed[part], simulated[part], atol=1e-4)
    assert sorted(p.name for p in (tmp_path / "logs").glob("client-*.log")) == [f"client-{i}.log" for i in (1, 2, 3)]


def test_a_client_that_cannot_start_stops_the_run_with_its_log(tmp_path):
    # Both clients fail the same way; whichever the launcher sees exit first is the one it names.
    with pytest.raises(LaunchError, match=r"client [12] exited with code 2 before registering") as exc:
        run_on_loopback(task=build({}), task_spec="fl_algorithms.tasks.toy:no_such_task", options={}, config=CONFIG,
                        clients=2, log_dir=tmp_path, register_timeout=120)
    message = str(exc.value)
    named = message.split()[1]
    assert "no_such_task" in message and f"client-{named}.log" in message
    assert Path(tmp_path / f"client-{named}.log").is_file()


def test_needs_two_clients(tmp_path):
    with pytest.raises(ValueError, match="at least 2"):
        run_on_loopback(task=build({}), task_spec="x:y", options={}, config=CONFIG, clients=1, log_dir=tmp_path)


def test_client_processes_get_the_runs_frame_limits(tmp_path):
    """client_command turns FrameLimits into deploy_cli options that parse back to the same limits
    (whole MiB, rounded up)."""
    import sys

    from fl_algorithms.deploy_cli import parser
    from fl_algorithms.engine.launch import client_command
    from transport.cli import frame_limits
    from transport.framing import DEFAULT_LIMITS, FrameLimits

    def parsed(limits=None):
        command = client_command(task_spec="fl_algorithms.tasks.toy:build", options={}, config_path=tmp_path / "c.toml",
                                 client_id=3, keys=None, endpoint="tcp://127.0.0.1:5555",
                                 **({} if limits is None else {"limits": limits}))
        assert command[:3] == [sys.executable, "-m", "fl_algorithms.deploy_cli"]
        return frame_limits(parser().parse_args(command[3:]))

    assert parsed() == DEFAULT_LIMITS
    assert parsed(FrameLimits(max_message_bytes=200 << 20, max_frames=100)) == FrameLimits(max_message_bytes=200 << 20,
                                                                                            max_frames=100)
    assert parsed(FrameLimits(max_message_bytes=(200 << 20) + 1)).max_message_bytes == 201 << 20


def test_run_on_loopback_gives_its_server_the_limits_and_refuses_ones_clients_cannot_take(tmp_path, monkeypatch):
    import transport.server
    from transport.framing import FrameLimits

    class Stop(Exception):
        pass

    seen = {}

    def no_driver(endpoint, *, curve, config):  # stands in for ServerDriver: record, stop the launch
        seen["config"] = config
        raise Stop

    monkeypatch.setattr(transport.server, "ServerDriver", no_driver)
    limits = FrameLimits(max_message_bytes=300 << 20, max_frames=128)
    # no message: Stop is this test's own sentinel, raised without one
    with pytest.raises(Stop):
        run_on_loopback(task=build({}), task_spec="fl_algorithms.tasks.toy:build", options={}, config=CONFIG, clients=2,
                        log_dir=tmp_path, limits=limits)
    assert seen["config"].limits == limits
    for bad in (FrameLimits(max_message_bytes=5000 << 20), FrameLimits(max_frames=4), FrameLimits(max_frames=300)):
        with pytest.raises(ValueError, match="limits: client processes take at most 4096 MiB"):
            run_on_loopback(task=build({}), task_spec="fl_algorithms.tasks.toy:build", options={}, config=CONFIG,
                            clients=2, log_dir=tmp_path, limits=bad)
