"""Colluding insiders for the attack campaign (`benchmarks/attack_campaign.py`): what the coalition
sees, how it plans, and how a finished round is scored against it.

Threat model (the protocols' own): a server honest-but-curious in its computation that may drop or
withhold any message, colluding with c enrolled clients (the campaign's insiders, c declared to the
server with `colluders`), against which no input and no sum over fewer than g honest clients may be
opened. The coalition's view is the server's (what it sent each client: the round's graph, whom each
client masks with) plus the insiders' secrets. Pieces:

- `ServerView`: that record, filled by `Observed` wrappers around the honest clients and by the
  insiders' `observe` hook, with the honest clients' reply times (`honest_stage_seconds`).
- `settle`: the server's rule for accusations replayed on the round's graph (both ends of a maximal
  matching dropped, `base.accusation_matching`; then clients short of live partners; then the
  survivor minimum and SecAgg+'s ring check, here by brute force over every coalition of at most c
  survivors), with what the coalition would learn if the round opened (`Settlement.exposed`).
- `Planners`: accusation maps for the insiders. `classic`: SecAgg+ insiders accuse the honest
  partners of a victim next to them, hoping it is left masked only with colluders; SecAgg and
  LightSecAgg insiders each accuse a different honest client (c colluders leaving one victim).
  `search`: every assignment of 0-2 accusations per insider over the honest clients it may accuse
  (where those are over `MAX_MAPS`, the maps of one accusation per insider, all different: every
  other map settles as one of these), scored by `settle`: a victim exposed first, then the most
  honest seats lost from a round that still opens.
- `recovered_inputs`: honest contributors whose input the coalition can compute from a finished
  round: a contributor whose live masking partners are all colluders, every honest contributor of
  a LightSecAgg round with fewer than g of them, and, directly, a lone honest contributor (the
  opened sum minus the colluders' known inputs is its input).
- `withholding_server`: a server protocol that withholds (treats as dropped) the masked inputs of a
  victim's honest partners, optionally skipping its own openability checks, to play a server that
  chooses the dropouts.
- `round_time_bound`: what a finished round may take when an insider stalls.
"""
from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from secagg.graph import is_connected
from secagg.messages import Message, ProtocolError
from secagg.protocols.base import WrappedClient, accusation_matching
from secagg.ring import Ring
from transport.server import StallPolicy

REQUEST_STAGE = {
    "advertise_request": "advertise", "share_request": "share", "check_request": "check",
    "masked_request": "masked", "consistency_request": "consistency", "unmask_request": "unmask",
    "lsa_setup": "advertise", "lsa_keys": "share", "lsa_more_pieces": "share", "lsa_relay": "check",
    "lsa_input_request": "masked_input",
    "lsa_survivors": "consistency", "lsa_recover": "recovery",
}
"""Request kind -> the server's stage that sends it (SecAgg, SecAgg+, LightSecAgg)."""
MAX_MAPS = 5_000
"""Most accusation maps `Planners.search` scores in one round: its members must answer the stage within
its grace (a second at least), or be dropped as stragglers before their accusations count."""


# ---- the round's threat parameters, read from the server protocol -------------------------------

@dataclass(frozen=True)
class Threat:
    """What a round's server enforces, read from a server protocol instance."""

    colluders: int
    group: int
    survivors: int
    """Fewest survivors the round is opened with."""
    partners: int | None
    """Live masking partners each client needs (SecAgg, SecAgg+); None for LightSecAgg."""
    sparse: bool
    """SecAgg+ on a sparse ring: the server also refuses survivor sets c colluders could cut."""

    @classmethod
    def of(cls, server: object) -> Threat:
        floors = server.floors
        if hasattr(server, "min_survivors"):  # LightSecAgg
            return cls(colluders=floors.colluders, group=floors.min_group, survivors=server.min_survivors,
                       partners=None, sparse=False)
        return cls(colluders=floors.colluders, group=floors.min_group, survivors=server.min_clients,
                   partners=server.partners, sparse=not server.complete)


# ---- the server's view ------------------------------------------------------------------------

