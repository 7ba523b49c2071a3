"""Local: every client trains in isolation; nothing leaves the client (a lower reference)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fl_algorithms.api import AggregateView, Algorithm, ClientContext, Upload

State = dict[str, np.ndarray]


class Local(Algorithm[State]):
    name = "local"

    def __init__(self, *, local_epochs: int = 1) -> None:
        self.local_epochs = local_epochs

    def init_state(self, *, initial: Mapping[str, np.ndarray]) -> State:
        return {}

    def configure_round(self, *, round: int, state: State, cohort: Sequence[int] = ()) -> Mapping[str, np.ndarray]:
        return {}

    def client_update(self, *, broadcast, client: ClientContext) -> tuple[Upload, Mapping[str, Any]]:
        metrics = client.trainer.train(epochs=self.local_epochs, round=client.round)
        return Upload(metrics=metrics), client.state

    def server_update(self, *, state: State, view: AggregateView) -> State:
        return state
