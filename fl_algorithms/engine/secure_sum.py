"""The bridge between algorithms and secure-sum protocols: the only code that unwraps a Masked part.

Client side, each client's Masked parts are encoded into one ring vector ([w, w*x] per part) and
handed to its protocol client as its input; server side, the protocol's ring sum is decoded into
per-part weighted means, and an AggregateView is built from them and the Released values.
"""
from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fl_algorithms.api import _SECURE_LAYER, AggregateView, GroupAggregate, Upload
from secagg.encoding import EncodingConfig, FixedPointEncoder
from secagg.protocols import registry
from secagg.simulate import run_round


@dataclass(frozen=True)
class SecureAggregationConfig:
    protocol: str = "secagg+"
    """One of 'plain' (insecure baseline), 'secagg', 'secagg+', 'lightsecagg'."""
    clip: float = 8.0
    """Per-coordinate range of every masked vector; values outside are clipped (and counted)."""
    max_weight: float = 1e4
    """Largest aggregation weight (e.g. a client's example count)."""
    max_clients: int = 1000
    protocol_params: Mapping[str, object] = field(default_factory=dict)
    """Extra keyword arguments of the protocol's server (e.g. degree, threshold_fraction)."""
    distributed_dp: Any = None
    """A `dp.distributed.DistributedDPConfig`: each client clips its whole update (all Masked parts
    together, client-level unit) and adds integer noise before masking; the server gets a Released
    noisy mean (unweighted) and the ledger is debited every round. None: exact weighted means."""

    def __post_init__(self) -> None:
        if self.protocol not in registry.names():
            raise ValueError(f"unknown protocol '{self.protocol}'; choose one of {registry.names()}")

    @property
    def ring(self):
        return registry.default_ring(self.protocol)


@dataclass(frozen=True)
class Layout:
    """Names and lengths of the masked parts, in the order they are concatenated."""

    parts: tuple[tuple[str, int], ...]

    @classmethod
    def of(cls, upload: Upload) -> "Layout":
        return cls(tuple(sorted((name, len(m)) for name, m in upload.masked.items())))

    @property
    def length(self) -> int:
        return sum(n + 1 for _, n in self.parts)


@dataclass
class SecureRoundStats:
    seconds: float = 0.0
    clipped: int = 0
    bytes_uploaded: dict[int, int] = field(default_factory=dict)
    dropped: dict[str, frozenset[int]] = field(default_factory=dict)


