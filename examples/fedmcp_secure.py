"""FedMCP against its baselines on real offline data, with SecAgg+ on and the privacy cost stated.

    python examples/fedmcp_secure.py                      # defaults: < 10 min on 2 CPU cores
    python examples/fedmcp_secure.py --full --seeds 0,1,2 # the paper's 25 rounds, training sets capped to the smallest
    python examples/fedmcp_secure.py --dp                 # Opacus DP-SGD on the adapters, epsilon per client
    python examples/fedmcp_secure.py --runtime deploy     # server here, each client its own process over tcp
    python examples/fedmcp_secure.py --resume results/fedmcp/<run>   # finish an interrupted run
    python examples/fedmcp_secure.py --full --seeds 0,1,2 --workers 9  # each seed x method a process, 9 at a time
    python examples/fedmcp_secure.py --combine results/fedmcp/seed0 results/fedmcp/seed1 ...  # parts run elsewhere, one report

Options every example shares: --algorithms fedmcp,fedavg_peft,local,fedrep (alias --methods; add
fedavg_full or --with-full-ft, fedlr, moon, ditto, and the ablations fedmcp_no_cl, fedmcp_no_bl)  --protocol secagg+ (any secure protocol of `python -m fl_algorithms
--list`)  --seeds 0,1,2 (a comma list of seeds: mean and std over them; one value is one seed)
--device auto|cpu|cuda  --runtime sim|deploy (deploy: this process is the server and every client is
its own `python -m fl_algorithms.deploy_cli client` process, all over tcp on loopback; each client
caches only its own examples, see fl_algorithms.tasks.fedmcp).

Setting (FedMCP, Zhao et al. 2024, Sec. V): cross-task, cross-silo; four clients, each its own task
(Rotten Tomatoes sentiment, Rotten Tomatoes plot vs review, BBC topic, 2016 debates party), every
corpus split 6:2:2 afresh for each seed, the training splits capped alike (to the smallest client's
with --full, as the paper) and every client tested on its corpus's whole 20% test split. Frozen MiniLM-L6 backbone with bottleneck-16
GeLU adapters; Adam, lr 5e-4, one local epoch per round, batch 16 (see below). Methods in one run and one table:
Local, FedAvg (PEFT: both adapters aggregated), FedRep, FedMCP with SecAgg+, and FedMCP again in
plaintext to show what secure aggregation costs in accuracy (``secure_vs_plain_diff``).
FedAvg (Full FT) trains and uploads all 22.7 M parameters per client per round: it is left out of
the default run (its estimated cost is printed) and runs with ``--with-full-ft``.

Simplifications, with reasons:
* Adapters sit in the top ``--adapter-layers`` layers (default 2 of 6), not in every layer as in the
  paper: the paper's structure is kept inside the adapted layers, and the frozen bottom layers are
  computed once per example and shared by every method, round and seed (a 10-minute CPU budget
  cannot backpropagate through all six layers for five methods). ``--full`` uses all six layers.
* Defaults are small (180 training examples per client, 64 tokens, 5 rounds); ``--full`` gives 25
  rounds, training sets capped to the smallest client's (481), 128 tokens and batch 64. Test sets
  are never capped by default (--test-cap exists for smoke runs).
* Batch 16 instead of the paper's 64 by default: with 180 training examples per client (the paper's
  clients hold ~2,400) batch 64 leaves 3 optimizer steps per round. ``--batch-size 64`` restores it.
* The frozen layers run without dropout (like the cached prefix below them; it drew a quarter of each
  CPU step in random numbers; ``--backbone-dropout`` restores it), and their matmuls use bfloat16
  autocast where the CPU multiplies bfloat16 natively (``--precision fp32`` to turn off).
* Reported accuracy is the clients' test accuracy after the last round; the learning curve
  (accuracy.png, metrics.jsonl's ``mean_validation_accuracy``) is validation accuracy per round, so
  the large test splits are evaluated once per run rather than every round.
* Seeds vary the data split, the adapter/head initialisation, batch order and dropout; the table's
  ± is the std over seeds, and FedMCP's difference to each method is paired by seed with a 95%
  Student-t interval.
* Under ``--dp`` FedMCP runs without its contrastive term (mu = 0): CKA couples the examples of a
  batch, so DP-SGD's per-example clipping would not bound an example's influence.
* ``--runtime deploy``: every client process loads the four packaged corpora (the cap is the
  smallest one's size) and keeps only its own; the server reads no client timers, so the timing
  report there shows the server's round and secure-aggregation times only.

Output: the Table I layout (per-client accuracy, average, trainable and communicated parameters as
% of full fine-tuning) plus the bytes actually uploaded per round and the share of round time spent
in secure aggregation. The run directory holds config.toml (settings and plan; --resume reuses
them), metrics.jsonl/.csv (one line per method, seed and round, written as each round completes),
results.json, accuracy.png, per-method checkpoints and, under deploy, each client's log in logs/.
The last two printed lines are ``ablation full=.. no_cl=.. no_bl=.. min_test_per_client=N`` (FedMCP's
Table II: w/o L_c is mu = 0, w/o L_b is gamma = 0; n/a unless --algorithms includes fedmcp_no_cl and
fedmcp_no_bl) and ``avg_acc fedmcp=.. fedavg_peft=.. local=.. fedrep=.. secure_vs_plain_diff=..``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from dp.leakage.stats import mean_ci
from fl_algorithms.engine.round import RoundRecord
from fl_algorithms.engine.secure_sum import SecureAggregationConfig
from fl_algorithms.engine.sim import RunConfig, SimulationRunner
from fl_algorithms.experiments.cli import check_run_location, comma_list
from fl_algorithms.experiments.parallel import run_pool
from fl_algorithms.experiments.rundir import RunDirectory
from fl_algorithms.tasks.fedmcp import (BACKBONES, DEFAULT_METHODS, FULL_PRESET, METHODS, ClientInfo, FedMCPClients,
                                        FedMCPSettings, check_method)
from fl_algorithms.training.dp_trainer import quiet_dp_libraries
from nlp_models._offline import ensure_offline
from nlp_models.classifiers import make_head
from nlp_models.device import DEVICES, deterministic_kernels, resolve_device
from secagg.protocols import registry

PLAIN_TWIN = "fedmcp_plain"
"""FedMCP rerun with a plaintext sum, added to the run when FedMCP runs (unless --no-plain-check)."""
TITLES = {"fedavg_full": "FedAvg (Full FT)", "local": "Local", "fedavg_peft": "FedAvg (PEFT)", "fedrep": "FedRep",
          "fedlr": "FedLR (LoRA)", "moon": "MOON", "ditto": "Ditto",
          "fedmcp": "FedMCP", "fedmcp_no_cl": "FedMCP w/o L_c", "fedmcp_no_bl": "FedMCP w/o L_b",
          PLAIN_TWIN: "FedMCP (plaintext agg.)"}
TABLE_ORDER = ("fedavg_full", "local", "fedavg_peft", "fedlr", "fedrep", "moon", "ditto", "fedmcp", "fedmcp_no_cl",
               "fedmcp_no_bl", PLAIN_TWIN)
RUNTIMES = ("sim", "deploy")
TASK_SPEC = "fl_algorithms.tasks.fedmcp:build"
DEFAULT_OUT = Path("results/fedmcp")


@dataclass(frozen=True)
class Plan:
    """What the run does beyond the clients' settings (saved in config.toml with them)."""

    algorithms: tuple[str, ...] = DEFAULT_METHODS
    protocol: str = "secagg+"
    seeds: tuple[int, ...] = (0,)
    runtime: str = "sim"
    plain_check: bool = True
    """Rerun FedMCP with a plaintext sum to show what secure aggregation costs in accuracy."""

    def __post_init__(self) -> None:
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


