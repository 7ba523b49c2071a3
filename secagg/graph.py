"""Masking graphs: the complete graph (SecAgg) and random k-regular Harary graphs (SecAgg+).

SecAgg+ (Bell et al., CCS 2020) replaces the complete graph by a random graph of degree
O(log N). We use the Harary construction on a uniformly random ordering of the clients (each
client is linked to the k/2 clients on either side), which is k-vertex-connected: removing fewer
than k clients never splits the survivors, so the server only ever learns the sum over all of them.
"""
from __future__ import annotations

import math
import secrets
from collections.abc import Iterable, Mapping, Sequence

Graph = Mapping[int, frozenset[int]]


def default_degree(n: int) -> int:
    """Neighbours per client for SecAgg+: 2 * ceil(log2 n), even, capped at n - 1."""
    if n <= 1:
        return 0
    k = 2 * math.ceil(math.log2(n))
    return min(n - 1, k)


def complete_graph(clients: Sequence[int]) -> dict[int, frozenset[int]]:
    everyone = frozenset(clients)
    return {c: everyone - {c} for c in clients}


def harary_graph(clients: Sequence[int], degree: int) -> dict[int, frozenset[int]]:
    """Random k-regular Harary graph (k even; odd k is rounded up), or complete if k >= n - 1."""
    n = len(clients)
    if degree < 1 and n > 1:
        raise ValueError("degree must be at least 1")
    if degree >= n - 1:
        return complete_graph(clients)
    half = (degree + 1) // 2
    order = list(clients)
    secrets.SystemRandom().shuffle(order)
    nbrs: dict[int, set[int]] = {c: set() for c in clients}
    for i, c in enumerate(order):
        for j in range(1, half + 1):
            other = order[(i + j) % n]
            nbrs[c].add(other)
            nbrs[other].add(c)
    return {c: frozenset(v) for c, v in nbrs.items()}


def is_connected(graph: Graph, nodes: Iterable[int]) -> bool:
    """Whether the subgraph induced on `nodes` is connected (empty and single-node count as yes)."""
    nodes = set(nodes)
    if len(nodes) <= 1:
        return True
    start = next(iter(nodes))
    seen, stack = {start}, [start]
    while stack:
        for w in graph[stack.pop()] & nodes:
            if w not in seen:
                seen.add(w)
                stack.append(w)
    return seen == nodes
