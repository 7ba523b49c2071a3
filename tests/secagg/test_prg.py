"""The mask PRG: an AES-256 keystream (GCM's counter mode, one nonce per segment) as uint32 words (2^32) or
rejection-sampled field elements (F_p)."""
from __future__ import annotations

import os

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from secagg import prg
from secagg.prg import CHUNK, apply_mask_, apply_masks_, field_mask, mask, random_vector
from secagg.ring import FIELD_P31, MERSENNE_31, RING_2_32, Ring

FAST = settings(max_examples=25, deadline=None)
P_FLOOR = 1e-6  # a uniformity test fails spuriously with probability 1e-6
SMALL_PRIME = Ring(5)  # 3 of every 8 candidate words are rejected: the redraw loop runs many times


def _keys():
    return st.binary(min_size=32, max_size=32)


def _reference(key: bytes, start: int, n: int, segment: int) -> np.ndarray:
    """Words [start, start + n) of the keystream from its definition, one AES block at a time (ECB):
    block g is AES-256_key(g // (segment / 4) as 96 bits || g mod (segment / 4) + 2 as 32 bits)."""
    per = segment // 4
    first, last = start // 4, (start + n - 1) // 4
    blocks = b"".join((g // per).to_bytes(12, "big") + (g % per + 2).to_bytes(4, "big") for g in range(first, last + 1))
    stream = Cipher(algorithms.AES(key), modes.ECB()).encryptor().update(blocks)
    return np.frombuffer(stream, dtype="<u4")[start - 4 * first :][:n]


def test_2_32_mask_is_aes_256_gcm_of_zeros_one_nonce_per_segment():
    """Known-answer check: interoperable with any AES-256-GCM implementation. Segment s of the mask is the
    ciphertext (tag dropped) of encrypting SEGMENT zero words under the 96-bit nonce s."""
    key = bytes(range(32))
    n = prg.SEGMENT + CHUNK + 17  # crosses a segment and chunk boundaries
    aead = AESGCM(key)
    expected = b"".join(aead.encrypt(s.to_bytes(12, "big"), bytes(4 * prg.SEGMENT), None)[:-16] for s in (0, 1))
    assert np.array_equal(mask(key, RING_2_32, n), np.frombuffer(expected, dtype="<u4")[:n])


@settings(max_examples=60, deadline=None)
@given(_keys(), st.sampled_from([4, 8, 64]), st.data())
def test_any_window_of_the_masks_matches_the_blockwise_definition_across_segments(key, segment, data):
    """With segments shrunk to a few blocks, windows starting anywhere (a segment's start, its middle,
    inside an AES block) and spanning many segments equal the definition computed block by block: the
    GCM path at segment starts and the CTR path after a seek agree with it and with each other."""
    start = data.draw(st.integers(0, 40 * segment))
    n = data.draw(st.integers(1, 30 * segment))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(prg, "SEGMENT", segment)
        window = apply_masks_(np.zeros(n, dtype=np.uint32), [(key, 1)], RING_2_32, offset=start)
        stream = prg._keystream(key, offset=start)
        small = np.empty(min(n, 3), dtype="<u4")   # a draw of a few words from a stream sought anywhere
        stream.into(memoryview(small).cast("B"), small.nbytes)
    expected = _reference(key, start, n, segment)
    assert np.array_equal(window, expected)
    assert np.array_equal(small, expected[:3])


def test_the_segments_of_a_mask_are_not_repeats():
    """Each segment has a nonce of its own: a mask that repeated every segment would hand the server
    x[i] - x[i + SEGMENT] from a single masked upload."""
    m = mask(os.urandom(32), RING_2_32, 3 * prg.SEGMENT)
    first, second, third = m[: prg.SEGMENT], m[prg.SEGMENT : 2 * prg.SEGMENT], m[2 * prg.SEGMENT :]
    assert not np.array_equal(first, second) and not np.array_equal(second, third)
    assert not np.array_equal(first[:64], second[:64])


@FAST
@given(_keys(), st.sampled_from([RING_2_32, FIELD_P31, SMALL_PRIME]), st.integers(1, 3000))
def test_masks_are_deterministic_per_key_and_distinct_across_keys(key, ring, n):
    a, b = mask(key, ring, n), mask(key, ring, n)
    assert np.array_equal(a, b)
    other = bytes([key[0] ^ 1]) + key[1:]
    if ring.modulus**n > 2**40:  # two keys agree on n words with probability m^-n
        assert not np.array_equal(mask(other, ring, n), a)
    assert a.dtype == np.uint32 and int(a.max()) < ring.modulus


@pytest.mark.parametrize("ring", [RING_2_32, FIELD_P31, SMALL_PRIME])
def test_shorter_mask_is_a_prefix_of_longer_mask(ring):
    key = os.urandom(32)
    long = mask(key, ring, 2 * CHUNK + 5)
    for n in (1, 7, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 5):
        assert np.array_equal(mask(key, ring, n), long[:n]), n


@FAST
@given(_keys(), st.sampled_from([RING_2_32, FIELD_P31, SMALL_PRIME, Ring(65521)]), st.integers(1, 2000))
def test_apply_then_remove_mask_restores_the_vector(key, ring, n):
    x = random_vector(ring, n)
    y = apply_mask_(x.copy(), key, ring)
    assert int(y.max()) < ring.modulus
    expected = ring.add_(x.copy(), mask(key, ring, n))
    assert np.array_equal(y, expected)
    assert np.array_equal(apply_mask_(y, key, ring, sign=-1), x)


def test_apply_mask_is_in_place_and_handles_multiple_chunks():
    key = os.urandom(32)
    for ring in (RING_2_32, FIELD_P31):
        x = np.zeros(3 * CHUNK + 1, dtype=np.uint32)
        out = apply_mask_(x, key, ring)
        assert out is x
        assert np.array_equal(x, mask(key, ring, x.shape[0]))


def test_empty_target_is_fine():
    x = np.zeros(0, dtype=np.uint32)
    assert apply_mask_(x, os.urandom(32), RING_2_32).shape == (0,)
    assert field_mask(os.urandom(32), FIELD_P31, 0).shape == (0,)


@pytest.mark.parametrize("key", [b"", bytes(16), bytes(31), bytes(33)])
def test_short_or_long_keys_are_refused(key):
    with pytest.raises(ValueError, match="AES-256 keys are 32 bytes"):
        mask(key, RING_2_32, 4)


def test_sign_must_be_plus_or_minus_one():
    for sign in (0, 2, -2):
        with pytest.raises(ValueError, match=r"sign must be \+1 or -1"):
            apply_mask_(np.zeros(4, dtype=np.uint32), os.urandom(32), RING_2_32, sign=sign)


def test_field_mask_is_in_range_after_rejection_and_deterministic():
    key = os.urandom(32)
    for ring in (SMALL_PRIME, Ring(3), Ring(65521), Ring((1 << 30) + 3), FIELD_P31):
        v = field_mask(key, ring, 5000)
        assert v.dtype == np.uint32 and int(v.max()) < ring.modulus
        assert np.array_equal(v, field_mask(key, ring, 5000))


def test_field_mask_uses_the_full_field():
    counts = np.bincount(field_mask(os.urandom(32), SMALL_PRIME, 50_000), minlength=5)
    assert counts.shape == (5,)
    assert stats.chisquare(counts).pvalue > P_FLOOR


def test_mersenne_field_mask_is_uniform_in_high_and_low_bits():
    v = field_mask(os.urandom(32), FIELD_P31, 200_000)
    assert int(v.max()) < MERSENNE_31
    top = np.bincount(v >> np.uint32(23), minlength=256)  # top 8 of 31 bits
    low = np.bincount(v & np.uint32(255), minlength=256)
    assert stats.chisquare(top).pvalue > P_FLOOR
    assert stats.chisquare(low).pvalue > P_FLOOR


def test_2_32_mask_bytes_are_uniform():
    v = mask(os.urandom(32), RING_2_32, 100_000)
    counts = np.bincount(v.view(np.uint8), minlength=256)
    assert stats.chisquare(counts).pvalue > P_FLOOR
    assert stats.kstest(v / 2.0**32, "uniform").pvalue > P_FLOOR


def test_masks_under_different_keys_are_uncorrelated():
    a = mask(os.urandom(32), RING_2_32, 100_000).astype(np.float64)
    b = mask(os.urandom(32), RING_2_32, 100_000).astype(np.float64)
    r = np.corrcoef(a, b)[0, 1]
    assert abs(r) < 5 / np.sqrt(a.size)  # 5 sigma


def test_random_vector_is_fresh_each_call():
    for ring in (RING_2_32, FIELD_P31):
        a, b = random_vector(ring, 64), random_vector(ring, 64)
        assert not np.array_equal(a, b)
        assert int(a.max()) < ring.modulus


def test_chunk_size_keeps_peak_memory_bounded():
    """The keystream buffer is one chunk whatever d is (the OOM concern raised against Flower)."""
    bufs = [ks for _, ks in prg._chunks(os.urandom(32), 5 * CHUNK + 3)]
    assert all(b.shape[0] <= CHUNK for b in bufs)
    assert sum(b.shape[0] for b in bufs) == 5 * CHUNK + 3
    assert len({b.__array_interface__["data"][0] for b in bufs}) == 1  # one reused buffer


# ---------------------------------------------------------------- CryptoRandom (rounding and DP noise)

def test_crypto_random_words_read_one_keystream_at_either_width():
    """uint32 and uint64 words of one key are views of the same AES-CTR keystream (the rounding
    stream of `secagg.encoding` and the DP samplers share the class, not a second implementation)."""
    key = bytes(range(32))
    wide = prg.CryptoRandom(key).words(6)
    narrow = prg.CryptoRandom(key).words(12, np.uint32)
    expected = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor().update(bytes(48))
    assert narrow.dtype == np.uint32 and wide.dtype == np.uint64
    assert narrow.tobytes() == wide.tobytes() == expected


def test_crypto_random_continues_its_stream_and_fresh_keys_differ():
    key = os.urandom(32)
    one = prg.CryptoRandom(key)
    parts = np.concatenate([one.words(3), one.words(5)])
    assert np.array_equal(parts, prg.CryptoRandom(key).words(8))  # no reuse of keystream between calls
    assert not np.array_equal(prg.CryptoRandom().words(4), prg.CryptoRandom().words(4))


@pytest.mark.parametrize("key", [b"", bytes(16), bytes(31), bytes(33)])
def test_crypto_random_refuses_keys_that_are_not_aes256(key):
    with pytest.raises(ValueError, match="32 bytes"):
        prg.CryptoRandom(key)


def test_crypto_random_uniforms_lie_in_their_intervals():
    rng = prg.CryptoRandom(bytes(32))
    u, v = rng.uniform(20_000), rng.uniform_open(20_000)
    assert u.min() >= 0.0 and u.max() < 1.0 and v.min() > 0.0 and v.max() <= 1.0
    assert stats.kstest(u, "uniform").pvalue > P_FLOOR


@pytest.mark.parametrize("ring", [RING_2_32, FIELD_P31])
@pytest.mark.parametrize("n", [1, CHUNK - 3, CHUNK, 2 * CHUNK + 5])
def test_applying_many_masks_at_once_equals_applying_them_one_by_one(ring, n):
    """apply_masks_ walks the target chunk by chunk for all keys at once (one pass over the target):
    the same vector as apply_mask_ per key, signs included, across chunk boundaries."""
    keys = [(os.urandom(32), sign) for sign in (1, -1, 1, 1, -1)]
    x = random_vector(ring, n)
    one_by_one = x.copy()
    for key, sign in keys:
        apply_mask_(one_by_one, key, ring, sign=sign)
    at_once = x.copy()
    assert apply_masks_(at_once, keys, ring) is at_once
    assert np.array_equal(at_once, one_by_one)
    assert np.array_equal(apply_masks_(at_once, [(k, -s) for k, s in keys], ring), x)   # and they come off again
    with pytest.raises(ValueError):
        apply_masks_(x, [(keys[0][0], 2), (keys[1][0], 1)], ring)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3 * CHUNK + 37), st.data(), st.integers(1, 3))
