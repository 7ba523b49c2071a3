"""Long-term client identities from enrolment: Ed25519 signing keys and the public roster.

Per-round X25519 keys are fresh in every round; what binds them to a client is a signature with
its long-term key over the round, the client id and the advertised keys (`advertisement`). Every
client checks its neighbours' signatures against the roster (client id -> public signing key,
distributed at enrolment, the same file for everyone), so a server that relays the keys cannot
substitute its own: the active-server defence of Bonawitz et al. (CCS 2017, Sec. 4). The
consistency-check round of that variant (signatures over the survivor set) is not implemented.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from secagg import crypto
from secagg.messages import MAX_CLIENT_ID

SIGNATURE_BYTES = 64
VERIFY_KEY_BYTES = 32

_P = 2**255 - 19
_D = -121665 * pow(121666, -1, _P) % _P
_SQRT_M1 = pow(2, (_P - 1) // 4, _P)


def _decode_point(key: bytes) -> tuple[int, int] | None:
    """The affine point (x, y) an Ed25519 key encodes (RFC 8032, 5.1.3), or None if the encoding
    is not a canonical one of a point on the curve."""
    y = int.from_bytes(key, "little")
    sign, y = y >> 255, y & ((1 << 255) - 1)
    if y >= _P:
        return None
    x2 = (y * y - 1) * pow(_D * y * y + 1, -1, _P) % _P
    x = pow(x2, (_P + 3) // 8, _P)
    if (x * x - x2) % _P:
        x = x * _SQRT_M1 % _P
    if (x * x - x2) % _P or (x == 0 and sign):
        return None
    return (_P - x if x & 1 != sign else x), y


def is_valid_verify_key(key: bytes) -> bool:
    """Whether `key` is the canonical encoding of an Ed25519 point of large order: not the identity,
    all zeros or another of the eight small-order points (a key for which signatures can be forged
    without any secret, or that several parties could claim), nor an encoding of no point at all."""
    return type(key) is bytes and len(key) == VERIFY_KEY_BYTES and _large_order(key)


@lru_cache(maxsize=1 << 16)  # a roster's keys are checked when it is loaded and again by `Roster`
def _large_order(key: bytes) -> bool:
    point = _decode_point(key)
    if point is None:
        return False
    x, y = point
    X, Y, Z = x, y, 1
    for _ in range(3):  # [8]P in projective coordinates (a = -1 twisted Edwards doubling)
        b, c, d = (X + Y) ** 2 % _P, X * X % _P, Y * Y % _P
        e = -c % _P
        f = (e + d) % _P
        j = (f - 2 * Z * Z) % _P
        X, Y, Z = (b - c - d) * j % _P, f * (e - d) % _P, f * j % _P
    return X != 0 or Y != Z  # [8]P is the identity (0, 1) exactly for the small-order points


@dataclass(frozen=True)
class SigningKey:
    """A client's long-term Ed25519 key (generated from the OS CSPRNG at enrolment)."""

    private: Ed25519PrivateKey
    public_bytes: bytes

    @classmethod
    def generate(cls) -> "SigningKey":
        sk = Ed25519PrivateKey.generate()
        return cls(sk, sk.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))

    @classmethod
    def from_private_bytes(cls, raw: bytes) -> "SigningKey":
        sk = Ed25519PrivateKey.from_private_bytes(raw)
        return cls(sk, sk.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))

    def private_bytes(self) -> bytes:
        return self.private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())

    def sign(self, message: bytes) -> bytes:
        return self.private.sign(message)

    def __repr__(self) -> str:
        return f"SigningKey(public={self.public_bytes.hex()[:16]}…)"


@dataclass(frozen=True)
class Roster:
    """Public: every enrolled client id and its verify key."""

    keys: Mapping[int, bytes]

    def __post_init__(self) -> None:
        keys = {}
        for cid, key in self.keys.items():
            if type(cid) is not int or not 0 < cid <= MAX_CLIENT_ID:
                raise ValueError(f"roster client ids are ints in 1..{MAX_CLIENT_ID}, got {cid!r}")
            if type(key) is not bytes or len(key) != VERIFY_KEY_BYTES:
                raise ValueError(f"client {cid}'s verify key must be {VERIFY_KEY_BYTES} bytes")
            if not is_valid_verify_key(key):
                raise ValueError(f"client {cid}'s verify key is not an Ed25519 point of large order "
                                 f"(all zeros, the identity, another small-order point, or no point at all)")
            keys[cid] = key
        if len(set(keys.values())) != len(keys):
            raise ValueError("two clients share a verify key")
        object.__setattr__(self, "keys", MappingProxyType(keys))

    def verify(self, client_id: int, signature: bytes, message: bytes) -> bool:
        """Whether `signature` is client `client_id`'s over `message` (False for an unknown id)."""
        key = self.keys.get(client_id)
        if key is None or type(signature) is not bytes or len(signature) != SIGNATURE_BYTES:
            return False
        try:
            Ed25519PublicKey.from_public_bytes(key).verify(signature, message)
        except InvalidSignature:
            return False
        return True


@dataclass(frozen=True)
class Identity:
    """What one enrolled client holds: its signing key and the roster to check its peers."""

    client_id: int
    signing_key: SigningKey
    roster: Roster

    def __post_init__(self) -> None:
        if self.roster.keys.get(self.client_id) != self.signing_key.public_bytes:
            raise ValueError(f"client {self.client_id}'s signing key is not the one the roster lists for it")


def advertisement(protocol: str, round_id: int, client_id: int, keys: bytes) -> bytes:
    """What a client signs: its round keys bound to the protocol family, the round and its id, so a
    signature cannot be replayed into another round or presented for another client."""
    return crypto.context(protocol, "advertise", round_id, client_id, keys)
