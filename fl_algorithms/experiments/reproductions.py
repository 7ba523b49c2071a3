"""Every headline claim of the five papers, against what our runs measured: reproduced, refuted or underpowered.

    python -m fl_algorithms.experiments.reproductions --collect RUN_DIR [RUN_DIR ...]   # runs -> ledger -> page
    python -m fl_algorithms.experiments.reproductions --check                          # page current? summary line

`CLAIMS` lists the claims: the paper's section or table, the paper's number (a difference between two
methods, in the metric's points), and whether the paper says one method is ahead ('greater') or that two
match ('match', within a stated margin). A claim is measured as per-seed paired differences (ours − theirs
on the same seed: same split, same initial model), read from a run's `results.json` by the experiment's
extractor (`EXTRACTORS`); `--collect` writes them into the ledger `docs/reproductions.json` (small and
tracked: per-seed numbers, the command, device, date and the training protocol the run declared; the run
directories themselves are not committed) and renders `docs/reproductions.md` from it. A hand-written
`note` per claim (the known cause) is kept across collections.

Verdict from the 95% Student-t interval of the mean paired difference (`verdict`):
    greater: reproduced when the interval lies above 0, refuted when it lies below 0, else underpowered;
    match (margin m): reproduced when the interval lies inside [-m, m], refuted when it lies wholly outside
    it, else underpowered. One seed gives no interval: underpowered.
For an underpowered 'greater' claim the page states the seeds needed for the interval to exclude 0 if the
measured mean and spread held (`seeds_needed`).

`--check` re-renders the page from the ledger, fails when the tracked page differs (stale), and ends with
    reproductions claims=N reproduced=R refuted=F underpowered=U protocol_declared=P
where P counts claims whose measurement ran under a declared training protocol (`TrainingProtocol`
recorded in the run's results.json).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dp.leakage.stats import mean_ci
from fl_algorithms.experiments.tables import fewest_seeds

ROOT = Path(__file__).resolve().parents[2]
LEDGER = ROOT / "docs" / "reproductions.json"
PAGE = ROOT / "docs" / "reproductions.md"
KINDS = ("greater", "match")
VERDICTS = ("reproduced", "refuted", "underpowered")


@dataclass(frozen=True, kw_only=True)
class Claim:
    """One headline claim: `ours` minus `theirs` per seed, against the paper's difference."""

    id: str
    paper: str
    source: str
    """Where the paper states it (table, section) and how its number is computed from that table."""
    claim: str
    kind: str
    paper_value: float
    """The paper's difference, in the metric's points (x 100 for accuracies and ROUGE)."""
    metric: str
    experiment: str
    """The `EXTRACTORS` key of the runs that measure it."""
    ours: str
    theirs: str
    margin: float | None = None
    """'match' only: the half-width of 'the same' in points."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"claim {self.id}: kind must be one of {KINDS}, got {self.kind!r}")
        if (self.kind == "match") != (self.margin is not None and self.margin > 0):
            raise ValueError(f"claim {self.id}: a 'match' claim needs a positive margin, a 'greater' one none")
        if self.kind == "greater" and not self.paper_value > 0:
            raise ValueError(f"claim {self.id}: a 'greater' claim's paper difference must be positive")


FEDNLP = "FedNLP (Lin et al., NAACL Findings 2022)"
FEDMCP = "FedMCP (2024)"
ATC = "ATC (Assign-Then-Contrast, 2023)"
FEDSEIT = "FedSeIT (Chaudhary et al., 2023)"
SELECTKD = "AdaFedSelectKD (Feng et al., 2024)"

CLAIMS: tuple[Claim, ...] = (
    Claim(id="fednlp-fedopt-over-fedavg", paper=FEDNLP, experiment="fednlp_classification",
          source="Table 2, text classification (20News, alpha 1, 100 clients): FedOPT 0.5349, FedAvg 0.5142",
          claim="FedOPT (client AdamW, server SGD with momentum) above FedAvg (SGD) on text classification",
          kind="greater", paper_value=2.07, metric="test accuracy x 100", ours="fedopt", theirs="fedavg"),
    Claim(id="fednlp-fedprox-matches-fedavg", paper=FEDNLP, experiment="fednlp_classification",
          source="Table 2 (FedProx 0.5143, FedAvg 0.5142) and Sec. 4 Q1: 'FedAvg and FedProx perform similarly "
                 "with marginal differences'",
          claim="FedProx matches FedAvg on text classification (within 1 point)",
          kind="match", margin=1.0, paper_value=0.01, metric="test accuracy x 100", ours="fedprox", theirs="fedavg"),
    Claim(id="fedmcp-over-local", paper=FEDMCP, experiment="fedmcp",
          source="Table I, Avg.: FedMCP 85.11, Local 83.58",
          claim="FedMCP above Local training (each client's own adapters, no communication)",
          kind="greater", paper_value=1.53, metric="accuracy x 100, mean over clients", ours="fedmcp",
          theirs="local"),
    Claim(id="fedmcp-over-fedavg-peft", paper=FEDMCP, experiment="fedmcp",
          source="Table I, Avg.: FedMCP 85.11, FedAvg (PEFT) 83.62",
          claim="FedMCP above FedAvg over the same adapters (PEFT)",
          kind="greater", paper_value=1.49, metric="accuracy x 100, mean over clients", ours="fedmcp",
          theirs="fedavg_peft"),
    Claim(id="atc-over-fedavg", paper=ATC, experiment="atc",
          source="Table 2, average: ATC 49.04, FedAvg 45.95",
          claim="ATC above FedAvg on the average over heterogeneous tasks",
          kind="greater", paper_value=3.09, metric="per-dataset metric x 100, averaged", ours="atc_secure",
          theirs="fedavg"),
    Claim(id="atc-over-isolated", paper=ATC, experiment="atc",
          source="Table 2, average: ATC 49.04, Isolated 45.38 (ATC 'outperforms all baselines'; Isolated is the "
                 "no-collaboration one)",
          claim="ATC above Isolated training (each client alone)",
          kind="greater", paper_value=3.66, metric="per-dataset metric x 100, averaged", ours="atc_secure",
          theirs="isolated"),
    Claim(id="fedseit-over-fedweit", paper=FEDSEIT, experiment="fedseit",
          source="Table 2, lambda_2 = 1.0: FedSeIT with SIT (K = 3) minus FedWeIT, mean over its five datasets "
                 "(+11.4, +4.1, +5.4, +3.4, +2.1)",
          claim="FedSeIT with SIT (K = 3) above FedWeIT in final task-averaged accuracy",
          kind="greater", paper_value=5.28, metric="task-averaged test accuracy x 100", ours="fedseit_k3",
          theirs="fedweit"),
    Claim(id="fedseit-sit-matches-all", paper=FEDSEIT, experiment="fedseit",
          source="Table 2, lambda_2 = 1.0: SIT (K = 3) minus without SIT, mean over five datasets (0, +0.1, 0, "
                 "+0.1, +0.1); Sec. 5 (2): 'similar ... while ... reducing the number of parameters'",
          claim="SIT with K = 3 matches FedSeIT without selection (every foreign task) (within 1 point)",
          kind="match", margin=1.0, paper_value=0.06, metric="task-averaged test accuracy x 100",
          ours="fedseit_k3", theirs="fedseit_all"),
    Claim(id="selectkd-over-adafedavg", paper=SELECTKD, experiment="adafedselectkd",
          source="Sec. V-A: 'improving the ROUGE score by approximately 1.2 points'; Table III (BART-large), "
                 "ROUGE-L mean over the three clients: 22.90 against 21.78",
          claim="AdaFedSelectKD above AdaFedAvg (non-IID)",
          kind="greater", paper_value=1.12, metric="ROUGE-L x 100, mean over clients", ours="adafedselectkd",
          theirs="adafedavg"),
    Claim(id="selectkd-over-adafedkd", paper=SELECTKD, experiment="adafedselectkd",
          source="Sec. V-A ('compared with AdaFedKD, our optimized AdaFedSelectKD demonstrates superior "
                 "performance'); Table III (BART-large), ROUGE-L mean over the three clients: 22.90 against 22.40",
          claim="selection helps distillation: AdaFedSelectKD above AdaFedKD (non-IID)",
          kind="greater", paper_value=0.50, metric="ROUGE-L x 100, mean over clients", ours="adafedselectkd",
          theirs="adafedkd"),
)
CLAIM_BY_ID = {c.id: c for c in CLAIMS}


# ---- statistics ------------------------------------------------------------------------------------------
def interval(values: Sequence[float], *, level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high) of the per-seed differences (low/high nan for one seed)."""
    return mean_ci(values, level=level)


