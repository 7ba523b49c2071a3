"""FedNLP text classification (Lin et al., 2022): FedAvg, FedProx and FedOPT on BBC News topics under
Dirichlet label skew, every round's uploads summed with SecAgg+, trained as FedNLP trains them.

    python examples/fednlp_classification.py --quick        # < 5 min on 2 cores
    python examples/fednlp_classification.py                 # all 2,127 distinct articles, 20 clients
    python examples/fednlp_classification.py --quick --runtime deploy   # server + 8 client processes, tcp
    python examples/fednlp_classification.py --resume results/fednlp/<run>
    python examples/fednlp_classification.py --quick --training-protocol federated-norm   # the all-AdamW control
    python examples/fednlp_classification.py --quick --training-protocol kept-adamw --fedopt-server adam --client-lr 0.01 --sgd-lr 0.01
                                                              # how this example ran before (named, reproducible)

Options every example shares: --algorithms fedavg,fedprox,fedopt  --protocol secagg+ (any of
`python -m fl_algorithms --list`)  --seeds 0,1,2 (mean and spread over seeds)  --device auto|cpu|cuda
--runtime sim|deploy (deploy: this process is the server, every client is its own
`python -m fl_algorithms.deploy_cli client` process, all over tcp on loopback; each client builds its
own shard and prefix cache, see fl_algorithms.tasks.fednlp).

Prints a table (method, final test accuracy, the last and best round of the validation curve, rounds, bytes uploaded per client per round, share
of round time spent in secure aggregation), saves results/fednlp/<run>/curve.png and results.json,
writes per-round metrics as they happen (metrics.jsonl/.csv, TensorBoard when installed) and
config.toml (both with the declared training protocol of every method), prints that protocol at the
start, and ends with the line
    fedavg_acc=.. fedprox_acc=.. fedopt_acc=.. secure_vs_plain_max_abs_diff=.. protocol=fednlp
(one `<method>_acc` per chosen algorithm, the mean over seeds, with `<method>_acc_std` when there
are several seeds; `secure_vs_plain_max_abs_diff` appears when FedAvg runs under a secure protocol;
`protocol=` names the clients' training protocol), where that figure is the largest absolute
difference between the final global parameters of
FedAvg run with SecAgg+ and FedAvg run with a plaintext sum, all seeds equal: only the fixed-point
encoder's stochastic rounding differs (its per-round error bound is printed next to it). It is
`n/a` when the two runs drew different cohorts (a CSPRNG sampler, --sampler fixed_size or poisson):
their difference would measure the cohorts, not the secure sum.

Setup and choices (and where they depart from FedNLP):
- Model: all-MiniLM-L6-v2, frozen; Houlsby adapters (bottleneck 16) only in the top 2 of its 6
  layers, plus a linear head on the mean-pooled tokens. SIMPLIFICATION: FedNLP fine-tunes whole
  models (DistilBERT); here the bottom layers are frozen and computed once for all methods and
  rounds (exact, see nlp_models.frozen_prefix; the clients are
  fl_algorithms.training.classification), which makes a 2-core CPU run take minutes.
- Shared (uploaded through SecAgg+) part: the adapters and the head; FedAvg-style deltas.
- Data: BBC News (5 topics), duplicates dropped, articles truncated to 64 (--quick) / 128 tokens.
  Label skew: the per-class Dirichlet partition with alpha = 0.5 (FedNLP used alpha = 1 for 20News
  over 100 clients; with only 5 topics and few clients, 0.5 gives each client a clearly skewed but
  not single-topic mix). Each client splits its own documents 60/20/20 (train/val/test, stratified).
- Accuracy: the mean over clients of each client's accuracy on its own test split under the last
  round's global model. The pooled accuracy over all clients' test examples (= a global test set) is
  in results.json too. Every round evaluates every client's validation split (the curve; its best round
  is reported beside the last) and only the last round the test split, so no choice looks at test.
- Clients (the declared training protocol, docs/protocols.md; `--training-protocol`): FedNLP's by
  default, as its public trainer (training/tc_transformer_trainer.py, build_optimizer) runs it: SGD
  for FedAvg and FedProx, AdamW for FedOPT's clients (FedNLP Sec. 2.2), a fresh optimiser every round
  with a linear warmup over 6% of the round's steps and a linear decay to 0, gradients clipped to norm
  1.0; 1 local epoch (FedNLP Sec. 4), batch 16. Each optimiser's lr was chosen on the clients'
  validation splits (final round, --quick data, 2026-11-29; the grids widened on seed 0 until the best
  was inside, then the best three compared by their mean over seeds 0-2): SGD 1.0 for FedAvg over
  {0.01, 0.03, 0.1, 0.3, 1, 3, 10} (seed 0: 0.251 ... 0.742, 0.894, 0.919, 0.270; mean over seeds 0-2 of
  0.3 / 1 / 3: 0.666 / 0.922 / 0.882), AdamW 3e-2 for FedOPT over {3e-3, 1e-2, 3e-2, 0.1} (seed 0: 0.515,
  0.854, 0.910, 0.378; mean of the first three: 0.443, 0.633, 0.797). Seed 0 alone had picked SGD 3.0,
  at the edge of stability (runs saved with it keep it).
  FedNLP's scripts pass one lr to every algorithm; its paper leaves "the selected hyper-parameters" to
  its supplement. With one lr for both (`--sgd-lr` equal to `--client-lr`, the setting before
  2026-11-29) SGD barely moves the adapters in a quick run's few steps (FedAvg 0.215 at 1e-2).
  `--training-protocol federated-norm` is the all-AdamW control (a fresh AdamW each round, constant lr,
  no clipping); `kept-adamw` is AdamW kept across rounds, what this example ran before (with
  `--fedopt-server adam --client-lr 0.01`, its numbers reproduce). FedProx: mu = 0.01, untuned (the middle of the FedProx
  paper's grid; with a few local steps FedProx stays close to FedAvg, as FedNLP also found). FedOPT as
  FedNLP names it: client AdamW, server SGD with momentum 0.9 (FedAvgM), server lr 0.1 as FedNLP's
  scripts (its text states 1.0: `--fedavgm-lr 1`). `--algorithms fedadam` adds Reddi et al.'s FedAdam
  (server Adam, beta1 0.9, beta2 0.99, tau 1e-3, server lr 1e-2: the best of {1e-3, 3e-3, 1e-2, 4e-2}
  on the same validation pilot), which is what this example's "FedOPT (Adam)" was before. Nothing was
  chosen on test accuracy.
- Cohort: a random subset of clients each round (4 of 8 in --quick, 10 of 20 by default), as in
  FedNLP's cross-device setting; every method sees the same cohorts (the seeded sampler: a public
  schedule from the seed; no DP runs here, so no amplification is claimed). `--runtime deploy` draws
  fixed-size cohorts from the OS CSPRNG by default, so its cohorts differ from the simulation's;
  `--runtime deploy --sampler seeded` follows the simulation's public schedule (recorded so in
  config.toml's [cohorts]) and ends with its accuracies, the encoder's rounding aside. --quick uses one torch thread:
  on a shared 2-core machine two threads were 3-4x slower than one (OpenMP threads wait on each
  other when a co-tenant holds a core); --threads 2 is faster on an idle machine.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

# heavy modules (torch, transformers) are imported where they are used, after the command line is parsed
from fl_algorithms.experiments.cli import add_training_protocol_arg, check_run_location, protocol_lines
from fl_algorithms.experiments.flags import add_common_flags
from fl_algorithms.tasks.fednlp_settings import BACKBONES, DEFAULT_METHODS, FEDOPT_SERVERS, METHODS, QUICK, FedNLPSettings
from nlp_models._offline import ensure_offline
from secagg.protocols import registry

if TYPE_CHECKING:
    import numpy as np

    from fl_algorithms.api import Algorithm
    from fl_algorithms.engine.sim import RoundRecord
    from fl_algorithms.experiments.rundir import RunDirectory
    from fl_algorithms.tasks.fednlp import FedNLPClients

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "fednlp"
PLAIN_TWIN = "fedavg_plain"
LABELS = {"fedavg": "FedAvg", "fedprox": "FedProx", "fedopt": "FedOPT", "fedadam": "FedAdam", PLAIN_TWIN: "FedAvg"}
TASK_SPEC = "fl_algorithms.tasks.fednlp:build"
Settings = FedNLPSettings  # one seed's settings; the run's seeds are listed beside them
SETTING_HELP = {
    "max_docs": "cap on BBC articles, stratified (default: every distinct one; --quick 600)",
    "max_length": "tokens per article",
    "clients": "clients the articles are partitioned over",
    "alpha": "Dirichlet label-skew concentration (smaller: more skewed)",
    "min_client_docs": "fewest articles a client may hold (the partition is redrawn until every client has them)",
    "clients_per_round": "cohort size of a round",
    "local_epochs": "local epochs per round",
    "adapter_layers": "adapters in the top N encoder layers",
    "bottleneck": "adapter bottleneck width",
    "batch_size": "local batch size",
    "client_lr": "the clients' AdamW lr (FedOPT's clients under fednlp; every client under the AdamW presets)",
    "sgd_lr": "the lr of the clients a protocol runs with SGD (FedAvg and FedProx under fednlp)",
    "fedprox_mu": "FedProx's proximal weight mu",
    "server_lr": "FedAdam's server lr (FedOPT's too with --fedopt-server adam)",
    "fedavgm_lr": "FedOPT's server SGD lr (FedNLP's scripts: 0.1; its text: 1.0)",
    "fedavgm_momentum": "FedOPT's server momentum",
    "clip": "fixed-point range of each uploaded delta coordinate (clipped values are counted)",
    "min_release_group": "fewest clients in a released noise-free sum",
}
"""Help of the options made from FedNLPSettings' fields (each with its default and --quick's value)."""
SETTING_TYPES = {"max_docs": int, "max_length": int, "clients": int, "min_client_docs": int, "clients_per_round": int,
                 "local_epochs": int, "adapter_layers": int, "bottleneck": int, "batch_size": int,
                 "min_release_group": int}
"""The int-valued settings options (the others are floats)."""


# ---- command line ------------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_flags(p, quick="600 articles, 8 clients (4 per round), 8 rounds, 64 tokens", algorithms=METHODS,
                     default_algorithms=DEFAULT_METHODS, seeds="0", rounds="default 30; --quick 8",
                     protocols=registry.names(), runtime=True, backend=True, data=True, device="cpu",
                     out=str(DEFAULT_OUT), resume="continue a run from its checkpoints, with its settings", progress=True,
                     report=True)
    p.add_argument("--ray-address", default=None, help="with --backend ray: a running Ray cluster (e.g. 'auto')")
    p.add_argument("--sampler", choices=("seeded", "fixed_size", "poisson"), default=None,
                   help="cohort sampler (default seeded in sim: a public schedule, the same cohorts for every method "
                        "and runtime; fixed_size in deploy: the OS CSPRNG)")
    p.add_argument("--backbone", choices=BACKBONES, default=None,
                   help="minilm (default) or tiny: a random 2-layer BERT for smoke runs")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: robust on a shared machine)")
    add_training_protocol_arg(p, default=None)
    p.add_argument("--fedopt-server", choices=FEDOPT_SERVERS, default=None,
                   help="FedOPT's server: sgdm (FedNLP's SGD with momentum, default) or adam (this example before)")
    for field in dataclasses.fields(Settings):
        if field.name not in SETTING_HELP:  # quick, seed, rounds, data and its columns, the protocol: above
            continue
        values = [f"default {field.default}"] if field.default is not None else []  # (None: said in the help)
        values += [f"--quick {QUICK[field.name]}"] if field.name in QUICK and field.default is not None else []
        kind = SETTING_TYPES.get(field.name, float)
        p.add_argument("--" + field.name.replace("_", "-"), type=kind, default=None, metavar=kind.__name__.upper(),
                       help=SETTING_HELP[field.name] + (f" ({'; '.join(values)})" if values else ""))
    return p


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the run does beyond one seed's settings (saved in config.toml with them)."""

    algorithms: tuple[str, ...] = DEFAULT_METHODS
    protocol: str = "secagg+"
    seeds: tuple[int, ...] = (0,)
    runtime: str = "sim"
    backend: str = "memory"
    """Where --runtime sim's clients run: 'memory' (this process) or 'ray' (Ray actors)."""
    ray_address: str | None = None
    backbone: str = "minilm"
    curve: str = "validation"
    """The split evaluated every round ('validation': test only in the last round, so that no choice looks
    at test scores; 'test': every round, as runs saved before 2026-11-29 did)."""
    sampler: str = "seeded"
    """'seeded' (a public schedule from the seed: every method of a seed, and either runtime, sees the
    same cohorts; no DP here, so nothing is amplified), or 'fixed_size' / 'poisson' from the OS CSPRNG
    ('fixed_size' is the deploy default; its cohorts differ from run to run)."""

    def __post_init__(self) -> None:
        if self.curve not in ("validation", "test"):
            raise ValueError(f"curve must be 'validation' or 'test', got {self.curve!r}")
        if self.sampler not in ("seeded", "fixed_size", "poisson"):
            raise ValueError(f"--sampler is seeded, fixed_size or poisson, got {self.sampler!r}")
        if self.backend not in ("memory", "ray") or (self.backend == "ray" and self.runtime != "sim"):
            raise ValueError("--backend is memory or ray, and ray needs --runtime sim")

    @property
    def methods(self) -> tuple[str, ...]:
        """The chosen algorithms, plus FedAvg under a plaintext sum when FedAvg runs under a secure protocol."""
        twin = ("fedavg" in self.algorithms and self.protocol != "plain")
        return self.algorithms + ((PLAIN_TWIN,) if twin else ())


