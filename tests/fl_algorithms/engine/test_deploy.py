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


# ---- what the server reads: ready and evaluation replies sized from the run ------------------

def _record(k: int):
    from dp.released import ReleaseRecord

    return ReleaseRecord(payload=np.arange(1.0, 4.0), unit="example", summary_key=f"r{k}", round_id=1,
                         mechanism={"name": "jl_sketch_gaussian", "sigma": 0.25, "n_documents": 40})


def _ready(*, sealed: int, releases: int, sealed_size: int = 1024):
    from fl_algorithms.api import Sealed
    from fl_algorithms.engine.round import ClientReady
    from fl_algorithms.engine.secure_sum import Layout

    return ClientReady(layouts={"all": Layout((("w", 0, 3),))},
                       sealed=tuple(Sealed(receiver=1 + k % 4, ciphertext=bytes([k % 256]) * sealed_size)
                                    for k in range(sealed)),
                       released={f"r{k}": _record(k) for k in range(releases)})


def _answering(replies):
    """Client handlers: answer fl_train with replies[c] (ready fields) and fl_evaluate with evaluated[c]."""
    from fl_algorithms.engine import wire
    from transport.session import reply_to

    def handlers(c):
        return {wire.TRAIN: lambda msg: reply_to(msg, wire.READY, **replies[c][0]),
                wire.EVALUATE: lambda msg: reply_to(msg, wire.EVALUATED, **replies[c][1])}
    return handlers


def test_ready_with_the_most_relays_and_releases_is_read_and_one_over_any_limit_is_not():
    """Through a real ServerDriver: a ready message with MAX_SEALED_PER_CLIENT sealed messages and
    MAX_RELEASES_PER_CLIENT releases (82 frames if sent one per frame, over the default 64) is read
    whole; one more of either is refused by the wire checks, and one over the run's byte bound is
    dropped by the driver before decoding."""
    from fl_algorithms.engine import wire
    from fl_algorithms.engine.round import MAX_RELEASES_PER_CLIENT, MAX_SEALED_PER_CLIENT, transport_round
    from secagg.messages import SERVER, Message

    evaluated = wire.evaluated_fields({"accuracy": 0.5})
    replies = {
        1: (wire.ready_fields(_ready(sealed=MAX_SEALED_PER_CLIENT, releases=MAX_RELEASES_PER_CLIENT)), evaluated),
        2: (wire.ready_fields(_ready(sealed=MAX_SEALED_PER_CLIENT + 1, releases=0)), evaluated),
        3: (wire.ready_fields(_ready(sealed=0, releases=MAX_RELEASES_PER_CLIENT + 1)), evaluated),
        4: (wire.ready_fields(_ready(sealed=2, releases=0, sealed_size=9 << 20)), evaluated),  # 18 MiB of relays
        5: (wire.ready_fields(_ready(sealed=0, releases=0)), {**evaluated, "junk": b"x" * (2 << 20)}),
        6: (wire.ready_fields(_ready(sealed=2, releases=0, sealed_size=8 << 20)), evaluated),  # all 16 MiB allowed
    }
    from fl_algorithms.engine.deploy import DeploymentConfig

    cfg = _config()
    with InprocFederation(client_ids=replies, factory=lambda c, r: None, handlers=_answering(replies)) as driver:
        # a dropped reply is waited for until the timeout: keep it short
        server = DeployedServer(task=build({}), config=cfg, driver=driver, deployment=DeploymentConfig(broadcast_timeout=3.0))
        assert server.max_ready_bytes == wire.max_ready_bytes(releases=0, sealed_bytes=16 << 20) < 18 << 20
        for c in replies:
            driver.send(Message(kind=wire.TRAIN, round=transport_round(1, 0), sender=SERVER, receiver=c,
                                fields={"meta": b"{}"}))
        got = server.collect_ready(1, cohort=sorted(replies))
        assert sorted(got) == [1, 5, 6]                                # 2, 3: malformed; 4: dropped unread
        assert len(got[1].sealed) == MAX_SEALED_PER_CLIENT and len(got[1].released) == MAX_RELEASES_PER_CLIENT
        assert [s.ciphertext for s in got[1].sealed] == [s.ciphertext for s in _ready(sealed=64, releases=0).sealed]
        assert driver.rejected_total["oversized"] == 1
        metrics = server._evaluate(1, lambda c: {})
        assert sorted(metrics) == [1, 2, 3, 4, 6] and metrics[1] == {"accuracy": 0.5}  # 5's 2 MiB evaluation: dropped
        assert sum(len(s.ciphertext) for s in got[6].sealed) == 16 << 20  # over the old 16 MiB collect default
        assert driver.rejected_total["oversized"] == 2


