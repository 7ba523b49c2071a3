"""Is a secure-vs-plaintext drift the secure sum's doing, or training's own sensitivity?

    python -m benchmarks.twin_sensitivity --run results/fednlp/<run> --partition quantity:1 --seed 0

A FedNLP grid run pairs FedAvg under a secure protocol with a plaintext twin. After round 1 they
differ only by the fixed-point encoding (within its bound); later rounds train from slightly
different models, and that difference can grow by training alone. This check reruns the plaintext
twin of one (task, partition, seed) of a finished run twice in this process, on the same batches:
once as saved, and once with the server's model moved by +-`--perturbation` per coordinate after
round `--after-round` (default 1, where the secure twin's difference arises; random signs, rounded to
float32; 0 moves the starting point instead, which also breaks the exact zeros of freshly
initialised adapters, whose first AdamW steps then turn 1e-8 into lr-sized moves). If the nudged pair
drifts apart as the secure twin did, the growth is training's sensitivity to a 1e-8 change, and says
nothing against the secure sum. The rerun's score is also compared with the saved plaintext run's:
`rerun_equals_saved=false` means a rerun of the identical configuration in a fresh process already
ends elsewhere (the CPU math kernels do not promise one summation order across processes, and
training amplifies any last-bit difference alike).

Ends with one line:

    twin_sensitivity task=.. partition=.. seed=.. perturbation=.. after_round=.. round1_diff=.. final_diff=.. secure_round1_diff=.. secure_final_diff=.. rerun_equals_saved=..
"""
from __future__ import annotations

import argparse
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fl_algorithms.experiments.cli import read_cells
from fl_algorithms.experiments.fednlp_grid import cell_key, flat_vector, load_formulation, plan_from_record, run_cell
from nlp_models.cpu import set_torch_threads


def perturbed(initial: Mapping[str, np.ndarray], *, size: float, seed: int) -> dict[str, np.ndarray]:
    """`initial` with +-`size` added to every coordinate (signs from a seeded generator: a numerical
    control, not a secret), kept in each part's dtype."""
    rng = np.random.default_rng(seed)
    return {k: (np.asarray(v, dtype=np.float64) + size * rng.choice((-1.0, 1.0), size=np.shape(v))).astype(
        np.asarray(v).dtype) for k, v in initial.items()}


def round_diffs(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> list[float]:
    """Largest absolute coordinate difference after each round."""
    return [float(np.max(np.abs(x - y))) for x, y in zip(a, b, strict=True)]


def check(run: Path, *, task: str, partition: str, seed: int, size: float, after_round: int = 1,
          backbone: str = "minilm", device: str = "cpu", progress: bool = True) -> dict[str, Any]:
    """Rerun the saved plaintext FedAvg twin, and again with the model nudged by `size` after round
    `after_round` (0: the start); compare both with the secure twin's saved round differences."""
    plan = plan_from_record(json.loads((run / "plan.json").read_text()))
    if not 0 <= after_round < plan.rounds:
        raise ValueError(f"after_round must be in 0..{plan.rounds - 1} (the run has {plan.rounds} rounds)")
    cell = dict(task=task, partition=partition, seed=seed, protocol="plain", algorithm="fedavg")
    saved = read_cells(run / "cells.jsonl", key=cell_key).get(cell_key(cell))
    if saved is None or "secure_vs_plain_round_diffs" not in saved:
        raise ValueError(f"{run} has no finished plaintext twin {cell_key(cell)} with its secure comparison")
    clients = load_formulation(task, plan.settings(task, partition=partition, seed=seed), backbone=backbone,
                               device=device)
    applied: list[float] = []

    def move(parts: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        moved = perturbed(parts, size=size, seed=seed)
        applied.append(float(np.max(np.abs(flat_vector(moved) - flat_vector(parts)))))
        return moved

    def nudge(round: int, parts: Mapping[str, np.ndarray]) -> None:
        if round == after_round:
            for name, value in move(parts).items():
                parts[name][...] = value

    rerun: list[np.ndarray] = []
    other: list[np.ndarray] = []
    clock = time.perf_counter()
    summary, _ = run_cell(cell, clients, plan, progress=progress, round_parameters=rerun)
    if after_round == 0:
        moved_summary, _ = run_cell(cell, clients, plan, progress=progress, round_parameters=other,
                                    initial=move(clients.initial()))
    else:
        moved_summary, _ = run_cell(cell, clients, plan, progress=progress, round_parameters=other, nudge=nudge)
    if not applied or applied[0] == 0:
        raise RuntimeError("the perturbation did not reach the model")
    diffs = round_diffs(rerun, other)
    secure = [float(d) for d in saved["secure_vs_plain_round_diffs"]]
    return {"task": task, "partition": partition, "seed": seed, "perturbation": size, "after_round": after_round,
            "applied": applied[0], "perturbed_round_diffs": diffs, "secure_round_diffs": secure,
            "rerun_equals_saved": summary["score"] == saved["score"] and summary["curve"] == saved["curve"],
            "score": summary["score"], "perturbed_score": moved_summary["score"], "saved_score": saved["score"],
            "curve": summary["curve"], "perturbed_curve": moved_summary["curve"], "saved_curve": saved["curve"],
            "seconds": time.perf_counter() - clock}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run", type=Path, required=True, help="a FedNLP grid run directory with a finished plaintext twin")
    p.add_argument("--task", default="classification")
    p.add_argument("--partition", default="quantity:1")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--perturbation", type=float, default=1e-8, help="added to every coordinate (+-)")
    p.add_argument("--after-round", type=int, default=1, help="nudge the model after this round (0: the start)")
    p.add_argument("--backbone", choices=("minilm", "tiny"), default="minilm")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, help="write the result as JSON here too")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if not args.perturbation > 0:
        p.error("--perturbation must be positive")
    if not (args.run / "plan.json").is_file():
        p.error(f"{args.run} is not a grid run directory (no plan.json)")
    set_torch_threads(args.threads)
    try:
        result = check(args.run, task=args.task, partition=args.partition, seed=args.seed, size=args.perturbation,
                       after_round=args.after_round, backbone=args.backbone, progress=not args.no_progress)
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None
    print(f"round  plaintext pair, nudged after round {args.after_round}  secure vs plaintext (saved)")
    for n, (a, b) in enumerate(zip(result["perturbed_round_diffs"], result["secure_round_diffs"]), start=1):
        print(f"{n:5d}  {a:37.3g}  {b:27.3g}")
    print(f"scores: rerun {result['score']:.4f} (saved {result['saved_score']:.4f}), nudged "
          f"{result['perturbed_score']:.4f}; largest change applied {result['applied']:.3g}; "
          f"{result['seconds']:.0f} s")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    line = (f"twin_sensitivity task={args.task} partition={args.partition} seed={args.seed} "
            f"perturbation={args.perturbation:g} after_round={args.after_round} round1_diff={result['perturbed_round_diffs'][0]:.3g} "
            f"final_diff={result['perturbed_round_diffs'][-1]:.3g} "
            f"secure_round1_diff={result['secure_round_diffs'][0]:.3g} "
            f"secure_final_diff={result['secure_round_diffs'][-1]:.3g} "
            f"rerun_equals_saved={str(result['rerun_equals_saved']).lower()}")
    print(line, flush=True)
    return {**result, "line": line}


if __name__ == "__main__":
    main()
