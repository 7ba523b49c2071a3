"""SecAgg / SecAgg+ speed and size: primitives, one client's masking work, and whole in-memory rounds.

Anchors and targets are research/secagg_anchors.md §5 (this machine's floors) and §7 (T1-T10):
one mask gen+apply <= 1.0 ms at d=1e6 (T3), client masking for SecAgg+ k~11 at d=1e6 <= 15 ms (T1),
X25519+HKDF <= 0.1 ms (T9), share sealing <= 3 us and <= 100 B (T10), Shamir <= 1 ms per secret at
n <= 100 (T5), upload 4 B/param (T8). Whole rounds run every party serially in this process.

    .venv/bin/python -m pytest benchmarks/test_bench_secagg.py --benchmark-columns=min,median,max
"""
from __future__ import annotations

import os

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from secagg import crypto, shamir
from secagg.encoding import EncodingConfig, FixedPointEncoder
from secagg.prg import apply_mask_, random_vector
from secagg.protocols import registry
from secagg.ring import FIELD_P31, RING_2_32
from secagg.simulate import run_round

SIZES = [100_000, 1_000_000]
SIZE_IDS = ["d1e5", "d1e6"]


# ---- primitives ----------------------------------------------------------------------------------
@pytest.mark.parametrize("d", SIZES, ids=SIZE_IDS)
def test_bench_mask_apply_2_32(benchmark, d):
    """One pairwise mask: AES-256 keystream added in place mod 2^32 (T3: <= 1.0 ms at 1e6)."""
    target = np.zeros(d, dtype=np.uint32)
    key = os.urandom(32)
    benchmark.extra_info.update(d=d, bytes=4 * d)
    benchmark(apply_mask_, target, key, RING_2_32)


@pytest.mark.parametrize("d", SIZES, ids=SIZE_IDS)
def test_bench_mask_apply_p31(benchmark, d):
    """The same in F_p, p = 2^31 - 1 (rejection sampling, then a modular add)."""
    target = np.zeros(d, dtype=np.uint32)
    key = os.urandom(32)
    benchmark.extra_info.update(d=d, bytes=4 * d)
    benchmark(apply_mask_, target, key, FIELD_P31)


@pytest.mark.parametrize("d", SIZES, ids=SIZE_IDS)
def test_bench_raw_aes_ctr_keystream(benchmark, d):
    """The floor: the raw keystream of the same number of bytes into a preallocated buffer."""
    out = np.empty(d, dtype=np.uint32)
    zeros = bytes(4 * d)
    key = os.urandom(32)

    def keystream():
        Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor().update_into(zeros, memoryview(out).cast("B"))

    benchmark.extra_info.update(d=d, bytes=4 * d)
    benchmark(keystream)


def test_bench_encode_1e6(benchmark):
    """Clip + scale + stochastic rounding (AES-CTR driven) of one d=1e6 float vector."""
    enc = FixedPointEncoder(EncodingConfig(clip=8.0, max_weight=1.0, max_clients=1000))
    x = np.random.default_rng(0).normal(0, 1, 1_000_000).astype(np.float32)  # benchmark data only
    benchmark.extra_info.update(d=x.shape[0])
    out, _ = benchmark(enc.encode, x, weight=0.5)
    assert out.shape == (1_000_001,)


def test_bench_decode_1e6(benchmark):
    enc = FixedPointEncoder(EncodingConfig(clip=8.0, max_weight=1.0, max_clients=1000))
    ring_sum, _ = enc.encode(np.zeros(1_000_000), weight=0.5)
    benchmark(enc.decode, ring_sum)


@pytest.mark.parametrize("n", [50, 100])
def test_bench_shamir_split(benchmark, n):
    """What one client shares: its self-mask seed and its masking key, t = n/2 + 1."""
    xs, t = list(range(1, n + 1)), n // 2 + 1
    secrets_ = [shamir.random_element(), shamir.random_element()]
    benchmark.extra_info.update(n=n, t=t, secrets=2)
    benchmark(shamir.split, secrets_, xs=xs, threshold=t)


@pytest.mark.parametrize("n", [50, 100])
def test_bench_shamir_combine(benchmark, n):
    """Reconstruct one secret from t shares (Lagrange coefficients included: the unbatched worst case)."""
    xs, t = list(range(1, n + 1)), n // 2 + 1
    secret = shamir.random_element()
    (row,) = shamir.split([secret], xs=xs, threshold=t)
    benchmark.extra_info.update(n=n, t=t)
    got = benchmark(shamir.combine, xs[:t], [row[:t]])
    assert got == [secret]


def test_bench_x25519_keygen(benchmark):
    benchmark(crypto.KeyPair.generate)


def test_bench_x25519_agree_hkdf(benchmark):
    """One pairwise key: X25519 exchange + HKDF-SHA256 (T9: <= 0.1 ms)."""
    a, b = crypto.KeyPair.generate(), crypto.KeyPair.generate()
    info = crypto.context("pairwise-mask", 1, 1, 2)
    benchmark(crypto.agree, a, b.public_bytes, info)


