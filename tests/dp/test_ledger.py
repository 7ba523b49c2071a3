"""The ledger composes with dp_accounting (Gaussian) and the RDP curves (Skellam/DDG), per label."""
import json
import math

import dp_accounting
import pytest
from dp_accounting import pld, rdp
from hypothesis import given, settings
from hypothesis import strategies as st

from dp.accounting import epsilon_from_rdp, skellam_curve
from dp.sampling import SamplingRecord
from dp.ledger import (Budget, BudgetExceeded, DiscreteGaussianMechanism, GaussianMechanism, Ledger, LedgerConfig,
                       NonPrivateMechanism, Observer, PrivacyUnit, SkellamMechanism, compose_epsilon)

DELTA = 1e-5


def poisson(q: float, population: int = 1000) -> SamplingRecord | None:
    """The record of a Poisson sampler at q (None for q = 1: no sampling claimed)."""
    return SamplingRecord("poisson", population, q) if q < 1 else None


def dp_accounting_epsilon(parts, *, accountant="rdp", delta=DELTA):
    acc = rdp.RdpAccountant() if accountant == "rdp" else pld.PLDAccountant(value_discretization_interval=1e-3)
    events = []
    for z, q, steps in parts:
        e = dp_accounting.GaussianDpEvent(z)
        if q < 1:
            e = dp_accounting.PoissonSampledDpEvent(q, e)
        events.append(dp_accounting.SelfComposedDpEvent(e, steps))
    acc.compose(dp_accounting.ComposedDpEvent(events))
    return acc.get_epsilon(delta)


@settings(max_examples=25, deadline=None)
@given(z=st.floats(0.5, 4.0), q=st.sampled_from([1.0, 0.5, 0.05, 0.003]), rounds=st.integers(1, 5),
       steps=st.integers(1, 200))
def test_subsampled_gaussian_matches_dp_accounting(z, q, rounds, steps):
    ledger = Ledger()
    mech = GaussianMechanism(noise_multiplier=z, sampling_rate=q)
    for r in range(rounds):  # repeated debits merge into one entry with a count
        ledger.debit(7, mech, unit="example", observer="server", round_id=r, count=steps, sampling=poisson(q))
    assert len(ledger.entries(7)) == 1
    expected = dp_accounting_epsilon([(z, q, rounds * steps)])
    assert ledger.epsilon(7, unit="example", observer="server") == pytest.approx(expected, rel=1e-12)


def test_heterogeneous_gaussians_and_pld_option_match_dp_accounting():
    parts = [(1.1, 0.01, 30), (0.8, 0.02, 10), (3.0, 1.0, 2)]
    for accountant in ("rdp", "pld"):
        ledger = Ledger(LedgerConfig(accountant=accountant, pld_discretization=1e-3))
        for z, q, steps in parts:
            ledger.debit(1, GaussianMechanism(noise_multiplier=z, sampling_rate=q), unit="client",
                         observer="outsider", count=steps, sampling=poisson(q))
        expected = dp_accounting_epsilon(parts, accountant=accountant)
        assert ledger.epsilon(1, unit="client", observer="outsider") == pytest.approx(expected, rel=1e-9)
    assert dp_accounting_epsilon(parts, accountant="pld") < dp_accounting_epsilon(parts)


def test_labels_are_composed_separately():
    ledger = Ledger()
    ledger.debit(3, GaussianMechanism(noise_multiplier=1.0), unit="client", observer="server", count=4)
    ledger.debit(3, GaussianMechanism(noise_multiplier=1.0, sampling_rate=0.1), unit="client",
                 observer="outsider", count=4, sampling=poisson(0.1))
    server = ledger.epsilon(3, unit="client", observer="server")
    outsider = ledger.epsilon(3, unit="client", observer="outsider")
    assert 0 < outsider < server
    assert ledger.epsilon(3, unit="example", observer="server") == 0.0
    assert ledger.epsilon(99, unit="client", observer="server") == 0.0


