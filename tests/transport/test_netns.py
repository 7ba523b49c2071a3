"""Across hosts: the server and the clients in separate network namespaces joined by a veth pair, so
every message crosses a network link between two stacks. SecAgg+ with CurveZMQ (enrolled keys), one
client crashes when asked for its masked input, and the server's sum of the survivors is exact.

Needs root (CAP_NET_ADMIN) and iproute2: `make test-netns`; skipped, with the reason, elsewhere."""
from __future__ import annotations

import json
import subprocess

import pytest

from benchmarks.netns import NetnsPair, unavailable
from tests.transport.test_cli import ENV, PY, ROOT, finish, wait_for_file
from transport.enrolment import enrol

REASON = unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(REASON is not None, reason=f"netns: {REASON}")]


def _cli(net: NetnsPair, side: str, *args: str) -> subprocess.Popen:
    """`python -m transport.cli <side> ARGS` inside that side's namespace ('server' or 'client')."""
    return net.popen(side, ["env", *(f"{k}={v}" for k, v in ENV.items() if k in ("PYTHONPATH", "PATH", "HOME")),
                            PY, "-m", "transport.cli", side, *args], cwd=ROOT, stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE, text=True)


def test_secaggplus_with_curvezmq_across_namespaces_survives_a_crash(tmp_path):
    keys = tmp_path / "keys"
    enrol(keys, clients=[1, 2, 3, 4, 5])
    with NetnsPair() as net:
        server = _cli(net, "server", "--keys", str(keys), "--protocol", "secagg+", "--clients", "5", "--dim", "2000",
                      "--host", net.server_ip, "--rounds", "2", "--check", "--stage-timeout", "15",
                      "--register-timeout", "60", "--endpoint-file", str(tmp_path / "ep"))
        endpoint = wait_for_file(tmp_path / "ep", server)
        assert endpoint.startswith(f"tcp://{net.server_ip}:")
        crash = ("--drop-at-input", "--drop-round", "2")
        clients = [_cli(net, "client", "--keys", str(keys), "--id", str(k), "--connect", endpoint, "--dim", "2000",
                        "--idle-timeout", "30", *(crash if k == 5 else ())) for k in range(1, 6)]
        (code, stdout, stderr), *results = finish([server, *clients], timeout=120)
    rounds = [json.loads(line) for line in stdout.splitlines() if '"event": "round"' in line]
    assert code == 0 and len(rounds) == 2, stdout + stderr
    assert all(r["sum_ok"] is True and r["authenticated"] is True for r in rounds), rounds
    assert rounds[0]["contributors"] == [1, 2, 3, 4, 5]
    assert rounds[1]["contributors"] == [1, 2, 3, 4]             # client 5 died at the masked-input stage
    assert "INSECURE" not in stderr
    assert all(r[0] == 0 for r in results[:4]), results


def test_the_namespaces_are_really_separate():
    with NetnsPair() as net:
        # the server's address is not on the client side's stack, only reachable over the veth link
        own = subprocess.run(["ip", "netns", "exec", net.names["client"], "ip", "-o", "addr"], capture_output=True,
                             text=True, check=True).stdout
        assert net.client_ip in own and net.server_ip not in own
        assert 0 < net.rtt_ms() < 50                           # reachable across the link
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert net.tag not in listed                                 # removed on exit
