"""FedMCP against its baselines on real offline data, with SecAgg+ on and the privacy cost stated.

    python examples/fedmcp_secure.py                      # defaults: 210-225 s on 2 idle CPU cores (2026-11-29)
    python examples/fedmcp_secure.py --quick              # 2 rounds, 60 training / 100 test examples per client
    python examples/fedmcp_secure.py --full --seeds 0,1,2 # the paper's 25 rounds, training sets capped to the smallest
    python examples/fedmcp_secure.py --dp                 # Opacus DP-SGD on the adapters, epsilon per client
    python examples/fedmcp_secure.py --runtime deploy     # server here, each client its own process over tcp
    python examples/fedmcp_secure.py --resume results/fedmcp/<run>   # finish an interrupted run
    python examples/fedmcp_secure.py --resume results/fedmcp/<run> --report   # print a finished run's report again
    python examples/fedmcp_secure.py --full --seeds 0,1,2 --workers 9  # each seed x method a process, 9 at a time
    python examples/fedmcp_secure.py --combine results/fedmcp/seed0 results/fedmcp/seed1 ...  # parts run elsewhere, one report
    python examples/fedmcp_secure.py --training-protocol fedmcp-fresh --precision fp32  # a fresh Adam each round, fp32

Options every example shares (fl_algorithms.experiments.flags): --quick  --algorithms fedmcp,fedavg_peft,local,fedrep
(--methods, its older name, still works; add fedavg_full or --with-full-ft, fedlr, moon, ditto, and the ablations
fedmcp_no_cl, fedmcp_no_bl)  --protocol secagg+ (any secure protocol of `python -m fl_algorithms --list`)
--seeds 0,1,2 (a comma list of seeds: mean and std over them; one value is one seed)  --device auto|cpu|cuda
--runtime sim|deploy (deploy: this process is the server and every client is its own
`python -m fl_algorithms.deploy_cli client` process, all over tcp on loopback; each client caches only its own
examples, see fl_algorithms.tasks.fedmcp)  --resume RUN_DIR [--report].

Setting (FedMCP, Zhao et al. 2024, Sec. V): cross-task, cross-silo; four clients, each its own task
(Rotten Tomatoes sentiment, Rotten Tomatoes plot vs review, BBC topic, 2016 debates party), every
corpus split 6:2:2 afresh for each seed, the training splits capped alike (to the smallest client's
with --full, as the paper) and every client tested on its corpus's whole 20% test split. Frozen MiniLM-L6 backbone with bottleneck-16
GeLU adapters; Adam, lr 5e-4, one local epoch per round, batch 16 (see below). Methods in one run and one table:
Local, FedAvg (PEFT: both adapters aggregated), FedRep, FedMCP with SecAgg+, and FedMCP's plaintext twin to
show what secure aggregation costs in accuracy (``secure_vs_plain_diff``). The twin is checked in-run by default
(``--twin``): every round, each SecAgg+ sum is also summed by the plaintext protocol from the same inputs; when all
agree bit for bit the plaintext run is FedMCP's own trajectory (same sums, same next round), so its row is
FedMCP's, marked derived, and nothing is trained twice (a differing or failed sum trains the twin again;
``--twin rerun`` always does, and is a deployment's only mode). Both give the same row (tested).
FedAvg (Full FT) trains and uploads all 22.7 M parameters per client per round: it is left out of
the default run (its estimated cost is printed) and runs with ``--with-full-ft``.

Training protocol (`--training-protocol`, docs/protocols.md; every field cited to the paper's section in
`fl_algorithms.training.adapter_trainer.fedmcp_protocol`): Adam at lr 5e-4, constant, no clipping, one local
epoch per round, last round, for every method of the run (Sec. V-C). The paper leaves the optimiser's
lifetime open: ``fedmcp`` (default, as every run before) keeps each client's Adam across rounds,
``fedmcp-fresh`` builds it afresh at every local run. ``--precision fp32|bf16`` sets the encoder's
autocast (default auto: bf16 where it is faster than fp32, i.e. a GPU from Ampere on or a CPU with AMX; fp32
elsewhere, as on this 2-core CPU since 2026-11-29; the paper's V100 has no bf16). The run header prints each method's protocol; config.toml and results.json record it
(``training_protocol``, and ``protocol`` per method in results.json). A run saved before protocols were
declared resumes with the kept Adam it ran.

Two evaluation points: the table's accuracy is measured after aggregation (the round's averaged global
adapter under the client's own private adapter and heads); a second table gives each client's model as
its own last local run left it (before aggregation). The paper does not say which Table I reports.

Simplifications, with reasons:
* Adapters sit in the top ``--adapter-layers`` layers (default 2 of 6), not in every layer as in the
  paper: the paper's structure is kept inside the adapted layers, and the frozen bottom layers are
  computed once per example and shared by every method, round and seed (a 5-minute CPU budget
  cannot backpropagate through all six layers for five methods). ``--full`` uses all six layers.
* Defaults are small (180 training examples per client, 64 tokens, 5 rounds); ``--full`` gives 25
  rounds, training sets capped to the smallest client's (481), 128 tokens and batch 64. Test sets
  are never capped by default (--test-cap exists for smoke runs).
* Batch 16 instead of the paper's 64 by default: with 180 training examples per client (the paper's
  clients hold ~2,400) batch 64 leaves 3 optimizer steps per round. ``--batch-size 64`` restores it.
* The frozen layers run without dropout (like the cached prefix below them; it drew a quarter of each
  CPU step in random numbers; ``--backbone-dropout`` restores it), and their matmuls use bfloat16
  autocast where that is faster than fp32 (``--precision`` chooses).
* The first adapted layer's attention block (frozen weights on frozen inputs) is cached with the prefix,
  so each pass starts that layer at its first adapter site (`nlp_models.frozen_prefix`); LoRA, which
  trains query and value, computes it afresh.
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
fedmcp_no_bl) and ``avg_acc fedmcp=.. fedavg_peft=.. local=.. fedrep=.. secure_vs_plain_diff=..`` followed by
the before-aggregation accuracies ``fedmcp_local_eval=.. fedavg_peft_local_eval=.. ...`` of the methods where
the two points can differ (not Local or Ditto).
"""
from __future__ import annotations

