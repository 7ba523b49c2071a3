"""SecAgg+ degree and threshold from the threat model (secagg/plus_params.py): the returned (k, t) meet
every condition and k - 2 does not (checked with scipy's hypergeometric tails, independently of the
module's log-space sums), the per-client probabilities match a simulation of the real Harary graph,
the client-side majority rule always holds, and impossible settings raise."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import hypergeom

from secagg.graph import harary_graph, is_connected
from secagg.plus_params import (
    check_degree, corrupt_neighbour_tail, counts, plus_parameters, short_holder_probability, window_probability,
)
from secagg.protocols.secagg import threshold_for

LN2 = math.log(2)


def _bounds(n: int, k: int, t, dropout: float, gamma: float) -> tuple[np.ndarray, np.ndarray]:
    """(ln security failure bound, ln abort bound) at degree k for the thresholds t (array), from
    scipy.stats.hypergeom."""
    t = np.asarray(t)
    c = min(n, math.ceil(gamma * n - 1e-9))
    m = min(n, c + math.ceil(dropout * n - 1e-9))
    k = min(k, n - 1)
    half = k // 2
    conn = (math.log(n) + hypergeom.logpmf(half, n, m, half)) if k < n - 1 and n > m else -math.inf
    with np.errstate(divide="ignore"):
        sec = np.logaddexp(math.log(n - c) + hypergeom.logsf(t - 1, n - 1, c, k) if n > c else -np.inf, conn)
        live = math.log(n - m) + hypergeom.logsf(k + 1 - t, n - 1, m, k) if n > m else -np.inf
        gone = math.log(m) + hypergeom.logsf(k - t, n - 1, m - 1, k) if m > 0 else -np.inf
    return sec, np.logaddexp(np.logaddexp(live, gone), conn)


def _meets(n, k, t, dropout, gamma, sigma=40.0, eta=30.0, slack=1e-6) -> np.ndarray:
    """Whether (k, t) meets every condition, per threshold in t; slack < 0 demands a clear failure."""
    t = np.asarray(t)
    sec, abort = _bounds(n, k, t, dropout, gamma)
    return ((2 * t > k + 1) & (t <= k + 1) & (k <= n - 1)
            & (sec <= -sigma * LN2 + slack) & (abort <= -eta * LN2 + slack))


GRID = [(n, delta, gamma) for n in (20, 60, 100, 200, 500, 1000) for delta in (0.0, 0.1, 0.3)
        for gamma in (0.0, 0.05, 0.1)] + [(10, 0.3, 0.05), (12, 0.3, 0.05), (33, 0.2, 0.2)]


@pytest.mark.parametrize("n,delta,gamma", GRID)
def test_returned_parameters_meet_every_condition_and_are_minimal(n, delta, gamma):
    p = plus_parameters(n=n, dropout=delta, corrupt_fraction=gamma)
    k, t = p.degree, p.threshold
    assert 2 * t > k + 1                                   # the client-side rule, always
    assert _meets(n, k, t, delta, gamma)
    assert (k == n - 1) == p.complete and (p.complete or k % 2 == 0)
    sec, abort = _bounds(n, k, t, delta, gamma)
    assert p.security_failure_log2 == pytest.approx(float(sec) / LN2, abs=1e-6)
    assert p.abort_log2 == pytest.approx(float(abort) / LN2, abs=1e-6)
    # the smallest threshold for k: t - 1 breaks the majority rule or security
    assert not _meets(n, k, t - 1, delta, gamma, slack=-1e-6)
    # the smallest degree: no threshold works at the even degree below (for the complete graph: the
    # largest even degree below N - 1)
    below = k - 2 if k % 2 == 0 else k - 1
    if below >= 2:
        assert not _meets(n, below, np.arange(1, below + 2), delta, gamma, slack=-1e-6).any()
        assert check_degree(n=n, degree=below, dropout=delta, corrupt_fraction=gamma).threshold is None


def test_planned_thirty_percent_dropout_stays_sparse():
    got = {n: plus_parameters(n=n, dropout=0.3, corrupt_fraction=0.05) for n in (200, 500, 1000)}
    assert {n: (p.degree, p.threshold) for n, p in got.items()} == {200: (132, 67), 500: (244, 123), 1000: (338, 170)}
    for n, p in got.items():
        assert p.degree < n - 1 and not p.complete
        assert p.security_failure_log2 <= -40 and p.abort_log2 <= -30
    assert got[1000].describe().startswith("secagg+ n=1000 k=338 t=170 dropout=0.30 corrupt=0.05 sigma=40 eta=30")


def test_only_the_complete_graph_and_its_line():
    p = plus_parameters(n=12, dropout=0.3, corrupt_fraction=0.05)     # 4 + 1 of 12 not live
    assert p.complete and (p.degree, p.threshold) == (11, 7) and "k=11 t=7 (complete graph: SecAgg)" in p.describe()
    assert check_degree(n=12, degree=10, dropout=0.3, corrupt_fraction=0.05).threshold is None


def test_impossible_settings_raise():
    with pytest.raises(ValueError, match=r"no SecAgg\+ degree k <= N-1 .*binding condition: correctness"):
        plus_parameters(n=100, dropout=0.3, corrupt_fraction=0.25)   # 55 of 100 not live: no majority left
    with pytest.raises(ValueError, match=r"binding condition: correctness"):
        plus_parameters(n=1000, dropout=0.5, corrupt_fraction=0.0)
    with pytest.raises(ValueError, match="at least 2 clients"):
        plus_parameters(n=1, dropout=0.1)
    with pytest.raises(ValueError, match=r"must be in \[0, 1\)"):
        plus_parameters(n=100, dropout=1.0)
    with pytest.raises(ValueError, match="must be positive"):
        plus_parameters(n=100, dropout=0.1, sigma=0)


def test_threshold_fraction_gives_the_servers_threshold_exactly():
    for k in range(2, 1200, 2):
        for t in range(k // 2 + 1, k + 2):
            assert threshold_for(k + 1, (t - 0.5) / (k + 1)) == t
    from secagg.protocols.secagg import SecAggPlusServer

    for n, delta in ((200, 0.3), (12, 0.1)):
        p = plus_parameters(n=n, dropout=delta, corrupt_fraction=0.05)
        server = SecAggPlusServer(round_id=1, clients=list(range(1, n + 1)), length=8, degree=p.degree,
                                  threshold_fraction=p.threshold_fraction())
        assert server.threshold == p.threshold
        assert {len(v) for v in server.graph.values()} == {p.degree}


def test_per_client_probabilities_match_a_simulation_of_the_harary_graph():
    n, k, draws = 60, 20, 1000
    ids = list(range(1, n + 1))
    c, m = 12, 24
    corrupt, lost = set(ids[:c]), set(ids[:m])                # the colluders are among the lost
    honest, live = [u for u in ids if u not in corrupt], [u for u in ids if u not in lost]
    ts = (10, 11, 12, 13)
    freq = {key: [] for key in [("corrupt", t) for t in (5, 6, 7)] + [(w, t) for w in ("live", "gone") for t in ts]}
    for _ in range(draws):
        g = harary_graph(ids, k)
        bad = [len(g[u] & corrupt) for u in honest]
        live_holders = [1 + len(g[u] - lost) for u in live]
        gone_holders = [len(g[u] - lost) for u in lost]
        for t in (5, 6, 7):
            freq[("corrupt", t)].append(np.mean([b >= t for b in bad]))
        for t in ts:
            freq[("live", t)].append(np.mean([h < t for h in live_holders]))
            freq[("gone", t)].append(np.mean([h < t for h in gone_holders]))
    for (what, t), per_draw in freq.items():
        if what == "corrupt":
            exact = corrupt_neighbour_tail(n=n, degree=k, corrupt=c, threshold=t)
        else:
            exact = short_holder_probability(n=n, degree=k, lost=m, threshold=t, live=what == "live")
        mean, se = float(np.mean(per_draw)), float(np.std(per_draw, ddof=1)) / math.sqrt(draws)
        assert 0.01 < exact < 0.99, (what, t, exact)          # large enough to estimate
        assert abs(mean - exact) <= 5 * se + 2e-3, (what, t, mean, exact, se)


def test_disconnection_of_the_honest_survivors_stays_under_the_window_bound():
    n, k, draws = 60, 8, 800
    ids = list(range(1, n + 1))
    m = 20                                                     # dropped or corrupt: not honest survivors
    bound = n * window_probability(n=n, degree=k, lost=m)
    assert bound == pytest.approx(n * math.comb(m, k // 2) / math.comb(n, k // 2))
    assert bound < 1
    honest_survivors = ids[m:]
    cut = np.mean([not is_connected(harary_graph(ids, k), honest_survivors) for _ in range(draws)])
    assert 0 < cut <= bound + 5 * math.sqrt(bound * (1 - bound) / draws)


def test_counts_do_not_round_float_noise_up():
    assert counts(n=1000, dropout=0.3, corrupt_fraction=0.05) == (50, 350)
    assert counts(n=10, dropout=0.25, corrupt_fraction=0.01) == (1, 4)
