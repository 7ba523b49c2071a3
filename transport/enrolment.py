"""Enrolment: every client's long-term keys and the public roster, made once before deployment.

Two ways to enrol. Without a trusted dealer (recommended), each party makes its own keys and only
public entries travel:

    python -m transport.cli enrol-client --dir mykeys --id 7     # on client 7's machine, one per client
    python -m transport.cli init-server --dir srvkeys              # on the server's machine
    python -m transport.cli roster --dir roster --server srvkeys/server.public.json \\
        --entry entries/client-*.public.json                         # whoever assembles the roster

`enrol_client` writes client k's CurveZMQ pair (`client-<k>.key_secret`) and Ed25519 signing key
(`client-<k>.sign_secret`), mode 0600, plus `client-<k>.public.json`: its public CurveZMQ key, its
verify key and a proof of possession (the new signing key's signature over the entry format, the
client id and both public keys), so an entry cannot be built around someone else's verify key or
moved to another id. `init_server` writes `server.key_secret` and `server.public.json`.
`assemble_roster` checks every entry (format, id, key encodings and lengths, the proof, no
repeated id or key) and writes `roster.json`; any bad entry is an EnrolmentError naming its file,
and nothing is written. Copy `roster.json` next to each party's own secret files: `load_server`
and `load_client` need nothing else. No secret ever leaves the machine that made it.

Loading (`load_roster`, and so `load_server` and `load_client`) runs the same checks
(`check_entries`) on `roster.json`, since a roster may be edited by hand or in transit: a bad
roster is an EnrolmentError naming the file, the client ids and the field, before any socket
opens. Every key must be a canonical encoding of a point of large order (no all-zero, identity
or other low-order Curve25519 or Ed25519 key) and no client may list the server's key. Secret
files are refused, as ssh refuses them, when group or others may read or write them.

With a trusted dealer (`enrol`, `python -m transport.cli enrol --dir keys --clients 50`), one
machine creates every secret in one folder; it then knows every client's signing key, so it must
not be the aggregation server, and each client's secrets must reach it over a private channel.

Either way the folder holds:
  roster.json                     public: the server's CurveZMQ key, and per client id its CurveZMQ
                                  key and its Ed25519 verify key. Give it to the server and every client.
  server.key_secret               the server's CurveZMQ pair (the server only)
  client-<k>.key_secret           client k's CurveZMQ pair (client k only)
  client-<k>.sign_secret          client k's Ed25519 signing key (client k only)
Secret files are created with mode 0600 and never overwritten; keys come from the OS CSPRNG
(libsodium / OpenSSL).

What it buys (the threat model, docs/threat_model.md): the server admits a connection only from a
CurveZMQ key on the roster, and a hello only for the id that key is enrolled as, at the
handshake, before any payload is decoded; clients pin the server's key, so nobody else can pose
as the server; clients sign their per-round keys and check every peer's signature against the
roster, so the server that relays keys cannot substitute its own. What it assumes: every party
gets the same, right roster. Whoever assembles it could list keys of its own making under a
client's id (a proof shows possession of a key, not who the client is), so public entries must
reach the assembler over an authentic channel, and every party should compare the roster's
SHA-256 (`roster_fingerprint`, printed by `roster`) with the others' over one before using it.
A client's own entry is checked against its secrets when it loads the roster. The proof does not
cover the CurveZMQ key's secret (a box key cannot sign): an entry listing another party's CurveZMQ
key lets only that key's owner connect, under the entry's id, and a repeated key is refused.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import zmq
import zmq.auth
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from zmq.utils import z85

from secagg import crypto
from secagg.identity import SIGNATURE_BYTES, VERIFY_KEY_BYTES, Identity, Roster, SigningKey, is_valid_verify_key
from secagg.messages import MAX_CLIENT_ID
from transport.sockets import CurveClientKeys, CurveServerKeys

ROSTER_FORMAT = "fedsecure-nlp/roster/v1"
ROSTER = "roster.json"
CLIENT_ENTRY_FORMAT = "fedsecure-nlp/client-entry/v1"
"""Format of `client-<k>.public.json`, the public entry a client hands to the roster's assembler."""
SERVER_ENTRY_FORMAT = "fedsecure-nlp/server-entry/v1"
"""Format of `server.public.json`, the server's public CurveZMQ key."""
SERVER_PUBLIC = "server.public.json"
SERVER_SECRET = "server.key_secret"
CURVE_KEY_CHARS = 40
"""A CurveZMQ public key in Z85 text (32 bytes)."""
MAX_ENTRY_BYTES = 4096
"""Largest public entry file read (a valid one is about 400 bytes), and largest secret key file."""
CURVE25519_P = 2**255 - 19
"""Curve25519's field prime: a canonical public key (u-coordinate, little-endian) is below it."""

