"""The one interface every federated algorithm implements, and the privacy boundary it runs behind.

A round has three steps, each run by a different party:

    plan                 = server.configure_round(round=t, state=server_state, cohort=cohort)
    upload, client_state = client.client_update(broadcast=plan.broadcast.for_client(i), client=ClientContext(...))
    server_state         = server.server_update(state=server_state, view=AggregateView(...))

An algorithm is written as one class (its paper's equations side by side), but the engine runs it
as separate objects: one server role and one client role per client (`fl_algorithms.engine.roles`),
deep copies that share nothing but the messages the engine carries between them.

A `RoundPlan` holds the broadcast, a common public part plus per-group and per-client public
parts (each client receives only its own), and the round's secure sums: each `SumSpec` names a
group of the cohort, the Masked parts it adds up, and its own minimum size and threshold.

A client's `Upload` leaves the client only in the three permitted forms:
`Masked` parts go through secure aggregation, `Released` parts are DP outputs charged to a ledger
(constructed only by `dp`, under a mechanism the algorithm declared in `releases`; the server
admits them through `dp.admission` and charges its own ledger), and `Sealed` parts are ciphertexts for named peers (docs/ARCHITECTURE.md). Server code never
sees an Upload: it receives an `AggregateView`, which only the secure-aggregation layer can build,
holding group means, total weights and Released values.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, TypeVar

import numpy as np


class PrivacyBoundaryError(RuntimeError):
    """Code tried to read a client's private vector outside the secure-aggregation layer."""


_SECURE_LAYER = object()  # capability held by fl_algorithms.engine.secure_sum only


class Masked:
    """A vector that may leave the client only inside a secure sum, with its aggregation weight.

    The payload is not readable by ordinary code: `np.asarray(masked)`, indexing, pickling and
    attribute access raise PrivacyBoundaryError. Only the secure layer unwraps it, on the client.
    """

    __slots__ = ("_vector", "weight", "clip", "cluster", "clusters")

    def __init__(self, vector: np.ndarray, *, weight: float, clip: float | None = None,
                 cluster: int | None = None, clusters: int | None = None) -> None:
        """`clip`: this part's own per-coordinate range, at most the run's `SecureAggregationConfig.clip`
        (the secure layer clips to it and counts what it clipped; a wider one is refused at encoding).
        `cluster`/`clusters` make this a cluster-indexed part: the secure sum adds it into block
        `cluster` of `clusters` blocks, so the server learns per-cluster sums, never the assignment."""
        v = np.ascontiguousarray(vector, dtype=np.float64).ravel()
        if not np.all(np.isfinite(v)):
            raise ValueError("masked vector contains NaN or infinity")
        if not weight > 0:
            raise ValueError("aggregation weight must be positive")
        if clip is not None and not (isinstance(clip, (int, float)) and math.isfinite(clip) and clip > 0):
            raise ValueError(f"clip must be a positive number (a per-coordinate range within the run's), got {clip!r}")
        if (cluster is None) != (clusters is None):
            raise ValueError("give both cluster and clusters, or neither")
        if clusters is not None and not (type(clusters) is int and type(cluster) is int and 0 <= cluster < clusters):
            raise ValueError(f"cluster must be an int in [0, clusters), got {cluster} of {clusters}")
        object.__setattr__(self, "_vector", v)
        object.__setattr__(self, "weight", float(weight))
        object.__setattr__(self, "clip", clip)
        object.__setattr__(self, "cluster", cluster)
        object.__setattr__(self, "clusters", clusters)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Masked is immutable")

    def __len__(self) -> int:
        return self._vector.shape[0]

    def __array__(self, *args, **kwargs):
        raise PrivacyBoundaryError("a Masked vector can only be summed by secure aggregation")

    def __getitem__(self, item):
        raise PrivacyBoundaryError("a Masked vector can only be summed by secure aggregation")

    def __reduce__(self):
        raise PrivacyBoundaryError("a Masked vector cannot be serialised in the clear")

    def __repr__(self) -> str:
        return f"Masked(<{len(self)} values hidden>, weight={self.weight})"

    def unwrap(self, capability: object) -> np.ndarray:
        if capability is not _SECURE_LAYER:
            raise PrivacyBoundaryError("only the secure-aggregation layer may unwrap a Masked vector")
        return self._vector


@dataclass(frozen=True)
class Sealed:
    """Ciphertext addressed to one peer client; the server relays it without reading it.

    The engine delivers it with the receiver's next broadcast (`ClientBroadcast.inbox`), naming
    the sender. Encryption and its keys are the sending algorithm's business: the engine only
    checks sizes and that the receiver exists.
    """

    receiver: int
    ciphertext: bytes

    def __post_init__(self) -> None:
        if type(self.receiver) is not int or self.receiver <= 0:
            raise ValueError("a Sealed message needs a positive receiver id")
        if type(self.ciphertext) is not bytes or not 0 < len(self.ciphertext) <= MAX_SEALED_BYTES:
            raise ValueError(f"sealed ciphertext must be 1..{MAX_SEALED_BYTES} bytes")


