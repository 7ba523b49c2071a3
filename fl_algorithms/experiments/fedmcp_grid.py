"""FedMCP's experiment (Zhao et al. 2024, Table I and II) as a library: the plan, one method's run for one
seed in the simulation or a deployment, the summary over seeds (per-client and average accuracy,
paired differences, costs), the table, plot and result lines, and runs made in parts (``run_parts``:
each seed x method its own process; ``combined_runs``: parts reported as one).

Two evaluation points (issue 55): ``accuracy`` after aggregation (the round's averaged shared parts under the
client's own private parts and heads: the table's main number, as before) and ``accuracy_before_aggregation``
(the model as the client's own last local run left it), each per client, averaged, per seed and paired by
seed (`POINTS`). They coincide by construction for Local (nothing is aggregated) and Ditto (it evaluates
the personal model its last local run trained), whose ``_local_eval`` keys the last line therefore omits.

``examples/fedmcp_secure.py`` is the command line over it; ``fl_algorithms.tasks.fedmcp`` builds the
clients and ``fl_algorithms.training.adapter_trainer`` trains them.
"""
from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from fl_algorithms.engine.round import RoundRecord
from fl_algorithms.choices import RUNTIMES
from fl_algorithms.engine.secure_sum import SecureAggregationConfig
from fl_algorithms.engine.sim import RunConfig, SimulationRunner
from fl_algorithms.experiments.parallel import run_pool
from fl_algorithms.experiments.rundir import RunDirectory
from fl_algorithms.experiments.tables import paired_difference, pyplot, save_figure
from fl_algorithms.tasks.fedmcp import DEFAULT_METHODS, METHODS, ClientInfo, FedMCPClients, FedMCPSettings
from fl_algorithms.training.adapter_trainer import BEFORE_AGGREGATION
from secagg.protocols import registry

PLAIN_TWIN = "fedmcp_plain"
"""FedMCP with plaintext sums, added to the run when FedMCP runs (unless --no-plain-check): checked in-run or
trained again (`TWIN_MODES`)."""
TWIN_MODES = ("in-run", "rerun")
"""How the plaintext twin is obtained. 'in-run' (the simulation's default): FedMCP's run also sums every
secure sum's inputs with the plaintext protocol (`RunConfig.plain_twin`); when every sum of every round agrees
bit for bit, the plaintext run's trajectory is FedMCP's own (same inputs, same sums, same next round), so the
twin's row is FedMCP's, marked as derived, and nothing is trained twice; any disagreement or failed sum falls
back to a rerun. 'rerun' (a deployment's only mode: its server never holds the inputs): FedMCP trained again
from the same seed with the plaintext protocol."""
TITLES = {"fedavg_full": "FedAvg (Full FT)", "local": "Local", "fedavg_peft": "FedAvg (PEFT)", "fedrep": "FedRep",
          "fedlr": "FedLR (LoRA)", "moon": "MOON", "ditto": "Ditto",
          "fedmcp": "FedMCP", "fedmcp_no_cl": "FedMCP w/o L_c", "fedmcp_no_bl": "FedMCP w/o L_b",
          PLAIN_TWIN: "FedMCP (plaintext agg.)"}
TABLE_ORDER = ("fedavg_full", "local", "fedavg_peft", "fedlr", "fedrep", "moon", "ditto", "fedmcp", "fedmcp_no_cl",
               "fedmcp_no_bl", PLAIN_TWIN)
TASK_SPEC = "fl_algorithms.tasks.fedmcp:build"
POINTS = {"after_aggregation": "accuracy", "before_aggregation": BEFORE_AGGREGATION}
"""Evaluation point -> the clients' metric: after the server's aggregation (the table's main number), and
before it (each client's model as its own last local run left it)."""
SAME_POINT = ("local", "ditto")
"""Methods whose two evaluation points coincide by construction (Local aggregates nothing; Ditto evaluates the
personal model its last local run trained)."""


