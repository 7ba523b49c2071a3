"""`fedsecure`: one command for what this toolkit offers (installed with the package, `[project.scripts]`).

    fedsecure list                          what exists: algorithms, protocols, DP mechanisms, tasks, partitions,
                                            and the experiments `run` knows
    fedsecure run EXPERIMENT [ARGS...]      run an experiment: its example script (examples/*.py) with ARGS as
                                            they are (`fedsecure run fedmcp --help`: its options)
    fedsecure report RUN_DIR                the experiment that made RUN_DIR, with --resume RUN_DIR --report:
                                            its tables and last line from what it finished, running nothing
    fedsecure report RUN_DIR --publish [PAGE]
                                            that report written into a results page (default: the experiment's
                                            docs/results/*.md) as RUN_DIR's generated block
    fedsecure report --check [PAGE...]      check the results pages' generated blocks (default: all of them)
    fedsecure deploy server|client ARGS...  any task as separate processes over tcp (python -m fl_algorithms.deploy_cli)
    fedsecure enrol client|server|roster|dealer ARGS...
                                            keys and the roster for a deployment (python -m transport.cli's
                                            enrol-client, init-server, roster and enrol)

The examples stay scripts (`python examples/fedmcp_secure.py` does the same as `fedsecure run fedmcp`): `run`
executes the script as `python SCRIPT ARGS...` would, located beside this package in the repository
(an editable install: `pip install -e .`). Nothing heavy is imported before a command has parsed its
arguments, so `--help` answers at once; the examples parse before they import torch.

Results pages (docs/results/*.md) are hand-written prose plus blocks generated from run records
(fl_algorithms/experiments/publish.py): `fedsecure report results/EXPERIMENT/RUN --publish` runs the report
in a subprocess and writes, between `<!-- generated from results/EXPERIMENT/RUN ... -->` and
`<!-- end generated: ... -->`, its output, the run's table.md and the `Command: ... · device: ... · date: ...`
line from its results.json (a run without that provenance is refused). Regenerate a page by publishing its
runs again (a block is replaced in place; the same record gives the same page), never by editing a block.
"""
from __future__ import annotations

import argparse
import json
import runpy
import sys
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parents[1]
"""The checkout this package runs from (its examples/ sit beside the package)."""
RESULTS_PAGES = REPOSITORY / "docs" / "results"
"""The results pages, one per experiment (`report --publish` writes their generated blocks)."""
DEFAULT_PAGE = Path("<the experiment's page>")
"""`--publish` given without PAGE: the detected experiment's results page."""


@dataclass(frozen=True)
class Mark:
    """What identifies an experiment's run directory: `file` (JSON or TOML) holds the dotted `key`, equal to
    `value` where one is given."""

    file: str
    key: str
    value: Any = None

    def found(self, run: Path) -> bool:
        node: Any = _read(run / self.file)
        for step in self.key.split("."):
            if isinstance(node, list) and step.isdigit() and int(step) < len(node):
                node = node[int(step)]
            elif isinstance(node, dict) and step in node:
                node = node[step]
            else:
                return False
        return self.value is None or node == self.value


@dataclass(frozen=True)
class Experiment:
    """One experiment `run` knows: its name, what it reproduces and its example script under examples/."""

    name: str
    script: str
    reproduces: str
    marks: tuple[tuple[Mark, ...], ...] = ()
    """Ways to recognise its run directories, each a set of marks that must all be found (`report`)."""
    page: str | None = None
    """Its results page under docs/results/, where `report RUN_DIR --publish` writes by default."""
    no_progress: bool = True
    """Whether its script takes --no-progress (what `--publish` passes, so no progress bar reaches the page)."""

    @property
    def path(self) -> Path:
        return REPOSITORY / "examples" / self.script

    @property
    def page_path(self) -> Path | None:
        """Its results page (None for an experiment without one)."""
        return None if self.page is None else RESULTS_PAGES / self.page

    def made(self, run: Path) -> bool:
        """Whether `run` is one of this experiment's run directories."""
        return any(all(mark.found(run) for mark in marks) for marks in self.marks)


