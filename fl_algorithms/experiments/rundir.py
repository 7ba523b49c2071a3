"""One directory per run: resolved config, per-round metrics as they happen, results, ledger, plots.

    run = RunDirectory.create(Path("runs"))                 # runs/20261123-081500
    run.write_config(settings)                              # config.toml (the resolved config)
    run.log_round({"round": 1, "accuracy": 0.71, ...})      # metrics.jsonl + metrics.csv, now
    run.write_results({...})                                # results.json, atomically
    run = RunDirectory.open(path)                           # --resume RUN_DIR
    run.truncate_rounds(after=last_checkpointed_round)      # drop rounds the checkpoint lacks

`metrics.jsonl` is the record of truth: each round is appended, flushed and fsynced before
`log_round` returns, so a crash loses at most the round being written (a torn last line, which
`rounds()` ignores and the next `log_round` cuts off). `metrics.csv` is derived from it in long
format, one number per row (`long_rows`): the record's identifying fields (its strings, e.g. the
method, and its seed) as leading columns, then `round, client, split, metric, value`, where client
is a client id or 'all' (run-level numbers), split is 'train', 'validation' or 'test' when the
metric's name starts with one ('validation_accuracy' -> validation, accuracy) and empty otherwise,
and a list counts as its length (`cohort_count`). It is rebuilt from the JSONL whenever they may
disagree (a file in the older wide format included). TensorBoard event files go under `tb/` (step:
the round) when the `tensorboard` extra is installed (`pip install 'fedsecure-nlp[tensorboard]'`);
without it a note says so once per process and the JSONL and CSV are the log. `write_curve()`
draws curve.png from the logged rounds: the mean over clients per round, integer round ticks.
"""
from __future__ import annotations

import csv
import dataclasses
import math
import enum
import datetime
import io
import json
import os
import platform
import shlex
import subprocess
import sys
import time
import tomllib
from collections.abc import Mapping
from pathlib import Path, PurePath
from typing import Any

import tomli_w

from fl_algorithms.experiments.checkpoint import fsync_dir

CONFIG, JSONL, CSV, RESULTS, LEDGER = "config.toml", "metrics.jsonl", "metrics.csv", "results.json", "ledger.json"
CURVE = "curve.png"
NONE_KEY = "_none"  # config.toml: where the keys of dropped None values are listed
LONG_COLUMNS = ("round", "client", "split", "metric", "value")
"""metrics.csv's columns after the identifying ones (`long_rows`)."""
ID_FIELDS = ("seed",)
"""Numeric fields of a round record that identify its series rather than measure it (strings always do)."""
SPLITS = ("train", "validation", "test")
TENSORBOARD_HINT = ("TensorBoard is not installed: per-round metrics go to metrics.jsonl and metrics.csv only "
                    "(pip install 'fedsecure-nlp[tensorboard]' adds event files under tb/)")
_tensorboard_noted = False  # the note above is printed once per process


def _plain(obj: Any) -> Any:
    """Dataclasses, mappings, sequences, paths, enums and array scalars as JSON/TOML-ready values."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _plain(dataclasses.asdict(obj))
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [_plain(v) for v in obj]
    if isinstance(obj, enum.Enum):
        return _plain(obj.value)
    if isinstance(obj, PurePath):
        return str(obj)
    if hasattr(obj, "tolist") and callable(obj.tolist):  # numpy arrays/scalars, torch tensors
        return _plain(obj.tolist())
    return obj


def _write_atomically(path: Path, text: str) -> None:
    """Temp file, fsync, rename: readers see the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8", newline="") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


# ---- config.toml -------------------------------------------------------------------------------
def _drop_none(doc: Any, where: list[str | int], dropped: list[list[str | int]]) -> Any:
    """TOML has no null: drop None values (in tables and arrays), remembering where they were."""
    if isinstance(doc, dict):
        out = {}
        for k, v in doc.items():
            if v is None:
                dropped.append([*where, k])
            else:
                out[k] = _drop_none(v, [*where, k], dropped)
        return out
    if isinstance(doc, list):
        out_list = []
        for i, v in enumerate(doc):
            if v is None:
                dropped.append([*where, i])
            else:
                out_list.append(_drop_none(v, [*where, i], dropped))
        return out_list
    return doc