def test_skellam_and_ddg_entries_use_their_rdp_curves():
    sk = SkellamMechanism(l1_sensitivity=3e5, l2_sensitivity=1000.0, variance=1000.0**2, sampling_rate=1.0)
    ledger = Ledger()
    ledger.debit(2, sk, unit="client", observer="server", count=10)
    expected = epsilon_from_rdp(10 * skellam_curve(l1=3e5, l2=1000.0, variance=1e6), delta=DELTA)
    assert ledger.epsilon(2, unit="client", observer="server") == pytest.approx(expected, rel=1e-12)
    ddg = DiscreteGaussianMechanism(l1_sensitivity=3e5, l2_sensitivity=1000.0, local_stddev=100.0, n_clients=100,
                                    dim=1024)
    assert compose_epsilon([(ddg, 10)], delta=DELTA) == pytest.approx(expected, rel=1e-3)


def test_pld_mode_with_skellam_takes_the_better_valid_bound():
    g = GaussianMechanism(noise_multiplier=1.0, sampling_rate=0.01)
    sk = SkellamMechanism(l1_sensitivity=3e5, l2_sensitivity=1000.0, variance=2000.0**2)
    parts = [(g, 1000), (sk, 3)]
    rdp_eps = compose_epsilon(parts, delta=DELTA, accountant="rdp")
    pld_eps = compose_epsilon(parts, delta=DELTA, accountant="pld")
    assert pld_eps <= rdp_eps
    split = compose_epsilon([(g, 1000)], delta=DELTA / 2, accountant="pld") + \
        compose_epsilon([(sk, 3)], delta=DELTA / 2, accountant="rdp")
    assert pld_eps == pytest.approx(min(rdp_eps, split))


def test_non_private_entry_is_infinite():
    ledger = Ledger()
    ledger.debit(5, NonPrivateMechanism("trusted server sees the sum"), unit="client", observer="server")
    assert ledger.epsilon(5, unit="client", observer="server") == math.inf
    assert json.loads(ledger.to_json())["clients"]["5"]["epsilon"]["client/server"] == "inf"


def test_budget_refuses_and_leaves_the_ledger_unchanged():
    budget = Budget(PrivacyUnit.EXAMPLE, Observer.SERVER, 2.0)
    ledger = Ledger(LedgerConfig(budgets=(budget,)))
    mech = GaussianMechanism(noise_multiplier=1.0, sampling_rate=0.01)
    ledger.debit(1, mech, unit="example", observer="server", count=100, sampling=poisson(0.01))
    before = ledger.epsilon(1, unit="example", observer="server")
    with pytest.raises(BudgetExceeded, match="budget 2"):
        ledger.debit(1, mech, unit="example", observer="server", count=100_000, sampling=poisson(0.01))
    assert ledger.epsilon(1, unit="example", observer="server") == before
    assert ledger.entries(1)[0].count == 100


def test_charges_are_verifiable():
    ledger, other = Ledger(), Ledger()
    charge = ledger.debit(4, GaussianMechanism(noise_multiplier=2.0), unit="client", observer="server", round_id=3)
    assert ledger.holds(charge)
    assert not other.holds(charge)


