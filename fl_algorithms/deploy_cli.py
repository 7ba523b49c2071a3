"""Run a federated experiment as separate processes over tcp.

    python -m fl_algorithms.deploy_cli server --task fl_algorithms.tasks.toy:build --clients 3 \\
        --bind tcp://127.0.0.1:5555 [--config run.toml] [--resume]
    python -m fl_algorithms.deploy_cli client --task fl_algorithms.tasks.toy:build --id 1 \\
        --connect tcp://127.0.0.1:5555 [--config run.toml] [--checkpoint-dir DIR]

The server prints one JSON line per round and a final evaluation line.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys

for _v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_v, "1")

from fl_algorithms.experiments.config import load_toml  # noqa: E402
from fl_algorithms.engine.deploy import DeployedClient, DeployedServer, DeploymentConfig  # noqa: E402
from fl_algorithms.engine.sim import RunConfig  # noqa: E402
from fl_algorithms.experiments.task import load_task  # noqa: E402


def _options(pairs: list[str]) -> dict[str, str]:
    out = {}
    for p in pairs:
        k, sep, v = p.partition("=")
        if not sep:
            raise SystemExit(f"--option takes key=value, got {p!r}")
        out[k] = v
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("role", choices=["server", "client"])
    ap.add_argument("--task", required=True, help="module:function returning a Task")
    ap.add_argument("--option", action="append", default=[], help="task option key=value (repeatable)")
    ap.add_argument("--config", help="TOML file with RunConfig fields")
    ap.add_argument("--clients", type=int, help="server: clients to wait for")
    ap.add_argument("--bind", default="tcp://127.0.0.1:5555")
    ap.add_argument("--connect", default="tcp://127.0.0.1:5555")
    ap.add_argument("--id", type=int, help="client id (positive)")
    ap.add_argument("--checkpoint-dir")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--register-timeout", type=float, default=120.0)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    config = load_toml(RunConfig, args.config) if args.config else RunConfig()
    task = load_task(args.task, _options(args.option))
    if args.role == "server":
        from transport.server import ServerDriver

        if not args.clients or args.clients < 1:
            raise SystemExit("server needs --clients N")
        with ServerDriver(args.bind) as driver:
            got = driver.wait_for_clients(count=args.clients, timeout=args.register_timeout)
            if len(got) < args.clients:
                raise SystemExit(f"only {len(got)} of {args.clients} clients registered")
            server = DeployedServer(task=task, config=config, driver=driver)
            for rec in server.run(resume=args.resume)[-config.rounds:]:
                print(json.dumps({"round": rec.round, "contributors": rec.contributors,
                                  "accuracy_before_round": rec.mean("accuracy"), "seconds": round(rec.seconds, 3),
                                  "secure_seconds": round(rec.secure_seconds, 3)}), flush=True)
            final = server.evaluate()
            accs = [m["accuracy"] for m in final.values() if "accuracy" in m]
            print(json.dumps({"final_accuracy": sum(accs) / max(len(accs), 1), "clients": sorted(final)}), flush=True)
            driver.shutdown()
        return 0
    from transport.client import run_client

    if not args.id or args.id < 1:
        raise SystemExit("client needs --id K (positive)")
    client = DeployedClient(client_id=args.id, task=task, config=config, checkpoint_dir=args.checkpoint_dir,
                            deployment=DeploymentConfig())
    summary = run_client(endpoint=args.connect, client_id=args.id, factory=client.protocol_for,
                         handlers=client.handlers())
    print(json.dumps({"client": args.id, "exit": summary.exit_reason, "rounds": len(summary.rounds)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
