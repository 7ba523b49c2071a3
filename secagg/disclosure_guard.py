"""Disclosure guard: refuse noise-free group sums that would expose an individual's vector.

Per summary key (one fixed per-client vector x_i, e.g. 'doc-mean/v1'), the released sums are
S = M X with M the 0/1 membership matrix. Any w^T X with w in rowspace(M) is learned exactly, so
client i is exposed iff e_i lies in rowspace(M), i.e. iff its leverage ||P_rowspace e_i||^2 is 1
(research/dp_leakage.md Sec. 3.4). Two sums S(A), S(A + {i}) suffice; random cohorts expose
everyone after about N releases; fixed disjoint groups never expose anyone.

Before a noise-free release the guard projects the new membership row on an orthonormal basis of
the current row space (classical Gram-Schmidt with one re-orthogonalisation, numerically stable
for 0/1 rows), updates the leverages by q_i^2 of the new basis vector, and refuses (DisclosureError
naming the exposed ids) if any leverage would exceed `max_leverage`. A row already in the span adds
nothing and is accepted in O(rank * N), so fixed groups can be released forever. A refused
release leaves the state unchanged.

Near-exposure: with leverage l < 1 the best linear estimate from the releases is
l x_i + (other clients with total weight sqrt(l (1 - l))), e.g. x_i to within ~10% at l = 0.99.
So the default `max_leverage` = 0.99 refuses near-exposures as well; set it to 1 - 1e-8 for the
exact test "e_i in the row space" (random cohorts reach leverages of 0.999 without exact exposure).

A release carrying DP noise (a `dp.released.Released` value, or the ledger charges of its debit)
is recorded and allowed: fresh noise per release makes the per-client accountant the real bound.
If the guard was given the run's ledger it checks the charges are in it. The minimum-cohort rule
(at least `min_cohort` contributors, default 5) applies to noise-free sums, including sums over
anonymous groups whose members the server does not know (`authorize_count`: the per-cluster sums of
a cluster-indexed part, where a cluster of one is one client's exact vector).

The secure layer (`fl_algorithms.engine.secure_sum.SecureAggregator`) puts every sum it decodes
through a guard before server code sees it.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class DisclosureError(PermissionError):
    """A release was refused. `exposed` names the clients it would expose (if any)."""

    def __init__(self, message: str, *, summary_key: str, exposed: Sequence[int] = ()) -> None:
        super().__init__(message)
        self.summary_key = summary_key
        self.exposed = tuple(sorted(exposed))


@dataclass(frozen=True)
class GuardConfig:
    min_cohort: int = 5
    """Fewest contributors of a noise-free sum (smaller groups make each member's share too large)."""
    max_leverage: float = 0.99
    """Refuse if any client's leverage would exceed this (1 - 1e-8: exact exposure only)."""
    span_tol: float = 1e-9
    """A row whose residual norm is below span_tol * ||row|| is in the current row space."""
    max_noisy_epsilon: float = 64.0
    """A release counts as noisy only if one use of each charged mechanism costs at most this epsilon
    (at the delta of the guard's `noise_epsilon`): a 'noisy' sum with negligible noise is refused."""

    def __post_init__(self) -> None:
        if self.min_cohort < 1 or not 0.5 <= self.max_leverage < 1 or not 0 < self.span_tol < 1e-3:
            raise ValueError("invalid guard tolerances or min_cohort")
        if not self.max_noisy_epsilon > 0:
            raise ValueError("max_noisy_epsilon must be positive")


@dataclass
class _KeyState:
    columns: dict[int, int] = field(default_factory=dict)
    basis: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    """rank x capacity; rows are an orthonormal basis of rowspace(M) (columns beyond len(columns) are 0)."""
    leverage: np.ndarray = field(default_factory=lambda: np.zeros(0))
    rank: int = 0
    exact_releases: list[tuple[int, ...]] = field(default_factory=list)
    noisy_releases: list[tuple[int, ...]] = field(default_factory=list)

    def column(self, client: int) -> int:
        col = self.columns.get(client)
        if col is None:
            col = len(self.columns)
            self.columns[client] = col
            if col >= self.leverage.shape[0]:
                cap = max(16, 2 * self.leverage.shape[0])
                self.basis = np.pad(self.basis, ((0, 0), (0, cap - self.basis.shape[1])))
                self.leverage = np.pad(self.leverage, (0, cap - self.leverage.shape[0]))
        return col


@dataclass(frozen=True)
class Decision:
    summary_key: str
    members: tuple[int, ...]
    noisy: bool
    rank: int
    """Rank of the noise-free membership matrix after this release."""
    max_leverage: float


class DisclosureGuard:
    """Keeps the membership matrix of every release of a run, per summary key."""

    def __init__(self, config: GuardConfig = GuardConfig(), *, ledger: Any = None,
                 noise_epsilon: Callable[[Any], float] | None = None) -> None:
        """`noise_epsilon(charge)`: the epsilon one use of a charge's mechanism costs (the engine passes
        the ledger's accountant; secagg does not know dp/). With it, a noisy release whose noise is
        weaker than `max_noisy_epsilon` allows is refused, whatever it was charged."""
        self.config = config
        self.ledger = ledger
        self.noise_epsilon = noise_epsilon
        self._keys: dict[str, _KeyState] = {}
        self._forgotten: set[str] = set()
        """Keys whose history was dropped: no noise-free sum is released under them again."""

    # ---- the check ------------------------------------------------------------------------
    def authorize(self, summary_key: str, members: Iterable[int], *, noise: Any = None) -> Decision:
        """Record a release of the sum over `members`, or raise DisclosureError (state unchanged)."""
        return self._decide(summary_key, members, noise=noise, record=True)

    def check(self, summary_key: str, members: Iterable[int], *, noise: Any = None) -> Decision:
        """Like `authorize` without recording (a dry run)."""
        return self._decide(summary_key, members, noise=noise, record=False)

    def authorize_count(self, summary_key: str, count: int, *, noisy: bool = False) -> None:
        """A noise-free sum over an anonymous group of `count` clients (members unknown to the server,
        e.g. one cluster of a cluster-indexed sum): refused below `min_cohort`. Only the size rule
        applies (no membership to track); an empty group (count 0) releases nothing and passes."""
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
            raise ValueError(f"a group size is a non-negative int, got {count!r}")
        if not noisy and 0 < count < self.config.min_cohort:
            raise DisclosureError(f"'{summary_key}': a noise-free sum of {count} client(s) is below the "
                                  f"minimum cohort {self.config.min_cohort} (min_cohort rule)", summary_key=summary_key)

    def forget(self, summary_keys: Iterable[str]) -> None:
        """Drop the history of these keys (their vectors will never be released again, e.g. a
        past round's model update). A later noise-free sum under a forgotten key is refused: without
        its history the guard could not see it difference an earlier one (S(A), then S(A + {i})
        exposes x_i). The forgotten names are kept for the life of this guard, not in `state_dict`."""
        for key in summary_keys:
            self._keys.pop(key, None)
            self._forgotten.add(key)

    def _decide(self, summary_key: str, members: Iterable[int], *, noise: Any, record: bool) -> Decision:
        ids = tuple(sorted({_client_id(m) for m in members}))
        if not ids:
            raise ValueError("a release needs at least one member")
        state = self._keys.get(summary_key) or _KeyState()
        if noise is not None:
            self._check_noise(summary_key, ids, noise)
            if record:
                self._keys[summary_key] = state
                state.noisy_releases.append(ids)
            return Decision(summary_key, ids, True, state.rank, self._max_leverage(state))
        if summary_key in self._forgotten:
            raise DisclosureError(f"'{summary_key}' was forgotten: its vectors are never released again noise-free "
                                  "(a new sum under it could difference a forgotten one)", summary_key=summary_key)
        if len(ids) < self.config.min_cohort:
            raise DisclosureError(f"'{summary_key}': a noise-free sum of {len(ids)} client(s) is below the "
                                  f"minimum cohort {self.config.min_cohort} (min_cohort rule)", summary_key=summary_key,
                                  exposed=ids if len(ids) == 1 else ())
        new = [c for c in ids if c not in state.columns]
        width = len(state.columns) + len(new)
        basis = state.basis[: state.rank, :width] if state.basis.shape[1] >= width else \
            np.pad(state.basis[: state.rank], ((0, 0), (0, width - state.basis.shape[1])))
        cols = np.array([state.columns.get(c, -1) for c in ids])
        cols[cols < 0] = np.arange(len(state.columns), width)
        row = np.zeros(width)
        row[cols] = 1.0
        residual = row - basis.T @ (basis @ row)
        residual -= basis.T @ (basis @ residual)  # re-orthogonalise (CGS2)
        norm = float(np.linalg.norm(residual))
        in_span = norm <= self.config.span_tol * np.sqrt(len(ids))
        lev = np.zeros(width)
        lev[: len(state.columns)] = state.leverage[: len(state.columns)]
        if not in_span:
            q = residual / norm
            lev = lev + q * q
            exposed_cols = np.flatnonzero(lev > self.config.max_leverage)
            if exposed_cols.size:
                inverse = {col: c for c, col in state.columns.items()}
                inverse.update({len(state.columns) + i: c for i, c in enumerate(new)})
                exposed = sorted(inverse[int(col)] for col in exposed_cols)
                raise DisclosureError(
                    f"'{summary_key}': releasing the noise-free sum over {len(ids)} clients would expose the "
                    f"individual vectors of clients {exposed} (leverage above {self.config.max_leverage}: e_i in, or "
                    "within reach of, the row space of the release history); "
                    "add DP noise, or release fixed disjoint groups", summary_key=summary_key, exposed=exposed)
        if record:
            self._keys[summary_key] = state
            for c in new:
                state.column(c)
            if not in_span:
                if state.rank == state.basis.shape[0]:
                    state.basis = np.pad(state.basis, ((0, max(8, state.rank)), (0, 0)))
                state.basis[state.rank, :width] = q
                state.rank += 1
                state.leverage[:width] = lev
            state.exact_releases.append(ids)
        return Decision(summary_key, ids, False, state.rank + (0 if in_span or record else 1), float(lev.max()))

    def _check_noise(self, summary_key: str, ids: tuple[int, ...], noise: Any) -> None:
        charges = tuple(getattr(noise, "charges", noise))
        if not charges or not all(hasattr(c, "client_id") for c in charges):
            raise TypeError("noise must be a Released value or a sequence of ledger Charges")
        uncharged = set(ids) - {c.client_id for c in charges}
        if uncharged:
            raise DisclosureError(f"'{summary_key}': DP noise was not charged to clients {sorted(uncharged)}",
                                  summary_key=summary_key)
        if self.ledger is not None and not all(self.ledger.holds(c) for c in charges):
            raise DisclosureError(f"'{summary_key}': the release's charges are not in this run's ledger",
                                  summary_key=summary_key)
        if self.noise_epsilon is not None:
            worst = max(self.noise_epsilon(c) for c in charges)
            if not worst <= self.config.max_noisy_epsilon:
                raise DisclosureError(f"'{summary_key}': its noise costs epsilon {worst:.3g} per release, above "
                                      f"max_noisy_epsilon={self.config.max_noisy_epsilon}: too little to count "
                                      "as a noisy release", summary_key=summary_key)

    # ---- diagnostics ----------------------------------------------------------------------
    @staticmethod
    def _max_leverage(state: _KeyState) -> float:
        n = len(state.columns)
        return float(state.leverage[:n].max()) if n else 0.0

    def rank(self, summary_key: str) -> int:
        state = self._keys.get(summary_key)
        return state.rank if state else 0

    def leverage(self, summary_key: str) -> dict[int, float]:
        """||P_rowspace e_i||^2 per client: 1 = exposed, 0 = nothing learned about i alone."""
        state = self._keys.get(summary_key)
        if not state:
            return {}
        return {c: float(state.leverage[col]) for c, col in state.columns.items()}

    def exposed_fraction(self, summary_key: str, *, threshold: float = 1 - 1e-8) -> float:
        """Fraction of clients whose leverage is at least `threshold` (leakage report metric)."""
        lev = self.leverage(summary_key)
        return sum(v >= threshold for v in lev.values()) / len(lev) if lev else 0.0

    def releases(self, summary_key: str) -> dict[str, list[tuple[int, ...]]]:
        state = self._keys.get(summary_key)
        if not state:
            return {"exact": [], "noisy": []}
        return {"exact": list(state.exact_releases), "noisy": list(state.noisy_releases)}

    def keys(self) -> list[str]:
        """Summary keys with a recorded history."""
        return sorted(self._keys)

    def state_dict(self, *, keys: Iterable[str] | None = None) -> dict[str, Any]:
        """The release history (membership lists) of `keys` (default all); the basis is rebuilt on load."""
        chosen = self._keys if keys is None else {k: self._keys[k] for k in keys if k in self._keys}
        return {"format": "fedsecure-nlp/disclosure-guard/v1",
                "keys": {k: {"exact": [list(r) for r in s.exact_releases], "noisy": [list(r) for r in s.noisy_releases]}
                         for k, s in chosen.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("format") != "fedsecure-nlp/disclosure-guard/v1":
            raise ValueError("not a disclosure-guard state")
        self._keys = {}
        for key, hist in state["keys"].items():
            for members in hist["exact"]:
                self._decide(key, members, noise=None, record=True)
            s = self._keys.setdefault(key, _KeyState())
            s.noisy_releases.extend(tuple(int(c) for c in r) for r in hist["noisy"])


def _client_id(c: Any) -> int:
    if isinstance(c, bool) or not isinstance(c, (int, np.integer)):
        raise TypeError("client ids are ints")
    return int(c)
