"""ATC, Assign-Then-Contrast (ATC paper, Sec. 3), where the server never sees one client's update,
representation or cluster.

Rounds 1..R_a, ASSIGN (`AssignStage`, on `atc_assign.SecureAssign`): per-cluster models from
cluster-indexed secure sums, clusters from a federated k-means on public sketches of the updates with
every assignment kept on its client. Each round the server draws, per cluster, a pre-training
objective o_k in {MLM, denoising} by a public coin (seeded by the run seed and round); every client
trains its cluster's model on its own inputs with its cluster's objective. (The paper assigns an
objective per client group; its public code draws one for all clients: we follow the paper.)

In round R_a each client also releases a DP JL sketch (`dp.sketches.DPSketcher`, example level, one
release, charged to the ledger) of the mean embedding of its training inputs under its model. The
server ranks clients by the cosine of these noisy sketches: N_i the top-K, F_i the K farthest.

Rounds R_a+1.., CONTRAST. The synthetic inputs x_1..x_M are public texts held by no client (the
construction: every client encodes the same public inputs with its own model; nothing private is an
input). Client i's representation h_i(k) = mean-pooled top-layer states of x_k. Then

    positives   p_i(k) = mean_{j in N_i} h_j(k)         one secure sum over N_i       (Eq. 3)
    negatives   n_i(k) = mean_{j in F_i} h_j(k)         one secure sum over F_i
    L_i         = L_task + lambda_c * mean_k -log e^{cos(h_i, p_i)/tau} / (e^{cos(h_i, p_i)/tau} + e^{cos(h_i, n_i)/tau})
    model       w_i <- w_i + sum_{j in C_i+} |D_j| Delta_j / |D_{C_i+}|,  C_i+ = {i} + N_i         (Eq. 4)

each a secure group sum, never an individual vector. w_i lives on client i (the server sends it only
the group's mean update); targets and updates of round t come from the sums of round t-1, and the
first CONTRAST round starts from the client's cluster model with no contrast term.

Overlapping group sums can reveal an individual (two sums over A and A + {i} give x_i; research
dp_leakage.md Sec. 3.4). The server plans the groups with the disclosure guard's own rule
(`guarded_groups`): each client's wanted group is kept only if the family of groups summed so far
stays free of exposure (every leverage <= 0.99, at least `min_size` members); otherwise the client
gets the already-summed group closest to its wish (a sum already in the span reveals nothing new), or
everyone. The secure layer's guard checks every sum again at release.

What the server learns: per-cluster means and member counts (ASSIGN), one noisy sketch per client
(epsilon in the ledger), and per-group means over guarded groups of >= `min_size` clients.

SIMPLIFICATIONS relative to the paper (stated in docs/simplifications.md): k-means with private assignments
replaces agglomerative clustering of raw updates; neighbours come from one DP sketch of the client's
data embedding (after ASSIGN) rather than from each round's raw model updates; the negative is the
mean over the K farthest clients (one group sum) where the paper sums over every other client
individually; the public inputs are public text rather than mixtures of the clients' own features;
the group sums carry no DP noise (the protection is the guard: minimum size and no exposure).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dp.sketches import DPSketcher, SketchRefused
from fl_algorithms.algorithms.atc_assign import SecureAssign
from fl_algorithms.api import AggregateView, Algorithm, Broadcast, ClientContext, Masked, RoundPlan, SumSpec, Upload
from fl_algorithms.training.hetero_trainer import ContrastTargets
from secagg.disclosure_guard import DisclosureError, DisclosureGuard, GuardConfig

OBJECTIVES = ("mlm", "denoise")
SKETCH = "neighbour_sketch"
REP = "rep"


def objectives_for(*, seed: int, round: int, clusters: int) -> np.ndarray:
    """The public coin: per cluster, 0 (MLM) or 1 (denoising) for this round."""
    return np.random.default_rng([seed, round, 0xA7C]).integers(0, 2, size=clusters)


def neighbour_sets(sketches: Mapping[int, np.ndarray], *, k: int) -> tuple[dict[int, tuple[int, ...]], dict[int, tuple[int, ...]]]:
    """(top-k most similar, k least similar) other clients per client, by cosine of their sketches."""
    ids = sorted(sketches)
    if len(ids) < k + 1:
        raise ValueError(f"{len(ids)} sketches cannot give each client {k} neighbours")
    m = np.stack([np.asarray(sketches[i], dtype=np.float64) for i in ids])
    m /= np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-12)
    sims = m @ m.T
    near, far = {}, {}
    for row, i in enumerate(ids):
        others = [(float(sims[row, col]), j) for col, j in enumerate(ids) if j != i]
        others.sort(key=lambda t: (-t[0], t[1]))
        near[i] = tuple(sorted(j for _, j in others[:k]))
        far[i] = tuple(sorted(j for _, j in others[-k:]))
    return near, far


def guarded_groups(wanted: Sequence[tuple[int, frozenset[int]]], *, everyone: frozenset[int], min_size: int,
                   max_leverage: float = 0.99) -> list[frozenset[int]]:
    """The group each (owner, wanted group) gets, in order, so that the family of distinct groups passes
    the disclosure guard (no member's leverage above `max_leverage`, every group >= `min_size`): the
    wanted group if the guard accepts it, else the accepted group containing the owner (if any) that
    overlaps the wish most, else everyone, else the accepted group overlapping most."""
    guard = DisclosureGuard(GuardConfig(min_cohort=min_size, max_leverage=max_leverage))
    accepted: list[frozenset[int]] = []

    def accept(group: frozenset[int]) -> bool:
        if group in accepted:
            return True
        try:
            guard.authorize("plan", sorted(group))
        except DisclosureError:
            return False
        accepted.append(group)
        return True

    out = []
    for owner, group in wanted:
        if accept(group):
            out.append(group)
            continue
        def overlap(g: frozenset[int]) -> tuple[bool, float]:
            return owner in g, len(g & group) / len(g | group)
        ranked = sorted(accepted, key=overlap, reverse=True)
        if ranked and overlap(ranked[0])[0]:
            out.append(ranked[0])
        elif accept(everyone):
            out.append(everyone)
        elif ranked:
            out.append(ranked[0])
        else:
            raise ValueError(f"no group the guard accepts for client {owner} (cohort of {len(everyone)}, "
                             f"min_size {min_size})")
    return out


class AssignStage(SecureAssign):
    """SecureAssign whose local work is, up to round `pretrain_rounds`, one step of the cluster's
    assigned pre-training objective (`trainer.pretrain`), and task training afterwards."""

    def __init__(self, *, pretrain_rounds: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pretrain_rounds = pretrain_rounds

    def configure_round(self, *, round: int, state: dict[str, Any], cohort: Sequence[int] = ()) -> RoundPlan:
        plan = super().configure_round(round=round, state=state, cohort=cohort)
        objectives = objectives_for(seed=self.seed, round=round, clusters=self.clusters).astype(np.float32)
        return RoundPlan(broadcast=Broadcast(common={**plan.broadcast.common, "objectives": objectives}),
                         sums=plan.sums)

    def local_work(self, *, broadcast, client: ClientContext, cluster: int) -> Mapping[str, float]:
        if client.round <= self.pretrain_rounds:
            objective = OBJECTIVES[int(broadcast["objectives"][cluster])]
            return client.trainer.pretrain(objective=objective, round=client.round)
        return client.trainer.train(epochs=self.local_epochs, round=client.round)


@dataclass(frozen=True)
class ATCConfig:
    assign_rounds: int = 3
    clusters: int = 5
    sketch_dim: int = 32
    """Dimension of ASSIGN's public update sketches (k-means)."""
    min_size: int = 5
    """Fewest clients in any released group (cluster, neighbour group): the disclosure guard's minimum."""
    top_k: int = 5
    contrast: bool = True
    """False: the ASSIGN-only ablation (per-cluster task training after ASSIGN)."""
    local_epochs: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.assign_rounds < 1 or self.clusters < 1 or self.top_k < 1 or self.local_epochs < 1:
            raise ValueError("need assign_rounds, clusters, top_k and local_epochs >= 1")
        if self.min_size < 2 or self.top_k < self.min_size - 1:
            raise ValueError(f"need min_size >= 2 and top_k >= min_size - 1 (C+ has top_k + 1 members), "
                             f"got top_k {self.top_k}, min_size {self.min_size}")


class ATC(Algorithm[dict]):
    """ASSIGN then CONTRAST (see the module docstring); `sketcher` releases the neighbour sketches."""

    name = "atc"
    description = "ATC (Assign-Then-Contrast) with private clusters, DP-sketch neighbours and guarded group sums"

    def __init__(self, config: ATCConfig, *, sketcher: DPSketcher | None = None) -> None:
        if config.contrast and sketcher is None:
            raise ValueError("CONTRAST needs a DPSketcher for the neighbour sketches")
        self.config, self.sketcher = config, sketcher
        self.assign = AssignStage(pretrain_rounds=config.assign_rounds, clusters=config.clusters,
                                  sketch_dim=config.sketch_dim, min_size=config.min_size,
                                  local_epochs=config.local_epochs, seed=config.seed)
        self.releases = {SKETCH: sketcher} if config.contrast else {}

    def contrasting(self, round: int) -> bool:
        return self.config.contrast and round > self.config.assign_rounds

    # ---- server ---------------------------------------------------------------------------------
    def init_state(self, *, initial: Mapping[str, np.ndarray]) -> dict[str, Any]:
        return {"assign": self.assign.init_state(initial=initial), "parts": sorted(initial),
                "near": {}, "far": {}, "updates": {}, "positive": {}, "negative": {}, "groups": {}}

    def plan_groups(self, state: dict[str, Any], cohort: Sequence[int]) -> tuple[list[frozenset[int]], list[frozenset[int]], dict[int, dict[str, int]]]:
        """(model groups, representation groups, per client the index of its C+ group, positive group and
        negative group): a pure function of the state and the cohort, so that server_update re-derives
        what configure_round planned."""
        cohort = sorted(cohort)
        everyone, k = frozenset(cohort), self.config.min_size
        near = {i: frozenset(state["near"][i]) if i in state["near"] else everyone for i in cohort}
        far = {i: frozenset(state["far"][i]) if i in state["far"] else everyone for i in cohort}
        # a client without a sketch (refused as too noisy) wants everyone: FedAvg's update, no contrast
        models = guarded_groups([(i, near[i] | {i}) for i in cohort], everyone=everyone, min_size=k)
        reps = guarded_groups([(i, near[i]) for i in cohort] + [(i, far[i]) for i in cohort], everyone=everyone,
                              min_size=k)
        model_groups, rep_groups = list(dict.fromkeys(models)), list(dict.fromkeys(reps))
        index = {i: {"model": model_groups.index(models[n]), "positive": rep_groups.index(reps[n]),
                     "negative": rep_groups.index(reps[len(cohort) + n])} for n, i in enumerate(cohort)}
        return model_groups, rep_groups, index

    def configure_round(self, *, round: int, state: dict[str, Any], cohort: Sequence[int] = ()) -> RoundPlan:
        if not self.contrasting(round) or not state["near"]:
            return self.assign.configure_round(round=round, state=state["assign"], cohort=cohort)
        model_groups, rep_groups, _ = self.plan_groups(state, cohort)
        k = self.config.min_size
        sums = tuple(SumSpec(name=f"a{j}", members=g, parts=tuple(state["parts"]), min_size=k)
                     for j, g in enumerate(model_groups)) + \
            tuple(SumSpec(name=f"r{j}", members=g, parts=(REP,), min_size=k) for j, g in enumerate(rep_groups))
        per_client = {}
        for i in cohort:
            own = {f"update.{p}": v for p, v in state["updates"].get(i, {}).items()}
            if i in state["positive"] and i in state["negative"]:
                own.update(positive=state["positive"][i], negative=state["negative"][i])
            per_client[i] = own
        # the cluster models go out while a client may still start from its (private) cluster's
        common = {"contrast": np.ones(1, dtype=np.float32), **dict(state["assign"]["models"])}
        return RoundPlan(broadcast=Broadcast(common=common, per_client=per_client), sums=sums)

    def server_update(self, *, state: dict[str, Any], view: AggregateView) -> dict[str, Any]:
        round = view.round
        if not self.contrasting(round) or not state["near"]:
            new = {**state, "assign": self.assign.server_update(state=state["assign"], view=view)}
            sketches = view.released.get(SKETCH, {})
            if self.config.contrast and len(sketches) > self.config.top_k:
                near, far = neighbour_sets({c: np.asarray(r.payload) for c, r in sketches.items()},
                                           k=self.config.top_k)
                new.update(near=near, far=far)
            return new
        # the cohort was everyone who contributed (simulation: full participation, no dropout)
        _, _, index = self.plan_groups(state, sorted(view.contributors))
        new = {**state, "updates": {}, "positive": dict(state["positive"]), "negative": dict(state["negative"]),
               "groups": index}
        for i, g in index.items():
            agg = view.sums.get(f"a{g['model']}")
            if agg:   # Eq. 4: the |D|-weighted mean update over C_i+, applied by client i to its own model
                new["updates"][i] = {p: agg[p].mean.astype(np.float32) for p in state["parts"]}
            pos, neg = view.sums.get(f"r{g['positive']}"), view.sums.get(f"r{g['negative']}")
            if pos and neg:
                new["positive"][i] = pos[REP].mean.astype(np.float32)
                new["negative"][i] = neg[REP].mean.astype(np.float32)
        return new

    def client_parameters(self, *, state: dict[str, Any], client_id: int) -> Mapping[str, np.ndarray]:
        update = state["updates"].get(client_id)
        if update is not None:
            return {f"update.{p}": v for p, v in update.items()}
        return state["assign"]["models"]

    def shared_parameters(self, state: dict[str, Any]) -> Mapping[str, np.ndarray]:
        return state["assign"]["models"]

    # ---- client ---------------------------------------------------------------------------------
    def client_update(self, *, broadcast, client: ClientContext) -> tuple[Upload, Mapping[str, Any]]:
        if "contrast" not in broadcast:    # ASSIGN (or the ASSIGN-only ablation's task rounds)
            upload, state = self.assign.client_update(broadcast=broadcast, client=client)
            if client.round == self.config.assign_rounds and self.config.contrast:
                try:
                    released = {SKETCH: client.release(SKETCH, documents=client.trainer.document_embeddings())}
                except SketchRefused:   # too noisy to rank anyone: nothing released, no epsilon spent
                    return Upload(masked=upload.masked, metrics={**upload.metrics, "sketch_refused": 1.0}), state
                upload = Upload(masked=upload.masked, released=released, metrics=upload.metrics)
            return upload, state
        trainer = client.trainer
        parts = sorted(trainer.get_shared())
        start = self._model_for(broadcast, client, parts)                       # w_i^t
        trainer.set_shared(start)
        targets = None
        if "positive" in broadcast:
            shape = (-1, trainer.public.hidden.shape[-1])
            targets = ContrastTargets(np.asarray(broadcast["positive"]).reshape(shape),
                                      np.asarray(broadcast["negative"]).reshape(shape))
        metrics = dict(trainer.train(epochs=self.config.local_epochs, round=client.round, contrast=targets))
        trained = trainer.get_shared()
        masked = {p: Masked(trained[p] - start[p], weight=trainer.num_examples) for p in parts}
        masked[REP] = Masked(trainer.represent().ravel(), weight=1.0)
        return Upload(masked=masked, metrics=metrics), {**client.state, "personal": start}

    def _model_for(self, parameters: Mapping[str, np.ndarray], client: ClientContext,
                   parts: Sequence[str]) -> dict[str, np.ndarray]:
        """Client i's model w_i: its own from the last CONTRAST round plus the group update the server
        sent (Eq. 4), or, before its first CONTRAST round, its (private) cluster's model."""
        personal = client.state.get("personal")
        if personal is None:
            cluster = int(client.state.get("cluster", 0))
            return {p: np.array(parameters[f"{p}@{cluster}"], copy=True) for p in parts}
        return {p: np.asarray(personal[p]) + (np.asarray(parameters[f"update.{p}"]) if f"update.{p}" in parameters else 0.0)
                for p in parts}

    def evaluate(self, *, parameters: Mapping[str, np.ndarray], client: ClientContext, split: str) -> dict[str, float]:
        if parameters:
            client.trainer.set_shared(self._model_for(parameters, client, sorted(client.trainer.get_shared())))
        return client.trainer.evaluate(split=split)


__all__ = ["OBJECTIVES", "SKETCH", "REP", "objectives_for", "neighbour_sets", "guarded_groups", "AssignStage", "ATCConfig",
           "ATC"]
