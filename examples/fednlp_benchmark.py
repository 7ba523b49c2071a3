"""FedNLP's benchmark grid (Lin et al., 2022) with every upload through secure aggregation: text
classification, sequence tagging, extractive QA and seq2seq, under FedAvg, FedProx and FedOPT.

    python examples/fednlp_benchmark.py --quick      # 4 tasks x 3 algorithms, SecAgg+, 9-11 min on 2 cores
    python examples/fednlp_benchmark.py              # + non-IID partitions, 3 seeds (a GPU-sized run)
    python examples/fednlp_benchmark.py --resume results/fednlp_grid/<run>   # finish an interrupted grid
    python examples/fednlp_benchmark.py --resume results/fednlp_grid/<run> --algorithms fedprox  # grow it
    python examples/fednlp_benchmark.py --resume results/fednlp_grid/<run> --report  # tables so far, runs none
    python examples/fednlp_benchmark.py --quick --freezing 0,2,4,5   # FedNLP's layer-freezing study

Tasks (offline stand-ins, see each module): BBC topics (fl_algorithms.tasks.classification), tweets
NER scored by seqeval span F1 (.tagging), cloze questions over BBC scored by SQuAD F1 (.qa), BBC
headline from body scored by ROUGE-L (.seq2seq). Clients train Houlsby adapters in the top layers of
the frozen MiniLM plus a head (seq2seq: the decoder of a BERT2BERT model warm-started from MiniLM);
SIMPLIFICATION: FedNLP fine-tunes whole models, which `--whole-layers 6` does for classification,
tagging and QA (every layer but the embeddings, client lr 5e-5). FedOPT is FedNLP's: server SGD with
momentum (FedAvgM, lr 0.1, momentum 0.9, as FedNLP's own scripts; `--fedopt-server-lr 1.0` is the lr
its text states); FedAdam / FedAdagrad / FedYogi are Reddi et al.'s (--algorithms).

Training protocol (docs/protocols.md; `--training-protocol`, printed per algorithm at the start and
recorded in every cell): FedNLP's by default, as its public trainer runs it: SGD for FedAvg and FedProx
(and Reddi et al.'s adaptive servers), AdamW for FedOPT's clients, a fresh optimiser every round with a
linear warmup (6% of the round's steps) and decay to 0, gradients clipped to norm 1.0. Each optimiser
runs at an lr chosen for it on validation: AdamW at the task's lr, SGD at the task's SGD lr (3 for every
task, docs/protocols.md; `--sgd-lr TASK=LR[,TASK=LR]` sets one task's, e.g. for a pilot, and the plan
records them, so a resumed grid keeps the lrs it ran). `--training-protocol federated-norm` is the all-AdamW control (a fresh AdamW each
round, constant lr, no clipping); `kept-adamw` reproduces grids run before protocols were declared
(AdamW kept across rounds; a resumed grid saved before then keeps it).

Partitions: iid, label:ALPHA (Dirichlet label skew; tagging has no sentence label and uses
cluster:ALPHA, FedNLP's k-means feature clusters, instead), quantity:BETA, cluster:ALPHA.

Writes results/fednlp_grid/<run>/: cells.jsonl (one line per finished run), grid.csv and grid.md
(score mean ± std over seeds per task, partition, protocol, algorithm), curves.png (validation curves
per task and partition), partition_curves.png (with several partitions: per task and algorithm, one
line per partition with its spread over seeds, FedNLP's Figure 5), partitions.md/.png (the partitions'
statistics), paired.md (under the first secure protocol, paired by seed: each algorithm minus FedAvg per
partition, and IID minus each other partition per algorithm, in points, of the score and of the pooled
score). A run's `score` is the mean over clients of each client's test metric; its `pooled_score` is the
metric over the union of the clients' test splits, FedNLP's global test set (under a skewed partition the
two differ: small clients count as much as large ones in the first). The last lines are one per task:
    fednlp task=classification metric=acc trivial=.. fedavg=.. fedprox=.. fedopt=.. secure_vs_plain_max_diff=..
      ... protocol=fednlp
with the first partition and secure protocol's test scores (mean over seeds), the trivial baseline
(majority class, most frequent tag, the better of first-entity and empty answer, lead words of the
body), the largest difference of any final parameter between FedAvg under the secure protocol and
under a plaintext sum (first seed), the same after round 1 (round1_diff: both runs start equal and
see the same batches, so only the fixed-point encoding differs) next to the encoder's bound and
whether every coordinate is within it (plus the float32 rounding of the update and of the new
parameters, the models' precision), the
plaintext twin's seconds per round and the secure sum's seconds per round (FedAvg; the overhead), and
the grid's training protocol.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fl_algorithms.experiments.cli import (add_run_args, add_training_protocol_arg, append_cell, comma_list, open_run,
                                           parse_grid_args, protocol_lines, read_cells, start_workers)
from fl_algorithms.experiments.fednlp_grid import (ALGORITHMS, METRIC_NAMES, PROTOCOLS, WIDENABLE, AlgorithmSettings,
                                                   GridPlan, aggregate, cell_key, encoder_bound, flat_vector,
                                                   load_formulation,
                                                   paired_comparisons, partition_for, plan_from_record, plan_record,
                                                   plot_curves, plot_partition_curves, run_cell, selected_sgd_lrs,
                                                   untwinned, whole_layer_tasks, write_paired, write_table)
from fl_algorithms.experiments.layer_freezing import FreezingPlan, plot_freezing, run_freezing, write_freezing
from fl_algorithms.experiments.parallel import pending
from fl_algorithms.tasks.formulation import TASKS, PartitionSpec
from fl_algorithms.training.memo import FirstRunMemo
from nlp_models._offline import ensure_offline
from nlp_models.cpu import set_torch_threads
from nlp_models.data.partition import Partition
from nlp_models.data.partition_stats import partition_summary, plot_partitions, summary_line

WHOLE_TASKS = whole_layer_tasks()
"""The formulations whose clients can train whole top layers instead of adapters (`--whole-layers`)."""
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "fednlp_grid"
QUICK = dict(rounds=4, formulation=dict(clients=4, max_examples=320, min_client_examples=20, length_groups=4),
             # length_groups: each run of 4 training batches sorted by length (less padding: tagging's rounds
             # 25% and QA's 13% shorter on a 2-core CPU; docs/results/fednlp.md). Tweets are short: more examples there.
             # QA trains its top 2 encoder layers whole at lr 2e-3
             # (picked on validation F1 among 3e-4, 1e-3, 2e-3, 3e-3 over every question), as many cloze
             # questions as 10 minutes held on the faster 2-core host measured (960 of 1,231; an AVX2-only
             # host takes 637 s, docs/results/fednlp.md); the adapter reader ends under the first-entity baseline here
             per_task={"tagging": dict(max_examples=800),
                       "qa": dict(max_examples=960, tune="layers", adapter_layers=2, lr=2e-3)})
WHOLE_LR = 5e-5
"""Client lr when whole layers train (--whole-layers): FedNLP fine-tunes its transformers at 5e-5."""
FULL = dict(rounds=20, seeds=(0, 1, 2), partitions=("iid", "label:10", "label:1", "label:0.1", "quantity:1"),
            formulation=dict(clients=10, max_examples=None, min_client_examples=20))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="4 clients, 320 examples per task (tagging 800; QA 960, its top 2 layers trained whole), "
                        "4 rounds, iid, seed 0")
    p.add_argument("--tasks", type=comma_list(str, what="task", choices=TASKS), default=None)
    p.add_argument("--algorithms", type=comma_list(str, what="algorithm", choices=ALGORITHMS), default=None,
                   help="default fedavg,fedprox,fedopt")
    p.add_argument("--partitions", type=comma_list(str, what="partition"), default=None,
                   help="comma list of iid, label:ALPHA, quantity:BETA, cluster:ALPHA")
    p.add_argument("--protocols", type=comma_list(str, what="protocol", choices=[x for x in PROTOCOLS if x != "plain"]),
                   default=None, help="secure protocols (default secagg+); FedAvg also runs under a plaintext sum")
    p.add_argument("--seeds", type=comma_list(int, what="seed"), default=None)
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--clients", type=int, default=None)
    p.add_argument("--max-examples", type=int, default=None, help="corpus cap per task (0: all)")
    p.add_argument("--whole-layers", type=int, default=None, metavar="K",
                   help="classification, tagging and QA clients train the top K encoder layers whole (6: all "
                        "but the embeddings, as FedNLP fine-tunes whole models) instead of adapters in the top 2, "
                        "at client lr --whole-lr (AdamW's; SGD's stays the task's SGD lr, --sgd-lr, chosen for "
                        "adapters and, for QA, 2 whole layers); seq2seq's generator is unchanged")
    p.add_argument("--whole-lr", type=float, default=WHOLE_LR,
                   help=f"client AdamW lr with --whole-layers (default {WHOLE_LR:g}, FedNLP's fine-tuning lr)")
    p.add_argument("--fedopt-server-lr", type=float, default=AlgorithmSettings.fedavgm_lr, metavar="LR",
                   help=f"FedOPT's server SGD lr (default {AlgorithmSettings.fedavgm_lr:g} as FedNLP's scripts; "
                        "FedNLP's text states 1.0), momentum 0.9 either way; a new grid only")
    add_training_protocol_arg(p, default="fednlp")
    p.add_argument("--sgd-lr", type=task_lrs, default=None, metavar="TASK=LR[,TASK=LR]",
                   help="SGD's client lr (FedAvg's and FedProx's clients under the fednlp protocol) of the tasks "
                        "named, e.g. tagging=1,qa=0.3; the others keep the lr chosen on validation "
                        f"({', '.join(f'{t} {lr:g}' for t, lr in selected_sgd_lrs().items()) or 'none yet'}), "
                        "else their one lr. AdamW's (FedOPT's) lr is unchanged; saved with the plan, a new grid only")
    add_run_args(p, resume_help=", except --tasks/--algorithms/--partitions/--protocols/--seeds, which grow it")
    p.add_argument("--freezing", type=comma_list(int, what="frozen layer count"), default=None, metavar="K,K,..",
                   help="run FedNLP's layer-freezing study instead of the grid: BBC topics with the embeddings and "
                        "the bottom K layers frozen, the rest trained whole, centralised and FedOPT (e.g. 0,2,4,5)")
    p.add_argument("--freezing-lr", type=float, default=FreezingPlan.lr, help="client lr when whole layers train")
    p.add_argument("--freezing-algorithm", choices=ALGORITHMS, default=None,
                   help="federated algorithm of the freezing study (default: fedopt as FedNLP; fedavg with --quick, "
                        "since FedOPT at FedNLP's scripts' server lr 0.1 has moved less than one FedAvg round after 4 rounds)")
    p.add_argument("--report", action="store_true",
                   help="with --resume: write the tables, plots and result lines from the finished runs only, "
                        "running none (a grid still under way elsewhere, or stopped early); lists what is missing")
    return p


def task_lrs(text: str) -> dict[str, float]:
    """An argparse type: `TASK=LR[,TASK=LR]`, each task known and named once, each lr a positive finite number."""
    out: dict[str, float] = {}
    for item in (t.strip() for t in text.split(",")):
        task, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not task or not value:
            raise argparse.ArgumentTypeError(f"expected TASK=LR[,TASK=LR] (e.g. tagging=1,qa=0.3), got {text!r}")
        if task not in TASKS:
            raise argparse.ArgumentTypeError(f"unknown task {task!r} in {text!r}; choose from {', '.join(TASKS)}")
        if task in out:
            raise argparse.ArgumentTypeError(f"task {task!r} named twice in {text!r}")
        try:
            lr = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {value!r} (the lr of {task})") from None
        if not (math.isfinite(lr) and lr > 0):
            raise argparse.ArgumentTypeError(f"the lr of {task} must be a positive finite number, got {value!r}")
        out[task] = lr
    return out


def build_plan(args: argparse.Namespace, parser: argparse.ArgumentParser) -> GridPlan:
    base: dict[str, Any] = dict(QUICK if args.quick else FULL)
    formulation = dict(base.pop("formulation"))
    per_task = {task: dict(values) for task, values in base.pop("per_task", {}).items()}
    for key, value in (("clients", args.clients), ("max_examples", args.max_examples)):
        if value is not None:
            formulation[key] = value or None
            for values in per_task.values():  # a value given on the command line holds for every task
                values.pop(key, None)
    if args.whole_layers is not None:
        if args.whole_layers < 1 or not args.whole_lr > 0:
            parser.error("--whole-layers must be at least 1 and --whole-lr positive")
        for task in WHOLE_TASKS:
            per_task[task] = {**per_task.get(task, {}), "tune": "layers", "adapter_layers": args.whole_layers,
                              "lr": args.whole_lr}
    elif "whole_lr" in getattr(args, "given", ()):
        parser.error("--whole-lr is the client lr of --whole-layers; give both")
    chosen = {k: v for k, v in (("tasks", args.tasks), ("algorithms", args.algorithms),
                                ("partitions", args.partitions), ("protocols", args.protocols),
                                ("seeds", args.seeds), ("rounds", args.rounds)) if v is not None}
    try:
        for text in chosen.get("partitions", ()):
            PartitionSpec.parse(text)
        return GridPlan(**{**base, **chosen, "formulation": formulation, "per_task": per_task},
                        algorithm=AlgorithmSettings(fedavgm_lr=args.fedopt_server_lr),
                        training_protocol=args.training_protocol,
                        sgd_lrs={**selected_sgd_lrs(), **(args.sgd_lr or {})})
    except ValueError as error:
        parser.error(str(error))


def widen_saved_plan(parser: argparse.ArgumentParser, args: argparse.Namespace, run: Path, plan: GridPlan) -> GridPlan:
    """`--resume RUN_DIR` with --tasks/--algorithms/--partitions/--protocols/--seeds grows the saved plan
    by those values (saved to RUN_DIR/plan.json; finished cells are kept), so a grid can be finished
    in parts, e.g. FedProx or another partition added to cells already run (options that would change a
    finished cell's meaning, such as --rounds, `open_run` has refused)."""
    lists = {name: getattr(args, name) for name in WIDENABLE if getattr(args, name) is not None}
    try:
        for text in lists.get("partitions", ()):
            PartitionSpec.parse(text)
        wider = plan.widened(**lists)
    except ValueError as error:
        parser.error(f"--resume {run}: {error}")
    if wider != plan:
        (run / "plan.json").write_text(json.dumps(plan_record(wider), indent=2))
        print(f"plan widened: {len(plan.cells())} -> {len(wider.cells())} runs", flush=True)
    return wider


def secure_vs_plain(secure: Sequence[np.ndarray], plain: Sequence[np.ndarray], *, initial: np.ndarray,
                    bound: float) -> dict[str, Any]:
    """Largest parameter difference between FedAvg under the secure protocol and under a plaintext
    sum after each round, and at the end. Both runs start at `initial` and train on the same batches,
    so round 1 differs only by the fixed-point encoding (at most `bound` per coordinate of the mean
    update); later rounds train from slightly different models, and the difference can grow by local
    training, not by the secure sum."""
    diffs = [float(np.max(np.abs(s - p))) for s, p in zip(secure, plain)]
    # the models hold float32: the mean update is rounded to float32 and so is its sum with the old
    # parameters, so round 1 is within the bound when no coordinate differs by more than the bound
    # plus one float32 step of the update and one of the result
    first_secure, first_plain = secure[0], plain[0]
    steps = (np.spacing(np.abs(first_plain - initial).astype(np.float32)).astype(np.float64)
             + np.spacing(np.maximum(np.abs(first_secure), np.abs(first_plain)).astype(np.float32)).astype(np.float64))
    within = bool(np.all(np.abs(first_secure - first_plain) <= bound + steps))
    return {"secure_vs_plain_round_diffs": diffs, "secure_vs_plain_max_diff": diffs[-1], "encoder_bound": bound,
            "round1_within_bound": within}


def freezing_main(args: argparse.Namespace, parser: argparse.ArgumentParser, *, device: str) -> dict[str, Any]:
    """FedNLP's layer-freezing study; prints one `fednlp_freezing ...` line per variant."""
    quick = QUICK if args.quick else FULL
    try:
        plan = FreezingPlan(frozen=tuple(args.freezing), rounds=args.rounds or quick["rounds"],
                            clients=args.clients or quick["formulation"]["clients"],
                            max_examples=(args.max_examples or None) if args.max_examples is not None
                            else quick["formulation"]["max_examples"],
                            protocol=(args.protocols or ("secagg+",))[0], lr=args.freezing_lr,
                            algorithm=args.freezing_algorithm or ("fedavg" if args.quick else "fedopt"),
                            seed=(args.seeds or (0,))[0], training_protocol=args.training_protocol)
    except ValueError as error:
        parser.error(str(error))
    run = (Path(args.out) if args.out else DEFAULT_OUT) / (args.run_name or time.strftime("freezing-%Y%m%d-%H%M%S"))
    if run.exists():
        parser.error(f"{run} exists: choose another --run-name")
    run.mkdir(parents=True)
    threads = set_torch_threads(args.threads)
    print(f"run directory: {run}  (device {device}, torch threads {threads})", flush=True)
    rows_path = run / "freezing.jsonl"

    def keep(row: dict[str, Any]) -> None:
        append_cell(rows_path, row)
        print(f"{row['variant']}: central {row['central']:.4f}, {plan.algorithm} {row['federated']:.4f}, "
              f"{row['trainable']:,} trainable, {row['seconds']:.0f} s", flush=True)

    try:
        rows = run_freezing(plan, backbone=args.backbone, device=device, progress=not args.no_progress, on_row=keep)
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None
    write_freezing(rows, csv_path=run / "freezing.csv", md_path=run / "freezing.md")
    plot_freezing(rows, path=run / "freezing.png", federated=f"{plan.algorithm}, {plan.protocol}")
    print(f"\n{(run / 'freezing.md').read_text()}\nwrote {run / 'freezing.csv'}, {run / 'freezing.png'}")
    lines = [f"fednlp_freezing variant={r['variant']} frozen={'none' if r['frozen'] is None else r['frozen']} "
             f"trainable={r['trainable']} central={r['central']:.4f} {plan.algorithm}={r['federated']:.4f} "
             f"secure_sum_s_per_round={r['secure_seconds_per_round']:.3f}" for r in rows]
    print("\n".join(lines), flush=True)
    return {"run": run, "rows": rows, "lines": lines}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ensure_offline()
    parser = _parser()
    args, device = parse_grid_args(parser, argv)
    if args.report and (not args.resume or args.workers > 1 or args.worker or args.freezing is not None):
        parser.error("--report writes a resumed grid's tables from its finished runs: give --resume RUN_DIR, "
                     "without --workers or --freezing")
    if args.freezing is not None:
        if "fedopt_server_lr" in getattr(args, "given", ()):
            parser.error("--fedopt-server-lr sets the grid's FedOPT; the freezing study's FedOPT keeps FedNLP's scripts' 0.1")
        if "sgd_lr" in getattr(args, "given", ()):
            parser.error("--sgd-lr sets the grid's SGD clients; the freezing study trains at --freezing-lr")
        if args.workers > 1 or args.worker:
            parser.error("--workers runs the grid's cells; the freezing study runs in one process")
        return freezing_main(args, parser, device=device)
    run, plan = open_run(parser, args, default_out=DEFAULT_OUT, build=lambda: build_plan(args, parser),
                         load=plan_from_record, record=plan_record, growable=WIDENABLE)
    if args.resume:
        plan = widen_saved_plan(parser, args, run, plan)
    set_torch_threads(args.threads)
    t0 = time.perf_counter()
    cells_path = run / "cells.jsonl"
    done = read_cells(cells_path, key=cell_key)
    others = sorted({str(r.get("backbone", "minilm")) for r in done.values()} - {args.backbone})
    if others:  # cells written before the field all ran on MiniLM, the only backbone of a real grid
        parser.error(f"--resume {run}: its finished runs used --backbone {', '.join(others)}, "
                     f"not {args.backbone}; give the same --backbone")
    trajectories: dict[tuple[str, str], list[np.ndarray]] = {}  # secure FedAvg's parameters per round
    # one (task, partition, seed)'s clients at a time, with the memo through which FedAvg, its twin and FedOPT
    # share each client's first local run (a memo serves one set of clients only)
    clients_cache: dict[tuple, tuple[Any, FirstRunMemo]] = {}
    print(f"run directory: {run}  (device {device}, torch threads {args.threads}, {len(plan.cells())} runs, "
          f"{len(done)} already done)", flush=True)
    for task in plan.tasks:  # the declared protocol of every algorithm, at each task's client lr
        settings = plan.settings(task, partition=partition_for(task, plan.partitions[0]), seed=plan.seeds[0])
        print("\n".join(f"{task}: {line}" for line in protocol_lines(
            {a: plan.protocol_for(a, settings) for a in plan.algorithms})), flush=True)
    if not args.report:
        done = start_workers(args, run, script=__file__, device=device, cells=plan.cells(), cells_path=cells_path,
                             key=cell_key, forward=["--backbone", args.backbone])
    # a task's clients, and FedAvg's secure run with its plaintext twin, stay in one worker; a secure
    # FedAvg run whose twin was cut off reruns with it (the check needs both in one process)
    rerun = untwinned(plan, done)
    todo = [] if args.report else pending(plan.cells(), {k: v for k, v in done.items() if k not in rerun},
                                          key=cell_key, run=run if args.worker else None,
                                          unit=lambda c: f"{c['task']} {c['partition']} seed {c['seed']}")
    for cell in todo:
        key = cell_key(cell)
        ident = (cell["task"], cell["partition"], cell["seed"])
        if ident not in clients_cache:
            clients_cache.clear()  # one task's clients in memory at a time
            settings = plan.settings(cell["task"], partition=cell["partition"], seed=cell["seed"])
            try:
                loaded = load_formulation(cell["task"], settings, backbone=args.backbone, device=device)
                loaded.partition  # noqa: B018 - loads and partitions, or raises
            except ValueError as error:
                raise SystemExit(f"error: {cell['task']} {cell['partition']}: {error}") from None
            clients_cache[ident] = (loaded, FirstRunMemo())
        clients, first_runs = clients_cache[ident]
        tracked = cell["seed"] == plan.seeds[0] and cell["algorithm"] == "fedavg"
        trajectory: list[np.ndarray] = []
        summary, _ = run_cell(cell, clients, plan, progress=not args.no_progress,
                              round_parameters=trajectory if tracked else None, first_runs=first_runs)
        if tracked and cell["protocol"] == plan.protocols[0]:
            trajectories[cell["task"], cell["partition"]] = trajectory
        if tracked and cell["protocol"] == "plain" and (cell["task"], cell["partition"]) in trajectories:
            summary.update(secure_vs_plain(trajectories.pop((cell["task"], cell["partition"])), trajectory,
                                           initial=flat_vector(clients.initial()),
                                           bound=encoder_bound(plan, clients, plan.protocols[0])))
            summary["partition_record"] = clients.partition.record()  # for partitions.md/.png, whoever writes them
        summary["backbone"] = args.backbone  # not part of the plan: --resume checks it against the finished runs
        append_cell(cells_path, summary)
        done[key] = summary
        restored = (f" ({summary['reused_train_seconds']:.1f} s of first client runs restored, counted)"
                    if summary.get("reused_train_seconds") else "")
        print(f"{key}: {summary['metric']}={summary['score']:.4f} (trivial {summary['trivial']:.4f}), "
              f"{summary['round_seconds']:.1f} s/round{restored}, secure {summary['secure_seconds_per_round']:.2f} s/round",
              flush=True)
    if args.worker:
        return {"run": run, "worker": True}
    rows = [done[cell_key(c)] for c in plan.cells() if cell_key(c) in done]  # in plan order
    missing = sorted({f"{c['task']} {c['partition']} seed {c['seed']}" for c in plan.cells() if cell_key(c) not in done})
    if not rows:
        raise SystemExit(f"error: no finished runs in {run} yet")
    if missing:
        more = f"; and {len(missing) - 12} more" if len(missing) > 12 else ""
        print(f"partial grid: {len(rows)} of {len(plan.cells())} runs finished; not yet (task partition seed): "
              f"{'; '.join(missing[:12])}{more}", flush=True)
    partition_sets = {f"{r['task']} {r['partition']}": Partition.from_record(r["partition_record"])
                      for r in rows if "partition_record" in r}
    partitions_md = [f"- {name}: {summary_line(partition_summary(p))}" for name, p in partition_sets.items()]
    table = aggregate(rows)
    write_table(table, csv_path=run / "grid.csv", md_path=run / "grid.md")
    paired = {title: found for title, value in (("mean over clients (score)", "score"),
                                                ("pooled over all test examples (pooled_score)", "pooled_score"))
              if (found := paired_comparisons(rows, protocol=plan.protocols[0], value=value))}
    if paired:
        write_paired(paired, md_path=run / "paired.md")
    plot_curves(rows, path=run / "curves.png")
    if len({r["partition"] for r in rows}) > 1:
        plot_partition_curves(rows, path=run / "partition_curves.png", protocol=plan.protocols[0])
    if partition_sets:
        (run / "partitions.md").write_text("\n".join(partitions_md) + "\n")
        plot_partitions(partition_sets, path=run / "partitions.png")
    print(f"\n{(run / 'grid.md').read_text()}")
    if paired:
        print(f"paired by seed ({plan.protocols[0]}):\n{(run / 'paired.md').read_text()}")
    print(f"wrote {run / 'grid.csv'}, {run / 'curves.png'}; {time.perf_counter() - t0:.0f} s")
    lines = []
    for task in plan.tasks:
        partition, protocol = partition_for(task, plan.partitions[0]), plan.protocols[0]
        picked = {r["algorithm"]: r for r in table if r["task"] == task and r["partition"] == partition
                  and r["protocol"] == protocol}
        twin = next((r for r in rows if r["task"] == task and r["partition"] == partition and r["protocol"] == "plain"
                     and r["seed"] == plan.seeds[0] and "secure_vs_plain_max_diff" in r), None)
        trivial = f"{next(iter(picked.values()))['trivial']:.4f}" if picked else "n/a"
        parts = [f"fednlp task={task} metric={METRIC_NAMES[task]}", f"trivial={trivial}"]
        parts += [f"{a}={picked[a]['mean']:.4f}" if a in picked else f"{a}=n/a" for a in plan.algorithms]
        if twin:
            parts += [f"secure_vs_plain_max_diff={twin['secure_vs_plain_max_diff']:.3g}",
                      f"round1_diff={twin['secure_vs_plain_round_diffs'][0]:.3g}",
                      f"encoder_bound={twin['encoder_bound']:.3g}",
                      f"round1_within_bound={str(twin['round1_within_bound']).lower()}",
                      f"plain_round_s={twin['round_seconds']:.2f}"]
        else:
            parts.append("secure_vs_plain_max_diff=n/a")
        if "fedavg" in picked:
            parts.append(f"secure_sum_s_per_round={picked['fedavg']['secure_seconds_per_round']:.3f}")
        parts.append(f"protocol={plan.training_protocol}")
        lines.append(" ".join(parts))
    from fl_algorithms.experiments.rundir import RunDirectory

    # the grid's tables and lines with the command, device and date that made them (publishable)
    RunDirectory(run).write_results({"experiment": "fednlp-benchmark", "table": table, "lines": lines,
                                     "missing": missing})
    print("\n".join(lines), flush=True)
    return {"run": run, "rows": rows, "table": table, "lines": lines}


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
