"""FedSeIT's comparison (Chaudhary et al., Table 2 / Fig. 3): FedSeIT (K = 3, 5), SIT against random
selection and against no selection (FedSeIT without SIT: every foreign adaptive), FedWeIT, FedAvg on B
and Local continual learning, per seed, B always through secure aggregation.

One cell is (seed, method). It reports, per client, the accuracy matrix a[l][j] (test accuracy of task j
after the last round of task l, j <= l); final accuracy = mean_j a[T-1][j]; forgetting = mean over
j < T-1 of max_{j <= l < T-1} a[l][j] - a[T-1][j]; both averaged over clients. It also reports the
descriptor epsilon the server's ledger holds (example level, composed over each client's descriptors,
the largest over clients), the SIT selections, and what a client sends and receives: relayed adaptives
(count and ciphertext bytes), descriptor bytes, the secure sum's bytes, and per round the mean bytes a
client uploads and downloads (`COST_KEYS`).

Every method's clients train under one declared protocol (`training_protocol`, a `TrainingProtocol`
built by `fedseit_protocol`: Adam lr 1e-3 fresh at every local run, constant lr, no clipping, the plan's
local epochs), printed in the run's header and recorded in config.toml and results.json.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dp.centroids import CentroidConfig, DPCentroids
from dp.ledger import Ledger
from fl_algorithms.algorithms.fedseit import (ContinualFedAvg, FedSeIT, FedWeIT, LocalContinual, Schedule,
                                              max_candidates)
from fl_algorithms.choices import CONTINUAL_METHODS, SECURE_PROTOCOLS
from fl_algorithms.engine.peer_channel import PeerDirectory
from fl_algorithms.engine.secure_sum import SecureAggregationConfig
from fl_algorithms.engine.sim import RoundRecord, RunConfig, SimulationRunner
from fl_algorithms.experiments import tables
from fl_algorithms.experiments.config import check_choices, check_seeds
from fl_algorithms.experiments.tables import grouped, plot_mean_curves, pyplot, save_figure, summarise
from fl_algorithms.tasks.continual import ContinualSettings, TaskData, build_tasks
from fl_algorithms.training.continual_trainer import (BASE_PART, ContinualTrainer, ContinualTrainerConfig,
                                                      fedseit_protocol)
from fl_algorithms.training.protocol import TrainingProtocol
from nlp_models.backbone import load_named_backbone
from nlp_models.decomposed_cnn import DecomposedConfig

METHODS = CONTINUAL_METHODS
"""'fedseit_all' is FedSeIT without SIT: every candidate foreign adaptive, unranked (the paper's Table 2
'Without SIT' column, whose claim is that SIT with K = 3 matches it at a lower cost)."""
LABELS = {"fedseit_k3": "FedSeIT, SIT, K = 3", "fedseit_k5": "FedSeIT, SIT, K = 5",
          "fedseit_random": "FedSeIT, random K = 3 (ablation)", "fedseit_all": "FedSeIT without SIT (every foreign A)",
          "fedweit": "FedWeIT", "fedavg_b": "FedAvg on B", "local": "Local continual"}
PROTOCOLS = SECURE_PROTOCOLS
COST_KEYS = ("upload_bytes_per_round", "download_bytes_per_round", "relay_bytes_sent", "relay_bytes_received",
             "descriptor_bytes", "secure_bytes_uploaded", "foreign_per_task")
"""Per cell, per client (mean over clients): mean bytes uploaded / downloaded per round (secure-sum
messages + sealed relays + descriptors up; B at 4 bytes a parameter + relays down), the run's totals of
relayed ciphertext bytes sent and received, descriptor payload bytes and secure-sum bytes, and the mean
number of foreign adaptives a task's model holds."""


