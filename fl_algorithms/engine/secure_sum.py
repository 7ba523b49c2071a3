"""The bridge between algorithms and secure-sum protocols: the only code that unwraps a Masked part.

Client half (`SecureAggregator.client_encode`): the Masked parts a client adds to one secure sum are
encoded into one ring vector, `[w, w*clip(x)]` per part (fixed point), or clipped, rotated and
noised as a whole (distributed DP). A cluster-indexed part (`Masked(..., cluster=a, clusters=K)`)
becomes K blocks of which only block a is non-zero, so the server learns per-cluster sums and
weights but not who is in which cluster.

Server half (`SecureAggregator.server_decode`): the protocol's ring sum is decoded into per-part
weighted means (or a Released noisy mean, charged to the ledger). The round engine
(`fl_algorithms.engine.round`) builds the AggregateView from these; drivers move the vectors.
"""
from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fl_algorithms.api import _SECURE_LAYER, DEFAULT_SUM, AggregateView, GroupAggregate, Upload
from secagg.encoding import EncodingConfig, FixedPointEncoder
from secagg.protocols import registry
from secagg.protocols.base import MAX_VECTOR_LENGTH
from secagg.simulate import run_round

MAX_PART_LENGTH = MAX_VECTOR_LENGTH
"""Largest Masked part: a layout naming more is refused before it costs memory."""
MAX_PARTS = 64
"""Most Masked parts in one secure sum."""
MAX_CLUSTERS = 1024
"""Most clusters of one cluster-indexed part."""


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
    """A `dp.distributed.DistributedDPConfig`: each client clips its whole contribution to a sum
    (all its Masked parts together, client-level unit) and adds integer noise before masking; the
    server gets a Released noisy mean (unweighted) and the ledger is debited. None: exact means."""
    insecure_seed: int | None = None
    """TESTS ONLY. Derives every client's stochastic rounding and DP noise from this public seed
    and (round, sum, client), so that two runtimes can be compared bit for bit. Anyone who knows
    the seed knows the noise and can subtract it: never set it in a run whose privacy you report."""

    def __post_init__(self) -> None:
        if self.protocol not in registry.names():
            raise ValueError(f"unknown protocol '{self.protocol}'; choose one of {registry.names()}")
        if isinstance(self.distributed_dp, Mapping):  # from a TOML table
            from dp.distributed import DistributedDPConfig

            object.__setattr__(self, "distributed_dp", DistributedDPConfig(**self.distributed_dp))

    @property
    def ring(self):
        return registry.default_ring(self.protocol)

    def describe(self) -> dict[str, Any]:
        """What a server and its clients must agree on (compared at every broadcast in deployment)."""
        import dataclasses
        import json

        ddp = self.distributed_dp
        doc = {"protocol": self.protocol, "clip": self.clip, "max_weight": self.max_weight,
               "max_clients": self.max_clients, "protocol_params": dict(self.protocol_params),
               "distributed_dp": None if ddp is None else dataclasses.asdict(ddp),
               "insecure_seed": self.insecure_seed}
        return json.loads(json.dumps(doc, default=str))  # as it reads after a trip over the wire


