"""Group FedAvg: one model per publicly known group of clients (e.g. a task or a domain).

    server, round t:  broadcast w_g^t to the cohort members of group g (each client receives only
                      its own group's model)
    client k in g:    Delta_k = LocalTrain(w_g^t) - w_g^t
    server:           w_g^{t+1} = w_g^t + sum_{k in g} n_k Delta_k / sum_{k in g} n_k
                      one secure sum per group, each with its own minimum size; a group with too
                      few members this round keeps its model (the sum is skipped, not run)

The group of each client is public configuration, like the task a client solves; the engine's
per-group broadcasts and group sums are what ATC's per-cluster models stand on.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fl_algorithms.api import (AggregateView, Algorithm, Broadcast, ClientBroadcast, ClientContext, Masked, RoundPlan,
                               SumSpec, Upload)

State = dict[str, np.ndarray]


class GroupFedAvg(Algorithm[State]):
    name = "group_fedavg"
    description = "one FedAvg model per public group of clients (task/domain): per-group broadcasts and secure sums"

    def __init__(self, *, groups: Mapping[int, str], local_epochs: int = 1, min_group_size: int = 2) -> None:
        if not groups:
            raise ValueError("GroupFedAvg needs the group of every client")
        self.groups = {int(c): str(g) for c, g in groups.items()}
        self.local_epochs, self.min_group_size = local_epochs, min_group_size

    def init_state(self, *, initial: Mapping[str, np.ndarray]) -> State:
        return {f"{g}/{k}": np.asarray(v, dtype=np.float32).copy()
                for g in sorted(set(self.groups.values())) for k, v in initial.items()}

    def model(self, state: State, group: str) -> dict[str, np.ndarray]:
        return {k.split("/", 1)[1]: v for k, v in state.items() if k.split("/", 1)[0] == group}

    def configure_round(self, *, round: int, state: State, cohort: Sequence[int] = ()) -> RoundPlan:
        present = sorted({self.groups[c] for c in cohort})
        broadcast = Broadcast(groups={g: self.model(state, g) for g in present},
                              group_of={c: self.groups[c] for c in cohort})
        sums = tuple(SumSpec(name=g, members=frozenset(c for c in cohort if self.groups[c] == g),
                             min_size=self.min_group_size) for g in present)
        return RoundPlan(broadcast=broadcast, sums=sums)

    def client_update(self, *, broadcast: ClientBroadcast, client: ClientContext) -> tuple[Upload, Mapping[str, Any]]:
        trainer = client.trainer
        w = {k: np.array(v) for k, v in broadcast.group_parts.items()}
        trainer.set_shared(w)
        metrics = trainer.train(epochs=self.local_epochs, round=client.round)
        new = trainer.get_shared()
        return Upload(masked={k: Masked(new[k] - w[k], weight=trainer.num_examples) for k in w}, metrics=metrics), client.state

    def server_update(self, *, state: State, view: AggregateView) -> State:
        new = dict(state)
        for group, parts in view.sums.items():
            for part, agg in parts.items():
                new[f"{group}/{part}"] = (state[f"{group}/{part}"] + agg.mean).astype(np.float32)
        return new

    def shared_parameters(self, state: State) -> Mapping[str, np.ndarray]:
        return state

    def client_parameters(self, *, state: State, client_id: int) -> Mapping[str, np.ndarray]:
        return self.model(state, self.groups[client_id])
