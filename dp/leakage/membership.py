"""Membership inference on a final model: the LOSS threshold attack (Yeom et al., CSF 2018).

The attacker predicts "member" when an example's loss is below a threshold. Reported as in the
LiRA paper (Carlini et al., S&P 2022): ROC AUC, TPR at FPR = 1% and 0.1% (the low-FPR regime
that matters for privacy), and the balanced accuracy at the best threshold as a secondary number.
A TPR at FPR = f needs about 1/f non-members to mean anything: with fewer, the 0.1% figure is the
TPR at zero false positives. `zlib_ratio_scores` gives Carlini et al.'s (USENIX Sec 2021) text
calibration; shadow-model attacks (LiRA, RMIA) are not implemented here (expensive; opt-in later).
"""
from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sklearn.metrics import roc_auc_score, roc_curve


@dataclass(frozen=True)
class MembershipScores:
    auc: float
    tpr_at_1pct_fpr: float
    tpr_at_01pct_fpr: float
    balanced_accuracy: float
    """max over thresholds of (TPR + TNR) / 2."""
    n_members: int
    n_nonmembers: int


def _finite(values: Any, name: str) -> np.ndarray:
    a = np.asarray(values, dtype=np.float64).ravel()
    if a.size == 0:
        raise ValueError(f"no {name}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} contain NaN or infinity")
    return a


def tpr_at_fpr(fpr: np.ndarray, tpr: np.ndarray, target: float) -> float:
    """Largest TPR on the ROC curve with FPR <= target."""
    ok = fpr <= target + 1e-12
    return float(tpr[ok].max()) if ok.any() else 0.0


def score_attack(member_scores: Any, nonmember_scores: Any) -> MembershipScores:
    """Metrics of any attack whose score is higher for members."""
    m = _finite(member_scores, "member scores")
    n = _finite(nonmember_scores, "non-member scores")
    y = np.concatenate([np.ones(m.size), np.zeros(n.size)])
    s = np.concatenate([m, n])
    fpr, tpr, _ = roc_curve(y, s)
    return MembershipScores(
        auc=float(roc_auc_score(y, s)),
        tpr_at_1pct_fpr=tpr_at_fpr(fpr, tpr, 0.01),
        tpr_at_01pct_fpr=tpr_at_fpr(fpr, tpr, 0.001),
        balanced_accuracy=float(np.max((tpr + 1.0 - fpr) / 2.0)),
        n_members=int(m.size), n_nonmembers=int(n.size))


def loss_threshold_attack(member_losses: Any, nonmember_losses: Any) -> MembershipScores:
    """LOSS attack: score = -loss (members were fitted, so their loss is lower)."""
    return score_attack(-_finite(member_losses, "member losses"), -_finite(nonmember_losses, "non-member losses"))


def calibrated_loss_attack(member_losses: Any, nonmember_losses: Any, *, reference_losses: Any,
                           target_fpr: float = 0.05) -> dict[str, float]:
    """The LOSS attack as an adversary runs it: the threshold is the `target_fpr` quantile of losses on
    REFERENCE examples the attacker knows were never trained on (a public split), chosen without the
    test's ground truth; "member" when the loss is below it. Returns its TPR and FPR on the real
    members and non-members, its advantage TPR - FPR (Yeom et al.'s membership advantage; chance 0),
    and `oracle_advantage`, the best TPR - FPR over all thresholds (chosen with the ground truth: an
    upper bound). A reference split from another distribution than the clients' moves the threshold:
    that is the attacker's real difficulty, not corrected here."""
    if not 0 < target_fpr < 1:
        raise ValueError("target_fpr must be in (0, 1)")
    m = _finite(member_losses, "member losses")
    n = _finite(nonmember_losses, "non-member losses")
    threshold = float(np.quantile(_finite(reference_losses, "reference losses"), target_fpr))
    tpr, fpr = float(np.mean(m < threshold)), float(np.mean(n < threshold))
    y = np.concatenate([np.ones(m.size), np.zeros(n.size)])
    roc_fpr, roc_tpr, _ = roc_curve(y, -np.concatenate([m, n]))
    return {"threshold": threshold, "target_fpr": target_fpr, "tpr": tpr, "fpr": fpr, "advantage": tpr - fpr,
            "oracle_advantage": float(np.max(roc_tpr - roc_fpr))}


def zlib_ratio_scores(losses: Any, texts: Sequence[str]) -> np.ndarray:
    """Membership score -loss / zlib_bits(text): discounts texts that are easy for any model."""
    loss = _finite(losses, "losses")
    if loss.size != len(texts):
        raise ValueError("one text per loss")
    bits = np.array([8.0 * len(zlib.compress(t.encode("utf-8"))) for t in texts])
    return -loss / bits


def per_example_losses(model: Any, inputs: Any, labels: Any, *, batch_size: int = 256) -> np.ndarray:
    """Cross-entropy of each example under `model` (eval mode, no gradients); torch tensors in."""
    import torch
    import torch.nn.functional as F

    was_training = model.training
    model.eval()
    out: list[np.ndarray] = []
    try:
        with torch.no_grad():
            for lo in range(0, len(labels), batch_size):
                logits = model(inputs[lo: lo + batch_size])
                out.append(F.cross_entropy(logits, labels[lo: lo + batch_size], reduction="none").double().numpy())
    finally:
        model.train(was_training)
    return np.concatenate(out) if out else np.zeros(0)


def losses_by_group(losses: Iterable[float], is_member: Iterable[bool]) -> tuple[np.ndarray, np.ndarray]:
    """Split one loss array by a membership mask (convenience for audits with canaries)."""
    loss = np.asarray(list(losses), dtype=np.float64)
    mask = np.asarray(list(is_member), dtype=bool)
    if loss.shape != mask.shape:
        raise ValueError("one membership flag per loss")
    return loss[mask], loss[~mask]


__all__ = ["MembershipScores", "score_attack", "loss_threshold_attack", "calibrated_loss_attack", "tpr_at_fpr",
           "zlib_ratio_scores",
           "per_example_losses", "losses_by_group"]
