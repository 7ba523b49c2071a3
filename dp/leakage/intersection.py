"""Cross-round intersection attack: attribute tokens recovered from cohort sums to single clients.

Secure aggregation hides who used a token within one round, but the server knows every cohort.
With fixed local data a client's tokens appear in the recovered union R_t whenever it takes part.
For a token tau seen in rounds A_tau = {t : tau in R_t}, and a client i taking part in rounds
P_i = {t : i in C_t}, count over the observed rounds

    hits_i(tau)        = |P_i  ∩ A_tau|     (i present, tau seen)
    misses_i(tau)      = |P_i  \\ A_tau|     (i present, tau not seen: i cannot own tau)
    unexplained_i(tau) = |A_tau \\ P_i|      (tau seen without i: someone else has it too)

Client i is a candidate owner of tau iff hits >= min_hits, misses <= max_misses and
unexplained <= max_unexplained; tau is attributed to i when i is its only candidate. With the
default zero tolerances this is the classic elimination (set-intersection) attack: candidates are
exactly the clients with P_i = A_tau, so a client-unique token is pinned to its owner as soon as
no other client has the same participation history, while clients that always participate
together (fixed disjoint groups, So et al. AAAI 2023) are never separated. The tolerances absorb
detector errors (a missed or spurious token in some round).
Simplified: statistical disclosure attacks that rank candidates by likelihood are not implemented;
unique-candidate attribution gives a conservative count (no guessing).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

_CHUNK = 4096  # tokens per block of the (clients x tokens) count matrices


@dataclass(frozen=True)
class Attribution:
    owner: Mapping[int, int]
    """token -> the single client it is attributed to."""
    candidates: Mapping[int, tuple[int, ...]]
    """token -> every candidate owner (observed tokens only)."""
    rounds: int

    def tokens_of(self, client: int) -> frozenset[int]:
        return frozenset(t for t, c in self.owner.items() if c == client)


@dataclass(frozen=True)
class AttributionScores:
    private_tokens: int
    """Tokens owned by exactly one client (the targets)."""
    attributed: int
    """Tokens the attack attributed to a single client."""
    correct: int
    """Private tokens attributed to their owner."""
    wrong: int
    """Attributions to a client that does not own the token."""
    rate: float
    """correct / private_tokens: the intersection attribution rate."""
    precision: float
    """Attributions to an actual owner / attributions (1.0 when nothing is attributed)."""


def attribute_tokens(round_tokens: Mapping[int, Iterable[int]], cohorts: Mapping[int, Iterable[int]], *,
                     clients: Iterable[int] | None = None, tokens: Iterable[int] | None = None,
                     max_misses: int = 0, max_unexplained: int = 0, min_hits: int = 1) -> Attribution:
    """Attribute recovered tokens to clients from per-round recovered sets and the public cohorts.

    `round_tokens[t]` is the token set recovered from round t's aggregate, `cohorts[t]` the clients
    in that aggregate (its contributors). Only rounds present in both are used. `tokens`
    restricts the attack (e.g. to rare or canary tokens); `clients` adds clients that never took
    part (they can never be candidates with min_hits >= 1).
    """
    if min(max_misses, max_unexplained) < 0 or min_hits < 1:
        raise ValueError("tolerances must be >= 0 and min_hits >= 1")
    rounds = sorted(set(round_tokens) & set(cohorts))
    sets = [frozenset(int(x) for x in round_tokens[t]) for t in rounds]
    members = [frozenset(int(c) for c in cohorts[t]) for t in rounds]
    client_ids = sorted(set().union(*members, (int(c) for c in clients or ())))
    observed = sorted(set().union(*sets)) if sets else []
    if tokens is not None:
        keep = {int(x) for x in tokens}
        observed = [x for x in observed if x in keep]
    if not rounds or not observed or not client_ids:
        return Attribution({}, {}, len(rounds))

    col = {x: j for j, x in enumerate(observed)}
    cidx = {c: j for j, c in enumerate(client_ids)}
    seen = np.zeros((len(rounds), len(observed)), dtype=np.int32)     # A: rounds x tokens
    present = np.zeros((len(rounds), len(client_ids)), dtype=np.int32)  # P: rounds x clients
    for r, (s, m) in enumerate(zip(sets, members)):
        seen[r, [col[x] for x in s if x in col]] = 1
        present[r, [cidx[c] for c in m]] = 1
    participations = present.sum(axis=0)[:, None]  # |P_i|
    appearances = seen.sum(axis=0)                  # |A_tau|

    owner: dict[int, int] = {}
    candidates: dict[int, tuple[int, ...]] = {}
    for lo in range(0, len(observed), _CHUNK):
        block = seen[:, lo: lo + _CHUNK]
        hits = present.T @ block                       # clients x tokens
        misses = participations - hits
        unexplained = appearances[None, lo: lo + _CHUNK] - hits
        ok = (hits >= min_hits) & (misses <= max_misses) & (unexplained <= max_unexplained)
        for j in range(block.shape[1]):
            cands = tuple(client_ids[i] for i in np.flatnonzero(ok[:, j]))
            tok = observed[lo + j]
            candidates[tok] = cands
            if len(cands) == 1:
                owner[tok] = cands[0]
    return Attribution(owner, candidates, len(rounds))


def score_attribution(attribution: Attribution, owners: Mapping[int, Iterable[int]]) -> AttributionScores:
    """Score against the ground truth `owners` (client -> the tokens it used)."""
    holders: dict[int, set[int]] = {}
    for c, toks in owners.items():
        for x in toks:
            holders.setdefault(int(x), set()).add(int(c))
    private = {x: next(iter(h)) for x, h in holders.items() if len(h) == 1}
    correct = sum(1 for x, c in attribution.owner.items() if private.get(x) == c)
    right_owner = sum(1 for x, c in attribution.owner.items() if c in holders.get(x, ()))
    n = len(attribution.owner)
    return AttributionScores(
        private_tokens=len(private), attributed=n, correct=correct, wrong=n - right_owner,
        rate=correct / len(private) if private else 0.0, precision=right_owner / n if n else 1.0)


__all__ = ["Attribution", "AttributionScores", "attribute_tokens", "score_attribution"]
