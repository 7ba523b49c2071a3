"""Ditto (Li, Hu, Beirami and Smith, "Ditto: Fair and Robust Federated Learning Through
Personalization", ICML 2021): a global model by FedAvg, and a personal model per client that is
pulled towards the global one.

    client k, round t:  w_k   = LocalTrain_{F_k}(w^t)                       E local epochs
                        Delta_k = w_k - w^t                                  (a secure sum)
                        v_k  <- argmin_v  F_k(v) + lambda/2 ||v - w^t||^2     personal epochs from v_k
    server:             w^{t+1} = w^t + sum_k n_k Delta_k / sum_k n_k
    evaluation:         client k predicts with v_k (w^t if it has never been sampled)

v_k is private client state: it never leaves the client and the server keeps nothing per client.
SIMPLIFICATION: one trainer holds both problems, so the client's optimiser state and any private
(non-shared) parameters, such as a private head, are common to the global and the personal
problem; the paper keeps two separate models trained with SGD (with SGD and no private parameters
the two coincide).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from fl_algorithms.api import ClientBroadcast, ClientContext, Masked, Upload
from fl_algorithms.algorithms.fedavg import FedAvg

PERSONAL = "personal"
"""Key of the personal model v_k in the client's private state."""


class Ditto(FedAvg):
    name = "ditto"
    description = "Ditto (Li et al. 2021): FedAvg global model + a personal model per client, pulled to it by lambda"

    def __init__(self, *, lam: float = 0.1, local_epochs: int = 1, personal_epochs: int = 1) -> None:
        super().__init__(local_epochs=local_epochs)
        if lam < 0:
            raise ValueError(f"lambda must be non-negative, got {lam}")
        if personal_epochs < 1:
            raise ValueError("personal_epochs must be at least 1")
        self.lam, self.personal_epochs = lam, personal_epochs

    def client_update(self, *, broadcast: ClientBroadcast, client: ClientContext) -> tuple[Upload, Mapping[str, Any]]:
        trainer = client.trainer
        w_t = {k: np.array(broadcast[k]) for k in broadcast}
        trainer.set_shared(w_t)                                                   # w <- w^t
        global_metrics = trainer.train(epochs=self.local_epochs, round=client.round)
        w_k = trainer.get_shared()
        deltas = {k: Masked(w_k[k] - w_t[k], weight=trainer.num_examples) for k in w_t}
        v_k = client.state.get(PERSONAL) or w_t                                   # v_k (w^t the first time)
        trainer.set_shared(v_k)
        personal_metrics = trainer.train(epochs=self.personal_epochs, proximal=w_t, mu=self.lam, round=client.round)
        metrics = {**global_metrics, **{f"personal_{k}": v for k, v in personal_metrics.items()}}
        return Upload(masked=deltas, metrics=metrics), {**client.state, PERSONAL: trainer.get_shared()}

    def evaluate(self, *, parameters: Mapping[str, np.ndarray], client: ClientContext, split: str) -> dict[str, float]:
        personal = client.state.get(PERSONAL)
        client.trainer.set_shared(personal if personal else parameters)
        return client.trainer.evaluate(split=split)