# ---------------------------------------------------------------- command line

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--full", action="store_true", help="the paper's run: 25 rounds, clients capped to the smallest "
                   "corpus, 128 tokens, batch 64, adapters in all 6 layers (explicit flags still override)")
    p.add_argument("--algorithms", "--methods", dest="algorithms", type=comma_list(str, what="method", choices=METHODS),
                   help=f"comma list from {','.join(METHODS)} (default {','.join(DEFAULT_METHODS)})")
    p.add_argument("--with-full-ft", action="store_true", help="add FedAvg (Full FT): all 22.7 M parameters")
    p.add_argument("--protocol", choices=[n for n in registry.names() if n != "plain"],
                   help="secure aggregation protocol (default secagg+)")
    p.add_argument("--seeds", type=comma_list(int, what="seed"), help="comma list of seeds (default 0): mean and std over them")
    p.add_argument("--device", choices=DEVICES, default="auto",
                   help="torch device of the clients (default auto: CUDA when a GPU is visible)")
    p.add_argument("--runtime", choices=RUNTIMES,
                   help="sim: in memory (default); deploy: real client processes over tcp on loopback")
    p.add_argument("--backbone", choices=BACKBONES, help="minilm (default) or tiny: a random 3-layer BERT for smoke runs")
    p.add_argument("--tiny-backbone", dest="backbone", action="store_const", const="tiny", help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int)
    p.add_argument("--train-cap", type=int, help="training examples per client after the 6:2:2 split "
                   "(default 180; 0: the smallest client's training split, as the paper)")
    p.add_argument("--test-cap", type=int, help="cap the test splits (smoke runs only; default: each corpus's whole 20%%)")
    p.add_argument("--max-length", type=int)
    p.add_argument("--adapter-layers", type=int, help="adapters in the top N encoder layers (default 2 of 6)")
    p.add_argument("--bottleneck", type=int)
    p.add_argument("--head-hidden", type=int, help="MLP classifier width (0: linear classifiers)")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--gamma", type=float)
    p.add_argument("--mu", type=float)
    p.add_argument("--fedrep-head-epochs", type=int)
    p.add_argument("--moon-mu", type=float, help="MOON's contrastive weight (default 1)")
    p.add_argument("--moon-tau", type=float, help="MOON's temperature (default 0.5)")
    p.add_argument("--ditto-lambda", type=float, help="Ditto's proximal weight (default 0.1)")
    p.add_argument("--no-plain-check", action="store_true", help="skip FedMCP's plaintext-aggregation rerun")
    p.add_argument("--dp", action="store_true", default=None, help="Opacus DP-SGD on the adapters; epsilon per client")
    p.add_argument("--dp-noise", type=float)
    p.add_argument("--dp-clip", type=float)
    p.add_argument("--dp-delta", type=float)
    p.add_argument("--threads", type=int, help="torch intra-op threads (default: 2 if the machine is idle, else 1)")
    p.add_argument("--backbone-dropout", action="store_true", default=None,
                   help="keep dropout in the frozen adapted layers")
    p.add_argument("--precision", choices=("auto", "bf16", "fp32"),
                   help="bf16 autocast in the encoder layers (auto: where the device multiplies bf16 natively)")
    p.add_argument("--out", help=f"parent directory of run directories (default {DEFAULT_OUT})")
    p.add_argument("--run-name", help="run directory name (default: a timestamp)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR with its saved settings")
    p.add_argument("--deterministic", action="store_true",
                   help="bit-reproducible GPU kernels (slower): same seed, same numbers; secure vs plaintext "
                        "then differ only by the fixed-point encoding")
    p.add_argument("--workers", type=int, default=1,
                   help="simulation: run each seed x method as its own process, N at a time, sharing this machine "
                        "and its GPU (one process leaves a GPU idle between small kernels), then report them as one")
    p.add_argument("--combine", nargs="+", metavar="RUN_DIR",
                   help="report finished runs of one setting made in parts (a seed or a group of methods each, e.g. "
                        "in parallel processes or on several GPUs) as one run, in a new run directory")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--verbose", action="store_true", help="print where the time goes")
    return p


