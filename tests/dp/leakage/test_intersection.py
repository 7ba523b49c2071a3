import numpy as np
import pytest

from dp.leakage.intersection import attribute_tokens, score_attribution
from dp.leakage.token_recovery import recover_tokens


def _owners(n: int, *, private: int = 5, common_pool: int = 200, common: int = 20, seed: int = 0) -> dict[int, set[int]]:
    """Client -> token set: `common` tokens from a shared pool plus `private` tokens of its own."""
    rng = np.random.default_rng(seed)
    return {c: set(rng.choice(common_pool, common, replace=False).tolist())
            | set(range(common_pool + (c - 1) * private, common_pool + c * private)) for c in range(1, n + 1)}


def _unions(owners, cohorts):
    return {t: set().union(*(owners[c] for c in members)) for t, members in cohorts.items()}


def _random_cohorts(n: int, k: int, rounds: int, seed: int = 1) -> dict[int, list[int]]:
    rng = np.random.default_rng(seed)
    return {t: sorted(rng.choice(np.arange(1, n + 1), k, replace=False).tolist()) for t in range(1, rounds + 1)}


def test_random_cohorts_attribute_private_tokens_after_enough_rounds():
    owners = _owners(50)
    cohorts = _random_cohorts(50, 10, 30)
    rates = []
    for rounds in (3, 10, 30):
        sub = {t: cohorts[t] for t in range(1, rounds + 1)}
        s = score_attribution(attribute_tokens(_unions(owners, sub), sub, clients=owners), owners)
        rates.append(s.rate)
    assert rates[0] < 0.1
    assert rates[0] < rates[1] < rates[2]
    assert rates[2] >= 0.9
    # every private token attributed after 30 rounds went to its owner (precision counts all tokens)
    final = score_attribution(attribute_tokens(_unions(owners, cohorts), cohorts, clients=owners), owners)
    assert final.wrong == 0 and final.precision == 1.0


def test_fixed_disjoint_groups_attribute_nothing():
    owners = _owners(50)
    cohorts = {t: list(range(1 + 10 * (t % 5), 11 + 10 * (t % 5))) for t in range(1, 61)}
    att = attribute_tokens(_unions(owners, cohorts), cohorts, clients=owners)
    s = score_attribution(att, owners)
    assert s.attributed == 0 and s.rate == 0.0
    # each private token is narrowed to its group of 10, no further
    assert all(len(c) == 10 for x, c in att.candidates.items() if x >= 200)


def test_two_rounds_that_differ_by_one_client_pin_its_tokens():
    owners = {1: {1, 2}, 2: {2, 3}, 3: {4, 9}}
    cohorts = {1: [1, 2], 2: [1, 2, 3]}
    att = attribute_tokens(_unions(owners, cohorts), cohorts)
    assert att.tokens_of(3) == {4, 9}
    assert att.tokens_of(1) == set() and att.tokens_of(2) == set()


def test_tolerances_absorb_a_missed_detection():
    owners = _owners(20, seed=3)
    cohorts = _random_cohorts(20, 5, 40, seed=4)
    seen = _unions(owners, cohorts)
    target = 200  # client 1's first private token
    first_round = min(t for t, m in cohorts.items() if 1 in m)
    seen[first_round].discard(target)  # the detector missed it once
    strict = attribute_tokens(seen, cohorts)
    assert target not in strict.owner
    tolerant = attribute_tokens(seen, cohorts, max_misses=1)
    assert tolerant.owner.get(target) == 1


def test_restricting_to_canary_tokens():
    owners = _owners(30)
    cohorts = _random_cohorts(30, 6, 40)
    canaries = {200, 205, 210}
    att = attribute_tokens(_unions(owners, cohorts), cohorts, tokens=canaries)
    assert set(att.candidates) == canaries
    assert att.owner == {200: 1, 205: 2, 210: 3}


def test_attack_on_tokens_recovered_from_real_secure_sums(bag):
    """End to end: per-round sums of real SGD embedding updates, support detector, attribution."""
    base = bag.initial_model()
    clients = bag.make_clients(20, seed=5, docs=2, length=6, private=3)
    updates = {c: bag.embedding_update(base, d, steps=1) for c, d in clients.items()}  # fixed local data
    cohorts = _random_cohorts(20, 5, 30, seed=6)
    recovered = {t: recover_tokens(sum(updates[c] for c in m), shape=bag.shape, method="support")
                 for t, m in cohorts.items()}
    owners = {c: d.token_set for c, d in clients.items()}
    s = score_attribution(attribute_tokens(recovered, cohorts, clients=owners), owners)
    assert s.private_tokens >= 60
    assert s.rate >= 0.8 and s.precision >= 0.95


def test_empty_inputs_and_validation():
    assert attribute_tokens({}, {}).owner == {}
    assert attribute_tokens({1: set()}, {1: [1, 2]}).owner == {}
    with pytest.raises(ValueError, match="tolerances must be >= 0"):
        attribute_tokens({1: {1}}, {1: [1]}, max_misses=-1)
