"""AdaFedSelectKD (Feng et al.): federated multi-domain summarisation with adapters and selective
distillation, against AdaFedKD, AdaFedAvg, AdaCentralized and Local; every federated upload through
secure aggregation (SecAgg+ by default).

    python examples/adafedselectkd.py --quick     # non-IID, seed 0, 5 rounds, 30% of the data: < 10 min on 2 cores
    python examples/adafedselectkd.py             # four settings x 3 seeds, 10 rounds, all data (a GPU-sized run)
    python examples/adafedselectkd.py --resume results/adafedselectkd/<run>   # finish an interrupted grid

Stand-ins (fl_algorithms.tasks.summarization): the summariser is a BERT2BERT generator from the
offline MiniLM pre-trained on BBC sports/entertainment headlines and then frozen (cached under
results/adafedselectkd/cache); the domains are BBC business, politics and tech ("headline from body");
the extreme setting's fourth client is tweets -> their entity mentions. Adapters: ReLU Houlsby
bottlenecks in the top decoder layer; A_l is each client's summariser, A_g the server's parameters.

Writes results/adafedselectkd/<run>/: cells.jsonl (one line per finished cell), summary.csv and
summary.md (ROUGE-1/2/L x 100, mean ± std over seeds, and per client), curves.png. The last line is
    summ setting=non_iid adafedselectkd=.. adafedkd=.. adafedavg=.. adacentralized=.. local=.. kd_token_share=..
with the first setting's ROUGE-L (mean over clients, then over seeds; in [0, 1]) and the share of target
tokens whose KL term counted under AdaFedSelectKD.
"""
from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any


from fl_algorithms.experiments.cli import add_run_args, comma_list, start_grid
from fl_algorithms.experiments.summarization_grid import (METHODS, PROTOCOLS, SummaryPlan, aggregate, cell_key,
                                                          plot_curves, run_summary_cell, write_table)
from fl_algorithms.tasks.summarization import SETTINGS, SummarySettings
from nlp_models._offline import ensure_offline

RESULTS = Path(__file__).resolve().parents[1] / "results" / "adafedselectkd"
QUICK = dict(settings=("non_iid",), seeds=(0,), rounds=5, data=SummarySettings(fraction=0.3))
FULL = dict(settings=SETTINGS, seeds=(0, 1, 2), rounds=10, data=SummarySettings())


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="non_iid, seed 0, 5 rounds, 30%% of each domain")
    p.add_argument("--settings", type=comma_list(str, what="setting", choices=SETTINGS), default=None)
    p.add_argument("--methods", type=comma_list(str, what="method", choices=METHODS), default=None)
    p.add_argument("--seeds", type=comma_list(int, what="seed"), default=None)
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--fraction", type=float, default=None, help="share of each domain's articles (default 1; quick 0.3)")
    p.add_argument("--lr", type=float, default=None, help=f"client AdamW lr (default {SummarySettings.lr})")
    p.add_argument("--protocol", choices=PROTOCOLS, default="secagg+")
    add_run_args(p, cache_help=f"pre-trained generator cache (default {RESULTS / 'cache'})")
    return p


def build_plan(args: argparse.Namespace, parser: argparse.ArgumentParser) -> SummaryPlan:
    base: dict[str, Any] = dict(QUICK if args.quick else FULL)
    data = base.pop("data")
    changes = {k: v for k, v in (("fraction", args.fraction), ("lr", args.lr)) if v is not None}
    chosen = {k: v for k, v in (("settings", args.settings), ("methods", args.methods), ("seeds", args.seeds),
                                ("rounds", args.rounds)) if v is not None}
    try:
        return SummaryPlan(**{**base, **chosen, "protocol": args.protocol,
                              "data": dataclasses.replace(data, **changes)})
    except ValueError as error:
        parser.error(str(error))


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ensure_offline()
    parser = _parser()
    grid = start_grid(parser, argv, script=__file__, default_out=RESULTS, build=lambda args: build_plan(args, parser),
                      load=SummaryPlan.from_record, record=SummaryPlan.record, key=cell_key, forward=("backbone", "cache"))
    plan, args = grid.plan, grid.args
    cache = Path(args.cache) if args.cache else RESULTS / "cache"
    clients = None
    for cell in grid.todo():
        if clients is None or (clients.settings.setting, clients.settings.seed) != (cell["setting"], cell["seed"]):
            clients = plan.clients_for(setting=cell["setting"], seed=cell["seed"], backbone=args.backbone,
                                       device=grid.device, cache_dir=cache, progress=not args.no_progress)
        row = grid.record(cell, lambda: run_summary_cell(cell, clients, plan, progress=not args.no_progress))
        share = f", KD tokens {row['kd_token_share']:.1%}" if "kd_token_share" in row else ""
        print(f"{cell_key(cell)}: ROUGE-1/2/L {row['rouge1']:.4f} / {row['rouge2']:.4f} / {row['rougeL']:.4f}"
              f"{share}, {row['seconds']:.0f} s", flush=True)
    if args.worker:
        return {"run": grid.run, "worker": True}
    rows = grid.summarise(write_table=write_table, plot=lambda rows, path: plot_curves(rows, path=path))
    first = plan.settings[0]
    table = {e["method"]: e for e in aggregate(rows) if e["setting"] == first}
    line = f"summ setting={first} " + " ".join(f"{m}={table[m]['rougeL']:.4f}" for m in plan.methods)
    if "adafedselectkd" in table:
        line += f" kd_token_share={table['adafedselectkd']['kd_token_share']:.4f}"
    print(line, flush=True)
    return {"run": grid.run, "rows": rows, "line": line}


if __name__ == "__main__":
    main()