def _explicit(args: argparse.Namespace, cls) -> dict[str, Any]:
    """The options of dataclass `cls` given on the command line (every one defaults to None)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in vars(args).items() if k in names and v is not None and v is not False}


def parse_settings(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, Settings, Plan]:
    parser = _parser()
    args = parser.parse_args(argv)
    from fl_algorithms.experiments.rundir import RunDirectory
    from nlp_models.device import resolve_device

    if args.report and not args.resume:
        parser.error("--report prints a finished run's report: give --resume RUN_DIR")
    if args.threads < 1:
        parser.error("--threads must be at least 1")
    check_run_location(parser, args)
    if args.data is None and (args.text_col or args.label_col):
        parser.error("--text-col and --label-col only apply with --data PATH")
    if args.data is not None:
        if not Path(args.data).exists():
            parser.error(f"--data {args.data}: no such file or folder")
        args.data = str(Path(args.data).resolve())  # client processes may start elsewhere
    chosen, planned = _explicit(args, Settings), _explicit(args, Plan)
    try:
        resolve_device(args.device)
        if args.resume:
            try:
                saved = RunDirectory.open(Path(args.resume)).read_config()
            except (FileNotFoundError, ValueError) as error:
                parser.error(f"--resume {args.resume}: {error}")
            # a run saved before --sampler existed continues with Poisson cohorts (the engine's default when
            # it was saved; still older runs had seeded ones)
            # and one saved before 2026-11-29 evaluated the test split every round
            saved_plan = {"sampler": "poisson", "curve": "test", **saved["plan"]}
            # a run saved before protocols were declared trained AdamW kept across rounds, its FedOPT server Adam
            # (and one saved before 2026-11-29 ran its SGD clients at client_lr, 1e-2 then by default)
            saved_settings = {"training_protocol": "kept-adamw", "fedopt_server": "adam", "client_lr": 1e-2,
                              "sgd_lr": None, **saved["settings"]}
            settings, plan = Settings(**saved_settings), Plan(**{k: tuple(v) if isinstance(v, list) else v
                                                                 for k, v in saved_plan.items()})
            more = chosen.pop("rounds", settings.rounds)
            if more < settings.rounds:
                parser.error(f"--resume: --rounds {more} is fewer than the {settings.rounds} the run was saved with "
                             "(a resumed run keeps its rounds or extends them)")
            args.extended_from = settings.rounds if more > settings.rounds else None
            settings = dataclasses.replace(settings, rounds=more)  # a finished run extended by the extra rounds
            clash = {k: v for k, v in chosen.items() if getattr(settings, k) != v}
            clash.update({k: v for k, v in planned.items() if getattr(plan, k) != v})
            if clash:
                parser.error(f"--resume reuses the run's saved settings; these options differ from them: {clash}")
        else:
            base = {**(QUICK if args.quick else {}), **chosen}
            if "clients_per_round" not in base and base.get("clients", Settings.clients) <= Settings.clients_per_round:
                base["clients_per_round"] = None  # the default cohort would be everyone anyway
            if planned.get("runtime") == "deploy" and "sampler" not in planned:
                planned["sampler"] = "fixed_size"
            plan = Plan(**planned)
            settings = Settings(**base, seed=plan.seeds[0])
            for s in plan.seeds:
                dataclasses.replace(settings, seed=s)  # every seed valid before anything runs
    except (ValueError, TypeError) as error:
        parser.error(str(error))
    return args, settings, plan


# ---- one seed ----------------------------------------------------------------------------------

def cohort_schedule(settings: Settings, plan: Plan) -> dict[str, Any]:
    """How the run's cohorts are drawn, for config.toml and results.json (`engine.sim.describe_cohorts`):
    'seeded' is a public schedule that claims no amplification (no DP here), shared by every method and
    runtime; a CSPRNG sampler's cohorts differ between runs."""
    from fl_algorithms.engine.sim import RunConfig, describe_cohorts

    return describe_cohorts(RunConfig(rounds=settings.rounds, clients_per_round=settings.clients_per_round,
                                      seed=settings.seed, sampler=plan.sampler))


