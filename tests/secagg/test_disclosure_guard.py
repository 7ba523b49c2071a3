"""The disclosure guard refuses noise-free sums that expose individuals, and only those."""
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp.ledger import GaussianMechanism, Ledger
from secagg.disclosure_guard import DisclosureError, DisclosureGuard, GuardConfig


def exposed_exactly(rows: list[tuple[int, ...]], clients: list[int]) -> set[int]:
    """Clients i with e_i in the row space of the 0/1 membership matrix, over the rationals.

    In the reduced row echelon form R of M, e_i is in rowspace(M) iff some row of R equals e_i.
    """
    index = {c: k for k, c in enumerate(clients)}
    basis: list[list[Fraction]] = []  # rows of the RREF, each with a distinct pivot
    pivots: list[int] = []
    for members in rows:
        v = [Fraction(0)] * len(clients)
        for c in members:
            v[index[c]] = Fraction(1)
        for row, p in zip(basis, pivots):
            if v[p]:
                f = v[p]
                v = [a - f * b for a, b in zip(v, row)]
        nz = next((k for k, a in enumerate(v) if a), None)
        if nz is None:
            continue
        v = [a / v[nz] for a in v]
        for k, row in enumerate(basis):
            if row[nz]:
                f = row[nz]
                basis[k] = [a - f * b for a, b in zip(row, v)]
        basis.append(v)
        pivots.append(nz)
    return {clients[p] for row, p in zip(basis, pivots) if sum(1 for a in row if a) == 1}


EXACT = 1 - 1e-8


def test_two_sums_attack_is_refused_naming_the_victim():
    guard = DisclosureGuard()
    a = list(range(1, 11))
    guard.authorize("doc-mean/v1", a)
    with pytest.raises(DisclosureError, match=r"would expose the individual vectors of clients \[42\]") as info:
        guard.authorize("doc-mean/v1", a + [42])
    assert info.value.exposed == (42,)
    assert "42" in str(info.value)
    assert guard.rank("doc-mean/v1") == 1  # the refused release left no trace
    guard.authorize("doc-mean/v1", a + [42, 43])  # adding two at once exposes nobody
    assert guard.leverage("doc-mean/v1")[42] == pytest.approx(0.5)


def test_subset_removal_is_the_same_attack():
    guard = DisclosureGuard()
    guard.authorize("k", range(1, 9))
    with pytest.raises(DisclosureError, match=r"would expose the individual vectors of clients \[8\]") as info:
        guard.authorize("k", range(1, 8))
    assert info.value.exposed == (8,)


def test_random_cohorts_are_refused_once_the_rank_test_fails():
    rng = np.random.default_rng(0)
    n_clients, cohort = 40, 8
    guard, accepted = DisclosureGuard(GuardConfig(max_leverage=EXACT)), []
    refusals = 0
    for _ in range(400):
        members = tuple(sorted(rng.choice(n_clients, size=cohort, replace=False).tolist()))
        try:
            guard.authorize("summary", members)
            accepted.append(members)
        except DisclosureError as err:
            refusals += 1
            if refusals <= 3:
                assert err.exposed
                assert set(err.exposed) == exposed_exactly(accepted + [members], list(range(n_clients)))
    assert refusals > 0
    assert guard.rank("summary") < n_clients  # full rank would expose everyone
    assert exposed_exactly(accepted, list(range(n_clients))) == set()
    assert guard.exposed_fraction("summary") == 0.0
    assert guard.exposed_fraction("summary", threshold=0.99) > 0  # near-exposures the default config refuses


def test_default_config_also_refuses_near_exposure():
    rng = np.random.default_rng(0)
    guard = DisclosureGuard()
    for _ in range(400):
        _try(guard, "summary", rng.choice(40, size=8, replace=False).tolist())
    assert max(guard.leverage("summary").values()) <= 0.99