_Z85 = re.compile("[" + re.escape(z85.Z85CHARS.decode()) + "]{%d}" % CURVE_KEY_CHARS)
_HEX = re.compile("[0-9a-f]*")


class EnrolmentError(ValueError):
    """The enrolment directory is missing a file, or its files disagree (the message names the file)."""


def client_public_name(client_id: int) -> str:
    return f"client-{client_id}.public.json"


def _client_secret_names(client_id: int) -> tuple[str, str]:
    return f"client-{client_id}.key_secret", f"client-{client_id}.sign_secret"


def _write_secret(path: Path, text: str) -> None:
    _write_new(path, text, mode=0o600)


def _write_new(path: Path, text: str, *, mode: int) -> None:
    """Create `path` with `mode` and write `text`; FileExistsError rather than overwrite (O_EXCL)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _refuse_existing(directory: Path, names: Iterable[str], what: str) -> None:
    found = [n for n in names if (directory / n).exists()]
    if found:
        raise EnrolmentError(f"{directory} already holds {what} ({', '.join(found)}); keys are never overwritten")


def _check_id(client_id: object) -> int:
    if type(client_id) is not int or not 1 <= client_id <= MAX_CLIENT_ID:
        raise ValueError(f"client ids are ints in 1..{MAX_CLIENT_ID}, got {client_id!r}")
    return client_id


def enrol(directory: Path, *, clients: Iterable[int]) -> Path:
    """Trusted dealer: create the server's and every client's keys and the roster in `directory`
    (must not hold an enrolment already: keys are never overwritten). Returns the roster's path.

    This machine then holds every client's secrets; `enrol_client`, `init_server` and
    `assemble_roster` enrol without anyone holding more than their own."""
    ids = sorted(set(int(c) for c in clients))
    if not ids or ids[0] < 1 or ids[-1] > MAX_CLIENT_ID:
        raise ValueError(f"client ids must be in 1..{MAX_CLIENT_ID}")
    directory.mkdir(parents=True, exist_ok=True)
    if (directory / ROSTER).exists():
        raise EnrolmentError(f"{directory} already holds an enrolment; use a new directory")
    server_public, server_secret = zmq.curve_keypair()
    _write_secret(directory / SERVER_SECRET, json.dumps(
        {"public": server_public.decode(), "secret": server_secret.decode()}))
    entries = {}
    for c in ids:
        public, secret = zmq.curve_keypair()
        signing = SigningKey.generate()
        _write_secret(directory / f"client-{c}.key_secret", json.dumps({"public": public.decode(), "secret": secret.decode()}))
        _write_secret(directory / f"client-{c}.sign_secret", signing.private_bytes().hex())
        entries[c] = ClientEntry(client_id=c, curve=public.decode(), verify=signing.public_bytes)
    return _write_roster(directory / ROSTER, server_public.decode(), entries.values())


# ---- enrolment without a dealer --------------------------------------------------------------

@dataclass(frozen=True)
class ClientEntry:
    """One client's public roster entry: its id, CurveZMQ public key (Z85) and Ed25519 verify key."""

    client_id: int
    curve: str
    verify: bytes
    proof: bytes | None = None
    """The proof of possession (`proof_message` signed by the verify key), where the source carries
    one: every client entry does, `roster.json` may. `check_entries` verifies it."""


def proof_message(*, client_id: int, curve: str, verify: bytes) -> bytes:
    """What a client's new signing key signs in its public entry: the entry format, the id and both
    public keys, so the proof cannot be reused for another id, another key or another format."""
    return crypto.context(CLIENT_ENTRY_FORMAT, "proof-of-possession", client_id, curve, verify)


