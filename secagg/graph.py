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


def random_order(clients: Sequence[int]) -> list[int]:
    """A uniformly random ring order of the clients (OS CSPRNG)."""
    order = list(clients)
    secrets.SystemRandom().shuffle(order)
    return order


def harary_graph(clients: Sequence[int], degree: int, *, order: Sequence[int] | None = None) -> dict[int, frozenset[int]]:
    """Random k-regular Harary graph (k even; odd k is rounded up), or complete if k >= n - 1.
    `order`: the ring order to use (default: a fresh `random_order`)."""
    n = len(clients)
    if degree < 1 and n > 1:
        raise ValueError("degree must be at least 1")
    if degree >= n - 1:
        return complete_graph(clients)
    half = (degree + 1) // 2
    order = list(order) if order is not None else random_order(clients)
    if sorted(order) != sorted(clients):
        raise ValueError("order must list every client once")
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


def smallest_isolable_group(*, order: Sequence[int], half: int, survivors: Iterable[int], colluders: int,
                            min_group: int) -> tuple[int, ...] | None:
    """A set of fewer than `min_group` honest survivors whose sum a server colluding with at most
    `colluders` clients could learn from a Harary ring round, or None if there is none.

    Survivors are linked when at most `half` positions apart on the ring `order`. The server and its
    colluders know every mask that involves a colluder, and the masks of clients that dropped are
    rebuilt, so the server learns the sum of each connected component of the HONEST survivors. Two
    honest survivors are cut apart exactly when at least `half` consecutive positions between them
    hold no honest survivor; so a component smaller than `min_group` needs two such windows, one
    on each side of an arc, whose survivors all collude, plus colluders inside the arc to bring its
    honest count below `min_group`. This checks every arc against the cheapest such placement
    (exact for the ring: windows adjacent to the arc are the cheapest), in O(n (min_group +
    colluders) / survival rate). The case with fewer than two cuts (all honest survivors in one
    component) is the caller's: it needs len(survivors) - colluders >= min_group. Returns a witness:
    the survivors of the cheapest offending arc."""
    n, alive = len(order), set(survivors)
    if n == 0 or half < 1 or 2 * half + 1 > n:
        return None  # windows would overlap: the graph is complete enough that only the total counts
    flag = [1 if c in alive else 0 for c in order]
    prefix = [0]
    for f in flag + flag:
        prefix.append(prefix[-1] + f)

    def count(start: int, length: int) -> int:  # survivors in positions [start, start + length) (cyclic)
        start %= n
        return prefix[start + length] - prefix[start]

    budget = colluders
    limit = min_group - 1 + budget  # more survivors in an arc cost more than the budget to thin out
    for i in range(n):
        if not flag[i]:
            continue  # arcs start at a survivor (shifting the window inward never costs more)
        left = count(i - half, half)
        if left > budget:
            continue
        inside = 0
        for length in range(1, n - 2 * half + 1):
            j = (i + length - 1) % n
            inside += flag[j]
            if inside > limit:
                break
            if not flag[j]:
                continue  # arcs end at a survivor, too
            right = count(i + length, half)
            cost = left + right + max(0, inside - min_group + 1)
            if cost <= budget:
                return tuple(order[(i + k) % n] for k in range(length) if flag[(i + k) % n])
    return None
