"""Accuracy against measured leakage: plaintext, SecAgg+, SecAgg+ with distributed DP, local DP-SGD.

    python examples/privacy_frontier.py --quick      # 20 clients, 8 rounds: < 10 min on 2 cores
    python examples/privacy_frontier.py              # 40 clients, all 12.7k snippets, 20 rounds

One task (examples/_frontier_task.py: a bag-of-token-embeddings sentiment classifier on Rotten
Tomatoes, V = 30,522 trainable embedding rows, clients = groups of movies, FedAvg with plain-SGD
clients), one cohort schedule (same seed, so every setting samples the same cohorts), six settings:

| setting   | upload                                   | server sees                              |
|-----------|------------------------------------------|------------------------------------------|
| plain     | the update (protocol 'plain')            | every client's update                    |
| secagg    | the update, SecAgg+ masked               | the cohort's exact (weighted) mean       |
| ddp_epsX  | clipped to C, Skellam noise, SecAgg+     | a noisy mean, client-level DP at eps X   |
| dpsgd     | Opacus DP-SGD update (protocol 'plain')  | every client's update, example-level DP  |

Every run records what the server actually received (`dp.leakage.Transcript`), saves it to disk,
reloads it and measures leakage on the reloaded copy only:
- token-set recovery from the embedding rows (support / two-sided row-norm test / top-k with the
  true k, an oracle upper bound); precision, recall, F1 against the true token set of the client
  (individual view) or of the union of the cohort (aggregate view); the best F1 and the best
  advantage over chance, (F1 - chance) / (1 - chance), are reported (naming every token has F1 > 0
  but no advantage);
- the cross-round intersection attack (aggregate views): client-unique tokens pinned to their owner;
  for individual views, the client-unique tokens recovered from their owner's own uploads;
- membership inference (LOSS threshold) on the final global model: members = training snippets of
  clients that took part, non-members = every client's held-out snippets; AUC and TPR at 1% FPR;
- recoverable clients: whose update of some round is determined by what the server received
  (per round), and whose vector would be if it were the same every round (rank test over rounds);
- epsilon, max over clients, from the run's ledger (ledger.json lists every client's mechanisms).

Outputs under results/privacy_frontier/<run>/: table.txt, results.json (config, per-round records,
every number above per attack), accuracy_vs_leakage.png, ledger.json (all settings), and per
setting <setting>/ledger.json and <setting>/transcript.{npz,json}. Transcripts are large where
the view is dense noise (--quick: ~40 MB per DDP setting, ~80 MB for DP-SGD; the full run about
5x that): --no-transcripts measures on the in-memory transcript instead.

Choices, stated (none tuned per setting; research/dp_leakage.md Sec. 1.5, 2, 4.2):
- Distributed DP: client-level unit, each client's whole update clipped to C = 1.0 (fixed before the
  sweep; round-1 update norms in development runs had median ~1.5, so most clients are clipped),
  Skellam noise, 20-bit modulus, noise calibrated to n_min = cohort (no dropouts). The target
  epsilon holds against the SERVER (it picks and knows the cohort: no amplification), for a client
  that takes part in every round (rounds = R): every client's server epsilon is <= the target.
  The outsider epsilon (sees only the released models; Poisson amplification at q = cohort /
  clients) is reported too. --target-observer outsider calibrates to the outsider instead.
- DP-SGD: example-level unit, target epsilon 8 for a client sampled in every round, C = 1.0 per
  example, expected batch 16 (Poisson), same SGD learning rate and local epochs as the others. Run
  over the 'plain' protocol so its guarantee is measured against the strongest view.
- FedAvg: 5 local epochs of SGD (lr 1.0, batch 16), server learning rate 1.
- The model has 488k parameters and the cohort is 5-10 clients: client-level DP noise per coordinate
  of the mean is z C / cohort, which is large next to the weights. Expect DP settings to lose most
  of the accuracy; that is the measured frontier, not a bug.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(REPO))
if str(REPO / "examples") not in sys.path:
    sys.path.insert(0, str(REPO / "examples"))

from nlp_models._offline import ensure_offline  # noqa: E402

ensure_offline()

import numpy as np  # noqa: E402
import torch  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

from _frontier_task import (EMBEDDING_PART, HEAD_PART, FrontierTask, FrontierTaskConfig,  # noqa: E402
                            build_dp_trainers, build_trainers, example_losses, load_frontier_task)
from dp.distributed import DistributedDPConfig  # noqa: E402
from dp.leakage import (LeakageReport, Transcript, attribute_tokens, loss_threshold_attack, mean_scores,  # noqa: E402
                        recover_tokens, recoverable_clients, score_attribution, score_tokens)
from dp.ledger import Ledger, LedgerConfig, NonPrivateMechanism, Observer, PrivacyUnit  # noqa: E402
from dp.opacus_client import DPSGDConfig, calibrate_noise_multiplier  # noqa: E402
from fl_algorithms.algorithms.fedavg import FedAvg  # noqa: E402
from fl_algorithms.experiments.results import write_results  # noqa: E402
from fl_algorithms.engine.sim import RoundRecord, RunConfig, SimulationRunner  # noqa: E402
from fl_algorithms.engine.secure_sum import SecureAggregationConfig  # noqa: E402

DEFAULT_OUT = REPO / "results" / "privacy_frontier"
ATTACKS = ("support", "two_sided", "top_k")
LEDGERS_FORMAT = "fedsecure-nlp/privacy-frontier-ledgers/v1"


@dataclass(frozen=True)
class Setting:
    name: str
    label: str
    protocol: str
    ddp_epsilon: float | None = None
    dpsgd: bool = False


@dataclass(frozen=True)
class FrontierConfig:
    task: FrontierTaskConfig = field(default_factory=FrontierTaskConfig)
    rounds: int = 20
    cohort: int = 10
    local_epochs: int = 5
    epsilons: tuple[float, ...] = (1.0, 4.0, 8.0)
    ddp_clip: float = 1.0
    ddp_bits: int = 20
    target_observer: str = "server"
    dpsgd_epsilon: float = 8.0
    dpsgd_clip: float = 1.0
    delta: float = 1e-5
    secure_clip: float = 4.0
    """Per-coordinate range of the fixed-point encoding (non-DP secure sums); clipped values are counted."""
    save_transcripts: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rounds < 1 or self.local_epochs < 1:
            raise ValueError("rounds and local_epochs must be positive")
        if not 2 <= self.cohort <= self.task.num_clients:
            raise ValueError("need 2 <= cohort <= clients")
        if self.target_observer not in ("server", "outsider"):
            raise ValueError("target_observer is 'server' or 'outsider'")

    def settings(self) -> list[Setting]:
        out = [Setting("plain", "plaintext", "plain"), Setting("secagg", "SecAgg+", "secagg+")]
        out += [Setting(f"ddp_eps{e:g}", f"SecAgg+ + DDP eps={e:g}", "secagg+", ddp_epsilon=e) for e in self.epsilons]
        out.append(Setting("dpsgd", f"DP-SGD eps={self.dpsgd_epsilon:g}", "plain", dpsgd=True))
        return out


# ---- running one setting ---------------------------------------------------------------------------

@dataclass
class RunOutput:
    setting: Setting
    history: list[RoundRecord]
    final: dict[str, np.ndarray]
    ledger: Ledger
    transcript: Transcript
    seconds: float
    ddp_plan: dict[str, Any] | None = None
    dpsgd_noise_multiplier: list[float] | None = None
    """The distinct noise multipliers of the DP-SGD clients (one per distinct local dataset size)."""


def ddp_config(cfg: FrontierConfig, epsilon: float) -> DistributedDPConfig:
    n = cfg.task.num_clients
    return DistributedDPConfig(l2_clip=cfg.ddp_clip, target_epsilon=epsilon, delta=cfg.delta,
                               expected_clients=cfg.cohort, min_clients=cfg.cohort, bits=cfg.ddp_bits,
                               rounds=cfg.rounds, sampling_rate=cfg.cohort / n, target_observer=cfg.target_observer)


@lru_cache(maxsize=64)
def _dpsgd_z(target: float, delta: float, batches: int, steps: int) -> float:
    return calibrate_noise_multiplier(target_epsilon=target, delta=delta, sample_rate=1.0 / batches, steps=steps)


def dpsgd_trainers(task: FrontierTask, cfg: FrontierConfig, ledger: Ledger) -> tuple[dict[int, Any], dict[int, float]]:
    """DP-SGD clients, z calibrated once per distinct loader length (the same z Opacus' client would
    solve for with target_epsilon: planned_rounds = R participations x local epochs x batches)."""
    configs, zs = {}, {}
    bs = task.config.batch_size
    for c, data in task.clients.items():
        batches = math.ceil(len(data.train) / bs)
        zs[c] = _dpsgd_z(cfg.dpsgd_epsilon, cfg.delta, batches, cfg.rounds * cfg.local_epochs * batches)
        configs[c] = DPSGDConfig(max_grad_norm=cfg.dpsgd_clip, noise_multiplier=zs[c], delta=cfg.delta, batch_size=bs,
                                 local_epochs=cfg.local_epochs, planned_rounds=cfg.rounds,
                                 grad_sample_mode="ghost")
    return build_dp_trainers(task, dp_config=configs, ledger=ledger), zs


def run_setting(setting: Setting, task: FrontierTask, cfg: FrontierConfig, *, progress: bool) -> RunOutput:
    ledger = Ledger(LedgerConfig(delta=cfg.delta))
    transcript = Transcript(protocol=setting.protocol, dtype="float32")
    zs = None
    if setting.dpsgd:
        trainers, zs = dpsgd_trainers(task, cfg, ledger)
    else:
        trainers = build_trainers(task)
    ddp = ddp_config(cfg, setting.ddp_epsilon) if setting.ddp_epsilon is not None else None
    secure = SecureAggregationConfig(protocol=setting.protocol, clip=cfg.secure_clip,
                                     max_weight=float(max(len(d.train) for d in task.clients.values())),
                                     max_clients=task.config.num_clients, distributed_dp=ddp)
    run = RunConfig(rounds=cfg.rounds, clients_per_round=cfg.cohort, seed=cfg.seed, secure=secure)
    runner = SimulationRunner(algorithm=FedAvg(local_epochs=cfg.local_epochs), trainers=trainers, config=run,
                              initial=task.initial, ledger=ledger, transcript=transcript)
    dim = sum(v.size for v in task.initial.values())

    def on_round(rec: RoundRecord) -> None:
        if ddp is None and not setting.dpsgd:
            seen = ("plaintext upload: the server reads the client's update" if setting.protocol == "plain"
                    else "secure sum without noise: the server reads the cohort's exact sum")
            for observer, reason in ((Observer.SERVER, seen),
                                     (Observer.OUTSIDER, "global model released without noise")):
                ledger.debit_many(rec.contributors, NonPrivateMechanism(reason=reason), unit=PrivacyUnit.CLIENT,
                                  observer=observer, round_id=rec.round, summary_key="model-update")

    runner.on_round = on_round
    t0 = time.perf_counter()
    history = runner.run(progress=progress, desc=setting.name)
    seconds = time.perf_counter() - t0
    final = {k: np.asarray(v) for k, v in runner.algorithm.shared_parameters(runner.state).items()}
    plan = runner.aggregator.ddp_encoder(dim).plan.summary() if ddp is not None else None
    return RunOutput(setting, history, final, ledger, transcript, seconds, plan,
                     None if zs is None else sorted(set(zs.values())))


# ---- measuring leakage on the server's view ---------------------------------------------------------

def _scores(vec: np.ndarray, truth: frozenset[int], *, shape: tuple[int, int]) -> dict[str, tuple]:
    """(recovered set, TokenScores) of every attack on one embedding update."""
    out = {}
    for method in ATTACKS:
        got = recover_tokens(vec, shape=shape, method=method, k=len(truth) if method == "top_k" else None)
        out[method] = (got, score_tokens(got, truth, vocab_size=shape[0]))
    return out


def token_advantage(f1: float, chance: float | None) -> float:
    """Token F1 above chance, normalised: 0 = random guessing of as many tokens, 1 = exact recovery.
    Makes individual and aggregate views comparable (their chance levels differ)."""
    c = chance or 0.0
    return (f1 - c) / (1.0 - c) if c < 1 else 0.0


def token_leakage(transcript: Transcript, task: FrontierTask) -> dict[str, Any]:
    """Token-set recovery on every view the transcript holds, and the attribution of client-unique tokens."""
    shape = task.embedding_shape
    truth = {c: d.token_set for c, d in task.clients.items()}
    holders: dict[int, int] = {}
    for toks in truth.values():
        for x in toks:
            holders[x] = holders.get(x, 0) + 1
    private = {c: frozenset(x for x in toks if holders[x] == 1) for c, toks in truth.items()}
    n_private = sum(len(p) for p in private.values())
    result: dict[str, Any] = {}

    indiv = {m: [] for m in ATTACKS}
    claimed = {m: {c: set() for c in truth} for m in ATTACKS}  # individual view: tokens read from c's uploads
    agg = {m: [] for m in ATTACKS}
    agg_sets = {m: {} for m in ATTACKS}
    cohorts = {}
    for t in transcript.rounds:
        for c, vec in transcript.individuals(t, EMBEDDING_PART).items():
            for m, (got, s) in _scores(vec, truth[c], shape=shape).items():
                indiv[m].append(s)
                claimed[m][c] |= got
        rec = transcript.aggregate(t, EMBEDDING_PART)
        if rec is not None:
            union = frozenset().union(*(truth[c] for c in rec.contributors))
            cohorts[t] = rec.contributors
            for m, (got, s) in _scores(rec.mean, union, shape=shape).items():
                agg[m].append(s)
                agg_sets[m][t] = got

    def summarise(per: Mapping[str, list]) -> dict[str, Any]:
        means = {m: mean_scores(v) for m, v in per.items()}
        best = max(ATTACKS, key=lambda m: means[m].f1)
        adv = {m: token_advantage(means[m].f1, means[m].chance_f1) for m in ATTACKS}
        top = max(ATTACKS, key=adv.get)
        return {"best_method": best, **asdict(means[best]), "advantage": adv[top], "advantage_method": top,
                "methods": {m: {**asdict(s), "advantage": adv[m]} for m, s in means.items()}}

    def pick(attack: str, scores: Mapping[str, Mapping[str, float]]) -> dict[str, Any]:
        """The method whose attribution has the best F1 of rate (recall of client-unique tokens) and
        precision: attributing every token to someone must not count as success."""
        best = max(ATTACKS, key=lambda m: _hmean(scores[m]["rate"], scores[m]["precision"]))
        return {"attack": attack, "method": best, "rate": scores[best]["rate"],
                "precision": scores[best]["precision"], "methods": dict(scores), "private_tokens": n_private}

    if any(indiv.values()):
        view = summarise(indiv)
        scores = {}
        for m in ATTACKS:
            attributed = sum(len(claimed[m][c]) for c in truth)
            right = sum(len(claimed[m][c] & truth[c]) for c in truth)
            correct = sum(len(claimed[m][c] & private[c]) for c in truth)
            scores[m] = {"rate": correct / n_private if n_private else 0.0, "attributed": attributed,
                         "correct": correct, "precision": right / attributed if attributed else 1.0}
        view["attribution"] = pick("own uploads", scores)
        result["individual"] = view
    if any(agg.values()):
        view = summarise(agg)
        scores = {m: asdict(score_attribution(attribute_tokens(agg_sets[m], cohorts, clients=truth), truth))
                  for m in ATTACKS}
        view["attribution"] = pick("cross-round intersection", scores)
        result["aggregate"] = view
    result["server_view"] = "individual" if "individual" in result else "aggregate"
    return result


def _hmean(a: float, b: float) -> float:
    return 2 * a * b / (a + b) if a + b > 0 else 0.0


def recoverability(transcript: Transcript, clients: Sequence[int], *, part: str = HEAD_PART) -> dict[str, Any]:
    """Clients whose update is determined by what the server received: in the same round (each
    round's update is a fresh vector), and across rounds if the vector were fixed (rank test)."""
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


def membership(task: FrontierTask, final: Mapping[str, np.ndarray], participants: Sequence[int]) -> dict[str, Any]:
    members = example_losses(task, final, split="train", clients=participants)
    nonmembers = example_losses(task, final, split="test")
    return asdict(loss_threshold_attack(members, nonmembers))


def ledger_epsilons(ledger: Ledger) -> dict[str, float]:
    """Max over clients of each (unit/observer) epsilon the ledger reports."""
    out: dict[str, float] = {}
    for c in ledger.clients():
        for unit, observer in ledger.labels(c):
            key = f"{unit.value}/{observer.value}"
            out[key] = max(out.get(key, 0.0), ledger.epsilon(c, unit=unit, observer=observer))
    return out


def measure(run: RunOutput, task: FrontierTask, out_dir: Path, *, save_transcript: bool) -> dict[str, Any]:
    transcript = run.transcript
    if save_transcript:  # measure on exactly what was exported
        stem = out_dir / "transcript"
        transcript.save(stem)
        transcript = Transcript.load(stem)
    participants = sorted(set().union(*(r.contributors for r in run.history)))
    tokens = token_leakage(transcript, task)
    view = tokens[tokens["server_view"]]
    rec = recoverability(transcript, sorted(task.clients))
    mia = membership(task, run.final, participants)
    eps = ledger_epsilons(run.ledger)
    unit = "example" if run.setting.dpsgd else "client"
    headline_eps = eps.get(f"{unit}/server")
    report = LeakageReport(
        server_view="plain" if tokens["server_view"] == "individual" else "secure",
        token_precision=view["precision"], token_recall=view["recall"], token_f1=view["f1"],
        token_chance_f1=view["chance_f1"], intersection_attribution_rate=view["attribution"]["rate"],
        mia_auc=mia["auc"], mia_tpr_at_1pct_fpr=mia["tpr_at_1pct_fpr"], mia_tpr_at_01pct_fpr=mia["tpr_at_01pct_fpr"],
        recoverable_clients=rec["per_round"], recoverable_fraction=rec["per_round_fraction"], epsilon=headline_eps)
    last = run.history[-1]
    return {
        "setting": asdict(run.setting), "accuracy": last.mean("accuracy"),
        "token_f1": view["f1"], "token_chance_f1": view["chance_f1"],
        "token_advantage": view["advantage"],
        "accuracy_curve": [r.mean("accuracy") for r in run.history],
        "participations": {str(c): sum(c in r.contributors for r in run.history) for c in sorted(task.clients)},
        "tokens": tokens, "recoverability": rec, "membership": mia, "epsilon": {k: _j(v) for k, v in eps.items()},
        "epsilon_unit": unit, "report": report.to_dict(), "seconds": run.seconds,
        "clipped_values": int(sum(r.clipped for r in run.history)), "ddp_plan": run.ddp_plan,
        "dpsgd_noise_multiplier": run.dpsgd_noise_multiplier,
        "transcript_bytes": run.transcript.nbytes,
    }


def _j(x: float) -> float | str:
    return x if math.isfinite(x) else "inf"


# ---- reporting ----------------------------------------------------------------------------------------

def _eps(v: Any) -> str:
    if v is None:
        return "-"
    return "inf" if v == "inf" else f"{v:.2f}"


def table(results: Mapping[str, Mapping[str, Any]], cfg: FrontierConfig) -> str:
    head = (f"{'setting':<22} {'view':<10} {'acc':>6} {'tokenF1':>8} {'(chance)':>9} {'adv':>6} {'P/R':>11} "
            f"{'unique R/P':>11} "
            f"{'MIA AUC':>8} {'TPR@1%':>7} {'recov':>8} {'eps srv':>8} {'eps out':>8} {'unit':>8}")
    lines = [head, "-" * len(head)]
    for r in results.values():
        tok = r["tokens"][r["tokens"]["server_view"]]
        unit = r["epsilon_unit"]
        rec = r["recoverability"]
        lines.append(
            f"{r['setting']['label']:<22} {r['tokens']['server_view']:<10} {r['accuracy']:>6.3f} {tok['f1']:>8.3f} "
            f"{'(' + format(tok['chance_f1'], '.3f') + ')':>9} {r['token_advantage']:>6.3f} "
            f"{tok['precision']:>5.2f}/{tok['recall']:<5.2f} "
            f"{tok['attribution']['rate']:>5.2f}/{tok['attribution']['precision']:<5.2f} "
            f"{r['membership']['auc']:>8.3f} {r['membership']['tpr_at_1pct_fpr']:>7.3f} "
            f"{str(rec['per_round']) + '/' + str(rec['if_fixed']):>8} {_eps(r['epsilon'].get(f'{unit}/server')):>8} "
            f"{_eps(r['epsilon'].get(f'{unit}/outsider')):>8} {unit:>8}")
    n, k, rounds = cfg.task.num_clients, cfg.cohort, cfg.rounds
    lines += [
        "",
        f"{n} clients, cohort {k} per round, {rounds} rounds, FedAvg, {cfg.local_epochs} local epochs of plain SGD. "
        "acc = mean client test accuracy of the final global model.",
        "Threat model: honest-but-curious server that chooses the cohorts and reads everything the protocol gives "
        "it (recorded in the transcript); every leakage number is computed from that transcript alone.",
        "view: 'individual' = the server reads each client's update; 'aggregate' = only the cohort's (noisy) mean.",
        "tokenF1: token set recovered from embedding rows vs the client's training tokens (individual) or the "
        "cohort's union (aggregate); best of support / two-sided row-norm test / top-k with true k (oracle), "
        "macro-averaged over rounds (and clients); (chance) = random guessing of as many tokens; "
        "adv = max over the attacks of (F1 - chance) / (1 - chance): 0 = no better than guessing, 1 = exact.",
        "unique R/P: share of client-unique tokens pinned to their owner / share of all attributions that name a "
        "holder of the token (aggregate: cross-round intersection attack over the public cohorts; individual: "
        "tokens read from a client's own uploads); method chosen by the F1 of the two.",
        "MIA: LOSS threshold on the final model; members = training snippets of participating clients, "
        "non-members = all clients' held-out snippets.",
        "recov: clients whose update the server can compute exactly in some round / whose vector it could compute "
        "if it were fixed across rounds (rank test of the release memberships; noise ignored, so for DDP "
        "'recoverable' means 'estimable up to the DP noise').",
        f"eps (delta={cfg.delta:g}, max over clients, from ledger.json): plaintext/SecAgg+ = inf (no noise; the ledger "
        "records a non-private entry per participation).",
        f"  DDP: unit = client (all of a client's data), Skellam noise summed under SecAgg+, clip C={cfg.ddp_clip:g}; "
        f"target eps calibrated against the {cfg.target_observer} for {rounds} "
        f"{'participations' if cfg.target_observer == 'server' else 'rounds'}. eps srv: the server knows the cohort "
        "(no amplification, each client's own participations); eps out: outsiders who see only the released "
        f"models (Poisson amplification at q={k}/{n}; the runner samples fixed-size cohorts, the usual approximation).",
        f"  DP-SGD: unit = one training example of a client (Opacus, per-example clip {cfg.dpsgd_clip:g}, Poisson "
        "batches, per-client RDP accountant); holds even against the server reading each update, so srv = out; "
        "it gives no client-level guarantee.",
    ]
    return "\n".join(lines)


def plot(results: Mapping[str, Mapping[str, Any]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    panels = (("token-set leakage: F1 advantage over chance (best attack)",
               lambda r: r["token_advantage"]),
              ("membership inference AUC (LOSS, final model)", lambda r: r["membership"]["auc"]))
    colors = plt.get_cmap("tab10").colors
    for ax, (xlabel, fx) in zip(axes, panels):
        for i, r in enumerate(results.values()):
            individual = r["tokens"]["server_view"] == "individual"
            ax.scatter([fx(r)], [r["accuracy"]], marker="s" if individual else "o", s=60, color=colors[i % 10],
                       label=r["setting"]["label"] + (" (server sees each update)" if individual else ""))
        ax.set_xlabel(xlabel)
        ax.set_ylabel("mean client test accuracy")
        ax.grid(alpha=0.3)
    axes[0].set_title("accuracy vs token-set leakage", fontsize=10)
    axes[1].set_title("accuracy vs membership leakage", fontsize=10)
    axes[1].legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def mechanism_parameters(run: RunOutput, cfg: FrontierConfig) -> dict[str, Any]:
    """What was configured for a setting, in float units (the ledger entries are in integer units)."""
    s = run.setting
    if s.ddp_epsilon is not None:
        return {"mechanism": "distributed DP (SecAgg+ sum of client-side Skellam noise)", "unit": "client",
                "target_epsilon": s.ddp_epsilon, "target_observer": cfg.target_observer,
                "target_horizon": cfg.rounds, "plan": run.ddp_plan}
    if s.dpsgd:
        return {"mechanism": "DP-SGD (Opacus, Poisson batches, ghost clipping)", "unit": "example",
                "target_epsilon": cfg.dpsgd_epsilon, "planned_participations": cfg.rounds,
                "max_grad_norm": cfg.dpsgd_clip, "expected_batch": cfg.task.batch_size,
                "local_epochs": cfg.local_epochs, "noise_multiplier": run.dpsgd_noise_multiplier}
    return {"mechanism": "none", "protocol": s.protocol}


def write_ledgers(runs: Mapping[str, RunOutput], path: Path, cfg: FrontierConfig) -> Path:
    """One file for the sweep: per setting, the configured mechanism and the toolkit's ledger report
    (per client: every mechanism with its parameters and epsilon, and the composed epsilons)."""
    doc = {"format": LEDGERS_FORMAT, "delta": cfg.delta,
           "settings": {name: {"parameters": mechanism_parameters(run, cfg), "ledger": run.ledger.report()}
                        for name, run in runs.items()}}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)
    return path


# ---- command line -------------------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="20 clients, 6,000 snippets, cohort 5, 8 rounds")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results root (a run directory goes inside)")
    p.add_argument("--run-name", default=None)
    p.add_argument("--clients", type=int, default=None)
    p.add_argument("--cohort", type=int, default=None)
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--local-epochs", type=int, default=5)
    p.add_argument("--max-examples", type=int, default=None)
    p.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 4.0, 8.0])
    p.add_argument("--target-observer", choices=("server", "outsider"), default="server")
    p.add_argument("--ddp-clip", type=float, default=1.0)
    p.add_argument("--dpsgd-epsilon", type=float, default=8.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-transcripts", action="store_true", help="measure in memory; do not write transcripts")
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def config_from(args: argparse.Namespace) -> FrontierConfig:
    quick = args.quick
    clients = args.clients or (20 if quick else 40)
    max_examples = args.max_examples if args.max_examples is not None else (6000 if quick else None)
    task = FrontierTaskConfig(num_clients=clients, max_examples=max_examples, seed=args.seed)
    return FrontierConfig(task=task, rounds=args.rounds or (8 if quick else 20),
                          cohort=args.cohort or (5 if quick else 10),
                          local_epochs=args.local_epochs, epsilons=tuple(args.epsilons), ddp_clip=args.ddp_clip,
                          target_observer=args.target_observer, dpsgd_epsilon=args.dpsgd_epsilon,
                          save_transcripts=not args.no_transcripts, seed=args.seed)


def _quiet() -> None:
    logging.getLogger("absl").setLevel(logging.ERROR)  # dp_accounting: "excluding this order" per RDP order
    warnings.filterwarnings("ignore", module="opacus")
    warnings.filterwarnings("ignore", message=".*[Ss]ecure RNG.*")
    warnings.filterwarnings("ignore", message="Full backward hook is firing")  # opacus on an input-free graph


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    _quiet()
    torch.set_num_threads(1)  # small kernels; a shared 2-core machine
    cfg = config_from(args)
    run_name = args.run_name or time.strftime("%Y%m%d-%H%M%S") + ("-quick" if args.quick else "")
    out = Path(args.out) / run_name
    out.mkdir(parents=True, exist_ok=True)
    load_start = _loadavg()
    t0 = time.perf_counter()
    task = load_frontier_task(cfg.task)
    progress = not args.no_progress
    runs: dict[str, RunOutput] = {}
    results: dict[str, dict[str, Any]] = {}
    for setting in tqdm(cfg.settings(), desc="settings", disable=not progress):
        run = run_setting(setting, task, cfg, progress=progress)
        sub = out / setting.name
        sub.mkdir(exist_ok=True)
        run.ledger.write(sub / "ledger.json")
        runs[setting.name] = run
        results[setting.name] = measure(run, task, sub, save_transcript=cfg.save_transcripts)
        write_ledgers(runs, out / "ledger.json", cfg)
    ledger_path = write_ledgers(runs, out / "ledger.json", cfg)
    text = table(results, cfg)
    plot_path = plot(results, out / "accuracy_vs_leakage.png")
    top = f"ddp_eps{max(cfg.epsilons):g}"  # ddp_eps8 with the default epsilons
    summary = {
        "task": task.summary(), "results": results, "plot": str(plot_path), "ledger": str(ledger_path),
        "seconds": time.perf_counter() - t0, "loadavg_start": load_start, "loadavg_end": _loadavg(),
        "threads": torch.get_num_threads(),
    }
    write_results(out / "results.json", config=cfg, runs={n: r.history for n, r in runs.items()}, summary=summary)
    (out / "table.txt").write_text(text + "\n")
    print(text)
    print(f"\ntask: {json.dumps(task.summary())}")
    print(f"results: {out / 'results.json'}  plot: {plot_path}  ({summary['seconds']:.0f} s, "
          f"loadavg {load_start} -> {summary['loadavg_end']})")

    def f1(name: str) -> float:
        r = results[name]["tokens"]
        return r[r["server_view"]]["f1"]

    last = (f"plain_token_f1={f1('plain'):.3f} secagg_token_f1={f1('secagg'):.3f} {top}_token_f1={f1(top):.3f} "
            f"plain_acc={results['plain']['accuracy']:.3f} {top}_acc={results[top]['accuracy']:.3f} "
            f"ledger={ledger_path}")
    print(last)
    summary["last_line"] = last
    return summary


def _loadavg() -> str | None:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return None


if __name__ == "__main__":
    main()
