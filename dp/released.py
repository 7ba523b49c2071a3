"""`Released`: one noisy per-client (or per-group) value, charged to the privacy ledger.

This is the only form in which a per-client value may cross the privacy boundary (docs/ARCHITECTURE.md).
Only DP mechanisms in `dp` hold the module-private capability that `Released.__init__` checks;
any other construction, `dataclasses.replace`, pickling or mutation raises. (Python cannot stop
code that deliberately reaches into `dp._mint` or calls object.__new__: this is a type boundary
that makes accidents impossible and abuse conspicuous, not a sandbox.)
"""
from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from dataclasses import InitVar, dataclass, field
from typing import Any

import numpy as np

from dp import _mint
from dp.ledger import Charge, PrivacyUnit


class ReleaseForbidden(PermissionError):
    """Raised when code outside the DP mechanisms tries to make a Released value."""


MAX_RELEASE_VALUES = 1 << 20
"""Largest per-client release a server admits (values); a sketch is tens to hundreds."""
MAX_MECHANISM_KEYS = 32


@dataclass(frozen=True)
class ReleaseRecord:
    """A Released value as it travels from a client to the server: plain data, no ledger receipts.

    Anyone may build one: it proves nothing. The server turns it back into a `Released` only
    through `dp.admission.admit`, which checks the mechanism against the one the run declared and
    charges the server's own ledger (the client's receipts are for the client's ledger only).
    """

    payload: np.ndarray
    unit: PrivacyUnit
    summary_key: str
    mechanism: Mapping[str, Any]
    round_id: int | None

    def __post_init__(self) -> None:
        payload = self.payload
        if (not isinstance(payload, np.ndarray) or payload.dtype != np.float64 or payload.ndim != 1
                or not 1 <= payload.shape[0] <= MAX_RELEASE_VALUES or not np.all(np.isfinite(payload))):
            raise ValueError(f"a release payload is a finite 1-D float64 array of 1..{MAX_RELEASE_VALUES} values")
        payload = payload.copy()
        payload.setflags(write=False)
        object.__setattr__(self, "payload", payload)
        object.__setattr__(self, "unit", PrivacyUnit(self.unit))
        if type(self.summary_key) is not str or not 0 < len(self.summary_key) <= 128:
            raise ValueError("a release's summary key is a string of 1..128 characters")
        mech = self.mechanism
        if (not isinstance(mech, Mapping) or len(mech) > MAX_MECHANISM_KEYS
                or not all(type(k) is str and len(k) <= 64 for k in mech)
                or not all(v is None or type(v) in (str, int, float, bool) for v in mech.values())
                or any(type(v) is str and len(v) > 256 for v in mech.values())):
            raise ValueError(f"a release's mechanism is a flat mapping of at most {MAX_MECHANISM_KEYS} "
                             f"short names to numbers, strings, booleans or None")
        object.__setattr__(self, "mechanism", MappingProxyType(dict(mech)))
        if self.round_id is not None and (type(self.round_id) is not int or self.round_id < 0):
            raise ValueError("a release's round is a non-negative int or None")


@dataclass(frozen=True, eq=False)
class Released:
    payload: np.ndarray
    """Read-only float64 copy of the noisy value."""
    unit: PrivacyUnit
    """The privacy unit the noise protects ('example' or 'client')."""
    contributors: frozenset[int]
    """Whose data the value depends on (one id for a per-client release)."""
    summary_key: str
    """What was summarised, with its version (e.g. 'doc-embedding-mean/v1/round-3')."""
    mechanism: Mapping[str, Any]
    """Mechanism description: name, noise scale, sensitivity, epsilon, delta."""
    charges: tuple[Charge, ...] = field(default=())
    """Ledger receipts of the debits made for this release."""
    round_id: int | None = None
    _capability: InitVar[object] = None

    def __post_init__(self, _capability: object) -> None:
        if _capability is not _mint.MINT:
            raise ReleaseForbidden("Released values are constructed only by the DP mechanisms in dp/")
        payload = np.array(self.payload, dtype=np.float64, copy=True)
        payload.setflags(write=False)
        object.__setattr__(self, "payload", payload)
        object.__setattr__(self, "unit", PrivacyUnit(self.unit))
        object.__setattr__(self, "contributors", frozenset(int(c) for c in self.contributors))
        object.__setattr__(self, "mechanism", MappingProxyType(dict(self.mechanism)))
        object.__setattr__(self, "charges", tuple(self.charges))
        if not self.contributors:
            raise ValueError("a release must name its contributors")
        if not self.charges:
            raise ValueError("a release must carry its ledger charges")
        uncharged = self.contributors - {c.client_id for c in self.charges}
        if uncharged:
            raise ValueError(f"contributors {sorted(uncharged)} were not charged")

    def __reduce__(self):
        raise TypeError("Released values are not picklable: serialise payload and metadata explicitly")

    def __copy__(self) -> "Released":
        return self

    def __deepcopy__(self, memo) -> "Released":
        return self

    def charged_clients(self) -> frozenset[int]:
        return frozenset(c.client_id for c in self.charges)

    def record(self) -> ReleaseRecord:
        """What the client sends: the payload and mechanism, without its own ledger receipts."""
        return ReleaseRecord(payload=np.array(self.payload), unit=self.unit, summary_key=self.summary_key,
                             mechanism=dict(self.mechanism), round_id=self.round_id)

    def describe(self) -> dict[str, Any]:
        """JSON-able metadata (no payload)."""
        return {"unit": self.unit.value, "contributors": sorted(self.contributors),
                "summary_key": self.summary_key, "mechanism": dict(self.mechanism),
                "round_id": self.round_id, "shape": list(self.payload.shape)}

