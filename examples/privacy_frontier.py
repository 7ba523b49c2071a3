"""Accuracy against measured leakage: plaintext, SecAgg+, SecAgg+ with distributed DP, local DP-SGD.

    python examples/privacy_frontier.py --quick      # 20 clients, 8 rounds: < 10 min on 2 cores
    python examples/privacy_frontier.py              # 40 clients, all 12.7k snippets, 20 rounds

One task (nlp_models.bag_of_tokens: a bag-of-token-embeddings sentiment classifier on Rotten
Tomatoes, V = 30,522 trainable embedding rows, clients = groups of movies, FedAvg with plain-SGD
clients), one cohort schedule (same seed, so every setting samples the same cohorts), six settings:

| setting   | upload                                   | server sees                              |
|-----------|------------------------------------------|------------------------------------------|
| plain     | the update (protocol 'plain')            | every client's update                    |
| secagg    | the update, SecAgg+ masked               | the cohort's exact (weighted) mean       |
| ddp_epsX  | clipped to C, Skellam noise, SecAgg+     | a noisy mean, client-level DP at eps X   |
| dpsgd     | Opacus DP-SGD update (protocol 'plain')  | every client's update, example-level DP  |

Every run records what the server actually received (`dp.leakage.Transcript`), saves it to disk,
reloads it and measures leakage on the reloaded copy only (`dp.leakage.measure_leakage`):
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
  The outsider epsilon (sees only the released models) is reported too, *without* amplification
  by sampling: the cohorts come from the seeded sampler (every setting samples the same cohorts),
  which justifies none, and the ledger refuses a claim the sampler does not back
  (`dp.sampling`). --target-observer outsider calibrates to the outsider instead.
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
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from dp.distributed import DistributedDPConfig
from dp.leakage import Transcript, measure_leakage
from dp.ledger import Ledger, LedgerConfig, NonPrivateMechanism, Observer, PrivacyUnit
from fl_algorithms.algorithms.fedavg import FedAvg
from fl_algorithms.engine.secure_sum import SecureAggregationConfig
from fl_algorithms.engine.sim import RoundRecord, RunConfig, SimulationRunner
from fl_algorithms.experiments.results import write_results
from fl_algorithms.training.bag_trainer import (build_dp_trainers, build_trainers, calibrated_dpsgd_configs,
                                                example_losses)
from fl_algorithms.training.dp_trainer import quiet_dp_libraries
from nlp_models._offline import ensure_offline
from nlp_models.bag_of_tokens import EMBEDDING_PART, HEAD_PART, BagTask, BagTaskConfig, load_bag_task

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "privacy_frontier"
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
    task: BagTaskConfig = field(default_factory=BagTaskConfig)
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
    return DistributedDPConfig(l2_clip=cfg.ddp_clip, target_epsilon=epsilon, delta=cfg.delta,
                               expected_clients=cfg.cohort, min_clients=cfg.cohort, bits=cfg.ddp_bits,
                               # seeded cohorts: no amplification by sampling may be claimed (dp.sampling)
                               rounds=cfg.rounds, sampling_rate=1.0, target_observer=cfg.target_observer)


def dpsgd_trainers(task: BagTask, cfg: FrontierConfig, ledger: Ledger) -> tuple[dict[int, Any], list[float]]:
    """DP-SGD clients at the target epsilon for a client sampled in every round, and their distinct z."""
    configs = calibrated_dpsgd_configs(task, target_epsilon=cfg.dpsgd_epsilon, delta=cfg.delta,
                                       max_grad_norm=cfg.dpsgd_clip, local_epochs=cfg.local_epochs,
                                       planned_rounds=cfg.rounds)
    return (build_dp_trainers(task, dp_config=configs, ledger=ledger),
            sorted({c.noise_multiplier for c in configs.values()}))


def run_setting(setting: Setting, task: BagTask, cfg: FrontierConfig, *, progress: bool) -> RunOutput:
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
    run = RunConfig(rounds=cfg.rounds, clients_per_round=cfg.cohort, seed=cfg.seed, secure=secure, sampler="seeded")
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
    return RunOutput(setting, history, final, ledger, transcript, seconds, plan, zs)


# ---- measuring leakage on the server's view ---------------------------------------------------------

def measure(run: RunOutput, task: BagTask, out_dir: Path, *, save_transcript: bool) -> dict[str, Any]:
    """Leakage from the run's transcript (exported and reloaded first), plus accuracy and cost."""
    participants = sorted(set().union(*(r.contributors for r in run.history)))
    leakage = measure_leakage(
        run.transcript, embedding_part=EMBEDDING_PART, vector_part=HEAD_PART, truth=task.token_sets(),
        shape=task.embedding_shape, ledger=run.ledger, unit="example" if run.setting.dpsgd else "client",
        member_losses=example_losses(task, run.final, split="train", clients=participants),
        nonmember_losses=example_losses(task, run.final, split="test"),
        export=out_dir / "transcript" if save_transcript else None)
    return {
        "setting": asdict(run.setting), "accuracy": run.history[-1].mean("accuracy"), **leakage,
        "accuracy_curve": [r.mean("accuracy") for r in run.history],
        "participations": {str(c): sum(c in r.contributors for r in run.history) for c in sorted(task.clients)},
        "seconds": run.seconds, "clipped_values": int(sum(r.clipped for r in run.history)),
        "ddp_plan": run.ddp_plan, "dpsgd_noise_multiplier": run.dpsgd_noise_multiplier,
        "transcript_bytes": run.transcript.nbytes,
    }


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
        f"models, not amplified: the {k}-of-{n} cohorts are seeded (reproducible), which justifies no amplification).",
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
    task = BagTaskConfig(num_clients=clients, max_examples=max_examples, seed=args.seed)
    return FrontierConfig(task=task, rounds=args.rounds or (8 if quick else 20),
                          cohort=args.cohort or (5 if quick else 10),
                          local_epochs=args.local_epochs, epsilons=tuple(args.epsilons), ddp_clip=args.ddp_clip,
                          target_observer=args.target_observer, dpsgd_epsilon=args.dpsgd_epsilon,
                          save_transcripts=not args.no_transcripts, seed=args.seed)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ensure_offline()
    args = parse_args(argv)
    quiet_dp_libraries()
    torch.set_num_threads(1)  # small kernels; a shared 2-core machine
    cfg = config_from(args)
    run_name = args.run_name or time.strftime("%Y%m%d-%H%M%S") + ("-quick" if args.quick else "")
    out = Path(args.out) / run_name
    out.mkdir(parents=True, exist_ok=True)
    load_start = _loadavg()
    t0 = time.perf_counter()
    task = load_bag_task(cfg.task)
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
