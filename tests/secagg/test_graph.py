"""Masking graphs: complete (SecAgg) and random k-regular, k-connected Harary graphs (SecAgg+)."""
from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from secagg.graph import complete_graph, default_degree, harary_graph, is_connected

FAST = settings(max_examples=40, deadline=None)


def _check_simple_symmetric(g, clients):
    assert set(g) == set(clients)
    for c, nb in g.items():
        assert c not in nb, "self loop"
        assert nb <= set(clients)
        for v in nb:
            assert c in g[v], f"edge {c}-{v} not symmetric"


@st.composite
def harary_params(draw):
    n = draw(st.integers(3, 40))
    k = draw(st.integers(1, n + 2))
    ids = draw(st.lists(st.integers(1, 10**6), min_size=n, max_size=n, unique=True))
    return ids, k


@FAST
@given(harary_params())
def test_harary_graph_is_symmetric_and_regular(params):
    ids, k = params
    n = len(ids)
    g = harary_graph(ids, k)
    _check_simple_symmetric(g, ids)
    degrees = {len(nb) for nb in g.values()}
    assert len(degrees) == 1, "not regular"
    (deg,) = degrees
    if k >= n - 1:
        assert deg == n - 1
    else:
        # even k exactly; odd k rounded up to the next even (or complete if that reaches n - 1)
        assert deg == min(k + (k % 2), n - 1)


@FAST
@given(harary_params(), st.randoms(use_true_random=False))
def test_harary_graph_survives_removal_of_any_k_minus_1_nodes(params, rnd):
    ids, k = params
    g = harary_graph(ids, k)
    deg = len(next(iter(g.values())))
    for _ in range(30):
        removed = set(rnd.sample(ids, min(deg - 1, len(ids) - 1)))
        assert is_connected(g, set(ids) - removed), (deg, removed)


@pytest.mark.parametrize("n, k", [(10, 4), (12, 2), (9, 6), (14, 4)])
def test_harary_graph_is_exactly_k_connected_exhaustively(n, k):
    ids = list(range(1, n + 1))
    g = harary_graph(ids, k)
    for removed in itertools.combinations(ids, k - 1):
        assert is_connected(g, set(ids) - set(removed))
    # ...and k is tight: removing a node's k neighbours isolates it
    c = ids[0]
    assert not is_connected(g, set(ids) - g[c])


def test_default_sizes_used_by_secagg_plus():
    for n in (10, 30, 50, 100, 1000):
        k = default_degree(n)
        assert k % 2 == 0 and k < n
        g = harary_graph(list(range(1, n + 1)), k)
        assert {len(v) for v in g.values()} == {k}
        _check_simple_symmetric(g, range(1, n + 1))
        survivors = set(random.sample(range(1, n + 1), n - (k - 1)))
        assert is_connected(g, survivors)


def test_harary_ordering_is_random():
    ids = list(range(1, 31))
    graphs = {tuple(sorted((c, tuple(sorted(v))) for c, v in harary_graph(ids, 4).items())) for _ in range(5)}
    assert len(graphs) > 1


@pytest.mark.parametrize("n, expected", [(0, 0), (1, 0), (2, 1), (3, 2), (4, 3), (5, 4), (10, 8), (30, 10), (1000, 20)])
def test_default_degree(n, expected):
    assert default_degree(n) == expected


def test_complete_graph():
    g = complete_graph([3, 1, 7])
    assert g == {3: frozenset({1, 7}), 1: frozenset({3, 7}), 7: frozenset({1, 3})}
    assert complete_graph([5]) == {5: frozenset()}


def test_large_degree_falls_back_to_complete():
    ids = [2, 4, 6, 8, 10]
    assert harary_graph(ids, 4) == complete_graph(ids)
    assert harary_graph(ids, 99) == complete_graph(ids)


def test_degree_below_one_is_refused():
    with pytest.raises(ValueError, match="degree must be at least 1"):
        harary_graph([1, 2, 3, 4], 0)


def test_is_connected_basics():
    g = {1: frozenset({2}), 2: frozenset({1}), 3: frozenset({4}), 4: frozenset({3}), 5: frozenset()}
    assert is_connected(g, [])
    assert is_connected(g, [5])
    assert is_connected(g, [1, 2])
    assert not is_connected(g, [1, 2, 3, 4])
    assert not is_connected(g, [1, 5])
    # induced subgraph: a path 1-2-3 with 2 removed is disconnected
    path = {1: frozenset({2}), 2: frozenset({1, 3}), 3: frozenset({2})}
    assert is_connected(path, [1, 2, 3])
    assert not is_connected(path, [1, 3])