EXPERIMENTS = (
    Experiment("fedmcp", "fedmcp_secure.py",
               "FedMCP (Zhao et al. 2024) Tables I/II: FedMCP vs Local, FedAvg (PEFT), FedRep and more, SecAgg+",
               ((Mark("results.json", "experiment", "fedmcp"),), (Mark("config.toml", "plan.plain_check"),)),
               "fedmcp.md"),
    Experiment("fednlp-classification", "fednlp_classification.py",
               "FedNLP (Lin et al. 2022) text classification: FedAvg, FedProx, FedOPT on BBC topics, secure vs plain",
               ((Mark("config.toml", "settings.alpha"), Mark("config.toml", "settings.min_client_docs")),),
               "fednlp.md"),
    Experiment("fednlp-benchmark", "fednlp_benchmark.py",
               "FedNLP's grid: four formulations x FedAvg/FedProx/FedOPT x partitions, each with a plaintext twin",
               ((Mark("plan.json", "tasks"), Mark("plan.json", "partitions")),), "fednlp.md"),
    Experiment("atc", "atc_secure.py",
               "ATC (Assign-Then-Contrast): 18 heterogeneous clients vs its baselines and an insecure reference",
               ((Mark("plan.json", "atc"), Mark("plan.json", "model")),), "atc.md"),
    Experiment("fedseit", "fedseit_continual.py",
               "FedSeIT + SIT (Chaudhary et al. 2022) vs FedWeIT and continual baselines: accuracy, forgetting",
               ((Mark("plan.json", "rounds_per_task"), Mark("plan.json", "descriptor")),), "fedseit.md"),
    Experiment("adafedselectkd", "adafedselectkd.py",
               "AdaFedSelectKD (Feng et al.) vs AdaFedKD, AdaFedAvg and baselines: multi-domain headline generation",
               ((Mark("results.json", "experiment", "adafedselectkd"),),
                (Mark("plan.json", "settings"), Mark("plan.json", "data"))), "adafedselectkd.md"),
    Experiment("privacy-frontier", "privacy_frontier.py",
               "accuracy vs measured leakage: plaintext, SecAgg+, distributed, central and local DP at Poisson cohorts",
               ((Mark("ledger.json", "format", "fedsecure-nlp/privacy-frontier-ledgers/v2"),),
                (Mark("results.json", "runs.0.cohort"), Mark("results.json", "runs.0.config"))),
               "privacy_frontier.md"),
    Experiment("secagg-demo", "secagg_demo.py",
               "one secure-aggregation round between real processes over tcp, with dropouts (no run directory)",
               page="secure_aggregation.md", no_progress=False),
)
ENROL = {"client": "enrol-client", "server": "init-server", "roster": "roster", "dealer": "enrol"}
"""`fedsecure enrol NAME` -> `python -m transport.cli SUBCOMMAND`."""


def _read(path: Path) -> Any:
    """A run's JSON or TOML file as data; None when it is missing or unreadable."""
    try:
        text = path.read_text(encoding="utf-8")
        return tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (OSError, ValueError):
        return None


def experiment(name: str) -> Experiment | None:
    """The experiment called `name` (None for none)."""
    return next((e for e in EXPERIMENTS if e.name == name), None)


def detect(run: Path) -> Experiment:
    """The experiment that made run directory `run`; ValueError saying why when none (or several) did."""
    if not run.is_dir():
        raise ValueError(f"{run} is not a directory")
    found = [e for e in EXPERIMENTS if e.made(run)]
    if len(found) == 1:
        return found[0]
    if found:
        raise ValueError(f"{run} looks like a run of several experiments ({', '.join(e.name for e in found)})")
    present = [n for n in ("config.toml", "plan.json", "results.json") if (run / n).is_file()]
    what = f"its {', '.join(present)} match no experiment" if present else "no config.toml, plan.json or results.json"
    raise ValueError(f"{run} is not a run directory of any experiment ({what}); runs are made by "
                     f"`fedsecure run {{{','.join(e.name for e in EXPERIMENTS if e.marks)}}}`")


def listing() -> str:
    """`fedsecure list`: the catalog (`python -m fl_algorithms --list`), then the experiments."""
    from fl_algorithms.catalog import render

    width = max(len(e.name) for e in EXPERIMENTS)
    lines = ["experiments (fedsecure run NAME [ARGS...]; NAME --help for its options):"]
    lines += [f"  {e.name:<{width}}  {e.reproduces} (examples/{e.script})" for e in EXPERIMENTS]
    return render() + "\n" + "\n".join(lines) + "\n"


def run_script(script: Path, args: Sequence[str]) -> int:
    """Execute `script` as `python SCRIPT ARGS...` would (as __main__, its folder first on sys.path); its
    SystemExit passes through, so its exit status is fedsecure's."""
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [str(script), *args]
    sys.path.insert(0, str(script.parent))
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv[:], sys.path[:] = saved_argv, saved_path
    return 0


def publish(run: Path, chosen: Experiment, *, page: Path, parser: argparse.ArgumentParser) -> int:
    """`report RUN_DIR --publish [PAGE]`: the run's report into its results page (`experiments.publish`); 1 with
    the reason when it cannot be published (nothing written then)."""
    from fl_algorithms.experiments.publish import PublishError
    from fl_algorithms.experiments.publish import publish as write_block

    if page == DEFAULT_PAGE:
        if chosen.page_path is None:
            parser.error(f"{chosen.name} has no results page: give --publish PAGE")
        page = chosen.page_path
    try:
        done = write_block(run, page, script=chosen.path, no_progress=chosen.no_progress, root=REPOSITORY)
    except PublishError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    sys.stdout.write(done.text + "\n")
    print(f"{'replaced' if done.replaced else 'added'} the block of {done.key} in {page} "
          f"(report {done.seconds:.1f} s)", file=sys.stderr)
    return 0


