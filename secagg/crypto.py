"""Key agreement, key derivation and authenticated encryption for the protocols.

X25519 + HKDF-SHA256 for every pairwise secret; AES-256-GCM for sealed messages with the round,
stage, sender and receiver bound in as associated data, so a ciphertext cannot be replayed into
another round or redirected to another party. All randomness comes from the OS CSPRNG.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PrivateFormat, PublicFormat, NoEncryption

PUBLIC_KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
_PROTOCOL_LABEL = b"fedsecure-nlp/v1"


class DecryptionError(Exception):
    """A sealed message failed authentication (tampered, replayed, or misaddressed)."""


@dataclass(frozen=True)
class KeyPair:
    private: X25519PrivateKey
    public_bytes: bytes

    @classmethod
    def generate(cls) -> "KeyPair":
        sk = X25519PrivateKey.generate()
        return cls(sk, sk.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))

    @classmethod
    def from_private_bytes(cls, raw: bytes) -> "KeyPair":
        sk = X25519PrivateKey.from_private_bytes(raw)
        return cls(sk, sk.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))

    def private_bytes(self) -> bytes:
        return self.private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


_PROBE = KeyPair.generate()


def context(*parts: int | str | bytes) -> bytes:
    """An unambiguous byte encoding of a tuple of context values (length-prefixed)."""
    out = bytearray(_PROTOCOL_LABEL)
    for p in parts:
        if isinstance(p, int):
            b = p.to_bytes(8, "big", signed=True)
        elif isinstance(p, str):
            b = p.encode()
        else:
            b = bytes(p)
        out += struct.pack(">I", len(b)) + b
    return bytes(out)


def hkdf(secret: bytes, info: bytes, length: int = 32) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(secret)


def agree(own: KeyPair, peer_public: bytes, info: bytes) -> bytes:
    """A 256-bit key shared with the peer: HKDF(X25519(own, peer), info).

    Raises ValueError for a malformed or low-order peer key (the all-zero shared secret).
    """
    if len(peer_public) != PUBLIC_KEY_BYTES:
        raise ValueError("X25519 public keys are 32 bytes")
    shared = own.private.exchange(X25519PublicKey.from_public_bytes(peer_public))
    return hkdf(shared, info)


def is_valid_public_key(peer_public: bytes) -> bool:
    """Whether an X25519 public key yields a non-zero shared secret (not a low-order point)."""
    if len(peer_public) != PUBLIC_KEY_BYTES:
        return False
    try:
        _PROBE.private.exchange(X25519PublicKey.from_public_bytes(peer_public))
    except ValueError:
        return False
    return True


def seal(key: bytes, plaintext: bytes, aad: bytes) -> bytes:
    """AES-256-GCM with a random 96-bit nonce; returns nonce || ciphertext || tag."""
    nonce = os.urandom(NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, aad)


def open_sealed(key: bytes, blob: bytes, aad: bytes) -> bytes:
    if len(blob) < NONCE_BYTES + TAG_BYTES:
        raise DecryptionError("sealed message too short")
    try:
        return AESGCM(key).decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], aad)
    except InvalidTag as exc:
        raise DecryptionError("sealed message failed authentication") from exc
