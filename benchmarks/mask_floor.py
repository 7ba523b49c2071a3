"""The physical floor of masking: raw generation of the masks' AES-256 keystream plus a uint32 add.

No protocol, no chunking logic: the keystream of `secagg.prg` written over the whole vector (GCM's
counter mode, 256 KiB per call) and one in-place numpy add, single-threaded. A secure round cannot do its mask work faster than
(number of masks) x (this time), so it is the yardstick for the overhead a protocol adds.
"""
from __future__ import annotations

import os
import statistics
import time

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from secagg import prg
from secagg.ring import RING_2_32


def one_mask_seconds(length: int, *, repeats: int = 7) -> float:
    """Median time to generate one mask of `length` uint32 words and add it in place."""
    target = np.zeros(length, dtype=np.uint32)
    stream = np.empty(length, dtype=np.uint32)
    times = []
    for _ in range(repeats):
        key = os.urandom(32)
        t0 = time.perf_counter()
        prg._keystream(key).into(memoryview(stream).cast("B"), 4 * length)
        np.add(target, stream, out=target)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def keystream_seconds(length: int, *, repeats: int = 7, ctr: bool = False) -> float:
    """Median time of the masks' keystream alone for `length` uint32 words; `ctr`: the same AES-256 blocks
    through OpenSSL's CTR mode instead (the masks' PRG before 2026-11-30), for comparison."""
    stream = np.empty(length, dtype=np.uint32)
    zeros = bytes(4 * length) if ctr else b""
    times = []
    for _ in range(repeats):
        key = os.urandom(32)
        t0 = time.perf_counter()
        if ctr:
            Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor().update_into(zeros, memoryview(stream).cast("B"))
        else:
            prg._keystream(key).into(memoryview(stream).cast("B"), 4 * length)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def secagg_plus_mask_count(*, clients: int, degree: int, dropped_after_share: int = 0) -> int:
    """Masks generated in one SecAgg+ round with no dropouts before sharing.

    Each client: one pairwise mask per neighbour plus its self mask; the server: one self mask per
    survivor, plus, for each client that dropped after sharing, one pairwise mask per surviving
    neighbour (approximated by `degree`).
    """
    k = min(degree, clients - 1)
    survivors = clients - dropped_after_share
    client_side = survivors * (k + 1)
    server_side = survivors + dropped_after_share * k
    return client_side + server_side


def mask_floor_seconds(*, clients: int, degree: int, length: int, dropped_after_share: int = 0) -> float:
    return secagg_plus_mask_count(clients=clients, degree=degree, dropped_after_share=dropped_after_share) * one_mask_seconds(length)


def cipher_gbps(*, seconds: float = 0.5) -> dict[str, float]:
    """GB/s one core reaches for candidate mask keystreams, each as the masks are made: `update_into` of
    256 KiB of zeros into one reused buffer (best of three bursts of about `seconds`/3 each)."""
    chunk = 4 * prg.CHUNK
    zeros, out = bytes(chunk), memoryview(bytearray(chunk))
    makers = {
        "aes256-ctr": lambda: Cipher(algorithms.AES(os.urandom(32)), modes.CTR(bytes(16))).encryptor(),
        "aes128-ctr": lambda: Cipher(algorithms.AES(os.urandom(16)), modes.CTR(bytes(16))).encryptor(),
        "chacha20": lambda: Cipher(algorithms.ChaCha20(os.urandom(32), bytes(16)), None).encryptor(),
        "aes256-gcm": lambda: Cipher(algorithms.AES(os.urandom(32)), modes.GCM(bytes(12))).encryptor(),
    }
    rates = {}
    for name, make in makers.items():
        best = 0.0
        for _ in range(3):
            enc, calls, t0 = make(), 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds / 3:
                for _ in range(32):
                    enc.update_into(zeros, out)
                calls += 32
            best = max(best, calls * chunk / (time.perf_counter() - t0) / 1e9)
        rates[name] = best
    return rates


def mask_stream_ms(*, length: int = 10_000_000, keys: int = 9, chunks: tuple[int, ...] = (1 << 14, 1 << 15, 1 << 16,
                   1 << 17, 1 << 18), window: int = 1 << 18) -> dict[int, float]:
    """ms per mask when `keys` masks are applied through `MaskStream` over `length` words in upload windows of
    `window` words, for each keystream chunk size (words) in `chunks` (best of five)."""
    x = np.zeros(length, dtype=np.uint32)
    out = np.empty_like(x)
    masks = [(os.urandom(32), 1 if i % 2 else -1) for i in range(keys)]
    kept, result = prg.CHUNK, {}
    try:
        for chunk in chunks:
            prg.CHUNK = chunk
            best = float("inf")
            for _ in range(5):
                stream, t0 = prg.MaskStream(masks, RING_2_32), time.perf_counter()
                for a in range(0, length, window):
                    stream.apply_(out[a : a + window], offset=a, source=x[a : a + window])
                best = min(best, time.perf_counter() - t0)
            result[chunk] = 1e3 * best / keys
    finally:
        prg.CHUNK = kept
    return result


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ciphers", action="store_true", help="also: GB/s of candidate keystreams (AES-256/128-CTR, "
                        "ChaCha20, AES-256-GCM)")
    parser.add_argument("--chunks", action="store_true", help="also: ms per mask through MaskStream for keystream "
                        "chunks of 64 KiB to 1 MiB")
    args = parser.parse_args()
    for d in (100_000, 1_000_000, 10_000_000):
        ks, ctr = keystream_seconds(d), keystream_seconds(d, ctr=True)
        print(f"d={d} one_mask_s={one_mask_seconds(d):.5f} keystream_s={ks:.5f} ctr_keystream_s={ctr:.5f} "
              f"ctr_over_masks={ctr / ks:.2f}")
    if args.ciphers:
        for name, rate in cipher_gbps().items():
            print(f"cipher={name} gb_per_s={rate:.2f}")
    if args.chunks:
        for chunk, ms in mask_stream_ms().items():
            print(f"mask_stream chunk_kib={4 * chunk // 1024} ms_per_mask={ms:.2f} d=1e7 keys=9")
