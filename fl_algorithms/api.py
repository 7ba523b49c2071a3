"""The one interface every federated algorithm implements, and the privacy boundary it runs behind.

A round has three steps:

    broadcast            = algorithm.configure_round(round=t, state=server_state)
    upload, client_state = algorithm.client_update(broadcast=..., client=ClientContext(...))
    server_state         = algorithm.server_update(state=server_state, view=AggregateView(...))

A client's `Upload` leaves the client only in the three permitted forms (DESIGN.md):
`Masked` parts go through secure aggregation, `Released` parts are DP outputs charged to a ledger
(constructed only by `dp`), and `Sealed` parts are ciphertexts for named peers. Server code never
sees an Upload: it receives an `AggregateView`, which only the secure-aggregation layer can build,
holding group means, total weights and Released values.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
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

    __slots__ = ("_vector", "weight", "clip")

    def __init__(self, vector: np.ndarray, *, weight: float, clip: float | None = None) -> None:
        v = np.ascontiguousarray(vector, dtype=np.float64).ravel()
        if not np.all(np.isfinite(v)):
            raise ValueError("masked vector contains NaN or infinity")
        if not weight > 0:
            raise ValueError("aggregation weight must be positive")
        object.__setattr__(self, "_vector", v)
        object.__setattr__(self, "weight", float(weight))
        object.__setattr__(self, "clip", clip)

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
    """Ciphertext addressed to one peer client; the server relays it without reading it."""

    receiver: int
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


class AggregateView:
    """Everything server-side algorithm code may see about a round. Built by the secure layer only."""

    __slots__ = ("round", "groups", "released", "contributors")

    def __init__(self, *, round: int, groups: Mapping[str, GroupAggregate], released: Mapping[str, Mapping[int, Any]],
                 contributors: frozenset[int], capability: object) -> None:
        if capability is not _SECURE_LAYER:
            raise PrivacyBoundaryError("an AggregateView is built only by the secure-aggregation layer")
        object.__setattr__(self, "round", round)
        object.__setattr__(self, "groups", MappingProxyType(dict(groups)))
        object.__setattr__(self, "released", MappingProxyType({k: MappingProxyType(dict(v)) for k, v in released.items()}))
        object.__setattr__(self, "contributors", frozenset(contributors))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("AggregateView is immutable")

    def mean(self, part: str) -> np.ndarray:
        return self.groups[part].mean


@dataclass(frozen=True)
class ClientContext:
    """What client_update gets: its id, its private state, and its local trainer (data + model)."""

    client_id: int
    state: Mapping[str, Any]
    trainer: Any
    round: int


ServerState = TypeVar("ServerState")


class Algorithm(ABC, Generic[ServerState]):
    """A federated algorithm: its math only. Privacy plumbing lives in the runner and secure layer."""

    name: str = ""

    @abstractmethod
    def init_state(self, *, initial: Mapping[str, np.ndarray]) -> ServerState:
        """Server state before round 1, from the initial shared parameters."""

    @abstractmethod
    def configure_round(self, *, round: int, state: ServerState) -> Mapping[str, np.ndarray]:
        """The broadcast: public arrays every sampled client receives."""

    @abstractmethod
    def client_update(self, *, broadcast: Mapping[str, np.ndarray], client: ClientContext) -> tuple[Upload, Mapping[str, Any]]:
        """Local work; returns the upload and the client's new private state."""

    @abstractmethod
    def server_update(self, *, state: ServerState, view: AggregateView) -> ServerState:
        """New server state from the aggregate view alone."""

    def shared_parameters(self, state: ServerState) -> Mapping[str, np.ndarray]:
        """The global parameters a state represents (for evaluation and checkpoints)."""
        return self.configure_round(round=0, state=state)