def make_algorithm(method: str, settings: Settings) -> Algorithm:
    """`fl_algorithms.tasks.fednlp.make_algorithm`, imported at the first call (tests replace this name)."""
    from fl_algorithms.tasks.fednlp import make_algorithm as make

    return make(method, settings)


def flat(params: Mapping[str, np.ndarray]) -> np.ndarray:
    import numpy as np

    return np.concatenate([np.asarray(params[k], dtype=np.float64).ravel() for k in sorted(params)])


def run_method(method: str, clients: FedNLPClients, plan: Plan, run: RunDirectory, *, resume: bool, progress: bool,
               threads: int) -> tuple[list[RoundRecord], np.ndarray, dict[int, np.ndarray]]:
    """One method for one seed in the chosen runtime: its history, final global parameters and the
    global parameters after each round run by this process."""
    from tqdm import tqdm

    from fl_algorithms.engine.sim import RunConfig, SimulationRunner
    from fl_algorithms.experiments.task import Task
    from fl_algorithms.tasks.fednlp import secure_config

    settings = clients.settings
    name = "fedavg" if method == PLAIN_TWIN else method
    sizes = [len(s.train) for s in clients.corpus.splits]
    protocol = "plain" if method == PLAIN_TWIN else plan.protocol
    where = f"seed-{settings.seed}/{method}"
    config = RunConfig(rounds=settings.rounds, clients_per_round=settings.clients_per_round, seed=settings.seed,
                       sampler=plan.sampler, secure=secure_config(settings, protocol=protocol, max_weight=max(sizes)),
                       curve_split=None if plan.curve == "test" else plan.curve,
                       checkpoint_dir=str(run.path / "checkpoints" / where), backend=plan.backend,
                       ray_address=plan.ray_address)
    task = Task(algorithm=make_algorithm(name, settings), make_trainer=clients.trainer_factory(name),
                initial=clients.initial)
    algorithm, snapshots = task.algorithm, {}

    def on_round(rec: RoundRecord, state_of) -> None:
        snapshots[rec.round] = flat(algorithm.shared_parameters(state_of()))
        run.log_round({"seed": settings.seed, "method": method, **dataclasses.asdict(rec),
                       "mean_accuracy": rec.mean("accuracy")})

    if plan.runtime == "sim":
        runner = SimulationRunner(algorithm=algorithm, config=config, initial=clients.initial(),
                                  trainers={c: task.make_trainer(c) for c in range(1, clients.num_clients + 1)})
        runner.on_round = lambda rec: on_round(rec, lambda: runner.state)
        try:
            history = runner.run(resume=resume, progress=progress, desc=method)
        finally:
            runner.close()
        return list(history), flat(algorithm.shared_parameters(runner.state)), snapshots
    from fl_algorithms.engine.launch import run_on_loopback

    bar = tqdm(total=settings.rounds, desc=f"{method} (deployed)", disable=None if progress else True, leave=False)

    def deployed_round(rec: RoundRecord, server) -> None:
        on_round(rec, lambda: server.state)
        bar.update(1)

    try:
        server = run_on_loopback(task=task, task_spec=TASK_SPEC, options={**clients.options(name),
                                 "threads": str(threads)}, config=config, clients=clients.num_clients,
                                 log_dir=run.path / "logs" / where, on_round=deployed_round, resume=resume,
                                 client_checkpoints=run.path / "checkpoints" / where / "clients")
    finally:
        bar.close()
    return list(server.history), flat(algorithm.shared_parameters(server.state)), snapshots


