"""ATC's comparison (ATC paper, Table 2): ATC through secure aggregation, its ASSIGN-only ablation, the
flagged insecure reference, and Isolated, FedAvg, FedAvg+FT, FedProx, Ditto and FedBN, all over the
same 18 heterogeneous clients (`tasks.hetero`), per seed.

One cell is (seed, method). It reports each client's test metric after the last round (accuracy,
span F1, SQuAD F1 or ROUGE-L by formulation), their mean per dataset, and the average over the six
datasets (the paper's 'avg'); plus what the server saw (`leakage`): the secure sums per round with
their sizes, the subset-sum recoverability attack on every family of overlapping sums, and the
neighbour-sketch epsilon from the server's ledger.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dp.leakage.recoverability import recoverable_clients
from dp.ledger import Ledger
from dp.sketches import DPSketcher, SketchConfig
from fl_algorithms.algorithms.atc import ATC, ATCConfig
from fl_algorithms.algorithms.ditto import Ditto
from fl_algorithms.algorithms.fedavg import FedAvg
from fl_algorithms.algorithms.fedbn import FedAvgFT, FedBN
from fl_algorithms.algorithms.fedprox import FedProx
from fl_algorithms.algorithms.local import Local
from fl_algorithms.engine.secure_sum import SecureAggregationConfig
from fl_algorithms.engine.sim import RoundRecord, RunConfig, SimulationRunner
from fl_algorithms.experiments.config import check_choices, check_seeds
from fl_algorithms.experiments.tables import grouped, plot_mean_curves, pyplot, save_figure, summarise
from fl_algorithms.tasks.hetero import LAYOUT, HeteroClient
from fl_algorithms.training.hetero_trainer import METRIC, HeteroConfig, HeteroFactory, HeteroTrainer
from nlp_models.device import device_name

METHODS = ("atc_secure", "atc_reference", "assign_only", "fedavg", "fedavg_ft", "isolated", "ditto", "fedprox", "fedbn")
SECURE = tuple(m for m in METHODS if m != "atc_reference")
ASSIGNING = ("atc_secure", "atc_reference", "assign_only")
"""The methods that run ATC's ASSIGN rounds before the task rounds."""


