"""FedNLP's benchmark grid (Lin et al., 2022, Table 2): tasks x algorithms x partitions x protocols x seeds.

Every cell is one federated run in the simulation engine with every upload summed by the chosen
secure-aggregation protocol ('plain' is a plaintext sum, for the secure-vs-plain check). Clients are
a task's `Formulation` (`fl_algorithms.tasks.formulation`); every method of a (task, partition,
seed) starts from the same initial model, sees the same clients and the same cohorts (the seeded
sampler: no DP runs here, so no amplification is claimed).

Clients train under the plan's declared training protocol (`GridPlan.training_protocol`, a preset of
`fl_algorithms.training.protocol`; default FedNLP's: SGD for FedAvg and FedProx, AdamW for FedOPT's
clients, a fresh optimiser with a linear warmup-and-decay schedule every round, gradients clipped to norm
1.0; 'federated-norm' is the all-AdamW control, 'kept-adamw' the grid before protocols were declared).
Every cell records its protocol (`training_protocol` in cells.jsonl).

Each round evaluates every client on its validation split (the learning curve); the last round also
on its test split (the reported score: the mean over clients of each client's test metric).
Results are appended to `cells.jsonl` as each cell finishes, so an interrupted grid resumes where it
stopped (`run_grid(..., resume=True)` skips finished cells).
"""
from __future__ import annotations

import dataclasses
import importlib
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fl_algorithms.algorithms.fedavg import FedAvg
from fl_algorithms.algorithms.fedopt import FedAdagrad, FedAdam, FedAvgM, FedYogi
from fl_algorithms.algorithms.fedprox import FedProx
from fl_algorithms.api import Algorithm
from fl_algorithms.engine.secure_sum import SecureAggregationConfig, SecureAggregator
from fl_algorithms.engine.sim import RoundRecord, RunConfig, SimulationRunner
from fl_algorithms.experiments.tables import grouped, paired_difference, pyplot, save_figure
from fl_algorithms.tasks.formulation import TASKS, Formulation, FormulationSettings, PartitionSpec
from fl_algorithms.training.memo import FirstRunMemo
from fl_algorithms.training.protocol import TrainingProtocol, preset
from nlp_models.device import device_name

FORMULATIONS = {
    "classification": "fl_algorithms.tasks.classification:ClassificationClients",
    "tagging": "fl_algorithms.tasks.tagging:TaggingClients",
    "qa": "fl_algorithms.tasks.qa:QAClients",
    "seq2seq": "fl_algorithms.tasks.seq2seq:HeadlineClients",
}
ALGORITHMS = ("fedavg", "fedprox", "fedopt", "fedadam", "fedadagrad", "fedyogi")
PROTOCOLS = ("plain", "secagg", "secagg+", "lightsecagg")
METRIC_NAMES = {"classification": "acc", "tagging": "span_f1", "qa": "f1", "seq2seq": "rougeL"}

TASK_DEFAULTS: dict[str, dict[str, Any]] = {
    # Client learning rates, each chosen on validation scores only (never test): classification as
    # for the classification example; tagging and QA from quick-budget pilots of FedAvg under
    # SecAgg+ (tagging {3e-3 with 2 local epochs, 1e-2}: validation span F1 0.291 / 0.309; QA
    # {3e-3, 1e-2} at 128 tokens: validation F1 0.311 / 0.415); seq2seq from a centralised pilot of
    # the decoder (3e-4). QA reads 128 tokens: at 64 the passage is so short that its first entity
    # is the answer half the time (first-entity F1 0.61 against 0.46 at 128).
    # SGD's lr (FedAvg and FedProx under the 'fednlp' protocol; `GridPlan.sgd_lrs`, saved with every plan):
    # classification's is the one chosen on validation for examples/fednlp_classification.py (same
    # corpus, backbone and adapters): 3.0 on seed 0 until 2026-11-29 evening, 1.0 by the mean over seeds 0-2
    # since (`FedNLPSettings.sgd_lr`). Tagging's, QA's and seq2seq's from quick-grid pilots of
    # FedAvg under SecAgg+ (seed 0, `--sgd-lr TASK=LR` over a log grid widened until its best was inside;
    # final-round validation score; docs/protocols.md, 2026-11-29): tagging 3 (span F1 0.186; 1: 0.079,
    # 10: diverged to 0), QA 3 (F1 0.462; 1: 0.457, 10: 0.121; chosen for the quick grid's top two layers
    # trained whole, the full grid's adapter reader was not piloted), seq2seq 3 (ROUGE-L 0.079; 0.1: 0.069,
    # 10: 0.004).
    "classification": dict(lr=1e-2, sgd_lr=1.0, max_length=64),
    "tagging": dict(lr=1e-2, sgd_lr=3.0, max_length=64),
    "qa": dict(lr=1e-2, sgd_lr=3.0, max_length=128),
    "seq2seq": dict(lr=3e-4, sgd_lr=3.0, max_length=64),
}


