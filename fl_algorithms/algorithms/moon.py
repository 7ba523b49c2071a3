"""MOON (Li, He and Song, "Model-Contrastive Federated Learning", CVPR 2021): FedAvg whose local
objective pulls the local representation toward the global model's and away from the client's
previous local model's.

    client i, round t:  w_i <- w^t;   z = R_{w_i}(x),  z_glob = R_{w^t}(x),  z_prev = R_{w_i^{t-1}}(x)
                        l_con = -log( exp(sim(z, z_glob)/tau) / (exp(sim(z, z_glob)/tau) + exp(sim(z, z_prev)/tau)) )
                        l     = l_sup(x, y) + mu l_con,      sim = cosine,  tau = 0.5,  mu = 1
                        Delta_i = w_i - w^t                                        (a secure sum)
    server:             w^{t+1} = w^t + sum_i n_i Delta_i / sum_i n_i

tau = 0.5 and mu = 1 are the defaults of the authors' code (``--temperature 0.5 --mu 1``); the paper
tunes mu per data set. z_glob and z_prev come from frozen copies (no gradient). l_con is computed as
the authors' code does, a cross-entropy over the logits [sim(z, z_glob), sim(z, z_prev)] / tau with
the positive first, which equals the formula above.

In the PEFT setting of FedMCP's comparison the model w is the client's two averaged adapters (the
baselines' architecture, Sec. V-B) over the frozen backbone; they are what is trained, shared and
averaged. The client model therefore carries two more frozen pairs of adapter sets: the round's
global adapters w^t (``GLOBAL_SETS``) and the client's own adapters at the end of the last round it
trained in, w_i^{t-1} (``PREVIOUS_SETS``: private client state kept in the trainer, so its checkpoint
carries it; with client sampling, the last round the client took part in, as in the authors' code).
The classifier head is private, as in every baseline here.

SIMPLIFICATIONS. (1) The paper's networks end in a projection head whose output is the representation
z; we use no projection head: z is the mean-pooled last-layer representation that FedMCP's baselines
classify. (2) A client's first round has no previous model: w_i^{t-1} = w^t, so z_prev = z_glob,
l_con = log 2 and its gradient is zero. That is the update of the authors' code, whose first round
has no negative at all (its l_con is 0): the same first step, a different reported value. (3) The
frozen passes run in the client model's mode: with backbone dropout on (off by default) they see
dropout, where the authors put their frozen networks in eval mode.

Differential privacy. l_con is a per-example term (each example's loss depends on that example
only), so it is returned in ``LossTerms.per_example`` and DP-SGD clips it with the supervised loss.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import torch
from torch.nn import functional as F

from fl_algorithms.api import ClientContext, Masked, Upload
from fl_algorithms.algorithms.fedavg import FedAvg
from fl_algorithms.algorithms.fedmcp import AdapterModel, LossTerms

LOCAL_SETS = ("adapter1", "adapter2")
"""w_i: the client's two adapters, averaged (the baselines' architecture): trained and shared."""
GLOBAL_SETS = ("global_adapter1", "global_adapter2")
"""A frozen copy of the round's global adapters w^t (z_glob)."""
PREVIOUS_SETS = ("previous_adapter1", "previous_adapter2")
"""A frozen copy of the client's adapters at the end of its previous round w_i^{t-1} (z_prev)."""
PART = "adapters"
"""The one shared (uploaded) part: both local adapters."""
HEAD = "head"
PREVIOUS_ROUND = "moon_previous_round"
"""Key of the client state: the last round this client trained in (its previous model is then in the trainer)."""


def _averaged(sets: Sequence[str]) -> dict[str, float]:
    return {name: 1.0 / len(sets) for name in sets}


LOCAL, GLOBAL, PREVIOUS = _averaged(LOCAL_SETS), _averaged(GLOBAL_SETS), _averaged(PREVIOUS_SETS)
"""Adapter mixings of the three representations: z, z_glob and z_prev."""


class MOONTrainer(Protocol):
    """A client trainer MOON can drive (fl_algorithms.training.adapter_trainer.AdapterTrainer with MOON_MODEL)."""

    num_examples: int

    def get_shared(self) -> dict[str, np.ndarray]: ...
    def set_shared(self, params: Mapping[str, np.ndarray]) -> None: ...
    def load_adapter_sets(self, names: Sequence[str], vector: np.ndarray) -> None:
        """Load one vector laid out like a shared part (its sets concatenated) into the sets `names`."""
    def fit(self, *, epochs: int, objective: Any, round: int | None = None) -> dict[str, float]: ...


