"""Run a Task as a real deployment on this machine: the server in this process, every client a
separate `python -m fl_algorithms.deploy_cli client` process, all over tcp on loopback.

This is what an example's `--runtime deploy` does. Each client process rebuilds the task from
`task_spec` and `options` (so it holds only what its own `make_trainer` builds), reads the run's
secure-aggregation settings from a TOML file, and writes its output to `<log_dir>/client-<id>.log`.
A client that dies before registering stops the run with its log's last lines, never a silent hang.
Every launch enrols its clients afresh in `<log_dir>/keys` (`transport.enrolment`), so even a
loopback run is authenticated and encrypted (CurveZMQ, signed round keys) like a real deployment.
`limits` (the transport's `FrameLimits`) applies to the server and, as `--max-message-mib` and
`--max-frames`, to every client process: raise it for models above the 64 MiB default.

Client processes run in their own session, so a terminal's Ctrl-C reaches the server alone: it tells
every client why the run ends (`DeployedServer.run`), shuts the transport down and gives them
`STOP_GRACE` seconds to say so in their logs before killing what is left; the KeyboardInterrupt (or
`DeploymentStopped`) then reaches the caller, which prints one line.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import tomli_w

from fl_algorithms.engine.deploy import DeployedServer, DeploymentConfig
from fl_algorithms.engine.round import RoundRecord
from fl_algorithms.engine.sim import RunConfig
from fl_algorithms.experiments.task import Task
from transport.framing import DEFAULT_LIMITS, FrameLimits

log = logging.getLogger(__name__)

STOP_GRACE = 10.0
"""Seconds client processes get to exit after the transport's shutdown when the run ended early (60 after a
finished run: a client may be finishing an evaluation)."""


class LaunchError(RuntimeError):
    """A client process failed to start or register; the message carries its log's tail."""


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _plain(value):
    """A dataclass as TOML-ready data: None values dropped (TOML has no null), tuples as lists."""
    if dataclasses.is_dataclass(value):
        value = dataclasses.asdict(value)
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def write_client_config(config: RunConfig, path: Path) -> Path:
    """The client's view of the run: its secure-aggregation table and evaluation splits (with a curve
    split, also the number of rounds: the last one is evaluated on the test split)."""
    view = {"eval_split": config.eval_split, "secure": _plain(config.secure)}
    if config.curve_split is not None:
        view.update(curve_split=config.curve_split, rounds=config.rounds)
    path.write_text(tomli_w.dumps(view))
    return path


def client_command(*, task_spec: str, options: Mapping[str, str], config_path: Path, client_id: int, keys: Path | None,
                   endpoint: str, limits: FrameLimits = DEFAULT_LIMITS) -> list[str]:
    """The deploy_cli command line of one client process; `limits` become --max-message-mib (rounded
    up to whole MiB) and --max-frames."""
    command = [sys.executable, "-m", "fl_algorithms.deploy_cli", "client", "--task", task_spec,
               "--config", str(config_path), "--id", str(client_id), "--connect", endpoint,
               *(["--keys", str(keys)] if keys is not None else ["--insecure"]),
               "--max-message-mib", str(math.ceil(limits.max_message_bytes / (1 << 20))),
               "--max-frames", str(limits.max_frames)]
    for key, value in options.items():
        command += ["--option", f"{key}={value}"]
    return command