def _restore_none(doc: dict[str, Any], entries: list[Any]) -> None:
    # In recorded (depth-first) order, each list index is valid once the earlier Nones are back.
    for entry in entries:
        where = entry.split(".") if isinstance(entry, str) else list(entry)
        if not where:
            raise ValueError(f"config.toml: empty {NONE_KEY} entry")
        node: Any = doc
        for step in where[:-1]:
            node = node.setdefault(step, {}) if isinstance(node, dict) else node[step]
        if isinstance(node, list):
            node.insert(where[-1], None)
        else:
            node[where[-1]] = None


def _none_entry(where: list[str | int]) -> str | list[str | int]:
    """A dotted string when that is unambiguous (the common case), else the list of steps."""
    if all(isinstance(s, str) and s and "." not in s for s in where):
        return ".".join(where)  # type: ignore[arg-type]
    return where


# ---- metrics -----------------------------------------------------------------------------------
def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _split_of(name: str) -> tuple[str, str]:
    """('validation', 'accuracy') for 'validation_accuracy'; ('', name) when no split prefixes it."""
    for split in SPLITS:
        if name.startswith(split + "_") and len(name) > len(split) + 1:
            return split, name[len(split) + 1:]
    return "", name


def _numbers(value: Any, name: str) -> list[tuple[str, float]]:
    """(dotted name, number) pairs under `value`: numbers as they are, a list as its length (name
    + '_count'), nested mappings dotted; strings and booleans are not numbers and are left out."""
    if _is_number(value):
        return [(name, value)]
    if isinstance(value, list):
        return [(f"{name}_count", len(value))]
    if isinstance(value, Mapping):
        return [pair for k, v in value.items() for pair in _numbers(v, f"{name}.{k}" if name else str(k))]
    return []


def _per_client(value: Any) -> bool:
    """A mapping keyed by client ids (ints, or their digit strings after a JSON round trip)."""
    return isinstance(value, Mapping) and bool(value) and all(
        (isinstance(k, int) and not isinstance(k, bool)) or (isinstance(k, str) and k.isdigit()) for k in value)


def identity(record: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a round record that say which series it belongs to: its strings (e.g. the method)
    and its `ID_FIELDS` (the seed), in record order."""
    return {k: v for k, v in record.items() if k != "round" and (isinstance(v, str) or k in ID_FIELDS)}


def long_rows(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per number of a round record (module doc): identity columns, then round, client ('all' or
    the client's id), split, metric, value. A mapping keyed by client ids gives per-client rows, named
    by its inner keys ('metrics': {3: {'validation_accuracy': ..}} -> client 3, validation, accuracy) or,
    for numbers, by its own key ('bytes_uploaded': {3: 10} -> client 3, bytes_uploaded)."""
    ids = identity(record)
    t = _round_of(record)
    rows = []

    def add(client: str, name: str, value: float) -> None:
        split, metric = _split_of(name)
        rows.append({**ids, "round": "" if t is None else t, "client": client, "split": split, "metric": metric,
                     "value": value})

    for key, value in record.items():
        if key == "round" or key in ids:
            continue
        if _per_client(value):
            for client, inner in value.items():
                for name, number in _numbers(inner, "" if isinstance(inner, Mapping) else key):
                    add(str(client), name, number)
        else:
            for name, number in _numbers(value, key):
                add("all", name, number)
    return rows


def _csv_text(header: list[str], rows: list[dict[str, Any]]) -> str:
    if not header:
        return ""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=header)
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def _long_header(records: list[Mapping[str, Any]]) -> list[str]:
    """The identity columns of all records (first-seen order), then LONG_COLUMNS."""
    ids: dict[str, None] = {}
    for record in records:
        ids.update(dict.fromkeys(identity(record)))
    return [*ids, *LONG_COLUMNS]


def _round_of(record: Mapping[str, Any]) -> int | None:
    value = record.get("round")
    return None if value is None else int(value)


