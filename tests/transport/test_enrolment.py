"""Enrolment: keys on disk, the roster, and an authenticated deployment that refuses outsiders;
with a trusted dealer (`enrol`) and without one (`enrol_client`, `init_server`, `assemble_roster`)."""
from __future__ import annotations

import json
import os
import re
import shutil
import stat
from pathlib import Path

import pytest
import zmq
import zmq.utils.z85

from secagg.identity import SigningKey
from secagg.messages import MAX_CLIENT_ID
from tests.transport.test_cli import cli, finish, wait_for_file
from transport.cli import main
from transport.client import ClientConfig, RegistrationError, run_client
from transport.enrolment import (CLIENT_ENTRY_FORMAT, ROSTER_FORMAT, EnrolmentError, assemble_roster, enrol,
                                 enrol_client, init_server, load_client, load_roster, load_server, proof_message,
                                 read_secret_file, roster_fingerprint)
from transport.sockets import CurveClientKeys


def write_secret(path: Path, text: str) -> None:
    """A secret key file as enrolment writes one (mode 0600; a looser one is refused at load)."""
    path.write_text(text)
    path.chmod(0o600)


def test_enrolment_writes_private_secrets_and_a_public_roster(tmp_path) -> None:
    d = tmp_path / "keys"
    enrol(d, clients=[1, 2, 3])
    roster = json.loads((d / "roster.json").read_text())
    assert sorted(roster["clients"]) == ["1", "2", "3"]
    for name in ("server.key_secret", "client-2.key_secret", "client-2.sign_secret"):
        assert stat.S_IMODE((d / name).stat().st_mode) == 0o600
    assert "secret" not in (d / "roster.json").read_text()
    server_keys, server_roster = load_server(d)
    client_keys, identity = load_client(d, 2)
    assert client_keys.server_key == server_keys.public_key                    # the client pins the server
    assert server_keys.client_keys[2] == client_keys.public_key                # id 2 is bound to this key
    assert server_roster.keys[2] == identity.signing_key.public_bytes
    with pytest.raises(EnrolmentError, match="already holds an enrolment"):
        enrol(d, clients=[4])                                                  # never overwrites keys


