"""FedNLP text classification (Lin et al., 2022): FedAvg, FedProx and FedOPT on BBC News topics under
Dirichlet label skew, every round's uploads summed with SecAgg+.

    python examples/fednlp_classification.py --quick        # < 5 min on 2 cores
    python examples/fednlp_classification.py                 # all 2,127 distinct articles, 20 clients
    python examples/fednlp_classification.py --resume results/fednlp/<run>

Prints a table (method, final and best accuracy, rounds, bytes uploaded per client per round, share
of round time spent in secure aggregation), saves results/fednlp/<run>/curve.png and results.json,
and ends with the line
    fedavg_acc=.. fedprox_acc=.. fedopt_acc=.. secure_vs_plain_max_abs_diff=..
where the last figure is the largest absolute difference between the final global parameters of
FedAvg run with SecAgg+ and FedAvg run with a plaintext sum, all seeds equal: only the fixed-point
encoder's stochastic rounding differs (its per-round error bound is printed next to it).

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
- Accuracy: the mean over clients of each client's accuracy on its own test split under the global
  model (every client, every round). The pooled accuracy over all clients' test examples (= a
  global test set) is in results.json too. "best" is the best round of that test curve.
- Clients: AdamW (FedNLP's ClientOpt), 1 local epoch (FedNLP), batch 16, lr 1e-2: the best of
  {1e-3, 3e-3, 1e-2} for FedAvg on the clients' validation splits in a pilot on the --quick data
  (adapters and a fresh head get only ~30 local steps in a quick run; 1e-3 reached 0.56). FedProx:
  mu = 0.01, untuned (the middle of the FedProx paper's grid; with a few local steps FedProx stays
  close to FedAvg, as FedNLP also found). FedOPT: server Adam (FedNLP's default is SGD-momentum;
  Adam per Reddi et al.), beta1 0.9, beta2 0.99, tau 1e-3 (Reddi et al.'s value; 1e-4 diverged),
  server lr 1e-2: the best of {1e-3, 3e-3, 1e-2, 4e-2} on the same validation pilot (4e-2 is
  "client lr x local steps", how far one local run moves a coordinate; it overshot). Each method
  thus runs at its own validation-chosen setting; nothing was chosen on test accuracy.
- Cohort: a random subset of clients each round (4 of 8 in --quick, 10 of 20 by default), as in
  FedNLP's cross-device setting; every method sees the same cohorts. --quick uses one torch thread:
  on a shared 2-core machine two threads were 3-4x slower than one (OpenMP threads wait on each
  other when a co-tenant holds a core); --threads 2 is faster on an idle machine.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fl_algorithms.algorithms.fedavg import FedAvg
from fl_algorithms.algorithms.fedopt import FedOpt
from fl_algorithms.algorithms.fedprox import FedProx
from fl_algorithms.api import Algorithm
from fl_algorithms.engine.secure_sum import SecureAggregationConfig, SecureAggregator
from fl_algorithms.engine.sim import RoundRecord, RunConfig, SimulationRunner
from fl_algorithms.experiments.results import write_results
from fl_algorithms.training.classification import TextTaskConfig, build_text_trainers
from fl_algorithms.training.trainer import SeededTorchTrainer
from nlp_models._offline import ensure_offline
from nlp_models.backbone import load_backbone
from nlp_models.data.dataset import TextDataset
from nlp_models.data.loaders import load_bbc_news
from nlp_models.data.partition import ClientSplit, Partition, PartitionError, client_splits, dirichlet_label_skew
from nlp_models.frozen_prefix import PrefixCache, build_prefix_cache, prefix_split

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "fednlp"
METHODS = ("fedavg", "fedprox", "fedopt", "fedavg_plain")
LABELS = {"fedavg": "FedAvg", "fedprox": "FedProx", "fedopt": "FedOPT (Adam)", "fedavg_plain": "FedAvg"}


@dataclass(frozen=True)
class Settings:
    """Everything that defines a run (saved in the run directory; --resume reuses it)."""

    quick: bool = False
    max_docs: int | None = None
    """Cap on BBC articles (stratified); None keeps all distinct ones."""
    max_length: int = 128
    clients: int = 20
    alpha: float = 0.5
    min_client_docs: int = 20
    rounds: int = 30
    clients_per_round: int | None = 10
    local_epochs: int = 1
    adapter_layers: int = 2
    bottleneck: int = 16
    batch_size: int = 16
    client_lr: float = 1e-2
    fedprox_mu: float = 0.01
    server_lr: float = 1e-2
    """FedOPT's server Adam lr (chosen on validation, see the module docstring)."""
    clip: float = 1.0
    """Fixed-point range of each uploaded delta coordinate (clipped values are counted and reported)."""
    seed: int = 0

    def __post_init__(self) -> None:
        checks = [
            (self.max_docs is None or self.max_docs >= 2, "--max-docs must be at least 2"),
            (8 <= self.max_length <= 512, "--max-length must be in 8..512"),
            (self.clients >= 2, "--clients must be at least 2 (secure aggregation needs two)"),
            (math.isfinite(self.alpha) and self.alpha > 0, "--alpha must be a positive number"),
            (self.min_client_docs >= 3, "--min-client-docs must be at least 3 (train, validation, test)"),
            (self.rounds >= 1, "--rounds must be at least 1"),
            (self.clients_per_round is None or 2 <= self.clients_per_round <= self.clients,
             "--clients-per-round must be in 2..--clients"),
            (self.local_epochs >= 1, "--local-epochs must be at least 1"),
            (self.adapter_layers >= 1, "--adapter-layers must be at least 1"),
            (self.bottleneck >= 1 and self.batch_size >= 1, "--bottleneck and --batch-size must be positive"),
            (self.client_lr > 0 and self.fedprox_mu >= 0, "need --client-lr > 0 and --fedprox-mu >= 0"),
            (self.server_lr > 0, "--server-lr must be positive"),
            (self.clip > 0, "--clip must be positive"),
        ]
        if self.max_docs is not None and self.max_docs < self.clients * self.min_client_docs:
            checks.append((False, f"--max-docs {self.max_docs} cannot give {self.clients} clients "
                                  f"{self.min_client_docs} documents each"))
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