def test_a_window_of_the_masks_is_that_slice_of_the_whole_masks(length, data, keys):
    """`offset=`: masking [a, b) of a vector with the keystreams sought to word a (any a, aligned to an AES
    block or not) gives exactly that slice of masking the whole vector, so chunks can be masked one by one."""
    start = data.draw(st.integers(0, length - 1))
    end = data.draw(st.integers(start + 1, length))
    masks = [(os.urandom(32), s) for s in data.draw(st.lists(st.sampled_from([1, -1]), min_size=keys, max_size=keys))]
    whole = np.zeros(length, dtype=np.uint32)
    apply_masks_(whole, masks, RING_2_32)
    window = np.zeros(end - start, dtype=np.uint32)
    apply_masks_(window, masks, RING_2_32, offset=start)
    assert np.array_equal(window, whole[start:end])


def test_mask_windows_are_for_power_of_two_rings_and_non_negative_offsets():
    with pytest.raises(ValueError, match="power-of-two"):
        apply_masks_(np.zeros(4, np.uint32), [(os.urandom(32), 1)], FIELD_P31, offset=4)
    with pytest.raises(ValueError, match="offset"):
        apply_masks_(np.zeros(4, np.uint32), [(os.urandom(32), 1), (os.urandom(32), 1)], RING_2_32, offset=-1)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 3 * CHUNK + 37), st.data(), st.integers(0, 3))
