"""The demo and the transport CLI refuse bad arguments with argparse errors (exit 2), never hang."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "secagg_demo.py"


@pytest.mark.parametrize("args,message", [
    (["--clients", "1"], "--clients must be at least 2"),
    (["--dim", "0"], "--dim must be at least 1"),
    (["--dim", "-5"], "--dim must be at least 1"),
    (["--stage-timeout", "0"], "--stage-timeout must be positive"),
    (["--param", "threshold=5"], "it takes ['degree', 'min_clients', 'threshold_fraction']"),
    (["--param", "nonsense"], "--param takes NAME=VALUE"),
])
def test_demo_rejects_bad_arguments(args, message):
    done = subprocess.run([sys.executable, str(DEMO), *args], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2 and message in done.stderr, done.stderr


@pytest.mark.parametrize("args,message", [
    (["server", "--clients", "3", "--dim", "0"], "--dim: must be at least 1"),
    (["server", "--clients", "1", "--dim", "5"], "--clients: must be at least 2"),
    (["server", "--clients", "3", "--dim", "5", "--stage-timeout", "0"], "--stage-timeout: must be positive"),
    (["client", "--id", "0", "--connect", "tcp://127.0.0.1:1", "--dim", "5"], "--id: must be at least 1"),
])
def test_transport_cli_rejects_bad_arguments(args, message):
    from transport.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 2


def test_transport_cli_defaults_to_secagg_plus():
    from transport.cli import parser

    assert parser().parse_args(["server", "--clients", "3", "--dim", "5"]).protocol == "secagg+"
    assert parser().parse_args(["client", "--id", "1", "--connect", "tcp://127.0.0.1:1", "--dim", "5"]).protocol == "secagg+"
