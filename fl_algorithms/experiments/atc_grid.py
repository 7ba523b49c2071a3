"""ATC's comparison (ATC paper, Table 2): ATC through secure aggregation, its ASSIGN-only ablation, the
flagged insecure reference, and Isolated, FedAvg, FedAvg+FT, FedProx, Ditto and FedBN, all over the
same 18 heterogeneous clients (`tasks.hetero`), per seed.

One cell is (seed, method). It reports each client's test metric after the last round (accuracy,
span F1, SQuAD F1 or ROUGE-L by formulation), their mean per dataset, and the average over the six
datasets (the paper's 'avg'); plus what the server saw (`leakage`): the secure sums per round with
their sizes, the subset-sum recoverability attack on every family of overlapping sums, and the
neighbour-sketch epsilon from the server's ledger.

Every method trains under one declared protocol (`ATCPlan.training_protocol`, `hetero_trainer.
hetero_protocol`): by default the ATC paper's (Sec. 4.3, as FederatedScope runs it), with `kept-adamw`
(this grid's protocol before issue 55) available by name. Every method does one epoch of task training
per round: Ditto's global and personal problems split one epoch's batches (`SplitEpochDitto`). ATC's
contrastive rounds log the contrastive term's gradient against the task loss's (`contrast_report`), and
`results_document` sets the per-dataset gains beside the paper's Table 2 (`PAPER_TABLE2`).
"""
from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dp.leakage.recoverability import recoverable_clients
from dp.ledger import Ledger
from dp.sketches import DPSketcher, SketchConfig
from fl_algorithms.algorithms.atc import ATC, ATCConfig
from fl_algorithms.algorithms.ditto import PERSONAL, Ditto
from fl_algorithms.algorithms.fedavg import FedAvg
from fl_algorithms.algorithms.fedbn import FedAvgFT, FedBN
from fl_algorithms.algorithms.fedprox import FedProx
from fl_algorithms.algorithms.local import Local
from fl_algorithms.api import ClientBroadcast, ClientContext, Masked, Upload
from fl_algorithms.choices import ATC_DITTO_WORK as DITTO_WORK, ATC_METHODS as METHODS
from fl_algorithms.engine.secure_sum import SecureAggregationConfig
from fl_algorithms.engine.sim import RoundRecord, RunConfig, SimulationRunner
from fl_algorithms.experiments.config import check_choices, check_seeds
from fl_algorithms.experiments.tables import grouped, paired_difference, plot_mean_curves, pyplot, save_figure, summarise
from fl_algorithms.tasks.hetero import LAYOUT, HeteroClient
from fl_algorithms.training.hetero_trainer import (METRIC, PROTOCOL_NAMES, HeteroConfig, HeteroFactory, HeteroProtocol,
                                                   HeteroTrainer, hetero_protocol)
from nlp_models.device import device_name

SECURE = tuple(m for m in METHODS if m != "atc_reference")
ASSIGNING = ("atc_secure", "atc_reference", "assign_only")
"""The methods that run ATC's ASSIGN rounds before the task rounds."""
BASELINES = ("fedavg", "fedavg_ft", "isolated", "ditto", "fedprox", "fedbn")
"""The paper's baselines (Table 2) that the grid runs: 'best baseline' is the best of these per seed."""
EVALUATION = {"atc_secure": "personal model", "atc_reference": "personal model", "assign_only": "personal model",
              "fedavg": "after aggregation", "fedavg_ft": "after local adaptation", "isolated": "personal model",
              "ditto": "personal model", "fedprox": "after aggregation", "fedbn": "after aggregation"}