def test_read_limits_follow_the_run_and_stop_at_the_transport_cap(caplog):
    from fl_algorithms.engine import wire
    from fl_algorithms.engine.deploy import DeploymentConfig
    from transport.framing import FrameLimits
    from transport.server import ServerConfig, ServerDriver

    task = build({})
    class Spec:  # a declared release (only its description matters here)
        def describe(self):
            return {"name": "stub"}

    task.algorithm.releases = {"a": Spec(), "b": Spec()}  # two declared DP releases: up to 8 MiB of payload each
    with ServerDriver("inproc://limits-wide", config=ServerConfig(limits=FrameLimits(max_message_bytes=256 << 20))) as d:
        server = DeployedServer(task=task, config=_config(), driver=d,
                                deployment=DeploymentConfig(max_sealed_bytes=40 << 20))
        assert server.max_ready_bytes == wire.HEADER_ALLOWANCE + wire.MAX_META_BYTES + (40 << 20) + 2 * (8 << 20)
        assert server.max_evaluated_bytes == wire.MAX_EVALUATED_BYTES < 2 << 20
    with ServerDriver("inproc://limits-narrow", config=ServerConfig(limits=FrameLimits(max_message_bytes=8 << 20))) as d:
        with caplog.at_level("WARNING", logger="fl_algorithms.engine.deploy"):
            server = DeployedServer(task=task, config=_config(), driver=d)
        assert server.max_ready_bytes == 8 << 20
        assert "ready messages may legitimately take" in caplog.text and "--max-message-mib" in caplog.text
    with pytest.raises(ValueError, match="max_sealed_bytes"):
        DeploymentConfig(max_sealed_bytes=-1)


def test_a_client_sealing_more_than_the_server_reads_reports_it_instead_of_vanishing(monkeypatch):
    from fl_algorithms.api import ClientBroadcast
    from fl_algorithms.engine import wire
    from fl_algorithms.engine.deploy import DeploymentConfig
    from secagg.messages import SERVER, Message

    cfg = _config()
    deployment = DeploymentConfig(max_sealed_bytes=3000)
    client = DeployedClient(client_id=1, task=build({}), config=cfg, deployment=deployment)
    request = Message(kind=wire.TRAIN, round=64, sender=SERVER, receiver=1, fields=wire.broadcast_fields(
        ClientBroadcast(round=1, sums={"all": None}), round_ids={"all": 65}, config=client.digest))
    for sealed, error in ((2, None), (3, "over DeploymentConfig.max_sealed_bytes (3000)")):
        monkeypatch.setattr(client.endpoint, "on_broadcast", lambda b, n=sealed: (_ready(sealed=n, releases=0), {}, None))
        answer = wire.parse_ready(client.on_train(request).fields)
        if error is None:
            assert len(answer.sealed) == 2
        else:
            assert isinstance(answer, str) and error in answer and "seals 3072 bytes" in answer


def test_a_deployment_refuses_predictable_cohorts():
    """Seeded cohorts follow from the config: a deployment draws them from the OS CSPRNG instead."""
    from fl_algorithms.engine.deploy import DeploymentConfig

    secure = SecureAggregationConfig(protocol="plain", clip=4.0, max_weight=100.0, max_clients=8, min_release_group=2)
    seeded = RunConfig(rounds=1, clients_per_round=2, sampler="seeded", secure=secure)
    with pytest.raises(ValueError, match="seeded"):
        DeployedServer(task=build({}), config=seeded, driver=None)
    DeployedServer(task=build({}), config=seeded, driver=None, deployment=DeploymentConfig(allow_seeded_cohorts=True))
    for sampler in ("poisson", "fixed_size"):
        DeployedServer(task=build({}), config=RunConfig(rounds=1, clients_per_round=2, sampler=sampler, secure=secure),
                       driver=None)
    DeployedServer(task=build({}), config=RunConfig(rounds=1, sampler="seeded", secure=secure), driver=None)  # everyone
