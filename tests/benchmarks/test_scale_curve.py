"""benchmarks/scale_curve.py at toy sizes: every protocol's round sums exactly, its costs are counted per
client, an abort is recorded rather than fatal, the exponent fit and the LightSecAgg crossover read the
points right, and the CLI ends with one `scale protocol=...` line per protocol."""
import re

import numpy as np
import pytest

from benchmarks.scale_curve import PROTOCOLS, Point, crossovers, growth_exponent, main, run_point


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_each_protocol_sums_exactly_and_counts_its_costs(protocol):
    p = run_point(protocol, n=12, d=500, dropout=0.1)       # raises if the secure sum were wrong
    assert not p.aborted and p.survivors == 11 and p.round_s > 0 and p.server_s > 0
    assert p.up_B >= 4 * 500 and p.down_B > 0              # at least the masked vector goes up
    assert p.total_cpu_s >= p.server_s + p.client_max_s - 1e-9
    if protocol == "plain":
        assert p.up_B == 4 * 500


def test_memory_is_traced_in_its_own_round():
    n, d = 40, 50_000
    vector_mb = d * 4 / 2**20
    # SecAgg+ folds each masked input into its running sum on arrival: O(d), not O(N d)
    plus = run_point("secagg+", n=n, d=d, dropout=0.0, memory=True)
    assert vector_mb <= plus.server_peak_MB < 8 * vector_mb
    # LightSecAgg settles accusations in a check stage and folds masked inputs on arrival too: it no
    # longer holds the N inputs (it did until 2026-11-29, at >= n * vector_mb here)
    light = run_point("lightsecagg", n=n, d=d, dropout=0.0, memory=True)
    assert vector_mb <= light.server_peak_MB < n * vector_mb


def test_an_aborted_round_is_recorded_not_raised():
    # SecAgg over 10 clients with threshold 5 cannot lose 6 of them at the masked input: the protocol
    # aborts (it cannot unmask safely), and the sweep records it and goes on
    p = run_point("secagg", n=10, d=100, dropout=0.6)
    assert p.aborted and p.survivors == 0 and p.round_s != p.round_s   # NaN


def _point(protocol, n, seconds, dropout=0.0, d=100):
    return Point(protocol=protocol, n=n, d=d, dropout=dropout, server_s=seconds, client_max_s=0.0, round_s=seconds,
                 up_B=0.0, down_B=0.0, server_peak_MB=0.0, survivors=n)


def test_exponent_and_crossover():
    quadratic = [_point("secagg", n, 1e-4 * n * n) for n in (50, 100, 200, 400)]
    assert growth_exponent(quadratic) == pytest.approx(2.0, abs=1e-6)
    assert growth_exponent([_point("plain", 10, 1.0)]) != growth_exponent([_point("plain", 10, 1.0)])   # NaN
    points = [_point("secagg+", 100, 1.0, 0.0), _point("lightsecagg", 100, 2.0, 0.0),
              _point("secagg+", 100, 3.0, 0.3), _point("lightsecagg", 100, 2.5, 0.3)]
    assert crossovers(points) == {(100, 100): 0.3}
    aborted = [_point("secagg+", 50, 1.0, 0.0), _point("lightsecagg", 50, 2.0, 0.0),
               Point(**{**_point("secagg+", 50, float("nan"), 0.3).__dict__, "aborted": "too few share holders"}),
               _point("lightsecagg", 50, 2.5, 0.3)]
    assert crossovers(aborted) == {(50, 100): 0.3}        # LightSecAgg finishes where SecAgg+ aborts


def test_cli_writes_tables_and_ends_with_one_line_per_protocol(tmp_path, capsys):
    main(["--sizes", "5,10", "--dims", "300", "--dropouts", "0,0.2", "--out", str(tmp_path), "--no-memory"])
    lines = capsys.readouterr().out.strip().splitlines()
    pattern = re.compile(r"^scale protocol=(\S+) n_max=10 exponent=\S+ seconds_at_nmax=\d+\.\d\d bytes_per_client_at_nmax=\d+$")
    assert [pattern.match(line).group(1) for line in lines[-4:]] == list(PROTOCOLS)
    for name in ("scale.csv", "scale.md", "scale.png"):
        assert (tmp_path / name).stat().st_size > 0
    # no message: argparse exits with status 2; the reason is asserted on stderr below
    with pytest.raises(SystemExit):
        main(["--sizes", "2", "--out", str(tmp_path)])
    assert "need N >= 3" in capsys.readouterr().err


