"""Deployment: a server process and client processes over tcp://127.0.0.1, started from the CLI."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

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
    server = cli("server", "--clients", "3", "--dim", str(dim), "--rounds", "2", "--check",
                 "--stage-timeout", "30", "--register-timeout", "60", "--endpoint-file", str(tmp_path / "ep"))
    endpoint = wait_for_file(tmp_path / "ep", server)
    assert endpoint.startswith("tcp://127.0.0.1:")
    clients = [cli("client", "--id", str(k), "--connect", endpoint, "--dim", str(dim), "--idle-timeout", "60",
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
