"""Recompute a written ledger's epsilons from what the file records, by dp_accounting and scipy directly.

The check a reviewer runs on a ledger.json: every entry's epsilon is recomputed from its recorded
mechanism, count, delta and sampler, without the ledger's composition code (`dp.ledger`), and every
label ('unit/observer') holding a single entry must report that entry's epsilon. Labels composed of
several entries are counted as `composite` and not recomputed here (none of the examples' ledgers
has one today): the summary says how many, so nothing is passed silently.

Skellam and discrete Gaussian entries use `dp.accounting.skellam_curve` and `discrete_gaussian_curve`,
the RDP curves of the distributed mechanisms (arXiv 2102.06387), because dp_accounting has no event for
them; everything else is dp_accounting's own.

    python -m dp.recompute results/privacy_frontier/RUN/ledger.json [more ...]

prints one line per file and ends with
`recompute ledgers=N entries=N labels=N composite_labels=N max_rel_diff=X noise_records=N mismatches=N`;
the exit status is 1 when any epsilon disagrees (relative tolerance 1e-6), an entry claims amplification
its recorded sampler does not back, or a distributed-DP release's realised noise (recomputed from its
noise record: survivors, colluders, floor, layers removed) differs from the record or falls below the
variance its charges account for; 2 when a file is not a ledger.
"""
from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TOLERANCE = 1e-6


class RecordDisagrees(ValueError):
    """An entry claims amplification its own sampler record does not back: a mismatch, not bad input."""


def recompute_entry(entry: Mapping[str, Any]) -> float:
    """One ledger entry's epsilon from its recorded mechanism, sampler, count and delta."""
    import dp_accounting
    from dp_accounting import rdp
    from scipy import stats

    from dp.accounting import ORDERS, discrete_gaussian_curve, skellam_curve

    m, s, count = entry["mechanism"], entry["sampling"], entry["count"]
    if m["name"] == "non_private":
        return math.inf
    if m["name"] == "no_release":
        return 0.0
    q = m["sampling_rate"]
    if m.get("sample_size") is not None:  # a fixed-size cohort: replace-one, without replacement, no boundary
        if s["scheme"] != "fixed_size" or round(s["rate"] * s["population"]) != m["sample_size"]:
            raise RecordDisagrees(f"a without-replacement entry whose sampler record disagrees: {s}")
        acc = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
        acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.SampledWithoutReplacementDpEvent(
            m["population"], m["sample_size"], dp_accounting.GaussianDpEvent(m["noise_multiplier"])), count))
        return acc.get_epsilon(entry["delta"])
    boundary = 0.0
    if q < 1 and s["min_cohort"] > 0:  # rounds that sampled below the release floor spend delta (dp.sampling)
        if s["scheme"] != "poisson" or s["rate"] != q:
            raise RecordDisagrees(f"an amplified entry whose sampler record disagrees: {s}")
        boundary = count * stats.binom.pmf(s["min_cohort"] - 1, s["population"] - 1, q)
    delta = entry["delta"] - boundary
    if delta <= 0:
        return math.inf
    if m["name"] == "gaussian":
        event = dp_accounting.GaussianDpEvent(m["noise_multiplier"])
        if q < 1:
            event = dp_accounting.PoissonSampledDpEvent(q, event)
        acc = rdp.RdpAccountant()
        acc.compose(dp_accounting.SelfComposedDpEvent(event, count))
        return acc.get_epsilon(delta)
    if m["name"] == "discrete_gaussian":
        curve = count * discrete_gaussian_curve(l1=m["l1_sensitivity"], l2=m["l2_sensitivity"],
                                                local_stddev=m["local_stddev"], n_clients=m["n_clients"],
                                                dim=m["dim"], sampling_rate=q, orders=ORDERS)
        eps, _ = rdp.compute_epsilon(list(ORDERS), list(curve), delta)
        return eps
    if m["name"] != "skellam":
        raise ValueError(f"no recomputation for mechanism {m['name']!r}")
    curve = count * skellam_curve(l1=m["l1_sensitivity"], l2=m["l2_sensitivity"], variance=m["variance"],
                                  sampling_rate=q, orders=ORDERS)
    eps, _ = rdp.compute_epsilon(list(ORDERS), list(curve), delta)
    return eps


def _recorded(value: Any) -> float:
    return math.inf if value == "inf" else float(value)


def _relative(a: float, b: float) -> float:
    if math.isinf(a) or math.isinf(b):
        return 0.0 if a == b else math.inf
    return abs(a - b) / abs(b) if b else abs(a)


@dataclass
class Check:
    """What a recomputation found: counts, the largest relative difference, and each disagreement."""
    ledgers: int = 0
    entries: int = 0
    labels: int = 0
    composite_labels: int = 0
    noise_records: int = 0
    max_rel_diff: float = 0.0
    mismatches: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (f"recompute ledgers={self.ledgers} entries={self.entries} labels={self.labels} "
                f"composite_labels={self.composite_labels} max_rel_diff={self.max_rel_diff:.3g} "
                f"noise_records={self.noise_records} mismatches={len(self.mismatches)}")