@dataclass(frozen=True)
class AlgorithmSettings:
    """Server-side hyperparameters (FedNLP: FedProx mu 0.01..; FedOPT = server SGD with momentum)."""

    local_epochs: int = 1
    fedprox_mu: float = 0.01
    fedavgm_lr: float = 0.1
    fedavgm_momentum: float = 0.9
    """FedOPT as FedNLP's code runs it: server SGD, lr 0.1, momentum 0.9 (its text-classification
    script and its migrated FedML config). Its paper's text (section 2.2, appendix) fixes the server lr
    at 1.0 instead; both are runs of the same algorithm (`fednlp_benchmark.py --fedopt-server-lr`)."""
    adaptive_lr: float = 1e-2
    """Server lr of FedAdam / FedAdagrad / FedYogi (tau 1e-3, Reddi et al.)."""

    def __post_init__(self) -> None:
        if self.local_epochs < 1 or self.fedprox_mu < 0 or not 0 <= self.fedavgm_momentum < 1:
            raise ValueError("need local_epochs >= 1, fedprox_mu >= 0 and 0 <= fedavgm_momentum < 1")
        if not (self.fedavgm_lr > 0 and self.adaptive_lr > 0):
            raise ValueError(f"server lrs must be positive; got fedavgm_lr={self.fedavgm_lr}, "
                             f"adaptive_lr={self.adaptive_lr}")


def selected_sgd_lrs() -> dict[str, float]:
    """The SGD lr of every task that has one chosen on validation (`TASK_DEFAULTS[task]['sgd_lr']`)."""
    return {task: float(d["sgd_lr"]) for task, d in TASK_DEFAULTS.items() if d.get("sgd_lr") is not None}


def make_algorithm(name: str, settings: AlgorithmSettings = AlgorithmSettings()) -> Algorithm:
    """FedAvg, FedProx, FedOPT (FedNLP's: FedAvgM, server SGD with momentum), FedAdam, FedAdagrad, FedYogi."""
    s = settings
    makers: dict[str, Callable[[], Algorithm]] = {
        "fedavg": lambda: FedAvg(local_epochs=s.local_epochs),
        "fedprox": lambda: FedProx(mu=s.fedprox_mu, local_epochs=s.local_epochs),
        "fedopt": lambda: FedAvgM(server_lr=s.fedavgm_lr, beta1=s.fedavgm_momentum, local_epochs=s.local_epochs),
        "fedadam": lambda: FedAdam(server_lr=s.adaptive_lr, local_epochs=s.local_epochs),
        "fedadagrad": lambda: FedAdagrad(server_lr=s.adaptive_lr, local_epochs=s.local_epochs),
        "fedyogi": lambda: FedYogi(server_lr=s.adaptive_lr, local_epochs=s.local_epochs),
    }
    if name not in makers:
        raise ValueError(f"unknown algorithm {name!r}; choose from {', '.join(ALGORITHMS)}")
    return makers[name]()


def formulation_class(task: str) -> type:
    """The clients class of `task` (imported on first use: each pulls in its own corpus and metrics)."""
    if task not in FORMULATIONS:
        raise ValueError(f"unknown task {task!r}; choose from {', '.join(TASKS)}")
    module, _, name = FORMULATIONS[task].partition(":")
    return getattr(importlib.import_module(module), name)


def load_formulation(task: str, settings: FormulationSettings, *, backbone: str, device: str) -> Formulation:
    return formulation_class(task)(settings, backbone=backbone, device=device)