QUICK = dict(quick=True, max_docs=600, max_length=64, clients=8, rounds=8, clients_per_round=4)


# ---- command line ------------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="600 articles, 8 clients (4 per round), 8 rounds, 64 tokens")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its checkpoints, with its settings")
    p.add_argument("--out", metavar="DIR", help=f"parent of the run directory (default {DEFAULT_OUT})")
    p.add_argument("--run-name", metavar="NAME", help="run directory name (default: a time stamp)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: robust on a shared machine)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    for field in dataclasses.fields(Settings):
        if field.name == "quick":
            continue
        kind = {"max_docs": int, "max_length": int, "clients": int, "min_client_docs": int, "rounds": int,
                "clients_per_round": int, "local_epochs": int, "adapter_layers": int, "bottleneck": int,
                "batch_size": int, "seed": int}.get(field.name, float)
        p.add_argument("--" + field.name.replace("_", "-"), type=kind, default=None, metavar=kind.__name__.upper())
    return p


def _explicit(args: argparse.Namespace) -> dict[str, Any]:
    """The settings options given on the command line (every one defaults to None, --quick to False)."""
    names = {f.name for f in dataclasses.fields(Settings)}
    return {k: v for k, v in vars(args).items() if k in names and v is not None and v is not False}


def parse_settings(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, Settings]:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error("--threads must be at least 1")
    if args.run_name is not None and (not args.run_name or Path(args.run_name).name != args.run_name
                                      or args.run_name in (".", "..")):
        parser.error("--run-name must be a plain directory name")
    if args.resume and (args.out or args.run_name):
        parser.error("--resume RUN_DIR already names the run directory; drop --out/--run-name")
    chosen = _explicit(args)
    try:
        if args.resume:
            saved = Path(args.resume) / "config.json"
            if not saved.is_file():
                parser.error(f"--resume {args.resume}: no config.json there (not a run directory of this script)")
            settings = Settings(**json.loads(saved.read_text())["settings"])
            clash = {k: v for k, v in chosen.items() if getattr(settings, k) != v}
            if clash:
                parser.error(f"--resume reuses the run's saved settings; these options differ from them: {clash}")
        else:
            base = {**(QUICK if args.quick else {}), **chosen}
            if "clients_per_round" not in base and base.get("clients", Settings.clients) <= Settings.clients_per_round:
                base["clients_per_round"] = None  # the default cohort would be everyone anyway
            settings = Settings(**base)
    except (ValueError, TypeError) as error:
        parser.error(str(error))
    return args, settings


def new_run_dir(out: Path, quick: bool, name: str | None = None) -> Path:
    if name is not None:
        path = out / name
        try:
            path.mkdir(parents=True)
        except FileExistsError:
            raise SystemExit(f"error: {path} exists; pick another --run-name or continue it with --resume") from None
        return path
    stamp = time.strftime("%Y%m%d-%H%M%S") + ("-quick" if quick else "")
    for k in range(100):
        path = out / (stamp if k == 0 else f"{stamp}-{k}")
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f"could not create a fresh run directory under {out}")


