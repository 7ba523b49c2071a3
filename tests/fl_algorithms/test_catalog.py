import subprocess
import sys

from fl_algorithms import catalog
from fl_algorithms.__main__ import main


def test_every_catalog_entry_imports():
    assert catalog.check() == []


def test_list_prints_every_section_and_name(capsys):
    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    for title, entries in catalog.SECTIONS.items():
        assert f"{title}:" in out
        assert all(f"  {e.name} " in out for e in entries)
    assert "ditto" in out and "secagg+" in out and "skellam" in out


def test_module_entry_point_runs_as_a_fresh_process():
    done = subprocess.run([sys.executable, "-m", "fl_algorithms", "--list"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "secure-aggregation protocols:" in done.stdout


def test_algorithm_entries_name_their_registered_names():
    for entry in catalog.ALGORITHMS:
        obj = entry.load()
        if isinstance(obj, type):
            assert obj.name == entry.name
