"""dp.audit.federated: canary clients through a mechanism's rounds; noise-free sums reach the largest bound
their canaries allow, noisy ones stay under their claim, and the result reads as the issue asks."""
import json
import math
import re

import numpy as np
import pytest

from dp.audit.federated import CanaryDesign, Cohorts, audit, run_trial
from dp.audit.mechanisms import make_mechanism

LINE = re.compile(r"^audit mechanism=(\w+) claimed_eps=(\S+) empirical_eps=(\S+) eps_lower_bound=(\S+) canaries=(\d+)$")


@pytest.mark.parametrize("kind", ["plaintext", "secagg"])
def test_noise_free_sums_reach_the_largest_bound_the_canaries_allow(kind):
    mech = make_mechanism(kind, dim=256, min_clients=2, expected_clients=8)
    result = audit(mech, design=CanaryDesign(trials=40, canaries_per_trial=1, inclusion=1.0, held_out_per_trial=100),
                   cohorts=Cohorts(background_clients=1), delta=1e-5)
    assert result.epsilon_lower_bound == pytest.approx(result.max_lower_bound) and result.max_lower_bound > 4
    assert result.claimed_epsilon == math.inf and not result.flagged
    assert result.empirical_epsilon == math.inf  # the fitted Gaussians do not overlap
    assert result.bound.true_positives == result.bound.n_in == 20 and result.bound.false_positives == 0


def test_many_orthogonal_canaries_in_one_secure_sum_also_separate_perfectly():
    mech = make_mechanism("secagg", dim=128, min_clients=2, expected_clients=80)
    result = audit(mech, design=CanaryDesign(trials=1, canaries_per_trial=128, inclusion=0.5, orthogonal=True, seed=3),
                   cohorts=Cohorts(background_clients=2), delta=1e-6)
    assert result.epsilon_lower_bound == pytest.approx(result.max_lower_bound)
    assert result.one_run_lower_bound > 1  # Steinke et al.'s bound on the same pool
    # its only wrong guesses are forced ones: k+ "in" guesses when fewer than k+ canaries went in
    assert result.one_run.guesses - result.one_run.correct <= abs(result.inserted - result.one_run.k_pos)


def test_a_correct_noisy_mechanism_stays_under_its_claim_with_every_statistic():
    mech = make_mechanism("ddp_skellam", dim=128, noise_multiplier=0.5, min_clients=2, expected_clients=4)
    result = audit(mech, design=CanaryDesign(trials=300, canaries_per_trial=1, inclusion=1.0, held_out_per_trial=200,
                                             canary_norm=4.0, seed=5),
                   cohorts=Cohorts(background_clients=3, sampling_rate=0.5, rounds=3), delta=0.1)
    assert set(result.fits) == {"final", "all_iterates"} and result.bound.statistic in result.fits
    # the bound is 0 in about 1 run in 200 (noise from the OS CSPRNG: measured 1 of 190, 2026-11-29); the
    # audit's power is what the seeded faults test (tests/dp/audit/test_faults.py)
    assert 0 <= result.epsilon_lower_bound < result.claimed_epsilon and not result.flagged
    assert result.skipped_rounds > 0  # Poisson cohorts below n_min = 2 released nothing
    assert result.claimed_epsilon == pytest.approx(mech.claimed_epsilon(rounds=3, delta=0.1))


def test_the_result_line_and_json():
    mech = make_mechanism("central", dim=64, noise_multiplier=1.0)
    result = audit(mech, design=CanaryDesign(trials=20, canaries_per_trial=2, held_out_per_trial=20, seed=1),
                   cohorts=Cohorts(background_clients=2), delta=1e-5)
    m = LINE.match(result.line(mechanism="central"))
    assert m and m.group(1) == "central" and int(m.group(5)) == result.canaries == 20 * 22
    assert float(m.group(4)) <= float(m.group(2))
    doc = json.loads(json.dumps(result.to_dict()))
    assert doc["flagged"] is False and doc["unit"] == "client" and "outsider" in doc["threat_model"]
    assert doc["bound"]["n_in"] + doc["bound"]["n_out"] <= result.canaries


def test_canaries_replace_background_clients_when_the_population_is_fixed():
    mech = make_mechanism("secagg", dim=32, min_clients=2, expected_clients=40)
    cohorts = Cohorts(population=10, sampling_rate=1.0)
    assert cohorts.background(3) == 7
    scores, inserted, pool, skipped = run_trial(mech, design=CanaryDesign(canaries_per_trial=4, inclusion=1.0),
                                                cohorts=cohorts, trial=0)
    assert inserted.sum() == 4 and pool.sum() == 4 and skipped == 0 and scores["final"].shape == (4,)
    with pytest.raises(ValueError, match="exceed the population of 2"):
        Cohorts(population=2).background(3)


def test_a_participation_cap_leaves_canaries_out_as_the_run_audited_does():
    mech = make_mechanism("secagg", dim=32, min_clients=2, expected_clients=40)
    design = CanaryDesign(canaries_per_trial=4, inclusion=1.0)
    capped = Cohorts(population=10, sampling_rate=1.0, rounds=3, max_participations=1)
    *_, skipped = run_trial(mech, design=design, cohorts=capped, trial=0)
    assert skipped == 2  # everyone took part in round 1, so rounds 2 and 3 had nobody left
    *_, skipped = run_trial(mech, design=design, cohorts=Cohorts(population=10, sampling_rate=1.0, rounds=3), trial=0)
    assert skipped == 0
    with pytest.raises(ValueError, match="max_participations"):
        Cohorts(max_participations=0)


def test_designs_refuse_what_cannot_be_audited():
    with pytest.raises(ValueError, match="inclusion must be in"):
        CanaryDesign(inclusion=0.0)
    with pytest.raises(ValueError, match="need trials >= 1"):
        CanaryDesign(trials=0)
    with pytest.raises(ValueError, match="sampling_rate must be in"):
        Cohorts(sampling_rate=1.5)
    mech = make_mechanism("secagg", dim=16, min_clients=2, expected_clients=8)
    with pytest.raises(ValueError, match="needs inserted and held-out canaries"):
        audit(mech, design=CanaryDesign(trials=2, canaries_per_trial=2, inclusion=1.0), cohorts=Cohorts(), delta=1e-5)
    with pytest.raises(ValueError, match="statistics are among"):
        audit(mech, design=CanaryDesign(), cohorts=Cohorts(), delta=1e-5, statistics=("median",))
    assert np.isfinite(make_mechanism("central", dim=8, noise_multiplier=1.0).claimed_epsilon(rounds=1, delta=1e-5))