import argparse
import os
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

# heavy modules (torch, transformers) are imported where they are used, after the command line is parsed
from fl_algorithms.choices import (BACKBONES, FEDMCP_DEFAULT_METHODS as DEFAULT_METHODS, FEDMCP_METHODS as METHODS,
                                   FEDMCP_TRAINING_PROTOCOLS)
from fl_algorithms.experiments.cli import check_run_location, protocol_lines
from fl_algorithms.experiments.flags import add_common_flags
from nlp_models._offline import ensure_offline
from secagg.protocols import registry

if TYPE_CHECKING:
    from fl_algorithms.experiments.fedmcp_grid import Plan
    from fl_algorithms.experiments.rundir import RunDirectory
    from fl_algorithms.tasks.fedmcp import FedMCPSettings

DEFAULT_OUT = Path("results/fedmcp")
QUICK_PRESET = {"rounds": 2, "train_cap": 60, "test_cap": 100}
"""--quick: 2 rounds, 60 training and (a smoke-run cap) 100 test examples per client; the default run's model."""


# ---------------------------------------------------------------- command line

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_flags(p, quick="2 rounds, 60 training and 100 test examples per client (a smoke run's test cap)",
                     full="the paper's run: 25 rounds, clients capped to the smallest corpus, 128 tokens, batch 64, "
                          "adapters in all 6 layers (explicit flags still override)",
                     algorithms=METHODS, default_algorithms=DEFAULT_METHODS, algorithm_word="method", seeds="0",
                     rounds="default 5; --quick 2; --full 25", protocols=[n for n in registry.names() if n != "plain"],
                     runtime=True, device="auto", out=str(DEFAULT_OUT),
                     resume="continue the run in RUN_DIR with its saved settings",
                     workers="simulation: run each seed x method as its own process, N at a time, sharing this "
                             "machine and its GPU (one process leaves a GPU idle between small kernels), then report "
                             "them as one", progress=True, report=True)
    p.add_argument("--with-full-ft", action="store_true", help="add FedAvg (Full FT): all 22.7 M parameters")
    p.add_argument("--backbone", choices=BACKBONES, help="minilm (default) or tiny: a random 3-layer BERT for smoke runs")
    p.add_argument("--tiny-backbone", dest="backbone", action="store_const", const="tiny", help=argparse.SUPPRESS)
    p.add_argument("--train-cap", type=int, help="training examples per client after the 6:2:2 split "
                   "(default 180; 0: the smallest client's training split, as the paper)")
    p.add_argument("--test-cap", type=int, help="cap the test splits (smoke runs only; default: each corpus's whole 20%%)")
    p.add_argument("--max-length", type=int, help="tokens per example (default 64; --full 128)")
    p.add_argument("--adapter-layers", type=int, help="adapters in the top N encoder layers (default 2 of 6)")
    p.add_argument("--bottleneck", type=int, help="adapter bottleneck width (default 16)")
    p.add_argument("--head-hidden", type=int, help="MLP classifier width (0: linear classifiers)")
    p.add_argument("--batch-size", type=int, help="local batch size (default 16; --full 64, the paper's)")
    p.add_argument("--lr", type=float, help="the clients' Adam lr (default 5e-4, the paper's)")
    p.add_argument("--gamma", type=float, help="FedMCP's weight of the global-only loss L_b (default 0.5)")
    p.add_argument("--mu", type=float, help="FedMCP's weight of the CKA model-contrastive loss L_c (default 0.05)")
    p.add_argument("--fedrep-head-epochs", type=int, help="FedRep's head epochs per round (default 10)")
    p.add_argument("--moon-mu", type=float, help="MOON's contrastive weight (default 1)")
    p.add_argument("--moon-tau", type=float, help="MOON's temperature (default 0.5)")
    p.add_argument("--ditto-lambda", type=float, help="Ditto's proximal weight (default 0.1)")
    p.add_argument("--no-plain-check", action="store_true", help="no plaintext twin of FedMCP")
    p.add_argument("--twin", choices=("in-run", "rerun"),
                   help="how FedMCP's plaintext twin is obtained: in-run (the simulation's default) sums every "
                        "secure sum's inputs with the plaintext protocol too and, when all agree bit for bit, reports "
                        "FedMCP's trajectory as the twin's without training it again; rerun (a deployment's only "
                        "mode) trains FedMCP again with plaintext sums")
    p.add_argument("--dp", action="store_true", default=None, help="Opacus DP-SGD on the adapters; epsilon per client")
    p.add_argument("--dp-noise", type=float, help="with --dp: DP-SGD's noise multiplier (default 1.0)")
    p.add_argument("--dp-clip", type=float, help="with --dp: per-example gradient clipping norm (default 1.0)")
    p.add_argument("--dp-delta", type=float, help="with --dp: the delta of each client's epsilon (default 1e-5)")
    p.add_argument("--threads", type=int, help="torch intra-op threads (default: 2 if the machine is idle, else 1)")
    p.add_argument("--backbone-dropout", action="store_true", default=None,
                   help="keep dropout in the frozen adapted layers")
    p.add_argument("--precision", choices=("fp32", "bf16", "auto"),
                   help="the declared protocol's precision: fp32, or bf16 autocast in the encoder layers (default "
                        "auto: bf16 where it is faster, a GPU from Ampere on or a CPU with AMX; fp32 elsewhere)")
    p.add_argument("--training-protocol", choices=FEDMCP_TRAINING_PROTOCOLS,
                   help="the clients' declared training protocol (docs/protocols.md): fedmcp (default) = the "
                        "paper's Adam (lr 5e-4) kept across rounds, as every run before; fedmcp-fresh = a fresh "
                        "Adam at every local run (the paper does not say which)")
    p.add_argument("--deterministic", action="store_true",
                   help="bit-reproducible GPU kernels (slower): same seed, same numbers; secure vs plaintext "
                        "then differ only by the fixed-point encoding")
    p.add_argument("--combine", nargs="+", metavar="RUN_DIR",
                   help="report finished runs of one setting made in parts (a seed or a group of methods each, e.g. "
                        "in parallel processes or on several GPUs) as one run, in a new run directory")
    p.add_argument("--verbose", action="store_true", help="print where the time goes")
    return p