MAX_SEALED_BYTES = 1 << 24
"""Largest relayed ciphertext (16 MiB): the server buffers relays until the receiver's next round."""


@dataclass(frozen=True)
class Relayed:
    """A Sealed message as the receiver gets it: who sent it, in which round, and the ciphertext."""

    sender: int
    round: int
    ciphertext: bytes


@dataclass(frozen=True)
class Upload:
    """What a client sends in a round: named Masked parts, Released values and Sealed messages."""

    masked: Mapping[str, Masked] = field(default_factory=dict)
    released: Mapping[str, Any] = field(default_factory=dict)
    sealed: tuple[Sealed, ...] = ()
    metrics: Mapping[str, float] = field(default_factory=dict)
    """Client-local diagnostics (e.g. training loss) kept client side: the runner logs them only in
    simulation reports and never passes them to server code."""

    def __post_init__(self) -> None:
        for name, part in self.masked.items():
            if not isinstance(part, Masked):
                raise TypeError(f"masked part '{name}' must be a Masked, got {type(part).__name__}")
        if not self.released:
            return
        from dp.released import Released  # local import: only uploads with DP parts need dp

        for name, part in self.released.items():
            if not isinstance(part, Released):
                raise TypeError(f"released part '{name}' must be built by a dp mechanism")


@dataclass(frozen=True)
class GroupAggregate:
    """The decoded secure sum of one masked part over the round's contributors."""

    mean: np.ndarray
    total_weight: float
    count: int
    error_bound: float
    """Worst-case absolute quantisation error of each coordinate of `mean`."""


DEFAULT_SUM = "all"
"""Name of the one secure sum of a round whose plan names none: every cohort member, every part."""


class AggregateView:
    """Everything server-side algorithm code may see about a round. Built by the secure layer only.

    `sums[name][part]` is the decoded aggregate of one part over one secure sum's contributors;
    `groups` is `sums["all"]` (the default sum). A sum that could not finish (too few members, an
    abort) is absent from `sums` and present in `failed` with the reason: one small group never
    sinks the round.
    """

    __slots__ = ("round", "sums", "released", "contributors", "sum_contributors", "failed")

    def __init__(self, *, round: int, groups: Mapping[str, GroupAggregate] | None = None,
                 released: Mapping[str, Mapping[int, Any]], contributors: frozenset[int], capability: object,
                 sums: Mapping[str, Mapping[str, GroupAggregate]] | None = None,
                 sum_contributors: Mapping[str, frozenset[int]] | None = None,
                 failed: Mapping[str, str] | None = None) -> None:
        if capability is not _SECURE_LAYER:
            raise PrivacyBoundaryError("an AggregateView is built only by the secure-aggregation layer")
        all_sums = {k: MappingProxyType(dict(v)) for k, v in (sums or {}).items()}
        if groups is not None:
            all_sums[DEFAULT_SUM] = MappingProxyType(dict(groups))
        object.__setattr__(self, "round", round)
        object.__setattr__(self, "sums", MappingProxyType(all_sums))
        object.__setattr__(self, "released", MappingProxyType({k: MappingProxyType(dict(v)) for k, v in released.items()}))
        object.__setattr__(self, "contributors", frozenset(contributors))
        object.__setattr__(self, "sum_contributors",
                           MappingProxyType({k: frozenset(v) for k, v in (sum_contributors or {}).items()}))
        object.__setattr__(self, "failed", MappingProxyType(dict(failed or {})))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("AggregateView is immutable")

    @property
    def groups(self) -> Mapping[str, GroupAggregate]:
        return self.sums.get(DEFAULT_SUM, MappingProxyType({}))

    def mean(self, part: str, *, sum: str = DEFAULT_SUM) -> np.ndarray:
        return self.sums[sum][part].mean


def _frozen_arrays(parts: Mapping[str, Any], what: str) -> Mapping[str, np.ndarray]:
    out = {}
    for name, value in parts.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"{what} part names must be non-empty strings, got {name!r}")
        arr = np.array(value, dtype=np.float32, copy=True).ravel()
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{what} part '{name}' is not finite")
        arr.setflags(write=False)
        out[name] = arr
    return MappingProxyType(out)