def run_seed(clients: FedNLPClients, plan: Plan, run: RunDirectory, *, resume: bool, progress: bool,
             threads: int) -> dict[str, Any]:
    """Every method of one seed from the same initial model and cohorts."""
    out: dict[str, Any] = {"histories": {}, "finals": {}, "snapshots": {}}
    for method in plan.methods:
        history, final, snapshots = run_method(method, clients, plan, run, resume=resume, progress=progress,
                                               threads=threads)
        out["histories"][method], out["finals"][method], out["snapshots"][method] = history, final, snapshots
    out["sizes"] = {k: len(s.train) for k, s in enumerate(clients.corpus.splits, start=1)}
    out["n_shared"] = {part: int(v.size) for part, v in clients.initial().items()}
    return out


def curve_metric(history: Sequence[RoundRecord]) -> str:
    """'validation_accuracy' when the run evaluated validation every round, else 'accuracy' (test)."""
    return "validation_accuracy" if "validation_accuracy" in next(iter(history[0].metrics.values())) else "accuracy"


def curve(history: Sequence[RoundRecord]) -> list[float]:
    """Mean over clients of their accuracy on the curve's split (validation; test in older runs), per round."""
    metric = curve_metric(history)
    return [r.mean(metric) for r in history]


def pooled_accuracy(record: RoundRecord) -> float:
    """Test accuracy over the union of the clients' test splits (a global test set) in one round."""
    n = sum(m["examples"] for m in record.metrics.values())
    return sum(m["accuracy"] * m["examples"] for m in record.metrics.values()) / max(n, 1)