def test_mismatched_or_missing_enrolment_files_are_refused(tmp_path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    enrol(a, clients=[1, 2])
    enrol(b, clients=[1, 2])
    with pytest.raises(EnrolmentError, match="not enrolled"):
        load_client(a, 3)
    (a / "client-1.sign_secret").unlink()
    write_secret(a / "client-1.sign_secret", (b / "client-1.sign_secret").read_text())
    with pytest.raises(EnrolmentError, match="not the one the roster lists"):
        load_client(a, 1)                                                      # another enrolment's signing key
    (a / "server.key_secret").unlink()
    write_secret(a / "server.key_secret", (b / "server.key_secret").read_text())
    with pytest.raises(EnrolmentError, match="not the server key the roster lists"):
        load_server(a)
    with pytest.raises(EnrolmentError, match="missing"):
        load_server(tmp_path / "nowhere")


@pytest.mark.slow
def test_an_enrolled_deployment_sums_exactly_and_refuses_an_outsider(tmp_path) -> None:
    keys, other = tmp_path / "keys", tmp_path / "other"
    enrol(keys, clients=[1, 2, 3])
    enrol(other, clients=[1, 2, 3])
    server = cli("server", "--keys", str(keys), "--clients", "3", "--dim", "300", "--check", "--stage-timeout", "20",
                 "--register-timeout", "40", "--endpoint-file", str(tmp_path / "ep"))
    endpoint = wait_for_file(tmp_path / "ep", server)
    outsider = cli("client", "--keys", str(other), "--id", "3", "--connect", endpoint, "--dim", "300",
                   "--hello-timeout", "8")
    outsider_code, _, outsider_err = finish([outsider], timeout=30)[0]
    # an unenrolled key that does pin the right server key: refused by the server at the handshake
    server_keys, _ = load_server(keys)
    stranger_keys, _ = load_client(other, 3)
    stranger = CurveClientKeys(public_key=stranger_keys.public_key, secret_key=stranger_keys.secret_key,
                               server_key=server_keys.public_key)
    with pytest.raises(RegistrationError, match="refused our key"):
        run_client(endpoint=endpoint, client_id=3, factory=lambda r: None, curve=stranger,
                   config=ClientConfig(hello_timeout=8.0))  # returns once the server's refusal has come back
    members = [cli("client", "--keys", str(keys), "--id", str(k), "--connect", endpoint, "--dim", "300",
                   "--idle-timeout", "30") for k in (1, 2, 3)]
    (code, stdout, stderr), *results = finish([server, *members], timeout=90)
    assert outsider_code == 2 and "security handshake failed" in outsider_err, outsider_err  # pins another server
    rounds = [json.loads(line) for line in stdout.splitlines() if '"event": "round"' in line]
    assert code == 0 and len(rounds) == 1, stdout + stderr
    assert rounds[0]["sum_ok"] is True and rounds[0]["authenticated"] is True
    assert rounds[0]["contributors"] == [1, 2, 3] and rounds[0]["faulty"] == {}
    assert all(r[0] == 0 for r in results), results
    assert "INSECURE" not in stderr


def test_insecure_mode_says_so(capsys) -> None:
    from transport.cli import main
    code = main(["client", "--insecure", "--id", "1", "--connect", "tcp://127.0.0.1:9", "--dim", "4",
                 "--hello-timeout", "0.2"])
    assert code == 2
    assert "INSECURE MODE (--insecure)" in capsys.readouterr().err


# ---- enrolment without a trusted dealer ------------------------------------------------------

def own_keys(base: Path, ids=(1, 2, 3)) -> tuple[Path, list[Path]]:
    """Each client makes its keys in its own folder, the server in its own: (server entry, client entries)."""
    return init_server(base / "server"), [enrol_client(base / f"client{k}", client_id=k) for k in ids]


def deliver(roster: Path, *folders: Path) -> None:
    for folder in folders:
        shutil.copy(roster, folder / "roster.json")


def test_clients_make_their_own_keys_and_only_public_entries_travel(tmp_path) -> None:
    server_entry, entries = own_keys(tmp_path)
    roster = assemble_roster(tmp_path / "assembler", server_public=server_entry, client_entries=entries)
    assert sorted(p.name for p in (tmp_path / "assembler").iterdir()) == ["roster.json"]   # no secret travelled
    deliver(roster, tmp_path / "server", *(tmp_path / f"client{k}" for k in (1, 2, 3)))
    assert sorted(p.name for p in (tmp_path / "client2").iterdir()) == \
        ["client-2.key_secret", "client-2.public.json", "client-2.sign_secret", "roster.json"]
    for k, entry in zip((1, 2, 3), entries):
        public = entry.read_text()
        assert (tmp_path / f"client{k}" / f"client-{k}.sign_secret").read_text() not in public
        assert json.loads((tmp_path / f"client{k}" / f"client-{k}.key_secret").read_text())["secret"] not in public
        assert json.loads(public)["format"] == CLIENT_ENTRY_FORMAT and json.loads(public)["client_id"] == k
    assert "secret" not in (tmp_path / "server" / "server.public.json").read_text()

    server_keys, server_roster = load_server(tmp_path / "server")   # only the roster and its own secret
    assert sorted(server_keys.client_keys) == [1, 2, 3]
    for k in (1, 2, 3):
        client_keys, identity = load_client(tmp_path / f"client{k}", k)
        assert client_keys.server_key == server_keys.public_key                  # pins this server
        assert server_keys.client_keys[k] == client_keys.public_key              # id k bound to its own key
        assert server_roster.keys[k] == identity.signing_key.public_bytes
        assert identity.roster.keys == server_roster.keys
    with pytest.raises(EnrolmentError, match="missing"):
        load_client(tmp_path / "client1", 2)                                     # client 1 holds no other secret
    # the dealer's roster format, which load_roster reads: nothing added, nothing missing
    raw = json.loads(roster.read_text())
    assert set(raw) == {"format", "server_curve", "clients"} and raw["format"] == ROSTER_FORMAT
    assert all(set(e) == {"curve", "verify"} for e in raw["clients"].values())
    dealer = json.loads(enrol(tmp_path / "dealer", clients=[1, 2]).read_text())
    assert set(dealer) == set(raw) and all(set(e) == {"curve", "verify"} for e in dealer["clients"].values())
    assert load_roster(tmp_path / "server")[0] == server_keys.public_key.decode()


def test_own_secrets_are_private_and_never_overwritten(tmp_path) -> None:
    entry = enrol_client(tmp_path / "c", client_id=5)
    server_entry = init_server(tmp_path / "s")
    secrets = [tmp_path / "c" / "client-5.key_secret", tmp_path / "c" / "client-5.sign_secret",
               tmp_path / "s" / "server.key_secret"]
    for path in secrets:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    before = {p: p.read_bytes() for p in [*secrets, entry, server_entry]}
    with pytest.raises(EnrolmentError, match="never overwritten"):
        enrol_client(tmp_path / "c", client_id=5)
    with pytest.raises(EnrolmentError, match="never overwritten"):
        init_server(tmp_path / "s")
    assert {p: p.read_bytes() for p in before} == before
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "client-6.public.json").write_text("{}")                  # even a stray public file
    with pytest.raises(EnrolmentError, match="client-6.public.json"):
        enrol_client(tmp_path / "d", client_id=6)
    assert not (tmp_path / "d" / "client-6.key_secret").exists()
    for bad in (0, MAX_CLIENT_ID + 1, True, "3"):
        with pytest.raises(ValueError, match="client ids are ints in 1"):
            enrol_client(tmp_path / "e", client_id=bad)
    roster = assemble_roster(tmp_path / "r", server_public=server_entry, client_entries=[entry])
    text = roster.read_text()
    with pytest.raises(EnrolmentError, match="never overwritten"):
        assemble_roster(tmp_path / "r", server_public=server_entry, client_entries=[entry])
    assert roster.read_text() == text


