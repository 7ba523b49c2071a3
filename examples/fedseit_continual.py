"""FedSeIT with SIT (Chaudhary et al.) against FedWeIT, FedAvg on B and Local continual learning:
federated continual text classification where B is securely aggregated, task descriptors are DP
releases and foreign adaptives travel sealed between clients.

    python examples/fedseit_continual.py --quick    # seed 0; FedSeIT K=3, FedWeIT, FedAvg(B), Local: < 10 min on 2 cores
    python examples/fedseit_continual.py            # 3 seeds; also FedSeIT K=5, random and no selection (a GPU-sized run)
    python examples/fedseit_continual.py --algorithms fedseit_k3,fedseit_all,fedweit   # SIT against no selection
    python examples/fedseit_continual.py --resume results/fedseit/<run>   # finish an interrupted grid

Stand-ins (fl_algorithms.tasks.continual): 3 clients, each a seeded sequence of 5 binary tasks from a
pool of 10 (BBC topic pairs, Rotten Tomatoes polarity and subjectivity, debates party, tweets with a
person / geo-location); MiniLM's token embeddings replace GloVe as the CNN's frozen word vectors.

Methods (`--algorithms`; `--methods` is its older name): fedseit_k3, fedseit_k5 (SIT), fedseit_random (the ablation), fedseit_all (FedSeIT
without SIT: every foreign adaptive, unranked; no descriptors), fedweit, fedavg_b, local.

Clients train under one declared protocol (`fedseit_protocol`, docs/protocols.md): Adam lr 1e-3 built
afresh at every local run (each task and round), constant lr, no clipping, 2 local epochs, evaluated
after aggregation (Local: its own model), the last round of each task. Printed in the header and
written to config.toml and results.json (per method, `TrainingProtocol.to_dict()`).

Writes results/fedseit/<run>/: plan.json and config.toml (the plan and every method's training
protocol), cells.jsonl (one line per finished cell, with every client's accuracy matrix, the SIT
selections and the bytes each client sent and received), ledgers/<seed>-<method>.json (the server's
privacy ledger: every descriptor charge with its mechanism), summary.csv, summary.md (with the paired
differences by seed and their 95% t-intervals), results.json (config, per-seed per-method values under
summary.cells, the aggregated table under summary.methods, summary.paired) and curves.png. The last line is
    fcl fedseit_acc=.. fedweit_acc=.. fedavg_acc=.. local_acc=.. fedseit_forgetting=.. fedweit_forgetting=.. descriptor_epsilon=.. fedseit_all_acc=.. fedseit_all_forgetting=..
(final average accuracy and forgetting in [0, 1], mean over clients and seeds; FedSeIT with K=3;
descriptor_epsilon: the largest per-client example-level epsilon on the server's ledger, delta 1e-5;
fedseit_all: FedSeIT without SIT; nan for a method the run did not include).
"""
from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

# heavy modules (torch, transformers) are imported in main(), after the command line is parsed
from fl_algorithms.choices import CONTINUAL_METHODS as METHODS, SECURE_PROTOCOLS
from fl_algorithms.experiments.cli import protocol_lines, start_grid
from fl_algorithms.experiments.flags import add_common_flags
from nlp_models._offline import ensure_offline

if TYPE_CHECKING:
    from fl_algorithms.experiments.continual_grid import ContinualPlan

RESULTS = Path(__file__).resolve().parents[1] / "results" / "fedseit"
QUICK = dict(seeds=(0,), methods=("fedseit_k3", "fedweit", "fedavg_b", "local"))
FULL = dict(seeds=(0, 1, 2), methods=METHODS)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_flags(p, quick="seed 0; FedSeIT K=3, FedWeIT, FedAvg on B, Local", algorithms=METHODS,
                     default_algorithms=METHODS, algorithm_word="method", seeds="0,1,2; --quick 0",
                     protocols=SECURE_PROTOCOLS, protocol_default="secagg+", grid=True, report=True)
    p.add_argument("--rounds-per-task", type=int, default=None,
                   help="federated rounds on each task of a client's sequence (default 3; at least 2)")
    p.add_argument("--local-epochs", type=int, default=None, help="local epochs per round (default 2)")
    p.add_argument("--max-train", type=int, default=None, help="training documents per client and task (a DP "
                   "descriptor needs about 90: with fewer, SIT's releases are refused and it selects nothing)")
    p.add_argument("--max-test", type=int, default=None, help="test documents per client and task (default 150)")
    p.add_argument("--descriptor-epsilon", type=float, default=None, help="epsilon of one task descriptor")
    p.add_argument("--mu", type=float, default=None, help="FedProx proximal weight on B (default 0: FedAvg)")
    p.add_argument("--projection", action="store_true", help="FedSeIT's W_f over the foreign features (paper Eq. 3)")
    return p