def test_a_mask_stream_gives_each_window_of_the_whole_masks_in_order_or_not(length, data, keys):
    """`MaskStream` keeps each key's AES context between windows: windows asked for in order continue the
    keystreams, any other window seeks them afresh; either way each window is that slice of the whole,
    and `source=` (target <- source + masks) equals copying then masking."""
    masks = [(os.urandom(32), s) for s in data.draw(st.lists(st.sampled_from([1, -1]), min_size=keys, max_size=keys))]
    x = random_vector(RING_2_32, length)
    whole = apply_masks_(x.copy(), masks, RING_2_32)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, length - 1), max_size=6)) if length > 1 else []))
    windows = list(zip([0, *cuts], [*cuts, length]))
    order = data.draw(st.permutations(windows)) if data.draw(st.booleans()) else windows
    stream = prg.MaskStream(masks, RING_2_32)
    out = np.full(length, 7, dtype=np.uint32)  # garbage the source must overwrite
    for a, b in order:
        stream.apply_(out[a:b], offset=a, source=x[a:b])
    assert np.array_equal(out, whole)
    assert np.array_equal(apply_masks_(np.empty_like(x), masks, RING_2_32, source=x), whole)


def test_a_mask_stream_reuses_its_contexts_only_for_the_next_window(monkeypatch):
    """In order: one AES context per key for the whole vector; out of order: a fresh one per key per window."""
    made = []
    keystream = prg._keystream
    monkeypatch.setattr(prg, "_keystream", lambda key, offset=0: made.append(offset) or keystream(key, offset=offset))
    masks = [(os.urandom(32), 1), (os.urandom(32), -1)]
    stream = prg.MaskStream(masks, RING_2_32)
    y = np.zeros(3 * 1000, dtype=np.uint32)
    for a in (0, 1000, 2000):
        stream.apply_(y[a : a + 1000], offset=a)
    assert made == [0, 0]
    stream.apply_(y[:1000], offset=0)
    assert made == [0, 0, 0, 0]


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 5 * CHUNK + 11), st.integers(2, 5), st.integers(0, 100), st.booleans(),
       st.sampled_from([None, 1024, 4 * 1024 + 4]))