def verdict(claim: Claim, values: Sequence[float], *, level: float = 0.95) -> str:
    """'reproduced', 'refuted' or 'underpowered' (module docstring's rule)."""
    if len(values) < 2:
        return "underpowered"
    _, low, high = interval(values, level=level)
    if claim.kind == "greater":
        return "reproduced" if low > 0 else "refuted" if high < 0 else "underpowered"
    m = float(claim.margin)
    return "reproduced" if -m <= low and high <= m else "refuted" if low > m or high < -m else "underpowered"


def seeds_needed(values: Sequence[float], *, level: float = 0.95, cap: int = 1000) -> int | None:
    """Seeds for the t-interval to exclude 0 if the measured mean and sample std held (None: mean 0 or
    fewer than two seeds; `cap` + 1 when more than `cap` would be needed)."""
    if len(values) < 2:
        return None
    mean, _, _ = interval(values, level=level)
    sd = float(np.std(np.asarray(values, dtype=float), ddof=1))
    if mean == 0:
        return None
    if sd == 0:
        return 2
    n = fewest_seeds(sd, half_width=abs(mean), level=level, most=cap)
    return cap + 1 if n is None else n


# ---- extractors: a run directory's results.json -> per-seed values per method ---------------------------
Extractor = Callable[[Mapping[str, Any]], dict[str, dict[int, float]]]
"""results.json -> {method: {seed: score in the claim's points}}."""


