"""Simulation past one process: the clients of a `SimulationRunner` as Ray actors.

The driver (this process) keeps the server role, the round state machine and the secure sums; each
Ray worker actor holds a shard of the clients (`ClientEndpoint`s: role, trainer, private state,
client-side encoder) and answers broadcasts and evaluations for them. A client's upload is encoded
into its secure-sum inputs inside its worker, exactly as in memory, and only those encoded inputs,
its `ClientReady` and its evaluation scalars come back: the `Upload` itself never leaves the worker
(its `Masked` parts refuse to be pickled). Clients train with the same seeds and the same torch
thread count as in memory, so a run gives the same results for the same seed.

    RunConfig(..., backend="ray")                        # every core of this machine
    RunConfig(..., backend="ray", ray_address="auto")    # a running Ray cluster

Ray is an optional extra (`pip install -e '.[ray]'`); the in-memory backend needs nothing.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


def require_ray():
    try:
        import ray
    except ImportError:
        raise RuntimeError("backend 'ray' needs Ray: pip install -e '.[ray]' (or pip install 'ray>=2.9')") from None
    return ray


class _Worker:
    """One Ray actor: a shard of the clients (their endpoints) and the torch thread count to use."""

    def __init__(self, endpoints: Mapping[int, Any], threads: int) -> None:
        from nlp_models.cpu import set_torch_threads

        set_torch_threads(threads)
        self.endpoints = dict(endpoints)

    def ready(self) -> None:
        """Answering it means the actor is up and its shard unpickled."""

    def broadcast(self, broadcasts: Mapping[int, Any]) -> dict[int, tuple[Any, Any]]:
        out = {}
        for c, b in broadcasts.items():
            ready, inputs, _upload = self.endpoints[c].on_broadcast(b)   # the Upload stays here
            out[c] = (ready, inputs)
        return out

    def evaluate(self, parameters: Mapping[int, Mapping[str, np.ndarray]], round: int) -> dict[int, dict[str, float]]:
        return {c: self.endpoints[c].on_evaluate(p, round=round) for c, p in parameters.items()}

    def call(self, client: int, method: str, *args: Any) -> Any:
        return getattr(self.endpoints[client], method)(*args)

    def attribute(self, client: int, name: str) -> Any:
        return getattr(self.endpoints[client], name)


class RayEndpoint:
    """The driver's handle on one remote client, with `ClientEndpoint`'s interface (blocking calls)."""

    def __init__(self, ray: Any, worker: Any, client_id: int) -> None:
        self._ray, self._worker, self.client_id = ray, worker, client_id

    def on_broadcast(self, broadcast: Any) -> tuple[Any, Any, None]:
        ready, inputs = self._ray.get(self._worker.broadcast.remote({self.client_id: broadcast}))[self.client_id]
        return ready, inputs, None

    def on_evaluate(self, parameters: Mapping[str, np.ndarray], *, round: int) -> dict[str, float]:
        return self._ray.get(self._worker.evaluate.remote({self.client_id: parameters}, round))[self.client_id]

    def state_dict(self) -> dict[str, Any]:
        return self._ray.get(self._worker.call.remote(self.client_id, "state_dict"))

    def load_state_dict(self, blob: Mapping[str, Any]) -> None:
        self._ray.get(self._worker.call.remote(self.client_id, "load_state_dict", blob))

    @property
    def state(self) -> dict[str, Any]:
        return self._ray.get(self._worker.attribute.remote(self.client_id, "state"))


class RayClients:
    """Clients sharded over `workers` Ray actors; `broadcast_all` / `evaluate_all` run the shards in parallel."""

    def __init__(self, endpoints: Mapping[int, Any], *, address: str | None = None, workers: int | None = None,
                 threads: int = 1) -> None:
        ray = require_ray()
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
        cpus = int(ray.cluster_resources().get("CPU", 1))
        count = max(1, min(workers or max(cpus // max(threads, 1), 1), len(endpoints)))
        ids = sorted(endpoints)
        shards = [ids[k::count] for k in range(count)]
        actor = ray.remote(num_cpus=threads)(_Worker)
        self.ray = ray
        self.workers = [actor.remote({c: endpoints[c] for c in shard}, threads) for shard in shards]
        self.worker_of = {c: self.workers[k] for k, shard in enumerate(shards) for c in shard}
        self.endpoints = {c: RayEndpoint(ray, self.worker_of[c], c) for c in ids}
        # Wait for every actor to start and unpickle its shard, so a broken client fails here rather than
        # mid-round, and round times do not include the actors' start.
        ray.get([w.ready.remote() for w in self.workers])

    def _by_worker(self, items: Mapping[int, Any]) -> dict[Any, dict[int, Any]]:
        grouped: dict[Any, dict[int, Any]] = {}
        for c, item in items.items():
            grouped.setdefault(self.worker_of[c], {})[c] = item
        return grouped

    def broadcast_all(self, broadcasts: Mapping[int, Any]) -> dict[int, tuple[Any, Any]]:
        futures = [w.broadcast.remote(items) for w, items in self._by_worker(broadcasts).items()]
        out: dict[int, tuple[Any, Any]] = {}
        for part in self.ray.get(futures):
            out.update(part)
        return out

    def evaluate_all(self, parameters: Mapping[int, Mapping[str, np.ndarray]], *, round: int) -> dict[int, dict[str, float]]:
        futures = [w.evaluate.remote(items, round) for w, items in self._by_worker(parameters).items()]
        out: dict[int, dict[str, float]] = {}
        for part in self.ray.get(futures):
            out.update(part)
        return out

    def shutdown(self) -> None:
        for w in self.workers:
            self.ray.kill(w)
        self.workers = []


__all__ = ["require_ray", "RayEndpoint", "RayClients"]
