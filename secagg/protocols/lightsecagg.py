"""LightSecAgg (So et al., MLSys 2022): one-shot recovery of the aggregate mask by Lagrange coding.

Parties: N clients (the roster, ordered by id; client at roster position j holds coded piece j),
target survivors U (the round finishes if at least U clients survive every stage, so up to N - U
may drop), privacy T (1 <= T < U <= N). Vectors live in F_p, p = 2^31 - 1, uint32 on the wire.

    advertise     client i -> server: a fresh X25519 public key pk_i.
    share         server -> clients: the advertised keys.  Client i draws its mask z_i uniformly
                  from the OS CSPRNG, Lagrange-encodes it (U - T data pieces + T random pieces,
                  `secagg.lcc`) into coded pieces [~z_i]_j, keeps [~z_i]_i and sends every other
                  [~z_i]_j SEALED to j: AES-256-GCM under HKDF(X25519(sk_i, pk_j)), with the round,
                  stage, sender and receiver as associated data. The server relays ciphertext only.
    check         server -> client j: the ciphertexts addressed to j. Client j opens them and
                  names the senders of any that fail to open (`bad_pieces`, usually empty).
                  Share and check run in parts when the pieces are large: each message carries the
                  pieces of one group of peers, at most max(4 d, 16 MiB) bytes (`part_size`), so no
                  message is the (N - 1) pieces of about 8 d bytes it would otherwise be. A client
                  must answer every part; one that misses a part is dropped like a silent one.
    masked_input  server -> the clients left once the accusations are settled: client j uploads
                  y_j = x_j + z_j (mod p), 4 bytes per coordinate. No client can be dropped after
                  this stage's replies are accepted, so the server adds each y_j into a running sum
                  as it arrives and holds O(d) of inputs, not O(N d).
    consistency   server -> U1 (clients whose y arrived; abort if |U1| < max(U, g + c)): the set U1.
                  Each client checks it and signs it with its enrolled key (`consistency.py`).
    recovery      server -> the signers: U1 and the signatures. Each client j checks at least U
                  valid signatures over the same U1, then returns sum_{i in U1} [~z_i]_j. From any
                  U of these the server decodes sum_{i in U1} z_i and outputs sum_{i in U1} y_i -
                  sum_{i in U1} z_i; pieces beyond U are cross-checked as a Reed–Solomon code
                  (`secagg.reed_solomon`): a wrong piece is located, its sender named in
                  `RoundResult.faulty`, and the sum decoded without it (or the round aborts).

Security (honest-but-curious server, which also relays every client-to-client message):
  * the server learns only sum_{i in U1} x_i: each y_i is one-time padded by a uniform z_i, and the
    only information about masks it sees is coded pieces of the SUM over U1 (the pieces of
    individual masks reach it encrypted to their receivers; compare FedML, which relays them in
    plaintext so the server can decode every mask from U of them);
  * any T colluding clients learn nothing about another client's mask: T coded pieces of z_i are
    independent of z_i (T-privacy of the Lagrange code). The paper proves the stronger statement
    that the server colluding with up to T clients learns nothing beyond the sum over U1;
  * every message is validated (kinds, sizes, ranges, addressees, consistency of the announced
    set); a client answers each stage once, so a server cannot obtain aggregate pieces for two
    different survivor sets.
Faulty clients are isolated, not fatal: a reply that fails validation (a low-order public key, a
wrong piece set, a vector outside F_p) drops its sender at that stage. A sealed piece that fails
authentication (or is not in F_p) at its receiver j cannot be judged by the server, so j names the
sender in its check reply (`bad_pieces`) and goes on; the server drops both ends of each
accusation of a maximal matching (`base.accusation_matching`: an accusation never costs more
honest seats than colluding ones) before it asks for masked inputs, so every member of U1 holds a
piece from every other. (Until 2026-11-29 the accusations came with the masked inputs, so the
server had to hold all N of them until they were settled: an accusation could drop a client whose
input had already arrived, and a folded input cannot be taken back out.) Two clients advertising
the same key are both dropped. With c colluders (c <= T) the server opens U1 only if
|U1| >= g + c, and each client checks that before it signs, so no sum over fewer than g honest
clients is opened. A server announcing different survivor sets to
different clients needs U signatures on each (the consistency stage, enrolled runs).
Substituted public keys are caught when clients are enrolled (`identity`: each client signs its
key and checks every peer's signature against the roster); without enrolment the clients trust
the server's relay of keys and of the survivor set.
Removable noise layers (XNoise, `secagg.noise_layers`, for dropout-exact distributed DP): with
`noise_layers`, each client also Shamir-shares its L layer secrets (threshold T + 1, so T colluders
learn nothing) inside the sealed piece it sends every other client; in recovery each survivor also
returns its share of the link its OWN spec gives for U1 of every member of U1, and the server
rebuilds those links (cross-checked as Reed–Solomon codewords) into `RoundResult.layer_secrets`.
Simplification relative to the paper: the offline (share) stage runs inside the round rather than
ahead of it and in parallel with training; the check stage is ours (the paper assumes honest
relays and clients that do not lie about pieces); the protocol is otherwise the paper's.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from secagg import crypto, reed_solomon, shamir
from secagg.crypto import DecryptionError, KeyPair, agree, context, open_sealed, seal
from secagg.identity import SIGNATURE_BYTES, Identity, Roster, advertisement
from secagg.lcc import KeyedNoise, LagrangeCode, betas
from secagg.messages import AbortError, Array, Bytes, BytesMap, Int, IntList, Message, ProtocolError, Schema
from secagg.noise_layers import MAX_LAYERS, LayerSecrets, LayerSpec
from secagg.prg import random_vector
from secagg.protocols.base import MAX_VECTOR_LENGTH, ClientProtocol, InputFn, RoundResult, ServerProtocol
from secagg.protocols.consistency import Floors, require_signatures, sign_survivors, survivor_statement
from secagg.protocols.relay import CLIENT_SPILL_FROM, SPILL_FROM, LazyRequests, RowStore, SealedStore, spills
from secagg.ring import FIELD_P31, MERSENNE_31, Ring

NAME = "lightsecagg"
MAX_LEN = MAX_VECTOR_LENGTH
MAX_CLIENTS = 10_000
SEAL_OVERHEAD = crypto.NONCE_BYTES + crypto.TAG_BYTES
WINDOW_BYTES = 64 << 20
"""Paced stages (`send_window`): the large messages a server asks for, or sends, at a time (64 MiB; at
least two requests, or one masked input at a time when one is larger)."""
UNMASK_BLOCK = 1 << 16
"""Columns of the aggregate pieces decoded at a time when the server removes the aggregate mask."""
PART_FLOOR = 16 << 20
"""Sealed pieces travel in parts of at most max(4 d, 16 MiB) bytes a message (`part_size`)."""
_MAX_BLOB = 4 * MAX_LEN + MAX_LAYERS * shamir.SECRET_BYTES + SEAL_OVERHEAD

# server -> client requests
SETUP = Schema("lsa_setup", {
    "length": Int(1, MAX_LEN), "modulus": Int(3, 1 << 32), "roster": IntList(MAX_CLIENTS, 1),
    "target": Int(2, MAX_CLIENTS), "privacy": Int(1, MAX_CLIENTS),
    "colluders": Int(0, MAX_CLIENTS), "min_group": Int(1, MAX_CLIENTS), "layers": Int(0, MAX_LAYERS),
})
KEYS = Schema("lsa_keys", {"keys": BytesMap(MAX_CLIENTS, crypto.PUBLIC_KEY_BYTES, exact=True),
                           "signatures": BytesMap(MAX_CLIENTS, SIGNATURE_BYTES),
                           "receivers": IntList(MAX_CLIENTS, 1)})
"""`receivers`: whose sealed pieces the reply carries (the first part; `MORE_PIECES` asks for the rest)."""
MORE_PIECES = Schema("lsa_more_pieces", {"receivers": IntList(MAX_CLIENTS, 1)})
RELAY = Schema("lsa_relay", {"pieces": BytesMap(MAX_CLIENTS, _MAX_BLOB)})
INPUT_REQUEST = Schema("lsa_input_request", {})
SURVIVORS = Schema("lsa_survivors", {"survivors": IntList(MAX_CLIENTS, 1)})
RECOVER = Schema("lsa_recover", {"survivors": IntList(MAX_CLIENTS, 1),
                                 "signatures": BytesMap(MAX_CLIENTS, SIGNATURE_BYTES)})
# client -> server replies, by stage
PUBLIC_KEY = Schema("lsa_public_key", {"public_key": Bytes(crypto.PUBLIC_KEY_BYTES, exact=True),
                                       "signature": Bytes(SIGNATURE_BYTES)})
CODED_PIECES = Schema("lsa_coded_pieces", {"pieces": BytesMap(MAX_CLIENTS, _MAX_BLOB)})
PIECE_CHECK = Schema("lsa_piece_check", {"bad_pieces": IntList(MAX_CLIENTS, 1)})
MASKED_INPUT = Schema("lsa_masked_input", {"vector": Array("uint32", MAX_LEN)})
SURVIVOR_SIGNATURE = Schema("lsa_survivor_signature", {"signature": Bytes(SIGNATURE_BYTES)})
AGGREGATE_PIECE = Schema("lsa_aggregate_piece", {
    "piece": Array("uint32", MAX_LEN),
    "layer_shares": BytesMap(MAX_CLIENTS, shamir.SECRET_BYTES, exact=True),
    "layer_index": Int(-1, MAX_LAYERS - 1),
    "excess": Array("uint32", MAX_LEN),
})


def _piece_key_info(round_id: int, a: int, b: int) -> bytes:
    return context(NAME, "piece-key", round_id, min(a, b), max(a, b))


def _piece_aad(round_id: int, sender: int, receiver: int) -> bytes:
    return context(NAME, round_id, "share", sender, receiver)


def resolve_count(value: int | float, n: int, *, name: str, rounding: Callable[[float], int]) -> int:
    """An absolute count from an int, or from a fraction of n in (0, 1] rounded by `rounding`."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int or a fraction, not bool")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and 0.0 < value <= 1.0:
        return int(rounding(value * n))
    raise ValueError(f"{name} must be an int or a fraction in (0, 1], got {value!r}")


