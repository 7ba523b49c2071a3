"""Accuracy against measured leakage at realistic cohorts: plaintext, SecAgg+, distributed DP, central DP, DP-SGD.

    python examples/privacy_frontier.py --quick     # 100 clients, Poisson cohorts of 20, eps 8, audited: < 10 min on 2 cores
    python examples/privacy_frontier.py             # 200 clients, cohorts 5/20/50, eps 1/2/4/8, 3 seeds (hours)
    python examples/privacy_frontier.py --model adapter   # MiniLM adapters (26k shared values; ~30 s a round on CPU)
    python examples/privacy_frontier.py --combine RUN_DIR RUN_DIR ...   # parts run in parallel, one report
    python examples/privacy_frontier.py --audit     # audit the DDP claim with canary clients (on by default with --quick)

What is run, measured and accounted is in `fl_algorithms.experiments.frontier`. Outputs under
results/privacy_frontier/<run>/: table.md and table.csv (mean and 95% Student-t interval over seeds,
and each setting's accuracy cost against plaintext paired by seed), results.json (every number of
every run), frontier.png (accuracy against the realistic attacker's advantage, epsilon labels),
cost_vs_epsilon.png (each mechanism's cost over epsilon), ledger.json (every run's ledger with the
configured mechanism).
Participation cap (`--max-participations`, default auto): a client takes part in at most K rounds, every
setting alike, and DDP's and DP-SGD's noise covers K participations against the server instead of every round;
auto takes, per cohort, the smallest K that fewer than one client is expected to exceed (6 of 20 rounds at
cohort 20 of 200), so it rarely binds (`capped_draws` per setting in results.json says how often it did).
The last line: `frontier cohort=C sampler=S plain_adv=A ddp_eps8_adv=B plain_acc=P ddp_eps8_acc=Q exact_noise=0|1
ledger=PATH` (exact_noise=1: DDP's released sums carry exactly the accounted noise, `dp.xnoise`).

`--audit` (`dp.audit`, `fl_algorithms.experiments.frontier.audit_ddp`): after each (cohort, seed) run,
the DDP setting with the largest epsilon is audited from the outside with canary clients (random
unit updates, inserted with probability 1/2, sampled into Poisson cohorts like any client; cosine
with each released model delta). The audit runs at the secure-sum level, not inside the frontier's
training run: the same DDP plan configuration (target epsilon, noise floor n_min, ring, bits, clip,
rounds, Poisson cohorts over the same population) through the project's DDP encoder and decoder,
on synthetic client vectors of 256 values instead of the model's (the mechanism's privacy depends
only on the clipped vectors). `claimed_eps` (the ledger's epsilon the setting targets: against the
server, a client in as many rounds as the participation cap allows), `empirical_eps` (Andrew et al.'s Gaussian fit) and
`eps_lower_bound` (95% Clopper-Pearson) go into that setting's result in results.json (its leakage
report), and `audit mechanism=ddp claimed_eps=8 empirical_eps=E eps_lower_bound=L canaries=K` is
printed just before the last line.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

# heavy modules (torch, transformers) are imported where they are used, after the command line is parsed
from fl_algorithms.choices import BACKBONES, COHORT_TAIL, FRONTIER_MECHANISMS as MECHANISMS, FRONTIER_SAMPLERS
from fl_algorithms.experiments.flags import add_common_flags
from nlp_models._offline import ensure_offline

if TYPE_CHECKING:
    from fl_algorithms.experiments.frontier import FrontierConfig

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "privacy_frontier"
LEDGERS_FORMAT = "fedsecure-nlp/privacy-frontier-ledgers/v2"
AUDIT_KEYS = ("claimed_eps", "empirical_eps", "eps_lower_bound")
"""What `--audit` adds to the audited setting's result (its leakage report), beside the full "audit" entry."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_flags(p, quick="100 clients, cohort 20, 8 rounds, eps 8, one seed", seeds="0 1 2; --quick 0",
                     seeds_spaces=True, rounds="default 20; --quick 8", device="cpu", out=str(DEFAULT_OUT),
                     device_note="; where the adapter model trains and is attacked (the bag model runs on the CPU)",
                     out_default=DEFAULT_OUT, resume="with --report only: the run directory to report (a frontier "
                                                     "run is not resumed: run the missing cells as a part and "
                                                     "--combine)", progress=True, report=True)
    p.add_argument("--model", choices=("bag", "adapter"), default="bag",
                   help="bag-of-embeddings (token attacks apply) or MiniLM adapters (membership attack only)")
    p.add_argument("--backbone", choices=BACKBONES, default="minilm",
                   help="the adapter model's encoder ('tiny': a random 3-layer BERT, for tests)")
    p.add_argument("--clients", type=int, default=None, help="clients in the population (default 200; --quick 100)")
    p.add_argument("--cohorts", type=int, nargs="+", default=None,
                   help="expected cohort sizes, one run each (default 5 20 50; --quick 20)")
    p.add_argument("--epsilons", type=float, nargs="+", default=None,
                   help="target epsilons of every DP mechanism (default 1 2 4 8; --quick 8)")
    p.add_argument("--mechanisms", nargs="+", choices=MECHANISMS, default=list(MECHANISMS),
                   help="DP mechanisms besides plaintext and SecAgg+: ddp (distributed), central, dpsgd (local "
                        "DP-SGD) (default all)")
    p.add_argument("--sampler", choices=FRONTIER_SAMPLERS, default="poisson",
                   help="cohort sampler: poisson (default; amplification by subsampling), fixed_size, or seeded "
                        "(reproducible, no amplification)")
    p.add_argument("--cohort-tail", type=float, default=COHORT_TAIL,
                   help="Poisson cohorts: DDP's noise is sized for this lower quantile of the cohort size; rounds "
                        "below it release nothing (default %(default)g)")
    p.add_argument("--floor-sized-noise", action="store_true",
                   help="DDP without XNoise: each client's noise sized for the floor n_min and left in, so a round "
                        "of u survivors carries u / n_min times the accounted noise (the runs before 2026-11-29); "
                        "default: exact noise, the excess removed once the survivors are known")
    p.add_argument("--max-participations", type=_cap, default="auto", metavar="K|auto|none",
                   help="each client takes part in at most K rounds (every setting alike); DDP's and DP-SGD's noise "
                        "is then calibrated for K participations against the server instead of every round; auto "
                        "(default): per cohort, the smallest K that fewer than one client is expected to exceed; "
                        "none: no cap, noise for a client in every round (the runs before 2026-11-29 evening)")
    p.add_argument("--local-epochs", type=int, default=5, help="local epochs per round (default 5)")
    p.add_argument("--max-examples", type=int, default=None, help="cap on the corpus' examples (default: all)")
    p.add_argument("--no-baselines", action="store_true",
                   help="skip plaintext and SecAgg+: more epsilons for cells another run measured (then --combine both)")
    p.add_argument("--save-transcripts", action="store_true", help="export each run's server transcript (large)")
    p.add_argument("--audit", action=argparse.BooleanOptionalAction, default=None,
                   help="audit the largest-epsilon DDP setting's claim with canary clients (dp.audit; about 10 s per "
                        "run; default: on with --quick, off otherwise)")
    p.add_argument("--combine", nargs="+", type=Path, metavar="RUN_DIR", default=None,
                   help="report finished runs (made in parallel, e.g. one per cohort) as one: writes the tables, "
                        "plots and last line under --out/--run-name; runs nothing")
    return p