def test_disjoint_fixed_groups_are_accepted_for_thousands_of_releases():
    guard = DisclosureGuard()
    groups = [tuple(range(g * 20, (g + 1) * 20)) for g in range(15)]  # 300 clients
    for release in range(3000):
        guard.authorize("model-update/partitioned", groups[release % len(groups)])
    assert guard.rank("model-update/partitioned") == 15
    assert max(guard.leverage("model-update/partitioned").values()) == pytest.approx(1 / 20)


def test_many_clients_and_releases_stay_consistent():
    """A few hundred clients x a few thousand releases (mostly repeats of a growing set of groups)."""
    rng = np.random.default_rng(1)
    guard = DisclosureGuard()
    groups = [tuple(sorted(rng.choice(300, size=30, replace=False).tolist())) for _ in range(120)]
    accepted = [g for g in groups if _try(guard, "big", g)]
    for k in range(2000):
        guard.authorize("big", accepted[k % len(accepted)])  # repeats are in the span: always accepted
    assert guard.rank("big") == len(accepted) and len(accepted) > 100


def _try(guard, key, members) -> bool:
    try:
        guard.authorize(key, members)
        return True
    except DisclosureError:
        return False


@settings(max_examples=40, deadline=None)
@given(st.lists(st.frozensets(st.integers(0, 7), min_size=1, max_size=8), min_size=1, max_size=10))
def test_numerical_decisions_match_exact_rational_rank(rows):
    guard = DisclosureGuard(GuardConfig(min_cohort=1, max_leverage=EXACT))
    accepted = []
    for members in rows:
        members = tuple(sorted(members))
        would_expose = exposed_exactly(accepted + [members], list(range(8)))
        if would_expose:
            with pytest.raises(DisclosureError, match="releasing the noise-free sum over .* would expose the individual vectors of clients") as info:
                guard.authorize("k", members)
            assert set(info.value.exposed) == would_expose
        else:
            guard.authorize("k", members)
            accepted.append(members)


def test_min_cohort_rule():
    guard = DisclosureGuard(GuardConfig(min_cohort=5))
    with pytest.raises(DisclosureError, match="minimum cohort"):
        guard.authorize("k", [1, 2, 3])
    with pytest.raises(DisclosureError, match="below the minimum cohort 5") as info:
        guard.authorize("k", [7])
    assert info.value.exposed == (7,)


def test_the_default_minimum_group_is_five():
    assert GuardConfig().min_cohort >= 5
    guard = DisclosureGuard()
    with pytest.raises(DisclosureError, match=r"4 client\(s\) is below the minimum cohort 5 \(min_cohort rule\)"):
        guard.authorize("k", [1, 2, 3, 4])
    assert guard.rank("k") == 0 and guard.keys() == []
    assert guard.authorize("k", [1, 2, 3, 4, 5]).rank == 1


def test_anonymous_groups_follow_the_size_rule_and_leave_no_history():
    guard = DisclosureGuard()
    guard.authorize_count("part[0]", 0)  # an empty cluster releases nothing
    guard.authorize_count("part[1]", 5)
    for small in (1, 2, 4):
        with pytest.raises(DisclosureError, match="min_cohort rule"):
            guard.authorize_count("part[2]", small)
    guard.authorize_count("part[2]", 1, noisy=True)  # DP noise on the cluster: allowed
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="a group size is a non-negative int"):
            guard.authorize_count("part[3]", bad)
    assert guard.keys() == []
    assert DisclosureGuard(GuardConfig(min_cohort=2)).authorize_count("x", 2) is None


