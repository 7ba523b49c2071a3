"""dp.leakage.calibration: a token attack calibrated on shadow views, never on the target's truth."""
import dataclasses

import numpy as np
import pytest

from dp.leakage.calibration import RowStats, TokenAttack, calibrate_token_attack, detect, row_stats
from dp.leakage.stats import advantage_over_chance
from dp.leakage.token_recovery import METHODS, mean_scores, recover_tokens, score_tokens


def _mean_advantage(attack, views):
    scores = mean_scores(attack.score(v, t) for v, t in views)
    return advantage_over_chance(scores.f1, scores.chance_f1)


def _clip_and_noise(pairs, *, clip, std, rng):
    out = []
    for vec, toks in pairs:
        norm = float(np.linalg.norm(vec))
        out.append((vec * min(1.0, clip / norm) + rng.normal(0.0, std, vec.size), toks))
    return out


def test_calibrated_on_shadow_clients_it_recovers_other_clients_tokens(ten_client_updates, shadow_client_updates,
                                                                         bag):
    updates, clients = ten_client_updates
    attack = calibrate_token_attack(shadow_client_updates, shape=bag.shape)
    assert attack.n_shadow == 12 and attack.shadow_score > 0.95
    target = [(updates[c], d.token_set) for c, d in clients.items()]
    assert _mean_advantage(attack, target) > 0.95


def test_under_strong_noise_the_calibrated_attack_is_at_chance(ten_client_updates, shadow_client_updates, bag):
    updates, clients = ten_client_updates
    rng = np.random.default_rng(0)
    # per-coordinate noise 0.5 against clipped updates of norm 0.5 spread over ~250 coordinates
    shadow = _clip_and_noise(shadow_client_updates, clip=0.5, std=0.5, rng=rng)
    target = _clip_and_noise([(updates[c], d.token_set) for c, d in clients.items()], clip=0.5, std=0.5, rng=rng)
    attack = calibrate_token_attack(shadow, shape=bag.shape)
    assert abs(_mean_advantage(attack, target)) < 0.05
    # the same clipped updates without noise still leak to the same kind of attacker
    clean_shadow = _clip_and_noise(shadow_client_updates, clip=0.5, std=0.0, rng=rng)
    clean = _clip_and_noise([(updates[c], d.token_set) for c, d in clients.items()], clip=0.5, std=0.0, rng=rng)
    assert _mean_advantage(calibrate_token_attack(clean_shadow, shape=bag.shape), clean) > 0.95


def _two_tailed_views(n_views, n_tokens, *, v=1000, d=4, seed):
    """Token rows large, 10% of the other rows frozen (tiny): two-sided tests flag both."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_views):
        rows = rng.normal(1.0, 0.05, size=(v, d))
        frozen = rng.choice(v, v // 10, replace=False)
        rows[frozen] *= 1e-3
        rest = np.setdiff1d(np.arange(v), frozen)
        toks = rng.choice(rest, n_tokens, replace=False)
        rows[toks] *= 100.0
        out.append((rows.ravel(), frozenset(toks.tolist())))
    return out


def test_k_comes_from_the_shadow_views_not_from_the_target():
    """The oracle's top-k is told the target's size; the calibrated one keeps the shadow's k."""
    shape = (1000, 4)
    shadow = _two_tailed_views(5, 20, seed=1)
    attack = calibrate_token_attack(shadow, shape=shape)
    assert (attack.method, attack.k) == ("top_k", 20)  # two-sided flags the frozen rows too
    assert attack.shadow_score == pytest.approx(1.0)
    target = _two_tailed_views(3, 50, seed=2)
    realistic = mean_scores(attack.score(v, t) for v, t in target)
    oracle = mean_scores(score_tokens(recover_tokens(v, shape=shape, method="top_k", k=len(t)), t) for v, t in target)
    assert realistic.precision == pytest.approx(1.0) and realistic.recall == pytest.approx(0.4)
    assert oracle.f1 == pytest.approx(1.0) and realistic.f1 < 0.6


def test_ties_go_to_scale_free_detectors(ten_client_updates, shadow_client_updates, bag):
    """Support with atol 0 is also perfect on untied SGD updates; an absolute threshold transfers
    worse (e.g. to least-squares estimates), so the tie goes to the two-sided test."""
    attack = calibrate_token_attack(shadow_client_updates, shape=bag.shape)
    assert attack.method == "two_sided"


