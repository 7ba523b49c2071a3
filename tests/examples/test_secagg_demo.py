"""examples/secagg_demo.py refuses bad arguments with argparse errors (exit code 2) naming the option,
before it starts any process, instead of hanging or tracing back."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "secagg_demo.py"


def _load_demo():
    """The demo as a module, without touching sys.path (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location("secagg_demo", DEMO)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


demo = _load_demo()


@pytest.mark.parametrize("args,message", [
    (["--clients", "1"], "--clients must be at least 2"),
    (["--clients", "0"], "--clients must be at least 2"),
    (["--clients", "3", "--param", "min_clients=5"],
     "--clients 3: secagg+ with --param min_clients=5 needs at least 5"),
    (["--dim", "0"], "--dim must be at least 1"),
    (["--dim", "-5"], "--dim must be at least 1"),
    (["--dim", str(1 << 28)], "--dim must be at least 1 and below 268435456"),
    (["--stage-timeout", "0"], "--stage-timeout must be positive"),
    (["--stage-timeout", "inf"], "--stage-timeout must be positive and finite"),
    (["--seed", "-1"], "--seed must be at least 0"),
    (["--drop-stage", "0"], "--drop-stage is 'input' or a positive integer"),
    (["--drop-stage", "masked"], "--drop-stage is 'input' or a positive integer"),
    (["--clients", "3", "--dropout", "3"], "--dropout must be between 0 and --clients - 1 = 2"),
    (["--param", "threshold=5"], "--param threshold: secagg+ has no such parameter; "
                                 "it takes ['chunk', 'colluders', 'corrupt_fraction', 'degree', 'max_streams', 'min_clients', 'planned_dropout', "
                                 "'threshold_fraction']"),
    (["--param", "nonsense"], "--param takes NAME=VALUE, got 'nonsense'"),
    (["--param", "threshold_fraction=1.5"], "threshold_fraction must be in [0, 1)"),
    (["--protocol", "lightsecagg", "--param", "degree=3"], "lightsecagg has no such parameter; "
                                                          "it takes ['colluders', 'min_group', 'pace', 'privacy', 'spill', 'target_survivors']"),
    (["--client-param", "degree=3"], "--client-param degree: the secagg+ client has no such parameter; "
                                     "it takes ['max_length']"),
    (["--role", "client"], "--role client needs --id (at least 1) and --connect"),
])
def test_demo_rejects_bad_arguments(args, message, capsys) -> None:
    # no message: argparse exits with status 2; the reason is asserted on stderr below
    with pytest.raises(SystemExit) as exit_:
        demo.main(args)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err, err


def test_demo_help_names_real_parameters_and_the_default_protocol(capsys) -> None:
    # no message: --help exits with status 0; the help text is asserted below
    with pytest.raises(SystemExit) as exit_:
        demo.main(["--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0
    assert "threshold_fraction=0.6" in out and "threshold=5" not in out and "default secagg+" in out
    assert "threshold=5" not in demo.__doc__ and "threshold_fraction=0.6" in demo.__doc__


def test_demo_runs_as_a_script_and_refuses_one_client() -> None:
    done = subprocess.run([sys.executable, str(DEMO), "--clients", "1"], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 2 and "--clients must be at least 2" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