def _reports(doc: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(name, ledger report) pairs of a file: one `Ledger.report()`, or a runs document holding several."""
    if "clients" in doc:
        yield "", doc
    elif isinstance(doc.get("runs"), Mapping):
        for name, run in doc["runs"].items():
            yield name, run["ledger"]
    else:
        raise ValueError("neither a ledger report (a 'clients' map) nor a runs document (a 'runs' map)")


def check_document(doc: Mapping[str, Any], *, check: Check | None = None, where: str = "") -> Check:
    """Recompute every entry and every single-entry label of one ledger file's document."""
    check = check or Check()
    cache: dict[str, float] = {}  # identical recorded inputs give identical epsilons: computed once
    check.ledgers += 1
    for name, report in _reports(doc):
        for cid, account in report["clients"].items():
            by_label: dict[str, list[float]] = defaultdict(list)
            for e in account["entries"]:
                key = json.dumps({k: e[k] for k in ("mechanism", "sampling", "count", "delta")}, sort_keys=True)
                if key not in cache:
                    cache[key] = recompute_entry(e)
                got = cache[key]
                diff = _relative(got, _recorded(e["epsilon"]))
                check.entries += 1
                check.max_rel_diff = max(check.max_rel_diff, diff)
                if diff > TOLERANCE:
                    check.mismatches.append(f"{where}{name} client {cid} entry {e['mechanism']['name']}/"
                                            f"{e['observer']}: recorded {e['epsilon']}, recomputed {got}")
                by_label[f"{e['unit']}/{e['observer']}"].append(got)
            for label, recorded in account["epsilon"].items():
                check.labels += 1
                mine = by_label.get(label, [])
                if len(mine) != 1:
                    check.composite_labels += 1
                    continue
                diff = _relative(mine[0], _recorded(recorded))
                check.max_rel_diff = max(check.max_rel_diff, diff)
                if diff > TOLERANCE:
                    check.mismatches.append(f"{where}{name} client {cid} label {label}: recorded {recorded}, "
                                            f"recomputed {mine[0]}")
        _check_noise(report, check, where=f"{where}{name}")
    return check


def realised_variance(record: Mapping[str, Any]) -> float:
    """A release's realised noise variance from the honest survivors, from the record's own parameters:
    each of the survivors - colluders honest survivors keeps V / (floor + layer_index + 1) once layers
    0..layer_index are removed (`dp.xnoise`; no layers: index -1, V / floor); with discrete Gaussian units
    (`units` G > 0) each keeps ceil(floor G / k) units of V / (floor G), k = floor + layer_index + 1; 0 where
    the record removed more layers than exist or than its survivors warrant (the noise fell below the target)."""
    honest = int(record["survivors"]) - int(record["colluders"])
    floor, index, units = int(record["floor"]), int(record["layer_index"]), int(record.get("units", 0))
    if honest < floor or index >= int(record["layers"]) or index > honest - floor - 1:
        return 0.0
    if units:
        return honest * (-(-floor * units // (floor + index + 1))) * float(record["target_variance"]) / (floor * units)
    return honest * float(record["target_variance"]) / (floor + index + 1)


def _check_noise(report: Mapping[str, Any], check: Check, *, where: str) -> None:
    """Each distributed-DP release's realised noise: recomputed, at least the variance its charges
    account for (the Skellam entries' `variance`, the discrete Gaussian ones' n_clients x local_stddev^2, for
    that summary key and round), and as recorded."""
    accounted: dict[tuple[str, int], set[float]] = defaultdict(set)
    for account in report["clients"].values():
        for e in account["entries"]:
            m = e["mechanism"]
            if m["name"] in ("skellam", "discrete_gaussian"):  # the charged central variance
                variance = float(m["variance"]) if m["name"] == "skellam" else float(m["local_stddev"]) ** 2 * int(m["n_clients"])
                for r in e["rounds"]:
                    accounted[(e["summary_key"], int(r))].add(variance)
    for record in report.get("noise", ()):
        check.noise_records += 1
        got = realised_variance(record)
        what = f"{where} noise of {record['summary_key']} round {record['round_id']}"
        if _relative(got, float(record["realised_variance"])) > TOLERANCE:
            check.mismatches.append(f"{what}: recorded realised variance {record['realised_variance']}, recomputed {got}")
        target = float(record["target_variance"])
        if got < target * (1 - TOLERANCE):
            check.mismatches.append(f"{what}: realised variance {got} is below the accounted target {target}")
        charged = accounted.get((record["summary_key"], int(record["round_id"])), set())
        if charged and any(_relative(v, target) > TOLERANCE for v in charged):
            check.mismatches.append(f"{what}: target variance {target} differs from the charged {sorted(charged)}")


def main(argv: Sequence[str] | None = None) -> int:
    import logging

    parser = argparse.ArgumentParser(prog="python -m dp.recompute", description=__doc__.split("\n")[0])
    parser.add_argument("ledgers", nargs="+", type=Path, help="ledger.json files")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.ledgers if not p.is_file()]
    if missing:
        parser.error(f"no such file: {', '.join(missing)}")
    logging.getLogger("absl").setLevel(logging.ERROR)  # dp_accounting warns per order it drops, as the ledger did
    total = Check()
    for path in args.ledgers:
        try:
            one = check_document(json.loads(path.read_text()), where=f"{path}: ")
        except RecordDisagrees as error:  # the file is a ledger; what it claims is not what it recorded
            one = Check(ledgers=1, mismatches=[f"{path}: {error}"])
        except (ValueError, KeyError, TypeError) as error:
            parser.error(f"{path}: not a ledger this check reads ({error})")
        print(f"{path}: {one.line()}", flush=True)
        for k in ("ledgers", "entries", "labels", "composite_labels", "noise_records"):
            setattr(total, k, getattr(total, k) + getattr(one, k))
        total.max_rel_diff = max(total.max_rel_diff, one.max_rel_diff)
        total.mismatches += one.mismatches
    for text in total.mismatches[:20]:
        print("mismatch:", text)
    print(total.line())
    return 1 if total.mismatches else 0


if __name__ == "__main__":
    raise SystemExit(main())