def test_the_advantage_objective_does_not_reward_naming_every_token():
    rng = np.random.default_rng(3)
    v, d = 400, 4
    shadow = [(rng.normal(size=v * d), frozenset(rng.choice(v, v // 2, replace=False).tolist())) for _ in range(6)]
    by_f1 = calibrate_token_attack(shadow, shape=(v, d), objective="f1")
    assert by_f1.shadow_f1 > 0.6  # pure noise, yet F1 is high by naming (nearly) everything
    assert abs(_mean_advantage(by_f1, shadow)) < 0.1
    by_adv = calibrate_token_attack(shadow, shape=(v, d))
    assert by_adv.shadow_score < 0.15 and by_adv.objective == "advantage"


def test_shadow_score_is_the_attacks_own_score_on_the_shadow_views():
    shadow = _two_tailed_views(4, 30, seed=5)
    rng = np.random.default_rng(0)
    noisy = [(vec + rng.normal(0.0, 20.0, vec.size), t) for vec, t in shadow]
    attack = calibrate_token_attack(noisy, shape=(1000, 4))
    advs = [advantage_over_chance(s.f1, s.chance_f1) for s in (attack.score(v, t) for v, t in noisy)]
    assert attack.shadow_score == pytest.approx(float(np.mean(advs)))
    assert attack.shadow_f1 == pytest.approx(float(np.mean([attack.score(v, t).f1 for v, t in noisy])))
    assert attack.grid_size > 3 * 1000


@pytest.mark.parametrize("method, parameter", [("support", 0.0), ("two_sided", 3.0), ("top_k", 40),
                                               ("bottom_k", 40), ("extreme_k", 40)])
def test_row_statistics_give_the_same_sets_as_the_full_view(ten_client_updates, bag, method, parameter):
    updates, _ = ten_client_updates
    vec = updates[1] + np.random.default_rng(0).normal(0.0, 1e-4, updates[1].size)
    attack = TokenAttack(method=method, parameter=parameter, shadow_score=0.0, shape=bag.shape)
    assert attack.recover(row_stats(vec, shape=bag.shape)) == attack.recover(vec)
    assert detect(row_stats(vec, shape=bag.shape), method=method, parameter=parameter) == attack.recover(vec)


def test_degenerate_shadow_sets_raise_clear_errors():
    shape = (50, 2)
    toks = frozenset({1, 2, 3})
    with pytest.raises(ValueError, match="at least one shadow view"):
        calibrate_token_attack([], shape=shape)
    with pytest.raises(ValueError, match="constant"):
        calibrate_token_attack([(np.zeros(100), toks), (np.ones(100), toks)], shape=shape)
    view = np.random.default_rng(0).normal(size=100)
    with pytest.raises(ValueError, match="empty or the whole vocabulary"):
        calibrate_token_attack([(view, frozenset()), (view, frozenset())], shape=shape)
    with pytest.raises(ValueError, match="empty or the whole vocabulary"):
        calibrate_token_attack([(view, frozenset(range(50)))], shape=shape)
    with pytest.raises(ValueError, match="does not match"):
        calibrate_token_attack([(np.ones(99), toks)], shape=shape)
    with pytest.raises(ValueError, match="token ids"):
        calibrate_token_attack([(view, frozenset({50}))], shape=shape)
    with pytest.raises(ValueError, match="pair"):
        calibrate_token_attack([view], shape=shape)
    with pytest.raises(ValueError, match="objective"):
        calibrate_token_attack([(view, toks)], shape=shape, objective="accuracy")


def test_token_attack_is_frozen_and_validated():
    attack = TokenAttack(method="top_k", parameter=5, shadow_score=0.5, shape=(10, 2))
    assert attack.k == 5 and attack.to_dict()["k"] == 5
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'parameter'"):
        attack.parameter = 6
    k_range = r"k must be an integer in 1\.\.V"
    for bad, message in ((("top_k", 2.5), k_range), (("top_k", 0), k_range), (("top_k", 11), k_range),
                         (("two_sided", 0.0), "z must be positive"),
                         (("support", -1.0), "parameter must be finite and non-negative"),
                         (("magic", 1), "unknown method 'magic'")):
        with pytest.raises(ValueError, match=message):
            TokenAttack(method=bad[0], parameter=bad[1], shadow_score=0.0, shape=(10, 2))
    assert set(METHODS) >= {"support", "two_sided", "top_k", "bottom_k", "extreme_k"}
    with pytest.raises(TypeError, match="positional argument"):
        TokenAttack("top_k", 5, 0.5, (10, 2))  # keyword-only
    with pytest.raises(ValueError, match="rows"):
        attack.recover(RowStats(norms=np.ones(9), rowmax=np.ones(9)))