"""Where each method's clients are evaluated (the protocol's `evaluation`)."""


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
    training_protocol: str = "atc-paper"
    """The clients' declared training protocol (`hetero_trainer.PROTOCOL_NAMES`): 'atc-paper' (the
    default) or 'kept-adamw' (AdamW at `model.lr`, kept, constant lr, no clipping: the grid before)."""
    ditto_work: str = "split-epoch"
    """`DITTO_WORK`: Ditto within every method's one epoch per round, or one epoch per problem (before)."""

    def __post_init__(self) -> None:
        check_choices("methods", self.methods, METHODS)
        check_seeds(self.seeds)
        if self.training_protocol not in PROTOCOL_NAMES:
            raise ValueError(f"training_protocol must be one of {', '.join(PROTOCOL_NAMES)}, "
                             f"got {self.training_protocol!r}")
        if self.ditto_work not in DITTO_WORK:
            raise ValueError(f"ditto_work must be one of {', '.join(DITTO_WORK)}, got {self.ditto_work!r}")
        if self.rounds < 2:
            raise ValueError("rounds must be at least 2 (CONTRAST's targets come from the previous round)")
        if not (self.sketch_epsilon > 0 and self.sketch_dim >= 1 and self.clip > 0):
            raise ValueError("need sketch_epsilon > 0, sketch_dim >= 1 and clip > 0")

    def cells(self) -> list[dict[str, Any]]:
        return [{"seed": seed, "method": m} for seed in self.seeds for m in self.methods]

    def record(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def protocol_for(self, method: str) -> HeteroProtocol:
        """The declared protocol of `method`'s clients (the same optimiser, lifetime, schedule and clipping
        for every method; its evaluation point is the method's)."""
        return hetero_protocol(self.training_protocol, evaluation=EVALUATION[method], kept_lr=self.model.lr,
                               local_epochs=self.atc.local_epochs)

    def assign_steps(self) -> int:
        """ASSIGN's optimiser steps per client: rounds x steps per round."""
        return self.atc.assign_rounds * self.model.pretrain_batches

    @classmethod
    def from_record(cls, raw: Mapping[str, Any]) -> "ATCPlan":
        """The inverse of `record`; a plan saved before protocols were declared ran `kept-adamw` and Ditto's
        two epochs, and resumes so."""
        def tuples(d: Mapping[str, Any]) -> dict[str, Any]:
            return {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}

        nested = {"model": HeteroConfig, "atc": ATCConfig}
        before = {"training_protocol": "kept-adamw", "ditto_work": "two-epochs"}
        return cls(**{**before, **{k: v for k, v in tuples(raw).items() if k not in nested}},
                   **{k: kind(**tuples(raw[k])) for k, kind in nested.items()})


def cell_key(cell: Mapping[str, Any]) -> str:
    return f"{cell['seed']}/{cell['method']}"


def total_rounds(method: str, plan: ATCPlan) -> int:
    """ATC's methods run ASSIGN before the task rounds every method gets."""
    return plan.rounds + (plan.atc.assign_rounds if method in ASSIGNING else 0)


class SplitEpochDitto(Ditto):
    """Ditto within one epoch of local work per round, every other method's budget: the round's batches
    (one shuffle) go alternately to the global problem (batches 0, 2, 4, ...) and the personal one (1, 3,
    ...), so the two together take one epoch's steps and see each training example once. Otherwise
    Ditto: the global update is summed, the personal model is pulled to w^t by lambda."""

    name = "ditto"

    def client_update(self, *, broadcast: ClientBroadcast, client: ClientContext) -> tuple[Upload, Mapping[str, Any]]:
        trainer = client.trainer
        if self.local_epochs != 1 or self.personal_epochs != 1:
            raise ValueError("SplitEpochDitto splits one epoch: local_epochs and personal_epochs must be 1")
        w_t = {k: np.array(broadcast[k]) for k in broadcast}
        trainer.set_shared(w_t)
        global_metrics = trainer.train(epochs=1, round=client.round, share=(0, 2))
        w_k = trainer.get_shared()
        deltas = {k: Masked(w_k[k] - w_t[k], weight=trainer.num_examples) for k in w_t}
        trainer.set_shared(client.state.get(PERSONAL) or w_t)
        personal_metrics = trainer.train(epochs=1, proximal=w_t, mu=self.lam, round=client.round, share=(1, 2))
        metrics = {**global_metrics, **{f"personal_{k}": v for k, v in personal_metrics.items()},
                   "round_steps": global_metrics["steps"] + personal_metrics["steps"]}
        return Upload(masked=deltas, metrics=metrics), {**client.state, PERSONAL: trainer.get_shared()}


class StagedFedAvgFT(FedAvgFT):
    """FedAvg+FT whose evaluation-time fine-tuning is a stage of its own (`HeteroTrainer.as_stage`): under
    a stage-long schedule it gets a fresh optimiser and a schedule over its one run, not the tail of the
    task stage's decay (lr near 0 after the last round)."""

    def evaluate(self, *, parameters: Mapping[str, np.ndarray], client: ClientContext, split: str) -> dict[str, float]:
        with client.trainer.as_stage("finetune"):
            return super().evaluate(parameters=parameters, client=client, split=split)


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
        return StagedFedAvgFT(local_epochs=epochs, finetune_epochs=1)
    if method == "isolated":
        return Local(local_epochs=epochs)
    if method == "ditto":
        if plan.ditto_work == "split-epoch":
            return SplitEpochDitto(lam=plan.ditto_lambda, local_epochs=epochs)
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
    protocol = plan.protocol_for(method)
    trainers: dict[int, HeteroTrainer] = {c: factory.trainer(clients[c], protocol=protocol) for c in sorted(clients)}
    for trainer in trainers.values():
        trainer.plan_stages(pretrain=plan.atc.assign_rounds if method in ASSIGNING else 0, task=plan.rounds)
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
            "contrast": contrast_report(trainers), "training_protocol": protocol.training.name,
            "assign_steps": plan.assign_steps() if method in ASSIGNING else 0,
            "seconds": time.perf_counter() - start, "device": device_name(factory.device)}