# ---- experiment --------------------------------------------------------------------------------

def load_data(settings: Settings) -> TextDataset:
    # ~12 characters per token is far more than enough: truncating here only saves tokeniser time.
    return load_bbc_news(max_examples=settings.max_docs, seed=settings.seed, dedupe=True,
                         max_chars=12 * settings.max_length)


def make_algorithm(method: str, settings: Settings) -> Algorithm:
    if method in ("fedavg", "fedavg_plain"):
        return FedAvg(local_epochs=settings.local_epochs)
    if method == "fedprox":
        return FedProx(mu=settings.fedprox_mu, local_epochs=settings.local_epochs)
    if method == "fedopt":
        return FedOpt(server_optimizer="adam", server_lr=settings.server_lr, tau=1e-3,
                      local_epochs=settings.local_epochs)
    raise ValueError(f"unknown method {method}")


def secure_config(method: str, settings: Settings, max_weight: int) -> SecureAggregationConfig:
    return SecureAggregationConfig(protocol="plain" if method == "fedavg_plain" else "secagg+", clip=settings.clip,
                                   max_weight=float(max_weight), max_clients=settings.clients)


def flat(params: Mapping[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(params[k], dtype=np.float64).ravel() for k in sorted(params)])


def curve(history: Sequence[RoundRecord]) -> list[float]:
    """Mean over clients of their test accuracy, per round."""
    return [r.mean("accuracy") for r in history]


def pooled_curve(history: Sequence[RoundRecord]) -> list[float]:
    """Accuracy over the union of the clients' test splits (a global test set), per round."""
    out = []
    for r in history:
        n = sum(m["examples"] for m in r.metrics.values())
        out.append(sum(m["accuracy"] * m["examples"] for m in r.metrics.values()) / max(n, 1))
    return out


def method_summary(history: Sequence[RoundRecord]) -> dict[str, float]:
    acc = curve(history)
    uploads = [b for r in history for b in r.bytes_uploaded.values()]
    seconds = sum(r.seconds for r in history)
    return {"final_accuracy": acc[-1], "best_accuracy": max(acc), "best_round": int(np.argmax(acc)) + 1,
            "final_pooled_accuracy": pooled_curve(history)[-1], "rounds": len(history),
            "bytes_uploaded_per_client_round": float(np.mean(uploads)) if uploads else 0.0,
            "secure_time_share": sum(r.secure_seconds for r in history) / seconds if seconds > 0 else 0.0,
            "clipped_values": int(sum(r.clipped for r in history)), "seconds": seconds}