def build_plan(args: argparse.Namespace, parser: argparse.ArgumentParser) -> ContinualPlan:
    from fl_algorithms.experiments.continual_grid import ContinualPlan

    base: dict[str, Any] = dict(QUICK if args.quick else FULL)
    defaults = ContinualPlan()
    data, descriptor = base.pop("data", defaults.data), base.pop("descriptor", defaults.descriptor)
    chosen = {k: v for k, v in (("methods", args.algorithms), ("seeds", args.seeds),
                                ("rounds_per_task", args.rounds_per_task), ("local_epochs", args.local_epochs),
                                ("mu", args.mu))
              if v is not None}
    try:
        if args.max_train is not None:
            data = dataclasses.replace(data, max_train=args.max_train)
        if args.max_test is not None:
            data = dataclasses.replace(data, max_test=args.max_test)
        if args.descriptor_epsilon is not None:
            descriptor = dataclasses.replace(descriptor, epsilon=args.descriptor_epsilon)
        if args.projection:
            base["projection"] = True
        return ContinualPlan(**{**base, **chosen, "protocol": args.protocol, "data": data, "descriptor": descriptor})
    except ValueError as error:
        parser.error(str(error))


def recorded_config(plan: ContinualPlan) -> dict[str, Any]:
    """What config.toml and results.json record: the plan and every method's declared training protocol."""
    return {"plan": plan.record(), "training_protocol": {m: p.to_dict() for m, p in plan.training_protocols().items()}}


PER_CELL = ("accuracy", "forgetting", "descriptor_epsilon", "seconds")
"""With `continual_grid.COST_KEYS` after them, the per-seed, per-method values results.json keeps under
summary.cells[method][seed]."""


def announce(plan: ContinualPlan) -> ContinualPlan:
    """Print every method's declared training protocol (the run's header; each --workers process's log too)."""
    print("\n".join(protocol_lines(plan.training_protocols())), flush=True)
    return plan


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ensure_offline()
    parser = _parser()
    parser.parse_args(argv)  # --help and a bad option answer here, before the heavy imports
    from fl_algorithms.experiments.continual_grid import (COST_KEYS, ContinualClients, ContinualPlan, aggregate,
                                                          cell_key, paired_differences, plot_curves, run_continual_cell,
                                                          write_table)
    from fl_algorithms.experiments.results import write_results
    from fl_algorithms.experiments.rundir import CONFIG, RunDirectory
    from fl_algorithms.tasks.continual import task_statistics

    grid = start_grid(parser, argv, script=__file__, default_out=RESULTS,
                      build=lambda args: announce(build_plan(args, parser)),
                      load=lambda raw: announce(ContinualPlan.from_record(raw)), record=ContinualPlan.record,
                      key=cell_key)
    plan = grid.plan
    if not grid.args.worker and not (grid.run / CONFIG).is_file():   # once per run, by the one process that
        RunDirectory(grid.run).write_config(recorded_config(plan))     # writes the tables (--workers: after them)
    clients = None
    for cell in grid.todo():
        if clients is None or clients.settings.seed != cell["seed"]:
            clients = ContinualClients(dataclasses.replace(plan.data, seed=cell["seed"]), backbone=grid.args.backbone,
                                       device=grid.device)
            for row in task_statistics(clients.tasks):
                print(f"  seed {cell['seed']} client {row['client']} task {row['position']}: {row['task']} "
                      f"({row['train']} train, {row['test']} test)", flush=True)
        row = grid.record(cell, lambda: run_continual_cell(cell, clients, plan, progress=not grid.args.no_progress,
                                                           ledger_dir=grid.run / "ledgers"))
        print(f"{cell_key(cell)}: final accuracy {row['accuracy']:.4f}, forgetting {row['forgetting']:.4f}, "
              f"{row['seconds']:.0f} s", flush=True)
    if grid.args.worker:
        return {"run": grid.run, "worker": True}
    rows = grid.summarise(write_table=write_table,
                          plot=lambda rows, path: plot_curves(rows, path=path, schedule=plan.schedule))
    table = {e["method"]: e for e in aggregate(rows)}

    def value(method: str, key: str) -> str:
        return f"{table[method][key]:.4f}" if method in table else "nan"

    cells: dict[str, dict[str, dict[str, Any]]] = {}
    for row in rows:
        cells.setdefault(row["method"], {})[str(row["seed"])] = {k: row.get(k) for k in (*PER_CELL, *COST_KEYS)}
    write_results(grid.run / "results.json", config=recorded_config(plan), runs={},
                  summary={"methods": table, "cells": cells, "paired": paired_differences(rows),
                           "training_protocol": {m: row["training_protocol"] for m, row in
                                                 {r["method"]: r for r in rows if "training_protocol" in r}.items()},
                           "wall_seconds": time.perf_counter() - grid.started})
    line = (f"fcl fedseit_acc={value('fedseit_k3', 'accuracy')} fedweit_acc={value('fedweit', 'accuracy')} "
            f"fedavg_acc={value('fedavg_b', 'accuracy')} local_acc={value('local', 'accuracy')} "
            f"fedseit_forgetting={value('fedseit_k3', 'forgetting')} fedweit_forgetting={value('fedweit', 'forgetting')} "
            f"descriptor_epsilon={value('fedseit_k3', 'descriptor_epsilon')} "
            f"fedseit_all_acc={value('fedseit_all', 'accuracy')} fedseit_all_forgetting={value('fedseit_all', 'forgetting')}")
    print(line, flush=True)
    return {"run": grid.run, "rows": rows, "line": line}


if __name__ == "__main__":
    main()