def enrol_client(directory: Path, *, client_id: int) -> Path:
    """On client `client_id`'s machine: create its CurveZMQ pair and Ed25519 signing key (mode 0600)
    and its public entry `client-<k>.public.json` in `directory`; returns the entry's path. Only the
    entry leaves the machine (to whoever assembles the roster). Existing files are never overwritten."""
    _check_id(client_id)
    directory.mkdir(parents=True, exist_ok=True)
    key_name, sign_name = _client_secret_names(client_id)
    public_name = client_public_name(client_id)
    _refuse_existing(directory, (key_name, sign_name, public_name), f"client {client_id}'s keys")
    public, secret = zmq.curve_keypair()
    signing = SigningKey.generate()
    _write_secret(directory / key_name, json.dumps({"public": public.decode(), "secret": secret.decode()}))
    _write_secret(directory / sign_name, signing.private_bytes().hex())
    proof = signing.sign(proof_message(client_id=client_id, curve=public.decode(), verify=signing.public_bytes))
    entry = {"format": CLIENT_ENTRY_FORMAT, "client_id": client_id, "curve": public.decode(),
             "verify": signing.public_bytes.hex(), "proof": proof.hex()}
    path = directory / public_name
    _write_new(path, json.dumps(entry, indent=1, sort_keys=True) + "\n", mode=0o644)
    return path


def init_server(directory: Path) -> Path:
    """On the server's machine: create its CurveZMQ pair (`server.key_secret`, mode 0600) and
    `server.public.json` (its public key, for the roster) in `directory`; returns the latter's path."""
    directory.mkdir(parents=True, exist_ok=True)
    _refuse_existing(directory, (SERVER_SECRET, SERVER_PUBLIC), "a server key")
    public, secret = zmq.curve_keypair()
    _write_secret(directory / SERVER_SECRET, json.dumps({"public": public.decode(), "secret": secret.decode()}))
    path = directory / SERVER_PUBLIC
    _write_new(path, json.dumps({"format": SERVER_ENTRY_FORMAT, "curve": public.decode()}, indent=1) + "\n",
               mode=0o644)
    return path


