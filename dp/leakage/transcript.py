"""What the server actually received, round by round: the input of every leakage measurement.

Secure protocols give the server, per round, the decoded mean of each masked part, the total
weight, the contributor set (and the sampled cohort, which the server chose). The 'plain'
ablation (no secure aggregation) gives it every client's vector; the runner then feeds those in
with `record_individual`. Released DP values are recorded with their public metadata.

Size: a transcript of whole model updates grows as rounds x parts x d. `parts` restricts it to
named parts, optionally to a coordinate range of each (e.g. the embedding rows of a flattened
update), and `max_bytes` makes a run fail loudly instead of filling memory.

Storage is `<stem>.npz` (arrays, loaded with allow_pickle=False) plus `<stem>.json` (metadata):
no pickle anywhere.
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

TRANSCRIPT_FORMAT = "fedsecure-nlp/server-transcript/v1"

Selection = Mapping[str, "tuple[int, int] | None"] | Sequence[str] | None


class TranscriptFull(MemoryError):
    """Recording would exceed the transcript's `max_bytes`; nothing was recorded."""


@dataclass(frozen=True)
class AggregateRecord:
    """One decoded secure aggregate: the weighted mean of `part` over `contributors`."""

    round: int
    part: str
    mean: np.ndarray
    contributors: tuple[int, ...]
    total_weight: float
    offset: int = 0
    """Index in the full part vector of mean[0] (non-zero when only a range was recorded)."""

    @property
    def weighted_sum(self) -> np.ndarray:
        return self.mean * self.total_weight


@dataclass(frozen=True)
class ReleasedRecord:
    """One DP release as the server saw it: the noisy payload and its public description."""

    round: int
    name: str
    client_id: int
    payload: np.ndarray
    meta: Mapping[str, Any]


def _round(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"round must be a non-negative int, got {value!r}")
    return int(value)


def _client(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"client ids are ints, got {value!r}")
    return int(value)


def _clients(values: Iterable[Any]) -> tuple[int, ...]:
    return tuple(sorted({_client(v) for v in values}))


def _vector(value: Any) -> np.ndarray:
    v = np.asarray(value)
    if v.dtype.kind not in "fiu":
        raise ValueError(f"expected a numeric vector, got dtype {v.dtype}")
    v = v.reshape(-1)
    if v.dtype.kind == "f" and not np.all(np.isfinite(v)):
        raise ValueError("vector contains NaN or infinity")
    return v


