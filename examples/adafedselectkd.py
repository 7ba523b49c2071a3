"""AdaFedSelectKD (Feng et al.): federated multi-domain summarisation with adapters and selective
distillation, against AdaFedKD, AdaFedAvg, AdaCentralized and Local; every federated upload through
secure aggregation (SecAgg+ by default).

    python examples/adafedselectkd.py --quick     # non-IID, seed 0, 5 rounds, 30% of the data: < 10 min on 2 cores
    python examples/adafedselectkd.py             # four settings x 3 seeds, 10 rounds, all data (a GPU-sized run)
    python examples/adafedselectkd.py --resume results/adafedselectkd/<run>   # finish an interrupted grid
    python examples/adafedselectkd.py --quick --training-protocol kept-adamw   # how runs before 2026-11-29 trained

Stand-ins (fl_algorithms.tasks.summarization): the summariser is a BERT2BERT generator from the
offline MiniLM pre-trained on BBC sports/entertainment headlines and then frozen (cached under
results/adafedselectkd/cache); the domains are BBC business, politics and tech ("headline from body");
the extreme setting's fourth client is tweets -> their entity mentions. Adapters: ReLU Houlsby
bottlenecks in the top decoder layer; A_l is each client's summariser, A_g the server's parameters.

Training protocol (`--training-protocol`, docs/protocols.md; printed at the start, one line per method):
'adafedselectkd' (the default) is the paper's where it states one: AdamW, weight decay 0.01, batch 16
(Sec. IV-D; lr 3e-3, not 2e-4, see `SummarySettings.lr`), a fresh optimiser each round for the federated
methods, constant lr, no clipping, and per client the test score of its best-validation round (Sec. V-C);
'kept-adamw' keeps AdamW across rounds and reports the last round, as every run before 2026-11-29.

Writes results/adafedselectkd/<run>/: cells.jsonl (one line per finished cell, with the last round's and
the best-validation round's numbers), config.toml (the plan and each method's declared protocol),
results.json (that config, the tables, per-seed values per method and the paired AdaFedSelectKD -
AdaFedAvg difference per setting), summary.csv and summary.md (ROUGE-1/2/L x 100, mean ± std over seeds,
and per client), curves.png. The last line is
    summ setting=non_iid adafedselectkd=.. adafedkd=.. adafedavg=.. adacentralized=.. local=.. kd_token_share=..
      adafedselectkd_last=.. ... training_protocol=..
with the first setting's ROUGE-L (mean over clients, then over seeds; in [0, 1]) as the protocol selects
it, the share of target tokens whose KL term counted under AdaFedSelectKD, then each method's last-round
ROUGE-L and the protocol's name.
"""
from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

# heavy modules (torch, transformers) are imported in main(), after the command line is parsed
from fl_algorithms.choices import (SECURE_PROTOCOLS, SUMMARY_LR, SUMMARY_METHODS as METHODS,
                                   SUMMARY_SETTINGS as SETTINGS, SUMMARY_TRAINING_PROTOCOLS as TRAINING_PROTOCOLS)
from fl_algorithms.experiments.cli import comma_list, protocol_lines, start_grid
from fl_algorithms.experiments.flags import add_common_flags
from nlp_models._offline import ensure_offline

if TYPE_CHECKING:
    from fl_algorithms.experiments.summarization_grid import SummaryPlan

RESULTS = Path(__file__).resolve().parents[1] / "results" / "adafedselectkd"
QUICK = dict(settings=("non_iid",), seeds=(0,), rounds=5, data=dict(fraction=0.3))
FULL = dict(settings=SETTINGS, seeds=(0, 1, 2), rounds=10, data={})
"""The presets; `data` holds the SummarySettings fields each changes."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_flags(p, quick="non_iid, seed 0, 5 rounds, 30%% of each domain", algorithms=METHODS,
                     default_algorithms=METHODS, algorithm_word="method", seeds="0,1,2; --quick 0",
                     rounds="default 10; --quick 5", protocols=SECURE_PROTOCOLS, protocol_default="secagg+", grid=True,
                     cache=f"pre-trained generator cache (default {RESULTS / 'cache'})", report=True)
    p.add_argument("--settings", type=comma_list(str, what="setting", choices=SETTINGS), default=None,
                   help=f"comma list of data settings: {', '.join(SETTINGS)} (default all; --quick non_iid)")
    p.add_argument("--fraction", type=float, default=None, help="share of each domain's articles (default 1; quick 0.3)")
    p.add_argument("--lr", type=float, default=None, help=f"client AdamW lr (default {SUMMARY_LR})")
    p.add_argument("--pretrain-seed", type=int, default=None,
                   help="pre-train one generator with this seed and share it across the seeds, as the paper's one "
                        "BART serves all its runs (default: a generator per seed)")
    p.add_argument("--training-protocol", choices=TRAINING_PROTOCOLS, default="adafedselectkd",
                   help="the clients' declared training protocol: 'adafedselectkd' (the paper's: a fresh AdamW each "
                        "round, best-validation round reported) or 'kept-adamw' (AdamW kept across rounds, last round "
                        "reported: the runs before 2026-11-29)")
    return p


def build_plan(args: argparse.Namespace, parser: argparse.ArgumentParser) -> SummaryPlan:
    from fl_algorithms.experiments.summarization_grid import SummaryPlan
    from fl_algorithms.tasks.summarization import SummarySettings

    base: dict[str, Any] = dict(QUICK if args.quick else FULL)
    data = SummarySettings(**base.pop("data"))
    changes = {k: v for k, v in (("fraction", args.fraction), ("lr", args.lr), ("pretrain_seed", args.pretrain_seed))
               if v is not None}
    chosen = {k: v for k, v in (("settings", args.settings), ("methods", args.algorithms), ("seeds", args.seeds),
                                ("rounds", args.rounds)) if v is not None}
    try:
        return SummaryPlan(**{**base, **chosen, "protocol": args.protocol, "training_protocol": args.training_protocol,
                              "data": dataclasses.replace(data, **changes)})
    except ValueError as error:
        parser.error(str(error))


PER_SEED = ("rouge1", "rouge2", "rougeL", "best_rouge1", "best_rouge2", "best_rougeL", "selection")


def per_seed_values(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """results.json's per_seed[setting][method][seed]: the last round's and the best-validation round's
    test ROUGE (mean over clients), the selection, and each client's best round."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        value = {k: r[k] for k in PER_SEED if k in r}
        if "best_clients" in r:
            value["best_rounds"] = {name: c["round"] for name, c in r["best_clients"].items()}
        out.setdefault(r["setting"], {}).setdefault(r["method"], {})[str(r["seed"])] = value
    return out