def _rewrite(path: Path, **changes) -> Path:
    obj = json.loads(path.read_text())
    obj.update(changes)
    path.write_text(json.dumps(obj))
    return path


def _signed_entry(path: Path, *, client_id: int, curve: str, signing: SigningKey) -> Path:
    """A well-formed entry with a valid proof by `signing` (what an attacker can make with its own key)."""
    proof = signing.sign(proof_message(client_id=client_id, curve=curve, verify=signing.public_bytes))
    path.write_text(json.dumps({"format": CLIENT_ENTRY_FORMAT, "client_id": client_id, "curve": curve,
                                "verify": signing.public_bytes.hex(), "proof": proof.hex()}))
    return path


def _public(path: Path) -> dict:
    return json.loads(path.read_text())


ATTACKS = {
    # (make the bad entry from the three good ones, what the error says)
    "verify key swapped for another client's": (
        lambda e, tmp: _rewrite(e[0], verify=_public(e[1])["verify"]), "proof"),
    "another client's verify key and proof": (
        lambda e, tmp: _rewrite(e[0], verify=_public(e[1])["verify"], proof=_public(e[1])["proof"]), "proof"),
    "moved to another id": (lambda e, tmp: _rewrite(e[0], client_id=4), "proof"),
    "moved onto another client's id": (lambda e, tmp: _rewrite(e[0], client_id=2), "proof"),
    "curve key swapped for another's": (lambda e, tmp: _rewrite(e[0], curve=_public(e[1])["curve"]), "proof"),
    "proof of another entry": (lambda e, tmp: _rewrite(e[0], proof=_public(e[1])["proof"]), "proof"),
    "duplicate id (a client enrolled twice)": (
        lambda e, tmp: enrol_client(tmp / "again", client_id=2), "client id 2 is also the id of"),
    "duplicate curve key under a valid proof": (
        lambda e, tmp: _signed_entry(tmp / "sybil.json", client_id=4, curve=_public(e[1])["curve"],
                                     signing=SigningKey.generate()), "curve key is also the one of"),
    "duplicate verify key under a valid proof": (
        lambda e, tmp: _signed_entry(tmp / "twice.json", client_id=4, curve=zmq.curve_keypair()[0].decode(),
                                     signing=SigningKey.from_private_bytes(bytes.fromhex(
                                         (tmp / "client1" / "client-1.sign_secret").read_text()))),
        "verify key is also the one of"),
    "the server's curve key": (
        lambda e, tmp: _signed_entry(tmp / "srv.json", client_id=4, curve=_public(tmp / "server" / "server.public.json")["curve"],
                                     signing=SigningKey.generate()), "curve key is the server's"),
    "verify not hex": (lambda e, tmp: _rewrite(e[0], verify="zz" * 32), "verify must be 64 lowercase hex"),
    "verify too short": (lambda e, tmp: _rewrite(e[0], verify=_public(e[0])["verify"][:-2]), "verify must be 64"),
    "verify upper case": (lambda e, tmp: _rewrite(e[0], verify=_public(e[0])["verify"].upper()), "verify must be 64"),
    "proof truncated": (lambda e, tmp: _rewrite(e[0], proof=_public(e[0])["proof"][:64]), "proof must be 128"),
    "curve not Z85": (lambda e, tmp: _rewrite(e[0], curve="~" * 40), "curve must be 40 Z85"),
    "curve too short": (lambda e, tmp: _rewrite(e[0], curve=_public(e[0])["curve"][:35]), "curve must be 40 Z85"),
    "curve over 256 bits": (lambda e, tmp: _rewrite(e[0], curve="#" * 40), "curve is not valid Z85"),
    "wrong format": (lambda e, tmp: _rewrite(e[0], format="fedsecure-nlp/roster/v1"), "format is"),
    "id as a string": (lambda e, tmp: _rewrite(e[0], client_id="1"), "client_id must be an int"),
    "id zero": (lambda e, tmp: _rewrite(e[0], client_id=0), "client_id must be an int"),
    "id as a bool": (lambda e, tmp: _rewrite(e[0], client_id=True), "client_id must be an int"),
    "id too large": (lambda e, tmp: _rewrite(e[0], client_id=MAX_CLIENT_ID + 1), "client_id must be an int"),
    "an extra field": (lambda e, tmp: _rewrite(e[0], secret="x"), "fields are"),
    "not JSON": (lambda e, tmp: (e[0].write_text("{not json"), e[0])[1], "not JSON"),
    "a JSON list": (lambda e, tmp: (e[0].write_text("[1, 2]"), e[0])[1], "not a JSON object"),
    "missing": (lambda e, tmp: tmp / "nowhere.json", "no such file"),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_a_bad_entry_is_refused_naming_its_file_and_nothing_is_written(attack, tmp_path) -> None:
    server_entry, entries = own_keys(tmp_path)
    make, reason = ATTACKS[attack]
    bad = make(entries, tmp_path)
    listed = [bad if e == bad else e for e in entries] + ([] if bad in entries else [bad])
    with pytest.raises(EnrolmentError, match=re.escape(str(bad)) + ".*" + re.escape(reason)) as exc:
        assemble_roster(tmp_path / "out", server_public=server_entry, client_entries=listed)
    assert str(bad) in str(exc.value) and reason in str(exc.value), str(exc.value)
    assert not (tmp_path / "out" / "roster.json").exists()


def test_a_bad_server_entry_is_refused_naming_its_file(tmp_path) -> None:
    server_entry, entries = own_keys(tmp_path, ids=(1,))
    assemble_roster(tmp_path / "ok", server_public=server_entry, client_entries=entries)  # the baseline
    for change in ({"format": CLIENT_ENTRY_FORMAT}, {"curve": "~" * 40}, {"extra": 1}):
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps({**json.loads(server_entry.read_text()), **change}))
        with pytest.raises(EnrolmentError, match="bad.json"):
            assemble_roster(tmp_path / "out", server_public=bad, client_entries=entries)
    with pytest.raises(EnrolmentError, match="no client entries"):
        assemble_roster(tmp_path / "out", server_public=server_entry, client_entries=[])
    assert not (tmp_path / "out" / "roster.json").exists()