LOG2 = math.log(2.0)


def contrast_report(trainers: Mapping[int, HeteroTrainer]) -> dict[str, Any]:
    """What ATC's contrastive term did, from each client's `contrast_log`: per round and client the term's
    value (log 2 = the positive and negative equally close, tau = 1), the norms of its gradient and of the
    task loss's over the shared parameters (means over the probed steps), and their ratio; summarised over
    every (round, client). Empty ('probes': 0) for a method without the term."""
    entries = [{"client": c, **e} for c, t in sorted(trainers.items()) for e in t.contrast_log]
    if not entries:
        return {"probes": 0}
    per_round = []
    for round in sorted({e["round"] for e in entries}):
        here = [e for e in entries if e["round"] == round]
        per_round.append({"round": int(round), **{k: float(np.mean([e[k] for e in here]))
                                                  for k in ("loss", "contrast_grad_norm", "task_grad_norm", "ratio",
                                                            "cos_positive", "cos_negative")}})
    losses = np.array([e["loss"] for e in entries])
    ratios = np.array([e["ratio"] for e in entries])
    return {"probes": int(sum(e["probes"] for e in entries)), "client_rounds": len(entries),
            "loss_mean": float(losses.mean()), "loss_min": float(losses.min()), "loss_max": float(losses.max()),
            "loss_minus_log2_mean": float((losses - LOG2).mean()),
            "share_within_0.01_of_log2": float(np.mean(np.abs(losses - LOG2) < 0.01)),
            "contrast_grad_norm_mean": float(np.mean([e["contrast_grad_norm"] for e in entries])),
            "task_grad_norm_mean": float(np.mean([e["task_grad_norm"] for e in entries])),
            "ratio_median": float(np.median(ratios)), "ratio_mean": float(ratios.mean()),
            "ratio_max": float(ratios.max()),
            "cos_gap_mean": float(np.mean([e["cos_positive"] - e["cos_negative"] for e in entries])),
            "per_round": per_round,
            "per_client_round": [{k: (int(v) if k in ("client", "round") else float(v)) for k, v in e.items()}
                                 for e in entries]}


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