def _layer_pieces(raw: bytes) -> tuple[bytes, ...]:
    """Layer shares from their concatenation (each a valid field element, else ValueError)."""
    if len(raw) % shamir.SECRET_BYTES:
        raise ValueError("layer shares of the wrong size")
    pieces = tuple(raw[i:i + shamir.SECRET_BYTES] for i in range(0, len(raw), shamir.SECRET_BYTES))
    for p in pieces:
        shamir.from_bytes(p)
    return pieces


def _check_parameters(n: int, target: int, privacy: int) -> None:
    if not 1 <= privacy < target <= n:
        raise ValueError(f"need 1 <= privacy T < target survivors U <= N; got T={privacy}, U={target}, N={n}")


class LightSecAggServer(ServerProtocol):
    """Server of one LightSecAgg round; `result().ring_sum` is the sum over the committed set U1."""

    name = NAME
    release_buffers = True  # sealed pieces, inputs and aggregate pieces of several MB come and go each round
    schemas = {"advertise": PUBLIC_KEY, "share": CODED_PIECES, "check": PIECE_CHECK, "masked_input": MASKED_INPUT,
               "consistency": SURVIVOR_SIGNATURE, "recovery": AGGREGATE_PIECE}

    def __init__(self, *, round_id: int, clients: Sequence[int], length: int, ring: Ring = FIELD_P31,
                 target_survivors: int | float = 0.8, privacy: int | float = 0.5, colluders: int = 0,
                 min_group: int = 1, roster: Roster | None = None, noise_layers: LayerSpec | None = None,
                 spill: bool | str = "auto", pace: bool = True) -> None:
        """`colluders` (c <= T) and `min_group` (g): the round is opened only with at least g + c
        survivors. `roster`: enrolled clients' verify keys; with it, an unsigned or wrongly signed key
        advertisement (or survivor signature) drops its sender at once (clients check every
        signature themselves anyway). `noise_layers`: removable noise layers (XNoise) whose secrets
        the clients share with their pieces; revealed ones come back in `RoundResult.layer_secrets`.
        `spill`: keep the sealed pieces between the share and check stages, and the aggregate pieces at
        recovery, in unlinked temporary files instead of memory (`relay.SealedStore`, `relay.RowStore`;
        "auto": each when it exceeds `relay.SPILL_FROM` bytes), and
        build each client's relay only when a driver sends it, so the server holds O(d) of them. `pace`:
        ask drivers to pace the stages with large messages (`send_window`)."""
        super().__init__(round_id=round_id, clients=clients, length=length, ring=ring)
        if spill not in (True, False, "auto"):
            raise ValueError(f"spill must be True, False or 'auto', got {spill!r}")
        self.spill, self.pace = spill, bool(pace)
        self.roster = roster
        self.layers = noise_layers
        if ring.modulus != MERSENNE_31:
            raise ValueError("LightSecAgg codes masks over F_p with p = 2^31 - 1; use FIELD_P31")
        n = len(self.clients)
        if n > MAX_CLIENTS:
            raise ValueError(f"at most {MAX_CLIENTS} clients per round")
        self.target = resolve_count(target_survivors, n, name="target_survivors", rounding=math.ceil)
        self.privacy = max(1, resolve_count(privacy, n, name="privacy", rounding=math.floor))
        _check_parameters(n, self.target, self.privacy)
        self.floors = Floors(colluders=int(colluders), min_group=int(min_group))
        if self.floors.colluders > self.privacy:
            raise ValueError(f"colluders={colluders} exceeds the privacy T={self.privacy}: that many clients "
                             "could decode another client's mask from their coded pieces")
        self.min_survivors = max(self.target, self.floors.survivors)
        """Fewest survivors the round may be opened with: U, and g honest besides c colluders."""
        self.code = LagrangeCode(num_coded=n, num_nodes=self.target, privacy=self.privacy, length=length)
        self.position = {c: j for j, c in enumerate(self.clients)}
        self.blob_bytes = 4 * self.code.piece_length + self._layer_count() * shamir.SECRET_BYTES + SEAL_OVERHEAD
        self.part_size = max(1, max(4 * length, PART_FLOOR) // self.blob_bytes)
        """Sealed pieces per message in the share and check stages."""
        self._groups: list[tuple[int, ...]] = []   # share: receivers, check: senders, cut into `part_size` parts
        self._part = 0                             # the share or check part being run
        self._senders: list[int] = []              # clients whose every share part arrived
        self._accused: dict[int, set[int]] = {}    # accusations of every check part so far
        self._keys: dict[int, bytes] = {}
        self._relayed_to: dict[int, frozenset[int]] = {}   # receiver -> senders of the pieces relayed to it
        self._store: SealedStore | None = None
        self._coded: RowStore | None = None
        """Recovery: the accepted aggregate pieces, one row per asked helper in id order (`_rows`); spilled
        to an unlinked file like the relay store."""
        self._rows: dict[int, int] = {}
        self._survivors: tuple[int, ...] = ()
        self._signatures: dict[int, bytes] = {}
        self._masked_sum: np.ndarray | None = None
        self._result: RoundResult | None = None

    # ---- requests ---------------------------------------------------------------------------
    def start(self) -> dict[int, Message]:
        if self.stage != "init":
            raise RuntimeError("the round has already started")
        setup = dict(length=self.length, modulus=self.ring.modulus, roster=self.clients,
                     target=self.target, privacy=self.privacy, colluders=self.floors.colluders,
                     min_group=self.floors.min_group, layers=self._layer_count())
        return self._enter("advertise", {c: self._request(SETUP.kind, c, **setup) for c in self.clients})

    def check_reply(self, msg: Message) -> None:
        if self.stage == "advertise":
            if not crypto.is_valid_public_key(msg["public_key"]):
                raise ProtocolError(f"client {msg.sender} advertised an invalid (low-order) public key")
            if self.roster is not None and not self.roster.verify(
                    msg.sender, msg["signature"], advertisement(NAME, self.round_id, msg.sender, msg["public_key"])):
                raise ProtocolError(f"client {msg.sender}'s key advertisement is not signed by its enrolled key")
        elif self.stage == "share":
            pieces = msg["pieces"]
            if set(pieces) != set(self._groups[self._part]) - {msg.sender}:
                raise ProtocolError(f"client {msg.sender} must send one piece to every other advertised client of "
                                    f"part {self._part}")
            if any(len(b) != self.blob_bytes for b in pieces.values()):
                raise ProtocolError(f"sealed pieces are {self.blob_bytes} bytes")
        elif self.stage == "check":
            if not set(msg["bad_pieces"]) <= set(self._groups[self._part]) & self._relayed_to.get(msg.sender, frozenset()):
                raise ProtocolError(f"client {msg.sender} reports bad pieces from clients that sent it none")
        elif self.stage == "masked_input":
            self._check_vector(msg["vector"], self.length)
        elif self.stage == "consistency":
            if self.roster is not None and not self.roster.verify(
                    msg.sender, msg["signature"], survivor_statement(NAME, self.round_id, self._survivors)):
                raise ProtocolError(f"client {msg.sender}'s signature over the survivor set is not valid")
        elif self.stage == "recovery":
            self._check_vector(msg["piece"], self.code.piece_length)
            index = self.layer_index()
            if msg["layer_index"] != index or set(msg["layer_shares"]) != (set(self._survivors) if index >= 0 else set()):
                raise ProtocolError(f"client {msg.sender} revealed noise layer {msg['layer_index']} for "
                                    f"{len(msg['layer_shares'])} clients; {len(self._survivors)} survivors remove up "
                                    f"to layer {index}")
            self.check_excess(msg, index)
            try:
                for b in msg["layer_shares"].values():
                    shamir.from_bytes(b)
            except ValueError as exc:
                raise ProtocolError(str(exc)) from exc

    def accept(self, msg: Message) -> None:
        """As `ServerProtocol.accept`; a masked input is folded into the running sum at once (no client
        is dropped after that stage), and a recovery reply's own excess noise (XNoise) too."""
        super().accept(msg)
        if self.stage == "share":  # the pieces wait in the relay store (spilled past its threshold)
            self._store.put(msg.sender, msg["pieces"])
            self._replies[msg.sender] = Message(kind=msg.kind, round=msg.round, sender=msg.sender, receiver=msg.receiver)
        elif self.stage == "masked_input":
            self.fold_input(msg)
        elif self.stage == "recovery":
            self.fold_excess(msg)
            self._keep_piece(msg)

    def on_stage_complete(self, replies: dict[int, Message]) -> dict[int, Message]:
        handler = {"advertise": self._after_advertise, "share": self._after_share, "check": self._after_check,
                   "masked_input": self._after_masked_input, "consistency": self._after_consistency,
                   "recovery": self._after_recovery}[self.stage]
        return handler(replies)

    def result(self) -> RoundResult:
        if self._result is None:
            raise RuntimeError("round not finished")
        return self._result

    def _layer_count(self) -> int:
        return self.layers.count if self.layers else 0

    def layer_index(self) -> int:
        """Highest noise layer the survivors reveal (-1: none, or no layers)."""
        return self.layers.reveal_index(len(self._survivors)) if self.layers else -1

    # ---- stages -----------------------------------------------------------------------------
    def quorum(self) -> int:
        """Half the expected replies, and never fewer than the round's minimum: a driver may close the
        stage once these arrived and a grace derived from their speed passed (a staller then counts as
        dropped). Half, not the minimum alone, so that honest clients answering one after another on a
        loaded machine (about as long for the second half as for the first) are not cut off."""
        return min(len(self._expected), max(self.min_survivors, -(-len(self._expected) // 2)))

    def describe(self) -> str:
        """One line: the round's code and threat parameters (printed with each round)."""
        return (f"{self.name} n={len(self.clients)} target={self.target} privacy={self.privacy} "
                f"colluders={self.floors.colluders} min_group={self.floors.min_group} "
                f"min_survivors={self.min_survivors}")

    def _require(self, replies: Mapping[int, Message], detail: str) -> None:
        if len(replies) < self.min_survivors:
            raise AbortError(stage=self.stage, survivors=len(replies), required=self.min_survivors, detail=detail)

    def _after_advertise(self, replies: dict[int, Message]) -> dict[int, Message]:
        owners: dict[bytes, list[int]] = {}
        for c, m in replies.items():
            owners.setdefault(m["public_key"], []).append(c)
        for shared in (cs for cs in owners.values() if len(cs) > 1):
            for c in shared:  # nobody can tell whose key it is: drop every client that advertised it
                self.mark_faulty(c, f"advertised a public key that clients {sorted(shared)} all advertised")
        replies = {c: m for c, m in replies.items() if c not in self._faulty}
        self._require(replies, "too few public keys")
        self._keys = {c: m["public_key"] for c, m in sorted(replies.items())}
        signatures = {c: m["signature"] for c, m in sorted(replies.items())}
        total = len(self._keys) * (len(self._keys) - 1) * self.blob_bytes
        self._store = SealedStore(spill=spills(self.spill, total, threshold=SPILL_FROM))
        ids = sorted(self._keys)
        self._groups = [tuple(ids[i:i + self.part_size]) for i in range(0, len(ids), self.part_size)]
        self._part = 0
        return self._enter("share", {c: self._request(KEYS.kind, c, keys=self._keys, signatures=signatures,
                                                      receivers=self._receivers(c))
                                     for c in self._keys})

    def _receivers(self, sender: int) -> tuple[int, ...]:
        """Whose pieces `sender` sends in the current share part."""
        return tuple(c for c in self._groups[self._part] if c != sender)

    def _after_share(self, replies: dict[int, Message]) -> dict[int, Message]:
        self._require(replies, "too few clients shared their coded masks")
        if self._part + 1 < len(self._groups):  # the next part, from those that sent every part so far
            self._part += 1
            return self._enter("share", {c: self._request(MORE_PIECES.kind, c, receivers=self._receivers(c))
                                         for c in sorted(replies)})
        self._senders = sorted(replies)
        self._relayed_to = {j: frozenset(replies) - {j} for j in replies}
        senders = self._senders
        self._groups = [tuple(senders[i:i + self.part_size]) for i in range(0, len(senders), self.part_size)]
        self._part, self._accused = 0, {}
        return self._relay_part(senders)

    def _relay_part(self, receivers: Sequence[int]) -> Mapping[int, Message]:
        """The current check part's relays, each built when a driver sends it: to each receiver, the pieces
        the current group of senders sealed for it."""
        store, group = self._store, self._groups[self._part]
        return self._enter("check", LazyRequests(sorted(receivers), lambda j: self._request(
            RELAY.kind, j, pieces=store.for_receiver(j, [i for i in group if i != j]))))

    def _after_check(self, replies: dict[int, Message]) -> dict[int, Message]:
        for c, m in replies.items():
            self._accused.setdefault(c, set()).update(m["bad_pieces"])
        self._require(replies, "too few clients hold every other's coded piece")
        if self._part + 1 < len(self._groups):  # the next part, to those that answered every part so far
            self._part += 1
            return self._relay_part(replies)
        self._store.close()  # every relay has been built (and a late one is refused)
        self.settle_accusations({c: frozenset(self._accused[c]) for c in replies if self._accused.get(c)})
        replies = {c: m for c, m in replies.items() if c not in self._faulty}
        self._require(replies, "too few clients hold every other's coded piece")
        return self._enter("masked_input", {c: self._request(INPUT_REQUEST.kind, c) for c in sorted(replies)})

    def _after_masked_input(self, replies: dict[int, Message]) -> dict[int, Message]:
        self._require(replies, "too few masked inputs")
        self._masked_sum = self.take_running_sum()  # folded as they arrived (`accept`)
        self._survivors = tuple(sorted(replies))
        return self._enter("consistency", {
            c: self._request(SURVIVORS.kind, c, survivors=self._survivors) for c in self._survivors
        })

    def _after_consistency(self, replies: dict[int, Message]) -> dict[int, Message]:
        if len(replies) < self.target:
            raise AbortError(stage="consistency", survivors=len(replies), required=self.target,
                             detail="too few survivors signed the survivor set")
        self._signatures = {c: m["signature"] for c, m in replies.items()}
        m = self.code.piece_length
        self._coded = RowStore(len(replies), m, spill=spills(self.spill, 4 * m * len(replies), threshold=SPILL_FROM))
        self._rows = {c: i for i, c in enumerate(sorted(replies))}
        return self._enter("recovery", {
            c: self._request(RECOVER.kind, c, survivors=self._survivors, signatures=self._signatures)
            for c in sorted(replies)
        })

    def _after_recovery(self, replies: dict[int, Message]) -> dict[int, Message]:
        if len(replies) < self.target:
            raise AbortError(stage="recovery", survivors=len(replies), required=self.target,
                             detail="too few aggregate coded pieces to decode the aggregate mask")
        helpers = sorted(replies)
        rows = [self._rows[c] for c in helpers]
        store = self._coded
        coded = store if rows == list(range(len(self._rows))) else store.select(rows)
        self._coded, self._rows = None, {}
        points = [betas(len(self.clients))[self.position[c]] for c in helpers]
        try:
            try:
                bad = reed_solomon.locate_vector_errors(points, coded, k=self.target)
            except reed_solomon.UncorrectableError as exc:
                raise AbortError(stage="recovery", survivors=len(helpers), required=self.target,
                                 detail=f"aggregate coded pieces disagree beyond correction: {exc}") from exc
            for i in sorted(bad):
                self.mark_faulty(helpers[i], "sent a wrong aggregate coded piece (located and left out): it lied, "
                                             "or a client sealed it a wrong piece")
            good = [i for i in range(len(helpers)) if i not in bad][: self.target]
            total = self._unmask(self._masked_sum, [self.position[helpers[i]] for i in good], coded.select(good))
        finally:
            store.close()  # the spill file goes, whether the round finishes or aborts
        index = self.layer_index()
        own = self.excess_from  # survivors that sent their own excess
        layers = self._rebuild_layers({c: replies[c] for c in helpers if helpers.index(c) not in bad},
                                      [c for c in self._survivors if c not in own]) if index >= 0 else {}
        self._result = dataclasses.replace(self._finish(total, self._survivors), layer_index=index, layer_secrets=layers,
                                           layer_excess=self.excess_sum)
        self.excess_sum = None
        self._masked_sum = None
        return {}

    def _unmask(self, total: np.ndarray, positions: list[int], coded: RowStore) -> np.ndarray:
        """total - the aggregate mask decoded from `coded` (U pieces at `positions`), in place, one block of
        columns at a time: no d-long mask or temporary is held besides `total`."""
        m = self.code.piece_length
        for c0 in range(0, m, UNMASK_BLOCK):
            c1 = min(c0 + UNMASK_BLOCK, m)
            block = self.code.decode_columns(positions, coded[:, c0:c1])
            for r in range(block.shape[0]):  # data piece r holds the mask's coordinates r m .. r m + m
                start, end = r * m + c0, min(r * m + c1, self.length)
                if start < end:
                    self.ring.sub_(total[start:end], block[r, : end - start])
        return total

    def _keep_piece(self, msg: Message) -> None:
        """Write an accepted aggregate piece into its row of the round's piece store (rows by helper id; on
        disk when spilled) and keep the reply without it: the server holds the pieces once, not as replies
        and again as a stacked copy for decoding."""
        self._coded.put(self._rows[msg.sender], msg["piece"])
        kept = {**self._replies[msg.sender].fields, "piece": np.zeros(0, dtype=np.uint32)}  # not a view of the buffer
        self._replies[msg.sender] = Message(kind=msg.kind, round=msg.round, sender=msg.sender, receiver=msg.receiver,
                                            fields=kept)

    def _rebuild_layers(self, replies: Mapping[int, Message], owners: list[int]) -> dict[int, int]:
        """Each survivor's revealed layer secret from the helpers' Shamir shares (x = roster position + 1,
        threshold T + 1), cross-checked as Reed–Solomon codewords; wrong shares are corrected and
        their senders named, or the round aborts."""
        helpers = sorted(replies)
        k = self.privacy + 1
        if len(helpers) < k:
            raise AbortError(stage="recovery", survivors=len(helpers), required=k,
                             detail="too few layer shares to remove the survivors' excess noise")
        if not owners:
            return {}
        rows = [[shamir.from_bytes(replies[h]["layer_shares"][u]) for h in helpers] for u in owners]
        try:
            values, bad = reed_solomon.decode_many([self.position[h] + 1 for h in helpers], rows, k=k, prime=shamir.PRIME)
        except reed_solomon.UncorrectableError as exc:
            raise AbortError(stage="recovery", survivors=len(helpers), required=k,
                             detail=f"noise layer shares disagree beyond correction: {exc}") from exc
        for h in sorted({helpers[i] for wrong in bad for i in wrong}):
            self.mark_faulty(h, "sent wrong noise layer shares (corrected): it lied, or the client that dealt them did")
        return dict(zip(owners, values))

    def send_window(self) -> int | None:
        """Paced stages, so that a server over a network never holds every client's large message at once:
        each share reply and each relay is one part, up to `part_size` sealed pieces of 4 d / (U - T) bytes,
        each masked input 4 d, each aggregate piece 4 d / (U - T). At most `WINDOW_BYTES` of them are asked
        for at a time, and at least two requests (the next is on its way while the last is handled), except
        masked inputs larger than the window, asked for one at a time: each is folded into the sum in memory,
        and at d = 1e8 (400 MB) two unanswered and one being folded would be three beside the sum. (Share
        replies go to the relay store and relays are read from it one at a time, so two parts in flight
        keep two clients encoding on two cores.) None when all of them fit."""
        if not self.pace:
            return None
        if self.stage in ("share", "check"):
            per = max(1, len(self._groups[self._part])) * self.blob_bytes
        elif self.stage == "masked_input":
            per = 4 * self.length
        elif self.stage == "recovery":
            per = 4 * (self.code.piece_length + (self.length if self.layers else 0))
        else:
            return None
        floor = 1 if self.stage == "masked_input" and per > WINDOW_BYTES else 2
        window = max(floor, WINDOW_BYTES // per)
        return window if window < len(self._expected) else None

    def max_reply_bytes(self) -> int:
        """The largest reply: a masked vector, or one part of sealed pieces (with map keys), or an aggregate
        piece with one layer share per survivor."""
        pieces = min(len(self.clients) - 1, self.part_size) * (self.blob_bytes + 12)
        layer_shares = len(self.clients) * (shamir.SECRET_BYTES + 12)
        return max(4 * self.length, pieces, 4 * (self.code.piece_length + self.length) + layer_shares) + (64 << 10)

    # ---- helpers ----------------------------------------------------------------------------
    def _check_vector(self, v: np.ndarray, length: int) -> None:
        try:
            self.ring.validate(v, length=length)
        except ValueError as exc:
            raise ProtocolError(str(exc)) from exc


def _check_part(receivers: Sequence[int], unsent: set[int]) -> None:
    """A share part names distinct peers whose pieces the client has not sent yet; ProtocolError otherwise."""
    if len(set(receivers)) != len(receivers) or not set(receivers) <= unsent:
        raise ProtocolError("a share part must name distinct peers whose pieces this client has not sent yet")


class LightSecAggClient(ClientProtocol):
    """Client of one LightSecAgg round. `min_privacy` / `min_survivors` are this client's floor:
    it refuses a round whose T or U is smaller (a weaker guarantee than it accepts)."""

    name = NAME
    schemas = {s.kind: s for s in (SETUP, KEYS, MORE_PIECES, RELAY, INPUT_REQUEST, SURVIVORS, RECOVER)}

    def __init__(self, *, client_id: int, round_id: int, input_fn: InputFn, max_length: int = MAX_LEN,
                 min_privacy: int = 1, min_survivors: int = 2, min_colluders: int = 0, min_group: int = 1,
                 identity: Identity | None = None, noise_layers: LayerSecrets | None = None,
                 spill: bool | str = "auto") -> None:
        """`noise_layers`: this client's removable-noise layer secrets (XNoise), Shamir-shared with its
        pieces; it reveals the link its own spec gives for the signed survivor set, whatever the server asks.
        `spill`: keep the sealed pieces received for recovery, (N - 1) / (U - T) times the input's size,
        in an unlinked temporary file instead of memory ("auto": when they exceed `relay.CLIENT_SPILL_FROM`
        bytes). With them spilled, its own pieces encoded and sealed part by part and the code's random
        pieces made from a key (`lcc.KeyedNoise`), a client holds its mask and one part, whatever N is."""
        super().__init__(client_id=client_id, round_id=round_id, input_fn=input_fn, max_length=max_length)
        if spill not in (True, False, "auto"):
            raise ValueError(f"spill must be True, False or 'auto', got {spill!r}")
        self.spill = spill
        self.noise_layers = noise_layers
        self.layer_count = noise_layers.spec.count if noise_layers else 0
        self._held_layers: dict[int, tuple[bytes, ...]] = {}
        self._own_layers: tuple[bytes, ...] = ()
        if identity is not None and identity.client_id != client_id:
            raise ValueError(f"identity of client {identity.client_id} given to client {client_id}")
        self.identity = identity
        self.min_privacy = min_privacy
        self.min_survivors = min_survivors
        self.min_colluders, self.min_group = min_colluders, min_group
        self.floors = Floors()
        self._survivors: tuple[int, ...] = ()
        self.code: LagrangeCode | None = None
        self._position: dict[int, int] = {}
        self._keypair: KeyPair | None = None  # kept only until the pairwise keys are derived
        self._public_key = b""
        self._peer_keys: dict[int, bytes] = {}
        self._data: np.ndarray | None = None
        """The mask's U - T data pieces (uint32 (U - T, m)); the mask is their first d words."""
        self._noise: KeyedNoise | None = None
        """The code's T random pieces, made from a key block by block each time a part is encoded, and
        forgotten when the share stage ends."""
        self._layer_bytes: dict[int, bytes] = {}
        """Each peer's share of this client's noise-layer secrets, sealed with its piece."""
        self._own_piece: np.ndarray | None = None
        self._held: set[int] = set()
        """Senders whose sealed piece passed the check; the blobs wait in `_store` until recovery."""
        self._store: SealedStore | None = None
        self._unsent: set[int] = set()
        """Peers whose pieces have not been asked for yet (the share stage runs in parts; each part is
        encoded and sealed when asked for)."""
        self._opened: set[int] = set()
        """Senders whose relayed piece this client has already tried to open (good or bad)."""

    def first_kind(self) -> str:
        return SETUP.kind

    def respond(self, msg: Message) -> tuple[Message | None, tuple[str, ...]]:
        handler = {SETUP.kind: self._on_setup, KEYS.kind: self._on_keys, MORE_PIECES.kind: self._on_more_pieces,
                   RELAY.kind: self._on_relay,
                   INPUT_REQUEST.kind: self._on_input_request, SURVIVORS.kind: self._on_survivors,
                   RECOVER.kind: self._on_recover}[msg.kind]
        return handler(msg)

    # ---- stages -----------------------------------------------------------------------------
    def _on_setup(self, msg: Message):
        roster, u, t, d = msg["roster"], msg["target"], msg["privacy"], msg["length"]
        if msg["modulus"] != MERSENNE_31:
            raise ProtocolError("LightSecAgg runs over F_p with p = 2^31 - 1")
        if d > self.max_length:
            raise ProtocolError("requested length exceeds this client's limit")
        if self.client_id not in roster:
            raise ProtocolError("this client is not in the round's roster")
        if not 1 <= t < u <= len(roster):
            raise ProtocolError(f"inconsistent parameters T={t}, U={u}, N={len(roster)}")
        if t < self.min_privacy or u < self.min_survivors:
            raise ProtocolError(f"round parameters T={t}, U={u} are below this client's floor "
                                f"(T >= {self.min_privacy}, U >= {self.min_survivors})")
        floors = Floors(colluders=msg["colluders"], min_group=msg["min_group"])
        floors.check_policy(min_colluders=self.min_colluders, min_group=self.min_group)
        if floors.colluders > t:
            raise ProtocolError(f"{floors.colluders} colluders exceed the privacy T={t}")
        if floors.survivors > len(roster):
            raise ProtocolError(f"the round needs {floors.survivors} survivors of {len(roster)}")
        if msg["layers"] != self.layer_count:
            raise ProtocolError(f"the round announces {msg['layers']} noise layers; this client holds {self.layer_count}")
        self.floors = floors
        self.code = LagrangeCode(num_coded=len(roster), num_nodes=u, privacy=t, length=d)
        self._position = {c: j for j, c in enumerate(roster)}
        self._keypair = KeyPair.generate()
        self._public_key = self._keypair.public_bytes
        signature = (self.identity.signing_key.sign(advertisement(NAME, self.round_id, self.client_id, self._public_key))
                     if self.identity is not None else b"")
        return self._reply(PUBLIC_KEY.kind, public_key=self._public_key, signature=signature), (KEYS.kind,)

    def _on_keys(self, msg: Message):
        keys = msg["keys"]
        me, code = self.client_id, self.code
        if keys.get(me) != self._public_key:
            raise ProtocolError("the key list does not carry this client's public key")
        if any(c not in self._position for c in keys):
            raise ProtocolError("the key list names clients outside the roster")
        if len(set(keys.values())) != len(keys):
            raise ProtocolError("the key list repeats a public key")
        if len(keys) < code.num_nodes:
            raise ProtocolError(f"{len(keys)} clients left, the round needs {code.num_nodes}")
        if self.identity is not None:
            signatures = msg["signatures"]
            forged = sorted(c for c, pk in keys.items() if c != me and not self.identity.roster.verify(
                c, signatures.get(c, b""), advertisement(NAME, self.round_id, c, pk)))
            if forged:
                raise ProtocolError(f"keys relayed for clients {forged[:5]} are not signed by their enrolled keys: "
                                    f"the server substituted or altered them")
        _check_part(msg["receivers"], set(keys) - {me})  # before any state changes (a refused request leaves none)
        try:
            peer_keys = {c: agree(self._keypair, pk, _piece_key_info(self.round_id, me, c))
                         for c, pk in keys.items() if c != me}
        except ValueError as exc:
            raise ProtocolError(f"bad peer public key: {exc}") from exc
        self._data = code.data_rows(random_vector(FIELD_P31, code.length))
        self._noise = KeyedNoise(code.privacy, code.piece_length) if code.privacy else None  # 32 bytes, not T m words
        shares = self._layer_shares(sorted(keys))
        self._peer_keys, self._keypair = peer_keys, None
        self._own_layers = _layer_pieces(shares.pop(me))
        self._layer_bytes, self._unsent = shares, set(peer_keys)
        blob_bytes = 4 * code.piece_length + len(next(iter(shares.values()), b"")) + SEAL_OVERHEAD
        held = blob_bytes * len(peer_keys)
        self._store = SealedStore(spill=spills(self.spill, held, threshold=CLIENT_SPILL_FROM))
        return self._reply(CODED_PIECES.kind, pieces=self._part(msg["receivers"], own=True)), \
            (MORE_PIECES.kind, RELAY.kind)

    def _on_more_pieces(self, msg: Message):
        return self._reply(CODED_PIECES.kind, pieces=self._part(msg["receivers"])), (MORE_PIECES.kind, RELAY.kind)

    def _part(self, receivers: Sequence[int], *, own: bool = False) -> dict[int, bytes]:
        """The sealed pieces of `receivers` (each once, each still unsent; ProtocolError otherwise), encoded
        and sealed now: one part's pieces exist at a time, never all N. `own`: this client's own piece is
        encoded in the same product (each product reads all U pieces of the code once)."""
        _check_part(receivers, self._unsent)
        me = self.client_id
        positions = [self._position[c] for c in receivers] + ([self._position[me]] if own else [])
        coded = self.code.encode_rows(positions, self._data, self._noise)
        if own:
            self._own_piece = coded[-1].copy()
        part = {}
        for row, c in enumerate(receivers):
            part[c] = seal(self._peer_keys[c], coded[row].astype("<u4", copy=False).tobytes() + self._layer_bytes[c],
                           _piece_aad(self.round_id, me, c))
        self._unsent -= set(receivers)
        return part

    def _end_share(self) -> None:
        """The share stage is over: the random pieces and layer shares are no longer needed."""
        self._unsent, self._noise, self._layer_bytes = set(), None, {}

    def _on_relay(self, msg: Message):
        pieces, code, me = msg["pieces"], self.code, self.client_id
        if not set(pieces) <= set(self._peer_keys):
            raise ProtocolError("relayed pieces from clients that were not in the key list")
        if set(pieces) & self._opened:
            raise ProtocolError("a relay part repeats a sender whose piece this client already has")
        self._end_share()
        bad = []
        for sender, blob in pieces.items():
            opened = self._open_piece(sender, blob)
            if opened is None:
                bad.append(sender)  # reported, not fatal: the server drops the sender (or this client)
                continue
            self._store.put(sender, {me: blob})  # kept sealed (spilled past the threshold), opened again at recovery
            self._held.add(sender)
            self._held_layers[sender] = opened[1]
        self._opened |= set(pieces)
        return self._reply(PIECE_CHECK.kind, bad_pieces=tuple(sorted(bad))), (RELAY.kind, INPUT_REQUEST.kind)

    def _open_piece(self, sender: int, blob: bytes) -> tuple[np.ndarray, tuple[bytes, ...]] | None:
        """`sender`'s coded piece and layer shares from its sealed blob, or None if the blob fails
        authentication or is malformed (wrong size, a word outside F_p, a bad layer share)."""
        cut = 4 * self.code.piece_length
        try:
            raw = open_sealed(self._peer_keys[sender], blob, _piece_aad(self.round_id, sender, self.client_id))
        except DecryptionError:
            return None
        if len(raw) != cut + self.layer_count * shamir.SECRET_BYTES:
            return None
        piece = np.frombuffer(raw, dtype="<u4", count=self.code.piece_length).astype(np.uint32, copy=False)
        try:
            layers = _layer_pieces(raw[cut:])
        except ValueError:
            return None
        return None if int(piece.max()) >= MERSENNE_31 else (piece, layers)

    def _on_input_request(self, msg: Message):
        if len(self._held) + 1 < self.code.num_nodes:
            raise ProtocolError(f"pieces from {len(self._held) + 1} clients, the round needs {self.code.num_nodes}")
        masked = self._input(self.code.length, FIELD_P31).copy()
        FIELD_P31.add_(masked, self._data.reshape(-1)[: self.code.length])
        self._data = None
        return self._reply(MASKED_INPUT.kind, vector=masked), (SURVIVORS.kind,)

    def _on_survivors(self, msg: Message):
        survivors, me = tuple(sorted(set(msg["survivors"]))), self.client_id
        if me not in survivors:
            raise ProtocolError("the survivor set leaves out this client, whose masked input was sent")
        if len(survivors) < max(self.code.num_nodes, self.floors.survivors):
            raise ProtocolError(f"survivor set of {len(survivors)} is below U={self.code.num_nodes} or "
                                f"{self.floors.min_group} honest clients besides {self.floors.colluders} colluders")
        unknown = [c for c in survivors if c != me and c not in self._held]
        if unknown:
            raise ProtocolError(f"survivors {unknown[:5]} did not share a coded piece with this client")
        self._survivors = survivors
        signature = sign_survivors(self.identity, NAME, self.round_id, survivors)
        return self._reply(SURVIVOR_SIGNATURE.kind, signature=signature), (RECOVER.kind,)

    def _on_recover(self, msg: Message):
        survivors, me = self._survivors, self.client_id
        if tuple(sorted(set(msg["survivors"]))) != survivors:
            raise ProtocolError("the recovery request names another survivor set than the one this client signed")
        require_signatures(self.identity, protocol=NAME, round_id=self.round_id, survivors=survivors,
                           signatures=msg["signatures"], eligible=survivors, needed=self.code.num_nodes)
        acc = self._own_piece.copy()
        for c in survivors:
            if c != me:
                opened = self._open_piece(c, self._store.for_receiver(me, [c])[c])
                if opened is None:  # it passed the check when it arrived: the copy kept here was altered
                    raise ProtocolError(f"the piece kept from client {c} fails authentication when read back")
                FIELD_P31.add_(acc, opened[0])
        self._store.close()
        self._peer_keys = {}
        # XNoise: the link this client's OWN spec gives for the signed survivor set, never the server's word.
        index = self.noise_layers.spec.reveal_index(len(survivors)) if self.noise_layers else -1
        layer_shares = {c: (self._own_layers if c == me else self._held_layers[c])[index] for c in survivors} \
            if index >= 0 else {}
        self._held, self._own_piece, self._held_layers, self._own_layers = set(), None, {}, ()
        excess = self.noise_layers.excess(index) if index >= 0 and self.noise_layers.excess else np.zeros(0, np.uint32)
        return self._reply(AGGREGATE_PIECE.kind, piece=acc, layer_shares=layer_shares, layer_index=index,
                           excess=excess), ()

    def _layer_shares(self, holders: list[int]) -> dict[int, bytes]:
        """Each holder's Shamir shares (x = roster position + 1, threshold T + 1) of this client's layer
        secrets, concatenated; empty bytes without layers."""
        if not self.noise_layers or not self.layer_count:
            return {c: b"" for c in holders}
        rows = shamir.split(list(self.noise_layers.secrets), xs=[self._position[c] + 1 for c in holders],
                            threshold=self.code.privacy + 1)
        return {c: b"".join(shamir.to_bytes(row[i]) for row in rows) for i, c in enumerate(holders)}
