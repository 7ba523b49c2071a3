"""AdaFedSelectKD's comparison (Feng et al., Table II-V): AdaFedSelectKD, AdaFedKD, AdaFedAvg,
AdaCentralized and Local, per data setting and seed, every federated upload through secure aggregation.

One cell is (setting, seed, method). Each reports ROUGE-1/2/L on every client's test split with the
model that client would use (its A_l for the distillation methods, the global adapter for AdaFedAvg,
its own for Local, the pooled one for AdaCentralized), their unweighted mean, the validation ROUGE-L
curve per round, and for the distillation methods the share of target tokens whose KL term counted.
Local trains `rounds x local_epochs` epochs alone; AdaCentralized as many epochs over the pooled
training rows.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fl_algorithms.algorithms.adafedselectkd import ADAPTER_PART, AdaFedKD, AdaFedSelectKD, scaled_threshold
from fl_algorithms.algorithms.fedavg import FedAvg
from fl_algorithms.algorithms.local import Local
from fl_algorithms.engine.sim import RoundRecord, RunConfig, SimulationRunner
from fl_algorithms.engine.secure_sum import SecureAggregationConfig
from fl_algorithms.experiments.config import check_choices, check_seeds
from fl_algorithms.experiments.tables import grouped, plot_mean_curves, pyplot, save_figure, summarise
from fl_algorithms.tasks.summarization import SETTINGS, SummaryClients, SummarySettings

METHODS = ("adafedselectkd", "adafedkd", "adafedavg", "adacentralized", "local")
DISTILLING = ("adafedselectkd", "adafedkd")
ROUGE = ("rouge1", "rouge2", "rougeL")
PROTOCOLS = ("secagg", "secagg+", "lightsecagg")


@dataclasses.dataclass(frozen=True)
class SummaryPlan:
    """The grid: settings x seeds x methods, with the data and model settings every cell shares."""

    settings: tuple[str, ...] = SETTINGS
    seeds: tuple[int, ...] = (0, 1, 2)
    methods: tuple[str, ...] = METHODS
    rounds: int = 10
    local_epochs: int = 1
    protocol: str = "secagg+"
    clip: float = 1.0
    """Fixed-point range of each uploaded adapter-delta coordinate."""
    data: SummarySettings = SummarySettings()
    """Every field but `setting` and `seed`, which each cell sets."""

    def __post_init__(self) -> None:
        check_choices("settings", self.settings, SETTINGS)
        check_choices("methods", self.methods, METHODS)
        check_seeds(self.seeds)
        if self.rounds < 1 or self.local_epochs < 1 or not self.clip > 0:
            raise ValueError("rounds and local_epochs must be positive, clip > 0")
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}")

    def cells(self) -> list[dict[str, Any]]:
        return [{"setting": s, "seed": seed, "method": m} for s in self.settings for seed in self.seeds
                for m in self.methods]

    def clients_for(self, *, setting: str, seed: int, backbone: str, device: str, cache_dir: str | Path | None,
                    progress: bool) -> SummaryClients:
        data = dataclasses.replace(self.data, setting=setting, seed=seed)
        return SummaryClients(data, backbone=backbone, device=device, cache_dir=cache_dir, progress=progress)

    def record(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_record(cls, raw: Mapping[str, Any]) -> "SummaryPlan":
        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if k != "data"}
        return cls(**fields, data=SummarySettings(**raw["data"]))


def cell_key(cell: Mapping[str, Any]) -> str:
    return f"{cell['setting']}/{cell['seed']}/{cell['method']}"


def make_algorithm(method: str, *, vocab_size: int, local_epochs: int):
    if method == "adafedselectkd":
        return AdaFedSelectKD(threshold=scaled_threshold(vocab_size), local_epochs=local_epochs)
    if method == "adafedkd":
        return AdaFedKD(local_epochs=local_epochs)
    if method == "adafedavg":
        return FedAvg(local_epochs=local_epochs)
    if method == "local":
        return Local(local_epochs=local_epochs)
    raise ValueError(f"{method!r} is not a federated method")


def _per_client(names: Sequence[str], metrics: Mapping[int, Mapping[str, float]]) -> dict[str, dict[str, float]]:
    return {names[k - 1]: {key: float(metrics[k][key]) for key in ROUGE} for k in sorted(metrics)}


def run_federated(method: str, clients: SummaryClients, plan: SummaryPlan, *, progress: bool,
                  on_round: Callable[[RoundRecord], None] | None = None) -> dict[str, Any]:
    """AdaFedSelectKD, AdaFedKD, AdaFedAvg (secure sums) or Local (nothing leaves a client)."""
    vocab = clients.backbone[0].config.vocab_size
    algorithm = make_algorithm(method, vocab_size=vocab, local_epochs=plan.local_epochs)
    n = clients.num_clients
    secure = SecureAggregationConfig(protocol=plan.protocol, clip=plan.clip, max_weight=float(max(clients.train_sizes())),
                                     max_clients=n, min_release_group=n)
    config = RunConfig(rounds=plan.rounds, seed=clients.settings.seed, sampler="seeded", curve_split="validation",
                       secure=secure)
    trainers = {k: clients.make_trainer(k, distill=method in DISTILLING) for k in range(1, n + 1)}
    initial = clients.initial()
    runner = SimulationRunner(algorithm=algorithm, config=config, initial=initial, trainers=trainers)
    runner.on_round = on_round
    history = runner.run(progress=progress, desc=method)
    final = history[-1]
    out = {"clients": _per_client(clients.client_names, final.metrics),
           "curve": [r.mean("validation_rougeL") for r in history],
           "secure_seconds_per_round": float(np.mean([r.secure_seconds for r in history])),
           "parameters": int(initial[ADAPTER_PART].size)}
    if method in DISTILLING:
        out["kd_token_share_per_round"] = [r.mean("kd_token_share") for r in history]
        out["kd_token_share"] = float(np.mean(out["kd_token_share_per_round"]))
    return out


def run_centralized(clients: SummaryClients, plan: SummaryPlan) -> dict[str, Any]:
    """AdaCentralized: one adapter over the pooled training rows, `local_epochs` per round."""
    trainer = clients.pooled_trainer()
    ids = range(1, clients.num_clients + 1)
    curve = []
    for _ in range(plan.rounds):
        trainer.train(epochs=plan.local_epochs)
        curve.append(float(np.mean([trainer.evaluate(split=f"validation_{k}")["rougeL"] for k in ids])))
    metrics = {k: trainer.evaluate(split=f"test_{k}") for k in ids}
    return {"clients": _per_client(clients.client_names, metrics), "curve": curve, "secure_seconds_per_round": 0.0,
            "parameters": sum(p.numel() for p in trainer.trainable())}


def run_summary_cell(cell: Mapping[str, Any], clients: SummaryClients, plan: SummaryPlan, *,
                     progress: bool) -> dict[str, Any]:
    """One (setting, seed, method): per-client and mean test ROUGE, curve, costs."""
    start = time.perf_counter()
    if cell["method"] == "adacentralized":
        out = run_centralized(clients, plan)
    else:
        out = run_federated(cell["method"], clients, plan, progress=progress)
    scores = out["clients"]
    return {**cell, **out, **{key: float(np.mean([c[key] for c in scores.values()])) for key in ROUGE},
            "seconds": time.perf_counter() - start, "train_sizes": clients.train_sizes(),
            **clients.pretraining}


def aggregate(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Mean ± sample std over seeds per (setting, method): ROUGE means and each client's ROUGE-L."""
    out = []
    for (setting, method), members in grouped(rows, lambda row: (row["setting"], row["method"])).items():
        series = {key: [m[key] for m in members] for key in ROUGE}
        for name in members[0]["clients"]:
            for key in ROUGE:
                series[f"{name}_{key}"] = [m["clients"][name][key] for m in members]
        if "kd_token_share" in members[0]:
            series["kd_token_share"] = [m["kd_token_share"] for m in members]
        out.append(summarise({"setting": setting, "method": method, "seeds": len(members)}, series))
    return out