@dataclasses.dataclass(frozen=True)
class ATCPlan:
    """The grid: seeds x methods, with the clients, model, rounds and privacy settings they share."""

    seeds: tuple[int, ...] = (0, 1, 2)
    methods: tuple[str, ...] = METHODS
    rounds: int = 12
    """Task-training rounds of every method. ATC and its ablation first run `atc.assign_rounds` rounds of
    ASSIGN (self-supervised pre-training, as the paper's separate ASSIGN stage), then these rounds."""
    max_per_client: int | None = None
    model: HeteroConfig = HeteroConfig()
    atc: ATCConfig = ATCConfig()
    sketch_epsilon: float = 8.0
    sketch_dim: int = 64
    max_cosine_noise_std: float = 0.25
    """The neighbour sketch is refused (nothing released) if its cosine noise std would exceed this."""
    fedprox_mu: float = 0.01
    ditto_lambda: float = 0.1
    protocol: str = "secagg+"
    clip: float = 1.0

    def __post_init__(self) -> None:
        check_choices("methods", self.methods, METHODS)
        check_seeds(self.seeds)
        if self.rounds < 2:
            raise ValueError("rounds must be at least 2 (CONTRAST's targets come from the previous round)")
        if not (self.sketch_epsilon > 0 and self.sketch_dim >= 1 and self.clip > 0):
            raise ValueError("need sketch_epsilon > 0, sketch_dim >= 1 and clip > 0")

    def cells(self) -> list[dict[str, Any]]:
        return [{"seed": seed, "method": m} for seed in self.seeds for m in self.methods]

    def record(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_record(cls, raw: Mapping[str, Any]) -> "ATCPlan":
        def tuples(d: Mapping[str, Any]) -> dict[str, Any]:
            return {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}

        nested = {"model": HeteroConfig, "atc": ATCConfig}
        return cls(**{k: v for k, v in tuples(raw).items() if k not in nested},
                   **{k: kind(**tuples(raw[k])) for k, kind in nested.items()})


def cell_key(cell: Mapping[str, Any]) -> str:
    return f"{cell['seed']}/{cell['method']}"


def total_rounds(method: str, plan: ATCPlan) -> int:
    """ATC's methods run ASSIGN before the task rounds every method gets."""
    return plan.rounds + (plan.atc.assign_rounds if method in ASSIGNING else 0)


def make_algorithm(method: str, *, plan: ATCPlan, seed: int, dim: int):
    atc = dataclasses.replace(plan.atc, seed=seed)
    epochs = atc.local_epochs
    if method == "atc_secure":
        sketcher = DPSketcher(SketchConfig(epsilon=plan.sketch_epsilon, sketch_dim=plan.sketch_dim,
                                           max_cosine_noise_std=plan.max_cosine_noise_std, projection_seed=seed), dim=dim)
        return ATC(atc, sketcher=sketcher)
    if method == "assign_only":
        return ATC(dataclasses.replace(atc, contrast=False))
    if method == "fedavg":
        return FedAvg(local_epochs=epochs)
    if method == "fedavg_ft":
        return FedAvgFT(local_epochs=epochs, finetune_epochs=1)
    if method == "isolated":
        return Local(local_epochs=epochs)
    if method == "ditto":
        return Ditto(lam=plan.ditto_lambda, local_epochs=epochs)
    if method == "fedprox":
        return FedProx(mu=plan.fedprox_mu, local_epochs=epochs)
    if method == "fedbn":
        return FedBN(local_epochs=epochs)
    raise ValueError(f"unknown method {method!r} (atc_reference runs outside the secure engine)")


def client_scores(metrics: Mapping[int, Mapping[str, float]], clients: Mapping[int, HeteroClient]) -> dict[str, float]:
    """Each client's headline test metric (by its formulation)."""
    return {str(c): float(metrics[c][METRIC[clients[c].formulation]]) for c in sorted(clients)}


def dataset_scores(scores: Mapping[str, float], clients: Mapping[int, HeteroClient]) -> dict[str, float]:
    """Mean over each dataset's clients; the datasets in layout order."""
    out = {}
    for entry in LAYOUT:
        members = [scores[str(c)] for c, client in clients.items() if client.dataset == entry.name]
        if members:
            out[entry.name] = float(np.mean(members))
    return out


def leakage_report(history: Sequence[RoundRecord], *, clients: Sequence[int], min_size: int) -> dict[str, Any]:
    """What the server saw: per round and family of sums over the same vectors (the neighbour-model sums
    'a*', the representation sums 'r*', and every other sum on its own), the smallest group, and the
    clients the subset-sum attack recovers from the family's noise-free sums."""
    recovered, smallest, sums = 0, None, 0
    for record in history:
        families: dict[str, list[list[int]]] = {}
        for name, members in record.sums.items():
            family = name[0] if name[:1] in ("a", "r") and name[1:].isdigit() else name
            families.setdefault(family, []).append(list(members))
        for groups in families.values():
            sums += len(groups)
            sizes = [len(g) for g in groups] + ([smallest] if smallest is not None else [])
            smallest = min(sizes)
            recovered += recoverable_clients(groups, clients=clients).count
    return {"secure_sums": sums, "smallest_group": smallest if smallest is not None else 0,
            "min_size": min_size, "recovered_clients": recovered}


def neighbour_guard_report(algorithm: ATC, state: Mapping[str, Any], *, cohort: Sequence[int]) -> dict[str, Any]:
    """What the guard changed in CONTRAST: the clients the subset-sum attack would recover from the
    wanted (unguarded) neighbour groups, and the share of clients whose group is the wanted one."""
    near = {i: tuple(state["near"].get(i, cohort)) for i in cohort}   # no sketch: everyone (as plan_groups)
    far = {i: tuple(state["far"].get(i, cohort)) for i in cohort}
    wanted_models = [sorted(set(near[i]) | {i}) for i in cohort]
    wanted_reps = [sorted(near[i]) for i in cohort] + [sorted(far[i]) for i in cohort]
    model_groups, rep_groups, index = algorithm.plan_groups(dict(state), cohort)
    kept = [set(model_groups[index[i]["model"]]) == set(wanted_models[n]) for n, i in enumerate(cohort)]
    return {"unguarded_recoverable": int(recoverable_clients(wanted_models, clients=cohort).count
                                         + recoverable_clients(wanted_reps, clients=cohort).count),
            "wanted_groups_kept": float(np.mean(kept)), "model_groups": len(model_groups),
            "rep_groups": len(rep_groups)}


def run_atc_cell(cell: Mapping[str, Any], *, plan: ATCPlan, clients: Mapping[int, HeteroClient],
                 factory: HeteroFactory, progress: bool,
                 on_round: Callable[[RoundRecord], None] | None = None, ledger_dir: Path | None = None) -> dict[str, Any]:
    """One (seed, method) through the secure engine (or, for atc_reference, the flagged insecure loop)."""
    start = time.perf_counter()
    seed, method = int(cell["seed"]), cell["method"]
    trainers: dict[int, HeteroTrainer] = {c: factory.trainer(clients[c]) for c in sorted(clients)}
    if method == "atc_reference":
        from fl_algorithms.experiments.atc_reference import run_reference

        final, curve, seen = run_reference(trainers, plan=plan, seed=seed, progress=progress)
        leakage = {"secure_sums": 0, "smallest_group": 1, "min_size": plan.atc.min_size, "recovered_clients": seen,
                   "insecure": True}
        epsilon = 0.0
    else:
        algorithm = make_algorithm(method, plan=plan, seed=seed, dim=factory.backbone.config.hidden_size)
        n = len(trainers)
        secure = SecureAggregationConfig(protocol=plan.protocol, clip=plan.clip,
                                         max_weight=float(max(t.num_examples for t in trainers.values())),
                                         max_clients=n, min_release_group=plan.atc.min_size)
        ledger = Ledger()
        runner = SimulationRunner(algorithm=algorithm, trainers=trainers, ledger=ledger,
                                  config=RunConfig(rounds=total_rounds(method, plan), seed=seed, sampler="seeded", secure=secure,
                                                   curve_split="validation"))
        runner.on_round = on_round
        history = runner.run(progress=progress, desc=method)
        if ledger_dir is not None:
            ledger_dir.mkdir(parents=True, exist_ok=True)
            ledger.write(ledger_dir / f"{seed}-{method}.json")
        final = history[-1].metrics
        curve = [float(np.mean([_validation_metric(r.metrics[c], clients[c]) for c in clients])) for r in history[:-1]]
        leakage = leakage_report(history, clients=sorted(clients), min_size=plan.atc.min_size)
        if method == "atc_secure" and runner.state["near"]:
            leakage.update(neighbour_guard_report(algorithm, runner.state, cohort=sorted(clients)))
        leakage["clipped"] = int(sum(r.clipped for r in history))
        leakage["failed_sums"] = int(sum(len(r.failed) for r in history))
        epsilon = max(ledger.epsilon(c, unit="example", observer="server") for c in clients)
    scores = client_scores(final, clients)
    per_dataset = dataset_scores(scores, clients)
    return {**cell, "clients": scores, "datasets": per_dataset, "avg": float(np.mean(list(per_dataset.values()))),
            "curve": curve, "leakage": leakage, "sketch_epsilon": float(epsilon),
            "seconds": time.perf_counter() - start, "device": device_name(factory.device)}


def _validation_metric(metrics: Mapping[str, float], client: HeteroClient) -> float:
    return float(metrics[f"validation_{METRIC[client.formulation]}"])


def aggregate(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Mean ± sample std over seeds per method: each dataset's metric and the average."""
    groups = grouped(rows, lambda row: row["method"])
    out = []
    for method in [m for m in METHODS if m in groups]:
        members = groups[method]
        names = [e.name for e in LAYOUT if e.name in members[0]["datasets"]]
        entry = summarise({"method": method, "seeds": len(members)},
                          {**{n: [m["datasets"][n] for m in members] for n in names}, "avg": [m["avg"] for m in members]})
        entry["recovered_clients"] = int(sum(m["leakage"]["recovered_clients"] for m in members))
        entry["smallest_group"] = int(min(m["leakage"]["smallest_group"] for m in members))
        entry["sketch_epsilon"] = float(max(m["sketch_epsilon"] for m in members))
        entry["seconds"] = float(np.mean([m["seconds"] for m in members]))
        entry["devices"] = ", ".join(sorted({m.get("device", "not recorded") for m in members}))
        out.append(entry)
    return out


def write_table(rows: Sequence[Mapping[str, Any]], *, csv_path: Path, md_path: Path) -> list[dict[str, Any]]:
    """Per-dataset metrics (x 100, mean ± std over seeds) and their average, per method."""
    import csv

    table = aggregate(rows)
    if not table:
        raise ValueError("no finished cells")
    with open(csv_path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    names = [e.name for e in LAYOUT if e.name in table[0]]
    metric = {e.name: METRIC[e.formulation] for e in LAYOUT}
    header = " | ".join(f"{n} ({metric[n]})" for n in names)
    lines = [f"| method | seeds | {header} | avg | smallest summed group | recovered clients | sketch ε | ran on |",
             "|---|---|" + "---|" * (len(names) + 5)]
    for e in table:
        cells = " | ".join(f"{100 * e[n]:.2f} ± {100 * e[f'{n}_std']:.2f}" for n in names)
        eps = f"{e['sketch_epsilon']:.1f}" if e["sketch_epsilon"] > 0 else "–"
        lines.append(f"| {e['method']} | {e['seeds']} | {cells} | {100 * e['avg']:.2f} ± {100 * e['avg_std']:.2f} | "
                     f"{e['smallest_group'] or '–'} | {e['recovered_clients']} | {eps} | {e['devices']} |")
    md_path.write_text("\n".join(lines) + "\n")
    return table


def plot_curves(rows: Sequence[Mapping[str, Any]], *, path: Path, assign_rounds: int) -> Path:
    """Mean validation metric over clients per round (before the last), mean over seeds, per method;
    ATC's ASSIGN rounds are drawn before round 1."""
    fig, ax = pyplot().subplots(figsize=(6.5, 3.6))
    plot_mean_curves(ax, rows, METHODS, first=lambda m: 1 - (assign_rounds if m in ASSIGNING else 0))
    ax.axvline(0.5, color="grey", linestyle="--", linewidth=0.7)
    ax.set_xlabel("task round (ATC's ASSIGN rounds before the dashed line)")
    ax.set_ylabel("mean validation metric over clients")
    return save_figure(fig, path)


__all__ = ["METHODS", "SECURE", "ASSIGNING", "ATCPlan", "cell_key", "total_rounds", "make_algorithm", "client_scores", "dataset_scores",
           "leakage_report", "neighbour_guard_report", "run_atc_cell", "aggregate", "write_table", "plot_curves"]
