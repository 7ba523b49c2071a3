"""The measurement pipeline: every leakage number of a run, computed from the server's view alone.

Given what the server received (a `Transcript`, optionally exported and reloaded so that exactly the
exported view is measured), the clients' true token sets and the per-example losses of the final
model, `measure_leakage` runs

- token-set recovery from embedding rows (support / two-sided row-norm test / top-k with the true k,
  an oracle upper bound) on every view the transcript holds: each client's upload (individual view)
  or the cohort's mean (aggregate view); precision, recall, F1 and the advantage over chance,
  (F1 - chance) / (1 - chance) (naming every token has F1 > 0 but no advantage);
- the attribution of client-unique tokens: the cross-round intersection attack on aggregates, or the
  tokens read from a client's own uploads on individual views;
- recoverability: whose update is determined by what the server received (per round), and whose
  vector would be if it were the same every round (rank test over rounds);
- membership inference (LOSS threshold) on the final model;
- the ledger's epsilon per (unit, observer), max over clients;

and collects the headline numbers in a `LeakageReport`.

Oracle versus attacker. The token numbers above pick the best detector WITH the ground truth and
give top-k the true k: an upper bound ('oracle'). Given `shadow` views (updates or cohort means the
attacker simulated itself from public data, with known token sets), `measure_leakage` also runs
what an adversary can actually run: a `TokenAttack` calibrated on the shadow views
(`dp.leakage.calibration`) applied unchanged to the real views, and, on aggregates, the
differencing attack (`dp.leakage.differencing`), which uses the released values and so feels the
DP noise. The headline `realistic_advantage` is the max over those; `oracle_advantage` sits beside.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from dp.leakage.calibration import RowStats, TokenAttack, calibrate_token_attack
from dp.leakage.differencing import differencing_attack
from dp.leakage.intersection import attribute_tokens, score_attribution
from dp.leakage.membership import loss_threshold_attack
from dp.leakage.recoverability import recoverable_clients
from dp.leakage.report import LeakageReport
from dp.leakage.stats import advantage_over_chance, token_advantage
from dp.leakage.token_recovery import TokenScores, mean_scores, recover_tokens, score_tokens
from dp.leakage.transcript import Transcript
from dp.ledger import Ledger

ATTACKS = ("support", "two_sided", "top_k")
"""The token-recovery attacks run on every view (top_k with the true k: an oracle upper bound)."""


def _scores(vec: np.ndarray, truth: frozenset[int], *, shape: tuple[int, int]
            ) -> dict[str, tuple[frozenset[int], TokenScores]]:
    """(recovered set, TokenScores) of every attack on one embedding update."""
    out = {}
    for method in ATTACKS:
        got = recover_tokens(vec, shape=shape, method=method, k=len(truth) if method == "top_k" else None)
        out[method] = (got, score_tokens(got, truth, vocab_size=shape[0]))
    return out


def _hmean(a: float, b: float) -> float:
    return 2 * a * b / (a + b) if a + b > 0 else 0.0


def _summarise(per: Mapping[str, list[TokenScores]]) -> dict[str, Any]:
    means = {m: mean_scores(v) for m, v in per.items()}
    best = max(ATTACKS, key=lambda m: means[m].f1)
    adv = {m: token_advantage(means[m].f1, means[m].chance_f1) for m in ATTACKS}
    top = max(ATTACKS, key=adv.get)
    return {"best_method": best, **asdict(means[best]), "advantage": adv[top], "advantage_method": top,
            "methods": {m: {**asdict(s), "advantage": adv[m]} for m, s in means.items()}}


def _pick(attack: str, scores: Mapping[str, Mapping[str, float]], private_tokens: int) -> dict[str, Any]:
    """The method whose attribution has the best F1 of rate (recall of client-unique tokens) and
    precision: attributing every token to someone must not count as success."""
    best = max(ATTACKS, key=lambda m: _hmean(scores[m]["rate"], scores[m]["precision"]))
    return {"attack": attack, "method": best, "rate": scores[best]["rate"], "precision": scores[best]["precision"],
            "methods": dict(scores), "private_tokens": private_tokens}


def token_leakage(transcript: Transcript, *, part: str, truth: Mapping[int, frozenset[int]],
                  shape: tuple[int, int]) -> dict[str, Any]:
    """Token-set recovery on every view of the embedding `part` (a V x D matrix, `shape`) the
    transcript holds, and the attribution of client-unique tokens; `truth` maps every client to
    its training token set. ``result['server_view']`` names the view the server had."""
    holders: dict[int, int] = {}
    for toks in truth.values():
        for x in toks:
            holders[x] = holders.get(x, 0) + 1
    private = {c: frozenset(x for x in toks if holders[x] == 1) for c, toks in truth.items()}
    n_private = sum(len(p) for p in private.values())
    result: dict[str, Any] = {}

    indiv: dict[str, list[TokenScores]] = {m: [] for m in ATTACKS}
    claimed = {m: {c: set() for c in truth} for m in ATTACKS}  # individual view: tokens read from c's uploads
    agg: dict[str, list[TokenScores]] = {m: [] for m in ATTACKS}
    agg_sets: dict[str, dict[int, frozenset[int]]] = {m: {} for m in ATTACKS}
    cohorts = {}
    for t in transcript.rounds:
        for c, vec in transcript.individuals(t, part).items():
            for m, (got, s) in _scores(vec, truth[c], shape=shape).items():
                indiv[m].append(s)
                claimed[m][c] |= got
        rec = transcript.aggregate(t, part)
        if rec is not None:
            union = frozenset().union(*(truth[c] for c in rec.contributors))
            cohorts[t] = rec.contributors
            for m, (got, s) in _scores(rec.mean, union, shape=shape).items():
                agg[m].append(s)
                agg_sets[m][t] = got

    if any(indiv.values()):
        view = _summarise(indiv)
        scores = {}
        for m in ATTACKS:
            attributed = sum(len(claimed[m][c]) for c in truth)
            right = sum(len(claimed[m][c] & truth[c]) for c in truth)
            correct = sum(len(claimed[m][c] & private[c]) for c in truth)
            scores[m] = {"rate": correct / n_private if n_private else 0.0, "attributed": attributed,
                         "correct": correct, "precision": right / attributed if attributed else 1.0}
        view["attribution"] = _pick("own uploads", scores, n_private)
        result["individual"] = view
    if any(agg.values()):
        view = _summarise(agg)
        scores = {m: asdict(score_attribution(attribute_tokens(agg_sets[m], cohorts, clients=truth), truth))
                  for m in ATTACKS}
        view["attribution"] = _pick("cross-round intersection", scores, n_private)
        result["aggregate"] = view
    result["server_view"] = "individual" if "individual" in result else "aggregate"
    return result


def recoverable_updates(transcript: Transcript, clients: Sequence[int], *, part: str) -> dict[str, Any]:
    """Clients whose update of `part` is determined by what the server received: in the same round
    (each round's update is a fresh vector), and across rounds if the vector were fixed (rank test)."""
    per_round: set[int] = set()
    releases: list[tuple[int, ...]] = []
    for t in transcript.rounds:
        rel = [(c,) for c in transcript.individuals(t, part)]
        rec = transcript.aggregate(t, part)
        if rec is not None:
            rel.append(rec.contributors)
        if rel:
            per_round |= set(recoverable_clients(rel, clients=clients).exposed)
            releases += rel
    fixed = recoverable_clients(releases, clients=clients) if releases else None
    return {"per_round": len(per_round), "per_round_fraction": len(per_round) / len(clients),
            "if_fixed": fixed.count if fixed else 0, "if_fixed_fraction": fixed.fraction if fixed else 0.0,
            "rank": fixed.rank if fixed else 0, "releases": len(releases)}


def ledger_epsilons(ledger: Ledger) -> dict[str, float]:
    """Max over clients of each (unit/observer) epsilon the ledger reports."""
    out: dict[str, float] = {}
    for c in ledger.clients():
        for unit, observer in ledger.labels(c):
            key = f"{unit.value}/{observer.value}"
            out[key] = max(out.get(key, 0.0), ledger.epsilon(c, unit=unit, observer=observer))
    return out


def json_epsilon(value: float) -> float | str:
    """An epsilon for JSON: infinity (no privacy) becomes the string 'inf'."""
    return value if math.isfinite(value) else "inf"


SHADOW_KINDS = ("individual", "aggregate", "differencing")
"""Keys of `measure_leakage(shadow=...)`: shadow individual updates, shadow cohort means (same noise
mechanism as the real aggregates), shadow differencing estimates (`simulate_differencing_shadow`)."""

ShadowViews = Sequence[tuple["np.ndarray | RowStats", frozenset[int]]]


def realistic_token_leakage(transcript: Transcript, *, part: str, truth: Mapping[int, frozenset[int]],
                            attack: TokenAttack, view: str) -> dict[str, Any]:
    """A calibrated `TokenAttack` applied unchanged to every real view of one kind.

    `view` 'individual': each client's upload, scored against its token set; 'aggregate': each
    round's mean, scored against the union of its contributors. Macro averages over views; the
    advantage is that of the mean F1 over the mean chance F1 (as for the oracle).
    """
    if view not in ("individual", "aggregate"):
        raise ValueError("view is 'individual' or 'aggregate'")
    scores: list[TokenScores] = []
    for t in transcript.rounds:
        if view == "individual":
            for c, vec in transcript.individuals(t, part).items():
                scores.append(attack.score(vec, truth[c]))
        else:
            rec = transcript.aggregate(t, part)
            if rec is not None:
                scores.append(attack.score(rec.mean, frozenset().union(*(truth[c] for c in rec.contributors))))
    if not scores:
        raise ValueError(f"the transcript has no {view} views of '{part}'")
    avg = mean_scores(scores)
    return {"method": attack.method, "parameter": attack.parameter, "k": attack.k, "calibrated_on": view,
            "shadow_score": attack.shadow_score, "shadow_f1": attack.shadow_f1, "n_shadow": attack.n_shadow,
            "views": len(scores), "precision": avg.precision, "recall": avg.recall, "f1": avg.f1,
            "chance_f1": avg.chance_f1, "advantage": advantage_over_chance(avg.f1, avg.chance_f1)}


def oracle_summary(view: Mapping[str, Any]) -> dict[str, Any]:
    """The best-of-detectors numbers of one `token_leakage` view (chosen with the truth, top-k told
    the true k): an upper bound on any attacker, reported beside the realistic attack."""
    return {"method": view["advantage_method"], "advantage": view["advantage"], "best_f1_method": view["best_method"],
            "precision": view["precision"], "recall": view["recall"], "f1": view["f1"], "chance_f1": view["chance_f1"]}


def _check_shadow(shadow: Mapping[str, ShadowViews]) -> None:
    unknown = set(shadow) - set(SHADOW_KINDS)
    if unknown:
        raise ValueError(f"unknown shadow kinds {sorted(unknown)}; use {SHADOW_KINDS}")


def measure_leakage(transcript: Transcript, *, embedding_part: str, vector_part: str,
                    truth: Mapping[int, frozenset[int]], shape: tuple[int, int], member_losses: np.ndarray,
                    nonmember_losses: np.ndarray, ledger: Ledger, unit: str,
                    export: str | Path | None = None, shadow: Mapping[str, ShadowViews] | None = None,
                    true_updates: Mapping[int, np.ndarray] | None = None, ridge: float = 1e-6) -> dict[str, Any]:
    """Every leakage number of one run (see the module docstring).

    `embedding_part` is the uploaded V x D embedding the token attacks read, `vector_part` the part
    whose recoverability is tested, `truth` every client's training token set, `unit` the privacy
    unit of the headline epsilon ('client' or 'example', against the server). With `export`, the
    transcript is saved under that stem and reloaded first: measured is exactly what was exported.

    `shadow` (optional) maps kinds in `SHADOW_KINDS` to (view, token set) pairs the attacker
    simulated: 'individual' calibrates the token attack on individual views (and, failing
    'differencing', the differencing attacker), 'aggregate' the one on cohort means, 'differencing'
    the differencing attacker. `true_updates` (optional): each client's true mean update of
    `embedding_part`, for the differencing cosine; `ridge`: the differencing estimator's ridge.

    Membership: `member_losses` and `nonmember_losses` must come from the SAME clients (each
    client's data split into trained-on and held-out examples); with non-members from other
    clients the attack partly measures the client shift instead of membership. Reported: AUC, TPR
    at 1% and 0.1% FPR (the latter needs about 1000 non-members to mean anything).

    Keys: token_f1, token_chance_f1, token_advantage (the oracle view's; kept for older callers),
    tokens, recoverability, membership, epsilon, epsilon_unit, report, and token_oracle,
    oracle_advantage, token_realistic, differencing, realistic_advantage, realistic_attack.
    Without `shadow`, realistic_advantage and realistic_attack are None and token_realistic and
    differencing hold {'skipped': reason}; so do they when their shadow kind or the aggregates are missing.
    """
    if shadow is not None:
        _check_shadow(shadow)
    if export is not None:
        transcript.save(export)
        transcript = Transcript.load(export)
    tokens = token_leakage(transcript, part=embedding_part, truth=truth, shape=shape)
    server_view = tokens["server_view"]
    view = tokens[server_view]
    oracle = oracle_summary(view)

    calibrated: dict[str, TokenAttack] = {}

    def attack_for(kind: str) -> TokenAttack:
        if kind not in calibrated:
            calibrated[kind] = calibrate_token_attack(shadow[kind], shape=shape)
        return calibrated[kind]

    realistic: dict[str, Any]
    if shadow is None:
        realistic = {"skipped": "no shadow views given (shadow=None)"}
    elif server_view not in shadow:
        realistic = {"skipped": f"no shadow views of kind '{server_view}' (the server's view)"}
    else:
        realistic = realistic_token_leakage(transcript, part=embedding_part, truth=truth,
                                            attack=attack_for(server_view), view=server_view)

    differencing: dict[str, Any]
    source = next((k for k in ("differencing", "individual") if shadow is not None and k in shadow), None)
    if not transcript.aggregates(embedding_part):
        differencing = {"skipped": f"the transcript has no aggregates of '{embedding_part}'"}
    elif shadow is None:
        differencing = {"skipped": "no shadow views given (shadow=None)"}
    elif source is None:
        differencing = {"skipped": "no shadow estimates ('differencing') or individual updates to calibrate on"}
    else:
        attack = attack_for(source)  # a bad shadow set is the caller's error: raise, do not skip
        try:
            scores = differencing_attack(transcript, part=embedding_part, truth=truth, shape=shape,
                                         attack=attack, true_updates=true_updates, ridge=ridge)
            differencing = {**scores.to_dict(), "calibrated_on": source,
                            "counts_in_headline": server_view == "aggregate"}
        except ValueError as err:
            differencing = {"skipped": str(err)}

    candidates = {}
    if "advantage" in realistic:
        candidates["token_recovery"] = realistic["advantage"]
    if differencing.get("counts_in_headline"):
        candidates["differencing"] = differencing["advantage"]
    realistic_attack = max(candidates, key=candidates.get) if candidates else None
    realistic_advantage = candidates[realistic_attack] if realistic_attack else None

    rec = recoverable_updates(transcript, sorted(truth), part=vector_part)
    mia = asdict(loss_threshold_attack(member_losses, nonmember_losses))
    eps = ledger_epsilons(ledger)
    report = LeakageReport(
        server_view="plain" if server_view == "individual" else "secure",
        token_precision=view["precision"], token_recall=view["recall"], token_f1=view["f1"],
        token_chance_f1=view["chance_f1"], intersection_attribution_rate=view["attribution"]["rate"],
        realistic_advantage=realistic_advantage, oracle_advantage=view["advantage"],
        mia_auc=mia["auc"], mia_tpr_at_1pct_fpr=mia["tpr_at_1pct_fpr"], mia_tpr_at_01pct_fpr=mia["tpr_at_01pct_fpr"],
        recoverable_clients=rec["per_round"], recoverable_fraction=rec["per_round_fraction"],
        epsilon=eps.get(f"{unit}/server"))
    return {"token_f1": view["f1"], "token_chance_f1": view["chance_f1"], "token_advantage": view["advantage"],
            "tokens": tokens, "recoverability": rec, "membership": mia,
            "epsilon": {k: json_epsilon(v) for k, v in eps.items()}, "epsilon_unit": unit,
            "token_oracle": oracle, "oracle_advantage": view["advantage"], "token_realistic": realistic,
            "differencing": differencing, "realistic_advantage": realistic_advantage,
            "realistic_attack": realistic_attack, "report": report.to_dict()}


__all__ = ["ATTACKS", "SHADOW_KINDS", "token_advantage", "advantage_over_chance", "token_leakage",
           "realistic_token_leakage", "oracle_summary", "recoverable_updates", "ledger_epsilons", "json_epsilon",
           "measure_leakage"]
