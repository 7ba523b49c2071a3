"""FedRep (Collins et al., 2021): a shared representation phi, a personal head h_i per client.

    client i, round t:   phi <- phi^t
                         h_i <- h_i  - eta grad_h  f_i(phi, h_i)     tau_h epochs, phi frozen
                         phi_i <- phi - eta grad_phi f_i(phi, h_i)   tau_phi epochs, h_i frozen
    server:              phi^{t+1} = phi^t + sum_i n_i (phi_i - phi^t) / sum_i n_i   (a secure sum)

In the PEFT setting of FedMCP's Table I the representation is the backbone's adapters (the frozen
backbone is shared by construction) and the head is the client's classifier, which never leaves the
client. Collins et al. train the head for 10 epochs (their scripts: 15 local epochs of which 5 for the
representation); we keep 10 head epochs and give the representation one epoch, the same one local
epoch every method gets in this comparison.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from fl_algorithms.api import ClientContext, Masked, Upload
from fl_algorithms.algorithms.fedavg import FedAvg


class RepresentationTrainer(Protocol):
    """A client trainer with separately trainable head and representation (body)."""

    num_examples: int

    def get_shared(self) -> dict[str, np.ndarray]: ...
    def set_shared(self, params: Mapping[str, np.ndarray]) -> None: ...
    def train_head(self, *, epochs: int, round: int | None = None) -> dict[str, float]: ...
    def train_body(self, *, epochs: int, round: int | None = None) -> dict[str, float]: ...


class FedRep(FedAvg):
    name = "fedrep"

    def __init__(self, *, head_epochs: int = 10, body_epochs: int = 1) -> None:
        super().__init__(local_epochs=body_epochs)
        if head_epochs < 1 or body_epochs < 1:
            raise ValueError("head_epochs and body_epochs must be at least 1")
        self.head_epochs, self.body_epochs = head_epochs, body_epochs

    def client_update(self, *, broadcast: Mapping[str, np.ndarray], client: ClientContext) -> tuple[Upload, Mapping[str, Any]]:
        trainer: RepresentationTrainer = client.trainer
        trainer.set_shared(broadcast)                                  # phi <- phi^t
        head = trainer.train_head(epochs=self.head_epochs, round=client.round)  # h_i with phi frozen
        body = trainer.train_body(epochs=self.body_epochs, round=client.round)  # phi_i with h_i frozen
        new = trainer.get_shared()
        deltas = {part: Masked(new[part] - broadcast[part], weight=trainer.num_examples) for part in broadcast}
        metrics = {**{f"head_{k}": v for k, v in head.items()}, **{f"body_{k}": v for k, v in body.items()}}
        return Upload(masked=deltas, metrics=metrics), client.state
