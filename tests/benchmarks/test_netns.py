"""The namespace pair's rate limit: a tbf link carries no more than its rate (a lower bound on time, which
load cannot break), and bad settings are refused before anything is made.

Needs root (CAP_NET_ADMIN) and iproute2 for the link itself; skipped, with the reason, elsewhere."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from benchmarks.netns import NetnsPair, unavailable

REASON = unavailable()


def test_a_rate_is_positive_and_does_not_come_with_a_delay():
    with pytest.raises(ValueError, match="rate_mbit"):
        NetnsPair(rate_mbit=0)
    with pytest.raises(ValueError, match="not both"):
        NetnsPair(rate_mbit=100, delay_ms=5)


@pytest.mark.slow
@pytest.mark.skipif(REASON is not None, reason=f"netns: {REASON}")
def test_a_rate_limited_link_carries_no_more_than_its_rate():
    """16 MiB across a 100 Mbit/s link take at least (16 MiB - the 1 MiB burst) x 8 / 100 Mbit = 1.26 s."""
    with NetnsPair(rate_mbit=100) as net:
        shown = subprocess.run(["ip", "netns", "exec", net.names["client"], "tc", "qdisc", "show"],
                               capture_output=True, text=True, check=True).stdout
        assert "tbf" in shown and "100Mbit" in shown
        sink = ("import socket;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
                f"s.bind(('{net.server_ip}',9001));s.listen(1);c,_=s.accept();n=0\n"
                "while (b:=c.recv(1<<20)): n+=len(b)\nprint(n)")
        server = net.popen("server", [sys.executable, "-c", sink], stdout=subprocess.PIPE, text=True)
        source = (f"import socket,time;time.sleep(0.3);c=socket.create_connection(('{net.server_ip}',9001));"
                  "t=time.perf_counter();c.sendall(bytes(16<<20));c.close();print(time.perf_counter()-t)")
        started = time.perf_counter()
        sent = subprocess.run(["ip", "netns", "exec", net.names["client"], sys.executable, "-c", source],
                              capture_output=True, text=True, timeout=120)
        received, _ = server.communicate(timeout=120)
        elapsed = time.perf_counter() - started
    assert sent.returncode == 0, sent.stderr
    assert int(received) == 16 << 20
    assert elapsed >= (15 << 20) * 8 / 100e6