@pytest.mark.parametrize("protocol", ["plain", "secagg+", "lightsecagg"])
def test_a_lazy_round_regenerates_inputs_and_still_sums_exactly(protocol):
    from benchmarks.scale_curve import lazy_input
    from secagg.protocols import registry

    ring = registry.default_ring(protocol)
    x = lazy_input(0, 3, ring, 1000)
    assert np.array_equal(x, lazy_input(0, 3, ring, 1000)) and not np.array_equal(x, lazy_input(0, 4, ring, 1000))
    assert x.dtype == np.uint32 and int(x.max()) < ring.modulus
    p = run_point(protocol, n=10, d=2000, dropout=0.1, lazy=True)     # raises if the secure sum were wrong
    assert not p.aborted and p.survivors == 9 and p.up_B >= 4 * 2000


def test_a_child_point_measures_its_own_peak_rss_and_the_cli_ends_with_scale_d_lines(tmp_path, capsys):
    from benchmarks.scale_curve import estimated_bytes, run_child

    p = run_child("secagg+", n=6, d=200_000, dropout=0.0)
    assert not p.aborted and p.survivors == 6
    # the child holds the running sum, one client's input and its masked copy: about 3 x 4d over its start
    assert p.base_rss_MB > 0 and 0 < p.peak_rss_MB - p.base_rss_MB < 3 * 0.8 + 40
    assert estimated_bytes("plain", n=1000, d=10**8, dropout=0.1) == 3 * 4e8          # whatever N
    assert estimated_bytes("lightsecagg", n=50, d=10**7, dropout=0.1) == (50 + 5) * 4e7   # the clients' masks
    main(["--sizes", "5", "--dims", "2e4", "--lazy-from", "2e4", "--protocols", "plain,secagg+",
          "--dropouts", "0,0.2", "--out", str(tmp_path), "--no-memory"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert re.match(r"^scale_d protocol=secagg\+ d_max=2e\+04 n=5 seconds=\d+\.\d\d plain_seconds=\d+\.\d\d "
                    r"peak_rss_mb=\d+$", lines[-1]), lines[-1]
    assert (tmp_path / "scale_d.png").stat().st_size > 0


@pytest.mark.parametrize("protocol", ["plain", "secagg+"])
def test_chunked_inputs_are_driven_chunk_by_chunk_and_summed_exactly(protocol):
    """With `chunk`, the in-process driver iterates the chunks, charges making them to the client and checks
    the sum (run_point raises if it were wrong)."""
    from secagg.protocols.chunks import MIN_CHUNK

    d = 3 * MIN_CHUNK + 5
    p = run_point(protocol, n=6, d=d, dropout=0.0, lazy=True, chunk=MIN_CHUNK)
    assert not p.aborted and p.survivors == 6
    assert 4 * d <= p.up_B < 4 * d + 64 * 1024 and p.client_max_s > 0


def test_the_d_table_puts_the_three_protocols_side_by_side_and_says_what_did_not_run():
    from benchmarks.scale_curve import Point, d_table

    def point(protocol, d, round_s, rss, up, aborted=""):
        return Point(protocol=protocol, n=10, d=d, dropout=0.1, server_s=round_s, client_max_s=0.0, round_s=round_s,
                     up_B=up * d, down_B=0.0, server_peak_MB=float("nan"), survivors=9, aborted=aborted, peak_rss_MB=rss)

    rows = d_table([point("plain", 10**7, 0.5, 175, 4.0), point("secagg+", 10**7, 1.5, 176, 4.0),
                    point("lightsecagg", 10**7, 3.0, 600, 12.0), point("plain", 10**8, 2.0, 1205, 4.0),
                    point("secagg+", 10**8, 8.0, 1206, 4.0),
                    point("lightsecagg", 10**8, float("nan"), 1300, 12.0, aborted="stopped")]).splitlines()
    assert len(rows) == 4 and rows[0].startswith("| d | N | dropout | plain round s | SecAgg+ round s")
    assert rows[2] == "| 1e+07 | 10 | 10% | 0.50 | 1.50 | 3.0x | 3.00 | 175 / 176 / 600 | 305 | 4.000 / 12.000 |"
    assert rows[3] == ("| 1e+08 | 10 | 10% | 2.00 | 8.00 | 4.0x | not run | 1205 / 1206 / not run | 1335 | "
                       "4.000 / not run |")
