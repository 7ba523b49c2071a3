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


@pytest.mark.slow
def test_a_crash_at_the_masked_stage_is_measured_with_one_fewer_contributor(tmp_path, capsys):
    """--dropout: a client exits when asked for its input in the timed round; ours_tcp checks that round's
    contributors (one fewer), so a row exists only if the chunked rounds finished without it."""
    assert stream_tcp.main(["--dims", "20000", "--clients", "5", "--chunk", "4096", "--rounds", "2",
                            "--dropout", "0.2", "--out", str(tmp_path)]) == 0
    goal = capsys.readouterr().out.strip().splitlines()[-1]
    assert goal.startswith("stream_goal d=2e+04 n=5 dropout=0.20 ")
    rows = (tmp_path / "stream.csv").read_text().splitlines()[1:]
    assert len(rows) == 4 and all(",0.2," in row for row in rows)


@pytest.mark.slow
def test_lightsecagg_is_measured_held_and_bounded(tmp_path, capsys):
    assert stream_tcp.main(["--dims", "20000", "--clients", "4", "--rounds", "1", "--protocols", "plain,lightsecagg",
                            "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    rows = (tmp_path / "stream.csv").read_text().splitlines()[1:]
    assert [r.split(",")[3:5] for r in rows] == [["plain", "whole"], ["plain", "chunked"], ["lightsecagg", "held"],
                                                 ["lightsecagg", "bounded"]]
    line = dict(part.split("=", 1) for part in lines[-1].split()[1:])
    assert lines[-1].startswith("stream_lightsecagg d=2e+04 n=4 ")
    assert float(line["held_peak_rss_mb"]) > 0 and float(line["bounded_round_s"]) > 0