def _cap(text: str) -> int | str | None:
    if text in ("auto", "none"):
        return None if text == "none" else text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, 'auto' or 'none', got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, 'auto' or 'none', got {text!r}")
    return value


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line, checked (a bad combination is an argparse error, exit code 2)."""
    p = _parser()
    args = p.parse_args(argv)
    if args.resume and not args.report:
        p.error("--resume is for --report here: a frontier run is not resumed (run the missing cells as a part, "
                "then --combine the parts)")
    if args.report and (not args.resume or args.combine):
        p.error("--report rewrites a run's tables from its results.json: give --resume RUN_DIR, without --combine")
    from nlp_models.device import resolve_device

    try:
        args.device = str(resolve_device(args.device))
    except ValueError as error:
        p.error(str(error))
    if args.audit is None:  # the quick run shows the audit line before its last line
        args.audit = bool(args.quick)
    if args.model == "bag" and args.device != "cpu":
        p.error("the bag model runs on the CPU: --device is for --model adapter")
    return args


def configs(args: argparse.Namespace) -> list[FrontierConfig]:
    from fl_algorithms.experiments.frontier import FrontierConfig
    from nlp_models.adapter_sentiment import AdapterTaskConfig
    from nlp_models.bag_of_tokens import BagTaskConfig

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
                                      sampler=args.sampler, cohort_tail=args.cohort_tail,
                                      exact_noise=not args.floor_sized_noise,
                                      max_participations=_resolve_cap(args, clients=clients, cohort=cohort),
                                      local_epochs=args.local_epochs,
                                      epsilons=tuple(args.epsilons or ((8.0,) if q else (1.0, 2.0, 4.0, 8.0))),
                                      mechanisms=tuple(args.mechanisms), save_transcripts=args.save_transcripts,
                                      baselines=not args.no_baselines, seed=seed))
    return out


def _resolve_cap(args: argparse.Namespace, *, clients: int, cohort: int) -> int | None:
    """--max-participations for one cohort: 'auto' resolved from the sampler (`participation_cap`)."""
    if args.max_participations != "auto":
        return args.max_participations
    from fl_algorithms.experiments.frontier import participation_cap

    rounds = args.rounds or (8 if args.quick else 20)
    return participation_cap(population=clients, rate=cohort / clients, rounds=rounds)


def exact_noise(runs: Sequence[dict]) -> bool:
    """Whether every run's DDP noise was exact (XNoise): read from its saved config (older runs: floor-sized)."""
    return bool(runs) and all("exact_noise=True" in str(r.get("config", "")) for r in runs)


