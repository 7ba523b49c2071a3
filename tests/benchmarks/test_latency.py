"""The delay relay that stands in for tc netem: bytes arrive intact, in order, each direction late by
the configured delay; and the latency benchmark times a plain round and reports its round trips.
Only lower bounds on time here (load cannot break them); the round-trip count itself is the
benchmark's output (`python -m benchmarks.latency`), not a unit-test assertion."""
import re
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
        assert elapsed >= 0.08          # 40 ms out and 40 ms back: a floor that load can only raise
    finally:
        relay.kill()
        relay.wait()
        listener.close()


@pytest.mark.slow
def test_a_plain_round_takes_at_least_a_round_trip_and_the_count_is_reported(capsys):
    from benchmarks.latency import main

    results = main(["--rtts", "0,200", "--protocols", "plain", "--clients", "3", "--dim", "100", "--rounds", "2",
                    "--loopback"])
    # a request and its reply cross the relay once each: 200 ms at the least, however loaded the machine;
    # one round trip rather than two is a ratio of timings, read off the benchmark's round_trips
    assert results[("plain", 200.0)] >= 0.2
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(r"latency protocol=plain rtt_ms=200 round_s=\d+\.\d{3} round_trips=-?\d+\.\d", last), last