@dataclasses.dataclass(frozen=True)
class ContinualPlan:
    """The grid: seeds x methods, with the data, model, optimiser and descriptor settings they share."""

    seeds: tuple[int, ...] = (0, 1, 2)
    methods: tuple[str, ...] = METHODS
    rounds_per_task: int = 3
    local_epochs: int = 2
    protocol: str = "secagg+"
    clip: float = 1.0
    """Fixed-point range of each coordinate of an uploaded B delta."""
    data: ContinualSettings = ContinualSettings()
    trainer: ContinualTrainerConfig = ContinualTrainerConfig()
    descriptor: CentroidConfig = CentroidConfig()
    filters: int = 128
    mu: float = 0.0
    """FedProx's proximal weight on B for the federated methods (0: FedAvg, the paper's main setting)."""
    projection: bool = False
    """FedSeIT's W_f over the foreign features (paper Eq. 3; off by default in the reference's parser)."""

    def __post_init__(self) -> None:
        check_choices("methods", self.methods, METHODS)
        check_seeds(self.seeds)
        if self.rounds_per_task < 2 or self.local_epochs < 1 or not self.clip > 0 or self.filters < 1:
            raise ValueError("need rounds_per_task >= 2, local_epochs >= 1, clip > 0, filters >= 1")
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}")
        if not self.mu >= 0:
            raise ValueError(f"mu must be >= 0, got {self.mu}")

    @property
    def schedule(self) -> Schedule:
        return Schedule(tasks=self.data.tasks_per_client, rounds_per_task=self.rounds_per_task)

    def cells(self) -> list[dict[str, Any]]:
        return [{"seed": seed, "method": m} for seed in self.seeds for m in self.methods]

    def training_protocol(self, method: str) -> TrainingProtocol:
        """The declared protocol of `method`'s clients (the same for every method but where it evaluates:
        Local continual learning's model is never aggregated)."""
        check_choices("method", (method,), METHODS)
        return fedseit_protocol(lr=self.trainer.lr, local_epochs=self.local_epochs, personal=method == "local")

    def training_protocols(self) -> dict[str, TrainingProtocol]:
        return {m: self.training_protocol(m) for m in self.methods}

    def record(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_record(cls, raw: Mapping[str, Any]) -> "ContinualPlan":
        def tuples(d: Mapping[str, Any]) -> dict[str, Any]:
            return {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}

        nested = {"data": ContinualSettings, "trainer": ContinualTrainerConfig, "descriptor": CentroidConfig}
        return cls(**{k: v for k, v in tuples(raw).items() if k not in nested},
                   **{k: kind(**tuples(raw[k])) for k, kind in nested.items()})


def cell_key(cell: Mapping[str, Any]) -> str:
    return f"{cell['seed']}/{cell['method']}"


def standardised_embeddings(weight: torch.Tensor) -> torch.Tensor:
    """The frozen word vectors divided by their coordinate std (a constant of the public model: 0.0556
    for MiniLM), so that inputs have unit variance per coordinate, the scale the reference's
    VarianceScaling(fan_in) kernels assume. Unscaled, MiniLM's small vectors make the CE gradient on
    each task's adaptive A far smaller than the L1 pull (1e-3) and every task after the first stays
    at chance (measured: client 1 of seed 0, 5 tasks x 6 epochs alone: mean accuracy 0.53 unscaled,
    0.79 standardised)."""
    w = weight.detach().float()
    return (w / w.std()).clone()


class ContinualClients:
    """One seed's clients: task sequences, the frozen word vectors, tokenizer and peer keys."""

    def __init__(self, settings: ContinualSettings, *, backbone: str = "minilm", device: str = "cpu") -> None:
        self.settings, self.device = settings, device
        encoder, self.tokenizer = load_named_backbone(backbone)
        self.embeddings = standardised_embeddings(encoder.get_input_embeddings().weight)
        del encoder
        self.tasks: dict[int, list[TaskData]] = build_tasks(settings)
        self.peers, self._keys = PeerDirectory.generate(sorted(self.tasks))

    @property
    def ids(self) -> list[int]:
        return sorted(self.tasks)

    def make_trainer(self, client: int, *, model: DecomposedConfig, config: ContinualTrainerConfig,
                     protocol: TrainingProtocol | None = None) -> ContinualTrainer:
        return ContinualTrainer(client_id=client, tasks=self.tasks[client], tokenizer=self.tokenizer,
                                embeddings=self.embeddings, model=model, config=config, keys=self._keys[client],
                                device=self.device, protocol=protocol)

    def max_train(self) -> int:
        return max(len(t.train_texts) for seq in self.tasks.values() for t in seq)


def make_method(method: str, *, plan: ContinualPlan, clients: ContinualClients, seed: int):
    """(algorithm, model config) of one row; the model seed is the run seed (equal initial B everywhere)."""
    schedule, epochs = plan.schedule, plan.local_epochs
    base = DecomposedConfig(filters=plan.filters, seed=seed + 1)
    run = f"fcl-seed{seed}-{method}"
    if method == "fedseit_all":   # without SIT: no descriptors, a slot for every candidate
        algorithm = FedSeIT(schedule=schedule, selection="all", local_epochs=epochs, peers=clients.peers, run=run,
                            seed=seed, mu=plan.mu)
        slots = max_candidates(schedule, len(clients.ids))
        return algorithm, dataclasses.replace(base, mode="fedseit", foreign_slots=slots, projection=plan.projection)
    if method.startswith("fedseit"):
        k = 5 if method == "fedseit_k5" else 3
        descriptor = DPCentroids(plan.descriptor, dim=clients.embeddings.shape[1])
        algorithm = FedSeIT(schedule=schedule, selection="random" if method == "fedseit_random" else "sit", top_k=k,
                            local_epochs=epochs, descriptor=descriptor, peers=clients.peers, run=run, seed=seed,
                            mu=plan.mu)
        return algorithm, dataclasses.replace(base, mode="fedseit", foreign_slots=k, projection=plan.projection)
    if method == "fedweit":
        algorithm = FedWeIT(schedule=schedule, local_epochs=epochs, peers=clients.peers, run=run, seed=seed, mu=plan.mu)
        return algorithm, dataclasses.replace(base, mode="fedweit", foreign_slots=len(clients.ids) - 1)
    model = dataclasses.replace(base, mode="fedweit", foreign_slots=0)
    if method == "fedavg_b":
        return ContinualFedAvg(schedule=schedule, local_epochs=epochs, mu=plan.mu), model
    if method == "local":
        return LocalContinual(schedule=schedule, local_epochs=epochs), model
    raise ValueError(f"unknown method {method!r}")


def accuracy_matrix(history: Sequence[RoundRecord], *, client: int, schedule: Schedule) -> list[list[float]]:
    """a[l][j]: client's test accuracy on task j after the last round of task l (j <= l)."""
    out = []
    for task in range(schedule.tasks):
        metrics = history[(task + 1) * schedule.rounds_per_task - 1].metrics[client]
        out.append([float(metrics[f"acc_task{j}"]) for j in range(task + 1)])
    return out


def final_accuracy(matrix: Sequence[Sequence[float]]) -> float:
    return float(np.mean(matrix[-1]))


def forgetting(matrix: Sequence[Sequence[float]]) -> float:
    """Mean over tasks j < T-1 of (best accuracy on j before the last task) - (accuracy on j at the end)."""
    last = len(matrix) - 1
    if last == 0:
        return 0.0
    return float(np.mean([max(matrix[l][j] for l in range(j, last)) - matrix[last][j] for j in range(last)]))


def costs(history: Sequence[RoundRecord], *, clients: Sequence[int], base_parameters: int,
          foreign_per_task: float) -> dict[str, float]:
    """`COST_KEYS` of one run, per client (mean over clients): what it uploads and downloads per round
    (mean over rounds) and over the run. Relay and descriptor bytes are the clients' own counts (ciphertext
    lengths, payload sizes); the secure sum's are the engine's (`RoundRecord.bytes_uploaded`); B's
    broadcast is counted at 4 bytes a parameter (fp32), the same in every federated row."""
    def total(key: str) -> float:
        return float(np.mean([sum(r.metrics[k].get(key, 0.0) for r in history) for k in clients]))

    rounds = max(len(history), 1)
    secure = float(np.mean([sum(r.bytes_uploaded.get(k, 0) for r in history) for k in clients]))
    sent, received = total("relay_bytes_sent"), total("relay_bytes_received")
    descriptors = total("relay_bytes_descriptors")
    broadcast = 4.0 * base_parameters * rounds if secure > 0 else 0.0   # nothing is broadcast to Local clients
    return {"upload_bytes_per_round": (secure + sent + descriptors) / rounds,
            "download_bytes_per_round": (broadcast + received) / rounds,
            "relay_bytes_sent": sent, "relay_bytes_received": received, "descriptor_bytes": descriptors,
            "secure_bytes_uploaded": secure, "foreign_per_task": float(foreign_per_task)}


def run_continual_cell(cell: Mapping[str, Any], clients: ContinualClients, plan: ContinualPlan, *,
                       progress: bool, on_round: Callable[[RoundRecord], None] | None = None,
                       ledger_dir: Path | None = None) -> dict[str, Any]:
    """One (seed, method): per-client accuracy matrices, final accuracy, forgetting, epsilon, costs.
    With `ledger_dir`, the server's ledger is written there as `<seed>-<method>.json` (every charge with
    its mechanism, so the descriptor epsilon can be recomputed from it)."""
    start = time.perf_counter()
    seed, method = int(cell["seed"]), cell["method"]
    algorithm, model = make_method(method, plan=plan, clients=clients, seed=seed)
    config = dataclasses.replace(plan.trainer, seed=seed)
    protocol = plan.training_protocol(method)
    trainers = {k: clients.make_trainer(k, model=model, config=config, protocol=protocol) for k in clients.ids}
    n = len(trainers)
    secure = SecureAggregationConfig(protocol=plan.protocol, clip=plan.clip, max_weight=float(clients.max_train()),
                                     max_clients=n, min_release_group=n)
    ledger = Ledger()
    runner = SimulationRunner(algorithm=algorithm, trainers=trainers, initial={BASE_PART: trainers[1].get_shared()[BASE_PART]},
                              config=RunConfig(rounds=plan.schedule.rounds, seed=seed, sampler="seeded", secure=secure),
                              ledger=ledger)
    runner.on_round = on_round
    history = runner.run(progress=progress, desc=method)
    if ledger_dir is not None:
        ledger_dir.mkdir(parents=True, exist_ok=True)
        ledger.write(ledger_dir / f"{seed}-{method}.json")
    matrices = {k: accuracy_matrix(history, client=k, schedule=plan.schedule) for k in clients.ids}
    epsilons = [ledger.epsilon(k, unit="example", observer="server") for k in clients.ids]
    relays = [r.metrics[k].get("relays_received", 0.0) for r in history for k in clients.ids]
    selection = runner.state.get("selection") if method.startswith("fedseit") else None
    sizes = [len(chosen) for per_client in (selection or {}).values() for chosen in per_client.values()]
    foreign = float(np.mean(sizes)) if sizes else float(len(clients.ids) - 1) if method == "fedweit" else 0.0
    out = {**cell,
           "accuracy": float(np.mean([final_accuracy(m) for m in matrices.values()])),
           "forgetting": float(np.mean([forgetting(m) for m in matrices.values()])),
           "matrices": {str(k): m for k, m in matrices.items()},
           "tasks": {str(k): [t.name for t in clients.tasks[k]] for k in clients.ids},
           "curve": [r.mean("accuracy") for r in history],
           "descriptor_epsilon": float(max(epsilons)),
           "relays_received": float(np.sum(relays)),
           "relays_rejected": float(np.sum([r.metrics[k].get("relays_rejected", 0.0) for r in history for k in clients.ids])),
           "secure_seconds_per_round": float(np.mean([r.secure_seconds for r in history])),
           "base_parameters": int(trainers[1].model.base_size),
           "foreign_slots": int(model.foreign_slots),
           **costs(history, clients=clients.ids, base_parameters=int(trainers[1].model.base_size),
                   foreign_per_task=foreign),
           "training_protocol": protocol.to_dict(),
           "seconds": time.perf_counter() - start}
    if method.startswith("fedseit"):
        out["selection"] = selection
    return out


def aggregate(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Mean ± sample std over seeds per method of final accuracy, forgetting, descriptor epsilon, seconds
    and the `COST_KEYS` (cells recorded before the costs were counted give nan there)."""
    groups = grouped(rows, lambda row: row["method"])
    return [summarise({"method": method, "seeds": len(groups[method])},
                      {key: [m.get(key, float("nan")) for m in groups[method]]
                       for key in ("accuracy", "forgetting", "descriptor_epsilon", "seconds", *COST_KEYS)})
            for method in METHODS if method in groups]


def paired_difference(rows: Sequence[Mapping[str, Any]], *, first: str, second: str,
                      key: str = "accuracy", level: float = 0.95) -> dict[str, Any] | None:
    """`first` - `second` in `key`, paired by seed (`tables.paired_difference`: the mean and its Student-t
    interval at `level`), with the per-seed differences; None with fewer than two common seeds."""
    ours = {r["seed"]: r[key] for r in rows if r["method"] == first and key in r}
    theirs = {r["seed"]: r[key] for r in rows if r["method"] == second and key in r}
    seeds = sorted(s for s in ours if s in theirs)
    if len(seeds) < 2:
        return None
    interval = tables.paired_difference(ours, theirs, level=level)
    return {**interval, "first": first, "second": second, "key": key, "seeds": seeds,
            "differences": [float(ours[s] - theirs[s]) for s in seeds], "level": level}


PAIRS = (("fedseit_k3", "fedseit_all"), ("fedseit_k5", "fedseit_all"), ("fedseit_k3", "fedweit"),
         ("fedseit_k3", "fedseit_random"))
"""The paired differences the summary reports where both rows ran: SIT against no selection (the
paper's claim: similar), FedSeIT against FedWeIT (the paper's headline), SIT against random selection."""


def paired_differences(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`paired_difference` of accuracy and forgetting for every pair of `PAIRS` that ran on >= 2 seeds."""
    return [d for a, b in PAIRS for key in ("accuracy", "forgetting")
            if (d := paired_difference(rows, first=a, second=b, key=key)) is not None]


def write_table(rows: Sequence[Mapping[str, Any]], *, csv_path: Path, md_path: Path) -> None:
    """Final average accuracy and forgetting (x 100, mean ± std over seeds) per method."""
    import csv

    table = aggregate(rows)
    if not table:
        raise ValueError("no finished cells")
    with open(csv_path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    lines = ["| method | seeds | final accuracy | forgetting | descriptor ε | seconds | foreign A per task | "
             "MB up / round | MB down / round |", "|---|---|---|---|---|---|---|---|---|"]
    for e in table:
        eps = f"{e['descriptor_epsilon']:.2f}" if e["descriptor_epsilon"] > 0 else "–"
        lines.append(f"| {e['method']} | {e['seeds']} | {100 * e['accuracy']:.2f} ± {100 * e['accuracy_std']:.2f} | "
                     f"{100 * e['forgetting']:.2f} ± {100 * e['forgetting_std']:.2f} | {eps} | {e['seconds']:.0f} | "
                     f"{e['foreign_per_task']:.1f} | {e['upload_bytes_per_round'] / 1e6:.2f} | "
                     f"{e['download_bytes_per_round'] / 1e6:.2f} |")
    pairs = paired_differences(rows)
    if pairs:
        lines += ["", "| paired by seed (x 100) | per seed | mean | 95% t-interval |", "|---|---|---|---|"]
        lines += [f"| {d['first']} - {d['second']}, {d['key']} | {', '.join(f'{100 * x:+.2f}' for x in d['differences'])} "
                  f"| {100 * d['mean']:+.2f} | [{100 * d['low']:+.2f}, {100 * d['high']:+.2f}] |" for d in pairs]
    md_path.write_text("\n".join(lines) + "\n")


def plot_curves(rows: Sequence[Mapping[str, Any]], *, path: Path, schedule: Schedule) -> Path:
    """Mean accuracy over the tasks seen so far, per round (task boundaries dashed), mean over seeds."""
    fig, ax = pyplot().subplots(figsize=(6.5, 3.6))
    plot_mean_curves(ax, rows, METHODS)
    for task in range(1, schedule.tasks):
        ax.axvline(task * schedule.rounds_per_task + 0.5, color="grey", linestyle="--", linewidth=0.7)
    ax.set_xlabel("round (dashed: a new task starts)")
    ax.set_ylabel("mean test accuracy over seen tasks")
    return save_figure(fig, path)


__all__ = ["METHODS", "LABELS", "PROTOCOLS", "COST_KEYS", "PAIRS", "ContinualPlan", "standardised_embeddings",
           "ContinualClients", "cell_key", "make_method", "accuracy_matrix", "final_accuracy", "forgetting", "costs",
           "run_continual_cell", "aggregate", "paired_difference", "paired_differences", "write_table", "plot_curves"]
