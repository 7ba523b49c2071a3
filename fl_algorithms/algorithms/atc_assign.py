"""ATC's ASSIGN aggregation (Assign-Then-Contrast, Sec. 3.2) where the server never sees one client's
update and never learns who is in which cluster.

The paper (and its public code, FederatedScope `ATCAggregator`) clusters the clients every round by
agglomerative clustering (cosine, average linkage) of their raw updates and averages each client's
model with its cluster. Here the clustering is a federated spherical k-means on public sketches of
the updates, with every assignment kept on its client (research/dp_leakage.md Sec. 3.2):

    server broadcasts  K cluster models w_k, the open centroids mu_k (unit vectors in R^p) and
                       rho = P mean_j Delta_j of the last round (P: public p x d JL matrix)
    client i           trains from w_{a_i} (a_i: its private assignment), Delta_i = w_i' - w_{a_i}
                       c_i = unit(P Delta_i^{prev} - rho)        its previous update, centred by that
                                                                 round's cohort mean (exactly: P is linear)
                       a_i' = argmax_k <c_i, mu_k> over the open clusters
                       uploads Masked(Delta_i, cluster=a_i) and Masked(c_i, cluster=a_i'), K blocks each
    server             w_k <- w_k + mean of the Delta in block k              (secure sum "update")
                       mu_k <- unit(sum of the c in block k)                  (secure sum "assign")
                       a cluster whose block is empty closes

Round 1 warms up: everyone trains w_0, and every w_k starts from the result. Centring matters: raw
update sketches share the cohort's common direction and all land in one cluster. When the guard
refuses the "assign" sum (some block below `min_size`; the server cannot tell which), the two closest
open centroids merge; a round in which every sum was refused never reaches `server_update`, so the
open set is also reduced once per such round (`active`). The run therefore always settles on clusters
the guard accepts, at worst one cluster of the whole cohort (greedy: it can merge more than needed).

What the server learns: per cluster, the weighted mean update and the sum of sketches and the member
count, each over at least `min_size` clients (the disclosure guard refuses a smaller non-empty block,
which fails that round's sum and leaves the state as it was); never an individual update, sketch or
assignment. No DP noise is added to the per-cluster sums yet (cluster-indexed parts under distributed
DP are not supported by the secure layer): the protection is the minimum group size.

SIMPLIFICATION relative to the paper: k-means with private assignments replaces agglomerative
clustering on raw updates (which needs every pairwise similarity, i.e. individual updates); one
model per cluster replaces one model per client.
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dp.samplers import CryptoRandom, gaussian
from dp.sketches import projection_matrix
from fl_algorithms.api import AggregateView, Algorithm, Broadcast, ClientContext, Masked, RoundPlan, SumSpec, Upload

SKETCH_PART = "sketch"
_INIT_DOMAIN = b"fedsecure-nlp/atc-assign/centroids/v1"


def _initial_centroids(*, clusters: int, dim: int, seed: int) -> np.ndarray:
    key = hashlib.sha256(_INIT_DOMAIN + seed.to_bytes(8, "big")).digest()
    rows = gaussian(1.0, clusters * dim, CryptoRandom(key)).reshape(clusters, dim)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def _unit(v: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0 else v


class SecureAssign(Algorithm[dict]):
    """Per-cluster FedAvg with private, sketch-based cluster assignments (see the module docstring)."""

    name = "atc_assign"

    def __init__(self, *, clusters: int = 5, sketch_dim: int = 32, min_size: int = 5, local_epochs: int = 1,
                 seed: int = 0) -> None:
        if clusters < 1 or sketch_dim < 1 or min_size < 2 or local_epochs < 1:
            raise ValueError("need clusters >= 1, sketch_dim >= 1, min_size >= 2, local_epochs >= 1")
        self.clusters, self.sketch_dim, self.min_size = clusters, sketch_dim, min_size
        self.local_epochs, self.seed = local_epochs, seed
        self._projection: np.ndarray | None = None

    # ---- shared helpers -------------------------------------------------------------------------
    def projection(self, dim: int) -> np.ndarray:
        """The public JL matrix (p x d), a function of the public seed."""
        if self._projection is None or self._projection.shape[1] != dim:
            self._projection = projection_matrix(seed=self.seed, sketch_dim=self.sketch_dim, dim=dim)
        return self._projection


    # ---- server ---------------------------------------------------------------------------------
    def init_state(self, *, initial: Mapping[str, np.ndarray]) -> dict[str, Any]:
        models = {f"{part}@{k}": np.asarray(v, dtype=np.float32).ravel().copy()
                  for part, v in initial.items() for k in range(self.clusters)}
        return {"parts": sorted(initial), "models": models, "active": [True] + [False] * (self.clusters - 1),
                "centroids": _initial_centroids(clusters=self.clusters, dim=self.sketch_dim, seed=self.seed),
                "reference": np.zeros(self.sketch_dim), "warm": True, "updated_round": 0}

    def active(self, state: dict[str, Any], round: int) -> list[bool]:
        """The clusters open in `round`: the state's, less one merge per round since the last update (a
        round whose every sum the guard refused never reaches server_update, so the state cannot)."""
        active = list(state["active"])
        for _ in range(max(0, round - 1 - int(state["updated_round"]))):
            active = self._merge(active, state["centroids"])
        return active

    def configure_round(self, *, round: int, state: dict[str, Any], cohort: Sequence[int] = ()) -> RoundPlan:
        centroids = np.where(np.asarray(self.active(state, round))[:, None], state["centroids"], 0.0)
        common = {**state["models"], "centroids": centroids.ravel(), "reference": state["reference"]}
        return RoundPlan(broadcast=Broadcast(common=common),
                         sums=(SumSpec(name="update", members=frozenset(cohort), parts=tuple(state["parts"]),
                                       min_size=self.min_size),
                               SumSpec(name="assign", members=frozenset(cohort), parts=(SKETCH_PART,),
                                       min_size=self.min_size)))

    def server_update(self, *, state: dict[str, Any], view: AggregateView) -> dict[str, Any]:
        new = {**state, "models": dict(state["models"]), "active": self.active(state, view.round),
               "updated_round": view.round}
        updates = view.sums.get("update", {})
        if updates:   # the sketch of this round's mean update centres the next round's sketches
            mean = np.concatenate([self._overall_mean(updates, p) for p in state["parts"]])
            new["reference"] = self.projection(mean.size) @ mean
        if state["warm"]:   # round 1: everyone in cluster 0; afterwards all K public centroids compete
            new["warm"] = not updates
            new["active"] = [True] * self.clusters if updates else list(state["active"])
            new = self._apply_updates(new, state, updates)
            for part in state["parts"]:         # every cluster starts from the warmed-up model
                for k in range(1, self.clusters):
                    new["models"][f"{part}@{k}"] = new["models"][f"{part}@0"].copy()
            return new
        new = self._apply_updates(new, state, updates)
        sketches = view.sums.get("assign", {})
        if sketches:
            centroids = np.array(state["centroids"])
            for k in range(self.clusters):
                block = sketches.get(f"{SKETCH_PART}[{k}]")
                count = 0 if block is None else block.count
                if count >= self.min_size:
                    centroids[k] = block.mean / max(float(np.linalg.norm(block.mean)), 1e-12)
                new["active"][k] = count >= self.min_size   # an empty or too-small cluster retires
            if not any(new["active"]):          # every cluster too small: start again from all of them
                new["active"] = [True] * self.clusters
            new["centroids"] = centroids
        elif "assign" in view.failed:
            new["active"] = self._merge(new["active"], state["centroids"])
        return new

    def _overall_mean(self, updates: Mapping[str, Any], part: str) -> np.ndarray:
        """The cohort's weighted mean of `part`, from its cluster blocks (sum_k W_k mean_k / sum_k W_k)."""
        blocks = [updates[f"{part}[{k}]"] for k in range(self.clusters) if updates[f"{part}[{k}]"].count > 0]
        total = sum(b.total_weight for b in blocks)
        return sum(b.total_weight * np.asarray(b.mean, dtype=np.float64) for b in blocks) / total

    def _apply_updates(self, new: dict[str, Any], state: dict[str, Any], updates: Mapping[str, Any]) -> dict[str, Any]:
        for part in state["parts"]:
            for k in range(self.clusters):
                block = updates.get(f"{part}[{k}]")
                if block is not None and block.count > 0:
                    new["models"][f"{part}@{k}"] = state["models"][f"{part}@{k}"] + block.mean.astype(np.float32)
        return new

    def _merge(self, active: Sequence[bool], centroids: np.ndarray) -> list[bool]:
        """After a refused assignment sum (some cluster below `min_size`; the server cannot tell which):
        retire one of the two most similar open centroids, so that a run always ends with clusters the
        guard accepts (one cluster of the whole cohort at worst)."""
        active = list(active)
        ids = [k for k in range(self.clusters) if active[k]]
        if len(ids) < 2:
            return active
        c = np.asarray(centroids)
        _, _, retired = max((float(c[a] @ c[b]), a, b) for i, a in enumerate(ids) for b in ids[i + 1:])
        active[retired] = False
        return active

    # ---- client ---------------------------------------------------------------------------------
    def _own_model(self, broadcast: Mapping[str, np.ndarray], cluster: int, parts: Sequence[str]) -> dict[str, np.ndarray]:
        return {part: np.array(broadcast[f"{part}@{cluster}"], copy=True) for part in parts}

    def local_work(self, *, broadcast, client: ClientContext, cluster: int) -> Mapping[str, float]:
        """The client's local training from its cluster's model (ATC's ASSIGN: the assigned objective)."""
        return client.trainer.train(epochs=self.local_epochs, round=client.round)

    def client_update(self, *, broadcast, client: ClientContext) -> tuple[Upload, Mapping[str, Any]]:
        trainer = client.trainer
        parts = sorted(trainer.get_shared())
        current = int(client.state.get("cluster", 0))
        start = self._own_model(broadcast, current, parts)
        trainer.set_shared(start)
        metrics = dict(self.local_work(broadcast=broadcast, client=client, cluster=current))
        trained = trainer.get_shared()
        deltas = {part: trained[part] - start[part] for part in parts}
        raw = self.projection(sum(deltas[p].size for p in parts)) @ np.concatenate(
            [deltas[p].ravel() for p in parts]).astype(np.float64)
        previous = client.state.get("last_sketch")
        # last round's update, centred by last round's cohort mean (both sketched with the public P)
        s = _unit(raw if previous is None else np.asarray(previous) - np.asarray(broadcast["reference"]))
        centroids = np.asarray(broadcast["centroids"]).reshape(self.clusters, self.sketch_dim)
        active = np.linalg.norm(centroids, axis=1) > 0
        scores = np.where(active, centroids @ s, -np.inf)
        chosen = int(np.argmax(scores))
        masked = {part: Masked(deltas[part], weight=trainer.num_examples, cluster=current, clusters=self.clusters)
                  for part in parts}
        masked[SKETCH_PART] = Masked(s, weight=1.0, cluster=chosen, clusters=self.clusters)
        return Upload(masked=masked, metrics={**metrics, "switched": float(chosen != current)}), \
            {**client.state, "cluster": chosen, "last_sketch": raw}

    def evaluate(self, *, parameters: Mapping[str, np.ndarray], client: ClientContext, split: str) -> dict[str, float]:
        """A client evaluates the model of the cluster it belongs to (its private assignment)."""
        parts = sorted(client.trainer.get_shared())
        if parameters:
            client.trainer.set_shared(self._own_model(parameters, int(client.state.get("cluster", 0)), parts))
        return client.trainer.evaluate(split=split)


__all__ = ["SKETCH_PART", "SecureAssign"]