def _pm(entry: Mapping[str, Any], key: str) -> str:
    return f"{100 * entry[key]:.2f} ± {100 * entry[key + '_std']:.2f}"


def write_table(rows: Sequence[Mapping[str, Any]], *, csv_path: Path, md_path: Path) -> None:
    """ROUGE x 100 per setting and method (mean ± std over seeds), then per client (CSV: every number)."""
    import csv

    table = aggregate(rows)
    if not table:
        raise ValueError("no finished cells")
    columns = list(dict.fromkeys(k for entry in table for k in entry))
    with open(csv_path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(table)
    lines = []
    for setting in dict.fromkeys(e["setting"] for e in table):
        entries = [e for e in table if e["setting"] == setting]
        names = list(dict.fromkeys(k[:-len("_rougeL")] for e in entries for k in e
                                   if k.endswith("_rougeL") and not k.endswith("_std") and k != "rougeL"))
        lines += [f"### {setting}: mean over clients (ROUGE x 100, mean ± std over seeds)", "",
                  "| method | seeds | ROUGE-1 | ROUGE-2 | ROUGE-L | KD tokens |", "|---|---|---|---|---|---|"]
        for e in entries:
            share = f"{100 * e['kd_token_share']:.1f}%" if "kd_token_share" in e else "–"
            lines.append(f"| {e['method']} | {e['seeds']} | " + " | ".join(_pm(e, key) for key in ROUGE)
                         + f" | {share} |")
        lines += ["", f"### {setting}: per client, ROUGE-1 / ROUGE-2 / ROUGE-L (x 100, mean over seeds)", "",
                  "| method | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for e in entries:
            lines.append(f"| {e['method']} | " + " | ".join(
                " / ".join(f"{100 * e[f'{n}_{key}']:.2f}" for key in ROUGE) for n in names) + " |")
        lines.append("")
    md_path.write_text("\n".join(lines))


def plot_curves(rows: Sequence[Mapping[str, Any]], *, path: Path) -> Path:
    """Validation ROUGE-L per round, one panel per setting, mean over seeds per method."""
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    fig, axes = pyplot().subplots(1, len(settings), figsize=(4.5 * len(settings), 3.4), squeeze=False)
    for ax, setting in zip(axes[0], settings):
        plot_mean_curves(ax, [r for r in rows if r["setting"] == setting], METHODS)
        ax.set_title(setting)
        ax.set_xlabel("round")
        ax.set_ylabel("validation ROUGE-L (mean over clients)")
    return save_figure(fig, path)


__all__ = ["METHODS", "DISTILLING", "ROUGE", "PROTOCOLS", "SummaryPlan", "cell_key", "make_algorithm", "run_federated",
           "run_centralized", "run_summary_cell", "aggregate", "write_table", "plot_curves"]
