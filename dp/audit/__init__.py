"""Empirical privacy auditing: measure, from the outside, whether a mechanism is as private as claimed.

The ledger's epsilons are recomputable (`dp.recompute`), but recomputing cannot notice an
implementation that adds less noise than the ledger says. An audit can: it inserts canaries,
looks only at what an observer of the released models sees, and turns how well the canaries'
presence shows into a lower bound on epsilon with 95% confidence. A lower bound above the
accountant's claim proves the implementation (or the accounting) wrong.

* `dp.audit.bounds`     the statistics: Clopper-Pearson lower bound, Steinke et al.'s one-run
                        bound, Andrew et al.'s Gaussian-fit estimate
* `dp.audit.canaries`   seeded random unit canary updates; the cosine statistic (final model, all iterates)
* `dp.audit.mechanisms` plaintext, SecAgg, distributed DP (Skellam, discrete Gaussian), central DP
                        at the secure-sum level, through the project's own client and server code
* `dp.audit.federated`  canary clients sampled into rounds like any client: `audit` -> `AuditResult`
* `dp.audit.runner`     the same canaries as ordinary clients of a `SimulationRunner` run
* `dp.audit.one_run`    Steinke et al.'s one-run audit of Opacus DP-SGD with canary examples
* `dp.audit.faults`     deliberate faults (in-memory patches) the audit must flag
* `dp.audit.selftest`   the seeded-fault suite (`python -m dp.audit --selftest`)

Submodules load on first use, so `import dp.audit` costs nothing (PEP 562).
"""
import importlib

_WHERE = {
    "dp.audit.bounds": ("ClopperPearsonBound", "GaussianFit", "OneRunBound", "clopper_pearson_bound",
                        "gaussian_fit_epsilon", "max_lower_bound", "one_run_bound", "one_run_epsilon"),
    "dp.audit.canaries": ("canary_directions", "canary_scores", "cosines"),
    "dp.audit.mechanisms": ("MECHANISMS", "make_mechanism"),
    "dp.audit.federated": ("AuditResult", "CanaryDesign", "Cohorts", "audit"),
    "dp.audit.faults": ("FAULTS",),
    "dp.audit.selftest": ("run_selftest",),
}
_MODULE_OF = {name: module for module, names in _WHERE.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'dp.audit' has no attribute {name!r}")
    value = getattr(importlib.import_module(_MODULE_OF[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
