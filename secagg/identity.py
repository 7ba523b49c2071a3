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
from types import MappingProxyType

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from secagg import crypto
from secagg.messages import MAX_CLIENT_ID

SIGNATURE_BYTES = 64
VERIFY_KEY_BYTES = 32


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