class Transcript:
    """Per-round record of the server's view: aggregates, individual uploads, releases, cohorts."""

    def __init__(self, *, protocol: str, parts: Selection = None, dtype: str | None = None,
                 max_bytes: int | None = None) -> None:
        """`parts`: None records every part; a sequence of names records those parts whole; a
        mapping name -> (start, stop) records only that coordinate range (None = whole part).
        `dtype`: store vectors in this dtype (e.g. 'float32' to halve the size); None keeps the
        received dtype."""
        if not isinstance(protocol, str) or not protocol:
            raise ValueError("protocol must be a non-empty string")
        self.protocol = protocol
        self.selection: dict[str, tuple[int, int] | None] | None = None
        if parts is not None:
            if isinstance(parts, Mapping):
                self.selection = {}
                for name, rng in parts.items():
                    if rng is not None:
                        start, stop = (int(rng[0]), int(rng[1]))
                        if not 0 <= start < stop:
                            raise ValueError(f"invalid range {rng!r} for part '{name}'")
                        rng = (start, stop)
                    self.selection[str(name)] = rng
            else:
                if isinstance(parts, str):
                    raise TypeError("parts must be a sequence of names, not one string")
                self.selection = {str(name): None for name in parts}
        self.dtype = np.dtype(dtype) if dtype is not None else None
        if max_bytes is not None and max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.max_bytes = max_bytes
        self._aggregates: dict[tuple[int, str], AggregateRecord] = {}
        self._individuals: dict[tuple[int, str], dict[int, np.ndarray]] = {}
        self._individual_offsets: dict[tuple[int, str], int] = {}
        self._released: dict[tuple[int, str], dict[int, ReleasedRecord]] = {}
        self._cohorts: dict[int, tuple[int, ...]] = {}
        self._nbytes = 0

    # ---- selection and size -------------------------------------------------------------------
    def wants(self, part: str) -> bool:
        """Whether `part` is recorded (callers can skip copying parts that are not)."""
        return self.selection is None or part in self.selection

    def _select(self, part: str, vector: Any) -> tuple[np.ndarray, int] | None:
        if not self.wants(part):
            return None
        v = _vector(vector)
        rng = self.selection.get(part) if self.selection is not None else None
        offset = 0
        if rng is not None:
            if rng[1] > v.shape[0]:
                raise ValueError(f"range {rng} exceeds part '{part}' of length {v.shape[0]}")
            v, offset = v[rng[0]: rng[1]], rng[0]
        v = np.array(v, dtype=self.dtype or v.dtype, copy=True)
        v.setflags(write=False)
        return v, offset

    def _charge(self, nbytes: int) -> None:
        if self.max_bytes is not None and self._nbytes + nbytes > self.max_bytes:
            raise TranscriptFull(f"recording {nbytes} bytes would exceed the transcript limit of "
                                 f"{self.max_bytes} bytes (record fewer parts or a row range)")
        self._nbytes += nbytes

    @property
    def nbytes(self) -> int:
        """Bytes of vector data held (metadata not counted)."""
        return self._nbytes

    # ---- recording ----------------------------------------------------------------------------
    def record_cohort(self, round: int, cohort: Iterable[int]) -> None:
        """The clients the server sampled for `round` (it chose them, so it knows them)."""
        self._cohorts[_round(round)] = _clients(cohort)

    def record_aggregate(self, round: int, part: str, mean: Any, contributors: Iterable[int],
                         total_weight: float) -> None:
        """A decoded secure aggregate of `part` (secure protocols)."""
        t = _round(round)
        picked = self._select(part, mean)
        if picked is None:
            return
        if not (math.isfinite(total_weight) and total_weight > 0):
            raise ValueError("total_weight must be positive and finite")
        ids = _clients(contributors)
        if not ids:
            raise ValueError("an aggregate needs at least one contributor")
        if (t, part) in self._aggregates:
            raise ValueError(f"aggregate of '{part}' in round {t} already recorded")
        vec, offset = picked
        self._charge(vec.nbytes)
        self._aggregates[(t, part)] = AggregateRecord(t, part, vec, ids, float(total_weight), offset)

    def record_individual(self, round: int, client_id: int, part: str, vector: Any) -> None:
        """One client's plaintext vector of `part` (the 'plain' ablation only)."""
        t, c = _round(round), _client(client_id)
        picked = self._select(part, vector)
        if picked is None:
            return
        vec, offset = picked
        slot = self._individuals.setdefault((t, part), {})
        if c in slot:
            raise ValueError(f"client {c}'s '{part}' in round {t} already recorded")
        self._charge(vec.nbytes)
        slot[c] = vec
        self._individual_offsets[(t, part)] = offset

    def record_released(self, round: int, name: str, client_id: int, payload: Any,
                        meta: Mapping[str, Any] | None = None) -> None:
        """A DP release (noisy payload plus its JSON-able description)."""
        t, c = _round(round), _client(client_id)
        vec = _vector(payload)
        vec = np.array(vec, dtype=self.dtype or vec.dtype, copy=True)
        vec.setflags(write=False)
        meta = json.loads(json.dumps(dict(meta or {})))  # must be JSON-able; detaches from caller
        slot = self._released.setdefault((t, str(name)), {})
        if c in slot:
            raise ValueError(f"release '{name}' of client {c} in round {t} already recorded")
        self._charge(vec.nbytes)
        slot[c] = ReleasedRecord(t, str(name), c, vec, meta)

    def record_view(self, view: Any, *, cohort: Iterable[int] | None = None) -> None:
        """Record an `AggregateView` (fl_algorithms.api): every group mean, contributors and releases."""
        t = _round(view.round)
        if cohort is not None:
            self.record_cohort(t, cohort)
        for part, group in view.groups.items():
            self.record_aggregate(t, part, group.mean, view.contributors, group.total_weight)
        for name, per_client in view.released.items():
            for cid, rel in per_client.items():
                meta = json.loads(json.dumps(rel.describe(), default=str))  # enums etc. as strings
                self.record_released(t, name, cid, rel.payload, meta)

    # ---- reading ------------------------------------------------------------------------------
    @property
    def rounds(self) -> list[int]:
        keys = {t for t, _ in self._aggregates} | {t for t, _ in self._individuals} | \
            {t for t, _ in self._released} | set(self._cohorts)
        return sorted(keys)

    def parts(self, round: int | None = None) -> list[str]:
        keys = list(self._aggregates) + list(self._individuals)
        return sorted({p for t, p in keys if round is None or t == round})

    def cohort(self, round: int) -> tuple[int, ...] | None:
        return self._cohorts.get(round)

    def aggregate(self, round: int, part: str) -> AggregateRecord | None:
        return self._aggregates.get((round, part))

    def aggregates(self, part: str) -> list[AggregateRecord]:
        """Every recorded aggregate of `part`, in round order."""
        return [self._aggregates[k] for k in sorted(self._aggregates) if k[1] == part]

    def individuals(self, round: int, part: str) -> dict[int, np.ndarray]:
        return dict(self._individuals.get((round, part), {}))

    def individual_offset(self, round: int, part: str) -> int:
        return self._individual_offsets.get((round, part), 0)

    def released(self, round: int, name: str) -> dict[int, ReleasedRecord]:
        return dict(self._released.get((round, name), {}))

    def contributors(self, round: int) -> tuple[int, ...]:
        """Who the server knows contributed in `round` (aggregate contributors, or uploaders)."""
        ids: set[int] = set()
        for (t, _), rec in self._aggregates.items():
            if t == round:
                ids.update(rec.contributors)
        for (t, _), slot in self._individuals.items():
            if t == round:
                ids.update(slot)
        return tuple(sorted(ids))

    # ---- persistence --------------------------------------------------------------------------
    def save(self, stem: str | Path, *, compress: bool = True) -> tuple[Path, Path]:
        """Write `<stem>.npz` and `<stem>.json`; returns both paths."""
        stem = Path(stem)
        stem.parent.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, np.ndarray] = {}
        aggregates, individuals, released = [], [], []
        for i, (key, rec) in enumerate(sorted(self._aggregates.items())):
            arrays[f"a{i}"] = rec.mean
            aggregates.append({"key": f"a{i}", "round": rec.round, "part": rec.part, "offset": rec.offset,
                               "contributors": list(rec.contributors), "total_weight": rec.total_weight})
        j = 0
        for (t, part), slot in sorted(self._individuals.items()):
            for cid, vec in sorted(slot.items()):
                arrays[f"i{j}"] = vec
                individuals.append({"key": f"i{j}", "round": t, "part": part, "client": cid,
                                    "offset": self._individual_offsets.get((t, part), 0)})
                j += 1
        k = 0
        for (t, name), slot in sorted(self._released.items()):
            for cid, rec in sorted(slot.items()):
                arrays[f"r{k}"] = rec.payload
                released.append({"key": f"r{k}", "round": t, "name": name, "client": cid, "meta": dict(rec.meta)})
                k += 1
        meta = {
            "format": TRANSCRIPT_FORMAT, "protocol": self.protocol,
            "selection": None if self.selection is None else {p: (list(r) if r else None) for p, r in self.selection.items()},
            "dtype": None if self.dtype is None else self.dtype.name, "max_bytes": self.max_bytes,
            "cohorts": {str(t): list(c) for t, c in sorted(self._cohorts.items())},
            "aggregates": aggregates, "individuals": individuals, "released": released,
        }
        npz, js = stem.with_name(stem.name + ".npz"), stem.with_name(stem.name + ".json")
        (np.savez_compressed if compress else np.savez)(npz, **arrays)
        js.write_text(json.dumps(meta))
        return npz, js

    @classmethod
    def load(cls, stem: str | Path) -> "Transcript":
        stem = Path(stem)
        meta = json.loads(stem.with_name(stem.name + ".json").read_text())
        if not isinstance(meta, dict) or meta.get("format") != TRANSCRIPT_FORMAT:
            raise ValueError("not a server transcript")
        sel = meta.get("selection")
        out = cls(protocol=meta["protocol"], parts=None if sel is None else {p: (tuple(r) if r else None) for p, r in sel.items()},
                  dtype=meta.get("dtype"), max_bytes=meta.get("max_bytes"))
        with np.load(stem.with_name(stem.name + ".npz"), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        for t, ids in meta["cohorts"].items():
            out.record_cohort(int(t), ids)
        # Arrays are stored already selected: insert them without re-applying the range.
        for rec in meta["aggregates"]:
            vec = _frozen(arrays[rec["key"]])
            out._charge(vec.nbytes)
            out._aggregates[(_round(rec["round"]), str(rec["part"]))] = AggregateRecord(
                _round(rec["round"]), str(rec["part"]), vec, _clients(rec["contributors"]),
                float(rec["total_weight"]), int(rec["offset"]))
        for rec in meta["individuals"]:
            vec = _frozen(arrays[rec["key"]])
            key = (_round(rec["round"]), str(rec["part"]))
            out._charge(vec.nbytes)
            out._individuals.setdefault(key, {})[_client(rec["client"])] = vec
            out._individual_offsets[key] = int(rec["offset"])
        for rec in meta["released"]:
            out.record_released(rec["round"], rec["name"], rec["client"], arrays[rec["key"]], rec["meta"])
        return out


def _frozen(a: np.ndarray) -> np.ndarray:
    v = _vector(a).copy()
    v.setflags(write=False)
    return v
