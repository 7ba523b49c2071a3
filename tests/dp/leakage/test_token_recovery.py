import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dp.leakage.token_recovery import (chance_f1, gaussian_sum, mean_scores, recover_from_transcript, recover_tokens,
                                       score_tokens)
from dp.leakage.transcript import Transcript


@pytest.mark.parametrize("method", ["support", "two_sided", "top_k", "extreme_k"])
def test_individual_plaintext_updates_reveal_each_clients_tokens(ten_client_updates, bag, method):
    updates, clients = ten_client_updates
    scores = [score_tokens(recover_tokens(updates[c], shape=bag.shape, method=method, k=len(d.token_set)),
                           d.token_set, vocab_size=bag.vocab) for c, d in clients.items()]
    avg = mean_scores(scores)
    assert avg.f1 >= 0.95
    assert avg.chance_f1 < 0.05


def test_support_is_exact_for_untied_sgd(ten_client_updates, bag):
    updates, clients = ten_client_updates
    for c, d in clients.items():
        assert recover_tokens(updates[c], shape=bag.shape, method="support") == d.token_set


@pytest.mark.parametrize("method", ["support", "two_sided", "top_k"])
def test_secure_sum_reveals_the_cohort_union(ten_client_updates, bag, method):
    updates, clients = ten_client_updates
    union = frozenset().union(*(d.token_set for d in clients.values()))
    total = sum(updates.values())
    s = score_tokens(recover_tokens(total, shape=bag.shape, method=method, k=len(union)), union,
                     vocab_size=bag.vocab)
    assert s.f1 >= 0.95
    # the mean (what the secure layer decodes) reveals the same rows as the sum
    assert recover_tokens(total / 10, shape=bag.shape, method=method, k=len(union)) == \
        recover_tokens(total, shape=bag.shape, method=method, k=len(union))


def test_strong_gaussian_noise_brings_f1_to_chance(ten_client_updates, bag):
    updates, clients = ten_client_updates
    union = frozenset().union(*(d.token_set for d in clients.values()))
    noisy = gaussian_sum(updates.values(), clip=0.5, noise_multiplier=2.0, rng=np.random.default_rng(0))
    top = score_tokens(recover_tokens(noisy, shape=bag.shape, method="top_k", k=len(union)), union,
                       vocab_size=bag.vocab)
    assert abs(top.f1 - top.chance_f1) < 0.08
    two = score_tokens(recover_tokens(noisy, shape=bag.shape, method="two_sided"), union, vocab_size=bag.vocab)
    assert two.f1 < top.chance_f1 + 0.08
    # and without noise the same clipped sum still leaks
    clean = gaussian_sum(updates.values(), clip=0.5, noise_multiplier=0.0, rng=np.random.default_rng(0))
    assert score_tokens(recover_tokens(clean, shape=bag.shape, method="top_k", k=len(union)), union).f1 >= 0.95


def test_two_sided_test_finds_anomalously_small_rows():
    """Tied embeddings + Adam: every row moves and the used rows move *less* (research note 4.2)."""
    rng = np.random.default_rng(0)
    v, d = 1000, 16
    rows = rng.normal(size=(v, d)) * 1e-3
    used = rng.choice(v, 40, replace=False)
    rows[used] *= 0.01
    truth = set(used.tolist())
    assert score_tokens(recover_tokens(rows, shape=(v, d), method="two_sided"), truth).f1 >= 0.95
    assert score_tokens(recover_tokens(rows, shape=(v, d), method="bottom_k", k=40), truth).f1 == 1.0
    assert score_tokens(recover_tokens(rows, shape=(v, d), method="extreme_k", k=40), truth).f1 == 1.0
    assert score_tokens(recover_tokens(rows, shape=(v, d), method="top_k", k=40), truth).f1 < 0.1
    assert score_tokens(recover_tokens(rows, shape=(v, d), method="support"), truth).precision < 0.05


def test_two_sided_flags_nothing_on_pure_noise():
    rows = np.random.default_rng(1).normal(size=(3000, 32))
    assert len(recover_tokens(rows, shape=rows.shape, method="two_sided", z=4.0)) <= 3


def test_recover_from_transcript_maps_a_row_range_back_to_token_ids(ten_client_updates, bag):
    updates, clients = ten_client_updates
    lo, hi = 500 * bag.dim, 1500 * bag.dim  # only rows 500..1499 are recorded
    tr = Transcript(protocol="plain", parts={"emb": (lo, hi)})
    for c, u in updates.items():
        tr.record_individual(1, c, "emb", u)
    tr.record_aggregate(2, "emb", sum(updates.values()) / 10, contributors=clients, total_weight=10.0)
    sums, individual = recover_from_transcript(tr, part="emb", shape=bag.shape, method="support")
    window = set(range(500, 1500))
    for c, d in clients.items():
        assert individual[1][c] == d.token_set & window
    assert sums[2] == frozenset().union(*(d.token_set for d in clients.values())) & window


def test_recover_from_transcript_rejects_ranges_that_split_rows(bag):
    tr = Transcript(protocol="plain", parts={"emb": (3, 3 + 4 * bag.dim)})
    tr.record_individual(1, 1, "emb", np.zeros(bag.vocab * bag.dim))
    with pytest.raises(ValueError, match="whole embedding rows"):
        recover_from_transcript(tr, part="emb", shape=bag.shape, method="support")


def test_input_validation():
    with pytest.raises(ValueError, match="does not match"):
        recover_tokens(np.zeros(10), shape=(3, 3))
    with pytest.raises(ValueError, match="NaN"):
        recover_tokens(np.full(9, np.nan), shape=(3, 3))
    with pytest.raises(ValueError, match="needs"):
        recover_tokens(np.zeros(9), shape=(3, 3), method="top_k")
    with pytest.raises(ValueError, match="unknown method"):
        recover_tokens(np.zeros(9), shape=(3, 3), method="magic")
    assert recover_tokens(np.zeros(9), shape=(3, 3), method="two_sided") == frozenset()


@given(st.sets(st.integers(0, 50), max_size=20), st.sets(st.integers(0, 50), max_size=20))
def test_score_tokens_properties(recovered, true):
    s = score_tokens(recovered, true, vocab_size=51)
    assert 0.0 <= s.precision <= 1.0 and 0.0 <= s.recall <= 1.0 and 0.0 <= s.f1 <= 1.0
    assert (s.f1 == 1.0) == (recovered == true)
    assert s.f1 == pytest.approx(2 * len(recovered & true) / (len(recovered) + len(true)) if recovered | true else 1.0)


def test_chance_f1_matches_random_guessing():
    rng = np.random.default_rng(0)
    v, truth = 500, set(range(60))
    f1s = [score_tokens(rng.choice(v, 60, replace=False).tolist(), truth).f1 for _ in range(400)]
    assert np.mean(f1s) == pytest.approx(chance_f1(n_true=60, n_guessed=60, vocab_size=v), rel=0.1)
