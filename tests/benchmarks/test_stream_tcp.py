"""The streaming benchmark over real sockets, at a size a test can afford: its rows and result lines."""
import csv

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
    assert goal["link_mbit"] == "loopback" and goal["link_s"] == goal["secaggplus_vs_link"] == "nan"
    assert float(goal["peak_rss_mb"]) > 0 and float(goal["goal_rss_mb"]) == pytest.approx((12 * 20000 + 200e6) / 2**20, abs=1)
    assert float(goal["mask_cpu_s"]) > 0 and int(goal["cores"]) >= 1  # the round line gave the degree; masks cost time
    plain, secure = (float(dict(part.split("=", 1) for part in lines[i].split()[1:])["round_s"]) for i in (-3, -2))
    assert float(goal["gap_s"]) == pytest.approx(secure - plain, abs=2e-3)
    with open(tmp_path / "stream.csv") as f:
        degrees = {(r["protocol"], r["mode"]): r["degree"] for r in csv.DictReader(f)}
    assert degrees[("secagg+", "chunked")] == "2" and degrees[("plain", "chunked")] == ""  # N = 3: k = N - 1


def test_max_streams_reaches_the_chunked_modes_of_plain_and_secagg_only():
    assert stream_tcp.modes("plain", 4096, 3)["chunked"] == {"chunk": "4096", "max_streams": "3"}
    assert stream_tcp.modes("secagg+", 4096, 3)["whole"] == {"chunk": "none"}
    assert stream_tcp.modes("secagg+", 4096)["chunked"] == {"chunk": "4096"}
    assert "max_streams" not in stream_tcp.modes("lightsecagg", 4096, 3)["bounded"]


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
    assert float(line["bounded_client_rss_mb"]) > 0  # the largest client process, from wait4