def test_bench_aes_gcm_seal_share(benchmark):
    """Sealing one 64-byte share pair with (round, sender, receiver) bound in (T10: <= 3 us, <= 100 B)."""
    key, aad, plain = os.urandom(32), crypto.context("share", 1, 1, 2), os.urandom(64)
    blob = benchmark(crypto.seal, key, plain, aad)
    benchmark.extra_info.update(ciphertext_bytes=len(blob))
    assert len(blob) <= 100


def test_bench_aes_gcm_open_share(benchmark):
    key, aad = os.urandom(32), crypto.context("share", 1, 1, 2)
    blob = crypto.seal(key, os.urandom(64), aad)
    benchmark(crypto.open_sealed, key, blob, aad)


# ---- one client's masking work (T1) -----------------------------------------------------------------
def test_bench_client_masked_stage_secagg_plus_k10_d1e6(benchmark):
    """Client 1's 'masked' stage with 10 neighbours at d=1e6: quantise + 10 key agreements + 11 masks
    (the shares were opened in the 'check' stage). Everything before it is rebuilt outside the timer."""
    d, n = 1_000_000, 11
    enc = FixedPointEncoder(EncodingConfig(clip=8.0, max_weight=1.0, max_clients=1000))
    x = np.random.default_rng(1).normal(0, 1, d - 1)  # benchmark data only
    ids = list(range(1, n + 1))
    server_cls, client_cls = registry.server_class("secagg+"), registry.client_class("secagg+")

    holder: dict = {}

    def setup():
        server = server_cls(round_id=1, clients=ids, length=d, degree=10)
        clients = {c: client_cls(client_id=c, round_id=1, input_fn=lambda: enc.encode(x, weight=1.0)[0]) for c in ids}
        reqs = server.start()
        for _ in range(3):  # advertise, share, check
            for c, r in reqs.items():
                server.accept(clients[c].handle(r))
            reqs = server.advance()
        holder["client"] = clients[1]
        return (reqs[1],), {}

    def masked_stage(req):
        return holder["client"].handle(req)

    benchmark.extra_info.update(d=d, neighbours=10)
    reply = benchmark.pedantic(masked_stage, setup=setup, rounds=5, iterations=1)
    assert reply["vector"].shape == (d,)


# ---- whole rounds ------------------------------------------------------------------------------------
ROUNDS = [
    (name, n, d, drop)
    for name in ("plain", "secagg+", "secagg")
    for n in (10, 50, 100)
    for d in SIZES
    for drop in (0.0, 0.1)
]


def _round_id(p) -> str:
    name, n, d, drop = p
    return f"{name}-N{n}-d{d:.0e}-drop{int(drop * 100)}"


class _CountingClient:
    """Forwards to a client and adds up the payload bytes of its replies."""

    def __init__(self, inner, tally: dict, cid: int) -> None:
        self.inner, self.tally, self.cid = inner, tally, cid

    def handle(self, msg):
        reply = self.inner.handle(msg)
        if reply is not None:
            self.tally[self.cid] = self.tally.get(self.cid, 0) + reply.nbytes()
        return reply


@pytest.mark.parametrize("name,n,d,drop", ROUNDS, ids=[_round_id(p) for p in ROUNDS])
def test_bench_round(benchmark, name, n, d, drop):
    """One full in-memory round; 10% dropout happens at the costliest point ('masked' / 'collect')."""
    ids = list(range(1, n + 1))
    x = random_vector(RING_2_32, d)  # every client uploads the same vector: the sum is easy to check
    dropped = set(ids[: int(round(drop * n))])
    drop_at = {("collect" if name == "plain" else "masked"): dropped} if dropped else {}
    stage_times: dict[str, float] = {}
    tally: dict[int, int] = {}
    server_cls, client_cls = registry.server_class(name), registry.client_class(name)

    def setup():
        stage_times.clear()
        tally.clear()
        server = server_cls(round_id=1, clients=ids, length=d)
        clients = {c: _CountingClient(client_cls(client_id=c, round_id=1, input_fn=lambda: x), tally, c) for c in ids}
        return (server, clients), {"drop_at": drop_at, "stage_times": stage_times}

    heavy = name == "secagg" and n >= 50 and d >= 1_000_000 or n * d >= 50_000_000
    result = benchmark.pedantic(run_round, setup=setup, rounds=1 if heavy else 2, iterations=1)
    contributors = sorted(result.contributors)
    per_client = max(tally[c] for c in contributors)
    benchmark.extra_info.update(
        protocol=name, N=n, d=d, dropped=len(dropped),
        upload_bytes_per_client=per_client, upload_bytes_per_param=round(per_client / d, 4),
        stage_seconds={k: round(v, 3) for k, v in stage_times.items()},
    )
    assert len(contributors) == n - len(dropped)
    expected = (x.astype(np.uint64) * len(contributors) % (1 << 32)).astype(np.uint32)
    assert np.array_equal(result.ring_sum, expected)
    assert per_client <= 4 * d + 200 * n  # T8: 4 B/param plus a small per-neighbour overhead