def run_on_loopback(*, task: Task, task_spec: str, options: Mapping[str, str], config: RunConfig, clients: int,
                    log_dir: Path, on_round: Callable[[RoundRecord, DeployedServer], None] | None = None,
                    register_timeout: float = 900.0, deployment: DeploymentConfig = DeploymentConfig(),
                    ledger=None, resume: bool = False, client_checkpoints: Path | None = None,
                    limits: FrameLimits = DEFAULT_LIMITS) -> DeployedServer:
    """Start `clients` client processes (ids 1..clients), run every round, stop them; return the server
    (its `history` and `state`). `task` is this process's (server-side) copy of the task;
    `on_round(record, server)` runs after each round; `client_checkpoints/client-<id>` holds each
    client's own state (optimiser, personal parts) so that `resume` continues every side; `limits`
    bounds the messages both sides read (raise it for bigger models)."""
    from transport.server import ServerConfig, ServerDriver

    if clients < 2:
        raise ValueError("a deployment needs at least 2 clients")
    from transport.cli import MAX_FRAMES, MAX_MESSAGE_MIB, MIN_FRAMES

    if limits.max_message_bytes > MAX_MESSAGE_MIB << 20 or not MIN_FRAMES <= limits.max_frames <= MAX_FRAMES:
        raise ValueError(f"limits: client processes take at most {MAX_MESSAGE_MIB} MiB and {MIN_FRAMES}..{MAX_FRAMES} "
                         f"frames, got {limits.max_message_bytes} bytes and {limits.max_frames} frames")
    from transport.enrolment import enrol, load_server

    log_dir.mkdir(parents=True, exist_ok=True)
    config_path = write_client_config(config, log_dir / "client_config.toml")
    keys = log_dir / "keys"  # a fresh enrolment per launch: authenticated and encrypted even on loopback
    if not (keys / "roster.json").exists():
        enrol(keys, clients=range(1, clients + 1))
    curve, roster = load_server(keys)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    procs: dict[int, subprocess.Popen] = {}
    logs: dict[int, Path] = {}
    early = started = False
    with ServerDriver("tcp://127.0.0.1:*", curve=curve, config=ServerConfig(limits=limits)) as driver:
        try:
            for cid in range(1, clients + 1):
                logs[cid] = log_dir / f"client-{cid}.log"
                with open(logs[cid], "wb") as out:
                    procs[cid] = subprocess.Popen(
                        client_command(task_spec=task_spec, options=options, config_path=config_path, client_id=cid,
                                       endpoint=driver.endpoint, keys=keys, limits=limits)
                    + ([] if client_checkpoints is None
                       else ["--checkpoint-dir", str(client_checkpoints / f"client-{cid}")]),
                        stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            deadline = time.monotonic() + register_timeout
            while len(driver.clients) < clients:
                dead = {c: p.returncode for c, p in procs.items() if p.poll() is not None}
                if dead:
                    c, code = sorted(dead.items())[0]
                    raise LaunchError(f"client {c} exited with code {code} before registering; "
                                      f"its log ({logs[c]}) ends:\n{_tail(logs[c])}")
                if time.monotonic() > deadline:
                    missing = sorted(set(procs) - driver.clients)
                    raise LaunchError(f"clients {missing} did not register within {register_timeout:.0f} s; "
                                      f"see {log_dir}")
                driver.wait_for_clients(count=clients, timeout=1.0)
            started = True  # every client registered: from here on the server tells them how the run ends
            server = DeployedServer(task=task, config=config, driver=driver, deployment=deployment, ledger=ledger,
                                    roster=roster)
            if on_round is not None:
                server.on_round = lambda rec: on_round(rec, server)
            if resume:
                server.load()
            server.run()
        except BaseException:
            early = True
            if not started:  # still registering: nobody has been told anything
                _kill(procs)
            raise
        finally:
            driver.shutdown()  # tells every registered client to exit (the server has said why: DeployedServer.run)
            deadline = time.monotonic() + (STOP_GRACE if early else 60.0)
            try:
                for cid, p in procs.items():
                    try:
                        p.wait(timeout=max(0.1, deadline - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait()
                        log.warning("client %d did not exit after shutdown; killed", cid)
            except KeyboardInterrupt:  # a second Ctrl-C: stop waiting
                _kill(procs)
                raise
    failed = {c: p.returncode for c, p in procs.items() if p.returncode not in (0, None)}
    if failed:
        log.warning("client processes exited with errors %s; see %s", failed, log_dir)
    return server


def _kill(procs: Mapping[int, subprocess.Popen]) -> None:
    """Kill the client processes still running (each by its own pid) and reap them."""
    for p in procs.values():
        if p.poll() is None:
            p.kill()
    for p in procs.values():
        p.wait()


__all__ = ["STOP_GRACE", "LaunchError", "run_on_loopback", "client_command", "write_client_config"]
