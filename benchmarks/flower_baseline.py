"""Flower 1.42 baseline: wall and CPU time of one FedAvg round, plain or secure.

This reproduces the harness of ``/work/shared/research/secagg_anchors.md`` §1 so that our
own protocols can be compared with Flower on the same machine:

* ``flwr.simulation.run_simulation`` with the Ray backend (``num_cpus=2``, 1 CPU per
  ClientApp, so at most two ClientApps run at once);
* a ServerApp running the legacy ``DefaultWorkflow`` with ``FedAvg`` (fraction_fit=1,
  evaluation off); the fit workflow is ``default_fit_workflow`` (plain),
  ``SecAggPlusWorkflow(num_shares=k, reconstruction_threshold=(k+1)//2)`` (secagg+), or
  ``SecAggWorkflow(reconstruction_threshold=0.5)`` (secagg, every client shares with all);
* trivial clients: each fit returns a fresh uniform(-0.5, 0.5) float32 vector of ``dim``
  parameters with ``num_examples=100``, no training.

The first round pays for starting the Ray actors, so ``rounds`` rounds are measured after
one discarded warm-up round and the median is reported.  Each measurement runs in a fresh
Python process (this file run with ``--emit-json``) so that Ray starts and stops cleanly and
the process-tree CPU count holds nothing but this run.

Flower is an optional benchmark dependency: install it with ``make bench-flower``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

PROTOCOLS = ("plain", "secagg+", "secagg")
SECAGG_STAGES = ("setup_stage", "share_keys_stage", "collect_masked_vectors_stage", "unmask_stage")
RAY_NUM_CPUS = 2
NUM_EXAMPLES = 100
_RESULT_TAG = "FLOWER_BASELINE_RESULT "
# Flower reads these at import time; they keep the runs offline and quiet.
_QUIET_ENV = {"FLWR_TELEMETRY_ENABLED": "0", "RAY_USAGE_STATS_ENABLED": "0", "RAY_DEDUP_LOGS": "1"}


@dataclass(frozen=True)
class FlowerRunConfig:
    """One Flower measurement: N clients, d parameters, protocol, k, measured rounds."""

    clients: int
    dim: int
    protocol: str
    num_shares: int | None
    rounds: int

    @property
    def reconstruction_threshold(self) -> int | float | None:
        if self.protocol == "secagg+":
            return (self.num_shares + 1) // 2
        if self.protocol == "secagg":
            return 0.5
        return None


def flower_is_installed() -> bool:
    """True when ``flwr`` and its Ray simulation backend can be imported."""
    return all(importlib.util.find_spec(name) is not None for name in ("flwr", "ray"))


def default_num_shares(clients: int) -> int:
    """k used by the research note: 5 for N <= 10, 11 above (never more than N)."""
    return min(clients, 5 if clients <= 10 else 11)


def measure_flower(
    *,
    clients: int,
    dim: int,
    protocol: str = "secagg+",
    num_shares: int | None = None,
    rounds: int = 3,
) -> dict[str, Any]:
    """Measure Flower ``rounds`` rounds (after one warm-up round) in a fresh process.

    Returns a dict with ``round_s`` (median wall seconds per round), ``cpu_s`` (median
    CPU seconds of the whole process tree per round: driver/ServerApp, Ray raylet/GCS and
    the ClientApp workers), ``driver_cpu_s`` (the driver process alone: ServerApp thread,
    in-memory grid, Ray driver), per-round lists, ``stage_s`` (median wall seconds of each
    SecAgg stage, or of the single plain fit stage), the Flower and Ray versions, the
    runtime used and the 1-minute load average before and after.  A round is the fit
    workflow only; evaluation is off, so the rest of Flower's round loop is a no-op.
    """
    if not flower_is_installed():
        raise RuntimeError(
            "Flower is not installed in this environment; run `make bench-flower` "
            "(it installs flwr==1.42.0 and the packages its Ray simulation needs)."
        )
    config = _validated_config(
        clients=clients, dim=dim, protocol=protocol, num_shares=num_shares, rounds=rounds
    )
    command = [
        sys.executable, os.path.abspath(__file__), "--emit-json",
        "--clients", str(config.clients), "--dim", str(config.dim),
        "--protocol", config.protocol, "--rounds", str(config.rounds),
    ]
    if config.protocol == "secagg+":
        command += ["--num-shares", str(config.num_shares)]
    completed = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, **_QUIET_ENV}, check=False
    )
    for line in reversed(completed.stdout.splitlines()):
        if line.startswith(_RESULT_TAG):
            return json.loads(line[len(_RESULT_TAG):])
    raise RuntimeError(
        f"Flower run failed (exit code {completed.returncode}); last output:\n"
        + "\n".join(completed.stderr.splitlines()[-30:])
    )


def _validated_config(
    *, clients: int, dim: int, protocol: str, num_shares: int | None, rounds: int
) -> FlowerRunConfig:
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
    if clients < 2 or dim < 1 or rounds < 1:
        raise ValueError("need clients >= 2, dim >= 1 and rounds >= 1")
    if protocol == "secagg+":
        num_shares = default_num_shares(clients) if num_shares is None else num_shares
        if not 3 <= num_shares <= clients:
            raise ValueError(f"SecAgg+ needs 3 <= num_shares <= clients, got {num_shares}")
    elif num_shares is not None:
        raise ValueError("num_shares applies to 'secagg+' only ('secagg' shares with all N)")
    return FlowerRunConfig(
        clients=clients, dim=dim, protocol=protocol, num_shares=num_shares, rounds=rounds
    )


# ---------------------------------------------------------------------------------------
# Everything below runs inside the measuring process.


def _process_tree_cpu_seconds(root_pid: int) -> float:
    """User+system CPU of ``root_pid`` and all its live descendants, plus reaped children.

    ``cutime``/``cstime`` keep the time of descendants that exited between two readings,
    so differences of this value are the CPU spent by the tree in between.
    """
    parent_of: dict[int, int] = {}
    ticks_of: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat_file:
                stat = stat_file.read().decode()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        parent_of[int(entry)] = int(fields[1])
        ticks_of[int(entry)] = sum(int(value) for value in fields[11:15])
    total = 0
    for pid, ticks in ticks_of.items():
        ancestor = pid
        while ancestor not in (root_pid, 0, 1) and ancestor in parent_of:
            ancestor = parent_of[ancestor]
        if ancestor == root_pid:
            total += ticks
    return total / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def _load_average_1min() -> float:
    with open("/proc/loadavg") as loadavg:
        return float(loadavg.read().split()[0])


class _Recorder:
    """Per-round wall/CPU times and per-stage wall times, filled by the ServerApp thread."""

    def __init__(self) -> None:
        self.rounds: list[dict[str, Any]] = []
        self.aggregate_ok = False  # set by the strategy when a round yields a plausible mean
        self._stage_s: dict[str, float] = {}

    def timed_fit(self, fit_workflow: Callable[..., None]) -> Callable[..., None]:
        def run_round(grid: Any, context: Any) -> None:
            self._stage_s, self.aggregate_ok = {}, False
            tree_cpu, own_cpu = _process_tree_cpu_seconds(os.getpid()), _own_cpu_seconds()
            start = time.perf_counter()
            fit_workflow(grid, context)
            wall = time.perf_counter() - start
            self.rounds.append({
                "wall_s": wall,
                "cpu_s": _process_tree_cpu_seconds(os.getpid()) - tree_cpu,
                "driver_cpu_s": _own_cpu_seconds() - own_cpu,
                "stage_s": self._stage_s or {"fit": wall},
                "aggregated": self.aggregate_ok,
            })
        return run_round

    def timed_stage(self, name: str, stage: Callable[..., bool]) -> Callable[..., bool]:
        def run_stage(*args: Any, **kwargs: Any) -> bool:
            start = time.perf_counter()
            proceed = stage(*args, **kwargs)
            self._stage_s[name.removesuffix("_stage")] = time.perf_counter() - start
            return proceed
        return run_stage


def _run_here(config: FlowerRunConfig) -> dict[str, Any]:
    """Run the simulation in this process and return the measurement dict."""
    os.environ.update(_QUIET_ENV)
    import numpy as np
    import ray
    import flwr
    from flwr.client import ClientApp, NumPyClient
    from flwr.client.mod import secagg_mod, secaggplus_mod
    from flwr.common import Context, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server import LegacyContext, ServerApp, ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow, SecAggWorkflow
    from flwr.server.workflow.default_workflows import default_fit_workflow
    from flwr.simulation import run_simulation

    dim = config.dim
    recorder = _Recorder()

    class TrivialClient(NumPyClient):
        """Returns fresh uniform(-0.5, 0.5) float32 parameters; no training."""

        def get_parameters(self, config: dict) -> list:
            return [np.zeros(dim, dtype=np.float32)]

        def fit(self, parameters: list, config: dict) -> tuple:
            update = np.random.default_rng().uniform(-0.5, 0.5, dim).astype(np.float32)
            return [update], NUM_EXAMPLES, {}

    def client_fn(context: Context) -> Any:
        return TrivialClient().to_client()

    class CheckedFedAvg(FedAvg):
        """FedAvg that notes whether each round produced a plausible aggregate."""

        def aggregate_fit(self, server_round: int, results: list, failures: list) -> tuple:
            parameters, metrics = super().aggregate_fit(server_round, results, failures)
            if parameters is not None:
                (mean,) = parameters_to_ndarrays(parameters)
                recorder.aggregate_ok = bool(
                    mean.shape == (dim,) and np.all(np.abs(mean) <= 0.5 + 1e-3)
                )
            return parameters, metrics

    mods = {"plain": [], "secagg+": [secaggplus_mod], "secagg": [secagg_mod]}[config.protocol]
    client_app = ClientApp(client_fn=client_fn, mods=mods)
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Any, context: Context) -> None:
        strategy = CheckedFedAvg(
            fraction_fit=1.0, fraction_evaluate=0.0,
            min_fit_clients=config.clients, min_evaluate_clients=0,
            min_available_clients=config.clients,
            initial_parameters=ndarrays_to_parameters([np.zeros(dim, dtype=np.float32)]),
        )
        legacy_context = LegacyContext(
            context=context, config=ServerConfig(num_rounds=config.rounds + 1), strategy=strategy
        )
        if config.protocol == "plain":
            fit_workflow: Callable[..., None] = default_fit_workflow
        else:
            if config.protocol == "secagg+":
                fit_workflow = SecAggPlusWorkflow(
                    num_shares=config.num_shares,
                    reconstruction_threshold=config.reconstruction_threshold,
                )
            else:
                fit_workflow = SecAggWorkflow(
                    reconstruction_threshold=config.reconstruction_threshold
                )
            for stage in SECAGG_STAGES:
                setattr(fit_workflow, stage, recorder.timed_stage(stage, getattr(fit_workflow, stage)))
        DefaultWorkflow(fit_workflow=recorder.timed_fit(fit_workflow))(grid, legacy_context)

    load_before = _load_average_1min()
    started = time.perf_counter()
    run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=config.clients,
        backend_name="ray",
        backend_config={
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"num_cpus": RAY_NUM_CPUS, "include_dashboard": False},
        },
    )
    total_s = time.perf_counter() - started
    load_after = _load_average_1min()

    if len(recorder.rounds) != config.rounds + 1:
        raise RuntimeError(f"expected {config.rounds + 1} rounds, recorded {len(recorder.rounds)}")
    measured = recorder.rounds[1:]
    if not all(record["aggregated"] for record in recorder.rounds):
        raise RuntimeError("a Flower round finished without a valid aggregate (SecAgg halted?)")
    stage_names = list(measured[0]["stage_s"])
    return {
        **asdict(config),
        "reconstruction_threshold": config.reconstruction_threshold,
        "num_shares_effective": {"plain": None, "secagg+": config.num_shares,
                                 "secagg": config.clients}[config.protocol],
        "round_s": statistics.median(r["wall_s"] for r in measured),
        "cpu_s": statistics.median(r["cpu_s"] for r in measured),
        "driver_cpu_s": statistics.median(r["driver_cpu_s"] for r in measured),
        "stage_s": {
            name: statistics.median(r["stage_s"][name] for r in measured) for name in stage_names
        },
        "warmup_round_s": recorder.rounds[0]["wall_s"],
        "rounds_wall_s": [r["wall_s"] for r in measured],
        "rounds_cpu_s": [r["cpu_s"] for r in measured],
        "total_s": total_s,
        "flwr_version": flwr.__version__,
        "ray_version": ray.__version__,
        "runtime": (
            f"flwr.simulation.run_simulation, backend=ray, num_cpus={RAY_NUM_CPUS}, "
            "1 CPU per ClientApp; legacy DefaultWorkflow + FedAvg(fraction_fit=1, no evaluation)"
        ),
        "cpu_s_scope": "process tree: driver (ServerApp, in-memory grid) + Ray GCS/raylet + workers",
        "loadavg_1min_before": load_before,
        "loadavg_1min_after": load_after,
    }


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--dim", type=int, default=100_000)
    parser.add_argument("--protocol", choices=PROTOCOLS, default="secagg+")
    parser.add_argument("--num-shares", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds after 1 warm-up")
    parser.add_argument("--emit-json", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    if not flower_is_installed():
        sys.exit("Flower is not installed; run `make bench-flower`.")
    config = _validated_config(
        clients=args.clients, dim=args.dim, protocol=args.protocol,
        num_shares=args.num_shares, rounds=args.rounds,
    )
    result = _run_here(config)
    if args.emit_json:
        print(_RESULT_TAG + json.dumps(result), flush=True)
        return
    print(
        f"flower protocol={result['protocol']} N={result['clients']} d={result['dim']} "
        f"round_s={result['round_s']:.3f} cpu_s={result['cpu_s']:.3f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
