"""Steinke, Nasr and Jagielski's one-run audit of Opacus DP-SGD with canary examples.

"Privacy auditing with one (1) training run" (NeurIPS 2023): m canary examples, each included in
the training set independently with probability 1/2; after ONE run, score every canary, guess the
k+ highest "in" and the k- lowest "out", and turn the number of right guesses into an epsilon lower
bound (`dp.audit.bounds.one_run_bound`: the binomial tail of their Theorem 3 with its delta term).

The client here is the project's own DP-SGD client (`dp.opacus_client.OpacusClient`: Opacus, Poisson
batches, per-example clipping, Gaussian noise, the ledger debited with the example-level
mechanism). The model is tiny on purpose: a bias-free linear classifier over `features` ordinary
features and one private feature per canary. Canary i is the example x = canary_scale * e_(features+i)
with label 1, so only it has a gradient on its own feature's weights, and that gradient, larger
than the clip, is clipped to exactly C: each canary is a worst-case example that no other example
disturbs. Its score is the change of its own feature's logit margin (W[1, f+i] - W[0, f+i]).
Ordinary examples (Gaussian features, labels from a random linear rule) keep the batches realistic.

Threat model: anyone who sees the client's model after the run (the final model); unit: one
example; the claim is the ledger's example-level epsilon of the run. Because canaries live on
disjoint coordinates and the noise is independent per coordinate, canary scores are independent
given the inclusion coins, so the Clopper-Pearson bound on a random half split is also valid here.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import asdict, dataclass

import numpy as np

from dp.audit.bounds import (DEFAULT_CONFIDENCE, ClopperPearsonBound, GaussianFit, OneRunBound, clopper_pearson_bound,
                             gaussian_fit_epsilon, one_run_bound)

THREAT_MODEL = "anyone who sees the model after the client's DP-SGD run (final model); unit: one example"


@dataclass(frozen=True)
class DPSGDAuditConfig:
    canaries: int = 1000
    """m: canary examples, each included with probability 1/2."""
    data_examples: int = 256
    features: int = 16
    noise_multiplier: float = 1.0
    max_grad_norm: float = 1.0
    batch_size: int = 64
    """Expected batch size (Opacus draws Poisson batches)."""
    epochs: int = 1
    lr: float = 1.0
    delta: float = 1e-5
    canary_scale: float = 10.0
    """A canary's input magnitude: its gradient then exceeds the clip, so it is clipped to exactly C."""
    seed: int = 0
    """Seeds the data, the canaries' inclusion coins and (through torch) Opacus' batches and noise."""

    def __post_init__(self) -> None:
        if self.canaries < 2 or self.data_examples < 0 or self.features < 1 or self.epochs < 1:
            raise ValueError("need canaries >= 2, data_examples >= 0, features >= 1, epochs >= 1")
        if not (self.noise_multiplier > 0 and self.max_grad_norm > 0 and self.lr > 0 and self.canary_scale > 0):
            raise ValueError("noise_multiplier, max_grad_norm, lr and canary_scale must be positive")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {self.delta}")


@dataclass(frozen=True)
class DPSGDAuditResult:
    claimed_epsilon: float
    """The ledger's example-level epsilon of the run at `delta`."""
    one_run_lower_bound: float
    """Steinke et al.'s bound at `delta` with probability `confidence` (Bonferroni over the (k+, k-) grid)."""
    epsilon_lower_bound: float
    """Clopper-Pearson bound on a random half split of the canaries (valid here: independent canaries)."""
    empirical_epsilon: float
    """Gaussian-fit estimate of the in and out score distributions (no confidence)."""
    one_run: OneRunBound
    bound: ClopperPearsonBound
    fit: GaussianFit
    canaries: int
    included: int
    steps: int
    sample_rate: float
    noise_multiplier: float
    delta: float
    confidence: float
    seconds: float
    threat_model: str = THREAT_MODEL
    unit: str = "example"

    @property
    def flagged(self) -> bool:
        return max(self.one_run_lower_bound, self.epsilon_lower_bound) > self.claimed_epsilon

    def to_dict(self) -> dict:
        from dp.audit.federated import json_safe

        out = asdict(self)
        out["flagged"] = self.flagged
        return json_safe(out)