def method_summary(history: Sequence[RoundRecord]) -> dict[str, float]:
    import numpy as np

    acc = curve(history)
    uploads = [b for r in history for b in r.bytes_uploaded.values()]
    seconds = sum(r.seconds for r in history)
    return {"final_accuracy": history[-1].mean("accuracy"), "final_validation_accuracy": acc[-1],
            "best_curve_accuracy": max(acc), "best_round": int(np.argmax(acc)) + 1,
            "final_pooled_accuracy": pooled_accuracy(history[-1]), "rounds": len(history),
            "bytes_uploaded_per_client_round": float(np.mean(uploads)) if uploads else 0.0,
            "secure_time_share": sum(r.secure_seconds for r in history) / seconds if seconds > 0 else 0.0,
            "clipped_values": int(sum(r.clipped for r in history)), "seconds": seconds}


def over_seeds(per_seed: Sequence[Mapping[str, float]]) -> dict[str, Any]:
    """Mean of every figure over seeds; the spread (sample std) and per-seed values of the accuracies."""
    import numpy as np

    keys = per_seed[0].keys()
    out: dict[str, Any] = {k: float(np.mean([s[k] for s in per_seed])) for k in keys}
    for k in ("rounds", "best_round", "clipped_values"):
        out[k] = int(round(out[k])) if k != "clipped_values" else int(sum(s[k] for s in per_seed))
    finals = [s["final_accuracy"] for s in per_seed]
    out["final_accuracy_std"] = float(np.std(finals, ddof=1)) if len(finals) > 1 else 0.0
    out["final_accuracy_per_seed"] = finals
    return out


def shared_cohorts(histories: Mapping[str, Sequence[RoundRecord]]) -> bool:
    """Whether FedAvg and its plaintext twin drew the same cohort in every round (their difference then
    measures the secure sum alone)."""
    secure, plain = histories["fedavg"], histories[PLAIN_TWIN]
    return len(secure) == len(plain) and all(a.cohort == b.cohort for a, b in zip(secure, plain))


