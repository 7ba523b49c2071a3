"""Server and client roles: the two halves of one Algorithm, as separate objects.

An algorithm is written as one class so that its file reads like its paper. The engine never runs
both halves on that object: it deep-copies it once for the server and once per client, and each
role exposes only its own side's methods. Anything a client's code stores on `self` stays in that
client's copy; the server learns only what the engine carries in messages.
"""
from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fl_algorithms.api import AggregateView, Algorithm, ClientBroadcast, ClientContext, RoundPlan, Upload


class ServerRole:
    """The server half: init, plan a round, update from the aggregate view, parameters to evaluate."""

    def __init__(self, algorithm: Algorithm) -> None:
        self.algorithm = copy.deepcopy(algorithm)
        self.name = algorithm.name

    @property
    def releases(self) -> Mapping[str, Any]:
        """The per-client DP releases the algorithm declared (what the server admits)."""
        return self.algorithm.releases

    def init_state(self, *, initial: Mapping[str, np.ndarray]) -> Any:
        return self.algorithm.init_state(initial=initial)

    def plan(self, *, round: int, state: Any, cohort: Sequence[int]) -> RoundPlan:
        return RoundPlan.of(self.algorithm.configure_round(round=round, state=state, cohort=tuple(cohort)))

    def server_update(self, *, state: Any, view: AggregateView) -> Any:
        return self.algorithm.server_update(state=state, view=view)

    def shared_parameters(self, state: Any) -> Mapping[str, np.ndarray]:
        return self.algorithm.shared_parameters(state)

    def client_parameters(self, *, state: Any, client_id: int) -> Mapping[str, np.ndarray]:
        return self.algorithm.client_parameters(state=state, client_id=client_id)


class ClientRole:
    """One client's half: local update and evaluation."""

    def __init__(self, algorithm: Algorithm) -> None:
        self.algorithm = copy.deepcopy(algorithm)
        self.name = algorithm.name

    @property
    def releases(self) -> Mapping[str, Any]:
        return self.algorithm.releases

    def client_update(self, *, broadcast: ClientBroadcast, client: ClientContext) -> tuple[Upload, Mapping[str, Any]]:
        return self.algorithm.client_update(broadcast=broadcast, client=client)

    def evaluate(self, *, parameters: Mapping[str, np.ndarray], client: ClientContext, split: str) -> dict[str, float]:
        return self.algorithm.evaluate(parameters=parameters, client=client, split=split)
