"""Authenticated encryption between two clients, for `Sealed` messages the server relays unread.

The engine relays a `Sealed(receiver, ciphertext)` to its receiver with the next broadcast and checks
only sizes (`fl_algorithms.api`); what is inside, and the keys, are the sending algorithm's business.
This module is that business, once, for every algorithm that relays:

* Keys. Each client holds a long-term X25519 key pair generated from the OS CSPRNG
  (`secagg.crypto.KeyPair.generate`); the public keys form a `PeerDirectory` every client receives at
  enrolment, as the CurveZMQ keys of a deployment are provisioned. A pair of clients shares
  K_ij = HKDF(X25519(sk_i, pk_j), context(purpose, run, min(i, j), max(i, j))).
* Messages. AES-256-GCM with a random 96-bit nonce; the associated data binds the purpose, the run,
  the sender, the receiver and the round the message was sent in, so a ciphertext replayed to another
  receiver, attributed to another sender, moved to another round or run, or reused for another
  purpose fails authentication.

Threat model: an honest-but-curious server that relays (and may drop or delay) ciphertexts learns
their sizes, senders, receivers and rounds, never their contents. A server that could substitute
public keys in the directory is excluded: the directory must reach clients authenticated (as the
deployment's CurveZMQ server key does). The receiving client learns the plaintext: what that reveals
about the sender is the sending algorithm's privacy statement.
"""
from __future__ import annotations

from collections.abc import Mapping

from fl_algorithms.api import MAX_SEALED_BYTES, Relayed, Sealed
from secagg import crypto

_PURPOSE_LIMIT = 64


class PeerDirectory:
    """Every client's X25519 public key, by client id (public; validated on construction)."""

    def __init__(self, public_keys: Mapping[int, bytes]) -> None:
        keys = {}
        for client, key in public_keys.items():
            if type(client) is not int or client <= 0:
                raise ValueError(f"client ids are positive ints, got {client!r}")
            if type(key) is not bytes or not crypto.is_valid_public_key(key):
                raise ValueError(f"client {client}'s public key is not a valid X25519 key")
            keys[client] = key
        if len(set(keys.values())) != len(keys):
            raise ValueError("two clients share a public key")
        self._keys = dict(keys)   # never handed out: `[]` returns bytes (immutable)

    def __contains__(self, client: object) -> bool:
        return client in self._keys

    def __getitem__(self, client: int) -> bytes:
        return self._keys[client]

    def clients(self) -> tuple[int, ...]:
        return tuple(sorted(self._keys))

    @classmethod
    def generate(cls, clients: range | tuple[int, ...] | list[int]) -> tuple["PeerDirectory", dict[int, crypto.KeyPair]]:
        """Fresh key pairs for `clients` (simulation's enrolment) and the directory of their public keys."""
        pairs = {int(c): crypto.KeyPair.generate() for c in clients}
        return cls({c: p.public_bytes for c, p in pairs.items()}), pairs


class PeerChannel:
    """One client's end of its pairwise channels: seal to a peer, open what a peer sealed to it."""

    def __init__(self, *, client_id: int, keys: crypto.KeyPair, directory: PeerDirectory, run: str,
                 purpose: str) -> None:
        if client_id not in directory or directory[client_id] != keys.public_bytes:
            raise ValueError(f"client {client_id}'s key pair is not the one in the directory")
        if not purpose or len(purpose) > _PURPOSE_LIMIT:
            raise ValueError(f"purpose must be 1..{_PURPOSE_LIMIT} characters")
        self.client_id, self.directory, self.run, self.purpose = client_id, directory, str(run), purpose
        self._keys = keys
        self._shared: dict[int, bytes] = {}

    def _key(self, peer: int) -> bytes:
        if peer == self.client_id:
            raise ValueError("a client does not seal messages to itself")
        if peer not in self.directory:
            raise KeyError(f"client {peer} is not in the peer directory")
        if peer not in self._shared:
            info = crypto.context("peer-channel", self.purpose, self.run, min(peer, self.client_id),
                                  max(peer, self.client_id))
            self._shared[peer] = crypto.agree(self._keys, self.directory[peer], info)
        return self._shared[peer]

    def _aad(self, *, sender: int, receiver: int, round: int) -> bytes:
        return crypto.context("peer-message", self.purpose, self.run, sender, receiver, round)

    def seal(self, *, receiver: int, round: int, plaintext: bytes) -> Sealed:
        """`plaintext` encrypted to `receiver`, bound to this sender and `round` (the round it is sent in)."""
        blob = crypto.seal(self._key(receiver), plaintext,
                           self._aad(sender=self.client_id, receiver=receiver, round=round))
        if len(blob) > MAX_SEALED_BYTES:
            raise ValueError(f"sealed message of {len(blob)} bytes exceeds the relay limit {MAX_SEALED_BYTES}")
        return Sealed(receiver=receiver, ciphertext=blob)

    def open(self, relayed: Relayed) -> bytes:
        """The plaintext of a relayed message; `crypto.DecryptionError` if it was not sealed by
        `relayed.sender` to this client in `relayed.round` for this run and purpose."""
        if relayed.sender not in self.directory or relayed.sender == self.client_id:
            raise crypto.DecryptionError(f"relay from unknown or own sender {relayed.sender}")
        return crypto.open_sealed(self._key(relayed.sender), relayed.ciphertext,
                                  self._aad(sender=relayed.sender, receiver=self.client_id, round=relayed.round))


__all__ = ["PeerDirectory", "PeerChannel"]