def _write_json(path: Path, doc: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    os.replace(tmp, path)


def training_protocol(model: str, task: Any):
    """The clients' declared training protocol (`TrainingProtocol`) of `model`'s trainers on `task`."""
    from fl_algorithms.training import adapter_sentiment_trainer, bag_trainer

    return (bag_trainer if model == "bag" else adapter_sentiment_trainer).training_protocol(task)


def load_bag_task(config: Any) -> Any:
    """`nlp_models.bag_of_tokens.load_bag_task`, imported at the first call (tests replace this name)."""
    from nlp_models.bag_of_tokens import load_bag_task as load

    return load(config)


def run_frontier(task: Any, config: FrontierConfig, **options: Any) -> Any:
    """`fl_algorithms.experiments.frontier.run_frontier`, imported at the first call (tests replace this name)."""
    from fl_algorithms.experiments.frontier import run_frontier as run

    return run(task, config, **options)


def report_saved(run: Path) -> dict[str, Any]:
    """--resume RUN_DIR --report: RUN_DIR's tables, plots and last line rewritten from its results.json (the
    settings it has finished), running nothing."""
    from fl_algorithms.experiments.frontier_report import load_results

    try:
        doc = load_results([run])[0][1]
        sampler = re.search(r"sampler='(\w+)'", doc["runs"][0]["config"]).group(1)
    except (OSError, ValueError, KeyError, IndexError, AttributeError) as error:
        raise SystemExit(f"error: {run}: no frontier run's results.json ({error!r})") from None
    sources = [Path(p) for p in doc.get("combined_from", [])]
    return report(doc["runs"], run, sampler=sampler, seconds=doc.get("seconds"),
                  ledgers=[p / "ledger.json" for p in sources] or [run / "ledger.json"], combined_from=sources or None)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ensure_offline()
    args = parse_args(argv)
    if args.report:
        return report_saved(Path(args.resume))
    import torch
    from tqdm.auto import tqdm

    from fl_algorithms.experiments.frontier import audit_ddp
    from fl_algorithms.experiments.frontier_report import combine, load_results
    from fl_algorithms.training.dp_trainer import quiet_dp_libraries
    from nlp_models.adapter_sentiment import load_adapter_task

    quiet_dp_libraries()
    torch.set_num_threads(1)
    run_name = args.run_name or (time.strftime("%Y%m%d-%H%M%S") + ("-quick" if args.quick else "")
                                 + ("" if args.model == "bag" else f"-{args.model}"))
    out = Path(args.out) / run_name
    out.mkdir(parents=True, exist_ok=True)
    if args.combine:
        docs = load_results(args.combine)
        sampler = re.search(r"sampler='(\w+)'", docs[0][1]["runs"][0]["config"]).group(1)  # combine: all agree
        sources = [p if p.is_dir() else p.parent for p in args.combine]
        return report(combine(docs), out, sampler=sampler, seconds=None, ledgers=[d / "ledger.json" for d in sources],
                      combined_from=sources)
    t0 = time.perf_counter()
    progress = not args.no_progress
    runs, ledgers, tasks = [], {}, {}
    ledger_path, results_path = out / "ledger.json", out / "results.json"
    for cfg in tqdm(configs(args), desc="cohorts x seeds", disable=not progress):
        if cfg.task not in tasks:  # one task in memory at a time
            tasks = {cfg.task: load_bag_task(cfg.task) if args.model == "bag"
                     else load_adapter_task(cfg.task, progress=progress, device=args.device)}
        tag = f"cohort{cfg.cohort}-seed{cfg.seed}"
        protocol = training_protocol(args.model, tasks[cfg.task])
        if not runs:
            print(f"training protocol: {protocol.describe()} (DP-SGD settings: Opacus's optimiser, per-example "
                  f"clipping)", flush=True)
        cell = {"model": args.model, "cohort": cfg.cohort, "seed": cfg.seed, "config": repr(cfg), "results": {},
                "task": tasks[cfg.task].summary(), "training_protocol": protocol.to_dict()}
        runs.append(cell)

        def keep(name, run, result, tag=tag, cell=cell):  # written as each setting ends: a crash or a kill
            ledgers[f"{tag}/{name}"] = {"parameters": run.parameters, "ledger": run.ledger.report()}  # loses one
            _write_json(ledger_path, {"format": LEDGERS_FORMAT, "runs": ledgers})
            cell["results"][name] = result
            _write_json(results_path, {"runs": runs})

        run_frontier(tasks[cfg.task], cfg, progress=progress, out_dir=out / tag, on_result=keep)
        if args.audit and "ddp" in cfg.mechanisms:
            found = audit_ddp(tasks[cfg.task], cfg)
            cell["results"][found["setting"]]["audit"] = found
            cell["results"][found["setting"]].update({k: found[k] for k in AUDIT_KEYS})
            _write_json(results_path, {"runs": runs})
    return report(runs, out, sampler=args.sampler, seconds=time.perf_counter() - t0, ledgers=[ledger_path])


def report(runs: list[dict[str, Any]], out: Path, *, sampler: str, seconds: float | None, ledgers: list[Path],
           combined_from: list[Path] | None = None) -> dict[str, Any]:
    """Tables, plots, results.json and the last line for `runs` (one run or combined parts)."""
    from fl_algorithms.experiments.frontier_report import csv_text, markdown, plot_cost, plot_frontier, summarise
    from fl_algorithms.experiments.rundir import stamped

    rows = summarise(runs)
    (out / "table.md").write_text(markdown(rows) + "\n")
    (out / "table.csv").write_text(csv_text(rows) + "\n")
    plot_path, cost_path = plot_frontier(rows, out / "frontier.png"), plot_cost(rows, out / "cost_vs_epsilon.png")
    audits = [{"cohort": r["cohort"], "seed": r["seed"], **res["audit"]}
              for r in runs for res in r["results"].values() if isinstance(res, dict) and "audit" in res]
    doc = {"runs": runs, "rows": rows, "seconds": seconds}
    if audits:
        doc["audit"] = [{k: a[k] for k in ("cohort", "seed", "setting", *AUDIT_KEYS, "canaries", "line")} for a in audits]
    if combined_from:
        doc["combined_from"] = [str(p) for p in combined_from]
    _write_json(out / "results.json", stamped(out / "results.json", doc))  # with the command, device, date
    print(markdown(rows))
    took = "combined" if seconds is None else f"{seconds:.0f} s"
    print(f"\nresults: {out / 'results.json'}  plots: {plot_path}" + (f", {cost_path}" if cost_path else "") + f"  ({took})")
    head = max(r["cohort"] for r in rows)
    by = {r["setting"]: r for r in rows if r["cohort"] == head}
    top = "ddp_eps8" if "ddp_eps8" in by else max((k for k in by if k.startswith("ddp_")), default="secagg")

    def value(setting: str, key: str) -> str:  # 'na' where a part ran without it (--no-baselines, --mechanisms)
        return f"{by[setting][key]:.3f}" if setting in by else "na"

    last = (f"frontier cohort={head} sampler={sampler} plain_adv={value('plain', 'realistic_advantage')} "
            f"{top}_adv={value(top, 'realistic_advantage')} plain_acc={value('plain', 'accuracy')} "
            f"{top}_acc={value(top, 'accuracy')} exact_noise={int(exact_noise(runs))} "
            f"ledger={','.join(str(p) for p in ledgers)}")
    for a in audits:
        print(a["line"])
    print(last)
    return {"rows": rows, "runs": runs, "last_line": last, "seconds": seconds, "out": str(out)}


if __name__ == "__main__":
    main()