class ServerView:
    """Per round, the requests the server sent each client, and each honest client's request and reply
    times (time.monotonic(), taken in this process). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict[int, dict[int, dict[str, Message]]] = {}
        self._times: dict[int, dict[str, list[tuple[float, float]]]] = {}

    def observe(self, client: int, msg: Message) -> None:
        with self._lock:
            self._requests.setdefault(msg.round, {}).setdefault(client, {})[msg.kind] = msg

    def replied(self, msg: Message, received: float, sent: float) -> None:
        """An honest client answered `msg` (received at `received`, reply handed over at `sent`)."""
        with self._lock:
            self._times.setdefault(msg.round, {}).setdefault(msg.kind, []).append((received, sent))

    def requests(self, round_id: int, kind: str) -> dict[int, Message]:
        with self._lock:
            return {c: k[kind] for c, k in self._requests.get(round_id, {}).items() if kind in k}

    def started(self, round_id: int) -> frozenset[int]:
        """Clients the server asked in the round's first stage."""
        return frozenset(self.requests(round_id, "advertise_request")) | frozenset(self.requests(round_id, "lsa_setup"))

    def graph(self, round_id: int) -> dict[int, frozenset[int]]:
        """The round's masking graph: SecAgg's `neighbours`, or complete over LightSecAgg's roster."""
        out = {c: frozenset(m["neighbours"]) for c, m in self.requests(round_id, "advertise_request").items()}
        for c, m in self.requests(round_id, "lsa_setup").items():
            out[c] = frozenset(m["roster"]) - {c}
        return out

    def mask_with(self, round_id: int) -> dict[int, frozenset[int]]:
        """Whom the server told each client to mask with (SecAgg, SecAgg+)."""
        return {c: frozenset(m["mask_with"]) for c, m in self.requests(round_id, "masked_request").items()}

    def honest_stage_seconds(self, round_id: int, *, waited: Iterable[str] = ()) -> dict[str, float]:
        """Per stage (the server's name for it), the honest clients' part of the round: until the last
        honest reply, from the last honest reply of the stage before (so the server's relaying and
        the transport count as honest time) or, for the first stage and after a stage in `waited`
        (one that held on for a silent client), from the first honest client receiving the request."""
        with self._lock:
            times = {REQUEST_STAGE.get(k, k): list(v) for k, v in self._times.get(round_id, {}).items() if v}
        waited = set(waited)
        out, previous = {}, None
        for stage, v in sorted(times.items(), key=lambda kv: min(t for t, _ in kv[1])):
            last = max(t for _, t in v)
            start = min(t for t, _ in v)
            if previous is not None and previous[0] not in waited:
                start = min(start, previous[1])
            out[stage] = last - start
            previous = (stage, last)
        return out


class Observed(WrappedClient):
    """An honest client protocol whose requests (and reply times) go into a `ServerView`."""

    def __init__(self, inner, *, client_id: int, view: ServerView) -> None:
        super().__init__(inner)
        self.client_id, self.view = client_id, view

    def handle(self, msg: Message) -> Message | None:
        self.view.observe(self.client_id, msg)
        received = time.monotonic()
        reply = self.inner.handle(msg)
        if reply is not None:
            self.view.replied(msg, received, time.monotonic())
        return reply


# ---- the server's rule for accusations, replayed ---------------------------------------------------

@dataclass(frozen=True)
class Settlement:
    """What the server makes of a round's accusations (if every kept client then sends its input)."""

    disputed: frozenset[int]
    """Both ends of the matched accusations."""
    kept: frozenset[int]
    """Clients asked for their (masked) input."""
    opens: bool
    """Whether the server unmasks the sum of `kept`."""
    why: str
    exposed: frozenset[int]
    """Honest kept clients whose input the coalition computes if the round opens."""
    honest_lost: int
    """Honest clients of `alive` not in `kept`."""
    colluders_lost: int


def components(graph: Mapping[int, frozenset[int]], nodes: Iterable[int]) -> list[frozenset[int]]:
    """Connected components of the subgraph induced on `nodes`."""
    left, out = set(nodes), []
    while left:
        stack, comp = [left.pop()], set()
        while stack:
            u = stack.pop()
            comp.add(u)
            for v in graph.get(u, frozenset()) & left:
                left.discard(v)
                stack.append(v)
        out.append(frozenset(comp))
    return out


def isolable(graph: Mapping[int, frozenset[int]], survivors: frozenset[int], *, colluders: int, group: int) -> bool:
    """Whether some coalition of at most `colluders` survivors leaves a component of 1..group-1 honest
    survivors in the masking graph (brute force: what `graph.smallest_isolable_group` decides on the ring)."""
    order = sorted(survivors)
    for k in range(colluders + 1):
        for coalition in itertools.combinations(order, k):
            if any(1 <= len(comp) < group for comp in components(graph, survivors - set(coalition))):
                return True
    return False


