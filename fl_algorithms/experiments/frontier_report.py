"""The privacy frontier's report: rows over seeds, the accuracy cost of each mechanism, tables, plots, and
runs made in parts combined into one report.

Input is the `runs` list that `examples/privacy_frontier.py` writes to results.json: one entry per
(cohort, seed) with every setting's result (`fl_algorithms.experiments.frontier.measure`). Rows are
per (cohort, setting): mean and 95% Student-t interval over seeds, and the **cost against plaintext**
in accuracy points, paired by seed (same split, same initial model; each setting draws its own
cohorts and noise), which is what the issue's accuracy goal is about.
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dp.leakage.stats import mean_ci
from fl_algorithms.experiments.frontier import COHORT_TAIL
from fl_algorithms.experiments.tables import paired_difference, pyplot, save_figure

KIND_STYLE = {"plain": ("s", "black"), "secagg": ("D", "grey"), "ddp": ("o", "tab:blue"),
              "central": ("^", "tab:orange"), "dpsgd": ("v", "tab:green")}
"""Marker and colour per setting kind (the name's prefix)."""

_PER_SEED = (("accuracy", lambda x: x["accuracy"]),
             ("realistic_advantage", lambda x: x["realistic_advantage"]),
             ("oracle_advantage", lambda x: x["oracle_advantage"]),
             ("mia_advantage", lambda x: x["membership"]["calibrated"]["advantage"]),
             ("mia_auc", lambda x: x["membership"]["auc"]),
             ("mia_tpr_1pct", lambda x: x["membership"]["tpr_at_1pct_fpr"]),
             ("mia_tpr_01pct", lambda x: x["membership"]["tpr_at_01pct_fpr"]))


def _eps(v: Any) -> float:
    return float("inf") if v in ("inf", None) else float(v)


KINDS = tuple(KIND_STYLE)
"""The table's order of setting kinds."""


def kind(setting: str) -> str:
    """'plain', 'secagg', 'ddp', 'central' or 'dpsgd' from a setting name such as 'ddp_eps8'."""
    return setting.split("_")[0]


def summarise(runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (cohort, setting): mean and 95% CI over seeds, and the cost against plaintext (points).
    Rows run by cohort, then mechanism (plaintext, SecAgg+, DDP, central DP, DP-SGD), then epsilon, whatever
    order the parts measured them in."""
    order: list[str] = []
    for r in runs:
        order += [name for name in r["results"] if name not in order]
    rows = []
    for cohort, name in sorted({(r["cohort"], n) for r in runs for n in r["results"]},
                               key=lambda k: (k[0], order.index(k[1]))):
        mine = [r for r in runs if r["cohort"] == cohort and name in r["results"]]
        per = [r["results"][name] for r in mine]
        unit = per[0]["epsilon_unit"]
        row = {"cohort": cohort, "setting": name, "label": per[0]["setting"]["label"], "seeds": len(per), "unit": unit,
               "epsilon_target": per[0]["setting"]["epsilon"]}
        for key, get in _PER_SEED:
            m, lo, hi = mean_ci([get(x) for x in per])
            row[key], row[key + "_ci"] = m, (None if lo != lo else [lo, hi])
        plain = {r["seed"]: 100 * r["results"]["plain"]["accuracy"]
                 for r in runs if r["cohort"] == cohort and "plain" in r["results"]}
        cost = paired_difference(plain, {r["seed"]: 100 * r["results"][name]["accuracy"] for r in mine})
        row["cost_vs_plain"] = None if cost is None or name == "plain" else cost["mean"]
        row["cost_vs_plain_ci"] = (None if row["cost_vs_plain"] is None or math.isnan(cost["low"])
                                   else [cost["low"], cost["high"]])
        row["eps_server"] = max(_eps(x["epsilon"].get(f"{unit}/server")) for x in per)
        row["eps_outsider"] = max(min(_eps(x["epsilon"].get(f"{unit}/outsider")), _eps(x["epsilon"].get(f"{unit}/server")))
                                  for x in per)
        row["skipped_rounds"] = sum(x["skipped_rounds"] for x in per)
        rows.append(row)
    rank = {k: i for i, k in enumerate(KINDS)}
    return sorted(rows, key=lambda r: (r["cohort"], rank.get(kind(r["setting"]), len(KINDS)), r["epsilon_target"] or 0.0))


def _pm(row: Mapping[str, Any], key: str, fmt: str = ".3f") -> str:
    if row[key] is None:
        return "–"
    ci = row.get(key + "_ci")
    return f"{row[key]:{fmt}}" + ("" if ci is None else f" ± {(ci[1] - ci[0]) / 2:{fmt}}")


def _interval(row: Mapping[str, Any], key: str) -> str:
    ci = row.get(key + "_ci")
    return "–" if row[key] is None else f"{row[key]:.1f}" + ("" if ci is None else f" [{ci[0]:.1f}, {ci[1]:.1f}]")


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """The results table (docs/results/privacy_frontier.md): one line per row; the cost column is plaintext minus the setting, paired by seed."""
    head = ("| cohort | setting | acc | cost vs plain (pts, 95% CI) | realistic adv | oracle adv | MIA adv | MIA AUC | "
            "TPR@1% | TPR@0.1% | eps server | eps outsider | unit | seeds |")
    lines = [head, "|" + "---|" * 14]
    for r in rows:
        lines.append(f"| {r['cohort']} | {r['label']} | {_pm(r, 'accuracy')} | {_interval(r, 'cost_vs_plain')} | "
                     f"{_pm(r, 'realistic_advantage')} | {_pm(r, 'oracle_advantage')} | {_pm(r, 'mia_advantage')} | "
                     f"{_pm(r, 'mia_auc')} | {r['mia_tpr_1pct']:.3f} | {r['mia_tpr_01pct']:.3f} | "
                     f"{r['eps_server']:.2f} | {r['eps_outsider']:.2f} | {r['unit']} | {r['seeds']} |")
    return "\n".join(lines)


CSV_COLUMNS = ("cohort", "setting", "unit", "epsilon_target", "seeds", "accuracy", "cost_vs_plain", "realistic_advantage",
               "oracle_advantage", "mia_advantage", "mia_auc", "mia_tpr_1pct", "mia_tpr_01pct", "eps_server",
               "eps_outsider", "skipped_rounds")


def csv_text(rows: Sequence[Mapping[str, Any]]) -> str:
    out = [",".join(CSV_COLUMNS)]
    for r in rows:
        out.append(",".join("" if r[c] is None else str(r[c]) for c in CSV_COLUMNS))
    return "\n".join(out)


def _errors(row: Mapping[str, Any], key: str) -> list[list[float]] | None:
    ci = row.get(key + "_ci")
    return None if ci is None else [[row[key] - ci[0]], [ci[1] - row[key]]]


def plot_frontier(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Per cohort: accuracy against the realistic attacker's advantage, one point per setting, epsilon labels."""
    plt = pyplot()
    cohorts = sorted({r["cohort"] for r in rows})
    fig, axes = plt.subplots(1, len(cohorts), figsize=(5.5 * len(cohorts), 4.4), squeeze=False)
    for ax, cohort in zip(axes[0], cohorts):
        for r in (r for r in rows if r["cohort"] == cohort):
            marker, colour = KIND_STYLE.get(kind(r["setting"]), ("o", "tab:red"))
            ax.errorbar(r["realistic_advantage"], r["accuracy"], xerr=_errors(r, "realistic_advantage"),
                        yerr=_errors(r, "accuracy"), marker=marker, color=colour, capsize=2, linestyle="none")
            eps = r["epsilon_target"]
            ax.annotate("inf" if eps is None else f"{eps:g}", (r["realistic_advantage"], r["accuracy"]), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")
        ax.set_title(f"expected cohort {cohort}", fontsize=10)
        ax.set_xlabel("realistic attacker's advantage over chance")
        ax.set_ylabel("mean client test accuracy")
    handles = [plt.Line2D([], [], marker=m, color=c, linestyle="none", label=k) for k, (m, c) in KIND_STYLE.items()]
    axes[0][0].legend(handles=handles, fontsize=8)
    return save_figure(fig, path, legend=False)


def plot_cost(rows: Sequence[Mapping[str, Any]], path: Path) -> Path | None:
    """Per cohort: each mechanism's cost against plaintext (points, paired 95% CI) over epsilon, log2 axis;
    None when no row has a finite epsilon."""
    noisy = [r for r in rows if r["epsilon_target"] is not None and r["cost_vs_plain"] is not None]
    if not noisy:
        return None
    plt = pyplot()
    cohorts = sorted({r["cohort"] for r in noisy})
    fig, axes = plt.subplots(1, len(cohorts), figsize=(4.6 * len(cohorts), 3.8), squeeze=False, sharey=True)
    for ax, cohort in zip(axes[0], cohorts):
        for shift, k in zip((-0.06, 0.0, 0.06), ("ddp", "central", "dpsgd")):  # side by side: bars stay apart
            mine = sorted((r for r in noisy if r["cohort"] == cohort and kind(r["setting"]) == k),
                          key=lambda r: r["epsilon_target"])
            if not mine:
                continue
            marker, colour = KIND_STYLE[k]
            lows = [r["cost_vs_plain"] - (r["cost_vs_plain_ci"] or [r["cost_vs_plain"]] * 2)[0] for r in mine]
            highs = [(r["cost_vs_plain_ci"] or [r["cost_vs_plain"]] * 2)[1] - r["cost_vs_plain"] for r in mine]
            ax.errorbar([r["epsilon_target"] * 2 ** shift for r in mine], [r["cost_vs_plain"] for r in mine], yerr=[lows, highs],
                        marker=marker, color=colour, capsize=2, label=k)
        ax.axhline(0.0, color="black", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(f"expected cohort {cohort}", fontsize=10)
        ax.set_xlabel("target epsilon")
        ax.set_ylabel("accuracy cost vs plaintext (points)")
    return save_figure(fig, path)


_VARYING = re.compile(r"\b(cohort|seed|epsilons|mechanisms|save_transcripts)=(\([^)]*\)|[^,)]+)")


def settings_key(run: Mapping[str, Any]) -> str:
    """What must agree between runs reported together: the model and the config without the cohort, seed,
    epsilons, mechanisms and baselines (which a report may span)."""
    config = re.sub(r", baselines=(True|False)", "", run["config"])  # which settings a part ran, like mechanisms
    config = config.replace(", max_participations=None", "")  # no cap: as every run before the cap existed
    if "cohort_tail=" not in config:  # recorded before the floor's quantile was configurable: the default then
        config = re.sub(r"(sampler='\w+', )", rf"\g<1>cohort_tail={COHORT_TAIL!r}, ", config, count=1)
    return f"{run['model']}:" + _VARYING.sub(r"\1=*", config)


def combine(docs: Iterable[tuple[str, Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """The runs of several results.json documents (name, doc) as one list. Refused when their settings
    disagree (other than cohort, seed, epsilons, mechanisms) or a (cohort, seed, setting) appears twice:
    a report takes each measurement once."""
    runs: list[dict[str, Any]] = []
    seen: dict[tuple[int, int, str], str] = {}
    key = None
    for name, doc in docs:
        if not doc.get("runs"):
            raise ValueError(f"{name}: no runs in it")
        for run in doc["runs"]:
            k = settings_key(run)
            if key is None:
                key = k
            elif k != key:
                raise ValueError(f"{name}: its settings differ from the first run's:\n  {k}\n  {key}")
            for setting in run["results"]:
                cell = (run["cohort"], run["seed"], setting)
                if cell in seen:
                    raise ValueError(f"{name}: cohort {cell[0]}, seed {cell[1]}, {setting} is also in {seen[cell]}")
                seen[cell] = name
        runs += [dict(run) for run in doc["runs"]]
    return _merge_by_cell(runs)


def _merge_by_cell(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per (cohort, seed): parts that measured different settings of one cell are joined."""
    out: dict[tuple[int, int], dict[str, Any]] = {}
    for run in runs:
        cell = out.setdefault((run["cohort"], run["seed"]), {**run, "results": {}})
        cell["results"].update(run["results"])
    return list(out.values())


def load_results(paths: Iterable[Path]) -> list[tuple[str, dict[str, Any]]]:
    """(name, results.json) for each run directory or results.json path."""
    out = []
    for p in map(Path, paths):
        f = p / "results.json" if p.is_dir() else p
        if not f.is_file():
            raise FileNotFoundError(f"{p}: no results.json")
        out.append((str(p), json.loads(f.read_text())))
    return out


__all__ = ["CSV_COLUMNS", "KIND_STYLE", "combine", "csv_text", "kind", "load_results", "markdown", "plot_cost",
           "plot_frontier", "settings_key", "summarise"]