def _read_entry_json(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_ENTRY_BYTES + 1)
    except FileNotFoundError:
        raise EnrolmentError(f"{path}: no such file") from None
    except OSError as exc:
        raise EnrolmentError(f"{path}: {exc}") from None
    if len(raw) > MAX_ENTRY_BYTES:
        raise EnrolmentError(f"{path}: over {MAX_ENTRY_BYTES} bytes, not a public entry")
    try:
        obj = json.loads(raw.decode())
    except (ValueError, UnicodeDecodeError) as exc:
        raise EnrolmentError(f"{path}: not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise EnrolmentError(f"{path}: not a JSON object")
    return obj


def _fields(path: Path, obj: dict, fmt: str, names: set[str]) -> None:
    if obj.get("format") != fmt:
        raise EnrolmentError(f"{path}: format is {obj.get('format')!r}, expected {fmt!r}")
    if set(obj) != names:
        raise EnrolmentError(f"{path}: fields are {sorted(obj)}, expected {sorted(names)}")


def _z85_key(where: object, value: object, what: str) -> bytes:
    """The 32 bytes of canonical Z85 text of CURVE_KEY_CHARS characters (public or secret)."""
    if not isinstance(value, str) or not _Z85.fullmatch(value):
        raise EnrolmentError(f"{where}: {what} must be {CURVE_KEY_CHARS} Z85 characters")
    try:
        raw = z85.decode(value.encode())
        ok = z85.encode(raw) == value.encode()
    except Exception:  # pyzmq raises KeyError, struct.error or ValueError on bad Z85
        ok = False
    if not ok:
        raise EnrolmentError(f"{where}: {what} is not valid Z85")
    return raw


def _curve_key(where: object, value: object, what: str) -> str:
    """A CurveZMQ public key: canonical Z85 text of 32 bytes, the canonical encoding (u < p) of a
    Curve25519 point of large order. A low-order key (all zeros among them) gives a shared secret
    anyone can compute, and a non-canonical one is a second spelling of another key, which would
    slip past the check for repeated keys."""
    raw = _z85_key(where, value, what)
    if int.from_bytes(raw, "little") >= CURVE25519_P:
        raise EnrolmentError(f"{where}: {what} is not a canonical Curve25519 key (u-coordinate not below 2^255 - 19)")
    if not crypto.is_valid_public_key(raw):
        raise EnrolmentError(f"{where}: {what} is an all-zero or low-order Curve25519 key")
    return str(value)  # already a str: _z85_key refuses anything else


def _verify_key(where: object, value: bytes, what: str) -> bytes:
    """An Ed25519 verify key that is a canonical encoding of a point of large order (not all zeros,
    the identity or another small-order point, for which signatures can be forged)."""
    if not is_valid_verify_key(value):
        raise EnrolmentError(f"{where}: {what} is not a valid Ed25519 key (all zeros, the identity, another "
                             f"low-order point, or no curve point at all)")
    return value


def _hex(where: object, value: object, what: str, size: int) -> bytes:
    if not isinstance(value, str) or len(value) != 2 * size or not _HEX.fullmatch(value):
        raise EnrolmentError(f"{where}: {what} must be {2 * size} lowercase hex digits ({size} bytes)")
    return bytes.fromhex(value)


def read_server_entry(path: Path) -> str:
    """The server's CurveZMQ public key (Z85) from its `server.public.json`; EnrolmentError naming
    the file if it is not one."""
    obj = _read_entry_json(path)
    _fields(path, obj, SERVER_ENTRY_FORMAT, {"format", "curve"})
    return _curve_key(path, obj["curve"], "the server's curve key")


def read_client_entry(path: Path) -> ClientEntry:
    """A client's public entry, after checking its format, id, key encodings and proof of possession;
    EnrolmentError naming the file and what is wrong."""
    obj = _read_entry_json(path)
    _fields(path, obj, CLIENT_ENTRY_FORMAT, {"format", "client_id", "curve", "verify", "proof"})
    return check_entry(path, ClientEntry(client_id=obj["client_id"], curve=obj["curve"],
                                         verify=_hex(path, obj["verify"], "verify", VERIFY_KEY_BYTES),
                                         proof=_hex(path, obj["proof"], "proof", SIGNATURE_BYTES)))


def check_entry(where: object, entry: ClientEntry) -> ClientEntry:
    """One client's entry, checked on its own: its id, both keys (`_curve_key`, `_verify_key`) and
    the proof of possession where it carries one; EnrolmentError starting with `where` (its file,
    or the roster and the client id) and naming the field."""
    client_id = entry.client_id
    if type(client_id) is not int or not 1 <= client_id <= MAX_CLIENT_ID:
        raise EnrolmentError(f"{where}: client_id must be an int in 1..{MAX_CLIENT_ID}, got {client_id!r}")
    curve = _curve_key(where, entry.curve, "curve")
    if type(entry.verify) is not bytes or len(entry.verify) != VERIFY_KEY_BYTES:
        raise EnrolmentError(f"{where}: verify must be {VERIFY_KEY_BYTES} bytes")
    verify = _verify_key(where, entry.verify, "verify")
    if entry.proof is not None:
        try:
            Ed25519PublicKey.from_public_bytes(verify).verify(
                entry.proof, proof_message(client_id=client_id, curve=curve, verify=verify))
        except (InvalidSignature, ValueError, TypeError):
            raise EnrolmentError(f"{where}: the proof is not a signature by this verify key over this entry "
                                 f"(client {client_id}): the entry was altered, or built around another key or id"
                                 ) from None
    return entry


def check_entries(server_curve: str, entries: Iterable[tuple[object, ClientEntry]], *,
                  server: object = "the server entry") -> dict[int, ClientEntry]:
    """Every check a roster passes, shared by the `roster` command (`assemble_roster`) and the
    loader (`load_roster`): the server's key (`_curve_key`), each entry (`check_entry`), and across
    entries no repeated id, CurveZMQ key or verify key and no client listing the server's key.
    `entries` pairs each entry with where it comes from (its file, or the roster and the id);
    `server` says where the server's key comes from. Returns the entries by client id; any failure
    is an EnrolmentError naming where both offending entries come from."""
    _curve_key(server, server_curve, "the server's curve key")
    by_id: dict[int, tuple[object, ClientEntry]] = {}
    curves: dict[str, object] = {}
    verifies: dict[bytes, object] = {}
    for where, e in entries:
        check_entry(where, e)
        if e.client_id in by_id:
            raise EnrolmentError(f"{where}: client id {e.client_id} is also the id of {by_id[e.client_id][0]}")
        if e.curve == server_curve:
            raise EnrolmentError(f"{where}: its curve key is the server's ({server})")
        if e.curve in curves:
            raise EnrolmentError(f"{where}: its curve key is also the one of {curves[e.curve]}")
        if e.verify in verifies:
            raise EnrolmentError(f"{where}: its verify key is also the one of {verifies[e.verify]}")
        by_id[e.client_id], curves[e.curve], verifies[e.verify] = (where, e), where, where
    if not by_id:
        raise EnrolmentError(f"{server}: no client entries: a roster needs at least one client")
    return {c: e for c, (_, e) in by_id.items()}


def assemble_roster(directory: Path, *, server_public: Path, client_entries: Iterable[Path]) -> Path:
    """Check the server's and every client's public entry and write `roster.json` in `directory`
    (the format `load_roster` reads). Refuses a directory that holds a roster already; any bad entry
    is an EnrolmentError naming its file, and then nothing is written. Returns the roster's path."""
    path = directory / ROSTER
    if path.exists():
        raise EnrolmentError(f"{path} exists; a roster is never overwritten")
    server_curve = read_server_entry(server_public)
    entries = check_entries(server_curve, [(Path(p), read_client_entry(Path(p))) for p in client_entries],
                            server=server_public)
    directory.mkdir(parents=True, exist_ok=True)
    return _write_roster(path, server_curve, entries.values())


def _write_roster(path: Path, server_curve: str, entries: Iterable[ClientEntry]) -> Path:
    clients = {str(e.client_id): {"curve": e.curve, "verify": e.verify.hex()} for e in entries}
    text = json.dumps({"format": ROSTER_FORMAT, "server_curve": server_curve, "clients": clients},
                      indent=1, sort_keys=True)
    try:
        _write_new(path, text, mode=0o644)
    except FileExistsError:
        raise EnrolmentError(f"{path} exists; a roster is never overwritten") from None
    return path


def roster_fingerprint(path: Path) -> str:
    """SHA-256 (hex) of a roster file: every party compares it over an authentic channel."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---- loading ----------------------------------------------------------------------------------
_ID_KEY = re.compile("[1-9][0-9]{0,9}")
"""A client id as a key of the roster's `clients`: decimal, no sign, no leading zero (so that "7"
and "07" cannot list one id twice)."""


@dataclass(frozen=True)
class RosterFile:
    """A checked `roster.json`: the server's CurveZMQ key (Z85) and every client's entry by id."""

    path: Path
    server_curve: str
    clients: Mapping[int, ClientEntry]


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """A JSON object whose keys are all distinct (json.loads would keep the last of a repeated one,
    and so hide a client id listed twice)."""
    obj: dict[str, object] = {}
    for key, value in pairs:
        if key in obj:
            raise EnrolmentError(f"the key {key!r} appears twice in one object")
        obj[key] = value
    return obj


def _read_roster_json(path: Path) -> dict:
    try:
        text = path.read_bytes().decode()
    except FileNotFoundError:
        raise EnrolmentError(f"{path} is missing") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise EnrolmentError(f"{path}: {exc}") from None
    try:
        obj = json.loads(text, object_pairs_hook=_unique_keys)
    except EnrolmentError as exc:
        raise EnrolmentError(f"{path}: {exc}") from None
    except ValueError as exc:
        raise EnrolmentError(f"{path}: not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise EnrolmentError(f"{path}: not a JSON object")
    return obj


def read_roster(path: Path) -> RosterFile:
    """`roster.json` after every check the `roster` command makes (`check_entries`: format, ids, key
    encodings, proofs where entries carry them, no repeated id or key, no client listing the
    server's key, no low-order or invalid key), since the file may have been edited after it was
    assembled. EnrolmentError naming the file, the client ids and the field."""
    raw = _read_roster_json(path)
    _fields(path, raw, ROSTER_FORMAT, {"format", "server_curve", "clients"})
    clients = raw["clients"]
    if not isinstance(clients, dict):
        raise EnrolmentError(f"{path}: clients must be a JSON object of client id -> entry")
    entries = []
    for key, e in clients.items():
        where = f"{path}, client {key}"
        if not _ID_KEY.fullmatch(key):
            raise EnrolmentError(f"{path}: client id {key!r} is not an int in 1..{MAX_CLIENT_ID} written in "
                                 f"decimal without sign or leading zero")
        if not isinstance(e, dict) or not {"curve", "verify"} <= set(e) <= {"curve", "verify", "proof"}:
            fields = sorted(e) if isinstance(e, dict) else type(e).__name__
            raise EnrolmentError(f"{where}: fields are {fields}, expected curve, verify and optionally proof")
        proof = _hex(where, e["proof"], "proof", SIGNATURE_BYTES) if "proof" in e else None
        entries.append((where, ClientEntry(client_id=int(key), curve=e["curve"],
                                           verify=_hex(where, e["verify"], "verify", VERIFY_KEY_BYTES), proof=proof)))
    by_id = check_entries(raw["server_curve"], entries, server=f"{path}, server_curve")
    return RosterFile(path=path, server_curve=raw["server_curve"], clients=MappingProxyType(by_id))


def load_roster(directory: Path) -> tuple[str, dict[int, bytes], Roster]:
    """(the server's CurveZMQ public key, client id -> CurveZMQ public key, the signing roster), from
    `directory/roster.json` once `read_roster` has checked it."""
    checked = read_roster(directory / ROSTER)
    try:
        roster = Roster({c: e.verify for c, e in checked.clients.items()})
    except ValueError as exc:  # read_roster has made every check Roster makes; kept as a backstop
        raise EnrolmentError(f"{checked.path}: {exc}") from None
    return checked.server_curve, {c: e.curve.encode() for c, e in checked.clients.items()}, roster


def read_secret_file(path: Path) -> str:
    """The text of a secret key file (what enrolment writes with mode 0600), refused, as ssh refuses
    a private key, when group or others may read or write it (mode & 0o077): such a key may already
    be someone else's, or be replaced. No mode check where files have no POSIX modes (os.name is not
    'posix'). EnrolmentError naming the file, its mode and the fix."""
    try:  # O_NONBLOCK: a FIFO planted in the key's place does not block the open
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise EnrolmentError(f"{path} is missing") from None
    except OSError as exc:
        raise EnrolmentError(f"{path}: {exc}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())  # the file opened, not whatever the path names by now
        if not stat.S_ISREG(st.st_mode):
            raise EnrolmentError(f"{path}: not a regular file, so not a secret key file")
        mode = stat.S_IMODE(st.st_mode)
        if os.name == "posix" and mode & 0o077:
            raise EnrolmentError(f"{path} has mode {mode:04o}: group or others may read or write this secret key, "
                                 f"so it is refused (as ssh refuses such keys); run `chmod 600 {path}` if nobody "
                                 f"else has had access to it, or enrol again")
        raw = f.read(MAX_ENTRY_BYTES + 1)
    if len(raw) > MAX_ENTRY_BYTES:
        raise EnrolmentError(f"{path}: over {MAX_ENTRY_BYTES} bytes, not a secret key file")
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise EnrolmentError(f"{path}: not text, not a secret key file") from None


def _read_curve_pair(path: Path) -> tuple[str, str]:
    """(public, secret) Z85 CurveZMQ keys from a `*.key_secret` file, the secret matching the public."""
    try:
        pair = json.loads(read_secret_file(path))
    except ValueError as exc:
        raise EnrolmentError(f"{path}: not JSON ({exc})") from None
    if not isinstance(pair, dict) or set(pair) != {"public", "secret"}:
        raise EnrolmentError(f"{path}: expected a JSON object with the fields public and secret")
    _z85_key(path, pair["public"], "public")
    _z85_key(path, pair["secret"], "secret")
    if zmq.curve_public(pair["secret"].encode()) != pair["public"].encode():
        raise EnrolmentError(f"{path}: its secret key is not the one of its public key")
    return pair["public"], pair["secret"]


def load_server(directory: Path) -> tuple[CurveServerKeys, Roster]:
    """The server's CurveZMQ keys with the client allowlist, and the roster for signed keys."""
    server_public, curve, roster = load_roster(directory)
    public, secret = _read_curve_pair(directory / SERVER_SECRET)
    if public != server_public:
        raise EnrolmentError("server.key_secret is not the server key the roster lists")
    keys = CurveServerKeys(public_key=public.encode(), secret_key=secret.encode(), client_keys=curve)
    return keys, roster


def load_client(directory: Path, client_id: int) -> tuple[CurveClientKeys, Identity]:
    """Client `client_id`'s CurveZMQ keys (pinned to the roster's server key) and its identity."""
    server_public, curve, roster = load_roster(directory)
    if client_id not in curve:
        raise EnrolmentError(f"client {client_id} is not enrolled in {directory / ROSTER}")
    key_name, sign_name = _client_secret_names(client_id)
    public, secret = _read_curve_pair(directory / key_name)
    if public.encode() != curve[client_id]:
        raise EnrolmentError(f"{key_name} is not the key the roster lists for client {client_id}")
    sign_path = directory / sign_name
    raw = _hex(sign_path, read_secret_file(sign_path).strip(), "the signing key", VERIFY_KEY_BYTES)
    try:
        identity = Identity(client_id=client_id, signing_key=SigningKey.from_private_bytes(raw), roster=roster)
    except ValueError as exc:
        raise EnrolmentError(str(exc)) from None
    keys = CurveClientKeys(public_key=public.encode(), secret_key=secret.encode(), server_key=server_public.encode())
    return keys, identity