def test_json_report_and_state_round_trip(tmp_path):
    ledger = Ledger(LedgerConfig(delta=1e-6, budgets=(Budget(PrivacyUnit.CLIENT, Observer.SERVER, 50.0),)))
    ledger.debit(1, GaussianMechanism(noise_multiplier=1.3, sampling_rate=0.02, sensitivity=1.0),
                 unit="example", observer="server", round_id=0, summary_key="dp-sgd", count=50, sampling=poisson(0.02))
    ledger.debit(1, SkellamMechanism(l1_sensitivity=5e4, l2_sensitivity=500.0, variance=6e5, scale=500.0),
                 unit="client", observer="server", round_id=0)
    ledger.debit(2, SkellamMechanism(l1_sensitivity=5e4, l2_sensitivity=500.0, variance=6e5, sampling_rate=0.1),
                 unit="client", observer="outsider", round_id=1, sampling=poisson(0.1))
    ledger.record_model(1, round_id=0, model_digest="abc123")

    path = ledger.write(tmp_path / "ledger.json")
    report = json.loads(path.read_text())
    entry = report["clients"]["1"]["entries"][0]
    assert entry["mechanism"] == {"name": "gaussian", "noise_multiplier": 1.3, "sampling_rate": 0.02,
                                  "sensitivity": 1.0, "neighbouring": "add_remove"}
    assert entry["count"] == 50 and entry["rounds"] == [0] and entry["unit"] == "example"
    assert entry["epsilon"] == pytest.approx(ledger.epsilon(1, unit="example", observer="server"))
    assert set(report["clients"]["1"]["epsilon"]) == {"example/server", "client/server"}
    assert report["clients"]["1"]["models"] == {"0": "abc123"}

    state = json.loads(json.dumps(ledger.state_dict()))  # JSON-able, no pickle
    restored = Ledger.from_state_dict(state)
    assert restored.config == ledger.config
    assert restored.report() == ledger.report()
    restored.debit(2, SkellamMechanism(l1_sensitivity=5e4, l2_sensitivity=500.0, variance=6e5, sampling_rate=0.1),
                   unit="client", observer="outsider", round_id=2, sampling=poisson(0.1))
    assert restored.entries(2)[0].count == 2 and restored.entries(2)[0].rounds == (1, 2)


def test_invalid_input_is_rejected():
    with pytest.raises(ValueError, match="noise multiplier must be positive"):
        GaussianMechanism(noise_multiplier=0.0)
    with pytest.raises(ValueError, match="Poisson-sampled events are accounted add/remove-one only"):
        GaussianMechanism(noise_multiplier=1.0, sampling_rate=0.5, neighbouring="replace_one")
    with pytest.raises(ValueError, match="'user' is not a valid PrivacyUnit"):
        Ledger().debit(1, GaussianMechanism(noise_multiplier=1.0), unit="user", observer="server")
    with pytest.raises(TypeError, match="client ids are ints"):
        Ledger().debit("1", GaussianMechanism(noise_multiplier=1.0), unit="client", observer="server")
    with pytest.raises(ValueError, match="not a ledger state of format"):
        Ledger.from_state_dict({"format": "something-else"})


def test_amplification_needs_a_poisson_sampler_at_that_rate_and_the_saved_ledger_says_which():
    from dp.sampling import AmplificationNotJustified

    ledger = Ledger()
    mech = GaussianMechanism(noise_multiplier=1.0, sampling_rate=0.05)
    for record in (None, SamplingRecord("seeded", 200, 0.05), SamplingRecord("fixed_size", 200, 0.05),
                   SamplingRecord("poisson", 200, 0.1)):
        with pytest.raises(AmplificationNotJustified, match="claims Poisson amplification at q=0.05.*(no sampler was recorded|drawn by the '(seeded|fixed_size)' sampler)|Poisson sampler ran at q=0.1"):
            ledger.debit(1, mech, unit="client", observer="outsider", sampling=record)
    assert ledger.entries(1) == ()
    seeded = SamplingRecord("seeded", 200, 0.05)  # recorded, but claims nothing: accounted at q = 1
    ledger.debit(1, GaussianMechanism(noise_multiplier=1.0), unit="client", observer="outsider", sampling=seeded)
    ledger.debit(1, mech, unit="client", observer="outsider", sampling=poisson(0.05, 200))
    state = json.loads(json.dumps(ledger.state_dict()))
    assert [e["sampling"] for e in state["clients"]["1"]["entries"]] == [
        {"scheme": "seeded", "population": 200, "rate": 0.05, "min_cohort": 0},
        {"scheme": "poisson", "population": 200, "rate": 0.05, "min_cohort": 0}]
    assert Ledger.from_state_dict(state).report() == ledger.report()
    state["clients"]["1"]["entries"][1]["sampling"] = {"scheme": "seeded", "population": 200, "rate": 0.05}
    with pytest.raises(AmplificationNotJustified, match="saved gaussian"):  # a tampered ledger file
        Ledger.from_state_dict(state)


