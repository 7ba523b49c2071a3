"""FedProx (Li et al., 2020): FedAvg whose local objective adds a proximal term.

    client i:  w_i = argmin_w  F_i(w) + mu/2 ||w - w_t||^2   (approximately, by local epochs)
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fl_algorithms.api import ClientContext
from fl_algorithms.algorithms.fedavg import FedAvg


class FedProx(FedAvg):
    name = "fedprox"

    def __init__(self, *, mu: float = 0.01, local_epochs: int = 1) -> None:
        super().__init__(local_epochs=local_epochs)
        if mu < 0:
            raise ValueError("mu must be non-negative")
        self.mu = mu

    def local_train(self, *, broadcast: Mapping[str, np.ndarray], client: ClientContext) -> dict[str, float]:
        return client.trainer.train(epochs=self.local_epochs, proximal=broadcast, mu=self.mu, round=client.round)
