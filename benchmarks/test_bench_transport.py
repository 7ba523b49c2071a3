"""Whole secure rounds over tcp://127.0.0.1 with one process per client (pytest-benchmark).

Each case starts a server and N client processes and runs two rounds; the timing recorded is the
second round (the first pays connection set-up). With 10% dropout, that many clients crash at the
masked-input stage of the second round. Not part of the test suite (run with `make bench`).
pytest-benchmark's own time column is the whole case (process start-up included); the round time
itself is in `extra_info['round_s']` (see `--benchmark-json`), per stage in `extra_info['stages']`.
"""
from __future__ import annotations

import pytest

from benchmarks.secagg_vs_flower import ours_tcp


@pytest.mark.parametrize("protocol", ["plain", "secagg+", "secagg", "lightsecagg"])
@pytest.mark.parametrize("clients", [10, 50])
@pytest.mark.parametrize("dim", [100_000, 1_000_000])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_tcp_round(benchmark, protocol, clients, dim, dropout):
    if protocol == "plain" and dropout:
        pytest.skip("a plain sum has no dropout handling to measure")
    drops = int(round(clients * dropout))
    params = {"degree": "10"} if protocol == "secagg+" else {}
    box = {}

    def run():
        box.update(ours_tcp(protocol=protocol, clients=clients, dim=dim, rounds=2, params=params, dropouts=drops))
        return box["round_s"]

    benchmark.pedantic(run, rounds=1, iterations=1)
    benchmark.extra_info.update(round_s=box["round_s"], stages=box["stages"], bytes_per_param=box["bytes_per_param"])