def test_a_roster_whose_entry_for_me_is_not_mine_is_refused_when_loaded(tmp_path) -> None:
    """An assembler that swaps in keys of its own making for client 2 (a valid proof: its own key)
    passes assembly, but client 2 refuses that roster, and the fingerprints differ."""
    server_entry, entries = own_keys(tmp_path)
    honest = assemble_roster(tmp_path / "honest", server_public=server_entry, client_entries=entries)
    forged_entry = _signed_entry(tmp_path / "forged.json", client_id=2, curve=zmq.curve_keypair()[0].decode(),
                                 signing=SigningKey.generate())
    forged = assemble_roster(tmp_path / "forged", server_public=server_entry,
                             client_entries=[entries[0], forged_entry, entries[2]])
    assert roster_fingerprint(forged) != roster_fingerprint(honest)
    deliver(forged, tmp_path / "client2")
    with pytest.raises(EnrolmentError, match="not the key the roster lists for client 2"):
        load_client(tmp_path / "client2", 2)


def test_enrolment_subcommands_from_the_cli(tmp_path, capsys) -> None:
    for k in (1, 2):
        assert main(["enrol-client", "--dir", str(tmp_path / f"c{k}"), "--id", str(k)]) == 0
    assert main(["init-server", "--dir", str(tmp_path / "s")]) == 0
    entries = [str(tmp_path / f"c{k}" / f"client-{k}.public.json") for k in (1, 2)]
    capsys.readouterr()
    assert main(["roster", "--dir", str(tmp_path / "r"), "--server", str(tmp_path / "s" / "server.public.json"),
                 "--entry", entries[0], "--entry", entries[1]]) == 0
    out = capsys.readouterr().out
    roster = tmp_path / "r" / "roster.json"
    assert roster_fingerprint(roster) in out and "clients [1, 2]" in out
    deliver(roster, tmp_path / "s", tmp_path / "c1", tmp_path / "c2")
    server_keys, _ = load_server(tmp_path / "s")
    assert load_client(tmp_path / "c2", 2)[0].server_key == server_keys.public_key
    # one --entry taking several paths (a shell glob) is the same roster
    assert main(["roster", "--dir", str(tmp_path / "r2"), "--server", str(tmp_path / "s" / "server.public.json"),
                 "--entry", *entries]) == 0
    assert (tmp_path / "r2" / "roster.json").read_text() == roster.read_text()

    swapped = tmp_path / "swapped.json"
    swapped.write_text(json.dumps({**json.loads(Path(entries[0]).read_text()),
                                   "verify": json.loads(Path(entries[1]).read_text())["verify"]}))
    for args, message in [
        (["roster", "--dir", str(tmp_path / "r3"), "--server", str(tmp_path / "s" / "server.public.json"),
          "--entry", str(swapped), entries[1]], f"--entry {swapped}: the proof"),
        (["roster", "--dir", str(tmp_path / "r3"), "--server", entries[0], "--entry", entries[1]],
         f"--server {entries[0]}: format is"),
        (["roster", "--dir", str(tmp_path / "r3"), "--server", str(tmp_path / "s" / "server.public.json"),
          "--entry", entries[0], entries[0]], "client id 1 is also the id of"),
        (["roster", "--dir", str(tmp_path / "r"), "--server", str(tmp_path / "s" / "server.public.json"),
          "--entry", entries[0]], "already holds roster.json"),
        (["enrol-client", "--dir", str(tmp_path / "c1"), "--id", "1"], "already holds client-1.key_secret"),
        (["enrol-client", "--dir", str(tmp_path / "c9"), "--id", "0"], "--id: must be at least 1"),
        (["enrol-client", "--dir", entries[0], "--id", "3"], "exists and is not a folder"),
        (["init-server", "--dir", str(tmp_path / "s")], "already holds server.key_secret"),
    ]:
        with pytest.raises(SystemExit, match="^2$") as exit_:
            main(args)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and message in err and "Traceback" not in err, (args, err)
    assert not (tmp_path / "r3").exists()


