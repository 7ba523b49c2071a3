"""FedSeIT with SIT (Chaudhary et al.) against FedWeIT, FedAvg on B and Local continual learning:
federated continual text classification where B is securely aggregated, task descriptors are DP
releases and foreign adaptives travel sealed between clients.

    python examples/fedseit_continual.py --quick    # seed 0; FedSeIT K=3, FedWeIT, FedAvg(B), Local: < 10 min on 2 cores
    python examples/fedseit_continual.py            # 3 seeds; also FedSeIT K=5 and random selection (a GPU-sized run)
    python examples/fedseit_continual.py --resume results/fedseit/<run>   # finish an interrupted grid

Stand-ins (fl_algorithms.tasks.continual): 3 clients, each a seeded sequence of 5 binary tasks from a
pool of 10 (BBC topic pairs, Rotten Tomatoes polarity and subjectivity, debates party, tweets with a
person / geo-location); MiniLM's token embeddings replace GloVe as the CNN's frozen word vectors.

Writes results/fedseit/<run>/: cells.jsonl (one line per finished cell, with every client's accuracy
matrix and the SIT selections), ledgers/<seed>-<method>.json (the server's privacy ledger: every
descriptor charge with its mechanism), summary.csv, summary.md and curves.png. The last line is
    fcl fedseit_acc=.. fedweit_acc=.. fedavg_acc=.. local_acc=.. fedseit_forgetting=.. fedweit_forgetting=.. descriptor_epsilon=..
(final average accuracy and forgetting in [0, 1], mean over clients and seeds; FedSeIT with K=3;
descriptor_epsilon: the largest per-client example-level epsilon on the server's ledger, delta 1e-5).
"""
from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any


from fl_algorithms.experiments.cli import add_run_args, comma_list, start_grid
from fl_algorithms.experiments.continual_grid import (METHODS, PROTOCOLS, ContinualClients, ContinualPlan, aggregate,
                                                      cell_key, plot_curves, run_continual_cell, write_table)
from fl_algorithms.tasks.continual import task_statistics
from nlp_models._offline import ensure_offline

RESULTS = Path(__file__).resolve().parents[1] / "results" / "fedseit"
QUICK = dict(seeds=(0,), methods=("fedseit_k3", "fedweit", "fedavg_b", "local"))
FULL = dict(seeds=(0, 1, 2), methods=METHODS)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="seed 0; FedSeIT K=3, FedWeIT, FedAvg on B, Local")
    p.add_argument("--methods", type=comma_list(str, what="method", choices=METHODS), default=None)
    p.add_argument("--seeds", type=comma_list(int, what="seed"), default=None)
    p.add_argument("--rounds-per-task", type=int, default=None)
    p.add_argument("--local-epochs", type=int, default=None)
    p.add_argument("--max-train", type=int, default=None, help="training documents per client and task")
    p.add_argument("--descriptor-epsilon", type=float, default=None, help="epsilon of one task descriptor")
    p.add_argument("--mu", type=float, default=None, help="FedProx proximal weight on B (default 0: FedAvg)")
    p.add_argument("--projection", action="store_true", help="FedSeIT's W_f over the foreign features (paper Eq. 3)")
    p.add_argument("--protocol", choices=PROTOCOLS, default="secagg+")
    add_run_args(p)
    return p


def build_plan(args: argparse.Namespace, parser: argparse.ArgumentParser) -> ContinualPlan:
    base: dict[str, Any] = dict(QUICK if args.quick else FULL)
    defaults = ContinualPlan()
    data, descriptor = base.pop("data", defaults.data), base.pop("descriptor", defaults.descriptor)
    chosen = {k: v for k, v in (("methods", args.methods), ("seeds", args.seeds),
                                ("rounds_per_task", args.rounds_per_task), ("local_epochs", args.local_epochs),
                                ("mu", args.mu))
              if v is not None}
    try:
        if args.max_train is not None:
            data = dataclasses.replace(data, max_train=args.max_train)
        if args.descriptor_epsilon is not None:
            descriptor = dataclasses.replace(descriptor, epsilon=args.descriptor_epsilon)
        if args.projection:
            base["projection"] = True
        return ContinualPlan(**{**base, **chosen, "protocol": args.protocol, "data": data, "descriptor": descriptor})
    except ValueError as error:
        parser.error(str(error))


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ensure_offline()
    parser = _parser()
    grid = start_grid(parser, argv, script=__file__, default_out=RESULTS, build=lambda args: build_plan(args, parser),
                      load=ContinualPlan.from_record, record=ContinualPlan.record, key=cell_key)
    plan = grid.plan
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

    line = (f"fcl fedseit_acc={value('fedseit_k3', 'accuracy')} fedweit_acc={value('fedweit', 'accuracy')} "
            f"fedavg_acc={value('fedavg_b', 'accuracy')} local_acc={value('local', 'accuracy')} "
            f"fedseit_forgetting={value('fedseit_k3', 'forgetting')} fedweit_forgetting={value('fedweit', 'forgetting')} "
            f"descriptor_epsilon={value('fedseit_k3', 'descriptor_epsilon')}")
    print(line, flush=True)
    return {"run": grid.run, "rows": rows, "line": line}


if __name__ == "__main__":
    main()