def audit_dpsgd(config: DPSGDAuditConfig, *, confidence: float = DEFAULT_CONFIDENCE) -> DPSGDAuditResult:
    """One DP-SGD run of `OpacusClient` with canary examples, and its one-run audit."""
    import torch
    from torch import nn
    from torch.nn import functional as F
    from torch.utils.data import TensorDataset

    from dp.ledger import Ledger, LedgerConfig
    from dp.opacus_client import DPSGDConfig, OpacusClient

    t0 = time.perf_counter()
    rng = np.random.default_rng(config.seed)
    f, m = config.features, config.canaries
    included = rng.random(m) < 0.5
    w_true = rng.standard_normal(f)
    x_data = np.zeros((config.data_examples, f + m), dtype=np.float32)
    x_data[:, :f] = rng.standard_normal((config.data_examples, f))
    y_data = (x_data[:, :f] @ w_true > 0).astype(np.int64)
    chosen = np.flatnonzero(included)
    x_can = np.zeros((chosen.size, f + m), dtype=np.float32)
    x_can[np.arange(chosen.size), f + chosen] = config.canary_scale
    x = torch.from_numpy(np.concatenate([x_data, x_can]))
    y = torch.from_numpy(np.concatenate([y_data, np.ones(chosen.size, dtype=np.int64)]))

    torch.manual_seed(config.seed)
    model = nn.Linear(f + m, 2, bias=False)  # no bias: canaries touch nothing but their own feature's weights
    with torch.no_grad():
        model.weight.zero_()
    before = model.weight.detach().clone()
    ledger = Ledger(LedgerConfig(delta=config.delta))
    client = OpacusClient(client_id=1, ledger=ledger, config=DPSGDConfig(
        max_grad_norm=config.max_grad_norm, noise_multiplier=config.noise_multiplier, batch_size=config.batch_size,
        local_epochs=config.epochs, delta=config.delta))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Opacus: secure RNG off, full backward hooks (research-grade noise, stated)
        report = client.train_round(model=model, optimizer_factory=lambda ps: torch.optim.SGD(ps, lr=config.lr),
                                    dataset=TensorDataset(x, y), round_id=1,
                                    loss_fn=lambda mdl, batch: F.cross_entropy(mdl(batch[0]), batch[1], reduction="none"))
    moved = (model.weight.detach() - before).numpy()
    scores = (moved[1, f:] - moved[0, f:]).astype(np.float64)  # each canary's own logit margin

    one_run = one_run_bound(scores, included, delta=config.delta, confidence=confidence)
    half = np.random.default_rng([config.seed, 0x5E1EC7]).permutation(m) < m // 2
    bound = clopper_pearson_bound(
        selection={"margin": (scores[half & included], scores[half & ~included])},
        evaluation={"margin": (scores[~half & included], scores[~half & ~included])},
        delta=config.delta, confidence=confidence)
    fit = gaussian_fit_epsilon(scores[included], scores[~included], delta=config.delta)
    return DPSGDAuditResult(claimed_epsilon=float(report.epsilon), one_run_lower_bound=one_run.epsilon,
                            epsilon_lower_bound=bound.epsilon, empirical_epsilon=fit.epsilon, one_run=one_run,
                            bound=bound, fit=fit, canaries=m, included=int(included.sum()), steps=report.steps,
                            sample_rate=report.sample_rate, noise_multiplier=report.noise_multiplier,
                            delta=config.delta, confidence=confidence, seconds=time.perf_counter() - t0)


__all__ = ["THREAT_MODEL", "DPSGDAuditConfig", "DPSGDAuditResult", "audit_dpsgd"]