def difference_line(setting: str, name: str, d: dict[str, Any]) -> str:
    """One printed line of `seed_differences`' `name` ('best' or 'last') entry for `setting`."""
    e = d[name]
    verdict = "narrower" if e["resolves"] else f"seeds needed: {e['seeds_needed']}"
    which = "best-validation rounds" if name == "best" else "last round"
    return (f"{setting}: adafedselectkd - adafedavg, ROUGE-L x 100, {which}: {e['mean']:+.2f} "
            f"[{e['low']:+.2f}, {e['high']:+.2f}] (n={e['seeds']}, paired std {e['std']:.2f}, width {e['width']:.2f} "
            f"against the paper's gap {d['paper_gap']:.2f}; {verdict})")


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ensure_offline()
    parser = _parser()
    parser.parse_args(argv)  # --help and a bad option answer here, before the heavy imports
    from fl_algorithms.experiments.rundir import RunDirectory
    from fl_algorithms.experiments.summarization_grid import (SummaryPlan, aggregate, cell_key, plot_curves,
                                                              run_summary_cell, seed_differences, write_table)

    def announce(plan: SummaryPlan) -> SummaryPlan:  # the run's header: each method's declared protocol
        print("\n".join(protocol_lines(plan.protocols())), flush=True)
        return plan

    grid = start_grid(parser, argv, script=__file__, default_out=RESULTS,
                      build=lambda args: announce(build_plan(args, parser)),
                      load=lambda raw: announce(SummaryPlan.from_record(raw)), record=SummaryPlan.record, key=cell_key,
                      forward=("backbone", "cache"))
    plan, args = grid.plan, grid.args
    config = {"plan": plan.record(), "training_protocol": {m: p.to_dict() for m, p in plan.protocols().items()}}
    if not args.worker:
        RunDirectory(grid.run).write_config(config)
    cache = Path(args.cache) if args.cache else RESULTS / "cache"
    clients = None
    for cell in grid.todo():
        if clients is None or (clients.settings.setting, clients.settings.seed) != (cell["setting"], cell["seed"]):
            clients = plan.clients_for(setting=cell["setting"], seed=cell["seed"], backbone=args.backbone,
                                       device=grid.device, cache_dir=cache, progress=not args.no_progress)
        row = grid.record(cell, lambda: run_summary_cell(cell, clients, plan, progress=not args.no_progress))
        share = f", KD tokens {row['kd_token_share']:.1%}" if "kd_token_share" in row else ""
        rounds = ", ".join(str(c["round"]) for c in row["best_clients"].values())
        print(f"{cell_key(cell)}: last round ROUGE-1/2/L {row['rouge1']:.4f} / {row['rouge2']:.4f} / {row['rougeL']:.4f}; "
              f"best-validation rounds ({rounds}) {row['best_rouge1']:.4f} / {row['best_rouge2']:.4f} / "
              f"{row['best_rougeL']:.4f}{share}, {row['seconds']:.0f} s", flush=True)
    if args.worker:
        return {"run": grid.run, "worker": True}
    rows = grid.summarise(write_table=write_table, plot=lambda rows, path: plot_curves(rows, path=path))
    first = plan.settings[0]
    tables = aggregate(rows)
    table = {e["method"]: e for e in tables if e["setting"] == first}
    differences = {s: d for s in plan.settings if (d := seed_differences(rows, setting=s)) is not None}
    for setting, d in differences.items():
        print("\n".join(difference_line(setting, name, d) for name in ("best", "last") if name in d), flush=True)
    RunDirectory(grid.run).write_results({"experiment": "adafedselectkd", "config": config, "summary": {
        "tables": tables, "paired_difference": differences, "per_seed": per_seed_values(rows)}})
    line = f"summ setting={first} " + " ".join(f"{m}={table[m]['rougeL']:.4f}" for m in plan.methods)
    if "adafedselectkd" in table:
        line += f" kd_token_share={table['adafedselectkd']['kd_token_share']:.4f}"
    if all("last_rougeL" in table[m] for m in plan.methods):
        line += "".join(f" {m}_last={table[m]['last_rougeL']:.4f}" for m in plan.methods)
    line += f" training_protocol={plan.training_protocol}"
    print(line, flush=True)
    return {"run": grid.run, "rows": rows, "line": line, "differences": differences}


if __name__ == "__main__":
    main()