def describe_device() -> str:
    """This machine in words, for a result's record: the CPU and its cores, and a visible GPU's name."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), cpu)
    except OSError:
        pass
    out = f"{os.cpu_count()}-core CPU ({cpu})"
    torch = sys.modules.get("torch")  # only when the run imported it: never import torch for this
    if torch is not None and torch.cuda.is_available():
        out += f", GPU {torch.cuda.get_device_name(0)}"
    return out


def _process_start() -> float | None:
    """When this process started (Unix seconds, from /proc), None where /proc cannot say."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def _commit_at(start: float | None) -> str | None:
    """The commit the code of a process started at `start` came from: the newest commit on HEAD made before
    it (a run outlives the commits made while it runs, and results.json is written at its end), else HEAD."""
    here = Path(__file__).resolve().parent
    cmd = (["git", "rev-list", "-1", "--abbrev-commit", f"--before=@{int(start)}", "HEAD"] if start is not None
           else ["git", "rev-parse", "--short", "HEAD"])
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=5, cwd=here).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def provenance() -> dict[str, Any]:
    """Where a result came from: the command line, the device, the UTC date and the commit (None outside git)
    the process's code came from (`_commit_at` its start, not HEAD at the time of writing)."""
    commit = _commit_at(_process_start())
    script = sys.argv[0] if sys.argv and sys.argv[0] else "python"
    try:
        script = os.path.relpath(script)
    except ValueError:
        pass
    command = " ".join(shlex.quote(a) for a in ["python", script, *sys.argv[1:]])
    return {"command": command, "device": describe_device(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"), "commit": commit}


def stamped(path: Path, doc: Mapping[str, Any]) -> dict[str, Any]:
    """`doc` as results file `path` should hold it: with the `provenance` of the command that first wrote
    the file (kept from `path` when it has one; this process's otherwise) unless `doc` brings its own, and
    this process's as `rewritten_by` when it rewrites a file it did not first write (a resume, a --report)."""
    if doc.get("provenance"):
        return dict(doc)
    now = provenance()
    try:
        first = json.loads(Path(path).read_text(encoding="utf-8")).get("provenance")
    except (OSError, ValueError, AttributeError):
        first = None
    if not (isinstance(first, dict) and first.get("command")):
        return {**doc, "provenance": now}
    return {**doc, "provenance": first, "rewritten_by": now}


class RunDirectory:
    """A run's folder: `config.toml`, `metrics.jsonl`/`.csv`, `results.json`, `ledger.json`,
    `checkpoints/`, `plots/`, `tb/`. One writer at a time (the process running the run)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._csv_header: list[str] | None = None  # None until synced with metrics.jsonl
        self._tb: Any = None  # a SummaryWriter, False when tensorboard is not installed
        self._tb_purge: int | None = None

    def __repr__(self) -> str:
        return f"RunDirectory({str(self.path)!r})"

    @classmethod
    def create(cls, parent: Path, *, name: str | None = None) -> RunDirectory:
        """A fresh directory under `parent`: `name`, or a time stamp (never an existing one)."""
        parent = Path(parent)
        if name is not None:
            if not name or name in (".", "..") or Path(name).name != name or "/" in name or "\\" in name:
                raise ValueError(f"a run name is a plain directory name, got {name!r}")
            try:
                (parent / name).mkdir(parents=True)
            except FileExistsError:
                raise FileExistsError(f"{parent / name} already exists: pick another name, "
                                      f"or resume that run with --resume {parent / name}") from None
            return cls(parent / name)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for k in range(1000):
            path = parent / (stamp if k == 0 else f"{stamp}-{k}")
            try:
                path.mkdir(parents=True)
                return cls(path)
            except FileExistsError:
                continue
        raise FileExistsError(f"no fresh run directory name under {parent} for {stamp}")

    @classmethod
    def open(cls, path: Path) -> RunDirectory:
        """An existing run (for --resume): a directory holding the `config.toml` of its run."""
        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(f"{path} is not a run directory (no such directory)")
        if not (path / CONFIG).is_file():
            raise FileNotFoundError(f"{path} is not a run directory (no {CONFIG})")
        return cls(path)

    def finished_summary(self) -> dict[str, Any]:
        """The `summary` of a finished run's results.json (for `--resume RUN_DIR --report`); SystemExit with
        the reason when the run has not finished or its file cannot be read."""
        path = self.path / "results.json"
        if not path.is_file():
            raise SystemExit(f"error: {self.path} has not finished (no results.json): finish it with --resume {self.path}")
        try:
            return json.loads(path.read_text())["summary"]
        except (ValueError, KeyError) as error:
            raise SystemExit(f"error: {path} cannot be reported ({error!r}; written by an older version?)") from None

    # ---- config ------------------------------------------------------------------------------
    def write_config(self, config: Any) -> Path:
        """The resolved config (a mapping or a dataclass) as `config.toml`; None values are dropped
        and listed under `_none` so that `read_config` restores them."""
        doc = _plain(config)
        if not isinstance(doc, dict):
            raise TypeError(f"a config is a mapping or a dataclass, got {type(config).__name__}")
        if NONE_KEY in doc:
            raise ValueError(f"{NONE_KEY!r} is reserved in config.toml")
        dropped: list[list[str | int]] = []
        doc = _drop_none(doc, [], dropped)
        if dropped:
            doc[NONE_KEY] = [_none_entry(w) for w in dropped]
        _write_atomically(self.path / CONFIG, tomli_w.dumps(doc))
        return self.path / CONFIG

    def read_config(self) -> dict[str, Any]:
        """`config.toml` as a dict, with the dropped None values back in place."""
        doc = tomllib.loads((self.path / CONFIG).read_text(encoding="utf-8"))
        _restore_none(doc, doc.pop(NONE_KEY, []))
        return doc

    # ---- per-round metrics ---------------------------------------------------------------------
    def log_round(self, record: Mapping[str, Any]) -> None:
        """Append one round to metrics.jsonl and metrics.csv (fsynced before returning), and to TensorBoard."""
        record = _plain(record)
        if not isinstance(record, dict):
            raise TypeError(f"a round record is a mapping, got {type(record).__name__}")
        line = json.dumps(record) + "\n"  # fails here, before any file is touched, if not JSON-able
        if self._csv_header is None:
            self._sync()
        created = not (self.path / JSONL).exists()
        with open(self.path / JSONL, "a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
        if created:
            fsync_dir(self.path)
        rows = long_rows(record)
        assert self._csv_header is not None
        if set(identity(record)) - set(self._csv_header):  # a new identity column: rewrite with the union header
            self._rewrite_csv(self.rounds())
        elif rows:  # (a record without numbers has no CSV row to add)
            with open(self.path / CSV, "a", encoding="utf-8", newline="") as fh:
                csv.DictWriter(fh, fieldnames=self._csv_header).writerows(rows)
                fh.flush()
                os.fsync(fh.fileno())
        self._tensorboard(record, rows)

    def rounds(self) -> list[dict[str, Any]]:
        """The logged rounds. A torn last line (a crash mid-write) is ignored; a bad line before it is an error."""
        path = self.path / JSONL
        if not path.exists():
            return []
        lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
        out = []
        for n, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except ValueError:
                if any(rest.strip() for rest in lines[n + 1:]):
                    raise ValueError(f"{path}: line {n + 1} is not JSON and is not the last line") from None
        return out

    def truncate_rounds(self, *, after: int) -> None:
        """Keep only rounds <= `after`: on resume, those the last checkpoint holds, so none is logged twice."""
        kept = [r for r in self.rounds() if (t := _round_of(r)) is None or t <= after]
        _write_atomically(self.path / JSONL, "".join(json.dumps(r) + "\n" for r in kept))
        self._rewrite_csv(kept)
        self._tb_purge = after + 1  # TensorBoard drops its events from this step on
        if self._tb:
            self._tb.close()
            self._tb = None

    def close(self) -> None:
        """Flush and close the TensorBoard writer (the JSONL and CSV need nothing)."""
        if self._tb:
            self._tb.close()
        self._tb = None

    def __enter__(self) -> RunDirectory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _sync(self) -> None:
        """Cut a torn last line off metrics.jsonl and rebuild metrics.csv from it (after a crash)."""
        path = self.path / JSONL
        if path.exists():
            data = path.read_bytes()
            if data and not data.endswith(b"\n"):
                with open(path, "r+b") as fh:
                    fh.truncate(data.rfind(b"\n") + 1)
                    fh.flush()
                    os.fsync(fh.fileno())
        self._rewrite_csv(self.rounds())

    def _rewrite_csv(self, records: list[dict[str, Any]]) -> None:
        self._csv_header = _long_header(records)
        rows = [row for r in records for row in long_rows(r)]
        _write_atomically(self.path / CSV, _csv_text(self._csv_header, rows))

    def _tensorboard(self, record: Mapping[str, Any], rows: list[dict[str, Any]]) -> None:
        """Each number of the round as a scalar at step = round: tag '<ids>/<metric>' for run-level numbers,
        '<ids>/<metric>/client_<id>' per client (split prefixes kept: 'validation_accuracy')."""
        global _tensorboard_noted
        if self._tb is False:
            return
        if self._tb is None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # the optional extra is not installed: the JSONL and CSV are the log
                self._tb = False
                if not _tensorboard_noted:
                    _tensorboard_noted = True
                    print(f"note: {TENSORBOARD_HINT}", file=sys.stderr, flush=True)
                return
            self._tb = SummaryWriter(log_dir=str(self.path / "tb"), purge_step=self._tb_purge)
        step = _round_of(record)
        prefix = "".join(f"{k}_{v}/" if k in ID_FIELDS else f"{v}/" for k, v in identity(record).items())
        for row in rows:
            name = f"{row['split']}_{row['metric']}" if row["split"] else row["metric"]
            client = "" if row["client"] == "all" else f"/client_{row['client']}"
            self._tb.add_scalar(f"{prefix}{name}{client}", row["value"], step)
        self._tb.flush()

    # ---- the learning curve --------------------------------------------------------------------
    def curve(self, *, metric: str | None = None) -> tuple[str, dict[str, dict[int, float]]]:
        """(the metric, {series label: {round: mean over clients}}) from the logged rounds. `metric` None
        picks 'validation_accuracy' when logged, else 'accuracy', else the first per-client metric."""
        rows = [row for r in self.rounds() for row in long_rows(r)
                if row["client"] != "all" and isinstance(row["round"], int)]
        named = [(f"{r['split']}_{r['metric']}" if r["split"] else r["metric"], r) for r in rows]
        if metric is None:
            present = list(dict.fromkeys(name for name, _ in named))
            metric = next((m for m in ("validation_accuracy", "accuracy") if m in present),
                          present[0] if present else "accuracy")
        values: dict[str, dict[int, list[float]]] = {}
        for name, row in named:
            if name == metric and math.isfinite(row["value"]):
                label = " ".join(f"{k}={row[k]}" if k in ID_FIELDS else str(row[k])
                                 for k in row if k not in LONG_COLUMNS) or "run"
                values.setdefault(label, {}).setdefault(row["round"], []).append(row["value"])
        return metric, {label: {t: sum(v) / len(v) for t, v in sorted(by_round.items())}
                        for label, by_round in values.items()}

    def write_curve(self, *, metric: str | None = None, title: str | None = None) -> Path | None:
        """curve.png: per series (method, seed, ...) the clients' mean `metric` per round (see `curve`), integer
        round ticks; None (no file) when no round logged a per-client metric."""
        metric, series = self.curve(metric=metric)
        if not series:
            return None
        from fl_algorithms.experiments.tables import pyplot, save_figure

        fig, ax = pyplot().subplots(figsize=(6.4, 4.2))
        for label, by_round in series.items():
            ax.plot(list(by_round), list(by_round.values()), "-o", markersize=3, label=label)
        ax.set_xlabel("round")
        ax.set_ylabel(f"mean client {metric.replace('_', ' ')}")
        if title:
            ax.set_title(title, fontsize=9)
        return save_figure(fig, self.path / CURVE)

    # ---- results and the rest of the layout ----------------------------------------------------
    def write_results(self, doc: Mapping[str, Any]) -> Path:
        """`results.json`, written atomically (an interrupted write leaves the previous file), with the
        run's `provenance` (command, device, date, commit) unless `doc` brings its own. A rewrite (a
        resumed run, a `--report`) keeps the provenance of the command that made the run and records its
        own as `rewritten_by`: the record must still say how it was first made."""
        doc = stamped(self.path / RESULTS, doc)
        _write_atomically(self.path / RESULTS, json.dumps(_plain(doc), indent=1) + "\n")
        return self.path / RESULTS

    @property
    def ledger_path(self) -> Path:
        """Where the privacy ledger of the run is written."""
        return self.path / LEDGER

    @property
    def checkpoint_dir(self) -> Path:
        """Where the run's checkpoints go (created by the first save)."""
        return self.path / "checkpoints"

    @property
    def plots_dir(self) -> Path:
        """Where plots go (created on first use)."""
        (self.path / "plots").mkdir(parents=True, exist_ok=True)
        return self.path / "plots"
