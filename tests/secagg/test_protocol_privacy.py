"""What the server, with a coalition below the threshold, can learn of one honest client's input.

Each round runs through the in-memory driver (`secagg.simulate.run_round`) with the server and the
colluding clients recorded from outside: every message the server sent and received, its state after
the round, and each colluder's state after every message it handled (its secrets, kept even where the
honest code forgets them). An attack then does everything that view allows: rebuild each secret for
which it holds a threshold of Shamir shares (the server's unmasking shares plus the coalition's),
remove every mask the coalition can compute, decode every coded mask piece it can read, and return
its candidate inputs. The protocol passes when no candidate is the input. The same attack against a
mutant that drops the protecting mask (`tests/mutants`) must recover the input exactly: the attack is
real, and the test kills the mutant. Rounds are driven only by the protocol objects and their
messages, so a protocol stage added later changes nothing here.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from secagg import crypto, lcc, shamir
from secagg.crypto import KeyPair
from secagg.messages import Message
from secagg.prg import mask, random_vector
from secagg.protocols import secagg as sa
from secagg.protocols import lightsecagg as lsa
from secagg.protocols.lightsecagg import LightSecAggClient, LightSecAggServer
from secagg.protocols.secagg import SecAggClient, SecAggPlusClient, SecAggPlusServer, SecAggServer
from secagg.ring import FIELD_P31, MERSENNE_31, RING_2_32
from secagg.simulate import run_round
from tests.mutants import registry

D = 32
PUB = crypto.PUBLIC_KEY_BYTES
SECAGG = {"secagg": (SecAggServer, SecAggClient, 7), "secagg+": (SecAggPlusServer, SecAggPlusClient, 12)}


# ---- recording ------------------------------------------------------------------------------------
class RecordingServer:
    """A server protocol with every request it sends and every reply it is offered kept."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.sent: list[Message] = []
        self.received: list[Message] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _out(self, requests: dict[int, Message]) -> dict[int, Message]:
        self.sent.extend(requests.values())
        return requests

    def start(self) -> dict[int, Message]:
        return self._out(self.inner.start())

    def accept(self, msg: Message) -> None:
        self.received.append(msg)  # seen even if refused
        self.inner.accept(msg)

    def advance(self) -> dict[int, Message]:
        return self._out(self.inner.advance())

    def result(self) -> Any:
        return self.inner.result()


class Colluder:
    """A client protocol whose attributes are copied after every message it handles."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.states: list[dict[str, Any]] = []

    def handle(self, msg: Message) -> Message | None:
        reply = self.inner.handle(msg)
        self.states.append(dict(vars(self.inner)))
        return reply

    def latest(self, name: str) -> Any:
        """The last non-empty value the attribute `name` held (None if never set)."""
        values = [s[name] for s in self.states if s.get(name) is not None and _nonempty(s[name])]
        return values[-1] if values else None


class Delayed:
    """A client whose reply carrying its masked vector is held back: the server sees it only later."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.late: Message | None = None

    def handle(self, msg: Message) -> Message | None:
        reply = self.inner.handle(msg)
        if reply is not None and "vector" in reply.fields and self.late is None:
            self.late = reply
            return None
        return reply


def _nonempty(value: Any) -> bool:
    return not isinstance(value, (dict, set, frozenset, tuple, list)) or len(value) > 0


@dataclass
class View:
    """The server's whole view of a round plus the coalition's secrets."""

    server: RecordingServer
    coalition: dict[int, Colluder]
    inputs: dict[int, np.ndarray]
    late: list[Message] = field(default_factory=list)

    def replies(self, name: str) -> list[Message]:
        """Every message the server received (late ones included) that carries field `name`."""
        return [m for m in [*self.server.received, *self.late] if name in m.fields]

    def request_to(self, client: int, name: str) -> Message | None:
        return next((m for m in self.server.sent if m.receiver == client and name in m.fields), None)


def _with_supported(cls: type, **kwargs: Any) -> dict[str, Any]:
    """The keyword arguments `cls` accepts (a parameter added or removed later changes nothing here)."""
    accepted = inspect.signature(cls).parameters
    return {k: v for k, v in kwargs.items() if k in accepted}


