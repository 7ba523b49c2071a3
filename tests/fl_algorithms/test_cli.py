"""fl_algorithms.cli (`fedsecure`): list, run, report, deploy and enrol, and `--help` before any heavy import."""
import json
import subprocess
import sys
import types

import pytest

from fl_algorithms import catalog, cli
from fl_algorithms.cli import EXPERIMENTS, detect, main

HELP_WITHOUT_TORCH = """
import contextlib, io, sys
from fl_algorithms.cli import EXPERIMENTS, main
helped = {}
for argv in [["--help"], ["run", "--help"]] + [["run", e.name, "--help"] for e in EXPERIMENTS if e.name not in {skip}]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main(argv)
        except SystemExit as exit:
            assert exit.code == 0, (argv, exit.code)
    helped[" ".join(argv)] = out.getvalue()
heavy = sorted(m for m in ("torch", "transformers", "nlp_models.backbone", "fl_algorithms.training.trainer", "dp.ledger")
               if m in sys.modules)
print(repr((heavy, helped)))
"""
LATE = {"fednlp-benchmark"}
"""Examples whose script still imports torch before it parses (examples/fednlp_benchmark.py: being changed elsewhere)."""


def test_list_prints_the_catalog_and_the_experiments(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(catalog.render())
    for entries in catalog.SECTIONS.values():
        assert all(f"  {e.name} " in out for e in entries)
    for e in EXPERIMENTS:
        assert f"  {e.name} " in out and f"(examples/{e.script})" in out
        assert e.path.is_file(), e.path


def test_an_unknown_experiment_is_a_usage_error_naming_the_experiments(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["run", "fedmpc", "--quick"])
    err = capsys.readouterr().err
    assert exit.value.code == 2 and "unknown experiment 'fedmpc'" in err
    assert all(e.name in err for e in EXPERIMENTS)


def test_help_answers_before_torch_or_the_library_is_imported():
    code = HELP_WITHOUT_TORCH.replace("{skip}", repr(LATE))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    heavy, helped = eval(done.stdout)  # noqa: S307 - our own repr from the line above
    assert heavy == []
    assert "run" in helped["--help"] and "report" in helped["--help"] and "enrol" in helped["--help"]
    assert "--algorithms" in helped["run fedmcp --help"] and "--quick" in helped["run fedmcp --help"]
    assert "--mechanisms" in helped["run privacy-frontier --help"]
    assert all(f"usage: {e.script}" in helped[f"run {e.name} --help"] for e in EXPERIMENTS if e.name not in LATE)


def test_run_passes_the_arguments_to_the_script_unchanged(tmp_path, monkeypatch, capsys):
    script = tmp_path / "echo.py"
    script.write_text("import json, sys\nif __name__ == '__main__':\n    print(json.dumps(sys.argv[1:]))\n"
                      "    if '--fail' in sys.argv:\n        sys.exit(3)\n")
    monkeypatch.setattr(cli, "EXPERIMENTS", (cli.Experiment("echo", "echo.py", "prints its arguments"),))
    monkeypatch.setattr(cli, "REPOSITORY", tmp_path.parent)
    monkeypatch.setattr(cli.Experiment, "path", property(lambda self: script))
    argv = sys.argv[:]
    assert main(["run", "echo", "--seeds", "0,1", "--methods", "a"]) == 0
    assert json.loads(capsys.readouterr().out) == ["--seeds", "0,1", "--methods", "a"]
    with pytest.raises(SystemExit) as exit:
        main(["run", "echo", "--fail"])
    assert exit.value.code == 3 and sys.argv == argv


def test_report_refuses_a_directory_no_experiment_made(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("hello")
    for target in (tmp_path, tmp_path / "missing"):
        with pytest.raises(SystemExit) as exit:
            main(["report", str(target)])
        err = capsys.readouterr().err
        assert exit.value.code == 2 and str(target) in err
        assert "not a run directory" in err or "not a directory" in err


@pytest.mark.parametrize("files, name", [
    ({"config.toml": "[settings]\ntrain_cap = 180\n[plan]\nplain_check = true\n"}, "fedmcp"),
    ({"results.json": '{"experiment": "fedmcp"}'}, "fedmcp"),
    ({"config.toml": "[settings]\nalpha = 0.5\nmin_client_docs = 20\n[plan]\nsampler = 'seeded'\n"},
     "fednlp-classification"),
    ({"plan.json": '{"tasks": ["classification"], "partitions": ["iid"]}'}, "fednlp-benchmark"),
    ({"plan.json": '{"atc": {}, "model": {}, "seeds": [0]}'}, "atc"),
    ({"plan.json": '{"rounds_per_task": 3, "descriptor": {}, "data": {}}'}, "fedseit"),
    ({"plan.json": '{"settings": ["non_iid"], "data": {}}'}, "adafedselectkd"),
    ({"results.json": '{"runs": [{"cohort": 20, "config": "FrontierConfig(sampler=\'poisson\')"}]}'},
     "privacy-frontier"),
])
def test_report_finds_the_experiment_that_made_a_run_directory(tmp_path, files, name):
    for file, text in files.items():
        (tmp_path / file).write_text(text)
    assert detect(tmp_path).name == name


def test_report_runs_that_experiment_with_resume_and_report(tmp_path, monkeypatch):
    (tmp_path / "plan.json").write_text('{"atc": {}, "model": {}}')
    calls = []
    monkeypatch.setattr(cli, "run_script", lambda script, args: calls.append((script.name, list(args))) or 0)
    assert main(["report", str(tmp_path)]) == 0
    assert calls == [("atc_secure.py", ["--resume", str(tmp_path), "--report"])]


def test_deploy_and_enrol_hand_their_arguments_to_the_deployment_clis(tmp_path, monkeypatch):
    seen = []
    fake = types.ModuleType("fl_algorithms.deploy_cli")
    fake.main = lambda argv: seen.append(("deploy_cli", argv)) or 0
    monkeypatch.setitem(sys.modules, "fl_algorithms.deploy_cli", fake)
    import fl_algorithms

    monkeypatch.setattr(fl_algorithms, "deploy_cli", fake, raising=False)
    assert main(["deploy", "client", "--task", "fl_algorithms.tasks.toy:build", "--id", "2"]) == 0
    assert seen == [("deploy_cli", ["client", "--task", "fl_algorithms.tasks.toy:build", "--id", "2"])]
    keys = tmp_path / "keys"
    assert main(["enrol", "dealer", "--dir", str(keys), "--clients", "2"]) == 0  # transport.cli enrol: real keys
    assert (keys / "roster.json").is_file()
    with pytest.raises(SystemExit) as exit:
        main(["enrol", "keygen"])
    assert exit.value.code == 2
