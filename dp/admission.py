"""Admitting a client's own DP release on the server: check the mechanism, charge the server's ledger.

A client that releases a value itself (a DP sketch, for clustering or neighbour search) draws the
noise on its own machine and keeps its own receipts. What reaches the server is a plain
`ReleaseRecord`: payload plus the mechanism the client claims. `admit` checks that claim against
the mechanism the run declared for that part (`spec.verify`: same parameters, noise recomputed from
public metadata), debits the server's ledger with the charges it derives itself, and only then
mints the `Released` that server code may read.

Threat model: an honest-but-curious server that runs this code; clients that draw their own noise
(a client that claims noise it did not add harms only its own privacy). A record that fails the
check is refused before any server code uses it: its charge cannot be derived, so it is not on the
ledger, and the engine drops the value. An admitted release is charged even past a budget
(`enforce_budget=False`): the value has already been received, so the ledger must show it; budgets
are enforced where the noise is drawn, by the client's own ledger.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from dp import _mint
from dp.ledger import Ledger, Mechanism, Observer
from dp.released import Released, ReleaseRecord


class ReleaseRejected(ValueError):
    """A client's release does not match what the run declared; nothing was charged or used."""


class ReleaseSpec(Protocol):
    """A per-client DP mechanism a run declares (e.g. `dp.sketches.DPSketcher`)."""

    def release(self, *, client_id: int, ledger: Ledger, round_id: int | None, summary_key: str,
                **data) -> Released: ...

    def verify(self, record: ReleaseRecord) -> Mapping[Observer, Mechanism]: ...

    def describe(self) -> Mapping[str, object]: ...


def admit(records: Mapping[str, ReleaseRecord], *, specs: Mapping[str, ReleaseSpec], client_id: int,
          round_id: int, ledger: Ledger) -> dict[str, Released]:
    """The server's Released for each of one client's records (by part name), charged to `ledger`.

    Every record is checked before any is charged: ReleaseRejected (nothing charged, nothing
    returned) if a part is not declared in `specs`, is not a release of that part for round
    `round_id`, or does not match its declared mechanism.
    """
    undeclared = sorted(set(records) - set(specs))
    if undeclared:
        raise ReleaseRejected(f"client {client_id} sent releases {undeclared}; the run declares {sorted(specs)}")
    checked = {}
    for name, record in sorted(records.items()):
        if not isinstance(record, ReleaseRecord):
            raise ReleaseRejected(f"release '{name}' is a {type(record).__name__}, not a ReleaseRecord")
        if record.round_id != round_id or record.summary_key != name:
            raise ReleaseRejected(f"client {client_id} sent a release of '{record.summary_key}' for round "
                                  f"{record.round_id} as '{name}', expected '{name}' for round {round_id}")
        try:
            checked[name] = specs[name].verify(record)
        except ValueError as exc:
            raise ReleaseRejected(f"client {client_id}'s release '{name}': {exc}") from None
    out = {}
    for name, charges in checked.items():
        record = records[name]
        receipts = tuple(ledger.debit(client_id, mech, unit=record.unit, observer=Observer(obs), round_id=round_id,
                                      summary_key=name, enforce_budget=False)
                         for obs, mech in charges.items())
        out[name] = Released(payload=record.payload, unit=record.unit, contributors=frozenset({int(client_id)}),
                             summary_key=name, mechanism=dict(record.mechanism), charges=receipts,
                             round_id=round_id, _capability=_mint.MINT)
    return out
