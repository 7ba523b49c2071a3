"""Results of a run as one JSON file: config, per-round records, and summary numbers."""
from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fl_algorithms.engine.sim import RoundRecord
from fl_algorithms.experiments.rundir import provenance


def _jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {k: _jsonable(v) for k, v in dataclasses.asdict(obj).items()}
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):
        return obj.item()
    return obj


def write_results(path: str | Path, *, config: Any, runs: Mapping[str, Sequence[RoundRecord]],
                  summary: Mapping[str, Any]) -> Path:
    """Write atomically (temp file + rename) so an interrupted write never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"config": _jsonable(config), "summary": _jsonable(summary),
           "runs": {name: [_jsonable(r) for r in recs] for name, recs in runs.items()},
           "provenance": provenance()}
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)
    return path
