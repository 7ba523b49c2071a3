"""The delay relay that stands in for tc netem: bytes arrive intact, in order, each direction late by
the configured delay; and the latency benchmark counts a plain round as one round trip."""
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_relay_delays_each_direction_and_keeps_the_bytes():
    listener = socket.create_server(("127.0.0.1", 0))
    target = listener.getsockname()[1]

    def echo():
        conn, _ = listener.accept()
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    threading.Thread(target=echo, daemon=True).start()
    port = _free_port()
    relay = subprocess.Popen([sys.executable, "-m", "benchmarks.delay_relay", "--listen", f"127.0.0.1:{port}",
                              "--target", f"127.0.0.1:{target}", "--delay-ms", "40"], cwd=ROOT)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                conn = socket.create_connection(("127.0.0.1", port), timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        with conn:
            payload = bytes(range(256)) * 400
            start = time.perf_counter()
            conn.sendall(payload)
            got = b""
            while len(got) < len(payload):
                got += conn.recv(65536)
            elapsed = time.perf_counter() - start
        assert got == payload
        assert elapsed >= 0.08          # 40 ms out and 40 ms back
    finally:
        relay.kill()
        relay.wait()
        listener.close()


@pytest.mark.slow
def test_a_plain_round_costs_one_round_trip(capsys):
    from benchmarks.latency import main

    results = main(["--rtts", "0,200", "--protocols", "plain", "--clients", "3", "--dim", "100", "--rounds", "2",
                    "--loopback"])
    added = results[("plain", 200.0)] - results[("plain", 0.0)]
    assert 0.15 < added < 0.4          # one round trip of 200 ms, not two
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("latency protocol=plain rtt_ms=200 ")