def secure_vs_plain(runs: Mapping[str, Any], settings: Settings, plan: Plan) -> dict[str, Any]:
    """How far FedAvg under the secure protocol ends from FedAvg under a plaintext sum, next to the
    encoder's bound (first seed); None ('n/a' in the last line) when the twins drew different cohorts."""
    import numpy as np

    from fl_algorithms.engine.secure_sum import SecureAggregator
    from fl_algorithms.tasks.fednlp import secure_config

    finals, snapshots, sizes = runs["finals"], runs["snapshots"], runs["sizes"]
    if not shared_cohorts(runs["histories"]):
        return {"secure_vs_plain_max_abs_diff": None,
                "secure_vs_plain_not_compared": f"the {plan.sampler} sampler drew FedAvg and its plaintext twin "
                                                "different cohorts (--sampler seeded shares them)"}
    encoder = SecureAggregator(secure_config(settings, protocol=plan.protocol, max_weight=max(sizes.values()))).encoder
    return {
        "secure_vs_plain_max_abs_diff": float(np.max(np.abs(finals["fedavg"] - finals[PLAIN_TWIN]))),
        "secure_vs_plain_max_abs_diff_by_round": {
            t: float(np.max(np.abs(v - snapshots[PLAIN_TWIN][t])))
            for t, v in sorted(snapshots["fedavg"].items()) if t in snapshots[PLAIN_TWIN]},
        "encoder_mean_error_bound_per_round": max(
            encoder.mean_error_bound(n_clients=len(r.contributors),
                                     total_weight=float(sum(sizes[c] for c in r.contributors)))
            for r in runs["histories"]["fedavg"]),
        "encoder_step": encoder.step,
    }


# ---- report ------------------------------------------------------------------------------------

def plot_curves(path: Path, curves: Mapping[str, Sequence[float]], protocol: str, title: str, *,
                split: str) -> Path:
    from fl_algorithms.experiments.tables import pyplot, save_figure

    fig, ax = pyplot().subplots(figsize=(6.4, 4.2))
    styles = {"fedavg": "-o", "fedprox": "-s", "fedopt": "-^", "fedadam": "-d", PLAIN_TWIN: ":x"}
    for method, values in curves.items():
        label = LABELS[method] + (" (plaintext sum)" if method == PLAIN_TWIN else f" ({protocol})")
        ax.plot(range(1, len(values) + 1), values, styles[method], label=label, markersize=4)
    ax.set_xlabel("round")
    ax.set_ylabel(f"mean client {split} accuracy")
    ax.set_title(title, fontsize=9)
    return save_figure(fig, path)


def format_table(summaries: Mapping[str, Mapping[str, Any]], protocol: str) -> str:
    head = f"{'method':<15} {'aggregation':<11} {'test acc':>9} {'± std':>7} {'curve acc':>9} {'best@round':>10} " \
           f"{'rounds':>6} " \
           f"{'bytes up/client/round':>21} {'secagg time share':>17}"
    lines = [head, "-" * len(head)]
    for method, s in summaries.items():
        agg = "plain" if method == PLAIN_TWIN else protocol
        lines.append(f"{LABELS[method]:<15} {agg:<11} {s['final_accuracy']:>9.4f} {s['final_accuracy_std']:>7.4f} "
                     f"{s['final_validation_accuracy']:>9.4f} {s['best_curve_accuracy']:>5.4f}@{s['best_round']:<4d} "
                     f"{s['rounds']:>6d} {s['bytes_uploaded_per_client_round']:>21,.0f} "
                     f"{100 * s['secure_time_share']:>16.1f}%")
    return "\n".join(lines)


def print_report(summary: Mapping[str, Any], settings: Settings, plan: Plan, *, title: str, model_label: str,
                 layers: int, first_round: np.ndarray | None) -> None:
    import numpy as np

    from fl_algorithms.training.protocol import TrainingProtocol

    n_shared = summary["shared_parameters"]
    print(f"\nFedNLP text classification: {title}, {settings.rounds} rounds, {settings.max_length} tokens, "
          f"seeds {','.join(map(str, plan.seeds))}, runtime {plan.runtime}, sampler {plan.sampler}")
    print(f"model: {model_label}, frozen; adapters (bottleneck {settings.bottleneck}) "
          f"only in the top {settings.adapter_layers} of {layers} layers + linear head "
          f"(simplification: FedNLP fine-tunes the whole model)")
    print(f"uploaded through {plan.protocol}: adapter ({n_shared['adapter']:,}) + head ({n_shared['head']:,}) "
          f"parameters, as per-round deltas")
    fedopt = (f"FedOPT client AdamW, server SGD lr {settings.fedavgm_lr:g} momentum {settings.fedavgm_momentum:g}"
              if settings.fedopt_server == "sgdm" else f"FedOPT server Adam lr {settings.server_lr:g}, tau 1e-3")
    sgd = "" if settings.sgd_lr is None else f", SGD lr {settings.sgd_lr:g}"
    print(f"clients: training protocol {settings.training_protocol}, lr {settings.client_lr:g}{sgd}, "
          f"{settings.local_epochs} local epoch(s), batch {settings.batch_size}; FedProx mu {settings.fedprox_mu:g}; "
          f"{fedopt}"
          + (f"; FedAdam server lr {settings.server_lr:g}, tau 1e-3" if "fedadam" in plan.algorithms else ""))
    print("\n".join(protocol_lines({m: TrainingProtocol.from_dict(d)
                                    for m, d in summary["training_protocol"].items()})))
    print("accuracy: mean over clients of their own test-split accuracy under the last round's global model "
          "(pooled over all test examples in results.json); ± std over seeds; the curve (every round) and its "
          f"best round on the {plan.curve} split\n")
    print(format_table(summary["methods"], plan.protocol))
    clipped = sum(s["clipped_values"] for s in summary["methods"].values())
    if summary.get("secure_vs_plain_max_abs_diff", 0.0) is None:
        print(f"\nsecure vs plain FedAvg: n/a, {summary['secure_vs_plain_not_compared']}")
    elif "secure_vs_plain_max_abs_diff" in summary:
        diff, bound = summary["secure_vs_plain_max_abs_diff"], summary["encoder_mean_error_bound_per_round"]
        print(f"\nsecure vs plain FedAvg (seed {plan.seeds[0]}): max |difference| of final global parameters "
              f"{diff:.3e}; encoder error bound per round and coordinate {bound:.3e}; clipped values {clipped}")
        by_round = summary["secure_vs_plain_max_abs_diff_by_round"]
        if 1 in by_round and first_round is not None:
            # each run: encoder error <= bound, then float32 storage of w + mean update rounds by <= ulp/2
            limit = 2 * bound + float(np.spacing(np.float32(np.max(np.abs(first_round)))))
            print(f"  after round 1 it is {by_round[1]:.3e} (limit: 2 x bound + float32 rounding = {limit:.3e}); "
                  f"later rounds' local training carries the difference forward")


