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
import importlib

# Where each name lives. Importing `dp` (as `import dp.sampling` does) loads none of them, so a
# submodule is imported with what it needs only (dp.central's dp_accounting and scipy are not);
# `from dp import Ledger` loads dp.ledger on first use (PEP 562).
_WHERE = {
    "dp.central": ("CentralDPAggregator", "CentralDPConfig"),
    "dp.distributed": ("DistributedDPConfig", "DistributedDPEncoder", "DistributedDPPlan", "InsufficientNoiseError",
                       "PlanningError", "plan_distributed_dp"),
    "dp.ledger": ("Budget", "BudgetExceeded", "Charge", "DiscreteGaussianMechanism", "GaussianMechanism", "Ledger",
                  "LedgerConfig", "NonPrivateMechanism", "Observer", "PrivacyUnit", "SkellamMechanism",
                  "compose_epsilon"),
    "dp.admission": ("ReleaseRejected", "ReleaseSpec", "admit"),
    "dp.released": ("Released", "ReleaseForbidden", "ReleaseRecord"),
    "dp.sketches": ("DPSketcher", "SketchConfig", "SketchRefused"),
}
_MODULE_OF = {name: module for module, names in _WHERE.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'dp' has no attribute {name!r}")
    value = getattr(importlib.import_module(_MODULE_OF[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
