"""LightSecAgg speed: Lagrange encode / one-shot decode, and a whole in-memory round.

Anchor (research/secagg_anchors.md, section 4.2, same machine): FedML encodes in 271 ms and
decodes in 290 ms at N=50, d=1e6 (U=N, T=N/2, p=32749, plaintext relay). Target T11: <= 100 ms each.

    .venv/bin/python -m pytest benchmarks/test_bench_lightsecagg.py --benchmark-columns=min,median,max
"""
from __future__ import annotations

import numpy as np
import pytest

from secagg.lcc import LagrangeCode
from secagg.prg import random_vector
from secagg.protocols.lightsecagg import LightSecAggClient, LightSecAggServer
from secagg.ring import FIELD_P31
from secagg.simulate import run_round

FEDML_MS = {(50, 1_000_000): (271, 290), (50, 100_000): (130, 93), (10, 1_000_000): (91, 37),
            (10, 100_000): (12, 8)}
CODES = [  # (N, U, T, d): FedML's setting U=N, T=N/2, and a dropout-tolerant one
    (10, 10, 5, 100_000), (10, 10, 5, 1_000_000), (50, 50, 25, 100_000), (50, 50, 25, 1_000_000),
    (50, 40, 25, 1_000_000),
]
IDS = [f"N{n}-U{u}-T{t}-d{d:.0e}" for n, u, t, d in CODES]


def _info(benchmark, n, u, t, d, which: int) -> None:
    benchmark.extra_info.update(N=n, U=u, T=t, d=d)
    if u == n and (n, d) in FEDML_MS:
        benchmark.extra_info["fedml_ms"] = FEDML_MS[(n, d)][which]


@pytest.mark.parametrize("n,u,t,d", CODES, ids=IDS)
def test_bench_encode(benchmark, n, u, t, d):
    code = LagrangeCode(num_coded=n, num_nodes=u, privacy=t, length=d)
    mask = random_vector(FIELD_P31, d)
    _info(benchmark, n, u, t, d, 0)
    coded = benchmark.pedantic(code.encode, args=(mask,), rounds=7, warmup_rounds=1)
    assert np.array_equal(code.decode(range(u), coded[:u]), mask)


@pytest.mark.parametrize("n,u,t,d", CODES, ids=IDS)
def test_bench_decode(benchmark, n, u, t, d):
    code = LagrangeCode(num_coded=n, num_nodes=u, privacy=t, length=d)
    masks = [random_vector(FIELD_P31, d) for _ in range(3)]
    coded = code.encode(masks[0])
    for z in masks[1:]:
        FIELD_P31.add_(coded, code.encode(z))
    positions = list(range(n - 1, n - 1 - u, -1))  # any U survivors; here the last U, reversed
    pieces = coded[positions]
    _info(benchmark, n, u, t, d, 1)
    total = benchmark.pedantic(code.decode, args=(positions, pieces), rounds=7, warmup_rounds=1)
    expected = masks[0].copy()
    for z in masks[1:]:
        FIELD_P31.add_(expected, z)
    assert np.array_equal(total, expected)


@pytest.mark.parametrize("u,t,dropped", [(50, 25, 0), (40, 25, 5)], ids=["U50-T25-no-drop", "U40-T25-drop5"])
def test_bench_whole_round(benchmark, u, t, dropped):
    """One full in-memory round at N=50, d=1e6 (all 50 clients run in this process, serially)."""
    n, d = 50, 1_000_000
    ids = list(range(1, n + 1))
    inputs = {c: random_vector(FIELD_P31, d) for c in ids}
    drop_at = {"masked_input": set(ids[:dropped])}
    stage_times: dict[str, float] = {}

    def setup():
        stage_times.clear()
        server = LightSecAggServer(round_id=1, clients=ids, length=d, target_survivors=u, privacy=t)
        clients = {c: LightSecAggClient(client_id=c, round_id=1, input_fn=lambda c=c: inputs[c]) for c in ids}
        return (server, clients), {"drop_at": drop_at, "stage_times": stage_times}

    result = benchmark.pedantic(run_round, setup=setup, rounds=1, iterations=1)
    benchmark.extra_info.update(N=n, U=u, T=t, d=d, dropped=dropped,
                                stage_seconds={k: round(v, 3) for k, v in stage_times.items()})
    expected = np.zeros(d, dtype=np.uint32)
    for c in result.contributors:
        FIELD_P31.add_(expected, inputs[c])
    assert len(result.contributors) == n - dropped
    assert np.array_equal(result.ring_sum, expected)