def exposed(*, contributors: frozenset[int], colluders: frozenset[int],
            mask_with: Mapping[int, frozenset[int]] | None, group: int) -> frozenset[int]:
    """Honest contributors whose input the coalition computes: (SecAgg, `mask_with` given) those whose
    live masking partners are all colluders; (LightSecAgg) all of them when fewer than `group`."""
    honest = contributors - colluders
    if mask_with is None:
        return honest if len(honest) < group else frozenset()
    return frozenset(c for c in honest if not (mask_with.get(c, frozenset()) & contributors) - colluders)


def settle(*, graph: Mapping[int, frozenset[int]], alive: Iterable[int], accusations: Mapping[int, Iterable[int]],
           colluders: frozenset[int], threat: Threat) -> Settlement:
    """The server's rule replayed: both ends of a maximal matching of the accusations dropped; then
    (SecAgg) clients short of `threat.partners` live neighbours, repeatedly; then the survivor minimum,
    and for SecAgg+ connectivity and the ring check, before anything is unmasked."""
    alive = frozenset(alive)
    drop, _ = accusation_matching({a: frozenset(us) for a, us in accusations.items() if a in alive})
    kept = set(alive) - drop.keys()
    if threat.partners is not None:
        while True:
            weak = {c for c in kept if len(graph[c] & kept) < threat.partners}
            if not weak:
                break
            kept -= weak
    kept = frozenset(kept)
    why, opens = "opens", True
    if len(kept) < threat.survivors:
        why, opens = f"{len(kept)} survivors, {threat.survivors} required", False
    elif threat.partners is not None and not all(len(graph[c] & kept) >= threat.partners for c in kept):
        why, opens = "a survivor short of live partners", False
    elif threat.sparse and not is_connected(graph, kept):
        why, opens = "survivors' masking graph disconnected", False
    elif threat.sparse and isolable(graph, kept, colluders=threat.colluders, group=threat.group):
        why, opens = f"{threat.colluders} colluders could cut out fewer than {threat.group} honest survivors", False
    mask_with = {c: graph[c] & kept for c in kept} if threat.partners is not None else None
    return Settlement(
        disputed=frozenset(drop), kept=kept, opens=opens, why=why,
        exposed=exposed(contributors=kept, colluders=colluders, mask_with=mask_with, group=threat.group)
        if opens else frozenset(),
        honest_lost=len((alive - kept) - colluders), colluders_lost=len((alive - kept) & colluders))


# ---- the coalition's planners -------------------------------------------------------------------

@dataclass
class SearchLog:
    """What a planner did in each round (for the campaign's report)."""

    maps: dict[int, int] = field(default_factory=dict)
    """Round -> accusation maps scored."""
    best: dict[int, Settlement] = field(default_factory=dict)
    """Round -> the settlement of the map chosen."""