def whole_layer_tasks() -> tuple[str, ...]:
    """The tasks whose clients can train whole top layers instead of adapters (`tune='layers'`)."""
    return tuple(task for task in TASKS if "layers" in formulation_class(task).tunes)


WIDENABLE = ("tasks", "algorithms", "partitions", "protocols", "seeds")
"""The plan's lists that `GridPlan.widened` may extend on a resumed run; its other settings are fixed."""


@dataclass(frozen=True)
class GridPlan:
    tasks: tuple[str, ...] = TASKS
    algorithms: tuple[str, ...] = ("fedavg", "fedprox", "fedopt")
    partitions: tuple[str, ...] = ("iid",)
    protocols: tuple[str, ...] = ("secagg+",)
    """Secure protocols of every algorithm; FedAvg also runs once under a plaintext sum per cell."""
    seeds: tuple[int, ...] = (0,)
    rounds: int = 5
    clients_per_round: int | None = None
    clip: float = 1.0
    """Fixed-point range of each uploaded delta coordinate (clipped values are counted)."""
    formulation: Mapping[str, Any] = field(default_factory=dict)
    """FormulationSettings fields for every task (over TASK_DEFAULTS)."""
    per_task: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """FormulationSettings fields for one task (over `formulation`), e.g. a larger corpus cap where
    a task's examples are short and cheap."""
    algorithm: AlgorithmSettings = AlgorithmSettings()
    sgd_lrs: Mapping[str, float] = field(default_factory=selected_sgd_lrs)
    """SGD's client lr per task (FedAvg's and FedProx's clients under the 'fednlp' protocol; AdamW keeps
    the task's `lr`). Default: the lrs chosen on validation (`TASK_DEFAULTS[task]['sgd_lr']`); a task not
    named trains SGD at its one lr, as FedNLP's scripts (`fednlp_benchmark.py --sgd-lr TASK=LR` sets one).
    Saved in plan.json, so a resumed grid keeps the lrs it ran whatever `TASK_DEFAULTS` says later."""
    training_protocol: str = "fednlp"
    """The clients' training protocol, a preset name ('fednlp', 'federated-norm', 'kept-adamw'), built per
    algorithm at each task's client lr (`protocol_for`)."""

    def __post_init__(self) -> None:
        preset(self.training_protocol)  # an unknown name fails here, naming the choices
        object.__setattr__(self, "sgd_lrs", dict(self.sgd_lrs))  # the caller's mapping, copied (and JSON-ready)
        if set(self.sgd_lrs) - set(TASKS):
            raise ValueError(f"sgd_lrs names unknown tasks {sorted(set(self.sgd_lrs) - set(TASKS))}; "
                             f"choose from {', '.join(TASKS)}")
        bad_lrs = {t: lr for t, lr in self.sgd_lrs.items()
                   if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not (math.isfinite(lr) and lr > 0)}
        if bad_lrs:
            raise ValueError(f"an SGD lr must be a positive finite number; got {bad_lrs}")
        for values, allowed, what in ((self.tasks, TASKS, "task"), (self.algorithms, ALGORITHMS, "algorithm"),
                                      (self.protocols, PROTOCOLS, "protocol")):
            bad = [v for v in values if v not in allowed]
            if bad or not values:
                raise ValueError(f"{what}s must be a non-empty list from {', '.join(allowed)}; got {list(values)}")
        if "plain" in self.protocols:
            raise ValueError("'plain' runs automatically as FedAvg's twin; list secure protocols only")
        if set(self.per_task) - set(TASKS):
            raise ValueError(f"per_task names unknown tasks {sorted(set(self.per_task) - set(TASKS))}")
        if self.rounds < 1 or not self.seeds:
            raise ValueError("need rounds >= 1 and at least one seed")
        for task in self.tasks:
            for partition in self.partitions:
                settings = self.settings(task, partition=partition_for(task, partition), seed=self.seeds[0])
                if settings.clients < 2:  # every cell valid up front
                    raise ValueError(f"clients must be at least 2 (secure aggregation needs two), got {settings.clients}")

    def protocol_for(self, algorithm: str, settings: FormulationSettings) -> TrainingProtocol:
        """The declared protocol of `algorithm`'s clients at the task's client lr (`settings.lr`)."""
        return preset(self.training_protocol).for_algorithm(algorithm, lr=settings.lr, sgd_lr=settings.sgd_lr,
                                                           local_epochs=self.algorithm.local_epochs)

    def settings(self, task: str, *, partition: str, seed: int) -> FormulationSettings:
        defaults = {k: v for k, v in TASK_DEFAULTS[task].items() if k != "sgd_lr"}  # the plan's own, below
        defaults["sgd_lr"] = self.sgd_lrs.get(task)  # None: SGD at the task's lr
        return FormulationSettings(**{**defaults, **self.formulation, **self.per_task.get(task, {}),
                                      "partition": partition, "seed": seed})

    def widened(self, **lists: Sequence[Any]) -> "GridPlan":
        """This plan with more tasks, algorithms, partitions, protocols or seeds (`--resume RUN --seeds 3,4`).
        The saved values come first and keep their order, so finished cells keep their keys and the
        first seed and partition stay the ones the summary lines track; values the plan already has
        (a partition by its meaning: 'label:0.10' is 'label:0.1') are skipped."""
        unknown = set(lists) - set(WIDENABLE)
        if unknown:
            raise ValueError(f"only {', '.join(WIDENABLE)} can grow on a saved plan, not {', '.join(sorted(unknown))}")
        changes = {}
        for name, values in lists.items():
            current = tuple(getattr(self, name))
            same = PartitionSpec.parse if name == "partitions" else (lambda v: v)
            seen = {same(v) for v in current}
            added = []
            for value in values:
                if same(value) not in seen:
                    seen.add(same(value))
                    added.append(value)
            changes[name] = current + tuple(added)
        return dataclasses.replace(self, **changes)

    def cells(self) -> list[dict[str, Any]]:
        """Every run, task-major (one task's clients are built once per partition and seed). Within a
        (task, partition, seed) the plaintext FedAvg twin comes right after the first protocol's FedAvg, so
        a grid cut off later in the unit has already made the secure-vs-plain check, and the secure run's
        per-round parameters are held in memory for one run, not for the whole unit."""
        out = []
        for task in self.tasks:
            for partition in (partition_for(task, p) for p in self.partitions):
                for seed in self.seeds:
                    unit = dict(task=task, partition=partition, seed=seed)
                    secure = [dict(unit, protocol=protocol, algorithm=algorithm)
                              for protocol in self.protocols for algorithm in self.algorithms]
                    twin = dict(unit, protocol="plain", algorithm="fedavg")
                    # the first protocol's runs come first, so its FedAvg sits at the algorithm's own index
                    at = self.algorithms.index("fedavg") + 1 if "fedavg" in self.algorithms else len(secure)
                    out.extend(secure[:at] + [twin] + secure[at:])
        return out