def test_the_dealer_says_it_is_one(capsys) -> None:
    for args in (["enrol", "--help"], ["keygen", "--help"], ["--help"]):
        with pytest.raises(SystemExit, match="^0$"):
            main(args)
        help_text = " ".join(capsys.readouterr().out.split())  # argparse wraps to the terminal's width
        assert "trusted dealer: create the server's and every client's secrets" in help_text
        assert "enrol-client, init-server and roster avoid that" in help_text
    assert "trusted dealer" in (enrol.__doc__ or "").lower() and "enrol_client" in (enrol.__doc__ or "")


@pytest.mark.slow
def test_a_deployment_enrolled_without_a_dealer_sums_exactly(tmp_path) -> None:
    """Three clients and the server make their own keys (through the CLI), the roster is assembled
    from public entries, and each process runs from a folder with the roster and its own secrets."""
    for k in (1, 2, 3):
        assert main(["enrol-client", "--dir", str(tmp_path / f"client{k}"), "--id", str(k)]) == 0
    assert main(["init-server", "--dir", str(tmp_path / "server")]) == 0
    assert main(["roster", "--dir", str(tmp_path / "roster"), "--server", str(tmp_path / "server" / "server.public.json"),
                 "--entry", *(str(tmp_path / f"client{k}" / f"client-{k}.public.json") for k in (1, 2, 3))]) == 0
    deliver(tmp_path / "roster" / "roster.json", tmp_path / "server", *(tmp_path / f"client{k}" for k in (1, 2, 3)))
    server = cli("server", "--keys", str(tmp_path / "server"), "--clients", "3", "--dim", "300", "--rounds", "2",
                 "--check", "--stage-timeout", "20", "--register-timeout", "40", "--endpoint-file", str(tmp_path / "ep"))
    endpoint = wait_for_file(tmp_path / "ep", server)
    members = [cli("client", "--keys", str(tmp_path / f"client{k}"), "--id", str(k), "--connect", endpoint,
                   "--dim", "300", "--idle-timeout", "30") for k in (1, 2, 3)]
    (code, stdout, stderr), *results = finish([server, *members], timeout=90)
    rounds = [json.loads(line) for line in stdout.splitlines() if '"event": "round"' in line]
    assert code == 0 and [r["round"] for r in rounds] == [1, 2], stdout + stderr
    assert all(r["sum_ok"] is True and r["authenticated"] is True for r in rounds)
    assert all(r["contributors"] == [1, 2, 3] and r["faulty"] == {} for r in rounds)
    assert all(r[0] == 0 for r in results), results
    assert "INSECURE" not in stderr


