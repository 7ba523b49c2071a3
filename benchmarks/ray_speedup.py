"""The Ray backend on FedNLP's quick run: the same final parameters as the in-memory driver, and the
speedup against the number of worker actors (cores).

    python -m benchmarks.ray_speedup                     # workers 1, 2 (this machine's cores)
    python -m benchmarks.ray_speedup --workers 1,2,4,8,16 --rounds 6 --clients 16

FedAvg over FedNLP's quick corpus (BBC topics, 600 articles; 8 clients by default, `--clients 16` to
give 16 workers a client each), all clients every round, SecAgg+. Both
runs derive the clients' stochastic rounding from a public test seed (`insecure_seed`) so the
parameters can be compared bit for bit: this run reports no privacy. Each worker actor runs torch
with one thread, as does the in-memory driver here. Ends with one line per worker count:

    ray workers=.. seconds=.. speedup=.. startup_s=.. same_parameters=..

`seconds` and `speedup` time the rounds alone; `startup_s` is the start of the actors and the shipping
of their clients (trainers, models), paid once per run.
"""
from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Sequence

import numpy as np
import torch

from fl_algorithms.engine.sim import RunConfig, SimulationRunner
from fl_algorithms.tasks.fednlp import QUICK, FedNLPClients, FedNLPSettings, make_algorithm, secure_config


def run(clients: FedNLPClients, *, rounds: int, backend: str,
        workers: int | None = None) -> tuple[float, float, np.ndarray]:
    """(seconds to start the runner, its actors included; seconds for the rounds; final shared parameters)."""
    settings = clients.settings
    sizes = [len(s.train) for s in clients.corpus.splits]
    secure = dataclasses.replace(secure_config(settings, protocol="secagg+", max_weight=max(sizes)), insecure_seed=11)
    config = RunConfig(rounds=rounds, seed=settings.seed, sampler="seeded", secure=secure, backend=backend,
                       ray_workers=workers)
    algorithm = make_algorithm("fedavg", settings)
    start = time.perf_counter()
    runner = SimulationRunner(algorithm=algorithm, config=config, initial=clients.initial(),
                              trainers={c: clients.make_trainer(c) for c in range(1, clients.num_clients + 1)})
    startup = time.perf_counter() - start
    try:
        start = time.perf_counter()
        runner.run(progress=False)
        seconds = time.perf_counter() - start
    finally:
        runner.close()
    shared = algorithm.shared_parameters(runner.state)
    return startup, seconds, np.concatenate([np.asarray(shared[k]).ravel() for k in sorted(shared)])


def main(argv: Sequence[str] | None = None) -> dict[int, tuple[float, bool]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", default="1,2", help="comma-separated Ray worker-actor counts")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=QUICK["clients"],
                    help="clients sharing the quick corpus (a worker count above it leaves workers idle)")
    ap.add_argument("--backbone", choices=("minilm", "tiny"), default="minilm")
    ap.add_argument("--address", default=None, help="a running Ray cluster ('auto'); default: start one here")
    args = ap.parse_args(argv)
    try:
        counts = [int(x) for x in args.workers.split(",")]
    except ValueError:
        ap.error("--workers must be comma-separated integers")
    if min(counts) < 1 or args.rounds < 1 or args.clients < 2:
        ap.error("need workers >= 1, rounds >= 1 and clients >= 2")
    from fl_algorithms.engine.ray_backend import require_ray

    ray = require_ray()
    torch.set_num_threads(1)
    settings = FedNLPSettings(**{**QUICK, "clients": args.clients, "clients_per_round": None})
    clients = FedNLPClients(settings, backbone=args.backbone)
    _, base_s, base = run(clients, rounds=args.rounds, backend="memory")
    print(f"in memory (one process, one thread): {base_s:.1f} s for {args.rounds} rounds of {clients.num_clients} clients",
          flush=True)
    ray.init(address=args.address, num_cpus=None if args.address else max(counts), include_dashboard=False,
             log_to_driver=False)
    out = {}
    try:
        for k in counts:
            startup, seconds, params = run(clients, rounds=args.rounds, backend="ray", workers=k)
            out[k] = (seconds, bool(np.array_equal(params, base)))
            print(f"ray workers={k} seconds={seconds:.1f} speedup={base_s / seconds:.2f} startup_s={startup:.1f} "
                  f"same_parameters={out[k][1]}", flush=True)
    finally:
        ray.shutdown()
    return out


if __name__ == "__main__":
    main()
