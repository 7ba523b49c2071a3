"""SecAgg (Bonawitz et al., CCS 2017) and SecAgg+ (Bell et al., CCS 2020), one state machine.

Each client u masks its ring vector x_u as

    y_u = x_u + PRG(b_u) + sum_{v in M(u)} sign(u, v) * PRG(s_uv)   (mod 2^32)

with M(u) the neighbours N(u) that shared and passed the check stage (below), sign(u, v) = +1 if
u < v else -1, s_uv = HKDF(X25519(s_sk_u, s_pk_v)) and b_u a fresh self-mask
seed. b_u and s_sk_u are Shamir-shared (threshold t) among N(u) + {u}, sealed with AES-GCM under
keys from a second X25519 pair. After the masked inputs arrive the server asks each survivor's
neighbours for shares of b_u (survivors) or s_sk_u (clients that dropped after the check), never both
for one client, and removes the masks:

    sum_{u in U3} x_u = sum y_u - sum PRG(b_u) - sum_{v dropped} sum_{u in M(v) & U3} sign(u, v) PRG(s_uv).

SecAgg uses the complete graph; SecAgg+ a random Harary graph of degree ~2 log2 N.

Threat model: a server honest-but-curious in its computation that may drop or delay any message
(so it chooses who drops), colluding with up to c enrolled clients (`colluders`, below the
threshold t); any party may send malformed bytes. Guarantee: no individual input and no sum over
fewer than g (`min_clients`) honest clients is learned. Stages: advertise -> share -> check ->
masked -> consistency -> unmask.

With `chunk` (server) the masked input travels in chunks folded into the sum as they arrive
(`secagg.protocols.chunks`): the server holds O(d) whatever N, and a stream that breaks costs one
`resend` stage in which the complete clients send the tainted chunks again: masked -> [resend] ->
consistency.

Faulty clients are isolated, not fatal: a reply that fails validation (e.g. a low-order public key)
drops its sender at that stage (`ServerProtocol.accept`). A share ciphertext that fails
authentication at its receiver c cannot be judged by the server (it cannot open it), so the
shares are checked before anyone masks: in the check stage each client opens the shares relayed
to it and names the senders whose shares failed (`bad_shares`). The server cannot tell which end
of an accusation lies, but one of them misbehaved, so it drops BOTH ends of each accusation of a
maximal matching (`base.accusation_matching`): disputes never cost more honest seats than colluding
ones, and the pair is recorded as a dispute, not as a culprit. (On SecAgg+'s sparse ring, clients
left with fewer than the needed live partners then leave the round as after any dropout: in the
attack campaign two colluders' accusations cost 23 honest seats against 20 colluding ones over the
opened rounds, 3 of them such partner drops, and could abort some rounds: denial of service.) Only
then does it tell each client which neighbours to mask with (`mask_with`: its kept neighbours,
whose shares it holds), so no survivor ever masks with a client whose masking key it cannot help
rebuild, however many of its shares were spoiled. A dropped client's self-mask seed is never
requested. The check stage is one round trip of a few bytes per neighbour (Bonawitz et al.
instead abort the whole round when a share fails to decrypt).

Isolation (the server choosing dropouts, helped by colluders) is refused on both sides: a client
masks only with at least max(t - 1, c + 1) partners and reveals its unmasking shares only if at
least c + 1 of them survived (one is honest, so its input never stands alone); the server opens a
round only with at least g + c survivors and, on SecAgg+'s sparse ring, only if no c colluders can
cut out a component of fewer than g honest survivors (`graph.smallest_isolable_group`). Before any
share is revealed, the consistency stage of the malicious-server variant runs
(`consistency.py`): survivors sign the announced survivor set and each client checks t valid
signatures over the same set (enrolled runs). At unmasking, shares beyond the threshold are
cross-checked as Reed–Solomon codewords (`secagg.reed_solomon`): wrong shares are corrected
where the redundancy allows and their senders named in `RoundResult.faulty`; a sum that cannot
be opened correctly aborts instead of being released wrong.

Duplicate round keys (two clients advertising the same key, each signing it with its own
identity) drop every client that advertised it; the round goes on.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from secagg import crypto, reed_solomon, shamir
from secagg.crypto import DecryptionError, KeyPair
from secagg.graph import complete_graph, default_degree, harary_graph, is_connected, random_order, smallest_isolable_group
from secagg.identity import SIGNATURE_BYTES, Identity, Roster, advertisement
from secagg.noise_layers import MAX_LAYERS, LayerSecrets, LayerSpec
from secagg.messages import (
    MAX_CLIENT_ID, AbortError, Array, Bytes, BytesMap, Int, IntList, Message, ProtocolError, Schema,
)
from secagg.prg import MaskStream, apply_masks_
from secagg.protocols.base import MAX_VECTOR_LENGTH, ClientProtocol, InputFn, RoundResult, ServerProtocol
from secagg.protocols.chunks import MIN_CHUNK, ChunkFolder, ChunkPlan, check_max_streams, plan_for, stream_window
from secagg.protocols.consistency import Floors, require_signatures, sign_survivors, survivor_statement
from secagg.ring import RING_2_32, Ring
from secagg.threads import thread_cap

MAX_LEN = MAX_VECTOR_LENGTH
MAX_PEERS = 1 << 16
KEYS_BYTES = 2 * crypto.PUBLIC_KEY_BYTES              # c_pk || s_pk
SHARE_PLAINTEXT = 2 * shamir.SECRET_BYTES             # share of b_u || share of s_sk_u
SHARE_CIPHERTEXT = SHARE_PLAINTEXT + crypto.NONCE_BYTES + crypto.TAG_BYTES
MAX_SHARE_CIPHERTEXT = SHARE_CIPHERTEXT + MAX_LAYERS * shamir.SECRET_BYTES


def share_ciphertext_bytes(layers: int) -> int:
    """Size of one sealed share: b_u's and s_sk_u's shares and one share per removable noise layer."""
    return SHARE_CIPHERTEXT + layers * shamir.SECRET_BYTES

# ---- messages -----------------------------------------------------------------------------------
ADVERTISE_REQUEST = Schema("advertise_request", {
    "length": Int(1, MAX_LEN), "threshold": Int(1, MAX_PEERS),
    "neighbours": IntList(MAX_PEERS, 1, MAX_CLIENT_ID),
    "colluders": Int(0, MAX_PEERS), "min_group": Int(1, MAX_PEERS), "layers": Int(0, MAX_LAYERS),
})
ADVERTISE_KEYS = Schema("advertise_keys", {"keys": Bytes(KEYS_BYTES, exact=True),
                                           "signature": Bytes(SIGNATURE_BYTES)})
SHARE_REQUEST = Schema("share_request", {"keys": BytesMap(MAX_PEERS, KEYS_BYTES, exact=True),
                                         "signatures": BytesMap(MAX_PEERS, SIGNATURE_BYTES)})
SIGNED_AS = "secagg"
"""Protocol family in signed advertisements (SecAgg and SecAgg+ are one state machine)."""
SHARES = Schema("shares", {"ciphertexts": BytesMap(MAX_PEERS, MAX_SHARE_CIPHERTEXT)})
CHECK_REQUEST = Schema("check_request", {"ciphertexts": BytesMap(MAX_PEERS, MAX_SHARE_CIPHERTEXT)})
SHARE_CHECK = Schema("share_check", {"bad_shares": IntList(MAX_PEERS, 1, MAX_CLIENT_ID)})
MASKED_REQUEST = Schema("masked_request", {"mask_with": IntList(MAX_PEERS, 1, MAX_CLIENT_ID),
                                           "chunk": Int(0, MAX_LEN)})
"""`chunk`: 0 for the masked input in one message, else the values per `masked_chunk` message (`chunks.py`)."""
MASKED_INPUT = Schema("masked_input", {"vector": Array("uint32", MAX_LEN)})
MASKED_CHUNK = Schema("masked_chunk", {"index": Int(0, MAX_LEN), "vector": Array("uint32", MAX_LEN)})
RESEND_REQUEST = Schema("resend_request", {"chunks": IntList(MAX_LEN, 0, MAX_LEN)})
"""Chunks whose slices of the sum a broken stream tainted, to be sent again by a complete client."""
CONSISTENCY_REQUEST = Schema("consistency_request", {"survivors": IntList(MAX_PEERS, 1, MAX_CLIENT_ID)})
SURVIVOR_SIGNATURE = Schema("survivor_signature", {"signature": Bytes(SIGNATURE_BYTES)})
UNMASK_REQUEST = Schema("unmask_request", {"signatures": BytesMap(MAX_PEERS, SIGNATURE_BYTES)})
UNMASK_SHARES = Schema("unmask_shares", {
    "seed_shares": BytesMap(MAX_PEERS, shamir.SECRET_BYTES, exact=True),
    "key_shares": BytesMap(MAX_PEERS, shamir.SECRET_BYTES, exact=True),
    "layer_shares": BytesMap(MAX_PEERS, shamir.SECRET_BYTES, exact=True),
    "layer_index": Int(-1, MAX_LAYERS - 1),
    "excess": Array("uint32", MAX_LEN),
})


def _mask_info(round_id: int, u: int, v: int) -> bytes:
    return crypto.context("pairwise-mask", round_id, min(u, v), max(u, v))


def _share_key_info(round_id: int, u: int, v: int) -> bytes:
    return crypto.context("share-key", round_id, min(u, v), max(u, v))


def _share_aad(round_id: int, sender: int, receiver: int) -> bytes:
    return crypto.context("share", round_id, sender, receiver)


def _self_mask_key(round_id: int, client: int, seed: int) -> bytes:
    return crypto.hkdf(shamir.to_bytes(seed), crypto.context("self-mask", round_id, client))


def _split_plain(plain: bytes) -> tuple[bytes, ...]:
    """A share plaintext's pieces: b_u's share, s_sk_u's share, then one per noise layer."""
    if len(plain) < SHARE_PLAINTEXT or len(plain) % shamir.SECRET_BYTES:
        raise ValueError("share plaintext of the wrong size")
    return tuple(plain[i:i + shamir.SECRET_BYTES] for i in range(0, len(plain), shamir.SECRET_BYTES))


