"""Two network namespaces joined by a veth pair: the server in one, the clients in the other, so that
every message crosses a real (virtual) network link, optionally delayed with tc netem or limited in rate
with tc tbf (the server's link: every client's upload shares it).

    with NetnsPair(delay_ms=10) as net:          # 10 ms each way: 20 ms round-trip time
        server = net.popen("server", [python, "-m", "transport.cli", "server", "--host", net.server_ip, ...])
        client = net.popen("client", [python, "-m", "transport.cli", "client", "--connect", f"tcp://{net.server_ip}:{port}", ...])

Needs root (CAP_NET_ADMIN) and iproute2; `unavailable()` says why not, so callers can skip.
"""
from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Sequence

SUBNET = "10.77.{}.{}"


class NetemUnavailable(RuntimeError):
    """The kernel cannot delay packets (no sch_netem)."""


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=30)


def unavailable() -> str | None:
    """Why network namespaces cannot be used here, or None if they can."""
    if os.name != "posix" or not hasattr(os, "geteuid"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN): run as root, e.g. `sudo make test-netns`"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    probe = f"fsn-probe-{secrets.token_hex(3)}"
    made = _run("ip", "netns", "add", probe)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip() or made.stdout.strip()}"
    try:
        tag = secrets.token_hex(3)
        veth = _run("ip", "link", "add", f"p{tag}a", "netns", probe, "type", "veth", "peer", "name", f"p{tag}b",
                    "netns", probe)
        if veth.returncode != 0:
            return f"cannot create a veth pair: {veth.stderr.strip() or veth.stdout.strip()}"
    finally:
        _run("ip", "netns", "del", probe)
    return None


class NetnsPair:
    """Namespaces '<tag>-srv' and '<tag>-cli', veth '<tag>s' <-> '<tag>c', addresses 10.77.N.1 and
    10.77.N.2; `delay_ms` of netem on each end (round-trip time twice that), or `rate_mbit`: a token
    bucket (tbf) on each end, so each direction carries at most that many megabits a second (10 ms of
    traffic, at least 1 MiB, may burst above it). Removed on exit."""

    def __init__(self, *, delay_ms: float = 0.0, rate_mbit: float | None = None, subnet: int | None = None) -> None:
        if delay_ms < 0:
            raise ValueError("delay_ms must be non-negative")
        if rate_mbit is not None and not rate_mbit > 0:
            raise ValueError("rate_mbit must be positive (None: the veth link's own speed)")
        if rate_mbit is not None and delay_ms > 0:
            raise ValueError("give delay_ms or rate_mbit, not both: netem and tbf on one device need a qdisc tree")
        self.delay_ms = delay_ms
        self.rate_mbit = rate_mbit
        self.tag = f"fsn{secrets.token_hex(3)}"
        octet = subnet if subnet is not None else secrets.randbelow(200) + 20
        self.server_ip, self.client_ip = SUBNET.format(octet, 1), SUBNET.format(octet, 2)
        self.names = {"server": f"{self.tag}-srv", "client": f"{self.tag}-cli"}
        self._made: list[str] = []

    def _must(self, *argv: str) -> None:
        done = _run(*argv)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")

    def __enter__(self) -> "NetnsPair":
        reason = unavailable()
        if reason:
            raise RuntimeError(reason)
        try:
            for name in self.names.values():
                self._must("ip", "netns", "add", name)
                self._made.append(name)
            srv, cli = self.names["server"], self.names["client"]
            a, b = f"{self.tag}s", f"{self.tag}c"
            self._must("ip", "link", "add", a, "netns", srv, "type", "veth", "peer", "name", b, "netns", cli)
            for ns, dev, ip in ((srv, a, self.server_ip), (cli, b, self.client_ip)):
                self._must("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
                self._must("ip", "-n", ns, "link", "set", dev, "up")
                self._must("ip", "-n", ns, "link", "set", "lo", "up")
                if self.delay_ms > 0:
                    done = _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "netem",
                                "delay", f"{self.delay_ms}ms")
                    if done.returncode != 0:
                        raise NetemUnavailable(f"tc netem failed ({done.stderr.strip()}): this kernel has no "
                                               "sch_netem; use a delay relay (benchmarks.delay_relay) instead")
                if self.rate_mbit is not None:
                    burst = max(1 << 20, int(self.rate_mbit * 1e6 / 8 / 100))
                    self._must("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
                               "rate", f"{self.rate_mbit:g}mbit", "burst", str(burst), "latency", "50ms")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        for name in reversed(self._made):
            _run("ip", "netns", "del", name)
        self._made.clear()

    def popen(self, side: str, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        """Start `argv` inside the server's or the clients' namespace."""
        return subprocess.Popen(["ip", "netns", "exec", self.names[side], *argv], **kwargs)

    def rtt_ms(self, *, port: int = 7, samples: int = 5) -> float:
        """The measured TCP round-trip time (ms, median of `samples` one-byte echoes) from the client side
        to the server side: an echo listener in the server's namespace, a timed client in the clients'."""
        import sys

        echo = ("import socket;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
                f"s.bind(('{self.server_ip}',{port}));s.listen(1);c,_=s.accept();c.setsockopt(6,1,1)\n"
                "while (b:=c.recv(1)):c.sendall(b)")
        probe = ("import socket,time,statistics;time.sleep(0.3);"
                 f"c=socket.create_connection(('{self.server_ip}',{port}),timeout=10);c.setsockopt(6,1,1);t=[]\n"
                 f"for _ in range({samples}):\n a=time.perf_counter();c.sendall(b'x');c.recv(1);"
                 "t.append(time.perf_counter()-a)\nprint(1000*statistics.median(t))")
        server = self.popen("server", [sys.executable, "-c", echo], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            done = subprocess.run(["ip", "netns", "exec", self.names["client"], sys.executable, "-c", probe],
                                  capture_output=True, text=True, timeout=60)
        finally:
            server.kill()
            server.wait()
        if done.returncode != 0:
            raise RuntimeError(f"echo probe failed: {done.stderr.strip()}")
        return float(done.stdout.strip())


__all__ = ["NetemUnavailable", "unavailable", "NetnsPair"]
