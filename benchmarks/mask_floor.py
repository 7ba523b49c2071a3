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


if __name__ == "__main__":
    for d in (100_000, 1_000_000, 10_000_000):
        ks, ctr = keystream_seconds(d), keystream_seconds(d, ctr=True)
        print(f"d={d} one_mask_s={one_mask_seconds(d):.5f} keystream_s={ks:.5f} ctr_keystream_s={ctr:.5f} "
              f"ctr_over_masks={ctr / ks:.2f}")