def _fednlp_classification(results: Mapping[str, Any]) -> dict[str, dict[int, float]]:
    summary = results["summary"]
    seeds = [int(s) for s in summary["seeds"]]
    return {m: {s: 100 * float(v) for s, v in zip(seeds, entry["final_accuracy_per_seed"])}
            for m, entry in summary["methods"].items()}


def _fedseit(results: Mapping[str, Any]) -> dict[str, dict[int, float]]:
    """examples/fedseit_continual.py: final task-averaged accuracy per method and seed (summary.cells)."""
    return {m: {int(seed): 100 * float(cell["accuracy"]) for seed, cell in by_seed.items()}
            for m, by_seed in results["summary"]["cells"].items()}


def _adafedselectkd(results: Mapping[str, Any]) -> dict[str, dict[int, float]]:
    """examples/adafedselectkd.py: test ROUGE-L in the non-IID setting per method and seed, at the round its
    declared protocol selects (`best_rougeL`: each client's best validation round; else the last round)."""
    out = {}
    for method, by_seed in results["summary"]["per_seed"].get("non_iid", {}).items():
        out[method] = {int(seed): 100 * float(cell["best_rougeL"] if cell.get("selection") == "best validation round"
                                              else cell["rougeL"]) for seed, cell in by_seed.items()}
    return out


def _atc(results: Mapping[str, Any]) -> dict[str, dict[int, float]]:
    """examples/atc_secure.py: the average over the six datasets' metrics per method and seed (per_seed)."""
    out: dict[str, dict[int, float]] = {}
    for seed, methods in results["per_seed"].items():
        for method, cell in methods.items():
            out.setdefault(method, {})[int(seed)] = 100 * float(cell["avg"])
    return out