class Planners:
    """Accusation maps for a coalition, from the server's view of the round (the server colludes)."""

    def __init__(self, *, view: ServerView, colluders: Iterable[int], threat: Threat, max_maps: int = MAX_MAPS) -> None:
        self.view, self.colluders, self.threat = view, frozenset(colluders), threat
        self.max_maps = max_maps
        self.log = SearchLog()

    def as_dict(self) -> dict[str, Callable[[int, Mapping[int, Message]], dict[int, tuple[int, ...]]]]:
        return {"accuse_classic": self.classic, "accuse_search": self.search}

    def _candidates(self, requests: Mapping[int, Message]) -> dict[int, tuple[int, ...]]:
        """Per member: the honest clients it may accuse (those whose sealed messages it was relayed)."""
        out = {}
        for m, req in sorted(requests.items()):
            name = {"check_request": "ciphertexts", "lsa_relay": "pieces"}.get(req.kind)
            out[m] = tuple(sorted(set(req[name]) - self.colluders)) if name else ()
        return out

    def _alive(self, round_id: int, requests: Mapping[int, Message]) -> frozenset[int]:
        """Clients still in the round: those asked in the stage before the accusations (every client
        has handled that request by now; the accusation stage's own requests may still be in flight)."""
        before = {"check_request": "share_request", "lsa_relay": "lsa_keys"}
        kinds = {before.get(m.kind, m.kind) for m in requests.values()}
        return frozenset().union(*(self.view.requests(round_id, k) for k in kinds)) | frozenset(requests)

    def classic(self, round_id: int, requests: Mapping[int, Message]) -> dict[int, tuple[int, ...]]:
        """SecAgg+: accuse the honest partners of the honest client with the most colluder neighbours;
        SecAgg, LightSecAgg: each member accuses a different honest client (the highest ids are left)."""
        cands = self._candidates(requests)
        graph = self.view.graph(round_id)
        plan: dict[int, list[int]] = {m: [] for m in cands}
        if self.threat.sparse:
            honest = sorted(set().union(*map(set, cands.values())))
            if not honest:
                return {}
            victim = max(honest, key=lambda v: (len(graph.get(v, frozenset()) & self.colluders), -v))
            partners = sorted(graph.get(victim, frozenset()) - self.colluders - {victim})
            for p in partners:
                able = [m for m in sorted(cands) if p in cands[m]]
                if able:
                    plan[min(able, key=lambda m: (len(plan[m]), m))].append(p)
        else:
            taken: set[int] = set()
            for m in sorted(cands):
                pick = next((h for h in cands[m] if h not in taken), None)
                if pick is not None:
                    plan[m].append(pick)
                    taken.add(pick)
        self._score(round_id, requests, {m: tuple(v) for m, v in plan.items()}, maps=1)
        return {m: tuple(v) for m, v in plan.items() if v}

    def search(self, round_id: int, requests: Mapping[int, Message]) -> dict[int, tuple[int, ...]]:
        """The map that exposes most victims, else loses most honest seats from a round that still
        opens (then the fewest colluders and accusations). Every map of 0-2 accusations per member
        over the honest clients it may accuse; where those are more than `max_maps`, the maps of at
        most one accusation per member, all different: the server's matching keeps at most one
        accusation per accuser, so every map settles exactly as one of these."""
        cands = self._candidates(requests)
        members = sorted(cands)
        opts = [[()] + [(h,) for h in cands[m]] + [tuple(p) for p in itertools.combinations(cands[m], 2)]
                for m in members]
        if np.prod([len(o) for o in opts], dtype=float) <= self.max_maps:
            maps = ({m: t for m, t in zip(members, combo) if t} for combo in itertools.product(*opts))
        else:
            maps = _injections(members, cands)
        graph, alive = self.view.graph(round_id), self._alive(round_id, requests)
        cache: dict[frozenset[int], Settlement] = {}
        best_key, best_map, best = None, {}, None
        count = 0
        for plan in maps:
            count += 1
            if count > self.max_maps:  # only if even the distinct matchings are too many
                break
            accusations = {m: frozenset(t) for m, t in plan.items()}
            dropped = frozenset(accusation_matching(accusations)[0])
            s = cache.get(dropped)
            if s is None:
                s = cache[dropped] = settle(graph=graph, alive=alive, accusations=accusations,
                                            colluders=self.colluders, threat=self.threat)
            key = (len(s.exposed), s.opens, s.honest_lost if s.opens else 0, -s.colluders_lost,
                   -sum(map(len, accusations.values())))
            if best_key is None or key > best_key:
                best_key, best_map, best = key, {m: tuple(sorted(t)) for m, t in accusations.items()}, s
        self.log.maps[round_id] = min(count, self.max_maps)
        if best is not None:
            self.log.best[round_id] = best
        return best_map

    def _score(self, round_id: int, requests: Mapping[int, Message], plan: Mapping[int, tuple[int, ...]],
               *, maps: int) -> None:
        self.log.maps[round_id] = maps
        self.log.best[round_id] = settle(graph=self.view.graph(round_id), alive=self._alive(round_id, requests),
                                         accusations=plan, colluders=self.colluders, threat=self.threat)


def _injections(members: list[int], cands: Mapping[int, tuple[int, ...]],
                taken: frozenset[int] = frozenset()) -> Iterable[dict[int, tuple[int, ...]]]:
    """Every map in which each member accuses at most one candidate and no two the same one."""
    if not members:
        yield {}
        return
    first, rest = members[0], members[1:]
    for tail in _injections(rest, cands, taken):
        yield tail
    for h in cands[first]:
        if h not in taken:
            for tail in _injections(rest, cands, taken | {h}):
                yield {first: (h,), **tail}


def accusations_made(plans: Mapping[tuple[int, str], Mapping[int, tuple[int, ...]]], *,
                     round_id: int) -> dict[int, frozenset[int]]:
    """The accusations the coalition made in a round (every attack's plan for it, merged)."""
    out: dict[int, set[int]] = {}
    for (r, _), plan in plans.items():
        if r == round_id:
            for m, targets in plan.items():
                out.setdefault(m, set()).update(targets)
    return {m: frozenset(t) for m, t in out.items() if t}


# ---- scoring a finished round --------------------------------------------------------------------

