"""What a run prints when it is interrupted (SIGINT) or stopped: one line naming the round it reached
and the exact command that resumes it, instead of a traceback.

    interrupted: fedprox (seed 0) reached round 3 of 8; resume with: python examples/fednlp_classification.py --resume results/fednlp/20261129-0500

The round reached is the last one logged to the run directory's metrics.jsonl (rounds are logged
after their checkpoint is written, so a resumed run starts right after it). The command keeps the
options of the interrupted command line that say where the run executes (device, threads, ...), the
only ones `--resume` takes besides the run directory.
"""
from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

RUN_LOCATION = {"--device": True, "--threads": True, "--no-progress": False, "--ray-address": True}
"""Options a resume command carries over from the interrupted command line (option -> takes a value)."""
INTERRUPTED_EXIT = 130
"""Exit status of a run stopped by SIGINT (128 + 2, as shells report it)."""
STOPPED_EXIT = 3
"""Exit status of a deployment stopped or ended with rounds that released nothing."""


def shown(path: Path) -> str:
    """`path` relative to the working directory when it lies under it, else absolute (for a command line)."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def script_command(script: str | Path) -> str:
    """'python <script>' with the script relative to the working directory where possible."""
    return f"python {shlex.quote(shown(Path(script)))}"


def carried_options(argv: Sequence[str], keep: Mapping[str, bool] = RUN_LOCATION) -> list[str]:
    """The options of `argv` named in `keep` (with their values, '--opt value' or '--opt=value'), in order."""
    out: list[str] = []
    args = list(argv)
    for i, arg in enumerate(args):
        name, eq, _ = arg.partition("=")
        if name not in keep:
            continue
        if eq or not keep[name]:
            out.append(arg)
        elif i + 1 < len(args):
            out += [arg, args[i + 1]]
    return out


def resume_command(*, program: str, run_dir: Path, argv: Sequence[str] = (),
                   keep: Mapping[str, bool] = RUN_LOCATION) -> str:
    """`program --resume RUN_DIR` and the options of `argv` named in `keep`, quoted for a POSIX shell."""
    extra = carried_options(argv, keep)
    return " ".join([program, "--resume", shlex.quote(shown(run_dir)), *map(shlex.quote, extra)])


def reached(records: Sequence[Mapping[str, Any]], *, rounds: int | None = None) -> str:
    """The last logged round in words ('fedprox (seed 0) reached round 3 of 8'), from a run's metrics.jsonl
    records; 'no round had finished' when none was logged."""
    last = next((r for r in reversed(records) if isinstance(r.get("round"), int)), None)
    if last is None:
        return "no round had finished"
    series = " ".join(str(last[k]) for k in ("method", "algorithm") if isinstance(last.get(k), str))
    seed = f"seed {last['seed']}" if "seed" in last else ""
    who = f"{series} ({seed})" if series and seed else series or seed
    of = f" of {rounds}" if rounds else ""
    return f"{who + ' ' if who else ''}reached round {last['round']}{of}"


def interrupted_line(*, what: str, command: str | None) -> str:
    """The one line printed on SIGINT: where the run got to and how to continue it."""
    return f"interrupted: {what}; " + (f"resume with: {command}" if command else "it cannot be resumed (no checkpoints)")


def exit_interrupted(*, what: str, command: str | None) -> None:
    """Print the interrupted line to stderr and exit with INTERRUPTED_EXIT (no traceback)."""
    print(interrupted_line(what=what, command=command), file=sys.stderr, flush=True)
    raise SystemExit(INTERRUPTED_EXIT)


__all__ = ["INTERRUPTED_EXIT", "RUN_LOCATION", "STOPPED_EXIT", "carried_options", "exit_interrupted",
           "interrupted_line", "reached", "resume_command", "script_command", "shown"]