def _sign(u: int, v: int) -> int:
    return 1 if u < v else -1


def threshold_for(neighbourhood: int, fraction: float) -> int:
    """Shares needed out of a neighbourhood of this size (self included): floor(f * n) + 1."""
    return min(neighbourhood, int(fraction * neighbourhood) + 1)


# ---- server -------------------------------------------------------------------------------------
class SecAggPlusServer(ServerProtocol):
    """Server of SecAgg+ (random sparse graph); `SecAggServer` fixes the complete graph."""

    name = "secagg+"
    schemas = {"advertise": ADVERTISE_KEYS, "share": SHARES, "check": SHARE_CHECK, "masked": MASKED_INPUT,
               "consistency": SURVIVOR_SIGNATURE, "unmask": UNMASK_SHARES}

    def __init__(
        self, *, round_id: int, clients: Sequence[int], length: int, ring: Ring = RING_2_32,
        degree: int | None = None, threshold_fraction: float = 0.5, min_clients: int = 2,
        colluders: int = 0, planned_dropout: float | None = None, corrupt_fraction: float = 0.05,
        roster: Roster | None = None, noise_layers: LayerSpec | None = None, chunk: int | str | None = "auto",
        max_streams: int | None = None,
    ) -> None:
        """`min_clients`: g, the fewest honest clients whose sum may be opened; `colluders`: c, the
        colluding clients the round withstands (c < t); the round needs max(t, g + c) survivors.
        `planned_dropout` (SecAgg+ only, with no `degree`): degree and threshold from the threat model
        (`secagg.plus_params`, Bell et al. CCS 2020: N, this dropout, `corrupt_fraction`, sigma 40,
        eta 30), so the round does not abort up to the planned dropout; `describe()` prints them.
        `roster`: enrolled clients' verify keys; with it, an unsigned or wrongly signed key
        advertisement (or survivor signature) drops its sender at once (clients check every
        signature themselves anyway). `noise_layers`: removable noise layers (`secagg.noise_layers`,
        XNoise) each client shares with its unmasking shares; the survivors' revealed layer secrets
        come back in `RoundResult.layer_secrets`. `chunk`: masked inputs in chunks of this many values,
        each folded into the sum as it arrives (None, or at least the length: one message; "auto", the
        default: 262,144-value chunks for inputs of 2^22 values or more, `chunks.plan_for`). `max_streams`
        (chunked rounds): at most this many clients stream their masked inputs at once
        (`chunks.stream_window`); None, the default: every client at once."""
        super().__init__(round_id=round_id, clients=clients, length=length, ring=ring)
        self.chunks = plan_for(chunk, length, max_length=MAX_LEN)
        self.max_streams = check_max_streams(max_streams)
        self._folder: ChunkFolder | None = None
        self.resent: tuple[int, ...] = ()
        """Chunk indices rebuilt from resends in this round (a stream broke), for reports and tests."""
        if self.chunks is not None:
            self.schemas = {**type(self).schemas, "masked": MASKED_CHUNK, "resend": MASKED_CHUNK}
        self.roster = roster
        self.layers = noise_layers
        self.share_bytes = share_ciphertext_bytes(noise_layers.count if noise_layers else 0)
        if not ring.is_power_of_two:
            raise ValueError("SecAgg masks live in Z_{2^32}; use LightSecAgg for a prime field")
        if not 0.0 <= threshold_fraction < 1.0:
            raise ValueError("threshold_fraction must be in [0, 1)")
        n = len(self.clients)
        self.plan = None
        if planned_dropout is not None and self.name == "secagg+":
            if degree is not None:
                raise ValueError("give degree or planned_dropout, not both")
            from secagg.plus_params import plus_parameters

            self.plan = plus_parameters(n=n, dropout=float(planned_dropout), corrupt_fraction=float(corrupt_fraction))
            degree, threshold_fraction = self.plan.degree, self.plan.threshold_fraction()
        self.order = random_order(self.clients)
        self.graph = self._make_graph(degree if degree is not None else default_degree(n))
        k = max(len(v) for v in self.graph.values()) if n > 1 else 0
        self.complete = k >= n - 1
        self.half = None if self.complete else (k + 1) // 2
        self.threshold = threshold_for(k + 1, threshold_fraction)
        self.floors = Floors(colluders=int(colluders), min_group=int(min_clients))
        if self.floors.colluders >= self.threshold and n > 1:
            raise ValueError(f"colluders={colluders} must be below the threshold t={self.threshold}: "
                             f"c colluders plus the server would hold t shares of a client's secrets")
        self.partners = max(self.threshold - 1, self.floors.partners)
        """Fewest live masking partners (self excluded) a client needs at masking and at unmasking."""
        self.min_clients = max(self.floors.survivors, self.threshold)
        """Fewest survivors the round may be opened with."""
        self._keys: dict[int, bytes] = {}
        self._signatures: dict[int, bytes] = {}
        self._u2: frozenset[int] = frozenset()
        self._mask_with: dict[int, frozenset[int]] = {}   # client -> neighbours it was told to mask with
        self._u3: frozenset[int] = frozenset()
        self._survivor_signatures: dict[int, bytes] = {}
        self._sum: np.ndarray | None = None
        self._result: RoundResult | None = None

    def _make_graph(self, degree: int) -> dict[int, frozenset[int]]:
        return harary_graph(self.clients, degree, order=self.order)

    def quorum(self) -> int:
        """Half the expected replies, and never fewer than the round's minimum: a driver may close the
        stage once these arrived and a grace derived from their speed passed (a staller then counts as
        dropped). Half, not the minimum alone, so that honest clients answering one after another on a
        loaded machine (about as long for the second half as for the first) are not cut off. A resend
        needs every survivor (a missing one aborts), so it never closes early."""
        if self.stage == "resend":
            return len(self._expected)
        return min(len(self._expected), max(self.min_clients, -(-len(self._expected) // 2)))

    def send_window(self) -> int | None:
        """With `max_streams`, the masked stage of a chunked round is paced: that many clients stream at once."""
        return stream_window(self.max_streams, streaming=self._folder is not None and self.stage == "masked",
                             expected=len(self._expected))

    def replies_expected(self, client: int) -> int:
        """Messages the current stage's request asks of `client`: its chunks in a chunked stage, else 1
        (drivers size what a connection may have in flight by it)."""
        if self._folder is not None and self.stage in ("masked", "resend"):
            return self._folder.need
        return 1

    def describe(self) -> str:
        """One line: the round's graph and threat parameters (printed with each round)."""
        k = max((len(v) for v in self.graph.values()), default=0)
        line = (f"{self.name} n={len(self.clients)} degree={k} threshold={self.threshold} "
                f"colluders={self.floors.colluders} min_group={self.floors.min_group} "
                f"min_survivors={self.min_clients}")
        return line if self.plan is None else f"{line} [{self.plan.describe()}]"

    # stage 0
    def start(self) -> dict[int, Message]:
        if len(self.clients) < self.min_clients:
            raise AbortError(stage="advertise", survivors=len(self.clients), required=self.min_clients)
        return self._enter("advertise", {
            c: self._request("advertise_request", c, length=self.length, threshold=self.threshold,
                             neighbours=tuple(sorted(self.graph[c])), colluders=self.floors.colluders,
                             min_group=self.floors.min_group, layers=self.layers.count if self.layers else 0)
            for c in self.clients
        })

    def check_reply(self, msg: Message) -> None:
        if self.stage == "advertise":
            keys = msg["keys"]
            for pub in (keys[: crypto.PUBLIC_KEY_BYTES], keys[crypto.PUBLIC_KEY_BYTES:]):
                if not crypto.is_valid_public_key(pub):
                    raise ProtocolError(f"client {msg.sender} advertised an invalid (low-order) public key")
            if self.roster is not None and not self.roster.verify(
                    msg.sender, msg["signature"], advertisement(SIGNED_AS, self.round_id, msg.sender, keys)):
                raise ProtocolError(f"client {msg.sender}'s key advertisement is not signed by its enrolled key")
        elif self.stage == "share":
            expected = self.graph[msg.sender] & self._keys.keys()
            if set(msg["ciphertexts"]) != expected:
                raise ProtocolError(f"client {msg.sender} sent shares for the wrong set of neighbours")
            if any(len(ct) != self.share_bytes for ct in msg["ciphertexts"].values()):
                raise ProtocolError(f"client {msg.sender} sent shares of the wrong size (expected {self.share_bytes} bytes)")
        elif self.stage == "check":
            if not set(msg["bad_shares"]) <= self.graph[msg.sender] & self._u2:
                raise ProtocolError(f"client {msg.sender} reports bad shares from clients that sent it none")
        elif self.stage == "masked":
            if msg["vector"].shape[0] != self.length:
                raise ProtocolError(f"masked input of length {msg['vector'].shape[0]}, expected {self.length}")
        elif self.stage == "consistency":
            if self.roster is not None and not self.roster.verify(
                    msg.sender, msg["signature"], survivor_statement(SIGNED_AS, self.round_id, self._u3)):
                raise ProtocolError(f"client {msg.sender}'s signature over the survivor set is not valid")
        elif self.stage == "unmask":
            alive, dropped = self._unmask_sets(msg.sender)
            if set(msg["seed_shares"]) != alive | {msg.sender} or set(msg["key_shares"]) != dropped:
                raise ProtocolError(f"client {msg.sender} returned shares for the wrong clients")
            index = self.layer_index()
            if msg["layer_index"] != index or set(msg["layer_shares"]) != (alive | {msg.sender} if index >= 0 else set()):
                raise ProtocolError(f"client {msg.sender} revealed noise layer {msg['layer_index']} for "
                                    f"{len(msg['layer_shares'])} clients; {len(self._u3)} survivors remove up to layer {index}")
            self.check_excess(msg, index)
            try:
                for b in (*msg["seed_shares"].values(), *msg["key_shares"].values(), *msg["layer_shares"].values()):
                    shamir.from_bytes(b)
            except ValueError as exc:
                raise ProtocolError(str(exc)) from exc

    def on_stage_complete(self, replies: dict[int, Message]) -> dict[int, Message]:
        return getattr(self, f"_after_{self.stage}")(replies)

    def accept(self, msg: Message) -> None:
        """As `ServerProtocol.accept`; a valid masked input is added into the running sum at once and
        only its envelope is kept, so the server holds O(d) of masked inputs, not O(N d). (No client is
        dropped after its masked input is accepted: accusations are settled in the check stage.) In a
        chunked round each chunk is folded as it arrives (`ServerProtocol.accept_chunk`)."""
        if self._folder is not None and self.stage in ("masked", "resend"):
            self.accept_chunk(msg, schema=MASKED_CHUNK, folder=self._folder)
            return
        super().accept(msg)
        if self.stage == "masked":
            self.fold_input(msg)
        elif self.stage == "unmask":
            self.fold_excess(msg)

    def _viable(self, alive: set[int], stage: str) -> frozenset[int]:
        """Drop clients with fewer live neighbours than `partners`, repeatedly (they would refuse to
        mask, or be exposed), and abort below the survivor minimum."""
        alive = set(alive)
        while True:
            weak = {c for c in alive if len(self.graph[c] & alive) < self.partners}
            if not weak:
                break
            alive -= weak
            self._dropped[stage] = self._dropped.get(stage, frozenset()) | weak
        if len(alive) < self.min_clients:
            raise AbortError(stage=stage, survivors=len(alive), required=self.min_clients,
                             detail=f"neighbourhood threshold {self.threshold}, {self.partners} partners each")
        return frozenset(alive)

    def _after_advertise(self, replies: dict[int, Message]) -> dict[int, Message]:
        keys = {c: m["keys"] for c, m in replies.items()}
        owners: dict[bytes, list[int]] = {}
        for c, k in keys.items():
            for half in {k[: crypto.PUBLIC_KEY_BYTES], k[crypto.PUBLIC_KEY_BYTES:]}:
                owners.setdefault(half, []).append(c)
        for shared in (cs for cs in owners.values() if len(cs) > 1):
            for c in shared:  # nobody can tell whose key it is: drop every client that advertised it
                self.mark_faulty(c, f"advertised a public key that clients {sorted(shared)} all advertised")
        u1 = self._viable(set(keys) - self._faulty.keys(), "advertise")
        self._keys = {c: keys[c] for c in u1}
        self._signatures = {c: replies[c]["signature"] for c in u1}
        return self._enter("share", {
            c: self._request("share_request", c, keys={v: self._keys[v] for v in self.graph[c] & u1},
                             signatures={v: self._signatures[v] for v in self.graph[c] & u1})
            for c in u1
        })

    def _after_share(self, replies: dict[int, Message]) -> dict[int, Message]:
        u2 = self._viable(set(replies), "share")
        self._u2 = u2
        inbox: dict[int, dict[int, bytes]] = {c: {} for c in u2}
        for sender in u2:
            for receiver, ct in replies[sender]["ciphertexts"].items():
                if receiver in u2:
                    inbox[receiver][sender] = ct
        return self._enter("check", {
            c: self._request("check_request", c, ciphertexts=inbox[c]) for c in u2
        })

    def _after_check(self, replies: dict[int, Message]) -> dict[int, Message]:
        self.settle_accusations({c: frozenset(m["bad_shares"]) for c, m in replies.items() if m["bad_shares"]})
        kept = self._viable(set(replies) - self._faulty.keys(), "check")
        self._mask_with = {c: self.graph[c] & kept for c in kept}
        if self.chunks is not None:
            self._folder = ChunkFolder(self.chunks, self.ring)
        return self._enter("masked", {
            c: self._request("masked_request", c, mask_with=tuple(sorted(self._mask_with[c])),
                             chunk=self.chunks.size if self.chunks is not None else 0) for c in kept
        })

    def _after_masked(self, replies: dict[int, Message]) -> dict[int, Message]:
        u3 = frozenset(replies)
        self._check_openable(u3, "masked")
        self._u3 = u3
        if self._folder is not None:
            tainted = self._folder.tainted(u3)
            if tainted:  # a stream broke: rebuild its chunks' slices from the complete clients' resends
                self._folder.clear(self.running_sum, tainted)
                self._folder = ChunkFolder(self.chunks, self.ring, wanted=tainted)
                self.resent = tuple(tainted)
                return self._enter("resend", {
                    c: self._request("resend_request", c, chunks=tuple(tainted)) for c in u3
                })
        return self._to_consistency()

    def _after_resend(self, replies: dict[int, Message]) -> dict[int, Message]:
        missing = self._u3 - replies.keys()
        if missing:
            raise AbortError(stage="resend", survivors=len(replies), required=len(self._u3),
                             detail=f"clients {sorted(missing)[:5]} did not resend chunks {list(self.resent)[:5]}: "
                                    f"their inputs are in the rest of the sum, so those slices cannot be rebuilt")
        return self._to_consistency()

    def _to_consistency(self) -> dict[int, Message]:
        self._folder = None
        self._sum = self.take_running_sum()
        return self._enter("consistency", {
            c: self._request("consistency_request", c, survivors=tuple(sorted(self._u3))) for c in self._u3
        })

    def _check_openable(self, u3: frozenset[int], stage: str) -> None:
        """Refuse to unmask a survivor set from which the server and c colluders could learn an input
        or a sum over fewer than g honest clients."""
        if len(u3) < self.min_clients:
            raise AbortError(stage=stage, survivors=len(u3), required=self.min_clients)
        for c in u3:  # a survivor with too few live partners cannot be unmasked safely
            if len(self._mask_with[c] & u3) < self.partners:
                raise AbortError(stage=stage, survivors=len(u3), required=self.min_clients,
                                 detail=f"client {c} has fewer than {self.partners} live masking partners")
        if not is_connected({c: self._mask_with[c] for c in u3}, u3):
            raise AbortError(stage=stage, survivors=len(u3), required=self.min_clients,
                             detail="survivors' masking graph is disconnected: partial sums would leak")
        if self.half is not None:
            cut = smallest_isolable_group(order=self.order, half=self.half, survivors=u3,
                                          colluders=self.floors.colluders, min_group=self.floors.min_group)
            if cut is not None:
                raise AbortError(stage=stage, survivors=len(u3), required=self.min_clients,
                                 detail=f"{self.floors.colluders} colluders could cut survivors {list(cut)[:8]} "
                                        f"out of the sum (a group below {self.floors.min_group} honest clients)")

    def _after_consistency(self, replies: dict[int, Message]) -> dict[int, Message]:
        signed = frozenset(replies)
        if len(signed) < self.threshold:
            raise AbortError(stage="consistency", survivors=len(signed), required=self.threshold,
                             detail="too few survivors signed the survivor set")
        self._survivor_signatures = {c: m["signature"] for c, m in replies.items()}
        return self._enter("unmask", {
            c: self._request("unmask_request", c, signatures={
                v: self._survivor_signatures[v] for v in (self.graph[c] & signed)})
            for c in signed
        })

    def layer_index(self) -> int:
        """Highest noise layer the survivors reveal (-1: none, or no layers)."""
        return self.layers.reveal_index(len(self._u3)) if self.layers else -1

    def _unmask_sets(self, c: int) -> tuple[frozenset[int], frozenset[int]]:
        """(neighbours c masked with that survived, neighbours c masked with that dropped before masking)."""
        masked_with = self._mask_with.get(c, frozenset())
        return masked_with & self._u3, masked_with - self._u3

    def _after_unmask(self, replies: dict[int, Message]) -> dict[int, Message]:
        responders = set(replies)
        acc = self._sum
        assert acc is not None
        # A client dropped after the check: its masking key is rebuilt for the survivors that masked with it.
        masked_with_dropped = {v: self._mask_with[v] & self._u3 for v in self._mask_with.keys() - self._u3}
        dropped = frozenset(v for v, us in masked_with_dropped.items() if us)
        seeds = self._reconstruct(replies, responders, self._u3, "seed_shares")
        sks = self._reconstruct(replies, responders, dropped, "key_shares")
        index = self.layer_index()
        own = self.excess_from  # survivors that sent their own excess
        layers = self._reconstruct(replies, responders, self._u3 - own, "layer_shares") if index >= 0 else {}
        masks = [(_self_mask_key(self.round_id, u, seed), -1) for u, seed in seeds.items()]
        for v, sk in sks.items():
            pair = KeyPair.from_private_bytes(shamir.to_bytes(sk))
            for u in masked_with_dropped[v]:
                key = crypto.agree(pair, self._keys[u][crypto.PUBLIC_KEY_BYTES:], _mask_info(self.round_id, u, v))
                # u added sign(u, v) * PRG(s_uv); take it back out.
                masks.append((key, -_sign(u, v)))
        # One pass over the sum for all the masks, in place, its windows side by side on the server's cores.
        apply_masks_(acc, masks, self.ring, threads=thread_cap())
        self._result = dataclasses.replace(self._finish(acc, self._u3), layer_index=index, layer_secrets=layers,
                                           layer_excess=self.excess_sum)
        self.excess_sum = None
        self._sum = None
        return {}

    def _reconstruct(self, replies: dict[int, Message], responders: set[int], owners: frozenset[int],
                     field: str) -> dict[int, int]:
        """Shamir-reconstruct one secret per owner from every share that came back, batching owners
        that share holders. Shares beyond the threshold are cross-checked (Reed–Solomon): wrong ones
        are corrected where the redundancy allows and their senders recorded as faulty; a secret that
        cannot be rebuilt correctly aborts the round rather than open a wrong sum."""
        by_holders: dict[tuple[int, ...], list[int]] = {}
        for u in sorted(owners):  # deterministic: an abort names the lowest client it cannot unmask
            holders = sorted((self.graph[u] | {u}) & responders)
            holders = [h for h in holders if u in replies[h][field]]
            if len(holders) < self.threshold:
                raise AbortError(stage="unmask", survivors=len(holders), required=self.threshold,
                                 detail=f"not enough shares to unmask client {u}")
            by_holders.setdefault(tuple(holders), []).append(u)
        out: dict[int, int] = {}
        liars: dict[int, set[int]] = {}
        for holders, us in by_holders.items():
            rows = [[shamir.from_bytes(replies[h][field][u]) for h in holders] for u in us]
            try:
                values, bad = reed_solomon.decode_many(list(holders), rows, k=self.threshold, prime=shamir.PRIME)
            except reed_solomon.UncorrectableError as exc:
                raise AbortError(stage="unmask", survivors=len(holders), required=self.threshold,
                                 detail=f"unmasking shares of clients {sorted(us)[:5]} disagree beyond correction: {exc}"
                                 ) from exc
            for u, secret, wrong in zip(us, values, bad):
                out[u] = secret
                for i in wrong:  # indices into holders
                    liars.setdefault(holders[i], set()).add(u)
        for h, us in sorted(liars.items()):
            self.mark_faulty(h, f"sent wrong {field.replace('_', ' ')} for clients {sorted(us)[:5]} (corrected): "
                                f"they disagree with the other holders' (it lied, or the client that dealt them did)")
        return out

    def result(self) -> RoundResult:
        if self._result is None:
            raise RuntimeError("round not finished")
        return self._result

    def max_reply_bytes(self) -> int:
        """The largest reply: a masked vector with its bad-share list, or one entry per neighbour
        (keys: 8 bytes, lengths: 4) of sealed shares or of two unmasking shares."""
        k = max((len(v) for v in self.graph.values()), default=0)
        per_neighbour = max(self.share_bytes + 12, 3 * (shamir.SECRET_BYTES + 12))
        # a whole vector travels in one message unless the input is chunked and no excess noise is sent
        vector = self.length if self.chunks is None or self.layers is not None else self.chunks.size
        return 4 * vector + 8 * k + k * per_neighbour + (64 << 10)  # an unmasking reply: shares (+ excess)


class SecAggServer(SecAggPlusServer):
    """SecAgg: every client masks with every other (complete graph)."""

    name = "secagg"

    def __init__(self, *, round_id: int, clients: Sequence[int], length: int, ring: Ring = RING_2_32,
                 threshold_fraction: float = 0.5, min_clients: int = 2, colluders: int = 0,
                 roster: Roster | None = None, noise_layers: LayerSpec | None = None,
                 chunk: int | str | None = "auto", max_streams: int | None = None) -> None:  # complete graph
        super().__init__(round_id=round_id, clients=clients, length=length, ring=ring, degree=None,
                         threshold_fraction=threshold_fraction, min_clients=min_clients, colluders=colluders,
                         roster=roster, noise_layers=noise_layers, chunk=chunk, max_streams=max_streams)

    def _make_graph(self, degree: int) -> dict[int, frozenset[int]]:
        return complete_graph(self.clients)


# ---- client -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ClientPolicy:
    """What a client accepts from the server before it reveals anything."""

    min_threshold_fraction: float = 0.5
    """Refuse a threshold t <= this fraction of the neighbourhood: a lower t would let a server that
    lies about who dropped collect both a client's self-mask seed and its masking key."""
    max_neighbours: int = 4096
    min_colluders: int = 0
    """Refuse a round that withstands fewer colluding clients than this."""
    min_group: int = 1
    """Refuse a round that would open sums over fewer honest clients than this."""


class SecAggPlusClient(ClientProtocol):
    name = "secagg+"
    schemas = {s.kind: s for s in (ADVERTISE_REQUEST, SHARE_REQUEST, CHECK_REQUEST, MASKED_REQUEST,
                                   RESEND_REQUEST, CONSISTENCY_REQUEST, UNMASK_REQUEST)}

    def __init__(self, *, client_id: int, round_id: int, input_fn: InputFn, max_length: int = MAX_LEN,
                 policy: ClientPolicy = ClientPolicy(), identity: Identity | None = None,
                 noise_layers: LayerSecrets | None = None) -> None:
        """`identity` (from enrolment): sign this client's key advertisement and accept a neighbour's
        keys only with a valid signature from its enrolled key; without it, trust the server's relay.
        `noise_layers`: this client's removable-noise layer secrets (XNoise), shared with its
        unmasking shares; it reveals layer j only for the j its own spec gives for the signed
        survivor set, whatever the server asks."""
        super().__init__(client_id=client_id, round_id=round_id, input_fn=input_fn, max_length=max_length)
        if identity is not None and identity.client_id != client_id:
            raise ValueError(f"identity of client {identity.client_id} given to client {client_id}")
        self.policy = policy
        self.identity = identity
        self.noise_layers = noise_layers
        self.layer_count = noise_layers.spec.count if noise_layers else 0
        self.ring = RING_2_32
        self._stream: tuple[ChunkPlan, np.ndarray, list[tuple[bytes, int]]] | None = None
        """A chunked masked input: its plan, the input and the masks (kept until the survivor set)."""

    def first_kind(self) -> str:
        return "advertise_request"

    def respond(self, msg: Message):
        return getattr(self, f"_on_{msg.kind}")(msg)

    def _on_advertise_request(self, msg: Message):
        nbrs = frozenset(msg["neighbours"])
        t = msg["threshold"]
        if self.client_id in nbrs:
            raise ProtocolError("neighbour list contains the client itself")
        if len(nbrs) > self.policy.max_neighbours:
            raise ProtocolError("too many neighbours")
        if msg["length"] > self.max_length:
            raise ProtocolError("requested vector length exceeds this client's limit")
        if msg["layers"] != self.layer_count:
            raise ProtocolError(f"the round announces {msg['layers']} noise layers; this client holds {self.layer_count}")
        size = len(nbrs) + 1
        if t > size or t <= self.policy.min_threshold_fraction * size:
            raise ProtocolError(f"threshold {t} unsafe for a neighbourhood of {size}")
        floors = Floors(colluders=msg["colluders"], min_group=msg["min_group"])
        floors.check_policy(min_colluders=self.policy.min_colluders, min_group=self.policy.min_group)
        if floors.colluders >= t:
            raise ProtocolError(f"{floors.colluders} colluders would reach the threshold {t}")
        self.length, self.threshold, self.neighbours, self.floors = msg["length"], t, nbrs, floors
        self.partners = max(t - 1, floors.partners)
        # The masking key's private scalar is drawn from the Shamir field so it can be shared whole.
        self.s_secret = shamir.random_element()
        self.c_pair, self.s_pair = KeyPair.generate(), KeyPair.from_private_bytes(shamir.to_bytes(self.s_secret))
        keys = self.c_pair.public_bytes + self.s_pair.public_bytes
        signature = (self.identity.signing_key.sign(advertisement(SIGNED_AS, self.round_id, self.client_id, keys))
                     if self.identity is not None else b"")
        return self._reply("advertise_keys", keys=keys, signature=signature), ("share_request",)

    def _on_share_request(self, msg: Message):
        keys: dict[int, bytes] = dict(msg["keys"])
        if not set(keys) <= self.neighbours:
            raise ProtocolError("share request names clients that are not neighbours")
        if len(keys) + 1 < self.threshold:
            raise ProtocolError(f"only {len(keys)} neighbours left, threshold {self.threshold}")
        halves = [k[i:i + crypto.PUBLIC_KEY_BYTES] for k in keys.values() for i in (0, crypto.PUBLIC_KEY_BYTES)]
        halves += [self.c_pair.public_bytes, self.s_pair.public_bytes]
        if len(set(halves)) != len(halves):
            raise ProtocolError("repeated public keys")
        if self.identity is not None:
            signatures = msg["signatures"]
            forged = sorted(v for v, k in keys.items() if not self.identity.roster.verify(
                v, signatures.get(v, b""), advertisement(SIGNED_AS, self.round_id, v, k)))
            if forged:
                raise ProtocolError(f"keys relayed for clients {forged[:5]} are not signed by their enrolled keys: "
                                    f"the server substituted or altered them")
        holders = sorted(keys) + [self.client_id]
        share_keys = {v: self._agree(self.c_pair, keys[v][: crypto.PUBLIC_KEY_BYTES], _share_key_info(self.round_id, self.client_id, v))
                      for v in holders[:-1]}
        seed = shamir.random_element()
        layer_secrets = list(self.noise_layers.secrets) if self.noise_layers else []
        rows = shamir.split([seed, self.s_secret, *layer_secrets], xs=holders, threshold=self.threshold)
        plains = [b"".join(shamir.to_bytes(row[i]) for row in rows) for i in range(len(holders))]
        cts = {v: crypto.seal(share_keys[v], plains[i], _share_aad(self.round_id, self.client_id, v))
               for i, v in enumerate(holders[:-1])}
        self.seed, self.own_shares = seed, _split_plain(plains[-1])
        self.peer_keys = keys
        return self._reply("shares", ciphertexts=cts), ("check_request",)

    def _on_check_request(self, msg: Message):
        cts: dict[int, bytes] = dict(msg["ciphertexts"])
        if not set(cts) <= set(self.peer_keys):
            raise ProtocolError("ciphertexts from clients whose keys were not announced")
        if len(cts) + 1 < self.threshold:
            raise ProtocolError(f"only {len(cts)} neighbours shared, threshold {self.threshold}")
        held: dict[int, tuple[bytes, ...]] = {}
        bad: list[int] = []
        size = share_ciphertext_bytes(self.layer_count)
        if any(len(ct) != size for ct in cts.values()):
            raise ProtocolError(f"relayed ciphertexts of the wrong size (expected {size} bytes)")
        for u, ct in cts.items():
            key = self._agree(self.c_pair, self.peer_keys[u][: crypto.PUBLIC_KEY_BYTES],
                              _share_key_info(self.round_id, self.client_id, u))
            try:
                pieces = _split_plain(crypto.open_sealed(key, ct, _share_aad(self.round_id, u, self.client_id)))
                for piece in pieces:
                    shamir.from_bytes(piece)
            except (DecryptionError, ValueError):
                bad.append(u)  # reported, not fatal: the server drops u as if it went silent
                continue
            held[u] = pieces
        self.held = held
        return self._reply("share_check", bad_shares=tuple(sorted(bad))), ("masked_request",)

    def _on_masked_request(self, msg: Message):
        mask_with = frozenset(msg["mask_with"])
        if not mask_with <= self.held.keys():
            raise ProtocolError("masked request names clients whose shares this client does not hold")
        if len(mask_with) < self.partners:
            raise ProtocolError(f"only {len(mask_with)} neighbours to mask with, {self.partners} needed "
                                f"(threshold {self.threshold}, {self.floors.colluders} colluders)")
        chunk = msg["chunk"]
        if 0 < chunk < MIN_CHUNK and chunk < self.length:
            raise ProtocolError(f"chunks of {chunk} values: fewer than {MIN_CHUNK}, this client's floor")
        mask_keys = {v: self._agree(self.s_pair, self.peer_keys[v][crypto.PUBLIC_KEY_BYTES:],
                                    _mask_info(self.round_id, self.client_id, v)) for v in mask_with}
        masks = [(_self_mask_key(self.round_id, self.client_id, self.seed), 1),
                 *((key, _sign(self.client_id, v)) for v, key in mask_keys.items())]
        x = self._input(self.length, self.ring)
        self.masked_with = mask_with
        if 0 < chunk < self.length:  # chunk by chunk, each masked when the driver asks for it
            self._stream = (ChunkPlan(self.length, chunk), x, masks)
            return (_masked_chunks(self, *self._stream, range(self._stream[0].count)),
                    ("resend_request", "consistency_request"))
        y = apply_masks_(np.empty_like(x), masks, self.ring, source=x)
        return self._reply("masked_input", vector=y), ("consistency_request",)

    def _on_resend_request(self, msg: Message):
        """Chunks sent before, again (the server rebuilds slices a broken stream tainted): the same values,
        from the same input and masks, so they tell the server nothing it was not sent already."""
        plan = self._stream[0]
        chunks = msg["chunks"]
        if not chunks or any(i >= plan.count for i in chunks):
            raise ProtocolError(f"resend asks for chunks {list(chunks)[:5]} of an input in {plan.count} chunks")
        return _masked_chunks(self, *self._stream, sorted(chunks)), ("consistency_request",)

    @staticmethod
    def _agree(own: KeyPair, peer_public: bytes, info: bytes) -> bytes:
        try:
            return crypto.agree(own, peer_public, info)
        except ValueError as exc:
            raise ProtocolError("peer public key is invalid (low order)") from exc

    def _on_consistency_request(self, msg: Message):
        survivors = tuple(sorted(set(msg["survivors"])))
        if self.client_id not in survivors:
            raise ProtocolError("the survivor set leaves out this client, whose masked input was sent")
        if len(survivors) < max(self.floors.survivors, self.threshold):
            raise ProtocolError(f"only {len(survivors)} survivors: fewer than {self.floors.min_group} honest "
                                f"clients besides {self.floors.colluders} colluders")
        alive = self.masked_with & frozenset(survivors)
        if len(alive) < self.partners:
            raise ProtocolError(f"only {len(alive)} of the clients this client masked with survived, "
                                f"{self.partners} needed: its input would not be hidden among honest ones")
        self.survivors, self.alive = survivors, alive
        self._stream = None  # no chunk is sent after the survivor set: the input may go
        signature = sign_survivors(self.identity, SIGNED_AS, self.round_id, survivors)
        return self._reply("survivor_signature", signature=signature), ("unmask_request",)

    def _on_unmask_request(self, msg: Message):
        require_signatures(self.identity, protocol=SIGNED_AS, round_id=self.round_id, survivors=self.survivors,
                           signatures=msg["signatures"], eligible=self.neighbours & set(self.survivors),
                           needed=self.threshold)
        alive = self.alive
        dropped = self.masked_with - alive
        seed_shares = {u: self.held[u][0] for u in alive}
        seed_shares[self.client_id] = self.own_shares[0]
        key_shares = {v: self.held[v][1] for v in dropped}
        # XNoise: the layer this client's OWN spec gives for the signed survivor set, never the server's word.
        index = self.noise_layers.spec.reveal_index(len(self.survivors)) if self.noise_layers else -1
        layer_shares = {u: self.held[u][2 + index] for u in alive} if index >= 0 else {}
        if index >= 0:
            layer_shares[self.client_id] = self.own_shares[2 + index]
        self.held = {}
        excess = self.noise_layers.excess(index) if index >= 0 and self.noise_layers.excess else np.zeros(0, np.uint32)
        return self._reply("unmask_shares", seed_shares=seed_shares, key_shares=key_shares,
                           layer_shares=layer_shares, layer_index=index, excess=excess), ()


def _masked_chunks(client: SecAggPlusClient, plan: ChunkPlan, x: np.ndarray, masks: list[tuple[bytes, int]],
                   indices) -> Iterator[Message]:
    """`client`'s masked chunks `indices`, each masked with its window of every keystream when asked for:
    the client never holds a masked copy of its input, and sending one chunk overlaps masking the next.
    Chunks in order continue the keystreams (one AES context per mask for the whole upload)."""
    stream = MaskStream(masks, client.ring)
    for index in indices:
        start, end = plan.bounds(index)
        y = np.empty(end - start, dtype=np.uint32)
        stream.apply_(y, offset=start, source=x[start:end])
        yield client._reply("masked_chunk", index=index, vector=y)


class SecAggClient(SecAggPlusClient):
    name = "secagg"