def last_line(summary: Mapping[str, Any], plan: Plan, settings: Settings) -> str:
    parts = []
    for m in plan.algorithms:
        parts.append(f"{m}_acc={summary['methods'][m]['final_accuracy']:.4f}")
        if len(plan.seeds) > 1:
            parts.append(f"{m}_acc_std={summary['methods'][m]['final_accuracy_std']:.4f}")
    if "secure_vs_plain_max_abs_diff" in summary:
        diff = summary["secure_vs_plain_max_abs_diff"]
        parts.append(f"secure_vs_plain_max_abs_diff={'n/a' if diff is None else format(diff, '.3e')}")
    parts.append(f"protocol={settings.training_protocol}")
    return " ".join(parts)


def report_saved(args: argparse.Namespace, settings: Settings, plan: Plan) -> dict[str, Any]:
    """--resume RUN_DIR --report: the finished run's table, its secure-vs-plain check and its last line, read
    from its results.json; runs nothing."""
    from fl_algorithms.experiments.rundir import RunDirectory
    from fl_algorithms.training.protocol import TrainingProtocol

    run = RunDirectory.open(Path(args.resume))
    summary = run.finished_summary()
    try:
        table, line = format_table(summary["methods"], plan.protocol), last_line(summary, plan, settings)
    except (ValueError, KeyError) as error:
        raise SystemExit(f"error: {run.path / 'results.json'} cannot be reported ({error!r}; written by an older "
                         "version?)") from None
    print(f"FedNLP text classification: {run.path}, {settings.rounds} rounds, {settings.clients} clients, "
          f"seeds {','.join(map(str, plan.seeds))}, runtime {plan.runtime}, sampler {plan.sampler}, {plan.protocol}")
    protocols = summary.get("training_protocol", {})
    print("\n".join(protocol_lines({m: TrainingProtocol.from_dict(protocols[m]) for m in plan.algorithms
                                    if m in protocols})))
    print(table)
    if summary.get("secure_vs_plain_max_abs_diff", 0.0) is None:
        print(f"\nsecure vs plain FedAvg: n/a, {summary['secure_vs_plain_not_compared']}")
    elif "secure_vs_plain_max_abs_diff" in summary:
        print(f"\nsecure vs plain FedAvg (seed {plan.seeds[0]}): max |difference| of final global parameters "
              f"{summary['secure_vs_plain_max_abs_diff']:.3e}; encoder error bound per round and coordinate "
              f"{summary['encoder_mean_error_bound_per_round']:.3e}")
    print(f"plot: {run.path / 'curve.png'}\nresults: {run.path / 'results.json'}")
    print(line, flush=True)
    return {"run_dir": run.path, "summary": summary, "last_line": line}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the comparison and return the run directory, the summary and the printed last line."""
    ensure_offline()
    args, settings, plan = parse_settings(argv)
    if args.report:
        return report_saved(args, settings, plan)
    import numpy as np

    from fl_algorithms.experiments.results import write_results
    from fl_algorithms.experiments.rundir import RunDirectory
    from fl_algorithms.tasks.fednlp import FedNLPClients
    from nlp_models.cpu import set_torch_threads
    from nlp_models.data.own import DataError

    set_torch_threads(args.threads)
    progress = not args.no_progress
    t_start = time.perf_counter()

    per_seed = [FedNLPClients(dataclasses.replace(settings, seed=s), backbone=plan.backbone, device=args.device)
                for s in plan.seeds]
    try:  # arguments, backbone and partition are checked before a run directory exists
        for clients in per_seed:
            clients.check_backbone(clients.backbone[0])
            clients.corpus  # noqa: B018 - loads and partitions, or raises
    except DataError as error:  # your own file: an argument error, exit code 2 as argparse gives
        print(f"error: --data: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None
    # the declared protocol of every method's clients (the same for every seed): printed, and recorded
    protocols = {m: per_seed[0].protocol("fedavg" if m == PLAIN_TWIN else m).to_dict() for m in plan.methods}
    print("\n".join(protocol_lines({m: per_seed[0].protocol(m) for m in plan.algorithms})), flush=True)
    if args.resume:
        run = RunDirectory.open(Path(args.resume))
        if getattr(args, "extended_from", None):  # more rounds than saved: config.toml says how many it runs now
            saved = run.read_config()
            run.write_config({**saved, "settings": {**saved["settings"], "rounds": settings.rounds}})
            print(f"extending the run from {args.extended_from} to {settings.rounds} rounds", flush=True)
    else:
        try:
            run = RunDirectory.create(Path(args.out) if args.out else DEFAULT_OUT, name=args.run_name)
        except FileExistsError as error:
            raise SystemExit(f"error: {error}") from None
        run.write_config({"settings": settings, "plan": plan, "training_protocol": protocols,
                          "cohorts": cohort_schedule(settings, plan)})

    from fl_algorithms.engine.deploy import DeploymentStopped
    from fl_algorithms.experiments.interrupt import (STOPPED_EXIT, exit_interrupted, reached, resume_command,
                                                     script_command)

    command = resume_command(program=script_command(__file__), run_dir=run.path,
                             argv=sys.argv[1:] if argv is None else argv)
    try:
        seeds = [run_seed(c, plan, run, resume=bool(args.resume), progress=progress, threads=args.threads)
                 for c in per_seed]
    except KeyboardInterrupt:  # one line: where it got to and how to go on, no traceback
        exit_interrupted(what=reached(run.rounds(), rounds=settings.rounds), command=command)
    except DeploymentStopped as error:
        print(f"error: {error}\nresume with: {command}", file=sys.stderr, flush=True)
        raise SystemExit(STOPPED_EXIT) from None
    first, clients = seeds[0], per_seed[0]
    histories = {m: h for m, h in first["histories"].items()}
    curves = {m: list(np.mean([curve(s["histories"][m]) for s in seeds], axis=0)) for m in plan.methods}
    cohort = "all" if settings.clients_per_round is None else str(settings.clients_per_round)
    dataset = clients.corpus.dataset
    source = "BBC News" if settings.data is None else Path(settings.data).name
    title = (f"{source}, {len(dataset)} docs, {settings.clients} clients, Dir({settings.alpha}) label skew, "
             f"{cohort} clients/round")
    curve_path = plot_curves(run.path / "curve.png", curves, plan.protocol, title, split=plan.curve)
    summary: dict[str, Any] = {
        "methods": {m: over_seeds([method_summary(s["histories"][m]) for s in seeds]) for m in plan.methods},
        "curves": curves,
        "curve_split": "test" if plan.curve == "test" else "validation",
        "shared_parameters": first["n_shared"], "prefix_split": clients.split,
        "documents": len(dataset), "client_train_sizes": first["sizes"],
        "client_label_counts": clients.corpus.partition.label_counts(clients.corpus.labels,
                                                                     dataset.num_labels).tolist(),
        "accuracy_definition": "mean over clients of each client's own test-split accuracy under the global model",
        "seeds": list(plan.seeds), "runtime": plan.runtime, "protocol": plan.protocol, "device": args.device,
        "training_protocol": protocols,
    }
    if PLAIN_TWIN in plan.methods:
        summary.update(secure_vs_plain(first, settings, plan))
    summary["wall_seconds"] = time.perf_counter() - t_start
    runs = histories if len(seeds) == 1 else {f"{m}@seed{s}": h for s, r in zip(plan.seeds, seeds)
                                               for m, h in r["histories"].items()}
    results_path = write_results(run.path / "results.json", config={"settings": settings, "plan": plan,
                                                                    "training_protocol": protocols,
                                                                    "cohorts": cohort_schedule(settings, plan)},
                                 runs=runs, summary=summary)
    model = clients.backbone[0]
    label = ("all-MiniLM-L6-v2" if plan.backbone == "minilm" else "tiny random BERT") + \
        f" ({model.config.num_hidden_layers} layers, hidden {model.config.hidden_size})"
    print_report(summary, settings, plan, title=title, model_label=label, layers=model.config.num_hidden_layers,
                 first_round=first["snapshots"].get("fedavg", {}).get(1))
    print(f"plot: {curve_path}\nresults: {results_path}\ntime: {summary['wall_seconds']:.0f} s")
    line = last_line(summary, plan, settings)
    print(line, flush=True)
    return {"run_dir": run.path, "summary": summary, "last_line": line}


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # before the run directory exists (loading, partitioning) or while writing results
        print("interrupted: outside the rounds (nothing lost; a run directory, if made, resumes with --resume)",
              file=sys.stderr)
        raise SystemExit(130) from None
