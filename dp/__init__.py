"""Differential privacy: the privacy ledger, DP mechanisms and the only constructors of Released.

* `dp.ledger`      per-client privacy ledger (dp_accounting RDP / PLD; Skellam and DDG curves)
* `dp.released`    the `Released` value type (noisy per-client or per-group value, unit stated)
                   and `ReleaseRecord`, its plain wire form
* `dp.admission`   the server's side of a client's own release: check the mechanism, charge the ledger
* `dp.distributed` distributed DP under secure aggregation (Skellam / discrete Gaussian)
* `dp.central`     central DP with a trusted aggregator (separately labelled)
* `dp.sketches`    DP JL sketches with an explicit privacy unit and a usefulness check
* `dp.opacus_client` example-level DP-SGD with Opacus (imported on demand: it pulls in torch)
* `dp.leakage`     leakage measurement on the server's view (separate subpackage)
"""
from dp.central import CentralDPAggregator, CentralDPConfig
from dp.distributed import (DistributedDPConfig, DistributedDPEncoder, DistributedDPPlan, InsufficientNoiseError,
                            PlanningError, plan_distributed_dp)
from dp.ledger import (Budget, BudgetExceeded, Charge, DiscreteGaussianMechanism, GaussianMechanism, Ledger,
                       LedgerConfig, NonPrivateMechanism, Observer, PrivacyUnit, SkellamMechanism, compose_epsilon)
from dp.admission import ReleaseRejected, ReleaseSpec, admit
from dp.released import Released, ReleaseForbidden, ReleaseRecord
from dp.sketches import DPSketcher, SketchConfig, SketchRefused

__all__ = [
    "Budget", "BudgetExceeded", "CentralDPAggregator", "CentralDPConfig", "Charge", "DPSketcher",
    "DiscreteGaussianMechanism", "DistributedDPConfig", "DistributedDPEncoder", "DistributedDPPlan",
    "GaussianMechanism", "InsufficientNoiseError", "Ledger", "LedgerConfig", "NonPrivateMechanism", "Observer",
    "PlanningError", "PrivacyUnit", "Released", "ReleaseForbidden", "ReleaseRecord", "ReleaseRejected", "ReleaseSpec", "SketchConfig", "SketchRefused",
    "SkellamMechanism", "admit", "compose_epsilon", "plan_distributed_dp",
]