def _fedmcp(results: Mapping[str, Any]) -> dict[str, dict[int, float]]:
    """examples/fedmcp_secure.py: average test accuracy (already x 100) per method and seed at the declared
    evaluation point (after aggregation; the paper's Table I does not say which, the run reports both)."""
    return {m: {int(seed): float(v) for seed, v in entry["points"]["after_aggregation"]["average_by_seed"].items()}
            for m, entry in results["summary"]["methods"].items() if "points" in entry}


EXTRACTORS: dict[str, Extractor] = {"fednlp_classification": _fednlp_classification, "fedseit": _fedseit,
                                    "adafedselectkd": _adafedselectkd, "atc": _atc, "fedmcp": _fedmcp}
"""Per experiment, its extractor; `detect` names the experiment of a run directory."""


def detect(results: Mapping[str, Any]) -> str:
    """Which experiment wrote this results.json (its `experiment` key, else recognised by its shape)."""
    if "experiment" in results:
        return str(results["experiment"])
    summary = results.get("summary", {})
    if "per_seed" in results and "contrast" in results:
        return "atc"
    if "accuracy_definition" in summary and "methods" in summary:
        return "fednlp_classification"
    if isinstance(summary.get("cells"), Mapping) and any(m.startswith(("fedseit", "fedweit")) for m in summary["cells"]):
        return "fedseit"
    raise ValueError("cannot tell which experiment wrote this results.json (no 'experiment' key)")


def protocols_of(results: Mapping[str, Any]) -> dict[str, Any]:
    """The declared training protocol per method, where the run recorded one."""
    for where in (results.get("summary", {}), results.get("config", {}), results):
        if isinstance(where, Mapping) and isinstance(where.get("training_protocol"), Mapping):
            return dict(where["training_protocol"])
    return {}


