"""The round engine's messages on the wire (deployment), and their validation before use.

    server -> client  fl_train      a ClientBroadcast: arrays 'c/…', 'g/…', 'p/…' (float32), the relayed
                                    ciphertexts packed in one bytes field 'i', and 'meta' (JSON: group,
                                    sums with their transport round ids, each relay's sender, round and
                                    size, the run's secure config)
    client -> server  fl_ready      'meta' (JSON: layout per sum, metrics, each sealed message's
                                    receiver and size, the client's own DP releases' names, units,
                                    claimed mechanisms and sizes, or an error naming what did not
                                    match), the sealed ciphertexts packed in one bytes field 's' and the
                                    release payloads in one float64 array 'r' (admitted by the round machine)
    server -> client  fl_evaluate   the parameters this client evaluates ('p/…')
    client -> server  fl_evaluated  'meta' (JSON metrics)
    server -> client  fl_end        'meta' (JSON: why the run ended, one of END_REASONS, the last round
                                    completed and a short detail), sent before the transport's
                                    shutdown so that a client can tell a finished run from a stopped one

Packing keeps a ready message at four frames whatever its number of sealed messages and releases
(one frame each would be up to 82, over the transport's default of 64), and a broadcast's relays in
one frame. `max_ready_bytes` and `MAX_EVALUATED_BYTES` bound what a legitimate client sends, for
the server's read limits. Everything received is checked here (sizes, types, names, counts) before
the engine uses it; a check that fails raises ProtocolError and the message is dropped.
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from fl_algorithms.api import MAX_SEALED_BYTES, ClientBroadcast, Relayed, Sealed
from fl_algorithms.engine.round import MAX_RELAY_QUEUE, MAX_RELEASES_PER_CLIENT, MAX_SEALED_PER_CLIENT, ClientReady
from fl_algorithms.engine.secure_sum import MAX_PARTS, Layout
from dp.released import MAX_RELEASE_VALUES, ReleaseRecord
from secagg.messages import ProtocolError, Value

TRAIN, READY, EVALUATE, EVALUATED, END = "fl_train", "fl_ready", "fl_evaluate", "fl_evaluated", "fl_end"
END_REASONS = ("finished", "interrupted", "stopped", "failed")
"""Why a deployment ended: every round ran; the operator interrupted the server (SIGINT); the server
stopped it (too few live clients to release anything); the server failed (an error)."""
MAX_END_DETAIL = 512
MAX_META_BYTES = 1 << 20
MAX_FIELDS = 4096
MAX_METRICS = 256
HEADER_ALLOWANCE = 64 << 10
"""Bytes allowed for a message's header frame (a ready or evaluated header is under 200 bytes; the
transport caps any header at 16 KiB), the margin of the bounds below."""
MAX_EVALUATED_BYTES = HEADER_ALLOWANCE + MAX_META_BYTES
"""Wire bytes of the largest fl_evaluated message: a header and 'meta'."""


MAX_SUM_SIZE = 1 << 20
"""Most members a broadcast may announce for one secure sum (a size outside 1 .. this is malformed)."""


def max_ready_bytes(*, releases: int, sealed_bytes: int) -> int:
    """Wire bytes of the largest fl_ready a client can legitimately send when the run declares
    `releases` DP releases and allows `sealed_bytes` of Sealed ciphertexts per client: header, 'meta',
    the packed ciphertexts and the packed float64 release payloads (each at most MAX_RELEASE_VALUES)."""
    if releases < 0 or sealed_bytes < 0:
        raise ValueError("releases and sealed_bytes must be non-negative")
    sealed = min(sealed_bytes, MAX_SEALED_PER_CLIENT * MAX_SEALED_BYTES)
    return HEADER_ALLOWANCE + MAX_META_BYTES + sealed + min(releases, MAX_RELEASES_PER_CLIENT) * MAX_RELEASE_VALUES * 8


def _meta(obj: Mapping[str, Any]) -> bytes:
    raw = json.dumps(obj, sort_keys=True, allow_nan=False).encode()
    if len(raw) > MAX_META_BYTES:
        raise ValueError(f"message metadata of {len(raw)} bytes exceeds {MAX_META_BYTES}")
    return raw


def _parse_meta(fields: Mapping[str, Value]) -> dict[str, Any]:
    raw = fields.get("meta")
    if type(raw) is not bytes or len(raw) > MAX_META_BYTES:
        raise ProtocolError("missing or oversized 'meta' field")
    try:
        meta = json.loads(raw.decode())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError("'meta' is not JSON") from exc
    if not isinstance(meta, dict):
        raise ProtocolError("'meta' must be a JSON object")
    return meta


def _arrays(fields: Mapping[str, Value], prefix: str) -> dict[str, np.ndarray]:
    out = {}
    for name, value in fields.items():
        if not name.startswith(prefix):
            continue
        if not isinstance(value, np.ndarray) or value.dtype != np.float32 or value.ndim != 1:
            raise ProtocolError(f"field '{name}' must be a 1-D float32 array")
        if not np.all(np.isfinite(value)):
            raise ProtocolError(f"field '{name}' is not finite")
        out[name[len(prefix):]] = np.array(value)  # own, writable copy (received arrays are views)
    return out


def _check_field_names(fields: Mapping[str, Value], allowed: tuple[str, ...], exact: tuple[str, ...] = ()) -> None:
    if len(fields) > MAX_FIELDS:
        raise ProtocolError(f"{len(fields)} fields (limit {MAX_FIELDS})")
    for name in fields:
        if name != "meta" and name not in exact and not (allowed and name.startswith(allowed)):
            raise ProtocolError(f"unexpected field '{name}'")


def _unpack_bytes(fields: Mapping[str, Value], name: str, sizes: list[Any]) -> list[bytes]:
    """Split bytes field `name` into pieces of `sizes` (each 1..MAX_SEALED_BYTES, adding up to the
    field exactly; the field is absent iff there are none). ValueError otherwise."""
    if any(type(n) is not int or not 0 < n <= MAX_SEALED_BYTES for n in sizes):
        raise ValueError
    blob = fields.get(name)
    if (blob is None) != (not sizes) or (blob is not None and (type(blob) is not bytes or len(blob) != sum(sizes))):
        raise ValueError
    out, start = [], 0
    for n in sizes:
        out.append(blob[start:start + n])
        start += n
    return out


def _metrics(raw: Any) -> dict[str, float]:
    if not isinstance(raw, dict) or len(raw) > MAX_METRICS:
        raise ProtocolError("metrics must be a small JSON object")
    out = {}
    for k, v in raw.items():
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            raise ProtocolError(f"metric '{k}' is not a finite number")
        out[str(k)[:128]] = float(v)
    return out


# ---- broadcast -----------------------------------------------------------------------------------

def broadcast_fields(b: ClientBroadcast, *, round_ids: Mapping[str, int], config: Mapping[str, Any]) -> dict[str, Value]:
    fields: dict[str, Value] = {}
    for prefix, parts in (("c/", b.common), ("g/", b.group_parts), ("p/", b.own)):
        for name, arr in parts.items():
            fields[prefix + name] = np.ascontiguousarray(arr, dtype=np.float32)
    if b.inbox:
        fields["i"] = b"".join(r.ciphertext for r in b.inbox)
    fields["meta"] = _meta({"round": b.round, "group": b.group, "config": dict(config),
                            "sums": {n: [round_ids[n], list(p) if p is not None else None, b.sum_sizes.get(n)]
                                     for n, p in b.sums.items()},
                            "inbox": [[r.sender, r.round, len(r.ciphertext)] for r in b.inbox]})
    return fields


def parse_broadcast(fields: Mapping[str, Value]) -> tuple[ClientBroadcast, dict[str, int], dict[str, Any]]:
    """(the broadcast, transport round id of each sum, the server's secure config)."""
    _check_field_names(fields, ("c/", "g/", "p/"), exact=("i",))
    meta = _parse_meta(fields)
    try:
        round_ = int(meta["round"])
        group = meta["group"]
        if group is not None and not isinstance(group, str):
            raise ValueError
        sums, round_ids, sizes = {}, {}, {}
        if not isinstance(meta["sums"], dict) or len(meta["sums"]) > 64:
            raise ValueError
        for name, (rid, parts, size) in meta["sums"].items():
            round_ids[str(name)] = int(rid)
            sums[str(name)] = None if parts is None else tuple(str(p) for p in parts)
            if size is not None:
                if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_SUM_SIZE:
                    raise ValueError
                sizes[str(name)] = size
        relays = meta["inbox"]
        if not isinstance(relays, list) or len(relays) > MAX_RELAY_QUEUE:
            raise ValueError
        ciphertexts = _unpack_bytes(fields, "i", [n for _, _, n in relays])
        inbox = tuple(Relayed(sender=int(s), round=int(t), ciphertext=c) for (s, t, _), c in zip(relays, ciphertexts))
        config = dict(meta["config"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError("malformed broadcast metadata") from exc
    b = ClientBroadcast(round=round_, common=_arrays(fields, "c/"), group=group, group_parts=_arrays(fields, "g/"),
                        own=_arrays(fields, "p/"), inbox=inbox, sums=sums, sum_sizes=sizes)
    return b, round_ids, config


# ---- ready ----------------------------------------------------------------------------------------

def ready_fields(ready: ClientReady | None, *, error: str | None = None) -> dict[str, Value]:
    """A client's answer (or the error it reports): four frames at most, whatever it carries."""
    if ready is None:
        return {"meta": _meta({"error": (error or "failed")[:2000]})}
    fields: dict[str, Value] = {}
    if ready.sealed:
        fields["s"] = b"".join(s.ciphertext for s in ready.sealed)
    releases = sorted(ready.released.items())
    if releases:
        fields["r"] = np.concatenate([np.asarray(r.payload, dtype=np.float64).ravel() for _, r in releases])
    fields["meta"] = _meta({"released": [[n, r.unit.value, r.summary_key, dict(r.mechanism), r.round_id,
                                          int(np.asarray(r.payload).size)] for n, r in releases],
                            "layouts": {n: [list(p) for p in lay.parts] for n, lay in ready.layouts.items()},
                            "metrics": {k: float(v) for k, v in ready.metrics.items() if math.isfinite(float(v))},
                            "sealed": [[s.receiver, len(s.ciphertext)] for s in ready.sealed], "error": None,
                            "clipped": {n: int(c) for n, c in ready.clipped.items()}})
    return fields


def parse_ready(fields: Mapping[str, Value]) -> ClientReady | str:
    """The client's answer, or the error it reported (a string)."""
    _check_field_names(fields, (), exact=("s", "r"))
    meta = _parse_meta(fields)
    if meta.get("error"):
        return str(meta["error"])[:2000]
    try:
        layouts = {}
        if not isinstance(meta["layouts"], dict) or len(meta["layouts"]) > 64:
            raise ValueError
        for name, parts in meta["layouts"].items():
            if not isinstance(parts, list) or len(parts) > MAX_PARTS:
                raise ValueError
            layouts[str(name)] = Layout(tuple((str(n), int(k), int(c)) for n, k, c in parts)).validate()
        entries = meta["sealed"]
        if not isinstance(entries, list) or len(entries) > MAX_SEALED_PER_CLIENT:
            raise ValueError
        ciphertexts = _unpack_bytes(fields, "s", [n for _, n in entries])
        sealed = tuple(Sealed(receiver=int(r), ciphertext=c) for (r, _), c in zip(entries, ciphertexts))
        metrics = _metrics(meta["metrics"])
        clipped = meta.get("clipped", {})
        if not isinstance(clipped, dict) or set(clipped) - set(layouts):
            raise ValueError
        clipped = {str(n): int(c) for n, c in clipped.items()}
        if any(c < 0 or c > layouts[n].length for n, c in clipped.items()):
            raise ValueError
        released = _releases(meta.get("released", []), fields)
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError("malformed ready message") from exc
    return ClientReady(layouts=layouts, sealed=sealed, metrics=metrics, clipped=clipped, released=released)


def _releases(entries: Any, fields: Mapping[str, Value]) -> dict[str, ReleaseRecord]:
    """The client's release records (ValueError if malformed: counts, names, payloads, mechanisms)."""
    if not isinstance(entries, list) or len(entries) > MAX_RELEASES_PER_CLIENT:
        raise ValueError
    sizes = [n for (_, _, _, _, _, n) in entries]
    if any(type(n) is not int or not 0 < n <= MAX_RELEASE_VALUES for n in sizes):
        raise ValueError
    packed = fields.get("r")
    if (packed is None) != (not entries):
        raise ValueError
    if packed is not None and (not isinstance(packed, np.ndarray) or packed.dtype != np.float64
                               or packed.ndim != 1 or packed.shape[0] != sum(sizes)):
        raise ValueError
    out, start = {}, 0
    for (name, unit, key, mechanism, round_id, n) in entries:
        if type(name) is not str or name in out or not isinstance(mechanism, dict):
            raise ValueError
        out[name] = ReleaseRecord(payload=np.array(packed[start:start + n]), unit=unit, summary_key=key,
                                  mechanism=mechanism, round_id=round_id)
        start += n
    return out


# ---- evaluation -----------------------------------------------------------------------------------

def evaluate_fields(parameters: Mapping[str, np.ndarray], *, round: int) -> dict[str, Value]:
    fields: dict[str, Value] = {f"p/{k}": np.ascontiguousarray(v, dtype=np.float32).ravel() for k, v in parameters.items()}
    fields["meta"] = _meta({"round": round})
    return fields


def parse_evaluate(fields: Mapping[str, Value]) -> tuple[dict[str, np.ndarray], int]:
    _check_field_names(fields, ("p/",))
    meta = _parse_meta(fields)
    try:
        return _arrays(fields, "p/"), int(meta["round"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError("malformed evaluation request") from exc


def evaluated_fields(metrics: Mapping[str, float]) -> dict[str, Value]:
    return {"meta": _meta({"metrics": {k: float(v) for k, v in metrics.items() if math.isfinite(float(v))}})}


def parse_evaluated(fields: Mapping[str, Value]) -> dict[str, float]:
    _check_field_names(fields, ())
    return _metrics(_parse_meta(fields).get("metrics"))


# ---- the end of a run -----------------------------------------------------------------------------

@dataclass(frozen=True)
class RunEnd:
    """What the server tells every client when the run ends (`END`)."""

    reason: str
    """One of END_REASONS."""
    round: int
    """The last round the server completed (0: none)."""
    detail: str = ""

    def __post_init__(self) -> None:
        if self.reason not in END_REASONS:
            raise ValueError(f"an end reason is one of {END_REASONS}, got {self.reason!r}")
        if type(self.round) is not int or self.round < 0:
            raise ValueError(f"the last round is a non-negative int, got {self.round!r}")


def end_fields(end: RunEnd) -> dict[str, Value]:
    return {"meta": _meta({"reason": end.reason, "round": end.round, "detail": end.detail[:MAX_END_DETAIL]})}


def parse_end(fields: Mapping[str, Value]) -> RunEnd:
    _check_field_names(fields, ())
    meta = _parse_meta(fields)
    try:
        detail = meta.get("detail", "")
        if not isinstance(detail, str) or len(detail) > MAX_END_DETAIL or type(meta["round"]) is not int:
            raise ValueError("detail is a short string, round an int")
        return RunEnd(reason=meta["reason"], round=meta["round"], detail=detail)
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed end-of-run message: {exc}") from exc


def config_mismatch(server: Mapping[str, Any], client: Mapping[str, Any]) -> str | None:
    """A message naming both sides of every setting they disagree on (None if they agree)."""
    keys = sorted(set(server) | set(client))
    diffs = [f"{k}: server {server.get(k)!r}, client {client.get(k)!r}" for k in keys if server.get(k) != client.get(k)]
    return "; ".join(diffs) if diffs else None