# ---- the roster and the secret files are checked at load ---------------------------------------

CURVE25519_P = 2**255 - 19
ED25519_ORDER_8 = "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a"  # a small-order point
CURVE25519_ORDER_8 = "e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800"  # u of a low-order point


def _z85(raw: bytes) -> str:
    return zmq.utils.z85.encode(raw).decode()


def _second_spelling(curve: str) -> str:
    """The same X25519 key with bit 255 set: X25519 ignores that bit, so both spellings are one key."""
    raw = bytearray(zmq.utils.z85.decode(curve.encode()))
    raw[31] |= 0x80
    return _z85(bytes(raw))


def _edit_roster(d: Path, edit) -> Path:
    path = d / "roster.json"
    raw = json.loads(path.read_text())
    edit(raw, raw["clients"])
    path.write_text(json.dumps(raw))
    return path


def _set(target: dict, **changes):
    target.update(changes)


FORGED_ROSTERS = {
    # name: (edit(roster, clients), what the error says after the roster's path)
    "two ids share one curve key": (
        lambda r, c: _set(c["2"], curve=c["1"]["curve"]), r", client 2: its curve key is also the one of .*, client 1"),
    "a curve key spelled a second way": (
        lambda r, c: _set(c["2"], curve=_second_spelling(c["1"]["curve"])),
        r", client 2: curve is not a canonical Curve25519 key"),
    "the server's curve key listed as a client's": (
        lambda r, c: _set(c["3"], curve=r["server_curve"]), r", client 3: its curve key is the server's"),
    "a repeated verify key": (
        lambda r, c: _set(c["3"], verify=c["1"]["verify"]),
        r", client 3: its verify key is also the one of .*, client 1"),
    "an all-zero verify key": (
        lambda r, c: _set(c["2"], verify="00" * 32), r", client 2: verify is not a valid Ed25519 key"),
    "the identity as verify key": (
        lambda r, c: _set(c["2"], verify="01" + "00" * 31), r", client 2: verify is not a valid Ed25519 key"),
    "a small-order verify key": (
        lambda r, c: _set(c["2"], verify=ED25519_ORDER_8), r", client 2: verify is not a valid Ed25519 key"),
    "a verify key that is no point": (
        lambda r, c: _set(c["2"], verify=(CURVE25519_P + 1).to_bytes(32, "little").hex()),
        r", client 2: verify is not a valid Ed25519 key"),
    "an all-zero curve key": (
        lambda r, c: _set(c["2"], curve=_z85(bytes(32))), r", client 2: curve is an all-zero or low-order"),
    "a low-order curve key": (
        lambda r, c: _set(c["2"], curve=_z85(bytes.fromhex(CURVE25519_ORDER_8))),
        r", client 2: curve is an all-zero or low-order"),
    "an all-zero server key": (
        lambda r, c: _set(r, server_curve=_z85(bytes(32))),
        r", server_curve: the server's curve key is an all-zero or low-order"),
    "a curve key not in Z85": (lambda r, c: _set(c["1"], curve="~" * 40), r", client 1: curve must be 40 Z85"),
    "a curve key cut short": (
        lambda r, c: _set(c["1"], curve=c["1"]["curve"][:39]), r", client 1: curve must be 40 Z85"),
    "a curve key over 256 bits": (lambda r, c: _set(c["1"], curve="#" * 40), r", client 1: curve is not valid Z85"),
    "a verify key not hex": (
        lambda r, c: _set(c["1"], verify="zz" * 32), r", client 1: verify must be 64 lowercase hex"),
    "a verify key in upper case": (
        lambda r, c: _set(c["1"], verify=c["1"]["verify"].upper()), r", client 1: verify must be 64 lowercase hex"),
    "a verify key cut short": (
        lambda r, c: _set(c["1"], verify=c["1"]["verify"][:-2]), r", client 1: verify must be 64 lowercase hex"),
    "a verify key that is a number": (
        lambda r, c: _set(c["1"], verify=7), r", client 1: verify must be 64 lowercase hex"),
    "a server key not in Z85": (
        lambda r, c: _set(r, server_curve="~" * 40), r", server_curve: the server's curve key must be 40 Z85"),
    "a proof that is not the entry's": (
        lambda r, c: _set(c["1"], proof="00" * 64), r", client 1: the proof is not a signature"),
    "a proof not hex": (lambda r, c: _set(c["1"], proof="x"), r", client 1: proof must be 128 lowercase hex"),
    "an id with a leading zero": (
        lambda r, c: c.update({"01": c.pop("1")}), r": client id '01' is not an int in 1\.\."),
    "id zero": (lambda r, c: c.update({"0": c.pop("1")}), r": client id '0' is not an int in 1\.\."),
    "an id too large": (
        lambda r, c: c.update({str(MAX_CLIENT_ID + 1): c.pop("1")}),
        r", client \d+: client_id must be an int in 1\.\."),
    "an entry with an extra field": (lambda r, c: _set(c["1"], secret="x"), r", client 1: fields are"),
    "an entry without a verify key": (lambda r, c: c["1"].pop("verify"), r", client 1: fields are"),
    "an extra top-level field": (lambda r, c: _set(r, note="x"), r": fields are"),
    "another format": (lambda r, c: _set(r, format=CLIENT_ENTRY_FORMAT), r": format is"),
    "clients not an object": (lambda r, c: _set(r, clients=[1, 2]), r": clients must be a JSON object"),
    "no clients": (lambda r, c: c.clear(), r", server_curve: no client entries"),
}


