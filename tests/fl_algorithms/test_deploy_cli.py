"""fl_algorithms.deploy_cli: the transport's frame limits from the command line, on both roles."""
from __future__ import annotations

import pytest

from fl_algorithms.deploy_cli import main
from transport.framing import DEFAULT_LIMITS, FrameLimits

TASK = ["--task", "fl_algorithms.tasks.toy:build", "--insecure"]
SERVER = ["server", *TASK, "--clients", "2"]
CLIENT = ["client", *TASK, "--id", "1"]


@pytest.mark.parametrize("args,message", [
    ([*SERVER, "--max-message-mib", "0"], "--max-message-mib: must be at least 1"),
    ([*SERVER, "--max-message-mib", "4097"], "--max-message-mib: must be at most 4096"),
    ([*CLIENT, "--max-message-mib", "lots"], "--max-message-mib: not an integer"),
    ([*CLIENT, "--max-frames", "2"], "--max-frames: must be at least 8"),
    ([*SERVER, "--max-frames", "1000"], "--max-frames: must be at most 256"),
])
def test_bad_limits_are_argparse_errors_naming_the_option(args, message, capsys):
    # no message: argparse exits with status 2; the reason is asserted on stderr below
    with pytest.raises(SystemExit) as exit_:
        main(args)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and "Traceback" not in err, err


class Stop(Exception):
    pass


def test_the_server_role_reads_with_the_given_limits(monkeypatch):
    import transport.server

    seen = []

    def no_driver(endpoint, *, curve, config):  # stands in for ServerDriver: record, stop
        seen.append(config)
        raise Stop

    monkeypatch.setattr(transport.server, "ServerDriver", no_driver)
    # no message: Stop is this test's own sentinel, raised without one
    with pytest.raises(Stop):
        main([*SERVER, "--max-message-mib", "512", "--max-frames", "200"])
    # no message: Stop is this test's own sentinel, raised without one
    with pytest.raises(Stop):
        main(SERVER)
    assert [c.limits for c in seen] == [FrameLimits(max_message_bytes=512 << 20, max_frames=200), DEFAULT_LIMITS]


def test_the_client_role_reads_with_the_given_limits(monkeypatch):
    import transport.client

    seen = []

    def no_server(*, config, **kw):  # stands in for run_client: record, be refused
        seen.append(config)
        raise transport.client.RegistrationError("no server here")

    monkeypatch.setattr(transport.client, "run_client", no_server)
    assert main([*CLIENT, "--max-message-mib", "1024", "--max-frames", "256"]) == 2
    assert main(CLIENT) == 2
    assert [c.limits for c in seen] == [FrameLimits(max_message_bytes=1024 << 20, max_frames=256), DEFAULT_LIMITS]