def check(pages: Sequence[Path]) -> int:
    """`report --check PAGE...`: 0 when every generated block is well formed, else 1 after listing the problems."""
    from fl_algorithms.experiments.publish import check_page

    problems = []
    for page in pages:
        if not page.is_file():
            problems.append(f"{page}: no such page")
            continue
        problems += check_page(page, root=REPOSITORY)
    for problem in problems:
        print(problem, file=sys.stderr)
    print(f"{len(pages)} page(s) checked: {len(problems) or 'no'} problem(s)", file=sys.stderr)
    return 1 if problems else 0


def parser() -> argparse.ArgumentParser:
    """fedsecure's parser: list, run, report, deploy, enrol (the last three pass their arguments on)."""
    p = argparse.ArgumentParser(prog="fedsecure", description=__doc__.split("\n")[0],
                                epilog="examples: fedsecure list | fedsecure run fedmcp --quick | "
                                       "fedsecure report results/fedmcp/RUN")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("list", help="algorithms, protocols, DP mechanisms, tasks, partitions and experiments, one line each")
    names = ", ".join(e.name for e in EXPERIMENTS)
    run = sub.add_parser("run", help="run an experiment (its example script) with ARGS passed on",
                         description=f"Run an experiment: {names}. ARGS go to its script unchanged; "
                                     "`fedsecure run NAME --help` lists them.")
    run.add_argument("experiment", metavar="EXPERIMENT", help=f"one of {names}")
    run.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="the experiment's own options")
    report = sub.add_parser("report", help="report a run directory: its experiment with --resume RUN_DIR --report",
                            description="Find the experiment that made RUN_DIR and run it with --resume RUN_DIR "
                                        "--report: its tables and last line from the cells or runs it finished, "
                                        "running nothing. --publish writes that report into a results page "
                                        "(docs/results/*.md) with the run's command, device and date; --check "
                                        "checks the pages' generated blocks.")
    report.add_argument("run_dir", metavar="RUN_DIR", type=Path, nargs="?", help="a run directory an experiment made")
    report.add_argument("--publish", metavar="PAGE", type=Path, nargs="?", const=DEFAULT_PAGE, default=None,
                        help="write the report into a results page as RUN_DIR's generated block, with the run's "
                             "command, device, date and commit from its results.json (replaced in place when the "
                             "page has one; default page: the experiment's docs/results/*.md)")
    report.add_argument("--check", metavar="PAGE", type=Path, nargs="*", default=None,
                        help="check the generated blocks of these results pages (default: every docs/results/*.md): "
                             "begin and end markers, the Command/device/date line; exit 1 listing the problems")
    deploy = sub.add_parser("deploy", help="a task's server or one client as its own process over tcp "
                                           "(python -m fl_algorithms.deploy_cli)",
                            description="Any task as separate processes over tcp: `fedsecure deploy server --help` "
                                        "gives the options (python -m fl_algorithms.deploy_cli).")
    deploy.add_argument("role", choices=("server", "client"), help="this process's side")
    deploy.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="python -m fl_algorithms.deploy_cli's options")
    enrol = sub.add_parser("enrol", help="keys and the roster of a deployment (python -m transport.cli)",
                           description="client: a client's own keys and public entry (enrol-client); server: the "
                                       "server's key (init-server); roster: check the public entries and write "
                                       "roster.json; dealer: one trusted machine makes every party's keys (enrol).")
    enrol.add_argument("step", choices=tuple(ENROL), help="client, server, roster or dealer")
    enrol.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="its options (STEP --help lists them)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, then hand over to the command (whose own errors exit with its status, 2 for a usage error)."""
    p = parser()
    args = p.parse_args(argv)
    if args.command == "list":
        sys.stdout.write(listing())
        return 0
    if args.command == "run":
        chosen = experiment(args.experiment)
        if chosen is None:
            p.error(f"unknown experiment {args.experiment!r}; choose from {', '.join(e.name for e in EXPERIMENTS)}")
        if not chosen.path.is_file():
            p.error(f"{chosen.path} is missing: `fedsecure run` needs the repository's examples/ beside the package "
                    "(a checkout installed with `pip install -e .`)")
        return run_script(chosen.path, args.args)
    if args.command == "report":
        if args.check is not None:
            if args.run_dir is not None or args.publish is not None:
                p.error("report --check PAGE... checks pages only: give no RUN_DIR and no --publish")
            return check(args.check or sorted(RESULTS_PAGES.glob("*.md")))
        if args.run_dir is None:
            p.error("report needs RUN_DIR (or --check PAGE...)")
        try:
            chosen = detect(args.run_dir)
        except ValueError as error:
            p.error(str(error))
        print(f"{args.run_dir}: a run of {chosen.name} (examples/{chosen.script})", file=sys.stderr, flush=True)
        if args.publish is not None:
            return publish(args.run_dir, chosen, page=args.publish, parser=p)
        return run_script(chosen.path, ["--resume", str(args.run_dir), "--report"])
    if args.command == "deploy":
        from fl_algorithms import deploy_cli

        return deploy_cli.main([args.role, *args.args])
    from transport import cli as transport_cli

    return transport_cli.main([ENROL[args.step], *args.args])


if __name__ == "__main__":
    sys.exit(main())