def test_forget_drops_a_key_and_state_can_be_limited_to_keys():
    """forget() drops a key's history, so the key itself is closed: S(a) then S(a + [42]) under it
    would be the two-sums attack the guard can no longer see."""
    guard = DisclosureGuard()
    a = list(range(1, 11))
    guard.authorize("round 1/body", a)
    guard.authorize("doc-mean", a)
    with pytest.raises(DisclosureError, match="expose"):
        guard.authorize("round 1/body", a + [42])
    guard.forget(["round 1/body", "never-seen"])
    assert guard.keys() == ["doc-mean"]
    for release in (guard.authorize, guard.check):
        with pytest.raises(DisclosureError, match="'round 1/body' was forgotten"):
            release("round 1/body", a + [42])
    assert guard.keys() == ["doc-mean"]
    guard.authorize("round 2/body", a + [42])  # another key (the next round's vectors): a fresh history
    kept = DisclosureGuard()
    kept.load_state_dict(guard.state_dict(keys=["doc-mean"]))
    assert kept.keys() == ["doc-mean"]
    with pytest.raises(DisclosureError, match=r"would expose the individual vectors of clients \[42\]"):
        kept.authorize("doc-mean", a + [42])


def test_dp_noised_releases_are_recorded_and_allowed_when_charged():
    ledger = Ledger()
    guard = DisclosureGuard(GuardConfig(min_cohort=2), ledger=ledger)
    mech = GaussianMechanism(noise_multiplier=1.0)
    charges = [ledger.debit(c, mech, unit="client", observer="server", round_id=0) for c in (1, 2, 3)]
    guard.authorize("k", [1, 2, 3])
    decision = guard.authorize("k", [1, 2], noise=charges[:2])  # would be the two-sums attack without noise
    assert decision.noisy and guard.releases("k")["noisy"] == [(1, 2)]
    assert guard.rank("k") == 1
    with pytest.raises(DisclosureError, match="not charged"):
        guard.authorize("k", [1, 2, 3], noise=charges[:2])
    foreign = Ledger().debit(1, mech, unit="client", observer="server", round_id=5)
    with pytest.raises(DisclosureError, match="ledger"):
        guard.authorize("k", [1], noise=[foreign])
    with pytest.raises(TypeError, match="noise must be a Released value or a sequence of ledger Charges"):
        guard.authorize("k", [1], noise="trust me")


def test_a_noisy_release_needs_noise_its_mechanism_calibrates_to_a_bounded_epsilon():
    """Charged noise is not enough: with the accountant's view of one use (`noise_epsilon`), a 'noisy'
    release whose noise is negligible (noise multiplier 0.01: epsilon in the hundreds) is refused like
    a differencing pair; the calibrated one (multiplier 1) passes."""
    from dp.ledger import compose_epsilon

    ledger = Ledger()
    guard = DisclosureGuard(GuardConfig(min_cohort=2), ledger=ledger,
                            noise_epsilon=lambda c: compose_epsilon([(c.mechanism, 1)], delta=1e-5))
    guard.authorize("k", [1, 2, 3])
    weak = [ledger.debit(c, GaussianMechanism(noise_multiplier=0.01), unit="client", observer="server", round_id=0)
            for c in (1, 2)]
    with pytest.raises(DisclosureError, match="too little to count as a noisy release"):
        guard.authorize("k", [1, 2], noise=weak)
    assert guard.releases("k")["noisy"] == []
    fair = [ledger.debit(c, GaussianMechanism(noise_multiplier=1.0), unit="client", observer="server", round_id=1)
            for c in (1, 2)]
    assert guard.authorize("k", [1, 2], noise=fair).noisy


def test_check_is_a_dry_run_and_state_round_trips():
    small = GuardConfig(min_cohort=2)
    guard = DisclosureGuard(small)
    guard.authorize("k", [1, 2, 3])
    assert guard.check("k", [4, 5, 6]).rank == 2
    assert guard.rank("k") == 1
    guard.authorize("k", [3, 4, 5])
    guard.authorize("other", [9, 10])
    restored = DisclosureGuard(small)
    restored.load_state_dict(guard.state_dict())
    assert restored.rank("k") == 2 and restored.leverage("k") == pytest.approx(guard.leverage("k"))
    with pytest.raises(DisclosureError, match=r"would expose the individual vectors of clients \[3\]"):
        restored.authorize("k", [1, 2])
    with pytest.raises(TypeError, match="client ids are ints"):
        guard.authorize("k", ["1", "2"])