def untwinned(plan: GridPlan, done: Mapping[str, Any]) -> set[str]:
    """Keys of the first seed's secure FedAvg runs (first protocol) that are finished while their plaintext
    twin is not. The twin's secure-vs-plain check compares the two runs' parameters round by round, which
    live only in the process that ran them; a grid stopped between the two must rerun the secure run with
    its twin, or the twin would be recorded without the check. The rerun appends a second line for the same
    key (`read_cells` keeps the last)."""
    if "fedavg" not in plan.algorithms:
        return set()
    out = set()
    for cell in plan.cells():
        if cell["protocol"] != "plain" or cell["seed"] != plan.seeds[0] or cell_key(cell) in done:
            continue
        secure = cell_key(dict(cell, protocol=plan.protocols[0]))
        if secure in done:
            out.add(secure)
    return out


def partition_for(task: str, partition: str) -> str:
    """Tagging has no sentence label: its label skew is over k-means feature clusters (as FedNLP)."""
    spec = PartitionSpec.parse(partition)
    return f"cluster:{spec.alpha:g}" if task == "tagging" and spec.kind == "label" else partition


def cell_key(cell: Mapping[str, Any]) -> str:
    return "/".join(str(cell[k]) for k in ("task", "partition", "seed", "protocol", "algorithm"))


