"""FedNLP's layer-freezing study (Lin et al., 2022, Table 3 and Figure 6) under secure aggregation.

FedNLP freezes DistilBERT's embeddings and its bottom k layers (E + L0..k-1), trains the rest whole,
and compares centralised training with FedOPT on 20News: fewer trainable layers mean smaller uploads,
and federated learning loses more from freezing than centralised training does. Here, on BBC topics
(`fl_algorithms.tasks.classification`) with MiniLM (6 layers): for each k the embeddings and bottom
k layers are frozen (their states cached once per client) and the top 6 - k layers and the head train
whole (`TextTaskConfig(tune='layers')`); every upload goes through the plan's secure protocol, so
the table also shows what a secure round costs per trainable parameter count. A reference row gives
the grid's default: adapters in the top two layers (a few tens of thousands of parameters).

Centralised = one model trained on every training example (one AdamW run, one epoch per federated
round). SIMPLIFICATION, stated: its test split is 20% of the whole corpus while the federated score
is the mean of the clients' own test splits (FedNLP tests both on one global test set).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fl_algorithms.experiments.fednlp_grid import ALGORITHMS, PROTOCOLS, GridPlan, TASK_DEFAULTS, run_cell
from fl_algorithms.tasks.classification import ClassificationClients
from fl_algorithms.tasks.formulation import FormulationSettings

REFERENCE = "adapters"


@dataclass(frozen=True)
class FreezingPlan:
    frozen: tuple[int, ...] = (0, 2, 4, 5)
    """Bottom layers frozen (with the embeddings); the layers above train whole."""
    rounds: int = 4
    clients: int = 4
    max_examples: int | None = 320
    algorithm: str = "fedopt"
    """FedNLP's study uses FedOPT (server SGD with momentum)."""
    protocol: str = "secagg+"
    lr: float = 1e-4
    """Client AdamW lr when whole layers train (FedNLP fine-tunes DistilBERT at 5e-5); the adapters
    reference row keeps the grid's classification lr."""
    adapter_layers: int = 2
    """The reference row's adapted top layers."""
    seed: int = 0
    training_protocol: str = "fednlp"
    """The federated clients' declared protocol (`GridPlan.training_protocol`); the centralised run keeps one
    AdamW across its epochs, as centralised training does."""

    def __post_init__(self) -> None:
        if not self.frozen or len(set(self.frozen)) != len(self.frozen) or min(self.frozen) < 0:
            raise ValueError(f"frozen must list distinct layer counts >= 0, got {list(self.frozen)}")
        if self.algorithm not in ALGORITHMS or self.protocol not in PROTOCOLS:
            raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)} and protocol one of "
                             f"{', '.join(PROTOCOLS)}")
        if self.rounds < 1 or self.clients < 2 or not self.lr > 0:
            raise ValueError("need rounds >= 1, clients >= 2 and lr > 0")

    def variants(self) -> list[dict[str, Any]]:
        """One row per frozen depth, then the adapters reference."""
        rows = [dict(variant="E" if k == 0 else "E+L0" if k == 1 else f"E+L0..{k - 1}", frozen=k, tune="layers", lr=self.lr) for k in self.frozen]
        rows.append(dict(variant=REFERENCE, frozen=None, tune="adapters", lr=TASK_DEFAULTS["classification"]["lr"]))
        return rows


def _clients(plan: FreezingPlan, variant: Mapping[str, Any], *, clients: int, layers: int, backbone: str,
             device: str) -> ClassificationClients:
    settings = FormulationSettings(**{**TASK_DEFAULTS["classification"], "clients": clients,
                                      "max_examples": plan.max_examples, "min_client_examples": 20,
                                      "adapter_layers": layers, "lr": variant["lr"], "seed": plan.seed,
                                      "tune": variant["tune"]})
    return ClassificationClients(settings, backbone=backbone, device=device)