def measurement(claim: Claim, scores: Mapping[str, Mapping[int, float]], protocols: Mapping[str, Any],
                *, provenance: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ledger entry of `claim` from one run's scores (None when the run lacks either method)."""
    ours, theirs = scores.get(claim.ours), scores.get(claim.theirs)
    if not ours or not theirs:
        return None
    seeds = sorted(set(ours) & set(theirs))
    if not seeds:
        return None
    declared = {m: protocols.get(m) for m in (claim.ours, claim.theirs)}
    return {"seeds": seeds, "values": [round(ours[s] - theirs[s], 6) for s in seeds],
            "ours": [round(ours[s], 6) for s in seeds], "theirs": [round(theirs[s], 6) for s in seeds],
            "protocol": {m: (p.get("name") if isinstance(p, Mapping) else None) for m, p in declared.items()},
            "protocol_declared": all(isinstance(p, Mapping) and p.get("name") for p in declared.values()),
            **provenance}


def collect(run_dirs: Sequence[Path], ledger: Mapping[str, Any], *,
            command: str | None = None) -> tuple[dict[str, Any], list[str]]:
    """The ledger with every claim the runs measure replaced by their measurement (notes kept). Runs of one
    experiment are pooled by seed (e.g. seeds 0-4 in one run directory and 5-7 in another); a seed measured
    twice, or one method trained under two different protocols, is refused."""
    out, found = {k: dict(v) for k, v in ledger.items()}, []
    pooled: dict[str, dict[str, Any]] = {}
    for run in run_dirs:
        path = Path(run) / "results.json"
        if not path.is_file():
            raise FileNotFoundError(f"{run}: no results.json (not a finished run directory)")
        results = json.loads(path.read_text())
        experiment = detect(results)
        if experiment not in EXTRACTORS:
            raise ValueError(f"{run}: no extractor for experiment {experiment!r}; known: {', '.join(EXTRACTORS)}")
        into = pooled.setdefault(experiment, {"scores": {}, "protocols": {}, "provenance": []})
        for method, by_seed in EXTRACTORS[experiment](results).items():
            mine = into["scores"].setdefault(method, {})
            twice = sorted(set(mine) & set(by_seed))
            if twice:
                raise ValueError(f"{run}: {method} seed(s) {twice} already measured by another run given")
            mine.update(by_seed)
        for method, protocol in protocols_of(results).items():
            seen = into["protocols"].setdefault(method, protocol)
            if _name(seen) != _name(protocol):
                raise ValueError(f"{run}: {method} ran under protocol {_name(protocol)!r} here and {_name(seen)!r} "
                                 f"in another run given")
            differ = _differing(seen, protocol)
            if differ:
                raise ValueError(f"{run}: {method} ran protocol {_name(protocol)!r} with other settings than in another "
                                 f"run given ({', '.join(differ)}): seeds of different settings are not pooled")
        into["provenance"].append({**{k: results.get("provenance", {}).get(k) for k in ("command", "device", "date")},
                                   "run": str(Path(run))})
    for experiment, into in pooled.items():
        runs = into["provenance"]
        provenance = {key: "; ".join(dict.fromkeys(str(r[key]) for r in runs if r.get(key))) or None
                      for key in ("command", "device", "date", "run")}
        if command:  # the runs' own command lines were continuations (--resume): the caller names the first
            provenance["command"] = command
        for claim in (c for c in CLAIMS if c.experiment == experiment):
            entry = measurement(claim, into["scores"], into["protocols"], provenance=provenance)
            if entry is not None:
                entry["note"] = out.get(claim.id, {}).get("note", "")
                for key in ("command", "device", "date"):  # a run without provenance keeps the ledger's
                    entry[key] = entry.get(key) or out.get(claim.id, {}).get(key)
                out[claim.id] = entry
                found.append(claim.id)
    return out, found


def _name(protocol: Any) -> str | None:
    return protocol.get("name") if isinstance(protocol, Mapping) else None


def _differing(a: Any, b: Any) -> list[str]:
    """The settings two declared protocols of one name differ in (optimiser and its lr, lifetime, schedule,
    clipping, local work, evaluation, selection, precision); their citations and stated reasons, which are
    prose and may be reworded between runs, are not compared."""
    if not (isinstance(a, Mapping) and isinstance(b, Mapping)):
        return []
    keys = sorted((set(a) | set(b)) - {"cite"})
    return [k for k in keys if not k.endswith("_reason") and a.get(k) != b.get(k)]


# ---- the page ---------------------------------------------------------------------------------------------
def _fmt(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:+.2f}"


def rows(ledger: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per claim: its measurement (if any), the interval, the verdict and the seeds needed."""
    out = []
    for claim in CLAIMS:
        entry = ledger.get(claim.id)
        values = list(entry["values"]) if entry else []
        mean, low, high = interval(values) if values else (math.nan, math.nan, math.nan)
        out.append({"claim": claim, "entry": entry or {}, "n": len(values), "mean": mean, "low": low,
                    "high": high, "verdict": verdict(claim, values),
                    "needed": seeds_needed(values) if claim.kind == "greater" else None,
                    "declared": bool(entry and entry.get("protocol_declared"))})
    return out


def summary_line(table: Sequence[Mapping[str, Any]]) -> str:
    count = {v: sum(r["verdict"] == v for r in table) for v in VERDICTS}
    return (f"reproductions claims={len(table)} reproduced={count['reproduced']} refuted={count['refuted']} "
            f"underpowered={count['underpowered']} protocol_declared={sum(r['declared'] for r in table)}")


def render(ledger: Mapping[str, Any]) -> str:
    """docs/reproductions.md from the ledger (deterministic: `--check` compares it with the tracked page)."""
    table = rows(ledger)
    lines = [
        "# Reproductions: every headline claim against our runs",
        "",
        "Generated by `python -m fl_algorithms.experiments.reproductions --collect RUN_DIR...` from run records "
        "(their per-seed numbers are kept in [reproductions.json](reproductions.json)); do not edit by hand. "
        "`--check` re-renders it and fails when it is stale.",
        "",
        "Each claim is a difference between two methods of one paper, in the metric's points. Ours is the mean of "
        "per-seed paired differences (same seed: same split, same initial model) with its 95% Student-t interval. "
        "Verdict: **reproduced** when the interval lies on the paper's side of 0 (for a 'match' claim: inside "
        "the stated margin), **refuted** when it lies wholly on the other side (outside the margin), "
        "**underpowered** otherwise; one seed gives no interval. 'Seeds to decide' (a 'greater' claim) is the number "
        "of seeds at which the interval would exclude 0, on whichever side, if the measured mean and spread held. "
        "Our settings are stand-ins at CPU scale "
        "(offline corpora and a frozen MiniLM, [simplifications.md](simplifications.md)); each run's declared "
        "training protocol is in [protocols.md](protocols.md) and in its records.",
        "",
        "| # | paper | claim | paper | ours [95% CI] | seeds | verdict | seeds to decide | protocol | device, date |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(table, start=1):
        c, e = r["claim"], r["entry"]
        ours = "not measured" if not r["n"] else f"{_fmt(r['mean'])} [{_fmt(r['low'])}, {_fmt(r['high'])}]"
        margin = f" (match: within ±{c.margin:g})" if c.kind == "match" else ""
        protocols = sorted({str(p) for p in (e.get("protocol") or {}).values()}) if e else []
        lines.append(f"| {i} | {c.paper} | {c.claim}{margin} | {c.paper_value:+.2f} | {ours} | {r['n']} | "
                     f"**{r['verdict']}** | {'' if r['needed'] is None else r['needed']} | "
                     f"{', '.join(protocols) if r['declared'] else 'not declared'} | "
                     f"{e.get('device') or '?'}, {e.get('date') or '?'} |")
    lines += ["", "## Each claim: source, measurement, known cause", ""]
    for i, r in enumerate(table, start=1):
        c, e = r["claim"], r["entry"]
        lines.append(f"**{i}. {c.claim}** ({c.id}). Paper: {c.source}. Metric: {c.metric}; ours − theirs = "
                     f"`{c.ours}` − `{c.theirs}`.")
        if r["n"]:
            per_seed = ", ".join(f"seed {s}: {v:+.2f}" for s, v in zip(e["seeds"], e["values"]))
            lines.append(f"Measured: {per_seed}. Command: `{e.get('command') or '?'}` ({e.get('device') or '?'}, "
                         f"{e.get('date') or '?'}).")
        if e.get("note"):
            lines.append(f"Cause, where known: {e['note']}")
        lines.append("")
    lines += ["```", summary_line(table), "```", ""]
    return "\n".join(lines)


def load_ledger(path: Path = LEDGER) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    unknown = sorted(set(data) - set(CLAIM_BY_ID))
    if unknown:
        raise ValueError(f"{path}: entries for unknown claims {unknown}")
    return data


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--collect", nargs="+", metavar="RUN_DIR", type=Path,
                        help="read these run directories' results.json into the ledger, then render the page")
    parser.add_argument("--command", metavar="TEXT",
                        help="with --collect: the command that made the runs, when their records name a --resume")
    parser.add_argument("--check", action="store_true",
                        help="fail when docs/reproductions.md is not the ledger's rendering; print the summary line")
    parser.add_argument("--ledger", type=Path, default=LEDGER, help=f"the ledger (default {LEDGER.relative_to(ROOT)})")
    parser.add_argument("--page", type=Path, default=PAGE, help=f"the page (default {PAGE.relative_to(ROOT)})")
    args = parser.parse_args(argv)
    try:
        ledger = load_ledger(args.ledger)
        if args.collect:
            ledger, found = collect(args.collect, ledger, command=args.command)
            if not found:
                parser.error("the run directories measure none of the claims")
            args.ledger.write_text(json.dumps(ledger, indent=1, sort_keys=True) + "\n")
            print(f"collected {len(found)} claim(s): {', '.join(sorted(set(found)))}")
    except (FileNotFoundError, ValueError, KeyError) as error:
        parser.error(str(error))
    page = render(ledger)
    if args.check:
        if not args.page.is_file() or args.page.read_text() != page:
            print(f"{args.page} is stale: run `python -m fl_algorithms.experiments.reproductions --collect ...` "
                  f"or without --check to re-render it", file=sys.stderr)
            print(summary_line(rows(ledger)))
            return 1
    else:
        args.page.write_text(page)
    print(summary_line(rows(ledger)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
