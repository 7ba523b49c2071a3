"""Accuracy against measured leakage at realistic cohorts: plaintext, SecAgg+, distributed DP, central DP, DP-SGD.

    python examples/privacy_frontier.py --quick     # 100 clients, Poisson cohorts of 20, eps 8: < 10 min on 2 cores
    python examples/privacy_frontier.py             # 200 clients, cohorts 5/20/50, eps 1/2/4/8, 3 seeds (hours)
    python examples/privacy_frontier.py --model adapter   # MiniLM adapters (26k shared values; ~30 s a round on CPU)

What is run, measured and accounted is in `fl_algorithms.experiments.frontier`. Outputs under
results/privacy_frontier/<run>/: table.md and table.csv (mean and 95% Student-t interval over seeds),
results.json (every number of every run), frontier.png (accuracy against the realistic attacker's
advantage, epsilon labels), ledger.json (every run's ledger with the configured mechanism).
The last line: `frontier cohort=C sampler=S plain_adv=A ddp_eps8_adv=B plain_acc=P ddp_eps8_acc=Q ledger=PATH`.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from dp.leakage.stats import mean_ci
from fl_algorithms.experiments.frontier import MECHANISMS, FrontierConfig, run_frontier
from fl_algorithms.training.dp_trainer import quiet_dp_libraries
from nlp_models._offline import ensure_offline
from nlp_models.adapter_sentiment import AdapterTaskConfig, load_adapter_task
from nlp_models.bag_of_tokens import BagTaskConfig, load_bag_task

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "privacy_frontier"
LEDGERS_FORMAT = "fedsecure-nlp/privacy-frontier-ledgers/v2"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="100 clients, cohort 20, 8 rounds, eps 8, one seed")
    p.add_argument("--model", choices=("bag", "adapter"), default="bag",
                   help="bag-of-embeddings (token attacks apply) or MiniLM adapters (membership attack only)")
    p.add_argument("--backbone", choices=("minilm", "tiny"), default="minilm",
                   help="the adapter model's encoder ('tiny': a random 3-layer BERT, for tests)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--run-name", default=None)
    p.add_argument("--clients", type=int, default=None)
    p.add_argument("--cohorts", type=int, nargs="+", default=None)
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--seeds", type=int, nargs="+", default=None)
    p.add_argument("--epsilons", type=float, nargs="+", default=None)
    p.add_argument("--mechanisms", nargs="+", choices=MECHANISMS, default=list(MECHANISMS))
    p.add_argument("--sampler", choices=("poisson", "fixed_size", "seeded"), default="poisson")
    p.add_argument("--local-epochs", type=int, default=5)
    p.add_argument("--max-examples", type=int, default=None)
    p.add_argument("--save-transcripts", action="store_true", help="export each run's server transcript (large)")
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def configs(args: argparse.Namespace) -> list[FrontierConfig]:
    q = args.quick
    clients = args.clients or (100 if q else 200)
    out = []
    for seed in args.seeds or ([0] if q else [0, 1, 2]):
        if args.model == "bag":
            task = BagTaskConfig(num_clients=clients, max_examples=args.max_examples, public_fraction=0.1, seed=seed)
        else:
            task = AdapterTaskConfig(num_clients=clients, max_examples=args.max_examples, public_fraction=0.1,
                                     seed=seed, backbone=args.backbone)
        for cohort in args.cohorts or ([20] if q else [5, 20, 50]):
            out.append(FrontierConfig(task=task, rounds=args.rounds or (8 if q else 20), cohort=cohort,
                                      sampler=args.sampler, local_epochs=args.local_epochs,
                                      epsilons=tuple(args.epsilons or ((8.0,) if q else (1.0, 2.0, 4.0, 8.0))),
                                      mechanisms=tuple(args.mechanisms), save_transcripts=args.save_transcripts,
                                      seed=seed))
    return out


def _eps(v: Any) -> float:
    return float("inf") if v in ("inf", None) else float(v)


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (cohort, setting): mean and 95% CI over seeds of accuracy and advantages."""
    rows = []
    keys = sorted({(r["cohort"], name) for r in runs for name in r["results"]},
                  key=lambda k: (k[0], list(runs[0]["results"]).index(k[1]) if k[1] in runs[0]["results"] else 99))
    for cohort, name in keys:
        per = [r["results"][name] for r in runs if r["cohort"] == cohort and name in r["results"]]
        unit = per[0]["epsilon_unit"]
        row = {"cohort": cohort, "setting": name, "label": per[0]["setting"]["label"], "seeds": len(per), "unit": unit,
               "epsilon_target": per[0]["setting"]["epsilon"]}
        for key, get in (("accuracy", lambda x: x["accuracy"]),
                         ("realistic_advantage", lambda x: x["realistic_advantage"]),
                         ("oracle_advantage", lambda x: x["oracle_advantage"]),
                         ("mia_advantage", lambda x: x["membership"]["calibrated"]["advantage"]),
                         ("mia_auc", lambda x: x["membership"]["auc"]),
                         ("mia_tpr_1pct", lambda x: x["membership"]["tpr_at_1pct_fpr"]),
                         ("mia_tpr_01pct", lambda x: x["membership"]["tpr_at_01pct_fpr"])):
            m, lo, hi = mean_ci([get(x) for x in per])
            row[key], row[key + "_ci"] = m, (None if lo != lo else [lo, hi])
        row["eps_server"] = max(_eps(x["epsilon"].get(f"{unit}/server")) for x in per)
        outsider = [min(_eps(x["epsilon"].get(f"{unit}/outsider")), _eps(x["epsilon"].get(f"{unit}/server"))) for x in per]
        row["eps_outsider"] = max(outsider)
        row["skipped_rounds"] = sum(x["skipped_rounds"] for x in per)
        rows.append(row)
    return rows