@pytest.mark.parametrize("forgery", sorted(FORGED_ROSTERS))
def test_a_forged_roster_is_refused_at_load_naming_the_file_ids_and_field(forgery, tmp_path) -> None:
    d = tmp_path / "keys"
    enrol(d, clients=[1, 2, 3])
    edit, reason = FORGED_ROSTERS[forgery]
    path = _edit_roster(d, edit)
    for load in (load_roster, load_server, lambda d: load_client(d, 1)):
        with pytest.raises(EnrolmentError, match=re.escape(str(path)) + reason):
            load(d)


def test_a_client_id_listed_twice_in_the_roster_is_refused(tmp_path) -> None:
    """JSON keeps the last of a repeated key; the loader refuses the roster instead."""
    d = tmp_path / "keys"
    enrol(d, clients=[1, 2])
    path = d / "roster.json"
    raw = json.loads(path.read_text())
    one, two = (json.dumps(raw["clients"][k]) for k in ("1", "2"))
    path.write_text(f'{{"format": "{ROSTER_FORMAT}", "server_curve": "{raw["server_curve"]}", '
                    f'"clients": {{"1": {one}, "2": {two}, "1": {two}}}}}')
    with pytest.raises(EnrolmentError, match=re.escape(str(path)) + ": the key '1' appears twice"):
        load_server(d)
    path.write_text("{not json")
    with pytest.raises(EnrolmentError, match=re.escape(str(path)) + ": not JSON"):
        load_server(d)


