"""FedAvg (McMahan et al., 2017), as used in FedNLP.

    client i:  w_i = LocalTrain(w_t),  Delta_i = w_i - w_t,  weight n_i
    server:    w_{t+1} = w_t + sum_i n_i Delta_i / sum_i n_i        (the sum is a secure sum)

Clients upload the update Delta_i rather than w_i: the update's range is smaller, so the fixed-point
encoding resolves it more finely.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fl_algorithms.api import AggregateView, Algorithm, ClientContext, Masked, Upload

State = dict[str, np.ndarray]


def params_of(state: State) -> dict[str, np.ndarray]:
    return {k.removeprefix("params."): v for k, v in state.items() if k.startswith("params.")}


class FedAvg(Algorithm[State]):
    name = "fedavg"

    def __init__(self, *, local_epochs: int = 1) -> None:
        self.local_epochs = local_epochs

    def init_state(self, *, initial: Mapping[str, np.ndarray]) -> State:
        return {f"params.{k}": np.asarray(v, dtype=np.float32).copy() for k, v in initial.items()}

    def configure_round(self, *, round: int, state: State, cohort: Sequence[int] = ()) -> Mapping[str, np.ndarray]:
        return params_of(state)

    def local_train(self, *, broadcast: Mapping[str, np.ndarray], client: ClientContext) -> dict[str, float]:
        return client.trainer.train(epochs=self.local_epochs, round=client.round)

    def client_update(self, *, broadcast: Mapping[str, np.ndarray], client: ClientContext) -> tuple[Upload, Mapping[str, Any]]:
        trainer = client.trainer
        trainer.set_shared(broadcast)
        metrics = self.local_train(broadcast=broadcast, client=client)
        new = trainer.get_shared()
        deltas = {k: Masked(new[k] - broadcast[k], weight=trainer.num_examples) for k in broadcast}
        return Upload(masked=deltas, metrics=metrics), client.state

    def mean_update(self, view: AggregateView, part: str) -> np.ndarray:
        return view.mean(part).astype(np.float32)

    def server_update(self, *, state: State, view: AggregateView) -> State:
        new = dict(state)
        for part, w in params_of(state).items():
            new[f"params.{part}"] = w + self.mean_update(view, part)
        return new

    def shared_parameters(self, state: State) -> Mapping[str, np.ndarray]:
        return params_of(state)
