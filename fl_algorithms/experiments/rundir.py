"""One directory per run: resolved config, per-round metrics as they happen, results, ledger, plots.

    run = RunDirectory.create(Path("runs"), name=None)      # runs/20261123-081500
    run.write_config(settings)                              # config.toml (the resolved config)
    run.log_round({"round": 1, "accuracy": 0.71, ...})      # metrics.jsonl + metrics.csv, now
    run.write_results({...})                                # results.json, atomically
    run = RunDirectory.open(path)                           # --resume RUN_DIR

Each logged round is flushed and fsynced before `log_round` returns, so a crash loses at most the
round in progress; on resume, `truncate_rounds(last_checkpointed)` drops rounds logged after the
last checkpoint so nothing is logged twice. TensorBoard scalars are written under `tb/` when the
`tensorboard` package is installed (skipped otherwise).
"""
from __future__ import annotations

import csv
import dataclasses
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tomli_w

CONFIG, JSONL, CSV, RESULTS = "config.toml", "metrics.jsonl", "metrics.csv", "results.json"


def _plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _plain(dataclasses.asdict(obj))
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [_plain(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):
        return obj.item()
    return obj


def _without_none(doc: Any, path: str, dropped: list[str]) -> Any:
    """TOML has no null: drop None values and remember their dotted paths."""
    if isinstance(doc, dict):
        out = {}
        for k, v in doc.items():
            if v is None:
                dropped.append(f"{path}{k}")
            else:
                out[k] = _without_none(v, f"{path}{k}.", dropped)
        return out
    return doc


def _flatten(record: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in record.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, f"{key}."))
        elif isinstance(v, (list, tuple)):
            out[key] = json.dumps(_plain(v))
        else:
            out[key] = _plain(v)
    return out


class RunDirectory:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._tb = None

    @classmethod
    def create(cls, parent: Path, *, name: str | None = None) -> "RunDirectory":
        parent = Path(parent)
        if name is not None:
            if not name or Path(name).name != name or name in (".", ".."):
                raise ValueError(f"a run name is a plain directory name, got {name!r}")
            try:
                (parent / name).mkdir(parents=True)
            except FileExistsError:
                raise FileExistsError(f"{parent / name} exists: pick another name or resume it") from None
            return cls(parent / name)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for k in range(1000):
            path = parent / (stamp if k == 0 else f"{stamp}-{k}")
            try:
                path.mkdir(parents=True)
                return cls(path)
            except FileExistsError:
                continue
        raise RuntimeError(f"no fresh run directory under {parent}")

    @classmethod
    def open(cls, path: Path) -> "RunDirectory":
        path = Path(path)
        if not (path / CONFIG).is_file():
            raise FileNotFoundError(f"{path} is not a run directory (no {CONFIG})")
        return cls(path)

    # ---- config ------------------------------------------------------------------------------
    def write_config(self, config: Any) -> Path:
        dropped: list[str] = []
        doc = _without_none(_plain(config), "", dropped)
        if dropped:
            doc["_none"] = dropped
        tmp = self.path / (CONFIG + ".tmp")
        tmp.write_text(tomli_w.dumps(doc))
        os.replace(tmp, self.path / CONFIG)
        return self.path / CONFIG

    def read_config(self) -> dict[str, Any]:
        import tomllib

        doc = tomllib.loads((self.path / CONFIG).read_text())
        for dotted in doc.pop("_none", []):
            node = doc
            *parents, leaf = dotted.split(".")
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = None
        return doc

    # ---- per-round metrics ---------------------------------------------------------------------
    def log_round(self, record: Mapping[str, Any]) -> None:
        record = _plain(record)
        with open(self.path / JSONL, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, allow_nan=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        self._append_csv(_flatten(record))
        self._tensorboard(record)

    def _append_csv(self, row: Mapping[str, Any]) -> None:
        path = self.path / CSV
        rows: list[dict[str, Any]] = []
        header: list[str] = []
        if path.exists():
            with open(path, newline="", encoding="utf-8") as fh:
                reader = csv.DictReader(fh)
                header = list(reader.fieldnames or [])
                if set(row) - set(header):
                    rows = list(reader)
        if not path.exists() or set(row) - set(header):  # new columns: rewrite with the union header
            header = header + [k for k in row if k not in header]
            tmp = path.with_suffix(".csv.tmp")
            with open(tmp, "w", newline="", encoding="utf-8") as fh:
                writer = csv.DictWriter(fh, fieldnames=header)
                writer.writeheader()
                writer.writerows(rows)
                writer.writerow(row)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
            return
        with open(path, "a", newline="", encoding="utf-8") as fh:
            csv.DictWriter(fh, fieldnames=header).writerow(row)
            fh.flush()
            os.fsync(fh.fileno())

    def _tensorboard(self, record: Mapping[str, Any]) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # tensorboard not installed: the JSONL and CSV are the log
            return
        if self._tb is None:
            self._tb = SummaryWriter(log_dir=str(self.path / "tb"))
        step = int(record.get("round", 0))
        for key, value in _flatten(record).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "round":
                self._tb.add_scalar(key, value, step)
        self._tb.flush()

    def rounds(self) -> list[dict[str, Any]]:
        """The logged rounds, ignoring a torn last line left by a crash."""
        path = self.path / JSONL
        if not path.exists():
            return []
        out = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                break
        return out

    def truncate_rounds(self, *, after: int) -> None:
        """Keep only rounds <= `after` (on resume: those the last checkpoint holds)."""
        kept = [r for r in self.rounds() if int(r.get("round", 0)) <= after]
        for name in (JSONL, CSV):
            (self.path / name).unlink(missing_ok=True)
        for r in kept:
            with open(self.path / JSONL, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(r) + "\n")
            self._append_csv(_flatten(r))

    # ---- results -------------------------------------------------------------------------------
    def write_results(self, doc: Mapping[str, Any]) -> Path:
        tmp = self.path / (RESULTS + ".tmp")
        tmp.write_text(json.dumps(_plain(doc), indent=1))
        os.replace(tmp, self.path / RESULTS)
        return self.path / RESULTS

    @property
    def ledger_path(self) -> Path:
        return self.path / "ledger.json"

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / "checkpoints"

    @property
    def plots_dir(self) -> Path:
        (self.path / "plots").mkdir(exist_ok=True)
        return self.path / "plots"
