"""Pairwise sealed messages: they open only for their receiver, from their sender, in their round."""
from __future__ import annotations

import pytest

from fl_algorithms.api import Relayed
from fl_algorithms.engine.peer_channel import PeerChannel, PeerDirectory
from secagg.crypto import DecryptionError, KeyPair


@pytest.fixture(scope="module")
def peers():
    directory, pairs = PeerDirectory.generate([1, 2, 3])
    return directory, {c: PeerChannel(client_id=c, keys=pairs[c], directory=directory, run="r1", purpose="test")
                       for c in pairs}, pairs


def test_round_trip_reaches_only_the_receiver(peers):
    _, channels, _ = peers
    sealed = channels[1].seal(receiver=2, round=4, plaintext=b"adaptive of task 3")
    assert sealed.receiver == 2 and b"adaptive" not in sealed.ciphertext
    assert channels[2].open(Relayed(sender=1, round=4, ciphertext=sealed.ciphertext)) == b"adaptive of task 3"
    with pytest.raises(DecryptionError, match="failed authentication"):       # another client cannot read it, even naming the right sender
        channels[3].open(Relayed(sender=1, round=4, ciphertext=sealed.ciphertext))


@pytest.mark.parametrize("sender,round", [(3, 4), (1, 5), (1, 3)])
def test_misattributed_or_moved_relays_fail(peers, sender, round):
    _, channels, _ = peers
    sealed = channels[1].seal(receiver=2, round=4, plaintext=b"x" * 100)
    with pytest.raises(DecryptionError, match="failed authentication"):
        channels[2].open(Relayed(sender=sender, round=round, ciphertext=sealed.ciphertext))


def test_tampering_and_truncation_fail(peers):
    _, channels, _ = peers
    blob = bytearray(channels[1].seal(receiver=2, round=1, plaintext=b"payload").ciphertext)
    blob[20] ^= 1
    with pytest.raises(DecryptionError, match="failed authentication"):
        channels[2].open(Relayed(sender=1, round=1, ciphertext=bytes(blob)))
    with pytest.raises(DecryptionError, match="sealed message too short"):
        channels[2].open(Relayed(sender=1, round=1, ciphertext=bytes(blob[:10])))


def test_run_and_purpose_are_bound(peers):
    directory, channels, pairs = peers
    sealed = channels[1].seal(receiver=2, round=1, plaintext=b"payload")
    for run, purpose in (("r2", "test"), ("r1", "other")):
        other = PeerChannel(client_id=2, keys=pairs[2], directory=directory, run=run, purpose=purpose)
        with pytest.raises(DecryptionError, match="failed authentication"):
            other.open(Relayed(sender=1, round=1, ciphertext=sealed.ciphertext))


def test_reflection_to_its_sender_fails(peers):
    """The pairwise key is symmetric; the direction in the associated data stops a reflected message."""
    _, channels, _ = peers
    sealed = channels[1].seal(receiver=2, round=1, plaintext=b"payload")
    with pytest.raises(DecryptionError, match="failed authentication"):
        channels[1].open(Relayed(sender=2, round=1, ciphertext=sealed.ciphertext))


def test_fresh_nonces(peers):
    _, channels, _ = peers
    a = channels[1].seal(receiver=2, round=1, plaintext=b"same").ciphertext
    b = channels[1].seal(receiver=2, round=1, plaintext=b"same").ciphertext
    assert a != b


def test_directory_and_channel_validation(peers):
    directory, _, pairs = peers
    with pytest.raises(ValueError, match="not a valid X25519"):
        PeerDirectory({1: b"\x00" * 32})
    with pytest.raises(ValueError, match="share a public key"):
        PeerDirectory({1: pairs[1].public_bytes, 2: pairs[1].public_bytes})
    with pytest.raises(ValueError, match="positive ints"):
        PeerDirectory({0: pairs[1].public_bytes})
    with pytest.raises(ValueError, match="not the one in the directory"):
        PeerChannel(client_id=1, keys=KeyPair.generate(), directory=directory, run="r", purpose="p")
    channel = PeerChannel(client_id=1, keys=pairs[1], directory=directory, run="r", purpose="p")
    with pytest.raises(ValueError, match="itself"):
        channel.seal(receiver=1, round=1, plaintext=b"x")
    with pytest.raises(KeyError, match="client 9 is not in the peer directory"):
        channel.seal(receiver=9, round=1, plaintext=b"x")
    with pytest.raises(DecryptionError, match="relay from unknown or own sender 9"):
        channel.open(Relayed(sender=9, round=1, ciphertext=b"x" * 40))