def test_rounds_below_the_floor_add_their_boundary_delta_and_nothing_else():
    """Two released and three skipped Poisson rounds with a floor of 4: epsilon is dp_accounting's for
    the two released rounds at delta minus five boundary terms (one per sampled round)."""
    from scipy import stats

    from dp.ledger import NoReleaseMechanism

    record = SamplingRecord("poisson", 40, 0.25, min_cohort=4)
    p = stats.binom.pmf(3, 39, 0.25)
    mech = GaussianMechanism(noise_multiplier=1.5, sampling_rate=0.25)
    ledger = Ledger(LedgerConfig(delta=0.1))
    for t in (1, 2):
        ledger.debit(7, mech, unit="client", observer="outsider", round_id=t, sampling=record)
    for t in (3, 4, 5):
        ledger.debit(7, NoReleaseMechanism("cohort below the floor", sampling_rate=0.25), unit="client",
                     observer="outsider", round_id=t, sampling=record)
    acc = rdp.RdpAccountant()
    acc.compose(dp_accounting.SelfComposedDpEvent(mech.dp_event(), 2))
    assert ledger.epsilon(7, unit="client", observer="outsider") == pytest.approx(acc.get_epsilon(0.1 - 5 * p))
    entries = ledger.report()["clients"]["7"]["entries"]
    assert [e["boundary_delta"] for e in entries] == pytest.approx([2 * p, 3 * p])
    assert entries[1]["epsilon"] == 0.0  # a skipped round alone releases nothing
    assert Ledger.from_state_dict(json.loads(json.dumps(ledger.state_dict()))).report() == ledger.report()
    # when the boundary terms use up delta, no finite epsilon is claimed
    tight = Ledger(LedgerConfig(delta=4 * p))
    for t in range(1, 6):
        tight.debit(7, mech, unit="client", observer="outsider", round_id=t, sampling=record)
    assert tight.epsilon(7, unit="client", observer="outsider") == math.inf
    # a seeded record with the same floor claims no amplification and adds nothing to delta
    seeded = Ledger(LedgerConfig(delta=1e-2))
    seeded.debit(7, GaussianMechanism(noise_multiplier=1.5), unit="client", observer="outsider",
                 sampling=SamplingRecord("seeded", 40, 0.25, min_cohort=4))
    acc = rdp.RdpAccountant()
    acc.compose(GaussianMechanism(noise_multiplier=1.5).dp_event())
    assert seeded.epsilon(7, unit="client", observer="outsider") == pytest.approx(acc.get_epsilon(1e-2))


def _wor_epsilon(population, size, z, count, delta=DELTA):
    acc = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.SampledWithoutReplacementDpEvent(
        population, size, dp_accounting.GaussianDpEvent(z)), count))
    return acc.get_epsilon(delta)


def fixed_size(size: int, population: int) -> SamplingRecord:
    return SamplingRecord("fixed_size", population, size / population)


@settings(max_examples=10, deadline=None)
@given(z=st.floats(0.6, 3.0), size=st.integers(2, 60), count=st.integers(1, 50))
def test_fixed_size_cohorts_are_accounted_replace_one_without_replacement(z, size, count):
    mech = GaussianMechanism(noise_multiplier=z, neighbouring="replace_one", population=200, sample_size=size)
    ledger = Ledger()
    ledger.debit(1, mech, unit="client", observer="outsider", count=count, sampling=fixed_size(size, 200))
    eps = ledger.epsilon(1, unit="client", observer="outsider")
    assert eps == pytest.approx(_wor_epsilon(200, size, z, count), rel=1e-9)
    unsampled = Ledger()
    unsampled.debit(1, GaussianMechanism(noise_multiplier=z, neighbouring="replace_one"), unit="client",
                    observer="outsider", count=count)
    assert eps < unsampled.epsilon(1, unit="client", observer="outsider")  # the sample amplifies
    assert ledger.report()["clients"]["1"]["neighbouring"] == {"client/outsider": "replace_one"}


