"""X25519 + HKDF key agreement and AES-256-GCM sealing with the context bound in as AAD."""
from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from secagg import crypto
from secagg.crypto import DecryptionError, KeyPair, agree, context, open_sealed, seal

FAST = settings(max_examples=40, deadline=None)

# Low-order X25519 points (RFC 7748 §6.1 "check for the all-zero value"): the shared secret is 0.
LOW_ORDER_POINTS = [
    bytes(32),
    (1).to_bytes(32, "little"),
    bytes.fromhex("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800"),
]


def share_aad(round_id: int, sender: int, receiver: int) -> bytes:
    """What the SecAgg protocols bind into a share ciphertext."""
    return context("share", round_id, sender, receiver)


def test_agreement_is_symmetric_and_info_separated():
    a, b, c = KeyPair.generate(), KeyPair.generate(), KeyPair.generate()
    k_ab = agree(a, b.public_bytes, b"info-1")
    assert k_ab == agree(b, a.public_bytes, b"info-1")
    assert len(k_ab) == 32
    assert agree(a, b.public_bytes, b"info-2") != k_ab
    assert agree(a, c.public_bytes, b"info-1") != k_ab


def test_keypair_round_trips_through_raw_private_bytes():
    kp = KeyPair.generate()
    again = KeyPair.from_private_bytes(kp.private_bytes())
    assert again.public_bytes == kp.public_bytes
    assert len(kp.public_bytes) == crypto.PUBLIC_KEY_BYTES
    assert KeyPair.generate().public_bytes != kp.public_bytes


@pytest.mark.parametrize("bad", [b"", bytes(31), bytes(33), bytes(64)])
def test_agree_refuses_wrong_length_public_keys(bad):
    with pytest.raises(ValueError, match="X25519 public keys are 32 bytes"):
        agree(KeyPair.generate(), bad, b"i")


@pytest.mark.parametrize("point", LOW_ORDER_POINTS)
def test_agree_refuses_low_order_points(point):
    # no message: the cryptography library refuses a low-order point with its own generic error
    with pytest.raises(ValueError):
        agree(KeyPair.generate(), point, b"i")


@FAST
@given(st.binary(max_size=300), st.binary(max_size=80))
def test_seal_open_round_trip(plaintext, aad):
    key = os.urandom(32)
    blob = seal(key, plaintext, aad)
    assert len(blob) == len(plaintext) + crypto.NONCE_BYTES + crypto.TAG_BYTES
    assert open_sealed(key, blob, aad) == plaintext


def test_nonces_are_fresh():
    key = os.urandom(32)
    blobs = {seal(key, b"same", b"aad") for _ in range(50)}
    assert len(blobs) == 50
    assert len({b[: crypto.NONCE_BYTES] for b in blobs}) == 50


@FAST
@given(st.data())
def test_any_bit_flip_is_detected(data):
    key = os.urandom(32)
    blob = bytearray(seal(key, os.urandom(64), b"aad"))
    bit = data.draw(st.integers(0, 8 * len(blob) - 1))
    blob[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(DecryptionError, match="failed authentication"):
        open_sealed(key, bytes(blob), b"aad")


def test_truncated_or_extended_ciphertexts_are_rejected():
    key = os.urandom(32)
    blob = seal(key, b"x" * 64, b"a")
    short, forged = "sealed message too short", "failed authentication"
    for bad, message in ((b"", short), (blob[:10], short), (blob[: crypto.NONCE_BYTES + crypto.TAG_BYTES - 1], short),
                         (blob[:-1], forged), (blob + b"\0", forged)):
        with pytest.raises(DecryptionError, match=message):
            open_sealed(key, bad, b"a")


def test_wrong_key_is_rejected():
    blob = seal(os.urandom(32), b"secret", b"a")
    with pytest.raises(DecryptionError, match="failed authentication"):
        open_sealed(os.urandom(32), blob, b"a")


def test_ciphertext_replayed_from_another_round_fails():
    key = os.urandom(32)
    blob = seal(key, b"share", share_aad(7, 1, 2))
    assert open_sealed(key, blob, share_aad(7, 1, 2)) == b"share"
    with pytest.raises(DecryptionError, match="failed authentication"):
        open_sealed(key, blob, share_aad(8, 1, 2))


def test_ciphertext_redirected_or_reflected_fails():
    """The pairwise key is symmetric, so only the AAD stops a reflection back to the sender."""
    a, b = KeyPair.generate(), KeyPair.generate()
    info = context("share-key", 3, 1, 2)
    k = agree(a, b.public_bytes, info)
    blob = seal(k, b"share", share_aad(3, 1, 2))
    assert open_sealed(agree(b, a.public_bytes, info), blob, share_aad(3, 1, 2)) == b"share"
    with pytest.raises(DecryptionError, match="failed authentication"):  # reflected: presented to 1 as if 2 had sent it
        open_sealed(k, blob, share_aad(3, 2, 1))
    with pytest.raises(DecryptionError, match="failed authentication"):  # redirected to a third party
        open_sealed(k, blob, share_aad(3, 1, 5))


_part = st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(max_size=8), st.binary(max_size=8))


@FAST
@given(st.lists(_part, max_size=5), st.lists(_part, max_size=5))
def test_context_is_injective_on_same_typed_tuples(a, b):
    """Length-prefixing makes concatenation ambiguities impossible, e.g. ('ab','c') vs ('a','bc')."""
    def typed(t):
        return [(type(x).__name__, x) for x in t]

    if typed(a) != typed(b) and [type(x) for x in a] == [type(x) for x in b]:
        assert context(*a) != context(*b)


def test_context_has_no_concatenation_ambiguity():
    assert context("ab", "c") != context("a", "bc")
    assert context(b"\x01", b"") != context(b"", b"\x01")
    assert context("share", 12, 3) != context("share", 1, 23)


def test_context_separates_the_protocol_labels_and_directions():
    values = {
        context("share", 1, 2, 3), context("share", 1, 3, 2), context("share", 2, 2, 3),
        context("share-key", 1, 2, 3), context("pairwise-mask", 1, 2, 3), context("self-mask", 1, 2),
        context("sharek", "ey", 1, 2, 3), context("share", 1, 23),
    }
    assert len(values) == 8
    assert context() == context()


def test_hkdf_output_length_and_separation():
    s = os.urandom(32)
    assert len(crypto.hkdf(s, b"a")) == 32
    assert len(crypto.hkdf(s, b"a", length=64)) == 64
    assert crypto.hkdf(s, b"a") != crypto.hkdf(s, b"b")
    assert crypto.hkdf(s, b"a") == crypto.hkdf(s, b"a")
