"""`LeakageReport`: the measured-leakage numbers of one run, next to the accountant's epsilon.

Every field is optional (None = not measured), so a run reports what it could afford. Numbers
come from the attacks in this package run on the server's actual view (`Transcript`), never on
data the server did not receive.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from dp.leakage.intersection import AttributionScores
from dp.leakage.membership import MembershipScores
from dp.leakage.recoverability import Recoverability
from dp.leakage.token_recovery import TokenScores


@dataclass(frozen=True)
class LeakageReport:
    server_view: str = "secure"
    """'secure' (aggregates only) or 'plain' (individual uploads: the no-SecAgg ablation)."""
    token_precision: float | None = None
    token_recall: float | None = None
    token_f1: float | None = None
    token_chance_f1: float | None = None
    intersection_attribution_rate: float | None = None
    """Fraction of client-unique tokens the cross-round intersection attack pins to their owner."""
    mia_auc: float | None = None
    mia_tpr_at_1pct_fpr: float | None = None
    mia_tpr_at_01pct_fpr: float | None = None
    recoverable_clients: int | None = None
    recoverable_fraction: float | None = None
    epsilon: float | None = None
    """The ledger's epsilon for the run (the accountant's upper bound), or None without DP."""
    realistic_advantage: float | None = None
    """Headline token leakage: max advantage over chance of the attacks an adversary can run (token
    recovery calibrated on shadow views; the differencing attack on aggregates). 0 = guessing."""
    oracle_advantage: float | None = None
    """Best-of-detectors advantage chosen with the ground truth, top-k told the true k: an upper bound."""

    def __post_init__(self) -> None:
        for name in ("token_precision", "token_recall", "token_f1", "token_chance_f1",
                     "intersection_attribution_rate", "mia_auc", "mia_tpr_at_1pct_fpr", "mia_tpr_at_01pct_fpr",
                     "recoverable_fraction"):
            v = getattr(self, name)
            if v is not None and not 0.0 <= v <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {v}")
        for name in ("realistic_advantage", "oracle_advantage"):
            v = getattr(self, name)  # (F1 - c) / (1 - c): at most 1, negative below chance
            if v is not None and not (math.isfinite(v) and v <= 1.0 + 1e-9):
                raise ValueError(f"{name} must be finite and <= 1, got {v}")
        if self.recoverable_clients is not None and self.recoverable_clients < 0:
            raise ValueError("recoverable_clients must be >= 0")
        if self.epsilon is not None and not (self.epsilon >= 0 or math.isinf(self.epsilon)):
            raise ValueError("epsilon must be >= 0 (inf allowed)")

    @classmethod
    def from_results(cls, *, server_view: str = "secure", tokens: TokenScores | None = None,
                     attribution: AttributionScores | None = None, membership: MembershipScores | None = None,
                     recoverability: Recoverability | None = None, epsilon: float | None = None,
                     realistic_advantage: float | None = None,
                     oracle_advantage: float | None = None) -> "LeakageReport":
        return cls(
            server_view=server_view,
            token_precision=tokens.precision if tokens else None,
            token_recall=tokens.recall if tokens else None,
            token_f1=tokens.f1 if tokens else None,
            token_chance_f1=tokens.chance_f1 if tokens else None,
            intersection_attribution_rate=attribution.rate if attribution else None,
            realistic_advantage=realistic_advantage, oracle_advantage=oracle_advantage,
            mia_auc=membership.auc if membership else None,
            mia_tpr_at_1pct_fpr=membership.tpr_at_1pct_fpr if membership else None,
            mia_tpr_at_01pct_fpr=membership.tpr_at_01pct_fpr if membership else None,
            recoverable_clients=recoverability.count if recoverability else None,
            recoverable_fraction=recoverability.fraction if recoverability else None,
            epsilon=None if epsilon is None else float(epsilon))

    def to_dict(self) -> dict[str, Any]:
        """JSON-able (infinite epsilon becomes the string 'inf')."""
        d = asdict(self)
        if d["epsilon"] is not None and math.isinf(d["epsilon"]):
            d["epsilon"] = "inf"
        return d

    def summary(self) -> str:
        """One line, measured numbers only, e.g. for a progress log."""
        def f(v: float | None, fmt: str = ".3f") -> str:
            return "n/a" if v is None else format(v, fmt)

        parts = [f"view={self.server_view}", f"eps={f(self.epsilon, '.2f')}",
                 f"tokenF1={f(self.token_f1)}" + (f"(chance {f(self.token_chance_f1)})" if self.token_chance_f1 is not None else ""),
                 f"adv realistic={f(self.realistic_advantage)} oracle={f(self.oracle_advantage)}",
                 f"attributed={f(self.intersection_attribution_rate)}",
                 f"MIA AUC={f(self.mia_auc)} TPR@1%FPR={f(self.mia_tpr_at_1pct_fpr)}"]
        if self.recoverable_clients is not None:
            parts.append(f"recoverable={self.recoverable_clients} ({f(self.recoverable_fraction, '.1%')})")
        else:
            parts.append("recoverable=n/a")
        return "leakage: " + " | ".join(parts)


__all__ = ["LeakageReport"]
