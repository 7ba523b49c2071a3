"""FedSeIT with SIT (Chaudhary et al., 2022), FedWeIT (Yoon et al., 2021) and their continual baselines,
with B through secure aggregation, private task descriptors and foreign adaptives relayed sealed.

Every client c learns its tasks t = 0, 1, ... one after another (`Schedule`: `rounds_per_task` rounds
each) with the decomposed CNN of `nlp_models.decomposed_cnn`, theta_t = B ⊙ sigmoid(m_t) + A_t.

    server:  B^{r+1} = B^r + sum_c n_c (B_c - B^r) / sum_c n_c          (FedAvg of B; a secure sum;
             FedProx optional: clients add mu/2 ||B - B^r||^2 to their loss)
    SIT:     d_(c,t) = DP centres of task t's documents                 (`dp.centroids`, per-client release)
             s((c,t), (j,u)) = sum_{cos(x, y) > 0.7} cos(x, y) / (n1 n2) over centre pairs x of d_(c,t), y of d_(j,u)
             F_(c,t) = top-K of s over the foreign candidates, alpha^0 = s / sum s   (``--et-init-alphas``)
    client:  the foreign adaptives A_(j,u) of F_(c,t) enter its model (FedSeIT: one convolution each,
             FedWeIT: summed into the kernel) with trainable alphas

Candidates for (c, t) are the tasks any client has announced and started, the client's own earlier tasks
included and its current and future tasks excluded (the reference's `get_top_adapts`). `selection`
'random' draws the K candidates uniformly (the SIT ablation); 'all' is FedSeIT without SIT: every
candidate enters, unranked, with equal initial alphas (no descriptor is released: nothing is scored;
the candidates are the tasks every client has started, by the public schedule); FedWeIT takes every
other client's current task's A from the previous round (its knowledge base); 'none' is FedAvg on B alone.

What leaves a client, and in which form (the reference sends all of it in the clear):
* B: a Masked delta, summed securely; the server sees only the weighted mean.
* Its task descriptors: `Released`, DP at example level (one document), charged to the ledger; the
  server never sees a document or its embedding (the reference sends real k-medoid documents).
* Its adaptive A_u: only to a client whose task the server matched to u, only if the owner consents,
  as a `Sealed` message (AES-GCM under a pairwise X25519 key, `engine.peer_channel`) that the server
  relays unread. The receiving client learns that A_u exactly (not DP): what a sparse task kernel
  trained on the owner's documents reveals about them is not bounded here; non-consenting clients are
  never selected and never send. The server learns who sends to whom and the sizes.

Timing (one round of relay latency each way): the descriptor of task u is released in the first round
of task u - 1 (task 0's and 1's in round 1); selection for the task a client trains in round r + 2 is
computed at the end of round r; owners seal in round r + 1 after training; the adaptives arrive with
the broadcast of round r + 2. So from task 1 on, foreign knowledge is there from a task's first round;
task 0 has it from round 3 when rounds_per_task >= 3 (never with 2), as the reference's knowledge base
is empty at the start. Requires rounds_per_task >= 2.
"""
from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fl_algorithms.algorithms.fedavg import FedAvg
from fl_algorithms.api import AggregateView, Broadcast, ClientContext, Masked, RoundPlan, Upload
from fl_algorithms.engine.peer_channel import PeerChannel, PeerDirectory
from fl_algorithms.training.continual_trainer import BASE_PART
from dp.centroids import DescriptorRefused, DPCentroids, rectified_linear_score
from secagg.crypto import DecryptionError

SELECTIONS = ("sit", "random", "all", "all_current", "none")
SIT_THRESHOLD = 0.7
"""The reference's rectified-linear scorer threshold (``--et-threshold`` default)."""
_MAGIC = b"FSA1"
_PURPOSE = "fcl-foreign-adaptive"