def plot_curves(path: Path, histories: Mapping[str, Sequence[RoundRecord]], title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    styles = {"fedavg": "-o", "fedprox": "-s", "fedopt": "-^", "fedavg_plain": ":x"}
    for method, history in histories.items():
        label = LABELS[method] + (" (plaintext sum)" if method == "fedavg_plain" else " (SecAgg+)")
        ax.plot([r.round for r in history], curve(history), styles[method], label=label, markersize=4)
    ax.set_xlabel("round")
    ax.set_ylabel("mean client test accuracy")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def format_table(summaries: Mapping[str, Mapping[str, float]]) -> str:
    head = f"{'method':<15} {'aggregation':<11} {'final acc':>9} {'best acc':>9} {'rounds':>6} " \
           f"{'bytes up/client/round':>21} {'secagg time share':>17}"
    lines = [head, "-" * len(head)]
    for method, s in summaries.items():
        agg = "plain" if method == "fedavg_plain" else "secagg+"
        lines.append(f"{LABELS[method]:<15} {agg:<11} {s['final_accuracy']:>9.4f} {s['best_accuracy']:>9.4f} "
                     f"{s['rounds']:>6d} {s['bytes_uploaded_per_client_round']:>21,.0f} "
                     f"{100 * s['secure_time_share']:>16.1f}%")
    return "\n".join(lines)


def backbone_label(backbone: torch.nn.Module, default: bool) -> str:
    cfg = backbone.config
    name = "all-MiniLM-L6-v2" if default else "injected backbone"
    return f"{name} ({cfg.num_hidden_layers} layers, hidden {cfg.hidden_size})"


@dataclass(frozen=True)
class Clients:
    """The partitioned corpus and its frozen-prefix cache, shared by every method's fresh clients."""

    dataset: TextDataset
    labels: np.ndarray
    partition: Partition
    splits: tuple[ClientSplit, ...]
    cache: PrefixCache
    task: TextTaskConfig

    def trainers(self, model: torch.nn.Module) -> dict[int, SeededTorchTrainer]:
        return build_text_trainers(backbone=model, cache=self.cache, labels=self.labels, splits=self.splits,
                                   num_labels=self.dataset.num_labels, config=self.task)


def check_backbone(model: torch.nn.Module, settings: Settings) -> int:
    """The cached prefix depth for `settings`, or a clear exit when the backbone cannot serve them."""
    try:
        split = prefix_split(model, settings.adapter_layers)
    except ValueError as error:
        raise SystemExit(f"error: --adapter-layers: {error}") from None
    if settings.max_length > model.config.max_position_embeddings:
        raise SystemExit(f"error: --max-length {settings.max_length} exceeds the backbone's "
                         f"{model.config.max_position_embeddings} positions")
    return split


def partition_data(settings: Settings) -> tuple[TextDataset, np.ndarray, Partition, tuple[ClientSplit, ...]]:
    dataset = load_data(settings)
    labels = dataset.label_array()
    try:
        partition = dirichlet_label_skew(labels, num_clients=settings.clients, alpha=settings.alpha,
                                         seed=settings.seed, min_size=settings.min_client_docs)
        splits = client_splits(partition, seed=settings.seed, labels=labels)
    except PartitionError as error:
        raise SystemExit(f"error: cannot partition {len(dataset)} documents: {error}") from None
    return dataset, labels, partition, splits


def run_methods(clients: Clients, model: torch.nn.Module, settings: Settings, run_dir: Path, *, resume: bool,
                progress: bool) -> dict[str, Any]:
    """Every method from the same initial model and cohorts; FedAvg's global model after each round (this
    process's rounds) for the secure-vs-plain comparison."""
    probe = clients.trainers(model)
    sizes = {c: t.num_examples for c, t in probe.items()}
    initial = probe[1].get_shared()
    del probe
    histories: dict[str, list[RoundRecord]] = {}
    finals: dict[str, np.ndarray] = {}
    snapshots: dict[str, dict[int, np.ndarray]] = {"fedavg": {}, "fedavg_plain": {}}
    for method in METHODS:
        config = RunConfig(rounds=settings.rounds, clients_per_round=settings.clients_per_round, seed=settings.seed,
                           secure=secure_config(method, settings, max(sizes.values())),
                           checkpoint_dir=str(run_dir / "checkpoints" / method))
        algorithm = make_algorithm(method, settings)
        runner = SimulationRunner(algorithm=algorithm, trainers=clients.trainers(model), config=config,
                                  initial=initial)
        if method in snapshots:
            runner.on_round = lambda rec, r=runner, a=algorithm, m=method: snapshots[m].__setitem__(
                rec.round, flat(a.shared_parameters(r.state)))
        histories[method] = list(runner.run(resume=resume, progress=progress, desc=method))
        finals[method] = flat(algorithm.shared_parameters(runner.state))
    return {"histories": histories, "finals": finals, "snapshots": snapshots, "sizes": sizes,
            "n_shared": {part: int(v.size) for part, v in initial.items()}}


def secure_vs_plain(runs: Mapping[str, Any], settings: Settings) -> dict[str, Any]:
    """How far FedAvg under SecAgg+ ends from FedAvg under a plaintext sum, next to the encoder's bound."""
    finals, snapshots, sizes = runs["finals"], runs["snapshots"], runs["sizes"]
    encoder = SecureAggregator(secure_config("fedavg", settings, max(sizes.values()))).encoder
    return {
        "secure_vs_plain_max_abs_diff": float(np.max(np.abs(finals["fedavg"] - finals["fedavg_plain"]))),
        "secure_vs_plain_max_abs_diff_by_round": {
            t: float(np.max(np.abs(v - snapshots["fedavg_plain"][t])))
            for t, v in sorted(snapshots["fedavg"].items()) if t in snapshots["fedavg_plain"]},
        "encoder_mean_error_bound_per_round": max(
            encoder.mean_error_bound(n_clients=len(r.contributors),
                                     total_weight=float(sum(sizes[c] for c in r.contributors)))
            for r in runs["histories"]["fedavg"]),
        "encoder_step": encoder.step,
    }


def print_report(summary: Mapping[str, Any], settings: Settings, *, title: str, model_label: str, layers: int,
                 first_round: np.ndarray | None) -> None:
    n_shared, diff = summary["shared_parameters"], summary["secure_vs_plain_max_abs_diff"]
    bound = summary["encoder_mean_error_bound_per_round"]
    print(f"\nFedNLP text classification: {title}, {settings.rounds} rounds, {settings.max_length} tokens")
    print(f"model: {model_label}, frozen; adapters (bottleneck {settings.bottleneck}) "
          f"only in the top {settings.adapter_layers} of {layers} layers + linear head "
          f"(simplification: FedNLP fine-tunes the whole model)")
    print(f"uploaded through secure aggregation: adapter ({n_shared['adapter']:,}) + head ({n_shared['head']:,}) "
          f"parameters, as per-round deltas")
    print(f"clients: AdamW lr {settings.client_lr:g}, {settings.local_epochs} local epoch(s), batch "
          f"{settings.batch_size}; FedProx mu {settings.fedprox_mu:g}; FedOPT server Adam lr {settings.server_lr:g}, "
          f"tau 1e-3")
    print("accuracy: mean over clients of their own test-split accuracy under the global model "
          "(pooled over all test examples in results.json)\n")
    print(format_table(summary["methods"]))
    clipped = sum(s["clipped_values"] for s in summary["methods"].values())
    print(f"\nsecure vs plain FedAvg: max |difference| of final global parameters {diff:.3e}; "
          f"encoder error bound per round and coordinate {bound:.3e}; clipped values {clipped}")
    by_round = summary["secure_vs_plain_max_abs_diff_by_round"]
    if 1 in by_round and first_round is not None:
        # each run: encoder error <= bound, then float32 storage of w + mean update rounds by <= ulp/2
        limit = 2 * bound + float(np.spacing(np.float32(np.max(np.abs(first_round)))))
        print(f"  after round 1 it is {by_round[1]:.3e} (limit: 2 x bound + float32 rounding = {limit:.3e}); "
              f"later rounds' local training carries the difference forward")


def main(argv: Sequence[str] | None = None, *, backbone: tuple[torch.nn.Module, Any] | None = None) -> dict[str, Any]:
    """Run the comparison; `backbone` = (model, tokenizer) replaces MiniLM (tests use a tiny BERT)."""
    ensure_offline()
    args, settings = parse_settings(argv)
    torch.set_num_threads(args.threads)
    progress = not args.no_progress
    t_start = time.perf_counter()

    default_backbone = backbone is None
    model, tokenizer = load_backbone() if backbone is None else backbone
    split = check_backbone(model, settings)
    dataset, labels, partition, splits = partition_data(settings)
    if args.resume:
        run_dir = Path(args.resume)
    else:  # created only once the arguments, backbone and partition have been checked
        run_dir = new_run_dir(Path(args.out) if args.out else DEFAULT_OUT, settings.quick, args.run_name)
        (run_dir / "config.json").write_text(json.dumps({"settings": dataclasses.asdict(settings)}, indent=1))
    encoded = tokenizer(list(dataset.texts), truncation=True, max_length=settings.max_length, padding="longest",
                        return_tensors="pt")
    cache = build_prefix_cache(model, encoded["input_ids"], encoded["attention_mask"], split=split,
                               progress=progress)
    task = TextTaskConfig(adapter_layers=settings.adapter_layers, bottleneck=settings.bottleneck,
                          batch_size=settings.batch_size, lr=settings.client_lr, seed=settings.seed)
    clients = Clients(dataset, labels, partition, splits, cache, task)
    runs = run_methods(clients, model, settings, run_dir, resume=bool(args.resume), progress=progress)

    histories = runs["histories"]
    cohort = "all" if settings.clients_per_round is None else str(settings.clients_per_round)
    title = (f"BBC News, {len(dataset)} docs, {settings.clients} clients, Dir({settings.alpha}) label skew, "
             f"{cohort} clients/round")
    curve_path = plot_curves(run_dir / "curve.png", histories, title)
    summaries = {m: method_summary(h) for m, h in histories.items()}
    summary = {
        "methods": summaries,
        "curves": {m: curve(h) for m, h in histories.items()},
        "pooled_curves": {m: pooled_curve(h) for m, h in histories.items()},
        **secure_vs_plain(runs, settings),
        "shared_parameters": runs["n_shared"], "prefix_split": split,
        "documents": len(dataset), "client_train_sizes": runs["sizes"],
        "client_label_counts": partition.label_counts(labels, dataset.num_labels).tolist(),
        "accuracy_definition": "mean over clients of each client's own test-split accuracy under the global model",
        "wall_seconds": time.perf_counter() - t_start,
    }
    results_path = write_results(run_dir / "results.json", config=settings, runs=histories, summary=summary)
    print_report(summary, settings, title=title, model_label=backbone_label(model, default_backbone),
                 layers=model.config.num_hidden_layers, first_round=runs["snapshots"]["fedavg"].get(1))
    print(f"plot: {curve_path}\nresults: {results_path}\ntime: {summary['wall_seconds']:.0f} s")
    line = (f"fedavg_acc={summaries['fedavg']['final_accuracy']:.4f} "
            f"fedprox_acc={summaries['fedprox']['final_accuracy']:.4f} "
            f"fedopt_acc={summaries['fedopt']['final_accuracy']:.4f} "
            f"secure_vs_plain_max_abs_diff={summary['secure_vs_plain_max_abs_diff']:.3e}")
    print(line, flush=True)
    return {"run_dir": run_dir, "summary": summary, "last_line": line}


if __name__ == "__main__":
    main()