@pytest.mark.slow
def test_lightsecagg_bounded_alone_is_measured_and_its_line_says_held_did_not_run(tmp_path, capsys):
    assert stream_tcp.main(["--dims", "20000", "--clients", "4", "--rounds", "1", "--protocols", "plain,lightsecagg",
                            "--lightsecagg-modes", "bounded", "--out", str(tmp_path)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    rows = (tmp_path / "stream.csv").read_text().splitlines()[1:]
    assert [r.split(",")[3:5] for r in rows][-1] == ["lightsecagg", "bounded"] and len(rows) == 3
    line = dict(part.split("=", 1) for part in last.split()[1:])
    assert last.startswith("stream_lightsecagg d=2e+04 n=4 dropout=0.00 ") and line["held_peak_rss_mb"] == "nan"
    assert float(line["bounded_peak_rss_mb"]) > 0 and float(line["bounded_client_rss_mb"]) > 0
    import csv
    runs = list(csv.DictReader(open(tmp_path / "stream_runs.csv")))
    assert len(runs) == 3 and all(float(r["client_cpu_s"]) > 0 for r in runs)  # four client processes' CPU, wait4
    assert "share=" in runs[-1]["stages"] and "recovery=" in runs[-1]["stage_peaks"]


def test_bounded_lightsecagg_clients_spill_the_pieces_they_keep():
    assert stream_tcp.client_params("lightsecagg", "bounded") == {"spill": "true"}
    assert stream_tcp.client_params("lightsecagg", "held") == {} == stream_tcp.client_params("secagg+", "chunked")


def test_lightsecagg_modes_are_checked():
    with pytest.raises(SystemExit):
        stream_tcp.main(["--protocols", "plain,lightsecagg", "--lightsecagg-modes", "spilled"])


def test_repeated_runs_are_summarised_by_their_median_round_and_largest_peaks():
    def run(protocol, repeat, round_s, peak, client):
        return {"d": 10, "n": 3, "dropout": 0.0, "protocol": protocol, "mode": "chunked", "repeat": repeat, "chunk": 4,
                "round_s": round_s, "peak_rss_mb": peak, "bytes_per_param": 4.0, "client_peak_rss_mb": client,
                "peak_stage": f"round 2 s{repeat}", "wall_s": 1.0}

    rows = [run("plain", 0, 3.0, 100, 50), run("secagg+", 0, 9.0, 120, 60), run("plain", 1, 1.0, 110, 40),
            run("secagg+", 1, 5.0, 115, 70), run("plain", 2, 2.0, 90, 45), run("secagg+", 2, 4.0, 118, 65)]
    plain, secure = stream_tcp.summarise(rows)
    assert (plain["protocol"], plain["runs"], plain["round_s"], plain["round_s_min"], plain["round_s_max"]) == \
        ("plain", 3, 2.0, 1.0, 3.0)
    assert (plain["peak_rss_mb"], plain["peak_stage"], plain["client_peak_rss_mb"], plain["wall_s"]) == \
        (110, "round 2 s1", 50, 3.0)
    assert secure["round_s"] == 5.0 and "repeat" not in secure
    assert "| 5.000 (4.00-9.00, 3 runs) |" in stream_tcp.table([plain, secure])


def test_repeats_must_be_positive():
    with pytest.raises(SystemExit):
        stream_tcp.main(["--repeats", "0"])


def test_the_degree_comes_from_the_round_line_and_the_masks_are_all_counted():
    assert stream_tcp.degree_of("secagg+ n=50 degree=12 threshold=7 colluders=0") == 12
    assert stream_tcp.degree_of("plain") is None
    # N = 10, k = 4, no dropout: 10 x 5 client masks and 10 server self masks
    assert stream_tcp.mask_cpu_seconds(clients=10, degree=4, dropped=0, mask_s=0.01) == pytest.approx(60 * 0.01)
    # two dropped after sharing: 8 x 5 + 8 self + 2 x 4 rebuilt pairwise = 56
    assert stream_tcp.mask_cpu_seconds(clients=10, degree=4, dropped=2, mask_s=0.01) == pytest.approx(56 * 0.01)
    assert stream_tcp.mask_seconds(1000, repeats=1) > 0


@pytest.mark.slow
@pytest.mark.skipif(stream_tcp.netns.unavailable() is not None, reason="network namespaces unavailable here")
def test_runs_cross_a_rate_limited_link_when_asked(tmp_path, capsys):
    """--link-mbit: the server and the clients in two namespaces over a tbf link. A round moves 3 x 4d bytes
    of uploads through it, so it cannot be faster than that at the rate (a lower bound load cannot break)."""
    assert stream_tcp.main(["--dims", "100000", "--clients", "3", "--rounds", "2", "--link-mbit", "50",
                            "--modes", "chunked", "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    goal = dict(part.split("=", 1) for part in lines[-1].split()[1:])
    assert goal["link_mbit"] == "50"
    plain = float(dict(part.split("=", 1) for part in lines[-3].split()[1:])["round_s"])
    assert plain >= (3 * 4 * 100_000 - (1 << 20)) * 8 / 50e6
    assert goal["whole_peak_rss_mb"] == "nan"  # --modes chunked: whole uploads not run
    link_s = 3 * 4 * 100_000 * 8 / 50e6  # three uploads of 4d bytes at 50 Mbit/s (each a few bytes more)
    assert link_s <= float(goal["link_s"]) < 1.01 * link_s
    secure = float(dict(part.split("=", 1) for part in lines[-2].split()[1:])["round_s"])
    assert float(goal["secaggplus_vs_link"]) == pytest.approx(secure / float(goal["link_s"]), abs=0.01)
    with open(tmp_path / "stream.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["link_mbit"] for r in rows} == {"50"} and {r["mode"] for r in rows} == {"chunked"}


@pytest.mark.parametrize("bad", [["--link-mbit", "0"], ["--modes", "whole"], ["--modes", "chunked,sideways"],
                                 ["--max-streams", "0"]])
def test_link_rates_and_modes_are_checked(bad):
    with pytest.raises(SystemExit):
        stream_tcp.main(bad)