@dataclass(frozen=True)
class Schedule:
    """Task t is trained in rounds t * R + 1 .. (t + 1) * R (R = rounds_per_task)."""

    tasks: int
    rounds_per_task: int

    def __post_init__(self) -> None:
        if self.tasks < 1 or self.rounds_per_task < 2:
            raise ValueError(f"need tasks >= 1 and rounds_per_task >= 2, got {self.tasks}, {self.rounds_per_task}")

    @property
    def rounds(self) -> int:
        return self.tasks * self.rounds_per_task

    def task_of(self, round: int) -> int:
        if round < 1:
            raise ValueError(f"rounds start at 1, got {round}")
        return min((round - 1) // self.rounds_per_task, self.tasks - 1)

    def is_last_round(self, round: int) -> bool:
        return round % self.rounds_per_task == 0

    def announced(self, round: int) -> tuple[int, ...]:
        """Tasks whose descriptor a client releases in `round`: task u in the first round of task u - 1
        (tasks 0 and 1 in round 1)."""
        if round == 1:
            return tuple(range(min(2, self.tasks)))
        if (round - 1) % self.rounds_per_task == 0 and self.task_of(round) + 1 < self.tasks:
            return (self.task_of(round) + 1,)
        return ()


def descriptor_part(task: int) -> str:
    return f"descriptor{task}"


def pack_adaptive(task: int, adaptive: Mapping[str, torch.Tensor], names: Sequence[str]) -> bytes:
    """The plaintext of a relayed adaptive: magic, task id, then each kernel as float32 (names' order)."""
    return _MAGIC + struct.pack(">I", task) + b"".join(
        adaptive[n].detach().cpu().float().contiguous().numpy().tobytes() for n in names)


def unpack_adaptive(blob: bytes, shapes: Mapping[str, tuple[int, ...]]) -> tuple[int, dict[str, torch.Tensor]]:
    """Task id and kernels of a relayed adaptive; ValueError unless its size is exactly what `shapes`
    give and every value is finite (checked before anything is allocated from it)."""
    sizes = {n: int(np.prod(s)) for n, s in shapes.items()}
    if len(blob) != 8 + 4 * sum(sizes.values()) or blob[:4] != _MAGIC:
        raise ValueError(f"relayed adaptive has {len(blob)} bytes, expected {8 + 4 * sum(sizes.values())}")
    task = struct.unpack(">I", blob[4:8])[0]
    out, offset = {}, 8
    for name, shape in shapes.items():
        values = np.frombuffer(blob, dtype=np.float32, count=sizes[name], offset=offset)
        if not np.all(np.isfinite(values)):
            raise ValueError(f"relayed adaptive {name} is not finite")
        out[name] = torch.from_numpy(values.reshape(shape).copy())
        offset += 4 * sizes[name]
    return task, out


def _flat(pairs: Sequence[Sequence[float]], width: int) -> np.ndarray:
    return np.asarray(pairs, dtype=np.float64).reshape(-1, width).ravel()


def _rows(array: np.ndarray | None, width: int) -> list[list[float]]:
    return [] if array is None or array.size == 0 else np.asarray(array, dtype=np.float64).reshape(-1, width).tolist()


def max_candidates(schedule: Schedule, clients: int) -> int:
    """The most foreign tasks 'all' (FedSeIT without SIT) hands one client for one task: for task t >= 1
    the other clients' tasks 0..t-1 and the client's own, clients x t; for task 0 the other clients'
    first tasks. The foreign slots its model needs."""
    return max(clients - 1, clients * (schedule.tasks - 1), 1)


class FederatedContinual(FedAvg):
    """FedAvg of B plus a foreign-knowledge `selection` ('sit', 'random', 'all', 'all_current', 'none')."""

    name = "fedseit"

    def __init__(self, *, schedule: Schedule, selection: str = "sit", top_k: int = 3, local_epochs: int = 1,
                 descriptor: DPCentroids | None = None, peers: PeerDirectory | None = None, run: str = "run",
                 consent: frozenset[int] | None = None, threshold: float = SIT_THRESHOLD, seed: int = 0,
                 mu: float = 0.0) -> None:
        """`mu` > 0 adds FedProx's proximal term mu/2 ||B - B^r||^2 to every client's loss."""
        super().__init__(local_epochs=local_epochs)
        if not mu >= 0:
            raise ValueError(f"mu must be >= 0, got {mu}")
        self.mu = mu
        if selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {', '.join(SELECTIONS)}, got {selection!r}")
        if selection in ("sit", "random") and (descriptor is None or top_k < 1):
            raise ValueError(f"selection {selection!r} needs a descriptor mechanism and top_k >= 1")
        if selection != "none" and peers is None:
            raise ValueError(f"selection {selection!r} relays adaptives: give the peer directory")
        self.schedule, self.selection, self.top_k, self.threshold, self.seed = schedule, selection, top_k, threshold, seed
        self.descriptor, self.peers, self.run = descriptor, peers, run
        self.consent = None if consent is None else frozenset(int(c) for c in consent)
        if selection in ("sit", "random"):
            self.releases = {descriptor_part(t): descriptor for t in range(schedule.tasks)}

    def consents(self, client: int) -> bool:
        return self.consent is None or client in self.consent

    # ---- server ---------------------------------------------------------------------------------
    def init_state(self, *, initial: Mapping[str, np.ndarray]) -> dict[str, Any]:
        if set(initial) != {BASE_PART}:
            raise ValueError(f"{self.name} shares exactly the part {BASE_PART!r}, got {sorted(initial)}")
        return {**super().init_state(initial=initial), "descriptors": {}, "selection": {}, "requests": {}}

    def configure_round(self, *, round: int, state: dict[str, Any], cohort: Sequence[int] = ()) -> RoundPlan:
        per_client: dict[int, dict[str, np.ndarray]] = {}
        for client in cohort:
            parts = {}
            chosen = state["selection"].get(str(client), {}).get(str(self.schedule.task_of(round)))
            if chosen:
                parts["foreign"] = _flat(chosen, 3)
            if state["requests"].get(str(client)):
                parts["send"] = _flat(state["requests"][str(client)], 2)
            if parts:
                per_client[client] = parts
        return RoundPlan(broadcast=Broadcast(common={BASE_PART: state[f"params.{BASE_PART}"]}, per_client=per_client))

    def server_update(self, *, state: dict[str, Any], view: AggregateView) -> dict[str, Any]:
        new = super().server_update(state=state, view=view) if BASE_PART in view.groups else dict(state)
        descriptors = dict(state["descriptors"])
        for name, by_client in view.released.items():
            task = int(name.removeprefix("descriptor"))
            for client, released in by_client.items():
                descriptors[f"{client}:{task}"] = self._centres(np.asarray(released.payload))
        new["descriptors"] = descriptors
        selection = {c: dict(v) for c, v in state["selection"].items()}
        requests: dict[str, list[list[int]]] = {}
        r = view.round
        if self.selection == "all_current" and r + 1 <= self.schedule.rounds:
            clients = sorted(view.contributors)
            task = self.schedule.task_of(r + 1)   # the task every owner trains when it seals
            for owner in clients:
                if self.consents(owner):
                    requests[str(owner)] = [[c, task] for c in clients if c != owner]
        elif self.selection in ("sit", "random", "all") and r + 2 <= self.schedule.rounds:
            target = self.schedule.task_of(r + 2)
            pool: Mapping[str, np.ndarray | None] = descriptors
            if self.selection == "all":   # no descriptors: every client's started tasks, by the public schedule
                members = sorted(set(state.get("members", [])) | set(view.contributors))
                new["members"] = members
                pool = {f"{c}:{u}": None for c in members for u in range(self.schedule.task_of(r + 1) + 1)}
            for client in sorted(view.contributors):
                mine = selection.setdefault(str(client), {})
                if str(target) in mine or (self.selection != "all" and f"{client}:{target}" not in descriptors):
                    continue
                chosen = self.select(client=client, task=target, descriptors=pool,
                                     started=self.schedule.task_of(r + 1), round=r)
                mine[str(target)] = chosen
                for owner, task, _ in chosen:
                    if int(owner) != client:
                        requests.setdefault(str(int(owner)), []).append([client, int(task)])
        new["selection"], new["requests"] = selection, requests
        return new

    def _centres(self, payload: np.ndarray) -> np.ndarray:
        """The released centres, with those whose noisy count is below one zeroed (they score 0)."""
        centres, counts = self.descriptor.unpack(payload)
        return np.where((counts >= 1.0)[:, None], centres, 0.0)

    def select(self, *, client: int, task: int, descriptors: Mapping[str, np.ndarray | None], started: int,
               round: int) -> list[list[float]]:
        """Top-K foreign tasks for (client, task) as [owner, task, initial alpha] rows ('all': every
        candidate, alpha 1/n, as the random ablation's; `descriptors` then only names the tasks)."""
        candidates = []
        for key in sorted(descriptors, key=lambda k: tuple(int(x) for x in k.split(":"))):
            owner, other = (int(x) for x in key.split(":"))
            if other > started or (owner == client and other >= task) or (owner != client and not self.consents(owner)):
                continue
            candidates.append((owner, other))
        if not candidates:
            return []
        if self.selection == "all":
            return [[o, u, 1.0 / len(candidates)] for o, u in candidates]
        if self.selection == "random":
            rng = np.random.default_rng([self.seed, round, client, task])
            picked = [candidates[i] for i in sorted(rng.choice(len(candidates), min(self.top_k, len(candidates)),
                                                               replace=False))]
            return [[o, u, 1.0 / len(picked)] for o, u in picked]
        own = descriptors[f"{client}:{task}"]
        scored = sorted(((rectified_linear_score(own, descriptors[f"{o}:{u}"], threshold=self.threshold), o, u)
                         for o, u in candidates), key=lambda x: (-x[0], x[1], x[2]))[: self.top_k]
        total = sum(s for s, _, _ in scored)
        return [[o, u, s / total if total > 0 else 1.0 / len(scored)] for s, o, u in scored]

    # ---- client ---------------------------------------------------------------------------------
    def _channel(self, client: ClientContext) -> PeerChannel:
        return PeerChannel(client_id=client.client_id, keys=client.trainer.keys, directory=self.peers, run=self.run,
                           purpose=_PURPOSE)

    def _receive(self, broadcast, client: ClientContext, task: int) -> tuple[dict[str, Any], dict[str, float]]:
        """Open this round's relays and load the foreign adaptives of the current task (alphas from
        SIT's scores when the set changes; FedWeIT's stay trained). Bad relays are dropped and counted."""
        trainer, state = client.trainer, dict(client.state)
        model = trainer.model
        shapes = {n: tuple(model.base[n].shape) for n in model.kernel_names}
        received, rejected = {}, 0
        inbox_bytes = sum(len(relay.ciphertext) for relay in broadcast.inbox or ())
        if broadcast.inbox:
            channel = self._channel(client)
            for relay in broadcast.inbox:
                try:
                    owner_task, kernels = unpack_adaptive(channel.open(relay), shapes)
                except (DecryptionError, ValueError):
                    rejected += 1
                    continue
                received[(relay.sender, owner_task)] = kernels
        wanted = _rows(broadcast.own.get("foreign"), 3)
        if self.selection == "all_current":
            chosen = sorted(received)
            if chosen:
                trainer.set_foreign(task, [received[k] for k in chosen])
        elif wanted:
            keys, tensors, alphas = [], [], []
            for owner, other, alpha in wanted:
                key = (int(owner), int(other))
                tensor = trainer.adaptive(key[1]) if key[0] == client.client_id else received.get(key)
                if tensor is not None:
                    keys.append(key)
                    tensors.append(tensor)
                    alphas.append(alpha)
            previous = state.get("foreign_keys", {}).get(str(task))
            if keys and [list(k) for k in keys] != previous and (previous is None or len(keys) > len(previous)):
                trainer.set_foreign(task, tensors, alphas=alphas)
                state["foreign_keys"] = {**state.get("foreign_keys", {}), str(task): [list(k) for k in keys]}
        return state, {"relays_received": float(len(received)), "relays_rejected": float(rejected),
                       "relay_bytes_received": float(inbox_bytes)}

    def client_update(self, *, broadcast, client: ClientContext) -> tuple[Upload, Mapping[str, Any]]:
        trainer, r = client.trainer, client.round
        task = self.schedule.task_of(r)
        trainer.start_task(task)
        trainer.set_shared(broadcast)
        state, metrics = (self._receive(broadcast, client, task) if self.selection != "none"
                          else (dict(client.state), {}))
        metrics.update(trainer.train(epochs=self.local_epochs, round=r, proximal=broadcast, mu=self.mu))
        delta = trainer.get_shared()[BASE_PART] - broadcast[BASE_PART]
        released = {}
        for u in self.schedule.announced(r) if self.releases else ():
            try:
                released[descriptor_part(u)] = client.release(descriptor_part(u),
                                                              documents=trainer.descriptor_documents(u))
            except DescriptorRefused:   # too few documents for a useful DP descriptor: the task is not matched
                metrics["descriptors_refused"] = metrics.get("descriptors_refused", 0.0) + 1.0
        sealed = ()
        requests = _rows(broadcast.own.get("send"), 2)
        if requests and self.consents(client.client_id):
            channel, names = self._channel(client), trainer.model.kernel_names
            sealed = tuple(channel.seal(receiver=int(receiver), round=r,
                                        plaintext=pack_adaptive(int(u), trainer.adaptive(int(u)), names))
                           for receiver, u in requests)
        if self.selection != "none":   # what this client uploads besides B: relayed adaptives, descriptors
            metrics["relay_bytes_sent"] = float(sum(len(m.ciphertext) for m in sealed))
            metrics["relay_bytes_descriptors"] = float(sum(np.asarray(getattr(x, "payload", ())).nbytes
                                                          for x in released.values()))
        return Upload(masked={BASE_PART: Masked(delta, weight=trainer.num_examples)}, released=released,
                      sealed=sealed, metrics=metrics), state


class FedSeIT(FederatedContinual):
    """FedSeIT: SIT top-K foreign tasks (or random ones, the ablation; or every candidate, 'all': FedSeIT
    without SIT), one convolution per foreign A."""

    name = "fedseit"


class FedWeIT(FederatedContinual):
    """FedWeIT: every other client's current A from the previous round, summed into the kernel."""

    name = "fedweit"

    def __init__(self, *, schedule: Schedule, local_epochs: int = 1, peers: PeerDirectory, run: str = "run",
                 consent: frozenset[int] | None = None, seed: int = 0, mu: float = 0.0) -> None:
        super().__init__(schedule=schedule, selection="all_current", local_epochs=local_epochs, peers=peers, run=run,
                         consent=consent, seed=seed, mu=mu)


class ContinualFedAvg(FederatedContinual):
    """FedAvg on B alone: the decomposed model without foreign knowledge."""

    name = "fedavg_b"

    def __init__(self, *, schedule: Schedule, local_epochs: int = 1, mu: float = 0.0) -> None:
        super().__init__(schedule=schedule, selection="none", local_epochs=local_epochs, mu=mu)


class LocalContinual(FedAvg):
    """Local continual learning: the same model and schedule, nothing leaves the client."""

    name = "local_continual"

    def __init__(self, *, schedule: Schedule, local_epochs: int = 1) -> None:
        super().__init__(local_epochs=local_epochs)
        self.schedule = schedule

    def configure_round(self, *, round: int, state, cohort: Sequence[int] = ()) -> Mapping[str, np.ndarray]:
        return {}

    def shared_parameters(self, state) -> Mapping[str, np.ndarray]:
        return {}

    def client_update(self, *, broadcast, client: ClientContext) -> tuple[Upload, Mapping[str, Any]]:
        client.trainer.start_task(self.schedule.task_of(client.round))
        return Upload(metrics=client.trainer.train(epochs=self.local_epochs, round=client.round)), client.state

    def server_update(self, *, state, view: AggregateView):
        return state


__all__ = ["SELECTIONS", "SIT_THRESHOLD", "Schedule", "descriptor_part", "pack_adaptive", "unpack_adaptive",
           "max_candidates",
           "FederatedContinual", "FedSeIT", "FedWeIT", "ContinualFedAvg", "LocalContinual"]