def model_contrastive_loss(z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor, *, tau: float) -> torch.Tensor:
    """l_con per example: -log( e^{sim(z, z_glob)/tau} / (e^{sim(z, z_glob)/tau} + e^{sim(z, z_prev)/tau}) )."""
    logits = torch.stack([F.cosine_similarity(z, z_glob, dim=-1), F.cosine_similarity(z, z_prev, dim=-1)], dim=-1)
    positive = torch.zeros(z.shape[0], dtype=torch.long, device=z.device)
    return F.cross_entropy(logits / tau, positive, reduction="none")


def moon_objective(model: AdapterModel, batch: Any, *, mu: float, tau: float) -> LossTerms:
    """l = l_sup + mu l_con per example; mu = 0 skips the two frozen passes (plain FedAvg)."""
    y = model.labels(batch)
    z = model.represent(batch, mixing=LOCAL)
    loss_sup = F.cross_entropy(model.classify(HEAD, z), y, reduction="none")
    parts = {"loss_sup": float(loss_sup.detach().mean()) if len(y) else 0.0}
    if mu == 0.0:
        return LossTerms(loss_sup, None, parts)
    with torch.no_grad():
        z_glob = model.represent(batch, mixing=GLOBAL)
        z_prev = model.represent(batch, mixing=PREVIOUS)
    loss_con = model_contrastive_loss(z, z_glob, z_prev, tau=tau)
    parts["loss_con"] = float(loss_con.detach().mean()) if len(y) else 0.0
    return LossTerms(loss_sup + mu * loss_con, None, parts)


class MOONObjective:
    """l = l_sup + mu l_con bound to (mu, tau), callable as ``objective(model, batch) -> LossTerms``."""

    def __init__(self, *, mu: float, tau: float) -> None:
        self.mu, self.tau = mu, tau

    def __call__(self, model: AdapterModel, batch: Any) -> LossTerms:
        return moon_objective(model, batch, mu=self.mu, tau=self.tau)


class MOON(FedAvg):
    """Server: FedAvg of the shared adapters. Client: local epochs of l_sup + mu l_con."""

    name = "moon"
    description = "MOON (Li et al. 2021): FedAvg + model-contrastive term (toward the global model, away from the previous local one)"

    def __init__(self, *, mu: float = 1.0, tau: float = 0.5, local_epochs: int = 1) -> None:
        super().__init__(local_epochs=local_epochs)
        if mu < 0:
            raise ValueError(f"mu must be non-negative, got {mu}")
        if not tau > 0:
            raise ValueError(f"tau must be positive, got {tau}")
        self.mu, self.tau = mu, tau
        self.objective = MOONObjective(mu=mu, tau=tau)

    def init_state(self, *, initial: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if set(initial) != {PART}:
            raise ValueError(f"MOON shares exactly the part {PART!r}, got {sorted(initial)}")
        return super().init_state(initial=initial)

    def client_update(self, *, broadcast: Mapping[str, np.ndarray], client: ClientContext) -> tuple[Upload, Mapping[str, Any]]:
        trainer: MOONTrainer = client.trainer
        w_t = np.asarray(broadcast[PART])
        trainer.set_shared({PART: w_t})                       # w_i <- w^t
        trainer.load_adapter_sets(GLOBAL_SETS, w_t)           # z_glob's model, frozen for the round
        if PREVIOUS_ROUND not in client.state:                # first round: w_i^{t-1} = w^t (l_con = log 2, no gradient)
            trainer.load_adapter_sets(PREVIOUS_SETS, w_t)
        metrics = trainer.fit(epochs=self.local_epochs, objective=self.objective, round=client.round)
        w_i = trainer.get_shared()[PART]
        trainer.load_adapter_sets(PREVIOUS_SETS, w_i)         # z_prev's model next round (private)
        upload = Upload(masked={PART: Masked(w_i - w_t, weight=trainer.num_examples)}, metrics=metrics)
        return upload, {**client.state, PREVIOUS_ROUND: client.round}


__all__ = ["LOCAL_SETS", "GLOBAL_SETS", "PREVIOUS_SETS", "PART", "HEAD", "PREVIOUS_ROUND", "LOCAL", "GLOBAL",
           "PREVIOUS", "MOONTrainer", "model_contrastive_loss", "moon_objective", "MOONObjective", "MOON"]
