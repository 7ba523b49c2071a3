import numpy as np
import pytest
import torch
from torch import nn

from dp.leakage.membership import (calibrated_loss_attack, loss_threshold_attack, losses_by_group,
                                   per_example_losses, score_attack, tpr_at_fpr, zlib_ratio_scores)

D, K, N = 16, 10, 120


def _random_task(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(N, D, generator=g), torch.randint(0, K, (N,), generator=g)


def _fit(x: torch.Tensor, y: torch.Tensor, *, steps: int = 150) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(D, 64), nn.ReLU(), nn.Linear(64, K))
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model


@pytest.fixture(scope="module")
def random_label_tasks():
    g = torch.Generator().manual_seed(0)
    return _random_task(g), _random_task(g), _random_task(g)


def test_overfit_model_leaks_membership(random_label_tasks):
    (xm, ym), (xn, yn), _ = random_label_tasks
    model = _fit(xm, ym)  # memorises random labels
    s = loss_threshold_attack(per_example_losses(model, xm, ym), per_example_losses(model, xn, yn))
    assert s.auc > 0.9
    assert s.balanced_accuracy > 0.85
    assert s.n_members == s.n_nonmembers == N


def test_model_that_never_saw_the_members_leaks_nothing(random_label_tasks):
    _, _, (xo, yo) = random_label_tasks
    model = _fit(xo, yo)
    g = torch.Generator().manual_seed(1)
    # "members" the model never saw, and non-members: many of each so the AUC's spread is ~0.013
    xm, ym = torch.randn(1000, D, generator=g), torch.randint(0, K, (1000,), generator=g)
    xn, yn = torch.randn(1000, D, generator=g), torch.randint(0, K, (1000,), generator=g)
    s = loss_threshold_attack(per_example_losses(model, xm, ym), per_example_losses(model, xn, yn))
    assert abs(s.auc - 0.5) < 0.06
    assert s.tpr_at_1pct_fpr < 0.05


def test_metrics_on_known_score_distributions():
    perfect = score_attack([5.0, 6.0, 7.0], [1.0, 2.0])
    assert perfect.auc == 1.0 and perfect.tpr_at_1pct_fpr == 1.0 and perfect.balanced_accuracy == 1.0
    inverted = score_attack([1.0, 2.0], [5.0, 6.0])
    assert inverted.auc == 0.0 and inverted.tpr_at_1pct_fpr == 0.0 and inverted.balanced_accuracy == 0.5
    rng = np.random.default_rng(0)
    same = score_attack(rng.normal(size=5000), rng.normal(size=5000))
    assert abs(same.auc - 0.5) < 0.02
    assert same.tpr_at_1pct_fpr < 0.03 and same.tpr_at_01pct_fpr < 0.01
    shifted = score_attack(rng.normal(2.0, 1.0, size=20000), rng.normal(size=20000))
    # Gaussian shift 2: TPR at FPR=1% is Phi(2 - 2.326) = 0.372
    assert shifted.tpr_at_1pct_fpr == pytest.approx(0.372, abs=0.02)
    assert shifted.auc == pytest.approx(0.921, abs=0.01)  # Phi(2 / sqrt 2)


def test_loss_attack_treats_low_loss_as_member():
    s = loss_threshold_attack([0.01, 0.02], [2.0, 3.0])
    assert s.auc == 1.0


def test_tpr_at_fpr_reads_the_curve():
    fpr = np.array([0.0, 0.0, 0.005, 0.02, 1.0])
    tpr = np.array([0.0, 0.3, 0.4, 0.9, 1.0])
    assert tpr_at_fpr(fpr, tpr, 0.01) == 0.4
    assert tpr_at_fpr(fpr, tpr, 0.001) == 0.3


def test_zlib_ratio_scores_discount_compressible_text():
    texts = ["a" * 200, "the quick brown fox jumps over the lazy dog, 7 times!"]
    scores = zlib_ratio_scores([1.0, 1.0], texts)
    assert scores[0] < scores[1]  # equal loss: the repetitive text is less surprising, so less member-like
    with pytest.raises(ValueError, match="one text per loss"):
        zlib_ratio_scores([1.0], texts)


def test_validation_and_grouping():
    with pytest.raises(ValueError, match="NaN"):
        loss_threshold_attack([np.nan], [1.0])
    with pytest.raises(ValueError, match="no"):
        score_attack([], [1.0])
    m, n = losses_by_group([0.1, 0.2, 0.3], [True, False, True])
    assert m.tolist() == [0.1, 0.3] and n.tolist() == [0.2]


def test_calibrated_loss_attack_picks_its_threshold_from_reference_data_only():
    rng = np.random.default_rng(0)
    members, nonmembers, reference = rng.exponential(0.3, 4000), rng.exponential(1.0, 4000), rng.exponential(1.0, 4000)
    out = calibrated_loss_attack(members, nonmembers, reference_losses=reference, target_fpr=0.05)
    assert out["fpr"] == pytest.approx(0.05, abs=0.015)  # reference ~ non-members: the FPR is what was aimed at
    # exponential losses: P[member loss < t] with t the 5% quantile of Exp(1)
    t = -np.log(0.95)
    assert out["threshold"] == pytest.approx(t, rel=0.15)
    assert out["tpr"] == pytest.approx(1 - np.exp(-t / 0.3), abs=0.03)
    assert out["advantage"] == pytest.approx(out["tpr"] - out["fpr"])
    assert out["advantage"] <= out["oracle_advantage"] + 1e-12 and out["oracle_advantage"] > 0.3
    # the same members and non-members: the advantage does not depend on which is which beyond the threshold
    swapped = calibrated_loss_attack(nonmembers, nonmembers, reference_losses=reference)
    assert abs(swapped["advantage"]) < 1e-12 and swapped["oracle_advantage"] < 0.1
    # a reference from another distribution moves the threshold: the attacker's real difficulty
    shifted = calibrated_loss_attack(members, nonmembers, reference_losses=reference * 10)
    assert shifted["fpr"] > 0.3
    for bad in (dict(target_fpr=0.0), dict(target_fpr=1.0)):
        with pytest.raises(ValueError, match=r"target_fpr must be in \(0, 1\)"):
            calibrated_loss_attack(members, nonmembers, reference_losses=reference, **bad)
    with pytest.raises(ValueError, match="no reference losses"):
        calibrated_loss_attack(members, nonmembers, reference_losses=[])