@dataclass(frozen=True)
class Broadcast:
    """The public part of a round: what the server sends, and to whom.

    `common` goes to every cohort member; `groups[g]` to the members with `group_of[i] == g`;
    `per_client[i]` to client i alone. Arrays are flat float32 (as on the wire). A client receives
    only its own `ClientBroadcast`: nothing addressed to another group or client.
    """

    common: Mapping[str, np.ndarray] = field(default_factory=dict)
    groups: Mapping[str, Mapping[str, np.ndarray]] = field(default_factory=dict)
    group_of: Mapping[int, str] = field(default_factory=dict)
    per_client: Mapping[int, Mapping[str, np.ndarray]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "common", _frozen_arrays(self.common, "broadcast"))
        object.__setattr__(self, "groups", MappingProxyType(
            {str(g): _frozen_arrays(p, f"group '{g}'") for g, p in self.groups.items()}))
        object.__setattr__(self, "per_client", MappingProxyType(
            {int(c): _frozen_arrays(p, f"client {c}") for c, p in self.per_client.items()}))
        object.__setattr__(self, "group_of", MappingProxyType({int(c): str(g) for c, g in self.group_of.items()}))
        unknown = set(self.group_of.values()) - set(self.groups)
        if unknown:
            raise ValueError(f"clients assigned to groups without a broadcast part: {sorted(unknown)}")
        for g, parts in self.groups.items():
            if set(parts) & set(self.common):
                raise ValueError(f"group '{g}' repeats common part names {sorted(set(parts) & set(self.common))}")
        for c, parts in self.per_client.items():
            clash = set(parts) & (set(self.common) | set(self.groups.get(self.group_of.get(c, ""), {})))
            if clash:
                raise ValueError(f"client {c}'s parts repeat common/group part names {sorted(clash)}")

    def for_client(self, client_id: int, *, round: int, inbox: tuple[Relayed, ...] = (),
                   sums: Mapping[str, tuple[str, ...] | None] | None = None,
                   sum_sizes: Mapping[str, int] | None = None) -> "ClientBroadcast":
        group = self.group_of.get(client_id)

        def own_copy(parts: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
            return {k: v.copy() for k, v in parts.items()}  # the client's own (writable) copies

        return ClientBroadcast(round=round, common=own_copy(self.common),
                               group=group, group_parts=own_copy(self.groups[group]) if group is not None else {},
                               own=own_copy(self.per_client.get(client_id, {})), inbox=tuple(inbox),
                               sums=dict(sums or {DEFAULT_SUM: None}), sum_sizes=dict(sum_sizes or {}))


@dataclass(frozen=True)
class ClientBroadcast(Mapping[str, np.ndarray]):
    """What one client receives: common, its group's and its own public parts, plus its relays.

    As a mapping it is the union of the three (names are disjoint by construction), so FedAvg-like
    code reads `broadcast[part]`. `sums` names the secure sums this client is a member of and the
    Masked parts each adds up (None: all of them).
    """

    round: int
    common: Mapping[str, np.ndarray] = field(default_factory=dict)
    group: str | None = None
    group_parts: Mapping[str, np.ndarray] = field(default_factory=dict)
    own: Mapping[str, np.ndarray] = field(default_factory=dict)
    inbox: tuple[Relayed, ...] = ()
    sums: Mapping[str, tuple[str, ...] | None] = field(default_factory=lambda: {DEFAULT_SUM: None})
    sum_sizes: Mapping[str, int] = field(default_factory=dict)
    """How many clients each of `sums` has (what sizes exact noise's layers); a sum not named here is taken
    at the ring's most clients."""

    def _merged(self) -> dict[str, np.ndarray]:
        return {**self.common, **self.group_parts, **self.own}

    def __getitem__(self, name: str) -> np.ndarray:
        for parts in (self.own, self.group_parts, self.common):
            if name in parts:
                return parts[name]
        raise KeyError(name)

    def __iter__(self):
        return iter(self._merged())

    def __len__(self) -> int:
        return len(self._merged())


@dataclass(frozen=True)
class SumSpec:
    """One secure sum of a round: a group of the cohort adding up some of its Masked parts.

    Members not in the cohort, or not ready, are left out; if fewer than `min_size` remain the sum
    is skipped (reported in `AggregateView.failed`), never run with too few to hide anyone.
    `protocol_params` override the run's protocol parameters for this sum (e.g. its threshold).
    """

    name: str
    members: frozenset[int]
    parts: tuple[str, ...] | None = None
    min_size: int = 2
    protocol_params: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or len(self.name) > 64:
            raise ValueError(f"sum names are 1..64 characters without '/', got {self.name!r}")
        object.__setattr__(self, "members", frozenset(int(c) for c in self.members))
        if self.min_size < 2:
            raise ValueError("a secure sum needs at least two members (one member's sum is its input)")
        if self.parts is not None:
            object.__setattr__(self, "parts", tuple(sorted(self.parts)))


MAX_SUMS_PER_ROUND = 60
"""Each sum uses its own transport round id: a round's ids are t * 64 + 1 .. t * 64 + 60."""


@dataclass(frozen=True)
class RoundPlan:
    """What `configure_round` returns: the broadcast and the secure sums (default: one over all)."""

    broadcast: Broadcast
    sums: tuple[SumSpec, ...] | None = None

    def __post_init__(self) -> None:
        if self.sums is not None:
            names = [s.name for s in self.sums]
            if len(set(names)) != len(names):
                raise ValueError(f"sum names repeat: {names}")
            if not 1 <= len(names) <= MAX_SUMS_PER_ROUND:
                raise ValueError(f"a round holds 1..{MAX_SUMS_PER_ROUND} secure sums, got {len(names)}")

    def sums_for(self, cohort: Sequence[int]) -> tuple[SumSpec, ...]:
        if self.sums is None:
            return (SumSpec(name=DEFAULT_SUM, members=frozenset(cohort)),)
        return self.sums

    @classmethod
    def of(cls, plan: "RoundPlan | Mapping[str, np.ndarray]") -> "RoundPlan":
        """Accept a plain mapping (one common broadcast, one sum over all) as a plan."""
        return plan if isinstance(plan, RoundPlan) else cls(broadcast=Broadcast(common=plan))


@dataclass(frozen=True)
class ClientContext:
    """What client_update gets: its id, its private state, its local trainer (data + model), and
    the DP mechanisms the algorithm declared (`Algorithm.releases`) with the client's own ledger."""

    client_id: int
    state: Mapping[str, Any]
    trainer: Any
    round: int
    releases: Mapping[str, Any] = field(default_factory=dict)
    ledger: Any = None
    """The client's own privacy ledger: its record of what it released (the server keeps its own)."""

    def release(self, name: str, **data: Any) -> Any:
        """A DP release of this client's data under the declared mechanism `name`, charged to the
        client's ledger; put it in `Upload.released[name]`. The server re-derives the charge."""
        spec = self.releases.get(name)
        if spec is None:
            raise KeyError(f"no release '{name}' declared by the algorithm (it declares {sorted(self.releases)})")
        if self.ledger is None:
            raise RuntimeError("this client has no ledger to charge a release to")
        return spec.release(client_id=self.client_id, ledger=self.ledger, round_id=self.round, summary_key=name,
                            **data)


ServerState = TypeVar("ServerState")


class Algorithm(ABC, Generic[ServerState]):
    """A federated algorithm: its math only. Privacy plumbing lives in the engine and secure layer.

    Server side: `init_state`, `configure_round`, `server_update`, `client_parameters`. Client side:
    `client_update`, `evaluate`. The engine never calls both sides on the same object.
    """

    name: str = ""
    description: str = ""
    """One line for `python -m fl_algorithms --list`."""
    releases: Mapping[str, Any] = MappingProxyType({})
    """Per-client DP releases this algorithm makes, by upload part name: a `dp.admission.ReleaseSpec`
    each (e.g. a `dp.sketches.DPSketcher`). Clients make them with `ClientContext.release(name, …)`;
    the server admits a part only under its declared mechanism and charges its own ledger."""

    # ---- server side ------------------------------------------------------------------------
    @abstractmethod
    def init_state(self, *, initial: Mapping[str, np.ndarray]) -> ServerState:
        """Server state before round 1, from the initial shared parameters."""

    @abstractmethod
    def configure_round(self, *, round: int, state: ServerState,
                        cohort: Sequence[int] = ()) -> "RoundPlan | Mapping[str, np.ndarray]":
        """The round's plan; a plain mapping means one common broadcast and one sum over all."""

    @abstractmethod
    def server_update(self, *, state: ServerState, view: AggregateView) -> ServerState:
        """New server state from the aggregate view alone."""

    def shared_parameters(self, state: ServerState) -> Mapping[str, np.ndarray]:
        """The global parameters a state represents (for checkpoints and reports)."""
        return RoundPlan.of(self.configure_round(round=0, state=state, cohort=())).broadcast.common

    def client_parameters(self, *, state: ServerState, client_id: int) -> Mapping[str, np.ndarray]:
        """The public parameters client `client_id` evaluates with (default: the global ones)."""
        return self.shared_parameters(state)

    # ---- client side ------------------------------------------------------------------------
    @abstractmethod
    def client_update(self, *, broadcast: ClientBroadcast, client: ClientContext) -> tuple[Upload, Mapping[str, Any]]:
        """Local work; returns the upload and the client's new private state."""

    def evaluate(self, *, parameters: Mapping[str, np.ndarray], client: ClientContext,
                 split: str) -> dict[str, float]:
        """Client-side evaluation of the model this client would use (default: the received
        public parameters loaded into its trainer, with its private parts as they are)."""
        if parameters:
            client.trainer.set_shared(parameters)
        return client.trainer.evaluate(split=split)