class SecureAggregator:
    """Runs one secure sum per round over the clients' Masked parts (in-memory protocol driver).

    With `distributed_dp` set, every sum carries the clients' integer DP noise and is charged to
    `ledger`; `transcript` (a `dp.leakage.Transcript`) records exactly what the server received.
    """

    def __init__(self, config: SecureAggregationConfig, *, ledger=None, transcript=None) -> None:
        self.config = config
        self.encoder = FixedPointEncoder(
            EncodingConfig(clip=config.clip, max_weight=config.max_weight, max_clients=config.max_clients),
            ring=config.ring,
        )
        self.ledger, self.transcript = ledger, transcript
        self._ddp: dict[int, Any] = {}
        if config.distributed_dp is not None and ledger is None:
            raise ValueError("distributed DP needs a ledger to charge")

    def ddp_encoder(self, dim: int):
        if dim not in self._ddp:
            from dp.distributed import DistributedDPEncoder

            self._ddp[dim] = DistributedDPEncoder.from_config(self.config.distributed_dp, dim=dim, ring=self.config.ring)
        return self._ddp[dim]

    @staticmethod
    def rotation_seed(round: int) -> int:
        """Public per-round seed of the randomised Hadamard rotation (anyone may know it)."""
        return int.from_bytes(hashlib.sha256(f"ddp-rotation/{round}".encode()).digest()[:8], "big")

    def encode_ddp(self, upload: Upload, layout: Layout, *, round: int) -> np.ndarray:
        """Client side: clip the concatenated parts, rotate, round, add local noise (client-level DP)."""
        x = np.concatenate([upload.masked[name].unwrap(_SECURE_LAYER) for name, _ in layout.parts])
        return self.ddp_encoder(x.shape[0]).encode(x, round_seed=self.rotation_seed(round))

    def encode_upload(self, upload: Upload, layout: Layout) -> tuple[np.ndarray, int]:
        """Client side: the ring vector of all Masked parts, and how many values were clipped."""
        if Layout.of(upload) != layout:
            raise ValueError(f"upload parts {Layout.of(upload).parts} differ from the round's {layout.parts}")
        pieces, clipped = [], 0
        for name, _ in layout.parts:
            part = upload.masked[name]
            vec, report = self.encoder.encode(part.unwrap(_SECURE_LAYER), weight=part.weight)
            pieces.append(vec)
            clipped += report.clipped
        return np.concatenate(pieces), clipped

    def decode(self, ring_sum: np.ndarray, layout: Layout, count: int) -> dict[str, GroupAggregate]:
        """Server side: per-part weighted means from the ring sum."""
        out, start = {}, 0
        for name, n in layout.parts:
            dec = self.encoder.decode(ring_sum[start : start + n + 1])
            out[name] = GroupAggregate(
                mean=dec.mean, total_weight=dec.total_weight, count=count,
                error_bound=self.encoder.mean_error_bound(n_clients=count, total_weight=dec.total_weight),
            )
            start += n + 1
        return out

    def aggregate(self, *, round: int, uploads: Mapping[int, Upload], drop_at: Mapping[str, set[int]] | None = None,
                  stats: SecureRoundStats | None = None, population: Iterable[int] | None = None) -> AggregateView:
        """Secure-sum the uploads of one round (simulation: all parties in this process).

        `population` (default: this round's cohort) is every client that could have been sampled:
        with distributed DP amplified by sampling, all of them are charged against outsiders.
        """
        if not uploads:
            raise ValueError("no uploads to aggregate")
        layout = Layout.of(next(iter(uploads.values())))
        ddp = self.config.distributed_dp is not None and bool(layout.parts)
        encoded: dict[int, np.ndarray] = {}
        clipped = 0
        for cid, up in uploads.items():
            if ddp:
                if Layout.of(up) != layout:
                    raise ValueError("all uploads of a round must have the same parts")
                encoded[cid] = self.encode_ddp(up, layout, round=round)
            else:
                encoded[cid], c = self.encode_upload(up, layout)
                clipped += c
        t0 = time.perf_counter()
        length = next(iter(encoded.values())).shape[0] if encoded else layout.length
        server = registry.server_class(self.config.protocol)(
            round_id=round, clients=list(uploads), length=length, ring=self.config.ring,
            **dict(self.config.protocol_params),
        )
        clients = {
            cid: registry.client_class(self.config.protocol)(client_id=cid, round_id=round, input_fn=lambda v=vec: v)
            for cid, vec in encoded.items()
        }
        sent: dict[int, int] = {}
        result = run_round(server, clients, drop_at=drop_at, bytes_sent=sent)
        released_sum = None
        if ddp:
            released_sum = self.ddp_encoder(sum(n for _, n in layout.parts)).release(
                result.ring_sum, round_seed=self.rotation_seed(round), round_id=round,
                contributors=result.contributors, ledger=self.ledger,
                population=sorted(population) if population is not None else sorted(uploads))
            groups, start = {}, 0
            for name, n in layout.parts:
                groups[name] = GroupAggregate(mean=np.asarray(released_sum.payload[start:start + n]),
                                              total_weight=float(len(result.contributors)),
                                              count=len(result.contributors), error_bound=float("nan"))
                start += n
        else:
            groups = self.decode(result.ring_sum, layout, len(result.contributors)) if layout.parts else {}
        if self.transcript is not None and self.config.protocol == "plain" and not ddp:
            # The plain protocol shows the server every client's vector: record what it saw.
            for cid in result.contributors:
                start = 0
                for name, n in layout.parts:
                    dec = self.encoder.decode(encoded[cid][start:start + n + 1])
                    self.transcript.record_individual(round, cid, name, dec.weighted_sum / dec.total_weight)
                    start += n + 1
        if stats is not None:
            stats.seconds += time.perf_counter() - t0
            stats.clipped += clipped
            stats.dropped = dict(result.dropped)
            stats.bytes_uploaded = sent
        released = {
            name: {cid: uploads[cid].released[name] for cid in result.contributors if name in uploads[cid].released}
            for name in {n for u in uploads.values() for n in u.released}
        }
        if released_sum is not None:
            released["model-update"] = {0: released_sum}
        view = build_view(round=round, groups=groups, released=released, contributors=result.contributors)
        if self.transcript is not None:
            self.transcript.record_view(view, cohort=sorted(uploads))
        return view


def build_view(*, round: int, groups: Mapping[str, GroupAggregate], released: Mapping[str, Mapping[int, object]],
               contributors: frozenset[int]) -> AggregateView:
    """Construct an AggregateView (secure layer and transport drivers only)."""
    return AggregateView(round=round, groups=groups, released=released, contributors=contributors, capability=_SECURE_LAYER)