def test_a_valid_roster_still_loads_with_or_without_proofs(tmp_path) -> None:
    d = tmp_path / "keys"
    enrol(d, clients=[1, 2, 3])
    server_public, curve, roster = load_roster(d)
    assert sorted(curve) == sorted(roster.keys) == [1, 2, 3]
    # a roster that carries each client's proof of possession: checked, and accepted when right
    server_entry, entries = own_keys(tmp_path)
    path = assemble_roster(tmp_path / "assembled", server_public=server_entry, client_entries=entries)
    raw = json.loads(path.read_text())
    for k, entry in zip((1, 2, 3), entries):
        raw["clients"][str(k)]["proof"] = json.loads(entry.read_text())["proof"]
    path.write_text(json.dumps(raw))
    deliver(path, tmp_path / "server", tmp_path / "client2")
    assert sorted(load_server(tmp_path / "server")[0].client_keys) == [1, 2, 3]
    assert load_client(tmp_path / "client2", 2)[1].client_id == 2
    two, three = raw["clients"]["2"], raw["clients"]["3"]
    two["proof"], three["proof"] = three["proof"], two["proof"]                # each proof under the other id
    (tmp_path / "server" / "roster.json").write_text(json.dumps(raw))
    with pytest.raises(EnrolmentError, match=r"roster\.json, client 2: the proof is not a signature"):
        load_server(tmp_path / "server")


def test_a_forged_roster_stops_the_cli_before_any_socket(tmp_path, capsys) -> None:
    d = tmp_path / "keys"
    enrol(d, clients=[1, 2])
    _edit_roster(d, lambda r, c: _set(c["2"], curve=c["1"]["curve"]))
    for args in (["server", "--keys", str(d), "--clients", "2", "--dim", "4", "--port", "9"],
                 ["client", "--keys", str(d), "--id", "1", "--connect", "tcp://127.0.0.1:9", "--dim", "4"]):
        with pytest.raises(SystemExit, match="^2$"):
            main(args)
        err = capsys.readouterr().err
        assert "client 2: its curve key is also the one of" in err and "Traceback" not in err, err


SECRET_FILES = ("server.key_secret", "client-1.key_secret", "client-1.sign_secret")
POSIX_ONLY = pytest.mark.skipif(os.name != "posix", reason="file modes (and FIFOs) are POSIX")


@POSIX_ONLY
@pytest.mark.parametrize("mode", [0o644, 0o660, 0o604, 0o620])
def test_a_secret_key_file_others_may_read_or_write_is_refused(mode, tmp_path) -> None:
    d = tmp_path / "keys"
    enrol(d, clients=[1, 2])
    for name in SECRET_FILES:
        (d / name).chmod(mode)
        load = load_server if name.startswith("server") else lambda d: load_client(d, 1)
        with pytest.raises(EnrolmentError, match=re.escape(f"{d / name} has mode {mode:04o}: group or others may "
                                                           f"read or write this secret key")) as exc:
            load(d)
        assert f"chmod 600 {d / name}" in str(exc.value)
        (d / name).chmod(0o600)
    load_server(d), load_client(d, 1)                        # 0600, as enrolment writes them
    for name in SECRET_FILES:
        (d / name).chmod(0o400)                              # stricter is fine too
    load_server(d), load_client(d, 1)
    (d / "roster.json").chmod(0o644)                         # public files need no such mode


@POSIX_ONLY
def test_secret_file_modes_are_not_checked_without_posix_modes(tmp_path, monkeypatch) -> None:
    d = tmp_path / "keys"
    enrol(d, clients=[1])
    (d / "client-1.sign_secret").chmod(0o644)
    with pytest.raises(EnrolmentError, match="has mode 0644"):
        read_secret_file(d / "client-1.sign_secret")
    with monkeypatch.context() as m:
        m.setattr(os, "name", "nt")
        assert read_secret_file(d / "client-1.sign_secret") == (d / "client-1.sign_secret").read_text()


@POSIX_ONLY
def test_a_secret_key_file_that_is_not_the_pair_it_claims_is_refused(tmp_path) -> None:
    d = tmp_path / "keys"
    enrol(d, clients=[1])
    pair = json.loads((d / "client-1.key_secret").read_text())
    (d / "client-1.key_secret").unlink()
    write_secret(d / "client-1.key_secret", json.dumps({**pair, "secret": zmq.curve_keypair()[1].decode()}))
    with pytest.raises(EnrolmentError, match="its secret key is not the one of its public key"):
        load_client(d, 1)
    (d / "client-1.key_secret").unlink()
    os.mkfifo(d / "client-1.key_secret", 0o600)
    with pytest.raises(EnrolmentError, match="not a regular file"):
        load_client(d, 1)
