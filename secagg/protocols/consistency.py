"""What every secure-sum protocol checks before it reveals anything that unmasks a sum.

Threat model these checks serve: a server that is honest-but-curious in its computation but may
drop or delay any message (so it chooses who "drops"), colluding with up to `colluders` enrolled
clients, against which no sum over fewer than `min_group` honest clients may be opened.

* `Floors`: the announced (colluders c, group minimum g) of a round, checked by each client against
  its own policy, and the counts they imply: a round needs at least g + c survivors (so at least g
  of them are honest), and each client needs at least c + 1 live masking partners (so at least one
  of them is honest: a client masked only with colluders and clients whose keys the server rebuilds
  is exposed by its own self-mask seed).
* The consistency check of Bonawitz et al. (CCS 2017, Sec. 4, malicious-server variant): after the
  masked inputs, the server announces the survivor set; every survivor signs it with its enrolled
  Ed25519 key, and a client reveals its unmasking shares (or its aggregate coded piece) only after
  checking enough valid signatures over the SAME set. An honest client signs one set per round, so
  a server cannot show different clients different survivor sets (and so collect both a client's
  self-mask seed and its masking key) unless it holds the needed signatures from colluders.
  Without enrolment (no identity) the signatures are empty and clients trust the server's
  announcement, as they trust its relay of round keys.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from secagg import crypto
from secagg.identity import Identity, Roster
from secagg.messages import ProtocolError


@dataclass(frozen=True)
class Floors:
    """A round's announced threat parameters."""

    colluders: int = 0
    """c: colluding clients the round must withstand (below the protocol's threshold)."""
    min_group: int = 1
    """g: fewest honest clients whose sum may be opened."""

    def __post_init__(self) -> None:
        for name in ("colluders", "min_group"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"{name} must be an int, got {v!r}")
        if self.colluders < 0 or self.min_group < 1:
            raise ValueError(f"need colluders >= 0 and min_group >= 1, got {self.colluders}, {self.min_group}")

    @property
    def survivors(self) -> int:
        """Fewest survivors a sum may be opened with: g honest ones besides c colluders."""
        return self.min_group + self.colluders

    @property
    def partners(self) -> int:
        """Fewest live masking partners a client needs: one more than the colluders."""
        return self.colluders + 1

    def check_policy(self, *, min_colluders: int, min_group: int) -> None:
        """A client refuses a round announcing a weaker guarantee than its own policy asks."""
        if self.colluders < min_colluders or self.min_group < min_group:
            raise ProtocolError(f"round tolerates {self.colluders} colluders with groups of {self.min_group}; "
                                f"this client requires at least {min_colluders} and {min_group}")


def survivor_statement(protocol: str, round_id: int, survivors: Iterable[int]) -> bytes:
    """What a survivor signs: the protocol family, the round and the sorted survivor set."""
    return crypto.context(protocol, "survivors", round_id, *sorted(survivors))


def sign_survivors(identity: Identity | None, protocol: str, round_id: int, survivors: Iterable[int]) -> bytes:
    """This client's signature over the survivor set (empty without enrolment)."""
    if identity is None:
        return b""
    return identity.signing_key.sign(survivor_statement(protocol, round_id, survivors))


def require_signatures(identity: Identity | None, *, protocol: str, round_id: int, survivors: tuple[int, ...],
                       signatures: Mapping[int, bytes], eligible: Iterable[int], needed: int) -> None:
    """Raise ProtocolError unless at least `needed` clients of `eligible` (this client included, its
    own signature counted) signed exactly `survivors`. A no-op without enrolment."""
    if identity is None:
        return
    statement = survivor_statement(protocol, round_id, survivors)
    roster: Roster = identity.roster
    valid = {identity.client_id}
    for c in set(eligible) - valid:
        sig = signatures.get(c)
        if sig is not None and roster.verify(c, sig, statement):
            valid.add(c)
    if len(valid) < needed:
        raise ProtocolError(f"only {len(valid)} valid signatures over the announced survivor set, {needed} needed: "
                            "the server may be showing different clients different survivor sets")