def test_sampling_without_replacement_needs_the_fixed_size_sampler_of_that_size():
    from dp.sampling import AmplificationNotJustified

    mech = GaussianMechanism(noise_multiplier=1.0, neighbouring="replace_one", population=200, sample_size=20)
    ledger = Ledger()
    for record in (None, SamplingRecord("poisson", 200, 0.1), SamplingRecord("seeded", 200, 0.1),
                   fixed_size(25, 200), fixed_size(20, 201)):
        with pytest.raises(AmplificationNotJustified, match=r"claims sampling without replacement \(20 of 200\).*(no sampler was recorded|drawn by the '(poisson|seeded)' sampler|sampler drew)"):
            ledger.debit(1, mech, unit="client", observer="outsider", sampling=record)
    assert ledger.entries(1) == ()
    ledger.debit(1, mech, unit="client", observer="outsider", sampling=fixed_size(20, 200))
    state = json.loads(json.dumps(ledger.state_dict()))
    assert state["clients"]["1"]["entries"][0]["mechanism"]["sample_size"] == 20
    assert Ledger.from_state_dict(state).report() == ledger.report()
    state["clients"]["1"]["entries"][0]["sampling"] = {"scheme": "poisson", "population": 200, "rate": 0.1}
    with pytest.raises(AmplificationNotJustified, match="without replacement"):  # a tampered ledger file
        Ledger.from_state_dict(state)
    for bad in (dict(population=200), dict(population=200, sample_size=20),  # add/remove: not this bound
                dict(population=10, sample_size=20, neighbouring="replace_one")):
        with pytest.raises(ValueError, match="sampling without replacement (needs both population and sample_size|is accounted replace-one)|need ints 1 <= sample_size <= population"):
            GaussianMechanism(noise_multiplier=1.0, **bad)


def test_a_replace_one_label_converts_other_entries_soundly_and_refuses_poisson_ones():
    wor = GaussianMechanism(noise_multiplier=1.5, neighbouring="replace_one", population=100, sample_size=10)
    ledger = Ledger()
    ledger.debit(1, wor, unit="client", observer="outsider", count=30, sampling=fixed_size(10, 100))
    ledger.debit(1, GaussianMechanism(noise_multiplier=4.0), unit="client", observer="outsider", count=5)
    sk = SkellamMechanism(l1_sensitivity=3e4, l2_sensitivity=100.0, variance=400.0**2)
    ledger.debit(1, sk, unit="client", observer="outsider", count=3)
    from dp.accounting import ORDERS
    acc = rdp.RdpAccountant(list(ORDERS), neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.SampledWithoutReplacementDpEvent(
        100, 10, dp_accounting.GaussianDpEvent(1.5)), 30))
    acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(2.0), 5))  # z/2: sensitivity x2
    total = acc.rdp + 3 * skellam_curve(l1=6e4, l2=200.0, variance=400.0**2)  # sensitivities doubled
    assert ledger.epsilon(1, unit="client", observer="outsider") == pytest.approx(
        epsilon_from_rdp(total, delta=DELTA, orders=ORDERS), rel=1e-9)
    before = ledger.report()
    with pytest.raises(ValueError, match="cannot compose"):
        ledger.debit(1, GaussianMechanism(noise_multiplier=1.0, sampling_rate=0.1), unit="client",
                     observer="outsider", sampling=poisson(0.1, 100))
    assert ledger.report() == before
    # other labels are unaffected: the same Poisson entry against the server is add/remove as before
    ledger.debit(1, GaussianMechanism(noise_multiplier=1.0, sampling_rate=0.1), unit="client", observer="server",
                 sampling=poisson(0.1, 100))
    assert ledger.report()["clients"]["1"]["neighbouring"]["client/server"] == "add_remove"
