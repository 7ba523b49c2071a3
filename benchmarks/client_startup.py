"""How long a deployed client spends importing before its first round (issue 57's budget: 3 s).

For each task, a fresh process does what ``deploy_cli client`` does before it registers: import the
command, the transport client and the task, build the task and client 1's trainer (backbone, tokenizer,
data). Run under ``python -X importtime``, the import time is the sum of the top-level entries, so it
counts every import the client makes before its first round, lazy ones included, and no compute.

    python -m benchmarks.client_startup            # toy, fednlp and fedmcp (MiniLM) clients
    python -m benchmarks.client_startup --repeat 3 # best of three per task (imports hit the disk cache)

Last lines: ``client_startup task=.. import_seconds=.. ready_seconds=.. transformers=0|1 budget=3.0``.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time

TASKS = {
    "toy": ("fl_algorithms.tasks.toy:build", {}),
    "fednlp": ("fl_algorithms.tasks.fednlp:build", {}),
    "fedmcp": ("fl_algorithms.tasks.fedmcp:build", {}),
}
BUDGET = 3.0
_CHILD = """
import json, sys, time
start = time.perf_counter()
import fl_algorithms.deploy_cli, transport.client
from fl_algorithms.experiments.task import load_task
task = load_task({spec!r}, {options!r})
task.make_trainer(1)
print(json.dumps({{"ready": time.perf_counter() - start, "transformers": "transformers" in sys.modules}}))
"""
_LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)")


def top_level_import_seconds(stderr: str) -> float:
    """Sum of the cumulative times of the top-level imports in ``-X importtime`` output."""
    total = 0
    for line in stderr.splitlines():
        match = _LINE.match(line)
        if match and len(match.group(3)) == 1:   # one space after '|': not nested under another import
            total += int(match.group(2))
    return total / 1e6


def measure(name: str) -> dict[str, float]:
    spec, options = TASKS[name]
    code = _CHILD.format(spec=spec, options=options)
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                          timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"the {name} client did not start:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {"import_seconds": top_level_import_seconds(done.stderr), "ready_seconds": result["ready"],
            "transformers": int(result["transformers"])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated, from {', '.join(TASKS)}")
    ap.add_argument("--repeat", type=int, default=1, help="runs per task; the fastest import time is reported")
    args = ap.parse_args(argv)
    names = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = set(names) - set(TASKS)
    if unknown or args.repeat < 1:
        ap.error(f"unknown tasks {sorted(unknown)}" if unknown else "--repeat must be >= 1")
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, python -X importtime, best of {args.repeat}",
          flush=True)
    for name in names:
        best = min((measure(name) for _ in range(args.repeat)), key=lambda r: r["import_seconds"])
        print(f"client_startup task={name} import_seconds={best['import_seconds']:.2f} "
              f"ready_seconds={best['ready_seconds']:.2f} transformers={best['transformers']} budget={BUDGET}",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