def _given_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The FedMCPSettings fields the command line sets (--full's or --quick's preset, then explicit flags)."""
    from fl_algorithms.tasks.fedmcp import FULL_PRESET, FedMCPSettings

    values: dict[str, Any] = dict(FULL_PRESET) if args.full else dict(QUICK_PRESET) if args.quick else {}
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
    if args.twin is not None:
        values["twin"] = args.twin
    return values


def parse_settings(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, FedMCPSettings, Plan]:
    """The command line as settings and plan (saved ones under --resume); a bad argument exits with code 2."""
    parser = _parser()
    args = parser.parse_args(argv)
    from fl_algorithms.experiments.fedmcp_grid import Plan, combine_plans, read_saved
    from fl_algorithms.tasks.fedmcp import FedMCPSettings, check_method
    from nlp_models.device import resolve_device

    if args.report and (not args.resume or args.combine or args.workers > 1):
        parser.error("--report prints a finished run's report: give --resume RUN_DIR, without --combine or --workers")
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
    """On a shared machine two threads contend with other processes and run slower than one. Busy is what
    runs now (/proc/loadavg's runnable count, this process excluded), not the 1-minute load average: that
    still counts jobs that just finished, and picking one thread on an idle 2-core machine made the default
    run 1.75x slower (`--quick`: 152 s on 1 thread, 87 s on 2, 2026-11-29)."""
    if threads:
        return threads
    cores = os.cpu_count() or 1
    return max(1, min(2, cores - busy_cores()))


def busy_cores() -> int:
    """Processes runnable right now besides this one (the 1-minute load average where /proc is absent)."""
    try:
        with open("/proc/loadavg") as fh:
            running = int(fh.read().split()[3].split("/")[0])
        return max(0, running - 1)
    except (OSError, ValueError, IndexError):
        return int(round(os.getloadavg()[0])) if hasattr(os, "getloadavg") else 0


# ---------------------------------------------------------------- main

def open_run(args: argparse.Namespace, settings: FedMCPSettings, plan: Plan, *,
             protocols: dict[str, dict[str, Any]]) -> RunDirectory:
    """The resumed run directory, or a fresh one holding config.toml (settings, plan and each method's
    declared training protocol)."""
    from fl_algorithms.experiments.rundir import RunDirectory

    if args.resume:
        return RunDirectory.open(Path(args.resume))
    try:
        run = RunDirectory.create(Path(args.out) if args.out else DEFAULT_OUT, name=args.run_name)
    except FileExistsError as error:
        raise SystemExit(f"error: {error}") from None
    run.write_config({"settings": settings, "plan": plan, "training_protocol": protocols})
    return run


def print_report(document: dict[str, Any], settings: FedMCPSettings, plan: Plan, *, verbose: bool,
                 run: RunDirectory) -> None:
    from fl_algorithms.experiments.fedmcp_grid import PLAIN_TWIN, TITLES

    print()
    print(f"Test accuracy (%) after {settings.rounds} rounds, {len(plan.seeds)} seed(s) "
          f"({','.join(map(str, plan.seeds))}), runtime {plan.runtime}; aggregation: {plan.protocol}"
          f"{' (FedMCP also in plaintext)' if PLAIN_TWIN in document['methods'] else ''}; Comm. relative to "
          f"uploading the {document['backbone_params'] / 1e6:.1f} M backbone parameters")
    print(document["table"])
    if document["table_before_aggregation"]:
        print()
        print(document["table_before_aggregation"])
    if document["left_out"]:
        print(f"not run (add with --algorithms): {', '.join(TITLES[m] for m in document['left_out'])}")
    for key in ("twin_note", "paired_text", "paired_before_aggregation_text", "point_differences_text"):
        if document.get(key):  # (twin_note: absent from results written before the in-run twin)
            print(document[key])
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


def report_saved(args: argparse.Namespace, settings: FedMCPSettings, plan: Plan) -> dict[str, Any]:
    """--resume RUN_DIR --report: print the finished run's report from its results.json, running nothing."""
    from fl_algorithms.experiments.rundir import RunDirectory

    run = RunDirectory.open(Path(args.resume))
    document = run.finished_summary()
    try:
        print_report(document, settings, plan, verbose=args.verbose, run=run)
    except (ValueError, KeyError) as error:
        raise SystemExit(f"error: {run.path / 'results.json'} cannot be reported ({error!r}; written by an older "
                         "version?)") from None
    return document


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run every chosen method for every seed, print the table and return the results document."""
    ensure_offline()
    wall_start = time.perf_counter()
    args, settings, plan = parse_settings(argv)
    if args.report:
        return report_saved(args, settings, plan)
    import numpy as np
    import torch
    from tqdm.auto import tqdm

    from fl_algorithms.experiments.fedmcp_grid import (PLAIN_TWIN, TABLE_ORDER, TITLES, MethodRun, ablation_line,
                                                       cache_clients, combined_runs, final_line, format_paired,
                                                       format_point_differences, format_point_table, format_table,
                                                       full_ft_estimate, paired_differences, percent_columns,
                                                       plot_curves, point_differences, run_method, run_parts,
                                                       saved_protocols, summarise, timing_report, twin_note)
    from fl_algorithms.tasks.fedmcp import FedMCPClients
    from fl_algorithms.training.dp_trainer import quiet_dp_libraries
    from nlp_models.classifiers import make_head
    from nlp_models.cpu import set_torch_threads
    from nlp_models.device import deterministic_kernels

    progress = not args.no_progress
    if args.deterministic:
        deterministic_kernels()
    threads = set_torch_threads(choose_threads(args.threads))
    clients = FedMCPClients(settings, device=args.device)
    try:  # the backbone and the corpora are checked before a run directory exists
        backbone, _ = clients.backbone
        clients.info  # noqa: B018 - loads every corpus, or raises
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None
    protocols = clients.protocols(plan.run_list())
    protocol_docs = {m: p.to_dict() for m, p in protocols.items()}
    run = open_run(args, settings, plan, protocols=protocol_docs)
    print(f"run directory: {run.path}  (runtime {plan.runtime}, device {clients.device.type}, torch threads {threads}, "
          f"load {os.getloadavg()[0]:.1f}, {'bf16 autocast' if settings.bf16_on(clients.device) else 'fp32'} encoder)")
    if args.resume and "training_protocol" not in run.read_config().get("settings", {}):
        print("this run was saved before training protocols were declared: it resumes with the kept Adam it ran "
              "(--training-protocol fedmcp)")
    print("\n".join(protocol_lines({m: p for m, p in protocols.items() if m != PLAIN_TWIN})), flush=True)
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
        parts = run_parts(run, settings, plan, script=Path(__file__).resolve(), workers=args.workers, device=clients.device.type, threads=threads,
                          progress=progress, deterministic=args.deterministic, protocols=protocol_docs)
        runs = combined_runs(parts, plan, run, logged)
        protocol_docs.update(saved_protocols(parts))
    elif args.combine:
        runs = combined_runs([Path(p) for p in args.combine], plan, run, logged)
        protocol_docs.update(saved_protocols([Path(p) for p in args.combine]))  # as the parts ran
        print(f"combined {len(args.combine)} parts: seeds {list(plan.seeds)}, methods {plan.run_list()}")
    outer = tqdm(plan_runs, desc="methods", disable=None if progress else True, leave=False)
    prefix_seconds = 0.0
    for seed, method in outer:
        outer.set_postfix_str(f"{method} seed {seed}")
        if plan.runtime == "sim":  # a no-op once this seed's clients are cached
            prefix_seconds += cache_clients(clients, seed=seed, progress=progress)
        secure = runs.get("fedmcp")  # FedMCP's run of this seed, which the in-run twin is derived from
        runs[method].append(run_method(method, seed, clients, plan, run, progress=progress, threads=threads,
                                       logged=logged, twin_of=secure[-1] if secure and method == PLAIN_TWIN else None))
    outer.close()

    backbone_params = sum(p.numel() for p in backbone.parameters())
    head_params = float(np.mean([sum(p.numel() for p in make_head(backbone.config.hidden_size, c.num_labels,
                                                                  mlp_hidden=settings.head_hidden, seed=0).parameters())
                                 for c in clients.info]))
    summary = summarise(runs, clients.info, dp=settings.dp)
    for method, row in summary.items():
        row["protocol"] = protocol_docs[method]
    percent_columns(summary, backbone_params=backbone_params, head_params=head_params)
    full_note = None
    if "fedavg_full" not in summary:
        full_note = full_ft_estimate(summary, backbone_params=backbone_params, depth=depth,
                                     adapter_layers=settings.adapter_layers)
    table = format_table(summary, clients.info, seeds=len(plan.seeds), dp=settings.dp, full_ft_note=full_note)
    line = final_line(summary)
    paired = paired_differences(summary)
    paired_before = paired_differences(summary, point="before_aggregation")
    points = point_differences(summary)
    wall = time.perf_counter() - wall_start
    timing = timing_report(summary, prefix_seconds, wall, runtime=plan.runtime)
    document = {"methods": summary, "table": table, "final_line": line, "full_ft": full_note,
                "paired": paired, "paired_text": format_paired(paired, summary),
                "twin_note": twin_note(summary, protocol=plan.protocol),
                "table_before_aggregation": format_point_table(summary, clients.info, seeds=len(plan.seeds)),
                "paired_before_aggregation": paired_before,
                "paired_before_aggregation_text": format_paired(paired_before, summary, point="before_aggregation"),
                "point_differences": points, "point_differences_text": format_point_differences(points, summary),
                "training_protocol": settings.training_protocol,
                "left_out": [m for m in TABLE_ORDER if m in METHODS and m not in summary],
                "ablation_line": ablation_line(summary, clients.info),
                "prefix_cache_seconds": prefix_seconds, "wall_seconds": wall,
                "clients": {c.key: {"title": c.title, "labels": c.num_labels, **c.sizes} for c in clients.info},
                "backbone_params": backbone_params, "timing": timing, "seeds": list(plan.seeds),
                "runtime": plan.runtime, "device": clients.device.type, "deterministic": args.deterministic}
    run.write_results({"experiment": "fedmcp",
                       "config": {"settings": settings, "plan": plan, "training_protocol": protocol_docs},
                       "summary": document,
                       "runs": {f"{m}/seed{r.seed}": r.history for m, rs in runs.items() for r in rs}})
    plot_curves(summary, run.path / "accuracy.png")
    run.close()

    print_report(document, settings, plan, verbose=args.verbose, run=run)
    return document


if __name__ == "__main__":
    main()
