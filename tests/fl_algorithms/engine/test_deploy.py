import dataclasses
import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fl_algorithms.engine import wire
from fl_algorithms.engine.deploy import DeployedClient, DeployedServer
from fl_algorithms.engine.sim import RunConfig, SimulationRunner
from fl_algorithms.engine.secure_sum import SecureAggregationConfig
from fl_algorithms.tasks.toy import build
from transport.enrolment import enrol
from transport.simulation import InprocFederation

ROOT = Path(__file__).resolve().parents[3]


def _config(protocol="secagg+", rounds=3, **kw):
    return RunConfig(rounds=rounds, secure=SecureAggregationConfig(protocol=protocol, clip=4.0, max_weight=100, max_clients=8, min_release_group=2), **kw)


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
    config = (run / "config.toml").read_text()
    assert "secagg+" in config and 'algorithm = "fedavg"' in config and (run / "metrics.csv").is_file()
    assert 'sampler = "everyone"' in config and 'amplification = "none"' in config  # how cohorts were drawn
    assert (run / "curve.png").stat().st_size > 1000  # a deployed run directory has its curve too
    assert json.loads((run / "results.json").read_text())["summary"] == lines[-1]
    assert (run / "checkpoints" / "server" / "latest" / "state.json").is_file()
    for c in clients:  # the server told them the run finished
        assert c.returncode == 0 and json.loads(c.stdout.read().splitlines()[-1])["exit"] == "finished"


