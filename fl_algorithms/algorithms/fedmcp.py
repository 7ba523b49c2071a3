"""FedMCP (Zhao et al., 2024): federated model-contrastive personalization with two adapters.

Each client holds a frozen backbone with a global adapter A_g and a private adapter A_p inserted at
the same positions, whose outputs are averaged (Sec. IV-B):

    h  <-  h + 1/2 A_g(h) + 1/2 A_p(h)

and two classifiers: g1 on the full model, g2 on the backbone with the global adapter only.
Per batch (Sec. IV-B to IV-E), with z = mean-pooled last-layer token states:

    z1 = f(x; A_g, A_p)           L_a = CE(g1(z1), y)                              (Eq. 3)
    X  = f(x; A_g)     (= z2)     L_b = CE(g2(X), y)                               (Eq. 4)
    Y  = f(x; A_p)                                  the local private adapter
    Z  = f(x; A_g^t)              (no gradient)     the averaged global adapter received this round
    L_c = CKA(X, Y) - CKA(X, Z)                                                    (Eq. 5, 6-7)
    L   = (1 - gamma) L_a + gamma L_b + mu L_c,   gamma = 0.5, mu = 0.05            (Eq. 8)

All of (A_g, A_p, g1, g2) are trained (Eq. 9). Only A_g is uploaded; the server takes the weighted
average of the clients' global adapters (Sec. IV-E), here as FedAvg over Masked deltas, so the sum
goes through secure aggregation. A_p, g1 and g2 never leave the client. Clients predict with the full
model and g1.

Reading of Eq. 5. The paper defines X = (local) global adapter, Y = (local) private adapter and
Z = averaged global adapter, writes L_c = Sim(X, Y) - Sim(X, Z), and then describes the two terms as
"minimize the similarity between the private adapter X and the global adapter Y" and "maximize the
similarity between the global adapter Y and the averaged global adapter Z": the prose swaps X and Y.
We implement the letters as defined, L_c = CKA(global, private) - CKA(global, averaged global),
because it is the only reading in which Eq. 5 does what both sentences say: minimising L_c pushes the
local global adapter away from the private one and pulls it toward the round's average (with the
prose's letters, Eq. 5 would pull the private adapter toward the averaged global adapter).

The private-adapter representation Y comes from its own pass (backbone + A_p only), as the paper
defines the three inputs as "representations generated with the backbone enhanced with different
adapters"; the full model's z1 would mix A_g into Y and contrast A_g partly with itself. The
averaged-adapter representation Z is computed under no_grad from a frozen copy of A_g^t (the
adapter set named ``reference``), loaded when the round starts and fixed for the round.

Differential privacy. L_c is a batch-level term: CKA couples all examples of a batch, so DP-SGD's
per-example clipping does not bound one example's influence on the update. Objectives return the
per-example part and the batch-level part separately, and a DP trainer must refuse a batch-level
term; FedMCP under DP-SGD therefore runs with mu = 0 (L_a and L_b only), and says so.
"""
from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch
from torch.nn import functional as F

from fl_algorithms.api import ClientContext, Masked, Upload
from fl_algorithms.algorithms.fedavg import FedAvg
from nlp_models.losses import linear_cka

GLOBAL, PRIVATE, REFERENCE = "global", "private", "reference"
"""Adapter-set names: A_g, A_p, and the frozen copy of the round's averaged A_g^t."""
GLOBAL_PART = "global_adapter"
"""The one shared (uploaded) part of a FedMCP client."""

FULL_MODEL = {GLOBAL: 0.5, PRIVATE: 0.5}
GLOBAL_ONLY = {GLOBAL: 1.0}
PRIVATE_ONLY = {PRIVATE: 1.0}
REFERENCE_ONLY = {REFERENCE: 1.0}
HEAD_FULL, HEAD_GLOBAL = "g1", "g2"


class LossTerms(NamedTuple):
    """A training objective's value on one batch.

    ``per_example`` (shape [B]) is a sum of per-example terms, the only kind DP-SGD may clip;
    ``batch`` is a scalar coupling the examples of the batch (None when absent). The training loss
    is ``per_example.mean() + batch``.
    """

    per_example: torch.Tensor
    batch: torch.Tensor | None
    parts: Mapping[str, float]

    def total(self) -> torch.Tensor:
        loss = self.per_example.mean()
        return loss if self.batch is None else loss + self.batch


class AdapterModel(Protocol):
    """What the FedMCP objective needs from a client model."""

    def represent(self, batch: Any, *, mixing: Mapping[str, float]) -> torch.Tensor:
        """Mean-pooled last-layer token states (B, H) with adapter outputs mixed by ``mixing``."""

    def classify(self, head: str, representation: torch.Tensor) -> torch.Tensor:
        """Logits of the named classifier."""

    def labels(self, batch: Any) -> torch.Tensor:
        """Class indices (B,)."""


class FedMCPTrainer(Protocol):
    """A client trainer FedMCP can drive (see fl_algorithms.training.adapter_trainer.AdapterTrainer for one)."""

    num_examples: int

    def get_shared(self) -> dict[str, np.ndarray]: ...
    def set_shared(self, params: Mapping[str, np.ndarray]) -> None: ...
    def load_adapter_set(self, name: str, vector: np.ndarray) -> None: ...
    def fit(self, *, epochs: int, objective: Any, round: int | None = None) -> dict[str, float]: ...


