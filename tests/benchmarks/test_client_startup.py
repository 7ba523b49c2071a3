"""The client start-up benchmark: what it sums, and its result line on the cheapest task."""
import pytest

pytest.importorskip("torch")
from benchmarks import client_startup  # noqa: E402

SAMPLE = """\
import time: self [us] | cumulative | imported package
import time:       100 |        100 |   _io
import time:      2000 |       2500 | encodings
import time:       300 |        400 |     nested.deep
import time:      1000 |     700000 | torch
import time:        50 |        50 | json
"""


def test_only_top_level_imports_are_summed():
    assert client_startup.top_level_import_seconds(SAMPLE) == pytest.approx((2500 + 700000 + 50) / 1e6)


def test_the_toy_client_line_is_printed(capsys):
    assert client_startup.main(["--tasks", "toy"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    fields = dict(part.split("=", 1) for part in line.split()[1:])
    assert line.startswith("client_startup task=toy ") and fields["transformers"] == "0"
    assert 0 < float(fields["import_seconds"]) and fields["budget"] == "3.0"


def test_unknown_tasks_are_refused():
    with pytest.raises(SystemExit):
        client_startup.main(["--tasks", "toy,nope"])
