"""Enrolment: keys on disk, the roster, and an authenticated deployment that refuses outsiders."""
from __future__ import annotations

import json
import stat
import time

import pytest

from tests.transport.test_cli import cli, finish, wait_for_file
from transport.client import ClientConfig, RegistrationError, run_client
from transport.enrolment import EnrolmentError, enrol, load_client, load_server
from transport.sockets import CurveClientKeys


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
    (a / "client-1.sign_secret").write_text((b / "client-1.sign_secret").read_text())
    with pytest.raises(EnrolmentError, match="not the one the roster lists"):
        load_client(a, 1)                                                      # another enrolment's signing key
    (a / "server.key_secret").unlink()
    (a / "server.key_secret").write_text((b / "server.key_secret").read_text())
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
                   config=ClientConfig(hello_timeout=8.0))
    time.sleep(0.5)
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
