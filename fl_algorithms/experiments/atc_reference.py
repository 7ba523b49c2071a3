"""INSECURE reference ATC, flagged: the server sees every client's update and representations, as in the
paper's public code. It exists to measure what the secure version's privacy costs and is never a
default; it cannot run inside the secure engine (which never hands server code an individual vector),
so it is a plain loop over the same trainers, with the same rounds, objectives and hyper-parameters.

    ASSIGN    the server clusters the clients by agglomerative clustering (scikit-learn, cosine, average
              linkage) of their raw pre-training updates, each cluster's model the mean of its members'
    CONTRAST  every round the server ranks clients by the cosine of their latest raw model updates (as
              the paper); positives / negatives are the exact means of the top-K's / K farthest's raw
              representations of the public inputs;
              w_i <- w_i + the |D|-weighted mean update of C_i+ = {i} + top-K (Eq. 4)

Every individual vector the server reads is counted (`individual vectors seen`).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from sklearn.cluster import AgglomerativeClustering
from tqdm.auto import tqdm

from fl_algorithms.algorithms.atc import OBJECTIVES, neighbour_sets, objectives_for
from fl_algorithms.training.hetero_trainer import ContrastTargets, HeteroTrainer


def _flat(parts: Mapping[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([parts[p] for p in sorted(parts)])


def _mean_model(models: list[Mapping[str, np.ndarray]], weights: list[float]) -> dict[str, np.ndarray]:
    return {p: np.average([m[p] for m in models], axis=0, weights=weights).astype(np.float32) for p in models[0]}


def run_reference(trainers: Mapping[int, HeteroTrainer], *, plan: Any, seed: int,
                  progress: bool = False) -> tuple[dict[int, dict[str, float]], list[float], int]:
    """(final test metrics per client, mean validation metric per round before the last, individual
    vectors the server saw)."""
    config = plan.atc
    ids = sorted(trainers)
    origin = trainers[ids[0]].get_shared()
    models: dict[int, dict[str, np.ndarray]] = {i: dict(origin) for i in ids}   # each client's current model
    seen, curve = 0, []
    previous: dict[int, ContrastTargets] = {}
    labels = {i: 0 for i in ids}                       # everyone in one cluster before the first clustering
    updates: dict[int, np.ndarray] = {}
    rounds = plan.atc.assign_rounds + plan.rounds
    for t in tqdm(range(1, rounds + 1), desc="atc_reference", disable=None if progress else True, leave=False):
        if t <= config.assign_rounds:
            coin = objectives_for(seed=seed, round=t, clusters=config.clusters)
            trained = {}
            for i in ids:
                trainers[i].set_shared(models[i])
                trainers[i].pretrain(objective=OBJECTIVES[int(coin[labels[i] % config.clusters])], round=t)
                trained[i] = trainers[i].get_shared()
                updates[i] = _flat(trained[i]) - _flat(models[i])
            seen += len(ids)
            k = min(config.clusters, len(ids))
            rows = np.stack([updates[i] for i in ids])
            if np.any(~rows.any(axis=1)):   # an update of exactly 0 (a round all warmup, lr 0) has no cosine:
                assign = np.array([labels[i] for i in ids])   # the clusters stay as they were
            else:
                assign = AgglomerativeClustering(n_clusters=k, metric="cosine", linkage="average").fit_predict(rows)
            for c in set(assign.tolist()):
                members = [i for i, a in zip(ids, assign) if a == c]
                mean = _mean_model([trained[i] for i in members], [float(trainers[i].num_examples) for i in members])
                for i in members:
                    models[i] = dict(mean)
            labels = {i: int(a) for i, a in zip(ids, assign)}
        else:
            reps = {}
            for i in ids:
                trainers[i].set_shared(models[i])
                reps[i] = trainers[i].represent()
            seen += len(ids)
            # the paper's ranking: cosine of the clients' latest raw model updates
            near, far = neighbour_sets(updates, k=config.top_k)
            deltas = {}
            for i in ids:
                trainers[i].set_shared(models[i])
                trainers[i].train(epochs=config.local_epochs, round=t, contrast=previous.get(i))
                trained = trainers[i].get_shared()
                deltas[i] = {p: trained[p] - models[i][p] for p in trained}
                updates[i] = _flat(deltas[i])
            seen += len(ids)
            previous = {i: ContrastTargets(np.mean([reps[j] for j in near[i]], axis=0),
                                           np.mean([reps[j] for j in far[i]], axis=0)) for i in ids}
            weights = {i: float(trainers[i].num_examples) for i in ids}
            for i in ids:                                            # Eq. 4, with the exact individual updates
                group = (i,) + near[i]
                total = sum(weights[j] for j in group)
                models[i] = {p: (models[i][p] + sum(weights[j] * deltas[j][p] for j in group) / total).astype(np.float32)
                             for p in models[i]}
        if t < rounds:
            scores = []
            for i in ids:
                trainers[i].set_shared(models[i])
                scores.append(float(trainers[i].evaluate(split="validation")[trainers[i].metric]))
            curve.append(float(np.mean(scores)))
    final = {}
    for i in ids:
        trainers[i].set_shared(models[i])
        final[i] = trainers[i].evaluate(split="test")
    return final, curve, seen


__all__ = ["run_reference"]
