"""One directory per run: resolved config, per-round metrics as they happen, results, ledger, plots.

    run = RunDirectory.create(Path("runs"))                 # runs/20261123-081500
    run.write_config(settings)                              # config.toml (the resolved config)
    run.log_round({"round": 1, "accuracy": 0.71, ...})      # metrics.jsonl + metrics.csv, now
    run.write_results({...})                                # results.json, atomically
    run = RunDirectory.open(path)                           # --resume RUN_DIR
    run.truncate_rounds(after=last_checkpointed_round)      # drop rounds the checkpoint lacks

`metrics.jsonl` is the record of truth: each round is appended, flushed and fsynced before
`log_round` returns, so a crash loses at most the round being written (a torn last line, which
`rounds()` ignores and the next `log_round` cuts off). `metrics.csv` is derived from it (nested
dicts flattened to dotted columns, the header grown to the union of all columns) and rebuilt from
the JSONL whenever they may disagree. TensorBoard scalars go under `tb/` when the `tensorboard`
package is installed (skipped silently otherwise).
"""
from __future__ import annotations

import csv
import dataclasses
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
NONE_KEY = "_none"  # config.toml: where the keys of dropped None values are listed


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
def _flatten(record: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as dotted columns; lists as JSON text in one cell."""
    out: dict[str, Any] = {}
    for k, v in record.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, f"{key}."))
        elif isinstance(v, list):
            out[key] = json.dumps(v)
        else:
            out[key] = v
    return out


def _csv_text(header: list[str], rows: list[dict[str, Any]]) -> str:
    if not header:
        return ""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=header)
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def _union_header(rows: list[dict[str, Any]]) -> list[str]:
    header: dict[str, None] = {}
    for row in rows:
        header.update(dict.fromkeys(row))
    return list(header)


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


def provenance() -> dict[str, Any]:
    """Where a result came from: the command line, the device, the UTC date and the commit (None outside git)."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                                cwd=Path(__file__).resolve().parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    script = sys.argv[0] if sys.argv and sys.argv[0] else "python"
    try:
        script = os.path.relpath(script)
    except ValueError:
        pass
    command = " ".join(shlex.quote(a) for a in ["python", script, *sys.argv[1:]])
    return {"command": command, "device": describe_device(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"), "commit": commit}


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
        row = _flatten(record)
        assert self._csv_header is not None
        if set(row) - set(self._csv_header):  # new columns: rewrite with the union header
            self._rewrite_csv(self.rounds())
        elif self._csv_header:  # (a record with no fields at all has no CSV row to add)
            with open(self.path / CSV, "a", encoding="utf-8", newline="") as fh:
                csv.DictWriter(fh, fieldnames=self._csv_header).writerow(row)
                fh.flush()
                os.fsync(fh.fileno())
        self._tensorboard(record)

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
        rows = [_flatten(r) for r in records]
        self._csv_header = _union_header(rows)
        _write_atomically(self.path / CSV, _csv_text(self._csv_header, rows))

    def _tensorboard(self, record: Mapping[str, Any]) -> None:
        if self._tb is False:
            return
        if self._tb is None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is not installed: the JSONL and CSV are the log
                self._tb = False
                return
            self._tb = SummaryWriter(log_dir=str(self.path / "tb"), purge_step=self._tb_purge)
        step = _round_of(record)
        for key, value in _flatten(record).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "round":
                self._tb.add_scalar(key, value, step)
        self._tb.flush()

    # ---- results and the rest of the layout ----------------------------------------------------
    def write_results(self, doc: Mapping[str, Any]) -> Path:
        """`results.json`, written atomically (an interrupted write leaves the previous file), with the
        run's `provenance` (command, device, date, commit) unless `doc` brings its own."""
        doc = {**doc, "provenance": doc.get("provenance") or provenance()}
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