@dataclass(frozen=True)
class Layout:
    """Names, lengths and cluster counts of the parts in one sum, in the order they are concatenated.

    Each entry is (name, n, k): k = 0 for an ordinary part, k >= 1 for a cluster-indexed part of
    k blocks of n values each.
    """

    parts: tuple[tuple[str, int, int], ...]

    @classmethod
    def of(cls, upload: Upload, parts: tuple[str, ...] | None = None) -> "Layout":
        names = sorted(upload.masked) if parts is None else list(parts)
        missing = [n for n in names if n not in upload.masked]
        if missing:
            raise ValueError(f"the upload lacks the Masked parts {missing} of this sum")
        return cls(tuple((n, len(upload.masked[n]), upload.masked[n].clusters or 0) for n in names))

    @property
    def length(self) -> int:
        """Length of the fixed-point ring vector: one weight slot per part (per cluster block)."""
        return sum((n + 1) * max(k, 1) for _, n, k in self.parts)

    @property
    def dim(self) -> int:
        """Number of real values (what distributed DP clips and noises)."""
        return sum(n * max(k, 1) for _, n, k in self.parts)

    def validate(self) -> "Layout":
        """Bounds a layout received from a peer must satisfy before it costs memory."""
        if len(self.parts) > MAX_PARTS:
            raise ValueError(f"{len(self.parts)} parts in one sum (limit {MAX_PARTS})")
        names = [n for n, _, _ in self.parts]
        if len(set(names)) != len(names) or any(not n or len(n) > 128 for n in names):
            raise ValueError("part names must be distinct strings of 1..128 characters")
        for name, n, k in self.parts:
            if not 0 <= n <= MAX_PART_LENGTH or not 0 <= k <= MAX_CLUSTERS or n * max(k, 1) > MAX_PART_LENGTH:
                raise ValueError(f"part '{name}' of {n} values x {k} clusters is outside the limits")
        return self


@dataclass
class SecureRoundStats:
    seconds: float = 0.0
    clipped: int = 0
    bytes_uploaded: dict[int, int] = field(default_factory=dict)
    dropped: dict[str, frozenset[int]] = field(default_factory=dict)


@dataclass(frozen=True)
class EncodedInput:
    """A client's input to one secure sum: its layout, its ring vector, and how much it clipped."""

    layout: Layout
    vector: np.ndarray
    clipped: int


def _key(seed: int, *labels: object) -> bytes:
    return hashlib.sha256("/".join(["fedsecure-insecure-test-seed", str(seed), *map(str, labels)]).encode()).digest()