def secure_config(plan: GridPlan, *, protocol: str, clients: Formulation) -> SecureAggregationConfig:
    """Fixed-point range `plan.clip`; weights up to the largest client's training split; a
    released sum needs the whole cohort (no DP here, so no smaller group is released)."""
    cohort = min(plan.clients_per_round or clients.num_clients, clients.num_clients)
    return SecureAggregationConfig(protocol=protocol, clip=plan.clip, max_weight=float(max(clients.train_sizes())),
                                   max_clients=clients.num_clients, min_release_group=cohort)


def flat_vector(parts: Mapping[str, np.ndarray]) -> np.ndarray:
    """Named parameter parts as one float64 vector (parts in sorted order)."""
    return np.concatenate([np.asarray(parts[k], dtype=np.float64).ravel() for k in sorted(parts)])


def shared_vector(algorithm: Algorithm, state: Any) -> np.ndarray:
    """The server's shared parameters as one float64 vector (parts in sorted order)."""
    return flat_vector(algorithm.shared_parameters(state))


def run_cell(cell: Mapping[str, Any], clients: Formulation, plan: GridPlan, *, progress: bool,
             on_round: Callable[[RoundRecord], None] | None = None,
             round_parameters: list[np.ndarray] | None = None,
             initial: Mapping[str, np.ndarray] | None = None,
             nudge: Callable[[int, Mapping[str, np.ndarray]], None] | None = None,
             first_runs: FirstRunMemo | None = None) -> tuple[dict[str, Any], np.ndarray]:
    """One federated run: its summary (test metric, validation curve, costs) and its final parameters.

    With `round_parameters`, the shared parameters after every round are appended to it (float64:
    the secure-vs-plain differences are near 1e-8), so that two runs can be compared round by round.
    `initial` replaces the formulation's seeded starting point, and `nudge(round, parameters)` may
    change the server's shared parameters in place after a round, before they are recorded and sent
    (a sensitivity check perturbs them; in place works for FedAvg, whose state holds the arrays).
    `first_runs`, shared by the runs of one (task, partition, seed) over the same `clients`, computes
    each client's first local run once for the runs that repeat it (`FirstRunMemo`); `round_seconds`
    then counts the restored runs' training time as measured when they were computed."""
    algorithm = make_algorithm(cell["algorithm"], plan.algorithm)
    protocol = plan.protocol_for(cell["algorithm"], clients.settings)
    config = RunConfig(rounds=plan.rounds, clients_per_round=plan.clients_per_round, seed=cell["seed"],
                       sampler="seeded", curve_split="validation",
                       secure=secure_config(plan, protocol=cell["protocol"], clients=clients))
    trainers = {k: clients.make_trainer(k, protocol=protocol) for k in range(1, clients.num_clients + 1)}
    if first_runs is not None:
        for trainer in trainers.values():
            if not hasattr(trainer, "first_runs"):
                raise TypeError(f"{type(trainer).__name__} cannot share first runs (a SeededTorchTrainer can)")
            trainer.first_runs = first_runs
    reused_before = first_runs.reused_seconds if first_runs is not None else 0.0
    runner = SimulationRunner(algorithm=algorithm, config=config, initial=dict(initial or clients.initial()),
                              trainers=trainers)
    def after_round(record: RoundRecord) -> None:
        if nudge is not None:
            nudge(record.round, algorithm.shared_parameters(runner.state))
        if round_parameters is not None:
            round_parameters.append(shared_vector(algorithm, runner.state))
        if on_round is not None:
            on_round(record)

    runner.on_round = after_round
    start = time.perf_counter()
    history = runner.run(progress=progress, desc=cell_key(cell), metric=f"validation_{clients.metric}")
    seconds = time.perf_counter() - start
    reused = first_runs.reused_seconds - reused_before if first_runs is not None else 0.0
    metric = clients.metric
    final = shared_vector(algorithm, runner.state)
    tested = {k: m for k, m in sorted(history[-1].metrics.items()) if metric in m}  # test metrics by client
    uploads = [b for r in history for b in r.bytes_uploaded.values()]
    summary = {
        **cell, "metric": metric, "score": history[-1].mean(metric),
        "pooled_score": clients.pooled(tested),  # over the union of the test splits, as FedNLP scores
        "client_scores": [m[metric] for m in tested.values()],  # test metric per client, by client id
        "curve": [r.mean(f"validation_{metric}") for r in history],
        "seconds": seconds, "round_seconds": (seconds + reused) / len(history), "reused_train_seconds": reused,
        "secure_seconds_per_round": float(np.mean([r.secure_seconds for r in history])),
        "bytes_uploaded_per_client_round": float(np.mean(uploads)) if uploads else 0.0,
        "parameters": int(final.size), "clipped_values": int(sum(r.clipped for r in history)),
        "trivial": clients.trivial(), "device": device_name(clients.device),
        # on a GPU, whether the twins trained bit for bit alike was possible (grid cells before 2026-11-27: not)
        "deterministic_kernels": torch.are_deterministic_algorithms_enabled(),
        "training_protocol": protocol.to_dict(),
    }
    return summary, final


