"""Enrolment: every client's long-term keys and the public roster, made once before deployment.

    python -m transport.cli enrol --dir keys --clients 50

writes, in `keys/`:
  roster.json                     public: the server's CurveZMQ key, and per client id its CurveZMQ
                                  key and its Ed25519 verify key. Give it to the server and every client.
  server.key_secret               the server's CurveZMQ pair (give to the server only)
  client-<k>.key_secret           client k's CurveZMQ pair (give to client k only)
  client-<k>.sign_secret          client k's Ed25519 signing key (give to client k only)
Secret files are created with mode 0600; keys come from the OS CSPRNG (libsodium / OpenSSL).

What it buys (the threat model in the README): the server admits a connection only from a
CurveZMQ key on the roster, and a hello only for the id that key is enrolled as, at the
handshake, before any payload is decoded; clients pin the server's key, so nobody else can pose
as the server; clients sign their per-round keys and check every peer's signature against the
roster, so the server that relays keys cannot substitute its own. Enrolment itself (getting the
right roster and secrets to the right parties) is assumed to happen over an authentic channel.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

import zmq
import zmq.auth

from secagg.identity import Identity, Roster, SigningKey
from secagg.messages import MAX_CLIENT_ID
from transport.sockets import CurveClientKeys, CurveServerKeys

ROSTER_FORMAT = "fedsecure-nlp/roster/v1"
ROSTER = "roster.json"


class EnrolmentError(ValueError):
    """The enrolment directory is missing a file, or its files disagree."""


def _write_secret(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def enrol(directory: Path, *, clients: Iterable[int]) -> Path:
    """Create the server's and each client's keys and the roster in `directory` (must not hold an
    enrolment already: keys are never overwritten). Returns the roster's path."""
    ids = sorted(set(int(c) for c in clients))
    if not ids or ids[0] < 1 or ids[-1] > MAX_CLIENT_ID:
        raise ValueError(f"client ids must be in 1..{MAX_CLIENT_ID}")
    directory.mkdir(parents=True, exist_ok=True)
    if (directory / ROSTER).exists():
        raise EnrolmentError(f"{directory} already holds an enrolment; use a new directory")
    server_public, server_secret = zmq.curve_keypair()
    _write_secret(directory / "server.key_secret", json.dumps(
        {"public": server_public.decode(), "secret": server_secret.decode()}))
    entries = {}
    for c in ids:
        public, secret = zmq.curve_keypair()
        signing = SigningKey.generate()
        _write_secret(directory / f"client-{c}.key_secret", json.dumps({"public": public.decode(), "secret": secret.decode()}))
        _write_secret(directory / f"client-{c}.sign_secret", signing.private_bytes().hex())
        entries[str(c)] = {"curve": public.decode(), "verify": signing.public_bytes.hex()}
    path = directory / ROSTER
    path.write_text(json.dumps({"format": ROSTER_FORMAT, "server_curve": server_public.decode(), "clients": entries},
                               indent=1, sort_keys=True))
    return path


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise EnrolmentError(f"{path} is missing") from None
    except (OSError, ValueError) as exc:
        raise EnrolmentError(f"{path}: {exc}") from None


def load_roster(directory: Path) -> tuple[str, dict[int, bytes], Roster]:
    """(the server's CurveZMQ public key, client id -> CurveZMQ public key, the signing roster)."""
    raw = _read_json(directory / ROSTER)
    if raw.get("format") != ROSTER_FORMAT:
        raise EnrolmentError(f"{directory / ROSTER} is not a {ROSTER_FORMAT} roster")
    try:
        curve = {int(c): e["curve"].encode() for c, e in raw["clients"].items()}
        roster = Roster({int(c): bytes.fromhex(e["verify"]) for c, e in raw["clients"].items()})
        server = str(raw["server_curve"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise EnrolmentError(f"{directory / ROSTER} is malformed: {exc}") from None
    if any(len(k) != 40 for k in curve.values()) or len(server) != 40:
        raise EnrolmentError("CurveZMQ keys are 40 Z85 characters")
    return server, curve, roster


def load_server(directory: Path) -> tuple[CurveServerKeys, Roster]:
    """The server's CurveZMQ keys with the client allowlist, and the roster for signed keys."""
    server_public, curve, roster = load_roster(directory)
    pair = _read_json(directory / "server.key_secret")
    if pair.get("public") != server_public:
        raise EnrolmentError("server.key_secret is not the server key the roster lists")
    keys = CurveServerKeys(public_key=pair["public"].encode(), secret_key=pair["secret"].encode(), client_keys=curve)
    return keys, roster


def load_client(directory: Path, client_id: int) -> tuple[CurveClientKeys, Identity]:
    """Client `client_id`'s CurveZMQ keys (pinned to the roster's server key) and its identity."""
    server_public, curve, roster = load_roster(directory)
    if client_id not in curve:
        raise EnrolmentError(f"client {client_id} is not enrolled in {directory / ROSTER}")
    pair = _read_json(directory / f"client-{client_id}.key_secret")
    if pair.get("public", "").encode() != curve[client_id]:
        raise EnrolmentError(f"client-{client_id}.key_secret is not the key the roster lists for client {client_id}")
    try:
        signing = SigningKey.from_private_bytes(bytes.fromhex((directory / f"client-{client_id}.sign_secret").read_text().strip()))
    except FileNotFoundError:
        raise EnrolmentError(f"{directory / f'client-{client_id}.sign_secret'} is missing") from None
    except ValueError as exc:
        raise EnrolmentError(f"client-{client_id}.sign_secret: {exc}") from None
    try:
        identity = Identity(client_id=client_id, signing_key=signing, roster=roster)
    except ValueError as exc:
        raise EnrolmentError(str(exc)) from None
    keys = CurveClientKeys(public_key=pair["public"].encode(), secret_key=pair["secret"].encode(),
                           server_key=server_public.encode())
    return keys, identity