def run_freezing(plan: FreezingPlan, *, backbone: str = "minilm", device: str = "cpu", progress: bool = False,
                 on_row: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Centralised and federated accuracy, trainable (uploaded) parameters and the secure round's
    cost for every variant of the plan."""
    variants = plan.variants()
    depth = len(_clients(plan, variants[0], clients=plan.clients, layers=1, backbone=backbone,
                         device=device).backbone[0].encoder.layer)
    too_deep = [k for k in plan.frozen if k >= depth]
    if too_deep:  # refused before any run
        raise ValueError(f"frozen {too_deep}: the backbone has {depth} layers; at least one must train")
    rows = []
    for variant in variants:
        start = time.perf_counter()
        layers = plan.adapter_layers if variant["frozen"] is None else depth - variant["frozen"]
        row: dict[str, Any] = {"variant": variant["variant"], "frozen": variant["frozen"], "tune": variant["tune"],
                               "lr": variant["lr"]}
        central = _clients(plan, variant, clients=1, layers=layers, backbone=backbone, device=device)
        trainer, curve = central.make_trainer(1), []
        for _ in range(plan.rounds):  # one AdamW run over all the data, an epoch per federated round
            trainer.train(epochs=1)
            curve.append(trainer.evaluate(split="validation")[central.metric])
        row.update(central=trainer.evaluate(split="test")[central.metric], central_curve=curve)
        federated = _clients(plan, variant, clients=plan.clients, layers=layers, backbone=backbone, device=device)
        grid = GridPlan(tasks=("classification",), algorithms=(plan.algorithm,), rounds=plan.rounds,
                        seeds=(plan.seed,), protocols=(plan.protocol,), training_protocol=plan.training_protocol)
        cell = dict(task="classification", partition="iid", seed=plan.seed, protocol=plan.protocol,
                    algorithm=plan.algorithm)
        summary, _ = run_cell(cell, federated, grid, progress=progress)
        row.update(federated=summary["score"], federated_curve=summary["curve"], trainable=summary["parameters"],
                   secure_seconds_per_round=summary["secure_seconds_per_round"],
                   round_seconds=summary["round_seconds"],
                   bytes_uploaded_per_client_round=summary["bytes_uploaded_per_client_round"],
                   clipped_values=summary["clipped_values"], training_protocol=summary["training_protocol"])
        row["seconds"] = time.perf_counter() - start
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows


def write_freezing(rows: Sequence[Mapping[str, Any]], *, csv_path: Path, md_path: Path) -> None:
    """The study as CSV and a Markdown table like FedNLP's Table 3."""
    import csv

    columns = ["variant", "frozen", "tune", "lr", "trainable", "central", "federated", "round_seconds",
               "secure_seconds_per_round", "bytes_uploaded_per_client_round", "clipped_values"]
    with open(csv_path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    lines = ["| frozen | trainable (uploaded) | central acc | federated acc | round s | secure sum s/round | "
             "upload MB/client/round |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['variant']} | {r['trainable']:,} | {r['central']:.4f} | {r['federated']:.4f} | "
                     f"{r['round_seconds']:.2f} | {r['secure_seconds_per_round']:.3f} | "
                     f"{r['bytes_uploaded_per_client_round'] / 1e6:.2f} |")
    md_path.write_text("\n".join(lines) + "\n")


def plot_freezing(rows: Sequence[Mapping[str, Any]], *, path: Path, federated: str = "federated") -> Path:
    """Accuracy against frozen layers, centralised and federated (FedNLP's Figure 6 in one panel),
    with the adapters reference as horizontal lines; `federated` labels the federated runs."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    layered = sorted((r for r in rows if r["frozen"] is not None), key=lambda r: r["frozen"])
    fig = Figure(figsize=(5.5, 3.6))
    ax = fig.subplots()
    for key, style in (("central", "o-"), ("federated", "s-")):
        ax.plot([r["frozen"] for r in layered], [r[key] for r in layered], style,
                label="centralised" if key == "central" else federated)
    for r in rows:
        if r["frozen"] is None:
            ax.axhline(r["federated"], linestyle=":", color="grey", label=f"{r['variant']}, {federated}")
    ax.set_xlabel("frozen layers below the trained ones (embeddings always frozen)")
    ax.set_ylabel("test accuracy")
    ax.set_xticks([r["frozen"] for r in layered])
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


__all__ = ["FreezingPlan", "run_freezing", "write_freezing", "plot_freezing", "REFERENCE"]

