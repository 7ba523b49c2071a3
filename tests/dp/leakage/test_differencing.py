"""dp.leakage.differencing: client contributions estimated from released cohort sums, then attacked."""
import numpy as np
import pytest

from dp.leakage import differencing as diff_mod
from dp.leakage.calibration import TokenAttack, calibrate_token_attack, row_stats
from dp.leakage.differencing import (differencing_attack, estimate_contributions, fit_contributions, random_cohorts,
                                     simulate_differencing_shadow)
from dp.leakage.transcript import Transcript

V, D = 2000, 4
N, COHORT, ROUNDS, TOKENS = 30, 8, 90, 25


def sparse_clients(n, *, seed):
    """n fixed sparse contributions: TOKENS random rows of N(0, 1) entries, the rest zero."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        toks = np.sort(rng.choice(V, TOKENS, replace=False))
        x = np.zeros((V, D))
        x[toks] = rng.normal(size=(TOKENS, D))
        out.append((x.ravel(), frozenset(toks.tolist())))
    return out


def secure_transcript(vectors, cohorts, *, noise_std, rng):
    """What a secure-sum server records: per round the cohort's (noisy) mean and its contributors."""
    tr = Transcript(protocol="secagg+")
    for t, cohort in enumerate(cohorts):
        total = sum(vectors[c] for c in cohort) + rng.normal(0.0, noise_std, V * D)
        tr.record_aggregate(t, "emb", total / len(cohort), contributors=cohort, total_weight=float(len(cohort)))
    return tr


def run(noise_std, *, seed=0, cohorts=None, shadow_cohorts=None):
    rng = np.random.default_rng(seed)
    shadow = sparse_clients(N, seed=seed + 100)
    shadow_est = simulate_differencing_shadow(
        shadow, cohorts=shadow_cohorts or random_cohorts(range(N), size=COHORT, rounds=ROUNDS, rng=rng),
        shape=(V, D), noise_std=noise_std, rng=rng)
    attack = calibrate_token_attack(shadow_est, shape=(V, D))
    real = sparse_clients(N, seed=seed + 200)
    vectors = {c + 1: real[c][0] for c in range(N)}
    cohorts = cohorts or random_cohorts(sorted(vectors), size=COHORT, rounds=ROUNDS, rng=rng)
    tr = secure_transcript(vectors, cohorts, noise_std=noise_std, rng=rng)
    return differencing_attack(tr, part="emb", truth={c + 1: real[c][1] for c in range(N)}, shape=(V, D),
                               attack=attack, true_updates=vectors)


def test_exact_sums_of_stable_vectors_reveal_every_clients_tokens():
    res = run(0.0)
    assert res.targets == N and res.releases == ROUNDS and res.rank == N and res.identifiable == N
    assert res.advantage > 0.95 and res.f1 > 0.95
    assert res.mean_cosine == pytest.approx(1.0, abs=1e-6)


def test_noise_much_larger_than_the_signal_brings_the_attack_to_chance():
    res = run(50.0)  # signal entries ~ N(0, 1) on 25 of 2000 rows; noise std 50 on every coordinate of a sum
    assert abs(res.advantage) < 0.05
    assert abs(res.mean_cosine) < 0.1
    assert res.identifiable == N  # identifiable in principle: it is the noise that protects


def test_moderate_noise_leaks_less_than_none():
    exact, mid, huge = run(0.0).advantage, run(3.0).advantage, run(50.0).advantage
    assert exact > mid + 0.1 and mid > huge + 0.1