def test_masks_applied_by_several_threads_equal_one_thread(length, threads, offset, with_source, segment):
    """`threads=`: contiguous windows masked side by side give the same vector as one pass (the server's
    unmasking), with windows cut anywhere or, where the vector spans a segment per thread, at segment starts."""
    masks = [(os.urandom(32), s) for s in (1, -1, -1)]
    x = random_vector(RING_2_32, length)
    with pytest.MonkeyPatch.context() as mp:
        if segment:
            mp.setattr(prg, "SEGMENT", segment)
        one = apply_masks_(x.copy(), masks, RING_2_32, offset=offset)
        if with_source:
            many = apply_masks_(np.empty_like(x), masks, RING_2_32, offset=offset, source=x, threads=threads)
        else:
            many = apply_masks_(x.copy(), masks, RING_2_32, offset=offset, threads=threads)
    assert np.array_equal(many, one)


@pytest.mark.parametrize("offset", [0, 3 * 1024 + 5])
def test_threads_start_their_windows_at_segment_starts(monkeypatch, offset):
    """The server's threaded unmasking cuts its vector at segment starts, so no thread produces a CTR head
    (the slower path a stream sought into the middle of a segment takes)."""
    monkeypatch.setattr(prg, "SEGMENT", 1024)
    seeks = []
    seek = prg._Keystream._seek
    monkeypatch.setattr(prg._Keystream, "_seek", lambda self, position: seeks.append(position) or seek(self, position))
    apply_masks_(np.zeros(8 * CHUNK, dtype=np.uint32), [(os.urandom(32), 1)], RING_2_32, offset=offset, threads=3)
    heads = [p for p in seeks if p % (4 * 1024)]
    assert heads == ([4 * offset] if offset % 1024 else [])   # only the first window's own start, if unaligned
    assert len(seeks) == 8 * CHUNK // 1024 + (1 if offset % 1024 else 0)


def test_mask_streams_and_sources_are_checked():
    with pytest.raises(ValueError, match="power-of-two"):
        prg.MaskStream([(os.urandom(32), 1)], FIELD_P31)
    with pytest.raises(ValueError, match="sign"):
        prg.MaskStream([(os.urandom(32), 0)], RING_2_32)
    with pytest.raises(ValueError, match="shape"):
        prg.MaskStream([(os.urandom(32), 1)], RING_2_32).apply_(np.zeros(4, np.uint32), source=np.zeros(5, np.uint32))
    with pytest.raises(ValueError, match="power-of-two"):
        apply_masks_(np.zeros(4, np.uint32), [(os.urandom(32), 1)], FIELD_P31, source=np.zeros(4, np.uint32))
    with pytest.raises(ValueError, match="threads"):
        apply_masks_(np.zeros(4, np.uint32), [(os.urandom(32), 1)], RING_2_32, threads=0)