def _given_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The FedMCPSettings fields the command line sets (--full's preset, then explicit flags)."""
    values: dict[str, Any] = dict(FULL_PRESET) if args.full else {}
    values.update({f.name: getattr(args, f.name) for f in fields(FedMCPSettings)
                   if getattr(args, f.name, None) is not None})
    if args.train_cap == 0:
        values["train_cap"] = None
    if args.head_hidden == 0:
        values["head_hidden"] = None
    return values


def _given_plan(args: argparse.Namespace) -> dict[str, Any]:
    """The Plan fields the command line sets."""
    values: dict[str, Any] = {}
    if args.algorithms is not None or args.with_full_ft:
        algorithms = list(args.algorithms or DEFAULT_METHODS)
        if args.with_full_ft and "fedavg_full" not in algorithms:
            algorithms.append("fedavg_full")
        values["algorithms"] = tuple(algorithms)
    values.update({k: getattr(args, k) for k in ("protocol", "seeds", "runtime") if getattr(args, k) is not None})
    if args.no_plain_check:
        values["plain_check"] = False
    return values


def read_saved(path: Path) -> tuple[FedMCPSettings, Plan]:
    """The settings and plan saved in run directory `path`."""
    legacy = not (path / "config.toml").is_file() and (path / "config.json").is_file()
    saved = None if legacy else RunDirectory.open(path).read_config()
    if legacy or "cap" in saved["settings"]:
        raise ValueError("this run predates per-seed splits with whole test sets (its 'cap' was applied before "
                         "the split): it cannot be resumed exactly; start a new run")
    plan = {k: tuple(v) if isinstance(v, list) else v for k, v in saved["plan"].items()}
    return FedMCPSettings(**saved["settings"]), Plan(**plan)


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
    return settings, Plan(algorithms=tuple(m for m in TABLE_ORDER if m in methods), protocol=saved[0][1].protocol,
                          seeds=tuple(seeds), runtime=saved[0][1].runtime, plain_check=plain)


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
                timer=dict(meta["timer"]) if once else {}, clipped=meta["clipped_values"] if once else 0)
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