# ---- SecAgg / SecAgg+ ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Attack:
    candidates: list[np.ndarray]
    seed_rebuilt: bool
    """The attackers held a threshold of shares of the victim's self-mask seed b_u."""
    key_rebuilt: bool
    """... of its masking key s_sk_u (then every pairwise mask of the victim is known)."""
    pairwise_known: int
    """Pairwise masks of the victim the attackers could compute."""

    def recovers(self, x: np.ndarray) -> bool:
        return any(np.array_equal(c, x) for c in self.candidates)


def run_secagg(protocol: str, *, victim: int = 1, delay_victim: bool = False) -> View:
    """One round of N clients; a coalition of t - 1 of the victim's neighbours records its secrets."""
    server_cls, client_cls, n = SECAGG[protocol]
    ids = list(range(1, n + 1))
    inputs = {c: random_vector(RING_2_32, D) for c in ids}
    t = server_cls(round_id=5, clients=ids, length=D).threshold  # fixed by N and the degree alone
    inner = server_cls(**_with_supported(server_cls, round_id=5, clients=ids, length=D, colluders=t - 1))
    coalition_ids = sorted(inner.graph[victim])[: t - 1]
    server = RecordingServer(inner)
    clients: dict[int, Any] = {c: client_cls(client_id=c, round_id=5, input_fn=lambda c=c: inputs[c]) for c in ids}
    coalition = {c: Colluder(clients[c]) for c in coalition_ids}
    clients.update(coalition)
    delayed = Delayed(clients[victim]) if delay_victim else None
    if delayed is not None:
        clients[victim] = delayed
    result = run_round(server, clients)
    expected = np.zeros(D, dtype=np.uint32)
    for c in result.contributors:
        RING_2_32.add_(expected, inputs[c])
    assert np.array_equal(result.ring_sum, expected)  # the round itself is correct
    view = View(server, coalition, inputs)
    if delayed is not None:
        assert victim not in result.contributors and delayed.late is not None
        view.late.append(delayed.late)  # the held-back upload reaches the server after unmasking
    return view


def _combine(shares: dict[int, bytes], t: int) -> int:
    xs = sorted(shares)[:t]
    return shamir.combine(xs, [[shamir.from_bytes(shares[x]) for x in xs]])[0]


def secagg_attack(view: View, victim: int) -> Attack:
    """y_u minus what the server and the coalition can rebuild: PRG(b_u) from a threshold of seed
    shares, every sign(u, v) PRG(s_uv) from a threshold of key shares, else those with colluders."""
    server = view.server.inner
    rid, t = server.round_id, server.threshold
    (y,) = [m["vector"] for m in view.replies("vector") if m.sender == victim]
    keys = {m.sender: m["keys"] for m in view.replies("keys")}
    seed_shares = {m.sender: m["seed_shares"][victim] for m in view.replies("seed_shares")
                   if victim in m["seed_shares"]}
    key_shares = {m.sender: m["key_shares"][victim] for m in view.replies("key_shares") if victim in m["key_shares"]}
    for c, colluder in view.coalition.items():
        held = colluder.latest("held") or {}
        if victim in held:
            seed_shares.setdefault(c, held[victim][0])
            key_shares.setdefault(c, held[victim][1])
    request = view.request_to(victim, "mask_with")
    partners = frozenset(request["mask_with"]) if request is not None else server.graph[victim]

    self_mask = np.zeros(D, dtype=np.uint32)
    if len(seed_shares) >= t:
        self_mask = mask(sa._self_mask_key(rid, victim, _combine(seed_shares, t)), RING_2_32, D)
    owners: dict[int, KeyPair] = {}  # partner v -> a key pair whose agreement with the other side gives s_uv
    if len(key_shares) >= t:
        own = KeyPair.from_private_bytes(shamir.to_bytes(_combine(key_shares, t)))
        owners = {v: own for v in partners}
        peer_of = {v: keys[v][PUB:] for v in partners}
    else:
        for c in sorted(partners & view.coalition.keys()):
            owners[c] = KeyPair.from_private_bytes(shamir.to_bytes(view.coalition[c].latest("s_secret")))
        peer_of = {c: keys[victim][PUB:] for c in owners}
    pairwise = np.zeros(D, dtype=np.uint32)
    for v, pair in owners.items():
        prg = mask(crypto.agree(pair, peer_of[v], sa._mask_info(rid, victim, v)), RING_2_32, D)
        (RING_2_32.add_ if sa._sign(victim, v) == 1 else RING_2_32.sub_)(pairwise, prg)
    candidates = []
    for a in (np.zeros(D, dtype=np.uint32), self_mask):
        for b in (np.zeros(D, dtype=np.uint32), pairwise):
            candidates.append(RING_2_32.sub_(RING_2_32.sub_(y.copy(), a), b))
    return Attack(candidates, seed_rebuilt=len(seed_shares) >= t, key_rebuilt=len(key_shares) >= t,
                  pairwise_known=len(owners))