# ---- the paper's Table 2 beside ours ------------------------------------------------------------------
PAPER_TABLE2: dict[str, dict[str, tuple[float, ...]]] = {
    "atc": {"imdb": (79.72,), "agnews": (92.86,), "squad": (46.35, 49.83), "newsqa": (22.58, 34.24),
            "cnndm": (37.88, 15.79, 34.13), "msqg": (28.14, 3.12, 16.39)},
    "assign_only": {"imdb": (79.39,), "agnews": (92.71,), "squad": (48.38, 50.78), "newsqa": (20.37, 29.87),
                    "cnndm": (37.31, 15.39, 33.65), "msqg": (26.40, 2.33, 15.42)},
    "isolated": {"imdb": (78.81,), "agnews": (92.04,), "squad": (43.25, 45.14), "newsqa": (12.01, 22.39),
                 "cnndm": (37.01, 15.14, 33.33), "msqg": (21.32, 1.61, 11.77)},
    "fedavg": {"imdb": (79.14,), "agnews": (92.20,), "squad": (46.17, 48.88), "newsqa": (15.65, 24.54),
               "cnndm": (32.64, 11.35, 29.59), "msqg": (21.98, 1.67, 12.93)},
    "fedprox": {"imdb": (79.88,), "agnews": (92.47,), "squad": (46.28, 49.13), "newsqa": (14.62, 23.57),
                "cnndm": (27.82, 7.89, 25.45), "msqg": (19.08, 0.96, 10.89)},
    "ditto": {"imdb": (79.48,), "agnews": (92.78,), "squad": (42.83, 46.49), "newsqa": (18.66, 30.03),
              "cnndm": (35.41, 13.77, 32.02), "msqg": (22.99, 1.79, 13.31)},
    "fedbn": {"imdb": (79.66,), "agnews": (92.58,), "squad": (45.32, 48.38), "newsqa": (16.64, 26.10),
              "cnndm": (32.82, 11.54, 29.72), "msqg": (22.10, 1.65, 12.96)},
}
"""ATC paper, Table 2 (x 100): per dataset its metrics (IMDB, AGNews: accuracy; SQuAD, NewsQA: EM, F1;
CNN/DM: ROUGE-1/2/L; MSQG: ROUGE-L, BLEU-4, METEOR) for ATC, ATC w/o CONTRAST (our ASSIGN-only) and the
baselines the grid also runs. A dataset's score is the mean of its metrics; their mean over the six
datasets is the paper's AVG (49.04 for ATC, 45.95 for FedAvg)."""
STAND_INS: dict[str, tuple[str, str, str]] = {
    "rt_sentiment": ("imdb", "IMDB", "same formulation: sentiment classification (short reviews, not long)"),
    "bbc_topic": ("agnews", "AGNews", "same formulation: news topic classification"),
    "cloze_qa": ("squad", "SQuAD", "same formulation: extractive QA (cloze questions over BBC, not crowd-written)"),
    "tweets_ner": ("newsqa", "NewsQA", "replaced: tagging, not QA (no second offline QA corpus)"),
    "bbc_headline": ("cnndm", "CNN/DM", "generation, but a headline from the body, not a multi-sentence summary"),
    "debates_party": ("msqg", "MSQG", "replaced: classification, not question generation (no second generation corpus)"),
}
"""Per stand-in dataset (tasks.hetero): the paper's dataset in its place (the same position and client
count in the 1/3/3/2/5/4 layout), its display name, and how far the stand-in matches it."""


def paper_scores(method: str) -> dict[str, float]:
    """The paper's per-dataset scores (mean of each dataset's metrics, x 100) of `method`, and 'avg'."""
    table = {name: float(np.mean(values)) for name, values in PAPER_TABLE2[method].items()}
    return {**table, "avg": float(np.mean(list(table.values())))}


def _by_seed(rows: Sequence[Mapping[str, Any]], method: str, key: Callable[[Mapping[str, Any]], float]) -> dict[int, float]:
    return {int(r["seed"]): float(key(r)) for r in rows if r["method"] == method}


def seed_differences(rows: Sequence[Mapping[str, Any]], *, method: str = "atc_secure") -> dict[str, Any]:
    """`method` minus FedAvg and minus the best baseline (`BASELINES`, the best per seed by its average),
    per seed (x 100) and as a mean with a 95% Student-t interval over seeds (nan bounds with one seed)."""
    ours = _by_seed(rows, method, lambda r: 100 * r["avg"])
    out: dict[str, Any] = {"method": method}
    fedavg = _by_seed(rows, "fedavg", lambda r: 100 * r["avg"])
    if ours and fedavg:
        out["minus_fedavg"] = {"per_seed": {str(s): ours[s] - fedavg[s] for s in ours if s in fedavg},
                               **(paired_difference(ours, fedavg) or {})}
    best: dict[int, tuple[float, str]] = {}
    for row in rows:
        if row["method"] in BASELINES:
            seed, value = int(row["seed"]), 100 * float(row["avg"])
            if seed not in best or value > best[seed][0]:
                best[seed] = (value, row["method"])
    if ours and best:
        theirs = {s: v for s, (v, _) in best.items()}
        out["minus_best_baseline"] = {"per_seed": {str(s): ours[s] - theirs[s] for s in ours if s in theirs},
                                      "best_baseline": {str(s): m for s, (_, m) in best.items()},
                                      **(paired_difference(ours, theirs) or {})}
    return out