# FedMCP and its twin (4 passes per step, plus the plaintext rerun) first, then the costlier baselines
PART_ORDER = ("fedmcp", "fedavg_full", "fedmcp_no_cl", "fedmcp_no_bl", "moon", "ditto", "fedrep", "fedavg_peft",
              "fedlr", "local")


def run_parts(run: RunDirectory, settings: FedMCPSettings, plan: Plan, *, workers: int, device: str, threads: int,
              progress: bool, deterministic: bool = False) -> list[Path]:
    """--workers: each seed x method its own run directory under run/parts (FedMCP with its plaintext twin),
    run as `--resume PART` processes, `workers` at a time; finished parts (results.json) are not rerun
    and unfinished ones continue from their checkpoints. Returns every part's directory."""
    folder = run.path / "parts"
    parts = []
    for seed in plan.seeds:
        for method in sorted(plan.algorithms, key=lambda m: PART_ORDER.index(m) if m in PART_ORDER else len(PART_ORDER)):
            path = folder / f"seed{seed}-{method}"
            if not (path / "config.toml").is_file():
                part = Plan(algorithms=(method,), protocol=plan.protocol, seeds=(seed,), runtime=plan.runtime,
                            plain_check=plan.plain_check and method == "fedmcp")
                path.mkdir(parents=True, exist_ok=True)  # (or left without its config by an interrupted start)
                RunDirectory(path).write_config({"settings": settings, "plan": part})
            parts.append(path)
    todo = [p for p in parts if not (p / "results.json").is_file()]
    commands = [[sys.executable, str(Path(__file__).resolve()), "--resume", str(p), "--device", device,
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


def parse_settings(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, FedMCPSettings, Plan]:
    """The command line as settings and plan (saved ones under --resume); a bad argument exits with code 2."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be at least 1")
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    if args.workers > 1 and args.combine:
        parser.error("--workers runs a plan; --combine reports finished parts")
    check_run_location(parser, args)
    chosen, planned = _given_settings(args), _given_plan(args)
    try:
        resolve_device(args.device)
        if args.combine:
            if args.resume or chosen or planned:
                parser.error("--combine takes the parts' saved settings: give only --out/--run-name/--device/--threads")
            try:
                settings, plan = combine_plans([Path(p) for p in args.combine])
            except (OSError, ValueError, TypeError, KeyError) as error:
                parser.error(f"--combine: {error}")
        elif args.resume:
            try:
                settings, plan = read_saved(Path(args.resume))
            except (OSError, ValueError, TypeError, KeyError) as error:
                parser.error(f"--resume {args.resume}: {error}")
            clash = {k: v for k, v in chosen.items() if getattr(settings, k) != v}
            clash.update({k: v for k, v in planned.items() if getattr(plan, k) != v})
            if clash:
                parser.error(f"--resume reuses the run's saved settings; these options differ from them: {clash}")
        else:
            settings, plan = FedMCPSettings(**chosen), Plan(**planned)
        for method in plan.algorithms:
            check_method(method, settings)
        if args.workers > 1 and plan.runtime != "sim":
            raise ValueError("--workers is for the simulation; --runtime deploy already runs every client as a process")
    except (ValueError, TypeError) as error:
        parser.error(str(error))
    return args, settings, plan


def choose_threads(threads: int | None) -> int:
    """On a shared machine two threads contend with other processes and run slower than one."""
    if threads:
        return threads
    cores = os.cpu_count() or 1
    busy = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return max(1, min(2, cores - int(round(busy))))


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


def run_method(method: str, seed: int, clients: FedMCPClients, plan: Plan, run: RunDirectory, *, progress: bool,
               threads: int, logged: set[tuple[int, str, int]]) -> MethodRun:
    """One method for one seed in the chosen runtime, each round logged to the run directory as it completes."""
    name = "fedmcp" if method == PLAIN_TWIN else method
    protocol = "plain" if method == PLAIN_TWIN else plan.protocol
    where = f"{method}-seed{seed}"
    secure = SecureAggregationConfig(protocol=protocol, clip=1.0,  # per-coordinate range of one round's update
                                     max_weight=float(max(c.sizes["train"] for c in clients.info)),
                                     max_clients=clients.num_clients,
                                     # FedMCP's benchmark has 4 clients in all: every sum is over all of them
                                     min_release_group=min(5, clients.num_clients))
    # the learning curve on the (small) validation splits every round, the whole test splits in the last round
    config = RunConfig(rounds=clients.settings.rounds, seed=seed, secure=secure, curve_split="validation",
                       checkpoint_dir=str(run.checkpoint_dir / where))
    task = clients.task(name, seed=seed)

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

        bar = tqdm(total=config.rounds, desc=f"{method} seed {seed} (deployed)", disable=not progress, leave=False)

        def on_round(rec: RoundRecord, server: Any) -> None:
            log(rec)
            bar.update(1)

        try:
            server = run_on_loopback(
                task=task, task_spec=TASK_SPEC, config=config, clients=clients.num_clients, on_round=on_round,
                options=clients.options(name, seed=seed, threads=max(1, threads // clients.num_clients)),
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


def summarise(runs: dict[str, list[MethodRun]], clients: Sequence[ClientInfo], *, dp: bool) -> dict[str, Any]:
    """Per method, over its seeds: per-client and average accuracy (mean, std), curve, costs, epsilon, timers."""
    methods: dict[str, Any] = {}
    for method, seed_runs in runs.items():
        per_client = {c.key: _mean_std([100 * r.history[-1].metrics[c.client_id]["accuracy"] for r in seed_runs])
                      for c in clients}
        averages = [100 * float(np.mean([r.history[-1].metrics[c.client_id]["accuracy"] for c in clients]))
                    for r in seed_runs]
        by_seed = {str(r.seed): a for r, a in zip(seed_runs, averages)}
        curve = np.mean([[100 * rec.mean("validation_accuracy") for rec in r.history] for r in seed_runs], axis=0)
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
            "per_client": {k: {"mean": m, "std": s} for k, (m, s) in per_client.items()},
            "average": dict(zip(("mean", "std"), _mean_std(averages))),
            "average_by_seed": by_seed,
            "curve": [float(v) for v in curve],
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
        row = [s["title"]] + [cell(s["per_client"][c.key]) for c in clients] + [
            cell(s["average"]), f"{s['param_pct']:.2f}",
            "-" if s["comm_pct"] is None else f"{s['comm_pct']:.2f}",
            "-" if not s["shared_params"] else f"{s['bytes_uploaded_per_round'] / 1e6:.2f} MB",
            "-" if not s["shared_params"] else f"{100 * s['secure_share']:.1f}%"]
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


def paired_differences(summary: dict[str, Any], *, level: float = 0.95) -> dict[str, dict[str, float]]:
    """FedMCP minus each other method in average accuracy, paired by seed (same split, same initial
    adapters): the mean difference and its Student-t interval over the common seeds (nan with one seed)."""
    if "fedmcp" not in summary:
        return {}
    ours = summary["fedmcp"]["average_by_seed"]
    out = {}
    for method in (m for m in TABLE_ORDER if m in summary and m != "fedmcp"):
        theirs = summary[method]["average_by_seed"]
        common = sorted(set(ours) & set(theirs), key=int)
        if common:
            mean, low, high = mean_ci([ours[s] - theirs[s] for s in common], level=level)
            out[method] = {"mean": mean, "low": low, "high": high, "seeds": len(common)}
    return out


def format_paired(paired: dict[str, dict[str, float]], summary: dict[str, Any]) -> str:
    if not paired:
        return ""
    cells = []
    for method, d in paired.items():
        interval = "n/a with one seed" if np.isnan(d["low"]) else f"[{d['low']:+.2f}, {d['high']:+.2f}]"
        cells.append(f"{summary[method]['title']} {d['mean']:+.2f} {interval}")
    n = max(d["seeds"] for d in paired.values())
    return f"FedMCP minus each method, average accuracy paired by seed (95% t-interval, {n} seeds): " + "; ".join(cells)


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
    return "avg_acc " + " ".join(parts) + f" secure_vs_plain_diff={diff}"


def plot_curves(summary: dict[str, Any], path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.ticker import MaxNLocator
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for method in TABLE_ORDER:
        if method in summary:
            curve = summary[method]["curve"]
            ax.plot(range(1, len(curve) + 1), curve, marker="o", label=summary[method]["title"],
                    linestyle="--" if method == "fedmcp_plain" else "-")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel("average validation accuracy (%)")
    ax.set_title("Cross-task clients, SecAgg+ aggregation")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


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


# ---------------------------------------------------------------- main

def open_run(args: argparse.Namespace, settings: FedMCPSettings, plan: Plan) -> RunDirectory:
    """The resumed run directory, or a fresh one holding config.toml."""
    if args.resume:
        return RunDirectory.open(Path(args.resume))
    try:
        run = RunDirectory.create(Path(args.out) if args.out else DEFAULT_OUT, name=args.run_name)
    except FileExistsError as error:
        raise SystemExit(f"error: {error}") from None
    run.write_config({"settings": settings, "plan": plan})
    return run


def cache_clients(clients: FedMCPClients, *, seed: int, progress: bool) -> float:
    """Simulation: every client's splits of `seed` cached below the adapted layers once, for all methods
    of that seed; seconds taken."""
    start = time.perf_counter()
    bar = tqdm(total=clients.num_clients, desc=f"frozen prefix (seed {seed})", disable=not progress, leave=False)
    for info in clients.info:
        clients.client_data(info.client_id, seed=seed)
        bar.update(1)
    bar.close()
    return time.perf_counter() - start


def print_report(document: dict[str, Any], settings: FedMCPSettings, plan: Plan, *, verbose: bool,
                 run: RunDirectory) -> None:
    print()
    print(f"Test accuracy (%) after {settings.rounds} rounds, {len(plan.seeds)} seed(s) "
          f"({','.join(map(str, plan.seeds))}), runtime {plan.runtime}; aggregation: {plan.protocol}"
          f"{' (FedMCP also in plaintext)' if PLAIN_TWIN in document['methods'] else ''}; Comm. relative to "
          f"uploading the {document['backbone_params'] / 1e6:.1f} M backbone parameters")
    print(document["table"])
    if document["left_out"]:
        print(f"not run (add with --algorithms): {', '.join(TITLES[m] for m in document['left_out'])}")
    if document["paired_text"]:
        print(document["paired_text"])
    if settings.dp:
        print("epsilon: example-level, per client, at delta "
              f"{settings.dp_delta:g} (Opacus RDP accountant kept across rounds; as each client last reported it)")
    if plan.runtime == "deploy":
        print("deploy runtime: times are the server's (round time, secure aggregation); the clients' own timers "
              f"stay in their processes; client logs under {run.path / 'logs'}")
    if verbose:
        print(document["timing"])
    print(f"results: {run.path / 'results.json'}  plot: {run.path / 'accuracy.png'}")
    print(document["ablation_line"])
    print(document["final_line"])


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run every chosen method for every seed, print the table and return the results document."""
    ensure_offline()
    wall_start = time.perf_counter()
    args, settings, plan = parse_settings(argv)
    progress = not args.no_progress
    if args.deterministic:
        deterministic_kernels()
    threads = choose_threads(args.threads)
    torch.set_num_threads(threads)
    clients = FedMCPClients(settings, device=args.device)
    try:  # the backbone and the corpora are checked before a run directory exists
        backbone, _ = clients.backbone
        clients.info  # noqa: B018 - loads every corpus, or raises
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None
    run = open_run(args, settings, plan)
    print(f"run directory: {run.path}  (runtime {plan.runtime}, device {clients.device.type}, torch threads {threads}, "
          f"load {os.getloadavg()[0]:.1f}, {'bf16 autocast' if settings.bf16_on(clients.device) else 'fp32'} encoder)")
    depth = backbone.config.num_hidden_layers
    sizes = ", ".join(f"{c.title} {c.sizes['train']}/{c.sizes['validation']}/{c.sizes['test']}" for c in clients.info)
    print(f"clients (train/val/test): {sizes}; adapters in the top {settings.adapter_layers} of {depth} layers")
    if plan.runtime == "deploy":
        print("deploy: this process is the server; each client is its own `python -m fl_algorithms.deploy_cli "
              "client` process (tcp on loopback) that caches only its own examples")
    if settings.dp:
        quiet_dp_libraries()
        print(f"DP-SGD: noise {settings.dp_noise}, clip {settings.dp_clip}, delta {settings.dp_delta}; "
              "FedMCP runs with mu = 0 (CKA is a batch-level term); Opacus noise from torch's generator "
              "(not secure_mode: research grade)")

    logged = {(r.get("seed"), r.get("method"), r.get("round")) for r in run.rounds()}
    runs: dict[str, list[MethodRun]] = defaultdict(list)
    parallel = bool(args.combine) or args.workers > 1
    plan_runs = [] if parallel else [(seed, method) for seed in plan.seeds for method in plan.run_list()]
    if args.workers > 1:
        parts = run_parts(run, settings, plan, workers=args.workers, device=clients.device.type, threads=threads,
                          progress=progress, deterministic=args.deterministic)
        runs = combined_runs(parts, plan, run, logged)
    elif args.combine:
        runs = combined_runs([Path(p) for p in args.combine], plan, run, logged)
        print(f"combined {len(args.combine)} parts: seeds {list(plan.seeds)}, methods {plan.run_list()}")
    outer = tqdm(plan_runs, desc="methods", disable=not progress, leave=False)
    prefix_seconds = 0.0
    for seed, method in outer:
        outer.set_postfix_str(f"{method} seed {seed}")
        if plan.runtime == "sim":  # a no-op once this seed's clients are cached
            prefix_seconds += cache_clients(clients, seed=seed, progress=progress)
        runs[method].append(run_method(method, seed, clients, plan, run, progress=progress, threads=threads,
                                       logged=logged))
    outer.close()

    backbone_params = sum(p.numel() for p in backbone.parameters())
    head_params = float(np.mean([sum(p.numel() for p in make_head(backbone.config.hidden_size, c.num_labels,
                                                                  mlp_hidden=settings.head_hidden, seed=0).parameters())
                                 for c in clients.info]))
    summary = summarise(runs, clients.info, dp=settings.dp)
    percent_columns(summary, backbone_params=backbone_params, head_params=head_params)
    full_note = None
    if "fedavg_full" not in summary:
        full_note = full_ft_estimate(summary, backbone_params=backbone_params, depth=depth,
                                     adapter_layers=settings.adapter_layers)
    table = format_table(summary, clients.info, seeds=len(plan.seeds), dp=settings.dp, full_ft_note=full_note)
    line = final_line(summary)
    paired = paired_differences(summary)
    wall = time.perf_counter() - wall_start
    timing = timing_report(summary, prefix_seconds, wall, runtime=plan.runtime)
    document = {"methods": summary, "table": table, "final_line": line, "full_ft": full_note,
                "paired": paired, "paired_text": format_paired(paired, summary),
                "left_out": [m for m in TABLE_ORDER if m in METHODS and m not in summary],
                "ablation_line": ablation_line(summary, clients.info),
                "prefix_cache_seconds": prefix_seconds, "wall_seconds": wall,
                "clients": {c.key: {"title": c.title, "labels": c.num_labels, **c.sizes} for c in clients.info},
                "backbone_params": backbone_params, "timing": timing, "seeds": list(plan.seeds),
                "runtime": plan.runtime, "device": clients.device.type, "deterministic": args.deterministic}
    run.write_results({"config": {"settings": settings, "plan": plan}, "summary": document,
                       "runs": {f"{m}/seed{r.seed}": r.history for m, rs in runs.items() for r in rs}})
    plot_curves(summary, run.path / "accuracy.png")
    run.close()

    print_report(document, settings, plan, verbose=args.verbose, run=run)
    return document


if __name__ == "__main__":
    main()