def _honest(view: View) -> list[int]:
    return sorted(set(view.inputs) - set(view.coalition))


@pytest.mark.parametrize("protocol", sorted(SECAGG))
def test_a_coalition_below_the_threshold_cannot_recover_an_honest_secagg_input(protocol: str, monkeypatch) -> None:
    """The server learns every survivor's b_u, and t - 1 colluders their own pairwise masks: the masks
    with honest partners still hide x_u. Without pairwise masks the same attack recovers x_u."""
    view = run_secagg(protocol)
    assert len(view.coalition) == view.server.threshold - 1
    for victim in _honest(view):
        attack = secagg_attack(view, victim)
        assert attack.seed_rebuilt and not attack.key_rebuilt  # never both secrets of one client
        assert attack.pairwise_known == len(view.coalition.keys() & view.server.graph[victim])
        assert not attack.recovers(view.inputs[victim]), f"client {victim}'s input was recovered"
    assert secagg_attack(view, 1).pairwise_known == len(view.coalition) > 0

    registry()["secagg_no_pairwise_masks"].apply(monkeypatch)
    broken = run_secagg(protocol)
    assert secagg_attack(broken, 1).recovers(broken.inputs[1])


@pytest.mark.parametrize("protocol", sorted(SECAGG))
def test_a_delayed_secagg_client_is_not_unmasked_by_its_rebuilt_masking_key(protocol: str, monkeypatch) -> None:
    """A client whose upload arrives after the server took it for dropped: the server has rebuilt
    s_sk_u (every pairwise mask) but never b_u, so the self-mask still hides x_u; without it the
    late upload gives x_u away."""
    view = run_secagg(protocol, delay_victim=True)
    attack = secagg_attack(view, 1)
    assert attack.key_rebuilt and not attack.seed_rebuilt
    assert attack.pairwise_known == len(view.request_to(1, "mask_with")["mask_with"])
    assert not attack.recovers(view.inputs[1])

    registry()["secagg_no_self_mask"].apply(monkeypatch)
    broken = run_secagg(protocol, delay_victim=True)
    assert secagg_attack(broken, 1).recovers(broken.inputs[1])


# ---- LightSecAgg -------------------------------------------------------------------------------------
LSA_N = 6  # U = ceil(0.8 N) = 5 pieces decode; T = floor(N / 2) = 3 reveal nothing


def run_lightsecagg() -> View:
    ids = list(range(1, LSA_N + 1))
    inputs = {c: random_vector(FIELD_P31, D) for c in ids}
    probe = LightSecAggServer(round_id=3, clients=ids, length=D)
    coalition_ids = ids[-probe.privacy:]
    inner = LightSecAggServer(**_with_supported(LightSecAggServer, round_id=3, clients=ids, length=D,
                                                colluders=len(coalition_ids)))
    server = RecordingServer(inner)
    clients: dict[int, Any] = {c: LightSecAggClient(client_id=c, round_id=3, input_fn=lambda c=c: inputs[c])
                               for c in ids}
    coalition = {c: Colluder(clients[c]) for c in coalition_ids}
    clients.update(coalition)
    result = run_round(server, clients)
    expected = np.zeros(D, dtype=np.uint32)
    for c in result.contributors:
        FIELD_P31.add_(expected, inputs[c])
    assert np.array_equal(result.ring_sum, expected) and result.contributors == frozenset(ids)
    return View(server, coalition, inputs)