def paper_comparison(rows: Sequence[Mapping[str, Any]], *, method: str = "atc_secure") -> list[dict[str, Any]]:
    """Per dataset and for the average: the paper's ATC minus FedAvg (Table 2) and its share of the paper's
    average gain, beside ours (`method` minus FedAvg, x 100, mean over seeds with its 95% t-interval)."""
    paper_atc, paper_fedavg = paper_scores("atc"), paper_scores("fedavg")
    total_gain = paper_atc["avg"] - paper_fedavg["avg"]
    out = []
    for name in [e.name for e in LAYOUT] + ["avg"]:
        key = STAND_INS[name][0] if name != "avg" else "avg"
        gain = paper_atc[key] - paper_fedavg[key]
        get = (lambda r: 100 * r["avg"]) if name == "avg" else (lambda r, n=name: 100 * r["datasets"].get(n, np.nan))
        diff = paired_difference(_by_seed(rows, method, get), _by_seed(rows, "fedavg", get))
        out.append({"dataset": name, "paper_dataset": STAND_INS[name][1] if name != "avg" else "AVG",
                    "stand_in": STAND_INS[name][2] if name != "avg" else "",
                    "paper_atc_minus_fedavg": gain,
                    "paper_share_of_avg_gain": (gain / len(LAYOUT) / total_gain) if name != "avg" else 1.0,
                    "ours_minus_fedavg": diff})
    return out


def contrast_summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per method with a contrastive term, per seed: its `contrast_report` summary (per round included)."""
    out: dict[str, Any] = {}
    for row in rows:
        report = row.get("contrast", {})
        if report.get("probes"):
            out.setdefault(row["method"], {})[str(row["seed"])] = report
    return out


def results_document(rows: Sequence[Mapping[str, Any]], *, plan: ATCPlan, line: str) -> dict[str, Any]:
    """results.json of a finished grid: the plan and every method's declared protocol
    (`TrainingProtocol.to_dict()`, with the schedule's span), per seed and method the average and the
    per-dataset metrics (x 1, as cells.jsonl), their means over seeds, ATC-secure minus FedAvg and minus the
    best baseline per seed with 95% t-intervals, the per-dataset table beside the paper's, and the
    contrastive term's log."""
    per_seed: dict[str, dict[str, Any]] = {}
    for row in rows:
        per_seed.setdefault(str(row["seed"]), {})[row["method"]] = {
            "avg": row["avg"], "datasets": row["datasets"], "seconds": row["seconds"], "device": row.get("device"),
            "training_protocol": row.get("training_protocol", "kept-adamw"), "assign_steps": row.get("assign_steps", 0)}
    return {"plan": plan.record(),
            "training_protocol": {m: plan.protocol_for(m).training.to_dict() for m in plan.methods},
            "schedule_span": plan.protocol_for(plan.methods[0]).record(),
            "assign_steps_per_client": plan.assign_steps(),
            "per_seed": per_seed, "methods": aggregate(rows),
            "differences": seed_differences(rows), "paper_comparison": paper_comparison(rows),
            "contrast": contrast_summary(rows), "line": line}


def paper_table_markdown(comparison: Sequence[Mapping[str, Any]]) -> str:
    """`paper_comparison` as a Markdown table."""
    lines = ["| ours | paper's dataset in its place | paper: ATC - FedAvg | share of the paper's avg gain | "
             "ours: ATC-secure - FedAvg (95% t-interval) | stand-in |", "|---|---|---|---|---|---|"]
    for e in comparison:
        d = e["ours_minus_fedavg"] or {}
        ours = "–" if not d else (f"{d['mean']:+.2f}" + ("" if d["seeds"] < 2 else
                                                          f" [{d['low']:+.2f}, {d['high']:+.2f}]") + f" ({d['seeds']} seeds)")
        lines.append(f"| {e['dataset']} | {e['paper_dataset']} | {e['paper_atc_minus_fedavg']:+.2f} | "
                     f"{100 * e['paper_share_of_avg_gain']:.0f}% | {ours} | {e['stand_in']} |")
    return "\n".join(lines) + "\n"


__all__ = ["METHODS", "SECURE", "ASSIGNING", "BASELINES", "EVALUATION", "DITTO_WORK", "ATCPlan", "cell_key",
           "total_rounds", "SplitEpochDitto", "StagedFedAvgFT", "make_algorithm", "client_scores", "dataset_scores",
           "leakage_report", "neighbour_guard_report", "run_atc_cell", "LOG2", "contrast_report", "aggregate",
           "write_table", "plot_curves", "PAPER_TABLE2", "STAND_INS", "paper_scores", "seed_differences",
           "paper_comparison", "contrast_summary", "results_document", "paper_table_markdown"]