def _pm(row: dict[str, Any], key: str, fmt: str = ".3f") -> str:
    ci = row.get(key + "_ci")
    return f"{row[key]:{fmt}}" + ("" if ci is None else f" ± {(ci[1] - ci[0]) / 2:{fmt}}")


def markdown(rows: list[dict[str, Any]]) -> str:
    head = ("| cohort | setting | acc | realistic adv | oracle adv | MIA adv | MIA AUC | TPR@1% | TPR@0.1% | "
            "eps server | eps outsider | unit | seeds |")
    lines = [head, "|" + "---|" * 13]
    for r in rows:
        lines.append(f"| {r['cohort']} | {r['label']} | {_pm(r, 'accuracy')} | {_pm(r, 'realistic_advantage')} | "
                     f"{_pm(r, 'oracle_advantage')} | {_pm(r, 'mia_advantage')} | {_pm(r, 'mia_auc')} | "
                     f"{r['mia_tpr_1pct']:.3f} | "
                     f"{r['mia_tpr_01pct']:.3f} | {r['eps_server']:.2f} | {r['eps_outsider']:.2f} | {r['unit']} | "
                     f"{r['seeds']} |")
    return "\n".join(lines)


def csv_text(rows: list[dict[str, Any]]) -> str:
    cols = ["cohort", "setting", "unit", "epsilon_target", "seeds", "accuracy", "realistic_advantage", "oracle_advantage",
            "mia_advantage", "mia_auc", "mia_tpr_1pct", "mia_tpr_01pct", "eps_server", "eps_outsider", "skipped_rounds"]
    out = [",".join(cols)]
    for r in rows:
        out.append(",".join("" if r[c] is None else str(r[c]) for c in cols))
    return "\n".join(out)


