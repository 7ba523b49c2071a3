"""ATC's server-side planning: the public objective coin, neighbour ranking from sketches, and the
guard-aware choice of overlapping neighbour groups, attacked with the subset-sum recoverability attack."""
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dp.leakage.recoverability import recoverable_clients
from fl_algorithms.algorithms.atc import ATC, ATCConfig, guarded_groups, neighbour_sets, objectives_for


def test_objective_coin_is_public_and_varies():
    a = objectives_for(seed=3, round=2, clusters=5)
    assert np.array_equal(a, objectives_for(seed=3, round=2, clusters=5))
    assert set(a.tolist()) <= {0, 1}
    draws = np.stack([objectives_for(seed=3, round=t, clusters=5) for t in range(1, 21)])
    assert 0.2 < draws.mean() < 0.8 and len({tuple(r) for r in draws}) > 5


def test_neighbours_are_the_most_and_least_similar_sketches():
    # two tight groups of 4 on opposite sides, and their members' nearest are their own group
    rng = np.random.default_rng(0)
    base = rng.normal(size=16)
    sketches = {i: base + 0.01 * rng.normal(size=16) for i in range(1, 5)}
    sketches |= {i: -base + 0.01 * rng.normal(size=16) for i in range(5, 9)}
    near, far = neighbour_sets(sketches, k=3)
    assert near[1] == (2, 3, 4) and near[6] == (5, 7, 8)
    assert set(far[1]) <= {5, 6, 7, 8} and set(far[6]) <= {1, 2, 3, 4}
    with pytest.raises(ValueError, match="2 sketches cannot give each client 2 neighbours"):
        neighbour_sets({1: base, 2: base}, k=2)


def _exposed(groups, ids):
    return recoverable_clients([sorted(g) for g in set(groups)], clients=ids).exposed


def test_the_guard_refuses_the_overlapping_groups_that_expose_a_client():
    """Client i's wish {1..5} then {1..6}: the difference is client 6's vector. The second wish is replaced
    by an already-summed group, and the attack recovers nobody from what is summed."""
    ids = list(range(1, 11))
    everyone = frozenset(ids)
    wanted = [(1, frozenset({1, 2, 3, 4, 5})), (6, frozenset({1, 2, 3, 4, 5, 6})), (7, frozenset({6, 7, 8, 9, 10}))]
    assert _exposed([g for _, g in wanted], ids)          # unguarded, the attack recovers client 6
    out = guarded_groups(wanted, everyone=everyone, min_size=5)
    assert out[0] == wanted[0][1] and out[1] != wanted[1][1]
    assert not _exposed(out, ids)
    assert all(len(g) >= 5 for g in out)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(8, 16), k=st.integers(4, 6), seed=st.integers(0, 2**16))
@example(n=15, k=4, seed=24820)
def test_random_neighbour_wishes_never_expose_anyone(n, k, seed):
    rng = np.random.default_rng(seed)
    ids = list(range(1, n + 1))
    wanted = [(i, frozenset({i, *rng.choice([j for j in ids if j != i], size=k, replace=False).tolist()}))
              for i in ids]
    out = guarded_groups(wanted, everyone=frozenset(ids), min_size=5)
    assert len(out) == n and all(len(g) >= 5 for g in out)
    assert not _exposed(out, ids)
    # an owner is left out of its group only as the docstring's last resort: its wish refused, no group
    # accepted before it holds it, and everyone refused (hypothesis found n = 15, k = 4, seed = 24820)
    for t, ((owner, _), g) in enumerate(zip(wanted, out)):
        if owner not in g:
            assert not any(owner in h for h in out[:t]) and frozenset(ids) not in out[:t], (owner, g)
    assert sum(owner in g for (owner, _), g in zip(wanted, out)) >= n // 2


def test_config_and_constructor_validation():
    with pytest.raises(ValueError, match=r"top_k >= min_size - 1 .*got top_k 2, min_size 5"):
        ATCConfig(top_k=2, min_size=5)          # C+ = top_k + 1 = 3 < 5: every group would be refused
    with pytest.raises(ValueError, match="need assign_rounds, clusters, top_k and local_epochs >= 1"):
        ATCConfig(assign_rounds=0)
    with pytest.raises(ValueError, match="CONTRAST needs a DPSketcher"):
        ATC(ATCConfig())                        # CONTRAST needs the sketch mechanism
    assert ATC(ATCConfig(contrast=False)).releases == {}