def contrastive_loss(global_rep: torch.Tensor, private_rep: torch.Tensor, averaged_rep: torch.Tensor) -> torch.Tensor:
    """Eq. 5 with X = global, Y = private, Z = averaged global: CKA(X, Y) - CKA(X, Z)."""
    return linear_cka(global_rep, private_rep) - linear_cka(global_rep, averaged_rep)


def fedmcp_terms(model: AdapterModel, batch: Any, *, contrastive: bool
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """L_a and L_b per example (Eqs. 3-4) and, when `contrastive`, the batch's L_c (Eq. 5)."""
    y = model.labels(batch)
    z1 = model.represent(batch, mixing=FULL_MODEL)
    x = model.represent(batch, mixing=GLOBAL_ONLY)
    loss_a = F.cross_entropy(model.classify(HEAD_FULL, z1), y, reduction="none")     # Eq. 3
    loss_b = F.cross_entropy(model.classify(HEAD_GLOBAL, x), y, reduction="none")    # Eq. 4
    if not contrastive:
        return loss_a, loss_b, None
    private = model.represent(batch, mixing=PRIVATE_ONLY)
    with torch.no_grad():
        averaged = model.represent(batch, mixing=REFERENCE_ONLY)
    return loss_a, loss_b, contrastive_loss(x, private, averaged)                  # Eq. 5


def fedmcp_objective(model: AdapterModel, batch: Any, *, gamma: float, mu: float) -> LossTerms:
    """Eq. 8 on one batch: (1-gamma) L_a + gamma L_b per example, plus mu L_c for the batch."""
    # CKA needs two examples; mu = 0 (DP) skips both extra passes
    contrastive = mu != 0.0 and model.labels(batch).shape[0] >= 2
    loss_a, loss_b, loss_c = fedmcp_terms(model, batch, contrastive=contrastive)
    per_example = (1.0 - gamma) * loss_a + gamma * loss_b
    parts = {"loss_a": float(loss_a.detach().mean()), "loss_b": float(loss_b.detach().mean())}
    if loss_c is None:
        return LossTerms(per_example, None, parts)
    parts["loss_c"] = float(loss_c.detach())
    return LossTerms(per_example, mu * loss_c, parts)


class FedMCPObjective:
    """Eq. 8 bound to its weights, callable as ``objective(model, batch) -> LossTerms``."""

    def __init__(self, *, gamma: float, mu: float) -> None:
        self.gamma, self.mu = gamma, mu

    def __call__(self, model: AdapterModel, batch: Any) -> LossTerms:
        return fedmcp_objective(model, batch, gamma=self.gamma, mu=self.mu)

    def gradient_norms(self, model: AdapterModel, batch: Any, params: list[torch.Tensor]) -> dict[str, float]:
        """||grad L_a||, ||grad L_b|| and ||grad mu L_c|| w.r.t. `params` (the global adapter) on one batch,
        and their ratio mu L_c : L_a: how much the contrastive term can move A_g against the supervised one.
        Computed at mu = 1 when self.mu is 0, so an ablation still shows what L_c would do (reported scaled
        by self.mu: 0)."""
        loss_a, loss_b, loss_c = fedmcp_terms(model, batch, contrastive=True)
        loss_a, loss_b = loss_a.mean(), loss_b.mean()

        def norm(loss: torch.Tensor) -> float:
            grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
            return float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads if g is not None)))

        a, b, c = norm(loss_a), norm(loss_b), norm(loss_c)
        return {"grad_norm_a": a, "grad_norm_b": b, "grad_norm_mu_c": self.mu * c, "loss_c_probe": float(loss_c.detach()),
                "grad_ratio_mu_c_to_a": self.mu * c / a if a > 0 else float("nan")}


class FedMCP(FedAvg):
    """Server: FedAvg of the global adapter only. Client: Algorithm 1's LocalUpdate with Eq. 8."""

    name = "fedmcp"

    def __init__(self, *, gamma: float = 0.5, mu: float = 0.05, local_epochs: int = 1, probe: bool = True) -> None:
        """`probe=False` trains the same way without logging the per-term gradient norms (a trainer probes
        an objective that has `gradient_norms`; FedMCP's plaintext twin needs no second copy of them)."""
        super().__init__(local_epochs=local_epochs)
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {gamma}")
        if mu < 0:
            raise ValueError(f"mu must be non-negative, got {mu}")
        self.gamma, self.mu = gamma, mu
        self.objective = FedMCPObjective(gamma=gamma, mu=mu) if probe else partial(fedmcp_objective, gamma=gamma, mu=mu)

    def init_state(self, *, initial: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if set(initial) != {GLOBAL_PART}:
            raise ValueError(f"FedMCP shares exactly the part {GLOBAL_PART!r}, got {sorted(initial)}")
        return super().init_state(initial=initial)

    def client_update(self, *, broadcast: Mapping[str, np.ndarray], client: ClientContext) -> tuple[Upload, Mapping[str, Any]]:
        trainer: FedMCPTrainer = client.trainer
        averaged = broadcast[GLOBAL_PART]
        trainer.set_shared({GLOBAL_PART: averaged})           # A_g <- A_g^t
        trainer.load_adapter_set(REFERENCE, averaged)         # Z's adapter, fixed for the round
        metrics = trainer.fit(epochs=self.local_epochs, objective=self.objective, round=client.round)
        delta = trainer.get_shared()[GLOBAL_PART] - averaged  # only A_g leaves the client, masked
        return Upload(masked={GLOBAL_PART: Masked(delta, weight=trainer.num_examples)}, metrics=metrics), client.state
