"""Deployment: a server process and client processes over tcp://127.0.0.1, started from the CLI; its
argument checks (argparse errors, exit code 2) and its protocol/length mismatch reports."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import zmq

from secagg.messages import AbortError
from secagg.protocols.plain import PlainClient, PlainServer
from secagg.protocols.secagg import SecAggPlusServer
from transport.cli import main, parser, synthetic_input
from transport.client import ClientConfig, ProtocolMismatchError, run_client
from transport.server import ServerConfig, ServerDriver

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
PY = sys.executable


def cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen([PY, "-m", "transport.cli", *args], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_file(path: Path, proc: subprocess.Popen, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if path.exists() and path.read_text():
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"server did not start: {proc.communicate(timeout=5)}")


def finish(procs: list[subprocess.Popen], timeout: float = 60.0) -> list[tuple[int, str, str]]:
    out = []
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            stdout, stderr = p.communicate()
        out.append((p.returncode, stdout, stderr))
    return out


@pytest.mark.slow
def test_server_and_client_processes_over_tcp_sum_exactly(tmp_path) -> None:
    dim = 1000
    server = cli("server", "--insecure", "--clients", "3", "--dim", str(dim), "--rounds", "2", "--check",
                 "--stage-timeout", "30", "--register-timeout", "60", "--endpoint-file", str(tmp_path / "ep"))
    endpoint = wait_for_file(tmp_path / "ep", server)
    assert endpoint.startswith("tcp://127.0.0.1:")
    clients = [cli("client", "--insecure", "--id", str(k), "--connect", endpoint, "--dim", str(dim), "--idle-timeout", "60",
                   *(["--drop-at-input", "--drop-round", "2"] if k == 3 else []))
               for k in (1, 2, 3)]
    (code, stdout, stderr), *client_results = finish([server, *clients])
    assert code == 0, stderr
    rounds = [json.loads(line) for line in stdout.splitlines() if '"round"' in line]
    assert [r["round"] for r in rounds] == [1, 2]
    assert all(r["sum_ok"] for r in rounds)
    assert rounds[0]["contributors"] == [1, 2, 3] and rounds[0]["dropped"] == {}
    assert rounds[1]["contributors"] == [1, 2] and rounds[1]["dropped"] == {"masked": [3]}  # SecAgg+ (the default)
    assert rounds[0]["bytes_received"] >= 3 * 4 * dim
    exits = [json.loads(out.splitlines()[-1]) for _, out, _ in client_results[:2]]
    assert [e["reason"] for e in exits] == ["shutdown", "shutdown"]
    assert client_results[2][0] == 3  # the dropout exited mid-round


@pytest.mark.slow
def test_secagg_demo_with_a_dropout(tmp_path) -> None:
    demo = subprocess.run([PY, str(ROOT / "examples" / "secagg_demo.py"), "--clients", "4", "--dim", "2000",
                           "--protocol", "plain", "--dropout", "1"],
                          cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=120)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "-> OK" in demo.stdout
    assert "contributors  3:" in demo.stdout and "in 'collect'" in demo.stdout


# ---- argument checks ----------------------------------------------------------------------

SERVER = ["server", "--clients", "3", "--dim", "5"]
CLIENT = ["client", "--id", "1", "--connect", "tcp://127.0.0.1:5555", "--dim", "5"]


@pytest.mark.parametrize("args,message", [
    (["server", "--clients", "3", "--dim", "0"], "--dim: must be at least 1"),
    (["server", "--clients", "3", "--dim", "-5"], "--dim: must be at least 1"),
    (["server", "--clients", "3", "--dim", "many"], "--dim: not an integer"),
    (["server", "--clients", "1", "--dim", "5"], "--clients: must be at least 2"),
    ([*SERVER, "--stage-timeout", "0"], "--stage-timeout: must be positive"),
    ([*SERVER, "--stage-timeout", "inf"], "--stage-timeout: must be a finite number"),
    ([*SERVER, "--register-timeout", "-1"], "--register-timeout: must be at least 0"),
    ([*SERVER, "--rounds", "0"], "--rounds: must be at least 1"),
    ([*SERVER, "--port", "70000"], "--port: must be at most 65535"),
    ([*SERVER, "--host", "tcp://0.0.0.0"], "--host: expected a host name"),
    ([*SERVER, "--endpoint", "inproc://x"], "--endpoint: expected tcp://HOST:PORT or ipc://PATH"),
    ([*SERVER, "--endpoint", "tcp://127.0.0.1:5555", "--port", "5556"], "--endpoint replaces --host and --port"),
    ([*SERVER, "--endpoint-file", "/nonexistent-folder/ep"], "--endpoint-file /nonexistent-folder/ep: its folder"),
    ([*SERVER, "--keys", "/nonexistent-folder"], "--keys /nonexistent-folder: cannot read"),
    (SERVER, "give --keys DIR"),
    (CLIENT, "give --keys DIR"),
    ([*SERVER, "--keys", "k", "--insecure"], "--insecure and --keys contradict"),
    ([*SERVER, "--param", "threshold=5"], "it takes ['chunk', 'colluders', 'corrupt_fraction', 'degree', 'max_streams', 'min_clients', 'planned_dropout', 'threshold_fraction']"),
    ([*SERVER, "--param", "nonsense"], "--param takes NAME=VALUE, got 'nonsense'; secagg+ takes ['chunk', 'colluders', 'corrupt_fraction', 'degree'"),
    ([*SERVER, "--param", "threshold_fraction=1.5"], "threshold_fraction must be in [0, 1)"),
    ([*SERVER, "--param", "min_clients=5"], "--clients 3: secagg+ with --param min_clients=5 needs at least 5"),
    ([*SERVER, "--protocol", "lightsecagg", "--param", "privacy=3"], "lightsecagg with --param privacy=3 refuses"),
    ([*SERVER, "--protocol", "plain", "--param", "degree=4"], "plain has no such parameter; it takes ['chunk', 'max_streams', 'min_clients']"),
    (["client", "--id", "0", "--connect", "tcp://127.0.0.1:1", "--dim", "5"], "--id: must be at least 1"),
    (["client", "--id", "1", "--connect", "127.0.0.1:5555", "--dim", "5"], "--connect: expected tcp://HOST:PORT"),
    (["client", "--id", "1", "--connect", "tcp://*:5555", "--dim", "5"], "--connect: expected tcp://HOST:PORT"),
    (["client", "--id", "1", "--connect", "tcp://127.0.0.1:0", "--dim", "5"], "--connect: expected tcp://HOST:PORT"),
    (["client", "--id", "1", "--connect", "tcp://127.0.0.1:1", "--dim", "0"], "--dim: must be at least 1"),
    ([*CLIENT, "--hello-timeout", "0"], "--hello-timeout: must be positive"),
    ([*CLIENT, "--idle-timeout", "nan"], "--idle-timeout: must be a finite number"),
    ([*CLIENT, "--drop-round", "0"], "--drop-round: must be at least 1"),
    ([*CLIENT, "--drop-round", "2"], "--drop-round only applies with --drop-at-input"),
    ([*CLIENT, "--float-input", "--max-clients", "0"], "--max-clients: must be at least 1"),
    ([*CLIENT, "--float-input", "--max-clients", "10000000000"], "--max-clients 10000000000: ring of 32 bits"),
    ([*CLIENT, "--param", "degree=4"], "the secagg+ client has no such parameter; it takes ['max_length']"),
    ([*CLIENT, "--param", "max_length=4"], "--param max_length=4 is below this client's vector length 5"),
    ([*CLIENT, "--protocol", "lightsecagg", "--param", "min_survivors"],
     "got 'min_survivors'; the lightsecagg client takes ['max_length', 'min_colluders', 'min_group', "
     "'min_privacy', 'min_survivors', 'spill']"),
    (["keygen", "--dir", "keys", "--clients", "0"], "--clients: must be at least 1"),
    ([*SERVER, "--max-message-mib", "0"], "--max-message-mib: must be at least 1"),
    ([*SERVER, "--max-message-mib", "4097"], "--max-message-mib: must be at most 4096"),
    ([*SERVER, "--max-message-mib", "1.5"], "--max-message-mib: not an integer"),
    ([*SERVER, "--max-frames", "7"], "--max-frames: must be at least 8"),
    ([*CLIENT, "--max-message-mib", "-3"], "--max-message-mib: must be at least 1"),
    ([*CLIENT, "--max-frames", "257"], "--max-frames: must be at most 256"),
    (["server", "--clients", "3", "--dim", "20000000", "--param", "chunk=none"],
     "--max-message-mib 64: secagg+ rounds of 3 clients on vectors of length 20000000 take replies of up to"),
    (["server", "--clients", "2", "--dim", "17000000", "--protocol", "plain", "--max-message-mib", "64",
      "--param", "chunk=none"],
     "raise it to at least 65, or stream the inputs in chunks folded as they arrive (--param chunk=262144"),
])
def test_cli_refuses_bad_arguments_with_an_argparse_error(args, message, capsys) -> None:
    # no message: argparse exits with status 2; the reason is asserted on stderr below
    with pytest.raises(SystemExit) as exit_:
        main(args)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err, err
    assert "Traceback" not in err


def test_cli_defaults_to_secagg_plus_and_says_so(capsys) -> None:
    assert parser().parse_args(SERVER).protocol == "secagg+"
    assert parser().parse_args(CLIENT).protocol == "secagg+"
    for command in ("server", "client"):
        # no message: --help exits with status 0; the help text is asserted below
        with pytest.raises(SystemExit) as exit_:
            main([command, "--help"])
        assert exit_.value.code == 0
        assert "default secagg+" in capsys.readouterr().out
    assert "(default secagg+, on both sides" in sys.modules[main.__module__].__doc__


def test_frame_limits_from_the_command_line_reach_the_server_and_client_configs(monkeypatch) -> None:
    import transport.cli as cli_module
    from transport.client import RegistrationError
    from transport.framing import DEFAULT_LIMITS, FrameLimits

    seen = {}

    def no_driver(endpoint, *, config, curve):  # stands in for ServerDriver: record, then fail to bind
        seen["server"] = config
        raise zmq.ZMQError(zmq.EADDRINUSE)

    def no_server(*, config, **kw):  # stands in for run_client: record, then be refused
        seen["client"] = config
        raise RegistrationError("no server here")

    monkeypatch.setattr(cli_module, "ServerDriver", no_driver)
    monkeypatch.setattr(cli_module, "run_client", no_server)
    assert main([*SERVER, "--insecure", "--max-message-mib", "300", "--max-frames", "100"]) == 2
    assert main([*CLIENT, "--insecure", "--max-message-mib", "2048", "--max-frames", "256"]) == 2
    assert seen["server"].limits == FrameLimits(max_message_bytes=300 << 20, max_frames=100)
    assert seen["client"].limits == FrameLimits(max_message_bytes=2048 << 20, max_frames=256)
    assert main([*SERVER, "--insecure"]) == 2 and seen["server"].limits == DEFAULT_LIMITS
    assert main([*CLIENT, "--insecure"]) == 2 and seen["client"].limits == DEFAULT_LIMITS


@pytest.mark.slow
@pytest.mark.parametrize("upload", [("--param", "chunk=none", "--max-message-mib", "72"), ()],
                         ids=["whole-with-max-message-mib", "chunked-by-default"])
def test_replies_above_the_default_message_limit_need_and_pass_with_max_message_mib(tmp_path, upload) -> None:
    """17M-value vectors make replies of 68 MB, over the default 64 MiB: sent whole (chunk=none), the
    server takes them only when told to (without, argparse refuses it up front; see the argument checks);
    by default they stream in 1 MiB chunks under the default limit."""
    dim = 17_000_000
    server = cli("server", "--insecure", "--protocol", "plain", "--clients", "2", "--dim", str(dim), "--check",
                 *upload, "--stage-timeout", "60", "--register-timeout", "60",
                 "--endpoint-file", str(tmp_path / "ep"))
    endpoint = wait_for_file(tmp_path / "ep", server)
    clients = [cli("client", "--insecure", "--protocol", "plain", "--id", str(k), "--connect", endpoint,
                   "--dim", str(dim), "--idle-timeout", "60") for k in (1, 2)]
    (code, stdout, stderr), *results = finish([server, *clients], timeout=180)
    rounds = [json.loads(line) for line in stdout.splitlines() if '"event": "round"' in line]
    assert code == 0 and len(rounds) == 1, stdout + stderr
    assert rounds[0]["sum_ok"] is True and rounds[0]["contributors"] == [1, 2]
    assert rounds[0]["bytes_received"] > 2 * (64 << 20)
    assert rounds[0]["peak_rss_mb"] > 4 * dim / 2**20  # the server's own VmHWM: at least its running sum
    assert all(r[0] == 0 for r in results), results


# ---- mismatches between server and clients ------------------------------------------------

def test_a_plain_client_of_a_secagg_plus_server_raises_naming_both_over_inproc() -> None:
    ctx = zmq.Context()
    errors: dict[int, BaseException] = {}

    def body(cid: int) -> None:
        def factory(r: int) -> PlainClient:
            return PlainClient(client_id=cid, round_id=r, input_fn=lambda: synthetic_input(cid, r, 8))
        try:
            run_client(endpoint="inproc://mismatch", client_id=cid, factory=factory, context=ctx,
                       config=ClientConfig(hello_timeout=5.0, idle_timeout=10.0))
        except BaseException as exc:  # surfaced to the test
            errors[cid] = exc

    try:
        with ServerDriver("inproc://mismatch", context=ctx) as driver:
            threads = [threading.Thread(target=body, args=(cid,), daemon=True) for cid in (1, 2)]
            for t in threads:
                t.start()
            assert driver.wait_for_clients(count=2, timeout=5.0) == {1, 2}
            with pytest.raises(AbortError, match="round aborted at stage 'advertise': 0 clients left, 2 required") as aborted:
                driver.run_round(SecAggPlusServer(round_id=1, clients=[1, 2], length=8), stage_timeout=2.0)
            assert aborted.value.survivors == 0
            for t in threads:
                t.join(10.0)
    finally:
        ctx.term()
    assert sorted(errors) == [1, 2]
    for exc in errors.values():
        assert isinstance(exc, ProtocolMismatchError)
        assert "server speaks secagg or secagg+" in str(exc) and "this client runs plain" in str(exc)


def test_a_secagg_plus_cli_client_of_a_secagg_server_is_refused_at_registration_naming_both(capsys) -> None:
    """SecAgg and SecAgg+ share every message kind, so no request can tell them apart: the
    session both sides announce at registration does, before any round starts."""
    server_session = "secagg length=10"
    with ServerDriver("tcp://127.0.0.1:*", config=ServerConfig(session=server_session)) as driver:
        out: dict[str, int] = {}
        t = threading.Thread(target=lambda: out.setdefault("code", main(
            ["client", "--insecure", "--id", "1", "--connect", driver.endpoint, "--dim", "10", "--protocol", "secagg+",
             "--hello-timeout", "10", "--idle-timeout", "10"])), daemon=True)
        t.start()
        assert driver.wait_for_clients(count=1, timeout=3.0) == frozenset()
        assert driver.rejected_total["registration"] >= 1
        t.join(15.0)
    assert out["code"] == 2
    err = capsys.readouterr().err
    assert "the server runs 'secagg length=10' but this client expects 'secagg+ length=10'" in err, err


def test_a_cli_client_of_the_same_session_registers() -> None:
    """The control for the refusal above: the same protocol and length are welcomed."""
    with ServerDriver("tcp://127.0.0.1:*", config=ServerConfig(session="secagg+ length=10")) as driver:
        t = threading.Thread(target=main, args=(["client", "--insecure", "--id", "1", "--connect", driver.endpoint, "--dim", "10",
                                                 "--protocol", "secagg+", "--hello-timeout", "10",
                                                 "--idle-timeout", "3"],), daemon=True)
        t.start()
        assert driver.wait_for_clients(count=1, timeout=10.0) == {1}
        driver.shutdown()
        t.join(15.0)


def test_a_cli_client_with_another_dim_exits_2_naming_both_lengths(capsys) -> None:
    with ServerDriver("tcp://127.0.0.1:*") as driver:
        out: dict[str, int] = {}
        t = threading.Thread(target=lambda: out.setdefault("code", main(
            ["client", "--insecure", "--id", "1", "--connect", driver.endpoint, "--dim", "11", "--protocol", "plain",
             "--hello-timeout", "10", "--idle-timeout", "10"])), daemon=True)
        t.start()
        assert driver.wait_for_clients(count=1, timeout=10.0) == {1}
        with pytest.raises(AbortError, match="round aborted at stage 'collect': 0 clients left, 1 required"):
            driver.run_round(PlainServer(round_id=1, clients=[1], length=10), stage_timeout=5.0)
        t.join(15.0)
    assert out["code"] == 2
    err = capsys.readouterr().err
    assert "server sums vectors of length 10 but this client's input has length 11 (--dim 11)" in err, err


@pytest.mark.slow
def test_cli_server_secagg_plus_and_plain_clients_name_both_protocols(tmp_path) -> None:
    server = cli("server", "--insecure", "--protocol", "secagg+", "--clients", "2", "--dim", "10", "--stage-timeout", "5",
                 "--register-timeout", "8", "--endpoint-file", str(tmp_path / "ep"))
    endpoint = wait_for_file(tmp_path / "ep", server)
    clients = [cli("client", "--insecure", "--id", str(k), "--connect", endpoint, "--dim", "10", "--protocol", "plain",
                   "--hello-timeout", "30", "--idle-timeout", "30") for k in (1, 2)]
    (code, stdout, stderr), *client_results = finish([server, *clients], timeout=60.0)
    for client_code, _, client_err in client_results:
        assert client_code == 2, client_err
        assert "the server runs 'secagg+ length=10' but this client expects 'plain length=10'" in client_err
    errors = [json.loads(line) for line in stdout.splitlines() if '"error"' in line]
    assert code == 2 and len(errors) == 1, stdout + stderr
    assert "only 0 of 2 clients registered; 2 hellos were refused" in errors[0]["error"]
    assert "'secagg+ length=10'" in errors[0]["error"]