def recovered_inputs(*, contributors: Iterable[int], colluders: Iterable[int],
                     mask_with: Mapping[int, frozenset[int]] | None, group: int, opened: np.ndarray | None,
                     inputs: Callable[[int], np.ndarray], ring: Ring) -> frozenset[int]:
    """Honest contributors whose input the coalition (server view + insiders' secrets) computes: by
    `exposed`, and directly when they are a lone honest contributor (the opened sum minus the
    colluders' inputs equals its input)."""
    contributors, colluders = frozenset(contributors), frozenset(colluders)
    out = set(exposed(contributors=contributors, colluders=colluders, mask_with=mask_with, group=group))
    honest = contributors - colluders
    if opened is not None and len(honest) == 1:
        (victim,) = honest
        guess = opened.copy()
        for k in sorted(contributors & colluders):
            ring.sub_(guess, inputs(k))
        if np.array_equal(guess, inputs(victim)):
            out.add(victim)
    return frozenset(out)


def small_groups(*, contributors: Iterable[int], colluders: Iterable[int],
                 mask_with: Mapping[int, frozenset[int]] | None, group: int) -> list[frozenset[int]]:
    """Components of the honest contributors' masking graph smaller than `group` (SecAgg+): sums the
    coalition learns over fewer than g honest clients."""
    honest = frozenset(contributors) - frozenset(colluders)
    if mask_with is None or not honest:
        return []
    return [c for c in components(mask_with, honest) if len(c) < group]


# ---- a server that chooses the dropouts -------------------------------------------------------------

MASKED_STAGES = ("masked", "masked_input")


def withholding_server(cls: type, *, colluders: Iterable[int], unchecked: bool) -> type:
    """A subclass of server protocol `cls` that, at the masked stage, withholds (treats as dropped) the
    masked inputs of a victim's honest partners: in SecAgg the honest client with the most colluder
    partners, whose honest partners are withheld; in LightSecAgg the lowest honest id, every other
    honest client withheld. `unchecked`: it also skips its own checks of the survivor set before
    unmasking (a malicious server), leaving the clients' checks to refuse."""
    colluders = frozenset(colluders)

    class Withholding(cls):
        victim: int | None = None
        withheld: frozenset[int] = frozenset()

        def _enter(self, stage: str, requests: dict[int, Message]) -> dict[int, Message]:
            out = super()._enter(stage, requests)
            if stage in MASKED_STAGES:
                honest = sorted(set(requests) - colluders)
                mask_with = getattr(self, "_mask_with", None)
                if mask_with:
                    self.victim = max(honest, key=lambda v: (len(mask_with[v] & colluders), -v), default=None)
                    self.withheld = frozenset(mask_with.get(self.victim, frozenset()) - colluders)
                else:
                    self.victim = honest[0] if honest else None
                    self.withheld = frozenset(honest[1:])
            return out

        def accept(self, msg: Message) -> None:
            if self.stage in MASKED_STAGES and msg.sender in self.withheld:
                raise ProtocolError(f"client {msg.sender}'s masked input withheld by the server")
            super().accept(msg)

        def waiting_for(self) -> frozenset[int]:
            waiting = super().waiting_for()
            return waiting - self.withheld if self.stage in MASKED_STAGES else waiting

        if unchecked:
            def _check_openable(self, u3, stage):  # SecAgg, SecAgg+
                return None

            def _require(self, replies, detail):  # LightSecAgg
                if self.stage != "masked_input":
                    super()._require(replies, detail)

    Withholding.__name__ = Withholding.__qualname__ = f"Withholding{'Unchecked' if unchecked else ''}{cls.__name__}"
    return Withholding


# ---- round time -----------------------------------------------------------------------------------

def round_time_bound(*, honest_seconds: Mapping[str, float], server_seconds: Mapping[str, float],
                     waited: Iterable[str], policy: StallPolicy = StallPolicy()) -> float:
    """What a round may take with stallers. Per stage, r is the honest clients' part of it
    (`ServerView.honest_stage_seconds`: until the slowest honest reply) plus the server's own protocol
    time; the bound is twice the sum of the r, plus, for each stage in `waited` (it closed with an
    expected client silent: a staller, a crash not yet seen, a reply dropped undecoded), the stall
    policy's grace after a quorum reached within 2 r."""
    stages = set(honest_seconds) | set(server_seconds)
    r = {s: honest_seconds.get(s, 0.0) + server_seconds.get(s, 0.0) for s in stages}
    return 2 * sum(r.values()) + sum(policy.grace(2 * r.get(s, max(r.values(), default=0.0))) for s in waited)


def silent_stages(*, dropped: Mapping[str, Iterable[int]], faulty: Mapping[int, str]) -> list[str]:
    """Stages in which some client was dropped without a recorded fault (silent, late or gone): the
    stages that may have waited a grace for it."""
    return [stage for stage, ids in dropped.items()
            if any(not faulty.get(c, "").startswith(f"{stage}:") for c in ids)]