@pytest.mark.slow
def test_sigint_stops_the_server_with_one_line_and_its_clients_say_why(tmp_path):
    import re
    import signal

    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    cfg = tmp_path / "run.toml"
    cfg.write_text('rounds = 500\n[secure]\nprotocol = "secagg+"\nclip = 4.0\nmax_weight = 100.0\nmax_clients = 8\n'
                   'min_release_group = 2\n')
    common = [sys.executable, "-m", "fl_algorithms.deploy_cli"]
    task = ["--task", "fl_algorithms.tasks.toy:build", "--config", str(cfg), "--insecure"]
    # SIGINT as a terminal delivers it: a suite started in the background (or under nohup) passes SIGINT
    # ignored to its children, and Python then leaves it ignored, as a shell's background job should
    server = subprocess.Popen(common + ["server", *task, "--clients", "3", "--bind", endpoint, "--run-dir",
                                        str(tmp_path / "run")], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    clients = [subprocess.Popen(common + ["client", *task, "--id", str(i), "--connect", endpoint], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in (1, 2, 3)]
    try:
        for line in server.stdout:  # the first round is done: interrupt the server as Ctrl-C would
            if line.startswith('{"round"'):
                server.send_signal(signal.SIGINT)
                break
        _, err = server.communicate(timeout=120)
        answers = [c.communicate(timeout=60) for c in clients]
    finally:
        for p in (server, *clients):
            if p.poll() is None:
                p.kill()
    assert server.returncode == 130 and "Traceback" not in err, err[-3000:]
    (said,) = [x for x in err.splitlines() if x.startswith("interrupted:")]
    assert re.fullmatch(r"interrupted: reached round (\d+) of 500; resume with: python -m fl_algorithms.deploy_cli "
                        r"server .* --run-dir \S+ --resume", said), said
    for c, (out, cerr) in zip(clients, answers):
        last = json.loads(out.splitlines()[-1])
        assert c.returncode == 1 and (last["exit"], last["why"]) == ("server_stopped", "interrupted"), (out, cerr)
        assert f"the server ended the run after round {last['round']} (interrupted" in cerr


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


def test_a_deployment_refuses_a_seeded_schedule_only_when_dp_amplification_is_claimed():
    """A seeded schedule is public: a deployment may follow it when nothing is amplified, never to back
    a claim (RunConfig refuses it, the server again if handed one anyway)."""
    from dp.central import CentralDPConfig

    secure = SecureAggregationConfig(protocol="plain", clip=4.0, max_weight=100.0, max_clients=8, min_release_group=2)
    seeded = RunConfig(rounds=1, clients_per_round=2, sampler="seeded", secure=secure)
    DeployedServer(task=build({}), config=seeded, driver=None)  # no DP: nothing is claimed
    for sampler in ("poisson", "fixed_size"):
        DeployedServer(task=build({}), config=RunConfig(rounds=1, clients_per_round=2, sampler=sampler, secure=secure),
                       driver=None)
    claimed = dataclasses.replace(secure, central_dp=CentralDPConfig(l2_clip=0.5, noise_multiplier=1.0,
                                                                     sampling_rate=0.5, population=4))
    with pytest.raises(ValueError, match="claims amplification by the 'poisson' sampler"):
        RunConfig(rounds=1, clients_per_round=2, sampler="seeded", secure=claimed)
    forced = RunConfig(rounds=1, clients_per_round=2, sampler="poisson", secure=claimed)
    object.__setattr__(forced, "sampler", "seeded")  # past RunConfig's own check
    with pytest.raises(ValueError, match="seeded cohort schedule is public.*claims 'poisson'"):
        DeployedServer(task=build({}), config=forced, driver=None)


def test_a_deployment_follows_the_simulations_seeded_cohorts_and_the_ledger_records_them_as_seeded():
    """Central DP accounted at q = 1 claims nothing: the seeded schedule is allowed, every entry records
    it as 'seeded', and the same record cannot back an amplified mechanism."""
    from dp.central import CentralDPConfig
    from dp.ledger import GaussianMechanism, Ledger
    from dp.sampling import AmplificationNotJustified

    secure = SecureAggregationConfig(protocol="secagg+", clip=4.0, max_weight=100.0, max_clients=8, min_release_group=2,
                                     central_dp=CentralDPConfig(l2_clip=0.5, noise_multiplier=1.0))
    cfg = RunConfig(rounds=2, clients_per_round=2, seed=7, sampler="seeded", secure=secure)
    ledger = Ledger()
    clients = {c: DeployedClient(client_id=c, task=build({}), config=cfg) for c in range(1, 5)}
    with InprocFederation(client_ids=clients, factory=lambda c, r: clients[c].protocol_for(r),
                          handlers=lambda c: clients[c].handlers()) as driver:
        server = DeployedServer(task=build({}), config=cfg, driver=driver, ledger=ledger)
        history = server.run()
    sim = SimulationRunner(algorithm=build({}).algorithm, trainers={c: build({}).make_trainer(c) for c in range(1, 5)},
                           config=cfg, ledger=Ledger())
    assert [r.cohort for r in history] == [r.cohort for r in sim.run(progress=False)]
    entries = [e for c in range(1, 5) for e in ledger.entries(c) if e.observer.value == "outsider"]
    assert entries and {e.sampling.scheme for e in entries} == {"seeded"}
    assert {e.sampling.amplification_rate for e in entries} == {1.0}
    with pytest.raises(AmplificationNotJustified, match="'seeded' sampler"):
        ledger.debit(1, GaussianMechanism(noise_multiplier=1.0, sampling_rate=0.5), unit="client",
                     observer="outsider", sampling=entries[0].sampling)


# ---- how a deployment ends ------------------------------------------------------------------------

class LosingDriver:
    """The server's driver, but the clients in `gone` are no longer connected (as the tcp monitor reports a
    killed client process; an inproc federation has no such monitor)."""

    def __init__(self, driver) -> None:
        self.driver, self.gone = driver, set()

    def __getattr__(self, name):
        return getattr(self.driver, name)

    @property
    def clients(self):
        return self.driver.clients - self.gone


def _federation(cfg, ids=(1, 2, 3), **client_kw):
    clients = {c: DeployedClient(client_id=c, task=build({}), config=cfg, **client_kw) for c in ids}
    return clients, InprocFederation(client_ids=clients, factory=lambda c, r: clients[c].protocol_for(r),
                                     handlers=lambda c: clients[c].handlers())


def test_too_few_live_clients_stop_the_run_before_a_round_that_cannot_release(tmp_path):
    from fl_algorithms.engine.deploy import TooFewClientsError

    cfg = RunConfig(rounds=3, checkpoint_dir=str(tmp_path),
                    secure=SecureAggregationConfig(protocol="secagg+", clip=4.0, max_weight=100, max_clients=8,
                                                   min_release_group=3))
    clients, federation = _federation(cfg)
    with federation as driver:
        losing = LosingDriver(driver)
        server = DeployedServer(task=build({}), config=cfg, driver=losing, on_round=lambda rec: losing.gone.add(3))
        assert server.group_minimum == (3, "min_release_group=3")
        with pytest.raises(TooFewClientsError, match=r"only 2 clients are still connected \(\[1, 2\]\), fewer than the "
                                                     r"3 a secure sum needs \(min_release_group=3\): round 2 could "
                                                     r"release nothing, so the run stops after round 1 \(checkpointed\)"
                           ) as stopped:
            server.run()
    assert stopped.value.round == 1 and [r.round for r in server.history] == [1]
    assert DeployedServer(task=build({}), config=cfg, driver=None).load()  # resumable from round 1
    assert clients[1].server_end.reason == clients[2].server_end.reason == "stopped"
    assert clients[1].server_end.round == 1 and "only 2 clients" in clients[1].server_end.detail
    assert clients[3].server_end is None  # gone: nobody to tell


def test_rounds_that_released_nothing_end_the_run_with_an_error():
    """Client 3 trains, then never joins its secure sum: with a group minimum of 3 nothing is released."""
    from fl_algorithms.engine.deploy import DeploymentConfig, NothingReleasedError

    cfg = RunConfig(rounds=1, secure=SecureAggregationConfig(protocol="secagg+", clip=4.0, max_weight=100,
                                                             max_clients=8, min_release_group=3))
    clients, federation = _federation(cfg)
    clients[3].protocol_for = lambda r: None
    with federation as driver:
        server = DeployedServer(task=build({}), config=cfg, driver=driver, deployment=DeploymentConfig(stage_timeout=0.5))
        with pytest.raises(NothingReleasedError, match=r"1 of 1 rounds released nothing \(round 1: all: "):
            server.run()
    assert list(server.unreleased) == [1] and server.history[0].cohort == [1, 2, 3]
    assert clients[1].server_end.reason == "failed" and "released nothing" in clients[1].server_end.detail


def test_a_cohort_below_the_minimum_by_sampling_is_not_a_failure():
    """A sampled cohort smaller than the group minimum releases nothing by design (dp.sampling): not counted."""
    from fl_algorithms.engine.round import RoundRecord

    server = DeployedServer(task=build({}), config=_config(), driver=None)  # group minimum 2
    record = dict(metrics={}, seconds=0.0, secure_seconds=0.0, bytes_uploaded={}, clipped=0)
    server.history = [RoundRecord(round=1, cohort=[4], contributors=[], failed={"all": "DisclosureError"}, **record),
                      RoundRecord(round=2, cohort=[], contributors=[], **record),
                      RoundRecord(round=3, cohort=[1, 2], contributors=[1, 2], **record),
                      RoundRecord(round=4, cohort=[1, 2], contributors=[], failed={"all": "AbortError"}, **record)]
    assert server.unreleased == {4: {"all": "AbortError"}}


def test_clients_hear_that_the_run_finished_or_was_interrupted():
    cfg = _config(rounds=2)
    clients, federation = _federation(cfg)
    with federation as driver:
        DeployedServer(task=build({}), config=cfg, driver=driver).run()
    assert {c.server_end for c in clients.values()} == {wire.RunEnd(reason="finished", round=2)}

    def interrupt(rec):
        raise KeyboardInterrupt

    clients, federation = _federation(cfg)
    with federation as driver:
        with pytest.raises(KeyboardInterrupt):
            DeployedServer(task=build({}), config=cfg, driver=driver, on_round=interrupt).run()
    assert {(c.server_end.reason, c.server_end.round) for c in clients.values()} == {("interrupted", 1)}
    assert {c.last_round for c in clients.values()} == {1}


@pytest.mark.parametrize("exit_reason, end, line, code, says", [
    ("shutdown", wire.RunEnd("finished", 3), {"client": 2, "exit": "finished", "round": 3}, 0, None),
    ("shutdown", wire.RunEnd("interrupted", 1, "SIGINT"),
     {"client": 2, "exit": "server_stopped", "why": "interrupted", "round": 1}, 1,
     "client 2: the server ended the run after round 1 (interrupted: SIGINT)"),
    ("server_gone", None, {"client": 2, "exit": "server_gone", "round": 2}, 1,
     "client 2: the server went away after round 2"),
    ("idle", None, {"client": 2, "exit": "idle", "round": 2}, 1, "no word from the server for 600 s after round 2"),
    ("shutdown", None, {"client": 2, "exit": "shutdown", "round": 2}, 0, None),
])
def test_a_client_says_how_its_run_ended(exit_reason, end, line, code, says):
    from fl_algorithms.engine.deploy import client_exit

    out = client_exit(client_id=2, exit_reason=exit_reason, end=end, last_round=2, idle_timeout=600.0)
    assert (out.line, out.code) == (line, code)
    assert out.message == says if says is None else says in out.message


@pytest.mark.parametrize("setting", [{"max_participations": 2}, {"plain_twin": True}])
def test_a_deployment_refuses_the_simulations_cap_and_in_run_twin(setting):
    """The cap binds against the server only if the clients keep it (they do not count yet); a deployed
    server never holds the inputs the twin check sums."""
    from fl_algorithms.engine.deploy import DeployedServer

    config = RunConfig(rounds=2, secure=SecureAggregationConfig(protocol="secagg+"), **setting)
    with pytest.raises(ValueError, match="simulation settings"):
        DeployedServer(task=None, config=config, driver=None)
