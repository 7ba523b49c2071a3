"""Run a federated experiment as separate processes over tcp.

    python -m fl_algorithms.deploy_cli server --keys keys --task fl_algorithms.tasks.toy:build --clients 3 \\
        --bind tcp://127.0.0.1:5555 [--config run.toml] [--rounds N] [--protocol secagg+] \\
        [--checkpoint-dir DIR] [--resume] [--max-message-mib 64] [--max-frames 64]
    python -m fl_algorithms.deploy_cli client --keys keys --task fl_algorithms.tasks.toy:build --id 1 \\
        --connect tcp://127.0.0.1:5555 [--config run.toml] [--protocol secagg+] [--checkpoint-dir DIR] \\
        [--max-message-mib 64] [--max-frames 64]

Both sides need `--keys DIR`: a folder with the roster and that party's own secrets, from
`python -m transport.cli enrol-client` / `init-server` / `roster` (or the trusted dealer `enrol`):
CurveZMQ with a client allowlist and a pinned server key; round keys signed by each client's
enrolled key. `--insecure` is for development on a trusted machine, and says so loudly.

`--max-message-mib` / `--max-frames` set the largest message a side reads (default 64 MiB in 64
frames): a client receives the model (one frame per part), the server the secure sums' replies
(about 4 bytes per model value), so raise them for bigger models.

The server prints one JSON line per round as the round completes, then a final evaluation line.
Server and clients must agree on the configuration (protocol, encoding, DP): a client that differs
is refused with an error that names both sides. `--checkpoint-dir` holds the server's checkpoint
(and `ledger.json` under distributed DP) or the client's own; `--resume` continues the server's run,
with more `--rounds` than it was saved with if given (a finished run is extended). `--run-dir` also
gets config.toml (the run config, task, algorithm and how cohorts are drawn), metrics.jsonl/.csv per
round, curve.png, results.json and ledger.json.

Ends and exit status. The server exits 0 after a finished run; 3 when it stopped because fewer
clients are connected than a secure sum needs (before a round that could release nothing) or when
rounds released nothing; 130 on SIGINT, printing one line with the round reached and the exact
command that resumes the run. It tells every client why the run ended; a client prints
`{"client": K, "exit": "finished", ...}` and exits 0, or says that the server stopped the run (why,
after which round) or went away (its connection closed without a word) and exits 1.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from pathlib import Path
from typing import Any

from fl_algorithms.engine.deploy import (DeployedClient, DeployedServer, DeploymentConfig, DeploymentStopped, client_exit,
                                         describe_round)
from fl_algorithms.engine.sim import RunConfig, describe_cohorts
from fl_algorithms.experiments.interrupt import INTERRUPTED_EXIT, STOPPED_EXIT, interrupted_line, reached
from fl_algorithms.experiments.config import load_toml
from fl_algorithms.experiments.task import Task, load_task
from secagg.protocols import registry
from transport.cli import add_limit_options, frame_limits
from transport.framing import FrameLimits


def _options(pairs: list[str], parser: argparse.ArgumentParser) -> dict[str, str]:
    out = {}
    for p in pairs:
        k, sep, v = p.partition("=")
        if not sep or not k:
            parser.error(f"--option takes key=value, got {p!r}")
        out[k] = v
    return out


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value
    return parse


def _endpoint(text: str) -> str:
    if not text.startswith(("tcp://", "ipc://", "inproc://")):
        raise argparse.ArgumentTypeError(f"endpoint must start with tcp://, ipc:// or inproc://, got {text!r}")
    return text


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m fl_algorithms.deploy_cli", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("role", choices=["server", "client"])
    ap.add_argument("--task", required=True, help="module:function returning a Task")
    ap.add_argument("--option", action="append", default=[], help="task option key=value (repeatable)")
    ap.add_argument("--config", help="TOML file with RunConfig fields (see examples/configs/)")
    ap.add_argument("--rounds", type=_positive(int), help="override the config's rounds")
    ap.add_argument("--protocol", choices=registry.names(), help="override the config's secure-aggregation protocol")
    ap.add_argument("--clients", type=_positive(int), help="server: clients to wait for")
    ap.add_argument("--bind", type=_endpoint, default="tcp://127.0.0.1:5555")
    ap.add_argument("--connect", type=_endpoint, default="tcp://127.0.0.1:5555")
    ap.add_argument("--id", type=_positive(int), help="client id (positive)")
    ap.add_argument("--checkpoint-dir", help="server: run checkpoints and ledger; client: its own state")
    ap.add_argument("--resume", action="store_true", help="server: continue from --checkpoint-dir")
    ap.add_argument("--run-dir", help="server: a run directory (config.toml, metrics.jsonl/csv per round as it "
                                      "completes, results.json, ledger.json); also the checkpoint dir if none given")
    ap.add_argument("--keys", help="enrolment folder: roster.json and this party's secrets "
                                   "(`python -m transport.cli enrol-client`, `init-server`, `roster`)")
    ap.add_argument("--insecure", action="store_true", help="no authentication or encryption: development only")
    ap.add_argument("--register-timeout", type=_positive(float), default=120.0)
    ap.add_argument("--broadcast-timeout", type=_positive(float), default=600.0)
    ap.add_argument("--stage-timeout", type=_positive(float), default=60.0)
    add_limit_options(ap)
    return ap


def run_config(args: argparse.Namespace, ap: argparse.ArgumentParser) -> RunConfig:
    try:
        config = load_toml(RunConfig, args.config) if args.config else RunConfig()
        secure = config.secure if args.protocol is None else dataclasses.replace(config.secure, protocol=args.protocol)
        changes = {"secure": secure}
        if args.rounds is not None:
            changes["rounds"] = args.rounds
        if args.role == "server" and (args.checkpoint_dir or args.run_dir):
            changes["checkpoint_dir"] = args.checkpoint_dir or str(Path(args.run_dir) / "checkpoints")
        return dataclasses.replace(config, **changes)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        ap.error(f"--config {args.config}: {exc}")


PROGRAM = "python -m fl_algorithms.deploy_cli"


def resume_command(argv: list[str], args: argparse.Namespace) -> str | None:
    """The server's command line again with --resume (None without --checkpoint-dir or --run-dir: nothing to
    resume from)."""
    import shlex

    if not (args.checkpoint_dir or args.run_dir):
        return None
    return " ".join([PROGRAM, *map(shlex.quote, argv), *([] if args.resume else ["--resume"])])


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    if args.role == "server" and args.clients is None:
        ap.error("server needs --clients N")
    if args.role == "client" and args.id is None:
        ap.error("client needs --id K")
    if args.resume and not (args.role == "server" and (args.checkpoint_dir or args.run_dir)):
        ap.error("--resume is for the server and needs --checkpoint-dir or --run-dir")
    from transport.cli import use_enrolment
    from transport.enrolment import load_client, load_server

    try:
        curve, roster, identity = None, None, None
        if use_enrolment(args):
            if args.role == "server":
                curve, roster = load_server(Path(args.keys))
            else:
                curve, identity = load_client(Path(args.keys), args.id)
    except (OSError, ValueError) as exc:
        ap.error(f"--keys {args.keys}: {exc}" if args.keys else str(exc))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    config = run_config(args, ap)
    try:
        task = load_task(args.task, _options(args.option, ap))
    except (ImportError, AttributeError, ValueError) as exc:
        ap.error(f"--task {args.task}: {exc}")
    deployment = DeploymentConfig(broadcast_timeout=args.broadcast_timeout, stage_timeout=args.stage_timeout)
    limits = frame_limits(args)
    if args.role == "server":
        try:
            return serve(args, ap, argv=argv, config=config, task=task, deployment=deployment, limits=limits,
                         curve=curve, roster=roster)
        except KeyboardInterrupt:  # during registration (the run itself answers in serve)
            print(interrupted_line(what="no round had started", command=resume_command(argv, args)),
                  file=sys.stderr, flush=True)
            return INTERRUPTED_EXIT
    from transport.client import ClientConfig, ProtocolMismatchError, RegistrationError, run_client

    client = DeployedClient(client_id=args.id, task=task, config=config, checkpoint_dir=args.checkpoint_dir,
                            deployment=deployment, identity=identity)
    client_config = ClientConfig(limits=limits)
    try:
        summary = run_client(endpoint=args.connect, client_id=args.id, factory=client.protocol_for,
                             handlers=client.handlers(), curve=curve, config=client_config)
    except (ProtocolMismatchError, RegistrationError) as exc:
        print(f"error: client {args.id}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted: client {args.id} after round {client.last_round}", file=sys.stderr, flush=True)
        return INTERRUPTED_EXIT
    end = client_exit(client_id=args.id, exit_reason=summary.exit_reason, end=client.server_end,
                      last_round=client.last_round, idle_timeout=client_config.idle_timeout)
    print(json.dumps(end.line), flush=True)
    if end.message:
        print(end.message, file=sys.stderr, flush=True)
    return end.code


def serve(args: argparse.Namespace, ap: argparse.ArgumentParser, *, argv: list[str], config: RunConfig, task: Task,
          deployment: DeploymentConfig, limits: FrameLimits, curve: Any, roster: Any) -> int:
    """The server side of main: wait for the clients, run the rounds, write the run directory."""
    from secagg.protocols import registry
    from transport.server import ServerConfig, ServerDriver, release_large_buffers

    ledger = None
    if config.secure.distributed_dp is not None:
        from dp.ledger import Ledger

        ledger = Ledger()
    if registry.server_class(config.secure.protocol).release_buffers:  # its large pieces go back to the OS
        release_large_buffers()
    with ServerDriver(args.bind, curve=curve, config=ServerConfig(limits=limits)) as driver:
        got = driver.wait_for_clients(count=args.clients, timeout=args.register_timeout)
        if len(got) < args.clients:
            print(f"error: only {len(got)} of {args.clients} clients registered", file=sys.stderr)
            return 1
        run = None
        if args.run_dir:
            from fl_algorithms.experiments.rundir import RunDirectory

            run = RunDirectory(Path(args.run_dir))
            run.path.mkdir(parents=True, exist_ok=True)
            run.write_config({"run": config, "task": args.task, "algorithm": task.algorithm.name,
                              "options": _options(args.option, ap), "cohorts": describe_cohorts(config)})

        def on_round(rec) -> None:
            if run is not None:  # logged before it is announced: whoever reads the line finds it in the run
                run.log_round(dataclasses.asdict(rec))
            print(describe_round(rec), flush=True)

        server = DeployedServer(task=task, config=config, driver=driver, deployment=deployment, ledger=ledger,
                                on_round=on_round, roster=roster)
        if args.resume and server.load() and run is not None:
            run.truncate_rounds(after=len(server.history))
        try:
            server.run()
        except KeyboardInterrupt:
            what = reached([{"round": r.round} for r in server.history], rounds=config.rounds)  # the checkpointed ones
            print(interrupted_line(what=what, command=resume_command(argv, args)), file=sys.stderr, flush=True)
            return INTERRUPTED_EXIT
        except DeploymentStopped as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            command = resume_command(argv, args)
            if command:
                print(f"when enough clients are back: {command}", file=sys.stderr, flush=True)
            return STOPPED_EXIT
        finally:
            if run is not None:
                run.write_curve(title=f"{task.algorithm.name}, {args.task}")
                if ledger is not None:
                    ledger.write(run.ledger_path)
                run.close()
        final = server.history[-1].metrics if server.history else server.evaluate()
        accs = [m["accuracy"] for m in final.values() if "accuracy" in m]
        summary = {"final_accuracy": sum(accs) / max(len(accs), 1), "clients": sorted(final)}
        if run is not None:
            run.write_results({"summary": summary, "rounds": [dataclasses.asdict(r) for r in server.history]})
        print(json.dumps(summary), flush=True)
        driver.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
