"""The streaming benchmark over real sockets, at a size a test can afford: its rows and result lines."""
import pytest

pytest.importorskip("zmq")
from benchmarks import stream_tcp  # noqa: E402


@pytest.mark.slow
def test_whole_and_chunked_rounds_are_measured_and_the_goal_line_is_printed(tmp_path, capsys):
    assert stream_tcp.main(["--dims", "20000", "--clients", "3", "--chunk", "4096", "--rounds", "1",
                            "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    rows = (tmp_path / "stream.csv").read_text().splitlines()
    assert len(rows) == 1 + 4  # plain and SecAgg+, whole and chunked
    assert lines[-3].startswith("stream protocol=plain d=2e+04 n=3 dropout=0.00 mode=chunked ")
    assert lines[-2].startswith("stream protocol=secagg+ d=2e+04 n=3 dropout=0.00 mode=chunked ")
    goal = dict(part.split("=", 1) for part in lines[-1].split()[1:])
    assert lines[-1].startswith("stream_goal ") and float(goal["secaggplus_vs_plain"]) > 0
    assert float(goal["peak_rss_mb"]) > 0 and float(goal["goal_rss_mb"]) == pytest.approx((12 * 20000 + 200e6) / 2**20, abs=1)


def test_the_baseline_is_required():
    with pytest.raises(SystemExit):
        stream_tcp.main(["--protocols", "secagg+"])