class SecureAggregator:
    """Both halves of the secure layer, plus an in-memory driver for one-sum rounds.

    With `distributed_dp` set, every sum carries the clients' integer DP noise and is charged to
    `ledger`; `transcript` (a `dp.leakage.Transcript`) records exactly what the server received.
    """

    def __init__(self, config: SecureAggregationConfig, *, ledger=None, transcript=None,
                 client_side: bool = False) -> None:
        """`client_side=True`: only the client half is used (it encodes; it never decodes or charges)."""
        self.config = config
        self.encoder = FixedPointEncoder(
            EncodingConfig(clip=config.clip, max_weight=config.max_weight, max_clients=config.max_clients),
            ring=config.ring,
        )
        self.ledger, self.transcript = ledger, transcript
        self._ddp: dict[int, Any] = {}
        if config.distributed_dp is not None and ledger is None and not client_side:
            raise ValueError("distributed DP needs a ledger to charge")

    @property
    def ddp(self) -> bool:
        return self.config.distributed_dp is not None

    def ddp_encoder(self, dim: int):
        if dim not in self._ddp:
            from dp.distributed import DistributedDPEncoder

            self._ddp[dim] = DistributedDPEncoder.from_config(self.config.distributed_dp, dim=dim, ring=self.config.ring)
        return self._ddp[dim]

    @staticmethod
    def rotation_seed(round: int, sum_name: str = DEFAULT_SUM) -> int:
        """Public per-round (per-sum) seed of the randomised Hadamard rotation (anyone may know it)."""
        label = f"ddp-rotation/{round}" if sum_name == DEFAULT_SUM else f"ddp-rotation/{round}/{sum_name}"
        return int.from_bytes(hashlib.sha256(label.encode()).digest()[:8], "big")

    def input_length(self, layout: Layout) -> int:
        """Length of the ring vector every member of a sum with this layout contributes."""
        return self.ddp_encoder(layout.dim).length if self.ddp and layout.parts else layout.length

    # ---- client half ------------------------------------------------------------------------
    def client_encode(self, upload: Upload, *, parts: tuple[str, ...] | None, round: int,
                      sum_name: str = DEFAULT_SUM, client_id: int = 0) -> EncodedInput:
        """Client side: the ring vector of this client's parts in one sum (fixed point or DDP)."""
        layout = Layout.of(upload, parts)
        seed = self.config.insecure_seed
        if self.ddp:
            if any(k for _, _, k in layout.parts):
                raise ValueError("cluster-indexed parts under distributed DP are not supported yet")
            x = np.concatenate([upload.masked[name].unwrap(_SECURE_LAYER) for name, _, _ in layout.parts]) \
                if layout.parts else np.zeros(0)
            rng = None
            if seed is not None:
                from dp.samplers import CryptoRandom

                rng = CryptoRandom(_key(seed, "ddp", round, sum_name, client_id))
            vec = self.ddp_encoder(x.shape[0]).encode(x, round_seed=self.rotation_seed(round, sum_name), rng=rng)
            return EncodedInput(layout=layout, vector=vec, clipped=0)
        pieces, clipped = [], 0
        for index, (name, n, k) in enumerate(layout.parts):
            part = upload.masked[name]
            key = None if seed is None else _key(seed, "rounding", round, sum_name, client_id, index)
            vec, report = self.encoder.encode(part.unwrap(_SECURE_LAYER), weight=part.weight, rounding_key=key)
            clipped += report.clipped
            if k == 0:
                pieces.append(vec)
            else:  # cluster-indexed: the client's block, zeros (exact) everywhere else
                blocks = np.zeros((k, n + 1), dtype=np.uint32)
                blocks[part.cluster] = vec
                pieces.append(blocks.ravel())
        vector = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.uint32)
        return EncodedInput(layout=layout, vector=vector, clipped=clipped)

    def encode_upload(self, upload: Upload, layout: Layout) -> tuple[np.ndarray, int]:
        """Client side, fixed point: the ring vector of all Masked parts and how many values were clipped."""
        if Layout.of(upload) != layout:
            raise ValueError(f"upload parts {Layout.of(upload).parts} differ from the round's {layout.parts}")
        enc = self.client_encode(upload, parts=tuple(n for n, _, _ in layout.parts), round=0)
        return enc.vector, enc.clipped

    # ---- server half ------------------------------------------------------------------------
    def decode(self, ring_sum: np.ndarray, layout: Layout, count: int) -> dict[str, GroupAggregate]:
        """Per-part weighted means from a fixed-point ring sum; cluster k of part p is 'p[k]'."""
        out, start = {}, 0
        for name, n, k in layout.parts:
            for block in range(max(k, 1)):
                chunk = ring_sum[start: start + n + 1]
                start += n + 1
                key = name if k == 0 else f"{name}[{block}]"
                signed_weight = float(self.encoder.ring.to_signed(chunk[:1])[0])
                if k and signed_weight == 0:  # an empty cluster: nothing to decode
                    out[key] = GroupAggregate(mean=np.full(n, np.nan), total_weight=0.0, count=0, error_bound=float("nan"))
                    continue
                dec = self.encoder.decode(chunk)
                out[key] = GroupAggregate(
                    mean=dec.mean, total_weight=dec.total_weight, count=count,
                    error_bound=self.encoder.mean_error_bound(n_clients=count, total_weight=dec.total_weight))
        return out

    def server_decode(self, ring_sum: np.ndarray, *, layout: Layout, contributors: frozenset[int], round: int,
                      sum_name: str = DEFAULT_SUM, population: Iterable[int] | None = None):
        """Server side: (per-part aggregates, the Released noisy mean under DDP or None)."""
        if not layout.parts:
            return {}, None
        if not self.ddp:
            return self.decode(ring_sum, layout, len(contributors)), None
        summary_key = "model-update" if sum_name == DEFAULT_SUM else f"model-update/{sum_name}"
        released = self.ddp_encoder(layout.dim).release(
            ring_sum, round_seed=self.rotation_seed(round, sum_name), round_id=round, contributors=contributors,
            ledger=self.ledger, population=sorted(population) if population is not None else sorted(contributors),
            summary_key=summary_key)
        groups, start = {}, 0
        for name, n, _ in layout.parts:
            groups[name] = GroupAggregate(mean=np.asarray(released.payload[start:start + n]),
                                          total_weight=float(len(contributors)), count=len(contributors),
                                          error_bound=float("nan"))
            start += n
        return groups, released

    def record_individuals(self, round: int, inputs: Mapping[int, EncodedInput], contributors: Iterable[int]) -> None:
        """The plain protocol shows the server every client's vector: record what it saw."""
        if self.transcript is None or self.config.protocol != "plain" or self.ddp:
            return
        for cid in contributors:
            enc, start = inputs[cid], 0
            for name, n, k in enc.layout.parts:
                if k == 0:
                    dec = self.encoder.decode(enc.vector[start:start + n + 1])
                    self.transcript.record_individual(round, cid, name, dec.weighted_sum / dec.total_weight)
                start += (n + 1) * max(k, 1)

    # ---- in-memory driver of one sum --------------------------------------------------------
    def run_sum(self, *, round_id: int, inputs: Mapping[int, np.ndarray], length: int,
                protocol_params: Mapping[str, object] | None = None,
                drop_at: Mapping[str, set[int]] | None = None, bytes_sent: dict[int, int] | None = None):
        """Run the configured protocol over `inputs` in this process; returns its RoundResult."""
        params = {**dict(self.config.protocol_params), **dict(protocol_params or {})}
        server = registry.server_class(self.config.protocol)(
            round_id=round_id, clients=sorted(inputs), length=length, ring=self.config.ring, **params)
        clients = {cid: registry.client_class(self.config.protocol)(client_id=cid, round_id=round_id,
                                                                    input_fn=lambda v=vec: v)
                   for cid, vec in inputs.items()}
        return run_round(server, clients, drop_at=drop_at, bytes_sent=bytes_sent)

    def aggregate(self, *, round: int, uploads: Mapping[int, Upload], drop_at: Mapping[str, set[int]] | None = None,
                  stats: SecureRoundStats | None = None, population: Iterable[int] | None = None) -> AggregateView:
        """One secure sum of all Masked parts of `uploads`, in memory (all parties in this process).

        `population` (default: the uploaders) is every client that could have been sampled: with
        distributed DP amplified by sampling, all of them are charged against outsiders.
        """
        if not uploads:
            raise ValueError("no uploads to aggregate")
        inputs = {cid: self.client_encode(up, parts=None, round=round, client_id=cid) for cid, up in uploads.items()}
        layouts = {enc.layout for enc in inputs.values()}
        if len(layouts) != 1:
            raise ValueError("all uploads of a round must have the same parts")
        layout = layouts.pop()
        t0 = time.perf_counter()
        sent: dict[int, int] = {}
        result = self.run_sum(round_id=round, inputs={c: e.vector for c, e in inputs.items()},
                              length=self.input_length(layout), drop_at=drop_at, bytes_sent=sent)
        groups, released_sum = self.server_decode(result.ring_sum, layout=layout, contributors=result.contributors,
                                                  round=round, population=population if population is not None else uploads)
        self.record_individuals(round, inputs, result.contributors)
        if stats is not None:
            stats.seconds += time.perf_counter() - t0
            stats.clipped += sum(e.clipped for e in inputs.values())
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


def build_view(*, round: int, groups: Mapping[str, GroupAggregate] | None = None,
               released: Mapping[str, Mapping[int, object]], contributors: frozenset[int],
               sums: Mapping[str, Mapping[str, GroupAggregate]] | None = None,
               sum_contributors: Mapping[str, frozenset[int]] | None = None,
               failed: Mapping[str, str] | None = None) -> AggregateView:
    """Construct an AggregateView (secure layer and round engine only)."""
    return AggregateView(round=round, groups=groups, released=released, contributors=contributors,
                         capability=_SECURE_LAYER, sums=sums, sum_contributors=sum_contributors, failed=failed)