def test_fixed_disjoint_groups_are_not_separated_even_without_noise():
    groups = [tuple(range(1 + 5 * g, 6 + 5 * g)) for g in range(N // 5)]
    shadow_groups = [tuple(c - 1 for c in g) for g in groups]
    res = run(0.0, cohorts=[groups[t % len(groups)] for t in range(ROUNDS)],
              shadow_cohorts=[shadow_groups[t % len(groups)] for t in range(ROUNDS)])
    assert res.identifiable == 0 and res.rank == N // 5
    assert res.precision < 0.3  # the estimate is the group average: a fifth of what it names is the target's
    assert res.advantage < 0.45


def test_two_sums_differ_by_one_client_and_reveal_it():
    rng = np.random.default_rng(0)
    x = {c: rng.normal(size=6) for c in range(1, 6)}
    a, b = [1, 2, 3, 4], [1, 2, 3, 4, 5]
    sums = np.stack([sum(x[c] for c in a), sum(x[c] for c in b)])
    est = estimate_contributions([a, b], sums, ridge=0.0)
    np.testing.assert_allclose(est[5], x[5], atol=1e-10)
    assert fit_contributions([a, b]).identifiable() == {5}
    np.testing.assert_allclose(estimate_contributions([a, b], sums, ridge=1e-6)[5], x[5], atol=1e-4)


def test_streaming_matches_the_dense_estimate(monkeypatch):
    """Tiny chunks and batches (as for 30522 x 16 with 200 clients) give the dense answer."""
    rng = np.random.default_rng(1)
    vectors = {c + 1: v for c, (v, _) in enumerate(sparse_clients(12, seed=5))}
    cohorts = random_cohorts(sorted(vectors), size=4, rounds=30, rng=rng)
    tr = secure_transcript(vectors, cohorts, noise_std=0.1, rng=rng)
    recs = tr.aggregates("emb")
    dense = estimate_contributions([r.contributors for r in recs], np.stack([r.weighted_sum for r in recs]))
    monkeypatch.setattr(diff_mod, "_CHUNK_VALUES", 900)  # 7 rows per chunk: not a divisor of V
    est = fit_contributions([r.contributors for r in recs])
    sums = diff_mod._ArraySums([(r.mean, r.total_weight) for r in recs])
    streamed = list(diff_mod._stream(est, sums, targets=[3, 1, 7, 12, 5], shape=(V, D), true_vectors=vectors, batch=2))
    assert [c for c, _, _ in streamed] == [3, 1, 7, 12, 5]
    for c, stats, cos in streamed:
        ref = row_stats(dense[c], shape=(V, D))
        np.testing.assert_allclose(stats.norms, ref.norms, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(stats.rowmax, ref.rowmax, rtol=1e-9, atol=1e-12)
        expect = dense[c] @ vectors[c] / (np.linalg.norm(dense[c]) * np.linalg.norm(vectors[c]))
        assert cos == pytest.approx(expect, rel=1e-9)


def test_real_bag_updates_stable_across_rounds(ten_client_updates, shadow_client_updates, bag):
    """The tiny classifier's embedding updates (same base model every round, so stable)."""
    updates, clients = ten_client_updates
    rng = np.random.default_rng(2)
    shadow = simulate_differencing_shadow(
        shadow_client_updates, cohorts=random_cohorts(range(12), size=4, rounds=30, rng=rng), shape=bag.shape,
        rng=rng)
    attack = calibrate_token_attack(shadow, shape=bag.shape)
    tr = Transcript(protocol="secagg+")
    for t, cohort in enumerate(random_cohorts(sorted(updates), size=4, rounds=30, rng=rng)):
        tr.record_aggregate(t, "emb", sum(updates[c] for c in cohort) / 4, contributors=cohort, total_weight=4.0)
    res = differencing_attack(tr, part="emb", truth={c: d.token_set for c, d in clients.items()}, shape=bag.shape,
                              attack=attack)
    assert res.targets == 10 and res.identifiable == 10 and res.mean_cosine is None
    assert res.advantage > 0.9


def test_simulated_shadow_is_reproducible_and_validated():
    shadow = sparse_clients(6, seed=0)
    cohorts = [(0, 1, 2), (1, 2, 3), (2, 3, 4), (0, 4), (3,)]
    a = simulate_differencing_shadow(shadow, cohorts=cohorts, shape=(V, D), noise_std=1.0,
                                     rng=np.random.default_rng(4))
    b = simulate_differencing_shadow(shadow, cohorts=cohorts, shape=(V, D), noise_std=1.0,
                                     rng=np.random.default_rng(4))
    assert len(a) == 5  # client 5 never took part
    assert [t for _, t in a] == [shadow[i][1] for i in range(5)]
    for (sa, _), (sb, _) in zip(a, b):
        np.testing.assert_array_equal(sa.norms, sb.norms)
    with pytest.raises(ValueError, match="index into updates"):
        simulate_differencing_shadow(shadow, cohorts=[(0, 9)], shape=(V, D), rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="noise_std"):
        simulate_differencing_shadow(shadow, cohorts=cohorts, shape=(V, D), noise_std=-1.0,
                                     rng=np.random.default_rng(0))


def test_input_validation():
    attack = TokenAttack(method="two_sided", parameter=3.0, shadow_score=0.0, shape=(V, D))
    empty = Transcript(protocol="secagg+")
    with pytest.raises(ValueError, match="no aggregates"):
        differencing_attack(empty, part="emb", truth={1: frozenset()}, shape=(V, D), attack=attack)
    tr = Transcript(protocol="secagg+", parts={"emb": (0, 40 * D)})
    tr.record_aggregate(0, "emb", np.ones(V * D), contributors=[1, 2], total_weight=2.0)
    with pytest.raises(ValueError, match="whole"):
        differencing_attack(tr, part="emb", truth={1: frozenset()}, shape=(V, D), attack=attack)
    full = secure_transcript({1: np.ones(V * D), 2: np.ones(V * D)}, [(1, 2)], noise_std=0.0,
                             rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="no client with a known token set"):
        differencing_attack(full, part="emb", truth={9: frozenset({1})}, shape=(V, D), attack=attack)
    with pytest.raises(ValueError, match="calibrated for shape"):
        differencing_attack(full, part="emb", truth={1: frozenset({1})}, shape=(V, D),
                            attack=TokenAttack(method="two_sided", parameter=3.0, shadow_score=0.0, shape=(V, 2 * D)))
    with pytest.raises(ValueError, match="ridge"):
        fit_contributions([(1, 2)], ridge=-1.0)
    with pytest.raises(ValueError, match=r"need 1 <= size <= len\(clients\)"):
        random_cohorts([1, 2, 3], size=4, rounds=1, rng=np.random.default_rng(0))
    cohorts = random_cohorts(range(10), size=3, rounds=5, rng=np.random.default_rng(7))
    assert cohorts == random_cohorts(range(10), size=3, rounds=5, rng=np.random.default_rng(7))
    assert all(len(set(c)) == 3 for c in cohorts)