@dataclass(frozen=True)
class Plan:
    """What the run does beyond the clients' settings (saved in config.toml with them)."""

    algorithms: tuple[str, ...] = DEFAULT_METHODS
    protocol: str = "secagg+"
    seeds: tuple[int, ...] = (0,)
    runtime: str = "sim"
    plain_check: bool = True
    """Compare FedMCP with its plaintext twin to show what secure aggregation costs in accuracy."""
    twin: str | None = None
    """`TWIN_MODES`; None resolves to 'in-run' in the simulation, 'rerun' in a deployment (saved resolved)."""

    def __post_init__(self) -> None:
        if self.twin is None:
            object.__setattr__(self, "twin", "in-run" if self.runtime == "sim" else "rerun")
        unknown = [m for m in self.algorithms if m not in METHODS]
        secure = [p for p in registry.names() if p != "plain"]
        checks = [
            (bool(self.algorithms), "--algorithms must name at least one method"),
            (not unknown, f"unknown method(s) {unknown}; choose from {', '.join(METHODS)}"),
            (len(set(self.algorithms)) == len(self.algorithms), "--algorithms repeats a method"),
            (self.protocol in secure, f"--protocol must be a secure protocol: {', '.join(secure)}"),
            (bool(self.seeds) and all(s >= 0 for s in self.seeds), "--seeds must be non-negative integers"),
            (len(set(self.seeds)) == len(self.seeds), "--seeds repeats a seed"),
            (self.runtime in RUNTIMES, f"--runtime must be one of {', '.join(RUNTIMES)}"),
            (self.twin in TWIN_MODES, f"--twin must be one of {', '.join(TWIN_MODES)}"),
            (not (self.twin == "in-run" and self.runtime == "deploy"),
             "--twin in-run needs the simulation (a deployed server never holds the inputs): use --twin rerun"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    def run_list(self) -> list[str]:
        """The chosen methods in table order, then FedMCP's plaintext twin."""
        runs = [m for m in TABLE_ORDER if m in self.algorithms]
        if self.plain_check and "fedmcp" in self.algorithms:
            runs.append(PLAIN_TWIN)
        return runs


def read_saved(path: Path) -> tuple[FedMCPSettings, Plan]:
    """The settings and plan saved in run directory `path`."""
    legacy = not (path / "config.toml").is_file() and (path / "config.json").is_file()
    saved = None if legacy else RunDirectory.open(path).read_config()
    if legacy or "cap" in saved["settings"]:
        raise ValueError("this run predates per-seed splits with whole test sets (its 'cap' was applied before "
                         "the split): it cannot be resumed exactly; start a new run")
    plan = {k: tuple(v) if isinstance(v, list) else v for k, v in saved["plan"].items()}
    plan.setdefault("twin", "rerun")  # saved before the in-run twin: it resumes as it ran
    settings = dict(saved["settings"])
    if settings.get("precision", "auto") == "auto":
        settings["precision"] = _precision_as_ran(saved)
    return FedMCPSettings(**settings), Plan(**plan)


def _precision_as_ran(saved: dict[str, Any]) -> str:
    """The precision a saved 'auto' run resolved to, so that a resume (on this machine) continues in it even
    though `fast_bf16`'s rule changed: each method's recorded protocol where there is one, else the rule of
    its time (`legacy_fast_bf16`, on the CPU: runs saved before protocols were recorded)."""
    recorded = {p.get("precision") for p in saved.get("training_protocol", {}).values() if isinstance(p, dict)}
    recorded.discard(None)
    if len(recorded) == 1:
        return recorded.pop()
    if recorded:
        raise ValueError(f"its methods recorded different precisions {sorted(recorded)}")
    from nlp_models.cpu import legacy_fast_bf16
    return "bf16" if legacy_fast_bf16("cpu") else "fp32"


def combine_plans(parts: Sequence[Path]) -> tuple[FedMCPSettings, Plan]:
    """One setting and plan for runs made in parts: the settings must agree; seeds and methods are the
    union (the plaintext twin is kept if every part that ran FedMCP ran it)."""
    if len(parts) < 2 or len(set(parts)) < len(parts):
        raise ValueError("name at least two different run directories")
    saved = [read_saved(p) for p in parts]
    settings = saved[0][0]
    for path, (other, plan) in zip(parts, saved):
        differ = [f.name for f in fields(FedMCPSettings) if getattr(other, f.name) != getattr(settings, f.name)]
        if differ:
            raise ValueError(f"{path} differs from {parts[0]} in {differ}: not parts of one run")
        if (plan.protocol, plan.runtime) != (saved[0][1].protocol, saved[0][1].runtime):
            raise ValueError(f"{path} used another protocol or runtime than {parts[0]}")
    methods = {m for _, plan in saved for m in plan.algorithms}
    seeds = sorted({s for _, plan in saved for s in plan.seeds})
    plain = all(plan.plain_check for _, plan in saved if "fedmcp" in plan.algorithms)
    twins = {plan.twin for _, plan in saved if "fedmcp" in plan.algorithms and plan.plain_check}
    return settings, Plan(algorithms=tuple(m for m in TABLE_ORDER if m in methods), protocol=saved[0][1].protocol,
                          seeds=tuple(seeds), runtime=saved[0][1].runtime, plain_check=plain,
                          twin=twins.pop() if len(twins) == 1 else None)


def combined_runs(parts: Sequence[Path], plan: Plan, run: RunDirectory,
                  logged: set[tuple[int, str, int]] | None = None) -> dict[str, list[MethodRun]]:
    """Every (method, seed) of `plan` from the parts' results.json, exactly once; their rounds are
    logged to `run` (those not in `logged` yet) so the combined directory holds the whole record."""
    logged = set() if logged is None else logged
    found: dict[tuple[str, int], MethodRun] = {}
    for path in parts:
        try:
            document = json.loads((path / "results.json").read_text())
        except FileNotFoundError:
            raise SystemExit(f"error: {path} has no results.json: finish it with --resume first") from None
        summary = document["summary"]["methods"]
        first_of_method: set[str] = set()
        for key, raw in document["runs"].items():
            method, seed = key.rsplit("/seed", 1)
            if (method, int(seed)) in found:
                raise SystemExit(f"error: {method} seed {seed} is in more than one part")
            history = [RoundRecord.from_json(r) for r in raw]
            meta = summary[method]
            # a part's timer and clip count are totals over its seeds: carried once, so the sums stay right
            once = method not in first_of_method
            first_of_method.add(method)
            found[method, int(seed)] = MethodRun(
                method=method, seed=int(seed), history=history, trainable=meta["trainable_params"],
                shared=meta["shared_params"], epsilon=last_epsilon(history),
                timer=dict(meta["timer"]) if once else {}, clipped=meta["clipped_values"] if once else 0,
                derived_from=meta.get("derived_from"))
        for record in RunDirectory.open(path).rounds():
            if (record.get("seed"), record.get("method"), record.get("round")) not in logged:
                run.log_round(record)
                logged.add((record.get("seed"), record.get("method"), record.get("round")))
    missing = [f"{m} seed {s}" for s in plan.seeds for m in plan.run_list() if (m, s) not in found]
    if missing:
        raise SystemExit(f"error: the parts do not cover {', '.join(missing)}")
    if len({len(r.history) for r in found.values()}) > 1:
        raise SystemExit("error: the parts ran different numbers of rounds (an unfinished part? --resume it)")
    runs: dict[str, list[MethodRun]] = defaultdict(list)
    for seed in plan.seeds:
        for method in plan.run_list():
            runs[method].append(found[method, seed])
    return runs


def saved_protocols(parts: Sequence[Path]) -> dict[str, dict[str, Any]]:
    """Each method's declared training protocol as its part recorded it (results.json), where one did."""
    out: dict[str, dict[str, Any]] = {}
    for path in parts:
        try:
            methods = json.loads((path / "results.json").read_text())["summary"]["methods"]
        except (OSError, KeyError, ValueError):
            continue
        out.update({m: row["protocol"] for m, row in methods.items() if "protocol" in row})
    return out


# FedMCP and its twin (4 passes per step, plus the plaintext rerun) first, then the costlier baselines
PART_ORDER = ("fedmcp", "fedavg_full", "fedmcp_no_cl", "fedmcp_no_bl", "moon", "ditto", "fedrep", "fedavg_peft",
              "fedlr", "local")


def run_parts(run: RunDirectory, settings: FedMCPSettings, plan: Plan, *, script: str | Path, workers: int, device: str,
              threads: int, progress: bool, deterministic: bool = False,
              protocols: dict[str, Any] | None = None) -> list[Path]:
    """--workers: each seed x method its own run directory under run/parts (FedMCP with its plaintext twin),
    run as `script --resume PART` processes, `workers` at a time; finished parts (results.json) are not rerun
    and unfinished ones continue from their checkpoints. Returns every part's directory."""
    folder = run.path / "parts"
    parts = []
    for seed in plan.seeds:
        for method in sorted(plan.algorithms, key=lambda m: PART_ORDER.index(m) if m in PART_ORDER else len(PART_ORDER)):
            path = folder / f"seed{seed}-{method}"
            if not (path / "config.toml").is_file():
                part = Plan(algorithms=(method,), protocol=plan.protocol, seeds=(seed,), runtime=plan.runtime,
                            plain_check=plan.plain_check and method == "fedmcp", twin=plan.twin)
                path.mkdir(parents=True, exist_ok=True)  # (or left without its config by an interrupted start)
                config: dict[str, Any] = {"settings": settings, "plan": part}
                if protocols is not None:  # each method's declared training protocol (as TrainingProtocol.to_dict)
                    config["training_protocol"] = {m: protocols[m] for m in part.run_list() if m in protocols}
                RunDirectory(path).write_config(config)
            parts.append(path)
    todo = [p for p in parts if not (p / "results.json").is_file()]
    commands = [[sys.executable, str(script), "--resume", str(p), "--device", device,
                 "--threads", str(threads), "--no-progress", *(["--deterministic"] if deterministic else [])]
                for p in todo]
    print(f"{len(todo)} of {len(parts)} runs to do, {workers} at a time: logs in {folder}/*/log.txt", flush=True)
    failed = run_pool(commands, workers=workers, logs=[p / "log.txt" for p in todo], progress=progress)
    if failed:
        for i in failed:
            tail = (todo[i] / "log.txt").read_text().splitlines()[-10:]
            print(f"--- {todo[i].name} failed; the end of its log:\n" + "\n".join(tail), file=sys.stderr)
        raise SystemExit(f"error: {len(failed)} run(s) failed; finished ones are kept: --resume {run.path} "
                         f"--workers {workers} continues")
    return parts


# ---------------------------------------------------------------- runs

@dataclass
class MethodRun:
    method: str
    seed: int
    history: list[RoundRecord]
    trainable: float
    """Mean trainable parameters per client."""
    shared: int
    """Parameters uploaded per client per round (0 for Local)."""
    epsilon: dict[int, float]
    timer: dict[str, float] = field(default_factory=dict)
    """The clients' timers summed (simulation only: in a deployment they stay in the client processes)."""
    clipped: int = 0
    derived_from: str | None = None
    """The in-run twin: the method whose checked trajectory this run's is (nothing was trained for it)."""


def last_epsilon(history: Sequence[RoundRecord]) -> dict[int, float]:
    """Each client's epsilon as it last reported it: the largest '*epsilon' metric of its last report
    (FedRep reports one per step; the accountant's epsilon only grows)."""
    out: dict[int, float] = {}
    for rec in history:
        for client, metrics in rec.metrics.items():
            spent = [v for k, v in metrics.items() if k.endswith("epsilon")]
            if spent:
                out[int(client)] = float(max(spent))
    return dict(sorted(out.items()))


def checked_sums(history: Sequence[RoundRecord]) -> int | None:
    """How many secure sums of `history` were checked equal to the plaintext protocol's sum of the same inputs
    (`RunConfig.plain_twin`); None unless every round's every sum was checked and agreed, and none failed."""
    if not history:
        return None
    for rec in history:
        if rec.failed or not rec.sums or set(rec.plain_twin) != set(rec.sums) or not all(rec.plain_twin.values()):
            return None
    return sum(len(rec.plain_twin) for rec in history)


def derive_twin(secure: MethodRun | None, *, seed: int, run: RunDirectory,
                logged: set[tuple[int, str, int]]) -> MethodRun | None:
    """The in-run twin (`TWIN_MODES`): FedMCP's run of `seed` as the plaintext run's, when every one of its sums
    agreed bit for bit with the plaintext protocol's; None otherwise (the caller reruns). Its rounds are logged
    with ``derived_from`` so the record says nothing was trained for them."""
    if secure is None or secure.method != "fedmcp" or secure.seed != seed or checked_sums(secure.history) is None:
        return None
    history = [replace(rec, seconds=0.0, secure_seconds=0.0, bytes_uploaded={}, plain_twin={})
               for rec in secure.history]
    for rec in history:
        if (seed, PLAIN_TWIN, rec.round) not in logged:
            run.log_round({"seed": seed, "method": PLAIN_TWIN, **asdict(rec), "derived_from": "fedmcp",
                           "mean_accuracy": rec.mean("accuracy"),
                           "mean_validation_accuracy": rec.mean("validation_accuracy")})
            logged.add((seed, PLAIN_TWIN, rec.round))
    return MethodRun(method=PLAIN_TWIN, seed=seed, history=history, trainable=secure.trainable, shared=secure.shared,
                     epsilon=dict(secure.epsilon), derived_from="fedmcp")


def run_method(method: str, seed: int, clients: FedMCPClients, plan: Plan, run: RunDirectory, *, progress: bool,
               threads: int, logged: set[tuple[int, str, int]], twin_of: MethodRun | None = None) -> MethodRun:
    """One method for one seed in the chosen runtime, each round logged to the run directory as it completes.
    The plaintext twin in 'in-run' mode is derived from `twin_of` (FedMCP's run of this seed) when all its
    sums were checked equal, and trained again otherwise."""
    if method == PLAIN_TWIN and plan.twin == "in-run":
        derived = derive_twin(twin_of, seed=seed, run=run, logged=logged)
        if derived is not None:
            return derived
        print(f"plaintext twin, seed {seed}: FedMCP's sums were not all checked equal to plaintext sums (a failed or "
              "differing sum, or a run resumed from before the check): training the twin again", flush=True)
    name = "fedmcp" if method == PLAIN_TWIN else method
    protocol = "plain" if method == PLAIN_TWIN else plan.protocol
    where = f"{method}-seed{seed}"
    secure = SecureAggregationConfig(protocol=protocol, clip=1.0,  # per-coordinate range of one round's update
                                     max_weight=float(max(c.sizes["train"] for c in clients.info)),
                                     max_clients=clients.num_clients,
                                     # FedMCP's benchmark has 4 clients in all: every sum is over all of them
                                     min_release_group=min(5, clients.num_clients))
    # the learning curve on the (small) validation splits every round, the whole test splits in the last round
    in_run = method == "fedmcp" and plan.plain_check and plan.twin == "in-run" and plan.runtime == "sim"
    config = RunConfig(rounds=clients.settings.rounds, seed=seed, secure=secure, curve_split="validation",
                       checkpoint_dir=str(run.checkpoint_dir / where), plain_twin=in_run)
    twin = method == PLAIN_TWIN  # trains exactly as FedMCP; its gradient-norm probe would only repeat FedMCP's
    task = clients.task(name, seed=seed, probe=not twin)

    def log(rec: RoundRecord) -> None:
        if (seed, method, rec.round) not in logged:
            run.log_round({"seed": seed, "method": method, **asdict(rec), "mean_accuracy": rec.mean("accuracy"),
                           "mean_validation_accuracy": rec.mean("validation_accuracy")})
            logged.add((seed, method, rec.round))

    timer: dict[str, float] = defaultdict(float)
    if plan.runtime == "sim":
        trainers = {c: task.make_trainer(c) for c in range(1, clients.num_clients + 1)}
        runner = SimulationRunner(algorithm=task.algorithm, trainers=trainers, config=config, initial=task.initial(),
                                  on_round=log)
        history = runner.run(resume=True, progress=progress, desc=f"{method} seed {seed}")
        for t in trainers.values():
            for k, v in t.timer.items():
                timer[k] += v
    else:
        from fl_algorithms.engine.launch import run_on_loopback

        bar = tqdm(total=config.rounds, desc=f"{method} seed {seed} (deployed)", disable=None if progress else True, leave=False)

        def on_round(rec: RoundRecord, server: Any) -> None:
            log(rec)
            bar.update(1)

        try:
            server = run_on_loopback(
                task=task, task_spec=TASK_SPEC, config=config, clients=clients.num_clients, on_round=on_round,
                options=clients.options(name, seed=seed, threads=max(1, threads // clients.num_clients), probe=not twin),
                log_dir=run.path / "logs" / where, resume=True, client_checkpoints=run.checkpoint_dir / where / "clients")
        finally:
            bar.close()
        history = server.history
    for rec in history:  # a round checkpointed just before a crash, but not yet logged
        log(rec)
    counts = clients.parameter_counts(name, seed=seed)
    return MethodRun(method=method, seed=seed, history=list(history), trainable=counts.trainable, shared=counts.shared,
                     epsilon=last_epsilon(history), timer=dict(timer), clipped=sum(r.clipped for r in history))


# ---------------------------------------------------------------- summary, table, plot

def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    arr = np.asarray(values, dtype=float)
    return float(arr.mean()), float(arr.std(ddof=1)) if len(arr) > 1 else 0.0


def _point(seed_runs: Sequence[MethodRun], clients: Sequence[ClientInfo], metric: str) -> dict[str, Any] | None:
    """One evaluation point's last-round test accuracy (%) over seeds: per client (mean, std, by seed),
    average (mean, std) and average by seed; None where some client of some seed did not report `metric`."""
    last = [r.history[-1].metrics for r in seed_runs]
    if not all(metric in m.get(c.client_id, {}) for m in last for c in clients):
        return None
    by_client = {c.key: {str(r.seed): 100 * m[c.client_id][metric] for r, m in zip(seed_runs, last)} for c in clients}
    averages = {str(r.seed): 100 * float(np.mean([m[c.client_id][metric] for c in clients]))
                for r, m in zip(seed_runs, last)}
    return {"per_client": {k: dict(zip(("mean", "std"), _mean_std(list(v.values())))) for k, v in by_client.items()},
            "per_client_by_seed": by_client,
            "average": dict(zip(("mean", "std"), _mean_std(list(averages.values())))),
            "average_by_seed": averages}


def _grad_ratio(seed_runs: Sequence[MethodRun]) -> dict[str, list[float]]:
    """FedMCP's logged ratio of the gradient norms of mu L_c and L_a on the global adapter, per round: the
    median, min and max over clients and seeds (empty for methods that do not log it)."""
    rounds = len(seed_runs[0].history)
    values = [[v for r in seed_runs if t < len(r.history) for m in r.history[t].metrics.values()
               if np.isfinite(v := m.get("grad_ratio_mu_c_to_a", float("nan")))] for t in range(rounds)]
    if not any(values):
        return {}
    return {stat: [float(fn(v)) if v else float("nan") for v in values]
            for stat, fn in (("median", np.median), ("min", np.min), ("max", np.max))}


def summarise(runs: dict[str, list[MethodRun]], clients: Sequence[ClientInfo], *, dp: bool) -> dict[str, Any]:
    """Per method, over its seeds: per-client and average accuracy (mean, std) after aggregation (the top-level
    keys, as before) and at each evaluation point (`points`: `POINTS`), curve, costs, epsilon, timers."""
    methods: dict[str, Any] = {}
    for method, seed_runs in runs.items():
        points = {name: p for name, metric in POINTS.items() if (p := _point(seed_runs, clients, metric)) is not None}
        after = points["after_aggregation"]
        curve = np.mean([[100 * rec.mean("validation_accuracy") for rec in r.history] for r in seed_runs], axis=0)
        curve_before = (np.mean([[100 * rec.mean(f"validation_{BEFORE_AGGREGATION}") for rec in r.history]
                                 for r in seed_runs], axis=0) if "before_aggregation" in points else [])
        first = seed_runs[0]
        seconds = sum(rec.seconds for r in seed_runs for rec in r.history)
        secure = sum(rec.secure_seconds for r in seed_runs for rec in r.history)
        uploaded = [sum(rec.bytes_uploaded.values()) for rec in first.history]
        timer: dict[str, float] = defaultdict(float)
        for r in seed_runs:
            for key, value in r.timer.items():
                timer[key] += value
        methods[method] = {
            "title": TITLES[method],
            "per_client": after["per_client"],
            "average": after["average"],
            "average_by_seed": after["average_by_seed"],
            "points": points,
            "curve": [float(v) for v in curve],
            "curve_before_aggregation": [float(v) for v in curve_before],
            "grad_ratio_mu_c_to_a": {} if first.derived_from else _grad_ratio(seed_runs),  # (the probe is FedMCP's)
            "trainable_params": first.trainable,
            "shared_params": first.shared,
            "bytes_uploaded_per_round": float(np.mean(uploaded)) if first.shared else 0.0,
            "secure_seconds": secure,
            "seconds": seconds,
            "rounds_run": sum(len(r.history) for r in seed_runs),
            "secure_share": secure / seconds if seconds and first.shared else 0.0,
            "epsilon": {str(c): e for c, e in first.epsilon.items()} if dp else {},
            "timer": dict(timer),
            "clipped_values": sum(r.clipped for r in seed_runs),
        }
        if first.derived_from is not None:
            methods[method]["derived_from"] = first.derived_from
        checked = [checked_sums(r.history) for r in seed_runs]
        if method == "fedmcp" and all(c is not None for c in checked):
            methods[method]["plain_twin_checked_sums"] = sum(checked)
    return methods


def percent_columns(summary: dict[str, Any], *, backbone_params: int, head_params: float) -> None:
    """Trainable and communicated parameters as % of FedAvg (Full FT) (backbone + one head; upload = backbone)."""
    full_trainable = backbone_params + head_params
    for method, row in summary.items():
        if method == "fedavg_full":
            row["param_pct"], row["comm_pct"] = 100.0, 100.0
            continue
        row["param_pct"] = 100 * row["trainable_params"] / full_trainable
        row["comm_pct"] = 100 * row["shared_params"] / backbone_params if row["shared_params"] else None


def full_ft_estimate(summary: dict[str, Any], *, backbone_params: int, depth: int, adapter_layers: int) -> str:
    """Why FedAvg (Full FT) is not in the default run, with its estimated cost."""
    peft = summary.get("fedavg_peft")
    if peft is None:
        return "not run (use --with-full-ft)"
    rounds = max(peft["rounds_run"], 1)
    if peft["timer"]:
        train = sum(v for k, v in peft["timer"].items() if k != "evaluation") / rounds
        what = "training"
    else:  # deploy: the clients' timers stay in their processes; the server sees round time less SecAgg
        train = (peft["seconds"] - peft["secure_seconds"]) / rounds
        what = "round time less SecAgg"
    flops = 3 * depth / (2 * adapter_layers)  # fwd+bwd(input, weight) over all layers vs fwd+bwd(input) over adapted
    secure = peft["secure_seconds"] / rounds * backbone_params / max(peft["shared_params"], 1)
    estimate = train * flops + secure
    return (f"not run: est. {estimate:.0f} s/round (~{flops:.1f}x FedAvg-PEFT {what} {train:.1f} s + SecAgg of "
            f"{backbone_params / 1e6:.1f} M values/client ~{secure:.0f} s); use --with-full-ft")


def format_table(summary: dict[str, Any], clients: Sequence[ClientInfo], *, seeds: int, dp: bool,
                 full_ft_note: str | None) -> str:
    def cell(stat: dict[str, float]) -> str:
        return f"{stat['mean']:.2f}" + (f"±{stat['std']:.2f}" if seeds > 1 else "")

    header = ["Method"] + [c.title for c in clients] + ["Avg.", "Param.(%)", "Comm.(%)", "Upload/round", "SecAgg time"]
    if dp:
        header.append("epsilon per client")
    rows = [header]
    if full_ft_note is not None:
        rows.append([TITLES["fedavg_full"], full_ft_note])
    for method in TABLE_ORDER:
        if method not in summary:
            continue
        s = summary[method]
        derived = "derived_from" in s  # the in-run twin: nothing uploaded or timed of its own
        row = [s["title"]] + [cell(s["per_client"][c.key]) for c in clients] + [
            cell(s["average"]), f"{s['param_pct']:.2f}",
            "-" if s["comm_pct"] is None else f"{s['comm_pct']:.2f}",
            "in-run" if derived else "-" if not s["shared_params"] else f"{s['bytes_uploaded_per_round'] / 1e6:.2f} MB",
            "in-run" if derived else "-" if not s["shared_params"] else f"{100 * s['secure_share']:.1f}%"]
        if dp:
            row.append("/".join(f"{e:.2f}" for e in s["epsilon"].values()))
        rows.append(row)
    widths = [max(len(r[i]) for r in rows if len(r) > i and len(r) == len(header)) for i in range(len(header))]
    lines = []
    for r in rows:
        if len(r) != len(header):  # a note row spanning the table
            lines.append(f"{r[0]:<{widths[0]}}  {r[1]}")
        else:
            lines.append("  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths))))
        if r is header:
            lines.append("-" * len(lines[-1]))
    return "\n".join(lines)


def format_point_table(summary: dict[str, Any], clients: Sequence[ClientInfo], *, seeds: int,
                       point: str = "before_aggregation") -> str:
    """Per-client and average test accuracy of every method at evaluation `point` (`POINTS`); '' if none has it."""
    rows = [["Method"] + [c.title for c in clients] + ["Avg."]]
    for method in TABLE_ORDER:
        stats = summary.get(method, {}).get("points", {}).get(point)
        if stats is None:
            continue
        same = " (= after agg.)" if method in SAME_POINT and point != "after_aggregation" else ""
        rows.append([summary[method]["title"] + same]
                    + [f"{stats['per_client'][c.key]['mean']:.2f}" + (f"±{stats['per_client'][c.key]['std']:.2f}"
                                                                        if seeds > 1 else "") for c in clients]
                    + [f"{stats['average']['mean']:.2f}" + (f"±{stats['average']['std']:.2f}" if seeds > 1 else "")])
    if len(rows) == 1:
        return ""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    what = {"before_aggregation": "before aggregation: each client's model as its own last local run left it "
                                  "(its just-trained shared parts, private parts and heads)",
            "after_aggregation": "after aggregation"}[point]
    return f"Test accuracy (%) {what}\n" + "\n".join(lines)


def paired_differences(summary: dict[str, Any], *, level: float = 0.95,
                       point: str = "after_aggregation") -> dict[str, dict[str, float]]:
    """FedMCP minus each other method in average accuracy at evaluation `point` (`POINTS`; both methods at the
    same point), paired by seed (same split, same initial adapters): the mean difference and its Student-t
    interval over the common seeds (nan with one seed)."""
    if point not in summary.get("fedmcp", {}).get("points", {}):
        return {}
    ours = summary["fedmcp"]["points"][point]["average_by_seed"]
    out = {}
    for method in (m for m in TABLE_ORDER if m in summary and m != "fedmcp"):
        theirs = summary[method].get("points", {}).get(point)
        d = None if theirs is None else paired_difference(ours, theirs["average_by_seed"], level=level)
        if d is not None:
            out[method] = d
    return out


def point_differences(summary: dict[str, Any], *, level: float = 0.95) -> dict[str, dict[str, float]]:
    """Per method: accuracy before minus after aggregation, paired by seed, where the two can differ."""
    out = {}
    for method in (m for m in TABLE_ORDER if m in summary and m not in SAME_POINT):
        points = summary[method].get("points", {})
        if "before_aggregation" in points:
            out[method] = paired_difference(points["before_aggregation"]["average_by_seed"],
                                            points["after_aggregation"]["average_by_seed"], level=level)
    return out


def _cells(paired: dict[str, dict[str, float]], summary: dict[str, Any]) -> tuple[str, int]:
    cells = []
    for method, d in paired.items():
        interval = "n/a with one seed" if np.isnan(d["low"]) else f"[{d['low']:+.2f}, {d['high']:+.2f}]"
        cells.append(f"{summary[method]['title']} {d['mean']:+.2f} {interval}")
    return "; ".join(cells), max(d["seeds"] for d in paired.values())


def format_paired(paired: dict[str, dict[str, float]], summary: dict[str, Any], *,
                  point: str = "after_aggregation") -> str:
    if not paired:
        return ""
    cells, n = _cells(paired, summary)
    where = "" if point == "after_aggregation" else ", both before aggregation"
    return f"FedMCP minus each method{where}, average accuracy paired by seed (95% t-interval, {n} seeds): {cells}"


def format_point_differences(differences: dict[str, dict[str, float]], summary: dict[str, Any]) -> str:
    if not differences:
        return ""
    cells, n = _cells(differences, summary)
    return f"before minus after aggregation, average accuracy paired by seed (95% t-interval, {n} seeds): {cells}"


def twin_note(summary: dict[str, Any], *, protocol: str) -> str:
    """How the plaintext twin's row was obtained ('' without a twin)."""
    twin = summary.get(PLAIN_TWIN)
    if twin is None:
        return ""
    if "derived_from" not in twin:
        return (f"{twin['title']}: FedMCP trained again from the same seeds with plaintext sums (--twin rerun, or "
                "an in-run check that did not hold for every sum)")
    checked = summary.get("fedmcp", {}).get("plain_twin_checked_sums", 0)
    return (f"{twin['title']}: checked in-run: all {checked} {protocol} sums of FedMCP's run (every round, every "
            "seed) equalled the plaintext protocol's sums of the same inputs bit for bit, so the plaintext run's "
            "trajectory is FedMCP's and it was not trained twice (--twin rerun trains it)")


def ablation_line(summary: dict[str, Any], clients: Sequence[ClientInfo]) -> str:
    """FedMCP's Table II in one line, with the smallest client's test-set size (one example's weight)."""
    def value(method: str) -> str:
        return f"{summary[method]['average']['mean']:.2f}" if method in summary else "n/a"
    return (f"ablation full={value('fedmcp')} no_cl={value('fedmcp_no_cl')} no_bl={value('fedmcp_no_bl')} "
            f"min_test_per_client={min(c.sizes['test'] for c in clients)}")


def final_line(summary: dict[str, Any]) -> str:
    parts = []
    for method in ("fedmcp", "fedavg_peft", "local", "fedrep", "fedavg_full", "fedlr", "moon", "ditto"):
        if method in summary:
            parts.append(f"{method}={summary[method]['average']['mean']:.2f}")
    diff = "n/a"
    if "fedmcp" in summary and "fedmcp_plain" in summary:
        diff = f"{summary['fedmcp']['average']['mean'] - summary['fedmcp_plain']['average']['mean']:+.2f}"
    # the second evaluation point, after the line's earlier keys: before aggregation, where it can differ
    before = [f"{method}_local_eval={summary[method]['points']['before_aggregation']['average']['mean']:.2f}"
              for method in ("fedmcp", "fedavg_peft", "local", "fedrep", "fedavg_full", "fedlr", "moon", "ditto")
              if method in summary and method not in SAME_POINT
              and "before_aggregation" in summary[method].get("points", {})]
    return "avg_acc " + " ".join(parts) + f" secure_vs_plain_diff={diff}" + "".join(f" {b}" for b in before)


def plot_curves(summary: dict[str, Any], path: Path) -> Path:
    """Average validation accuracy per round, one line per method (the twin dashed)."""
    from matplotlib.ticker import MaxNLocator

    fig, ax = pyplot().subplots(figsize=(6.5, 4))
    for method in TABLE_ORDER:
        if method in summary:
            curve = summary[method]["curve"]
            ax.plot(range(1, len(curve) + 1), curve, marker="o", label=summary[method]["title"],
                    linestyle="--" if method == "fedmcp_plain" else "-")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel("average validation accuracy (%)")
    ax.set_title("Cross-task clients, SecAgg+ aggregation")
    return save_figure(fig, path)


def timing_report(summary: dict[str, Any], prefix_seconds: float, wall: float, *, runtime: str) -> str:
    """Where the time went, per method; under deploy only what the server sees."""
    if runtime == "deploy":
        lines = [f"time: {wall:.1f} s total; deploy runtime: the clients' timers (frozen-prefix cache, training, "
                 "forward passes, evaluation) stay in the client processes; per method, the server's view over all "
                 "its seeds:"]
        for method in (m for m in TABLE_ORDER if m in summary):
            s = summary[method]
            lines.append(f"  {method:<13} {s['seconds']:6.1f} s of rounds: secure agg {s['secure_seconds']:.1f}, "
                         f"clients and transport {s['seconds'] - s['secure_seconds']:.1f}")
        return "\n".join(lines)
    lines = [f"time: {wall:.1f} s total; frozen-prefix cache {prefix_seconds:.1f} s (once per seed, shared by its methods); "
             "per method over all its seeds (work done by this invocation; a resumed method shows only its rest):"]
    for method in TABLE_ORDER:
        if method not in summary:
            continue
        s = summary[method]
        if "derived_from" in s:
            lines.append(f"  {method:<13}    0.0 s: derived in-run from {s['derived_from']}'s checked sums")
            continue
        timer = s["timer"]
        evaluation = timer.get("evaluation", 0.0)
        train = sum(v for k, v in timer.items() if k != "evaluation")
        forward = {k.removeprefix("forward "): v for k, v in timer.items() if k.startswith("forward")}
        other = s["seconds"] - s["secure_seconds"] - train - evaluation
        detail = ", ".join(f"{k} {v:.1f}" for k, v in sorted(timer.items()) if k != "evaluation" and not k.startswith("forward"))
        fwd = ", ".join(f"{k} {v:.1f}" for k, v in forward.items())
        lines.append(f"  {method:<13} {s['seconds']:6.1f} s: train {train:.1f} (forward passes [{fwd}]; {detail}), "
                     f"eval {evaluation:.1f}, secure agg {s['secure_seconds']:.1f}, other {other:.1f}")
    return "\n".join(lines)


def cache_clients(clients: FedMCPClients, *, seed: int, progress: bool) -> float:
    """Simulation: every client's splits of `seed` cached below the adapted layers once, for all methods
    of that seed; seconds taken."""
    start = time.perf_counter()
    bar = tqdm(total=clients.num_clients, desc=f"frozen prefix (seed {seed})", disable=None if progress else True, leave=False)
    for info in clients.info:
        clients.client_data(info.client_id, seed=seed)
        bar.update(1)
    bar.close()
    return time.perf_counter() - start


__all__ = ["PART_ORDER", "PLAIN_TWIN", "POINTS", "RUNTIMES", "SAME_POINT", "TABLE_ORDER", "TASK_SPEC", "TITLES",
           "TWIN_MODES", "MethodRun", "Plan", "ablation_line", "cache_clients", "checked_sums", "combine_plans",
           "combined_runs", "derive_twin", "final_line", "format_paired", "format_point_differences",
           "format_point_table", "format_table", "full_ft_estimate", "last_epsilon", "paired_differences",
           "percent_columns", "plot_curves", "point_differences", "read_saved", "run_method",
           "run_parts", "saved_protocols", "summarise", "timing_report", "twin_note"]
