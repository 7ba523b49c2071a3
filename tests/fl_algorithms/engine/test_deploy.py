import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fl_algorithms.engine.deploy import DeployedClient, DeployedServer
from fl_algorithms.engine.sim import RunConfig, SimulationRunner
from fl_algorithms.engine.secure_sum import SecureAggregationConfig
from fl_algorithms.tasks.toy import build
from transport.enrolment import enrol
from transport.simulation import InprocFederation

ROOT = Path(__file__).resolve().parents[3]


def _config(protocol="secagg+", **kw):
    return RunConfig(rounds=3, secure=SecureAggregationConfig(protocol=protocol, clip=4.0, max_weight=100, max_clients=8, min_release_group=2), **kw)


@pytest.mark.parametrize("protocol", ["secagg+", "lightsecagg"])
def test_inproc_deployment_matches_simulation(protocol):
    task, cfg = build({}), _config(protocol)
    clients = {c: DeployedClient(client_id=c, task=build({}), config=cfg) for c in range(1, 5)}
    with InprocFederation(client_ids=clients, factory=lambda c, r: clients[c].protocol_for(r),
                          handlers=lambda c: clients[c].handlers()) as driver:
        server = DeployedServer(task=task, config=cfg, driver=driver)
        history = server.run()
        final = server.evaluate()
    assert [len(r.contributors) for r in history] == [4, 4, 4]
    assert set(final) == {1, 2, 3, 4} and all(0 <= m["accuracy"] <= 1 for m in final.values())
    sim = SimulationRunner(algorithm=build({}).algorithm, trainers={c: build({}).make_trainer(c) for c in range(1, 5)},
                           config=_config("plain"))
    sim.run(progress=False)
    for k, v in sim.algorithm.shared_parameters(sim.state).items():
        np.testing.assert_allclose(server.algorithm.shared_parameters(server.state)[k], v, atol=1e-3)


def test_inproc_deployment_survives_a_client_that_vanishes(tmp_path):
    cfg = _config("secagg+", checkpoint_dir=str(tmp_path))
    clients = {c: DeployedClient(client_id=c, task=build({}), config=cfg) for c in range(1, 6)}
    broken = clients[5]
    broken.protocol_for = lambda r: None  # trains and reports ready, then never joins the secure sum
    from fl_algorithms.engine.deploy import DeploymentConfig
    with InprocFederation(client_ids=clients, factory=lambda c, r: clients[c].protocol_for(r),
                          handlers=lambda c: clients[c].handlers()) as driver:
        server = DeployedServer(task=build({}), config=cfg, driver=driver,
                                deployment=DeploymentConfig(stage_timeout=0.5))
        history = server.run()
    assert all(r.contributors == [1, 2, 3, 4] for r in history)
    resumed = DeployedServer(task=build({}), config=cfg, driver=None)
    assert resumed.load() and len(resumed.history) == 3
    for k, v in server.state.items():
        np.testing.assert_array_equal(resumed.state[k], v)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_multiprocess_tcp_run(tmp_path):
    port = _free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    cfg = tmp_path / "run.toml"
    cfg.write_text('rounds = 3\n[secure]\nprotocol = "secagg+"\nclip = 4.0\nmax_weight = 100.0\nmax_clients = 8\nmin_release_group = 2\n')
    common = [sys.executable, "-m", "fl_algorithms.deploy_cli"]
    enrol(tmp_path / "keys", clients=[1, 2, 3])  # authenticated: CurveZMQ and signed round keys
    task = ["--task", "fl_algorithms.tasks.toy:build", "--config", str(cfg), "--keys", str(tmp_path / "keys")]
    server = subprocess.Popen(common + ["server", *task, "--clients", "3", "--bind", endpoint,
                                        "--run-dir", str(tmp_path / "run")],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    clients = [subprocess.Popen(common + ["client", *task, "--id", str(i), "--connect", endpoint,
                                          "--checkpoint-dir", str(tmp_path / f"c{i}")],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for i in (1, 2, 3)]
    try:
        out, err = server.communicate(timeout=240)
    finally:
        for c in clients:
            try:
                c.wait(timeout=30)
            except subprocess.TimeoutExpired:
                c.kill()
        server.kill()
    assert server.returncode == 0, err[-2000:]
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    rounds = [line for line in lines if "round" in line]
    assert [r["round"] for r in rounds] == [1, 2, 3]
    assert all(r["contributors"] == [1, 2, 3] for r in rounds)
    assert lines[-1]["clients"] == [1, 2, 3] and lines[-1]["final_accuracy"] > 0.5
    assert all((tmp_path / f"c{i}" / "client").is_dir() for i in (1, 2, 3))
    run = tmp_path / "run"  # the run directory: config, per-round metrics, results, checkpoints
    assert [json.loads(x)["round"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    assert "secagg+" in (run / "config.toml").read_text() and (run / "metrics.csv").is_file()
    assert json.loads((run / "results.json").read_text())["summary"] == lines[-1]
    assert (run / "checkpoints" / "server" / "latest" / "state.json").is_file()


@pytest.mark.parametrize("report", [True, False])
def test_clipped_counts_and_metrics_cross_only_when_reporting_is_on(report):
    """A tiny clip range forces clipping; the count reaches the round record like the simulation's,
    and with report_metrics=False no per-client scalar (metrics or clipped count) leaves a client."""
    from fl_algorithms.engine.deploy import DeploymentConfig

    cfg = RunConfig(rounds=1, secure=SecureAggregationConfig(protocol="secagg+", clip=1e-4, max_weight=100,
                                                             max_clients=8, min_release_group=2))
    deployment = DeploymentConfig(report_metrics=report)
    clients = {c: DeployedClient(client_id=c, task=build({}), config=cfg, deployment=deployment) for c in (1, 2, 3)}
    with InprocFederation(client_ids=clients, factory=lambda c, r: clients[c].protocol_for(r),
                          handlers=lambda c: clients[c].handlers()) as driver:
        server = DeployedServer(task=build({}), config=cfg, driver=driver, deployment=deployment)
        (record,) = server.run()
    sim = SimulationRunner(algorithm=build({}).algorithm, trainers={c: build({}).make_trainer(c) for c in (1, 2, 3)},
                           config=cfg)
    (simulated,) = sim.run(progress=False)
    assert simulated.clipped > 0
    if report:
        assert record.clipped == simulated.clipped
        assert all("train_loss" in m for m in record.metrics.values())
    else:
        assert record.clipped == 0 and all(m == {} for m in record.metrics.values())