def encoder_bound(plan: GridPlan, clients: Formulation, protocol: str) -> float:
    """The fixed-point encoder's per-round bound on the error of the weighted mean (whole cohort)."""
    encoder = SecureAggregator(secure_config(plan, protocol=protocol, clients=clients)).encoder
    cohort = min(plan.clients_per_round or clients.num_clients, clients.num_clients)
    return float(encoder.mean_error_bound(n_clients=cohort, total_weight=float(sum(clients.train_sizes()))))


def aggregate(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Mean ± sample std over seeds of each (task, partition, protocol, algorithm)."""
    groups: dict[tuple, list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["task"], row["partition"], row["protocol"], row["algorithm"]), []).append(row)
    out = []
    for (task, partition, protocol, algorithm), members in groups.items():
        scores = [m["score"] for m in members]
        out.append({"task": task, "partition": partition, "protocol": protocol, "algorithm": algorithm,
                    "metric": members[0]["metric"], "mean": float(np.mean(scores)),
                    "std": float(np.std(scores, ddof=1)) if len(scores) > 1 else 0.0, "seeds": len(scores),
                    **_pooled_columns(members),
                    "trivial": float(np.mean([m["trivial"] for m in members])),
                    "round_seconds": float(np.mean([m["round_seconds"] for m in members])),
                    "secure_seconds_per_round": float(np.mean([m["secure_seconds_per_round"] for m in members])),
                    "parameters": members[0]["parameters"],
                    "bytes_uploaded_per_client_round": float(np.mean([m["bytes_uploaded_per_client_round"]
                                                                      for m in members]))})
    return out


def _pooled_columns(members: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Mean and std of the pooled scores over seeds; nan where a run predates them (cells written before
    the grid recorded `pooled_score`)."""
    pooled = [m.get("pooled_score", float("nan")) for m in members]
    return {"pooled_mean": float(np.mean(pooled)),
            "pooled_std": float(np.std(pooled, ddof=1)) if len(pooled) > 1 else 0.0}


def paired_comparisons(rows: Sequence[Mapping[str, Any]], *, protocol: str, baseline: str = "fedavg",
                       reference: str = "iid", value: str = "score") -> list[dict[str, Any]]:
    """What FedNLP's Table 2 and its non-IID study compare, paired by seed (same split, same initial
    model) over `protocol`'s runs: each algorithm minus `baseline` within a (task, partition), and the
    `reference` partition minus each other partition within a (task, algorithm), of `value` ('score':
    the mean over clients; 'pooled_score': over all test examples). Differences are in metric units;
    seeds present on one side only, and runs without `value`, are left out (`seeds` says how many
    were paired)."""
    mine = [{**r, "score": r[value]} for r in rows if r["protocol"] == protocol and value in r]
    out = []
    for (task, partition), members in grouped(mine, key=lambda r: (r["task"], r["partition"])).items():
        by_algorithm = _scores_by(members, "algorithm")
        for algorithm, scores in by_algorithm.items():
            if algorithm != baseline and baseline in by_algorithm:
                out.append(_paired(task, f"{algorithm} - {baseline}", partition, scores, by_algorithm[baseline]))
    for (task, algorithm), members in grouped(mine, key=lambda r: (r["task"], r["algorithm"])).items():
        by_partition = _scores_by(members, "partition")
        for partition, scores in by_partition.items():
            if partition != reference and reference in by_partition:
                out.append(_paired(task, f"{reference} - {partition}", algorithm, by_partition[reference], scores))
    return [r for r in out if r is not None]


def _scores_by(rows: Sequence[Mapping[str, Any]], column: str) -> dict[str, dict[int, float]]:
    return {value: {r["seed"]: r["score"] for r in members}
            for value, members in grouped(rows, key=lambda r: r[column]).items()}


def _paired(task: str, comparison: str, within: str, ours: Mapping[int, float],
            theirs: Mapping[int, float]) -> dict[str, Any] | None:
    difference = paired_difference(ours, theirs)
    if difference is None:
        return None
    by_seed = {seed: ours[seed] - theirs[seed] for seed in sorted(ours) if seed in theirs}
    return {"task": task, "comparison": comparison, "within": within, "by_seed": by_seed, **difference}


def write_paired(sections: Mapping[str, Sequence[Mapping[str, Any]]], *, md_path: Path) -> None:
    """`paired_comparisons` as Markdown, one table per titled section, in points (metric x 100): mean,
    its 95% Student-t interval, and each seed's difference."""
    header = ["task", "comparison", "within", "mean (points)", "95% interval", "by seed"]
    lines: list[str] = []
    for title, rows in sections.items():
        lines += [f"## {title}", "", "| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        for r in rows:
            interval = "n/a (one seed)" if r["seeds"] < 2 else f"{100 * r['low']:+.1f} .. {100 * r['high']:+.1f}"
            seeds = ", ".join(f"{100 * d:+.1f}" for d in r["by_seed"].values())
            lines.append(f"| {r['task']} | {r['comparison']} | {r['within']} | {100 * r['mean']:+.1f} | {interval} | "
                         f"{seeds} |")
        lines.append("")
    md_path.write_text("\n".join(lines))


def write_table(rows: Sequence[Mapping[str, Any]], *, csv_path: Path, md_path: Path) -> None:
    """The grid as CSV (every column) and Markdown (score ± std per cell)."""
    import csv

    columns = list(rows[0].keys())
    with open(csv_path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    header = ["task", "metric", "partition", "protocol", "algorithm", "score (mean ± std)", "pooled (mean ± std)",
              "seeds", "trivial", "round s", "secure s/round", "parameters"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        lines.append("| " + " | ".join([r["task"], r["metric"], r["partition"], r["protocol"], r["algorithm"],
                                        f"{r['mean']:.4f} ± {r['std']:.4f}",
                                        "n/a" if np.isnan(r["pooled_mean"]) else
                                        f"{r['pooled_mean']:.4f} ± {r['pooled_std']:.4f}",
                                        str(r["seeds"]), f"{r['trivial']:.4f}",
                                        f"{r['round_seconds']:.2f}", f"{r['secure_seconds_per_round']:.3f}",
                                        f"{r['parameters']:,}"]) + " |")
    md_path.write_text("\n".join(lines) + "\n")


def plot_curves(rows: Sequence[Mapping[str, Any]], *, path: Path) -> Path:
    """FedNLP-style learning curves: one row of panels per task, one panel per partition, one line
    per algorithm and protocol (validation metric per round, mean over seeds)."""
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    partitions = list(dict.fromkeys(r["partition"] for r in rows))
    series = lambda r: f"{r['algorithm']} ({r['protocol']})"  # noqa: E731
    colours = {label: f"C{k % 10}" for k, label in enumerate(dict.fromkeys(map(series, rows)))}  # alike in every panel
    fig, axes = pyplot().subplots(len(tasks), len(partitions), figsize=(4.2 * len(partitions), 3.2 * len(tasks)),
                                  squeeze=False)
    for i, task in enumerate(tasks):
        for j, partition in enumerate(partitions):
            ax = axes[i][j]
            curves: dict[str, list[list[float]]] = {}
            for r in rows:
                if r["task"] == task and r["partition"] == partition:
                    curves.setdefault(series(r), []).append(r["curve"])
            for label, runs in curves.items():
                ax.plot(range(1, len(runs[0]) + 1), np.mean(np.asarray(runs, dtype=float), axis=0), marker="o",
                        markersize=3, label=label, color=colours[label], linestyle=":" if "plain" in label else "-")
            metric = next(r["metric"] for r in rows if r["task"] == task)
            ax.set_title(f"{task}, {partition}", fontsize=9)
            ax.set_xlabel("round")
            ax.set_ylabel(f"validation {metric}")
    return save_figure(fig, path)


def plot_partition_curves(rows: Sequence[Mapping[str, Any]], *, path: Path, protocol: str) -> Path:
    """FedNLP's Figure 5 for every algorithm: one panel per task and algorithm (runs under `protocol`),
    one line per partition, the mean over seeds with a band of ± one std, so that both of FedNLP's
    partition findings can be read off: a smaller alpha scores lower, and its seeds spread wider."""
    rows = [r for r in rows if r["protocol"] == protocol]
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    algorithms = list(dict.fromkeys(r["algorithm"] for r in rows))
    partitions = list(dict.fromkeys(r["partition"] for r in rows))
    colours = {partition: f"C{k % 10}" for k, partition in enumerate(partitions)}
    fig, axes = pyplot().subplots(max(len(tasks), 1), max(len(algorithms), 1), squeeze=False, sharey="row",
                                  figsize=(4.2 * max(len(algorithms), 1), 3.2 * max(len(tasks), 1)))
    for i, task in enumerate(tasks):
        for j, algorithm in enumerate(algorithms):
            ax = axes[i][j]
            for partition in partitions:
                runs = [r["curve"] for r in rows if (r["task"], r["algorithm"], r["partition"]) == (task, algorithm, partition)]
                if not runs:
                    continue
                curves = np.asarray(runs, dtype=float)
                mean, std = curves.mean(axis=0), curves.std(axis=0, ddof=1) if len(runs) > 1 else np.zeros(curves.shape[1])
                x = np.arange(1, len(mean) + 1)
                ax.plot(x, mean, color=colours[partition], marker="o", markersize=2.5,
                        label=f"{partition} ({len(runs)} seed{'s' if len(runs) > 1 else ''})")
                ax.fill_between(x, mean - std, mean + std, color=colours[partition], alpha=0.15, linewidth=0)
            metric = next(r["metric"] for r in rows if r["task"] == task)
            ax.set_title(f"{task}, {algorithm} ({protocol})", fontsize=9)
            ax.set_xlabel("round")
            ax.set_ylabel(f"validation {metric} (± std over seeds)")
    return save_figure(fig, path)


def plan_record(plan: GridPlan) -> dict[str, Any]:
    """The plan as JSON-ready data (saved in the run directory; `plan_from_record` inverts it)."""
    return {**dataclasses.asdict(plan), "formulation": dict(plan.formulation),
            "per_task": {task: dict(values) for task, values in plan.per_task.items()},
            "sgd_lrs": dict(plan.sgd_lrs)}


SGD_LRS_2026_11_29 = {"classification": 3.0}
"""The SGD lrs of plans saved with `selected_sgd_lrs: true` (2026-11-29, before plans recorded each task's
SGD lr): classification's, chosen on validation for the classification example; every other task at its one lr."""


def plan_from_record(raw: Mapping[str, Any]) -> GridPlan:
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()
              if k not in ("algorithm", "selected_sgd_lrs")}
    fields.setdefault("per_task", {})  # plans saved before per-task settings existed
    fields.setdefault("training_protocol", "kept-adamw")  # plans saved before protocols were declared ran that
    if "sgd_lrs" not in fields:  # saved before plans recorded each task's SGD lr: what that plan ran
        fields["sgd_lrs"] = dict(SGD_LRS_2026_11_29) if raw.get("selected_sgd_lrs") else {}  # before 2026-11-29: one lr
    return GridPlan(**fields, algorithm=AlgorithmSettings(**raw["algorithm"]))


__all__ = ["FORMULATIONS", "ALGORITHMS", "PROTOCOLS", "METRIC_NAMES", "TASK_DEFAULTS", "AlgorithmSettings",
           "make_algorithm", "formulation_class", "load_formulation", "whole_layer_tasks", "GridPlan", "WIDENABLE", "selected_sgd_lrs", "SGD_LRS_2026_11_29", "cell_key", "secure_config", "flat_vector", "shared_vector", "run_cell",
           "encoder_bound", "aggregate", "paired_comparisons", "write_paired", "write_table", "plot_curves", "plot_partition_curves", "plan_record",
           "plan_from_record", "partition_for", "untwinned"]