def lightsecagg_attack(view: View, victim: int) -> tuple[list[np.ndarray], int]:
    """y_u as uploaded, and y_u minus z_u decoded from every coded piece of z_u the attackers can read:
    the coalition's own pieces, then each relayed blob read as if it were an unsealed piece.
    Returns the candidates and how many true pieces (the coalition's) were among those used."""
    server = view.server.inner
    code, position = server.code, server.position
    (y,) = [m["vector"] for m in view.replies("vector") if m.sender == victim]
    pieces: dict[int, np.ndarray] = {}
    for c, colluder in view.coalition.items():  # each colluder opens the victim's piece sealed to it
        key = (colluder.latest("_peer_keys") or {}).get(victim)
        sent = [m["pieces"][c] for m in view.replies("pieces") if m.sender == victim and c in m["pieces"]]
        if key is not None and sent:
            raw = lsa.open_sealed(key, sent[0], lsa._piece_aad(3, victim, c))
            pieces[position[c]] = np.frombuffer(raw, dtype="<u4", count=code.piece_length).astype(np.uint32)
    true_pieces = len(pieces)
    candidates = [y.copy()]
    k = code.num_nodes - code.privacy
    if true_pieces >= k:  # were the T random pieces zero, the coalition's own pieces would fix the mask
        n, nodes_u = len(server.clients), lcc.alphas(len(server.clients), code.num_nodes)
        own = sorted(pieces)[: code.num_nodes]
        nodes = tuple(lcc.betas(n)[p] for p in own) + nodes_u[k:][: code.num_nodes - len(own)]
        values = np.vstack([pieces[p] for p in own] + [np.zeros((len(nodes) - len(own), code.piece_length), np.uint32)])
        z = lcc.matmul_mod_p(lcc.lagrange_matrix(nodes, nodes_u[:k]), values).reshape(-1)[: code.length]
        candidates.append(FIELD_P31.sub_(y.copy(), z))
    width = 4 * code.piece_length
    for m in view.replies("pieces"):
        if m.sender != victim:
            continue
        for receiver, blob in sorted(m["pieces"].items()):
            raw = np.frombuffer(blob[crypto.NONCE_BYTES:crypto.NONCE_BYTES + width], dtype="<u4")
            pieces.setdefault(position[receiver], (raw.astype(np.uint64) % MERSENNE_31).astype(np.uint32))
    if len(pieces) >= code.num_nodes:
        used = sorted(pieces, key=lambda p: (p not in {position[c] for c in view.coalition}, p))[: code.num_nodes]
        z = code.decode(used, np.stack([pieces[p] for p in used]))
        candidates.append(FIELD_P31.sub_(y.copy(), z))
    return candidates, true_pieces


def test_a_coalition_of_t_clients_cannot_recover_an_honest_lightsecagg_input(monkeypatch) -> None:
    """T colluders hold T < U coded pieces of z_u and the server only sealed ones: y_u = x_u + z_u stays
    padded. With the mask zeroed, the pieces relayed unsealed, or the code's T random pieces zero (then
    the colluders' T >= U - T pieces fix the mask), the same attacks recover x_u."""
    view = run_lightsecagg()
    server = view.server.inner
    assert len(view.coalition) == server.privacy < server.code.num_nodes
    for victim in _honest(view):
        candidates, true_pieces = lightsecagg_attack(view, victim)
        assert true_pieces == server.privacy and len(candidates) == 3  # both attacks decoded something
        assert not any(np.array_equal(c, view.inputs[victim]) for c in candidates), f"client {victim} recovered"

    for name in ("lightsecagg_zero_mask", "lightsecagg_piece_in_clear", "lightsecagg_zero_random_pieces"):
        with monkeypatch.context() as mp:
            registry()[name].apply(mp)
            broken = run_lightsecagg()
            candidates, _ = lightsecagg_attack(broken, 1)
            assert any(np.array_equal(c, broken.inputs[1]) for c in candidates), name