def plot(rows: list[dict[str, Any]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cohorts = sorted({r["cohort"] for r in rows})
    fig, axes = plt.subplots(1, len(cohorts), figsize=(5.5 * len(cohorts), 4.4), squeeze=False)
    markers = {"plain": "s", "secagg": "D", "ddp": "o", "central": "^", "dpsgd": "v"}
    colors = {"plain": "black", "secagg": "grey", "ddp": "tab:blue", "central": "tab:orange", "dpsgd": "tab:green"}
    for ax, cohort in zip(axes[0], cohorts):
        for r in (r for r in rows if r["cohort"] == cohort):
            kind = r["setting"].split("_")[0]
            xerr = None if r["realistic_advantage_ci"] is None else [[r["realistic_advantage"] - r["realistic_advantage_ci"][0]],
                                                                     [r["realistic_advantage_ci"][1] - r["realistic_advantage"]]]
            yerr = None if r["accuracy_ci"] is None else [[r["accuracy"] - r["accuracy_ci"][0]],
                                                         [r["accuracy_ci"][1] - r["accuracy"]]]
            ax.errorbar(r["realistic_advantage"], r["accuracy"], xerr=xerr, yerr=yerr, marker=markers.get(kind, "o"),
                        color=colors.get(kind, "tab:red"), capsize=2, linestyle="none")
            eps = r["epsilon_target"]
            ax.annotate("inf" if eps is None else f"{eps:g}", (r["realistic_advantage"], r["accuracy"]), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")
        ax.set_title(f"expected cohort {cohort}", fontsize=10)
        ax.set_xlabel("realistic attacker's advantage over chance")
        ax.set_ylabel("mean client test accuracy")
        ax.grid(alpha=0.3)
    handles = [plt.Line2D([], [], marker=m, color=colors[k], linestyle="none", label=k) for k, m in markers.items()]
    axes[0][0].legend(handles=handles, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _write_json(path: Path, doc: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    os.replace(tmp, path)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ensure_offline()
    args = parse_args(argv)
    quiet_dp_libraries()
    torch.set_num_threads(1)
    run_name = args.run_name or (time.strftime("%Y%m%d-%H%M%S") + ("-quick" if args.quick else "")
                                 + ("" if args.model == "bag" else f"-{args.model}"))
    out = Path(args.out) / run_name
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    progress = not args.no_progress
    runs, ledgers, tasks = [], {}, {}
    ledger_path, results_path = out / "ledger.json", out / "results.json"
    for cfg in tqdm(configs(args), desc="cohorts x seeds", disable=not progress):
        if cfg.task not in tasks:  # one task in memory at a time
            tasks = {cfg.task: load_bag_task(cfg.task) if args.model == "bag"
                     else load_adapter_task(cfg.task, progress=progress)}
        tag = f"cohort{cfg.cohort}-seed{cfg.seed}"

        def keep(name, run, _result, tag=tag):  # written as each run ends: nothing lost on a crash
            ledgers[f"{tag}/{name}"] = {"parameters": run.parameters, "ledger": run.ledger.report()}
            _write_json(ledger_path, {"format": LEDGERS_FORMAT, "runs": ledgers})

        results, _ = run_frontier(tasks[cfg.task], cfg, progress=progress, out_dir=out / tag, on_result=keep)
        runs.append({"model": args.model, "cohort": cfg.cohort, "seed": cfg.seed, "config": repr(cfg), "results": results,
                     "task": tasks[cfg.task].summary()})
        _write_json(results_path, {"runs": runs})
    rows = summarise(runs)
    (out / "table.md").write_text(markdown(rows) + "\n")
    (out / "table.csv").write_text(csv_text(rows) + "\n")
    plot_path = plot(rows, out / "frontier.png")
    seconds = time.perf_counter() - t0
    _write_json(results_path, {"runs": runs, "rows": rows, "seconds": seconds})
    print(markdown(rows))
    print(f"\nresults: {results_path}  plot: {plot_path}  ({seconds:.0f} s)")
    head = max(r["cohort"] for r in rows)
    by = {r["setting"]: r for r in rows if r["cohort"] == head}
    top = "ddp_eps8" if "ddp_eps8" in by else max((k for k in by if k.startswith("ddp_")), default="secagg")
    last = (f"frontier cohort={head} sampler={args.sampler} plain_adv={by['plain']['realistic_advantage']:.3f} "
            f"{top}_adv={by[top]['realistic_advantage']:.3f} plain_acc={by['plain']['accuracy']:.3f} "
            f"{top}_acc={by[top]['accuracy']:.3f} ledger={ledger_path}")
    print(last)
    return {"rows": rows, "runs": runs, "last_line": last, "seconds": seconds, "out": str(out)}


if __name__ == "__main__":
    main()
