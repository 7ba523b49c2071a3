"""Hostile peers, for the transport's tests and the attack campaign (`benchmarks/attack_campaign.py`).

Nothing here is used by a server or an honest client. What each piece plays:

- `RawPeer`: a bare DEALER socket that speaks the wire format by hand (optionally over CurveZMQ
  with any key): a client that sends what it likes.
- `zmtp_connect`, `stream_unfinished_message`, `flood`: below the message layer, a TCP peer past
  the ZMTP NULL handshake writing raw frames, and a socket queueing messages as fast as it can.
- `TcpRecorder` and `replay_session`: a network attacker on the path who records a client's
  CurveZMQ session and replays it to the server on a new connection.
- `Insider`: an *enrolled* client (it holds real keys) that runs the real client protocol to
  compute every genuine reply and lets an `Attack` decide what goes on the wire instead: corrupt
  shares, a low-order key, a forged signature, malformed or oversized replies, garbage, replays,
  spoofed senders, replies of the wrong stage, floods. `ATTACKS` lists them with the outcome
  the server must produce (the insider dropped from the round, or counted as usual).
- `Coalition`: colluding insiders of one process sharing what they see and acting on one plan per
  round: accusation maps made by a planner (`accuse_classic`, `accuse_search`), one insider
  advertising another's round keys (`duplicate_keys`, `duplicate_half_key`), wrong unmasking
  material (`wrong_unmask`), replies held to 0.9 x the stage timeout (`stall`), and colluders that
  sign any survivor set and reveal what they hold for it (`collude`).
"""
from __future__ import annotations

import os
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import zmq

from secagg import shamir
from secagg.identity import Identity, advertisement
from secagg.messages import SERVER, Message, ProtocolError
from secagg.protocols import registry
from secagg.protocols.consistency import sign_survivors
from secagg.ring import FIELD_P31
from transport import session
from transport.framing import WIRE_VERSION, decode, encode
from transport.sockets import CurveClientKeys, make_curve_client


class RawPeer:
    """A bare DEALER socket speaking the wire format by hand, to play a misbehaving client."""

    def __init__(self, endpoint: str, context: zmq.Context, *, curve: CurveClientKeys | None = None,
                 monitor: bool = False) -> None:
        self.sock = context.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if curve is not None:
            make_curve_client(self.sock, curve)
        self._monitor = self.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED) if monitor else None
        self.sock.connect(endpoint)

    def hello(self, client_id: int, *, session_text: str = "") -> None:
        self.send(session.hello(client_id, wire_version=WIRE_VERSION, session=session_text))

    def send(self, msg: Message) -> None:
        self.send_frames(encode(msg))

    def send_frames(self, frames: list) -> None:
        self.sock.send_multipart(frames, copy=False)

    def recv(self, timeout: float) -> Message | None:
        if not self.sock.poll(int(timeout * 1000)):
            return None
        return decode(self.sock.recv_multipart(copy=False))

    def expect(self, kind: str, timeout: float = 10.0) -> Message:
        """Next message of `kind` (others are skipped); AssertionError after the timeout."""
        for _ in range(100):
            msg = self.recv(timeout)
            assert msg is not None, f"no '{kind}' within {timeout}s"
            if msg.kind == kind:
                return msg
        raise AssertionError(f"no '{kind}' among 100 messages")

    def disconnected(self) -> bool:
        """Whether the connection was closed (by the server) since the last call; needs monitor=True."""
        gone = False
        while self._monitor is not None:
            try:
                event = self._monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            gone |= bool(event) and len(event[0]) == 6 and int.from_bytes(event[0][:2], "little") == zmq.EVENT_DISCONNECTED
        return gone

    def close(self) -> None:
        if self._monitor is not None:
            self.sock.disable_monitor()
            self._monitor.close(linger=0)
            self._monitor = None
        self.sock.close(linger=0)


# ---- below the message layer --------------------------------------------------------------------

def _address(endpoint: str) -> tuple[str, int]:
    host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
    return host, int(port)


def zmtp_connect(endpoint: str) -> socket.socket:
    """A plain TCP socket past the ZMTP 3.0 NULL handshake as a DEALER: frames can then be written
    raw. A server that requires CurveZMQ closes it at the greeting (ConnectionError)."""
    sock = socket.create_connection(_address(endpoint), timeout=5)
    sock.sendall(b"\xff" + bytes(8) + b"\x7f\x03\x00" + b"NULL".ljust(20, b"\x00") + bytes(32))
    got = b""
    while len(got) < 64:
        chunk = sock.recv(64 - len(got))
        if not chunk:
            sock.close()
            raise ConnectionError("no ZMTP greeting")
        got += chunk
    ready = b"\x05READY\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
    sock.sendall(bytes([0x04, len(ready)]) + ready)
    return sock


def stream_unfinished_message(endpoint: str, *, total: int, stop: threading.Event, sent: list[int],
                              max_connections: int = 10_000) -> None:
    """Send `total` bytes as 1 MiB frames of one multipart message that never ends; libzmq keeps
    such a message until it ends, so no RCVHWM or ZMQ_MAXMSGSIZE bounds it. sent[0]: bytes sent.
    Cut connections are reopened, at most `max_connections` times."""
    frame = bytes([0x03]) + struct.pack(">Q", 1 << 20) + bytes(1 << 20)  # MORE | LONG
    for _ in range(max_connections):
        if sent[0] >= total or stop.is_set():
            return
        try:
            with zmtp_connect(endpoint) as sock:
                while sent[0] < total and not stop.is_set():
                    sock.sendall(frame)
                    sent[0] += len(frame)
        except OSError:  # cut by the server: come back on a new connection
            time.sleep(0.05)


def flood(sock: zmq.Socket, messages: list[list], stop: threading.Event) -> None:
    """Queue `messages` (zero-copy: shared buffers) as fast as the socket takes them. The socket is
    this thread's from now on."""
    for frames in messages:
        while not stop.is_set():
            try:
                sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
                break
            except zmq.Again:
                time.sleep(0.01)


class TcpRecorder:
    """A TCP relay between one client and the server that keeps the first `keep` bytes the client
    sent on its first connection: what a network attacker on the path sees (ciphertext)."""

    def __init__(self, server_endpoint: str, *, keep: int = 64 << 10) -> None:
        self.server = _address(server_endpoint)
        self.keep = keep
        self.recorded = bytearray()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._stop = threading.Event()
        self._first = True
        self._threads: list[threading.Thread] = []
        self.endpoint = f"tcp://127.0.0.1:{self._listener.getsockname()[1]}"
        self._spawn(self._accept)

    def _spawn(self, target: Callable, *args: object) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        t.start()
        self._threads.append(t)

    def _accept(self) -> None:
        self._listener.settimeout(0.2)
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.server, timeout=5)
            except OSError:
                client.close()
                continue
            record, self._first = self._first, False
            self._spawn(self._pipe, client, upstream, record)
            self._spawn(self._pipe, upstream, client, False)

    def _pipe(self, src: socket.socket, dst: socket.socket, record: bool) -> None:
        src.settimeout(0.2)
        try:
            while not self._stop.is_set():
                try:
                    data = src.recv(1 << 16)
                except TimeoutError:
                    continue
                if not data:
                    break
                if record and len(self.recorded) < self.keep:
                    self.recorded += data[: self.keep - len(self.recorded)]
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self._listener.close()
        for t in self._threads:
            t.join(2.0)


def replay_session(endpoint: str, recorded: bytes, *, timeout: float = 3.0) -> bool:
    """Replay a recorded client->server ZMTP byte stream on a new connection; True if the server
    completed the handshake (sent a READY command), i.e. admitted the replayed session."""
    if len(recorded) < 64:
        raise ValueError("nothing recorded yet")
    received = bytearray()
    try:
        with socket.create_connection(_address(endpoint), timeout=timeout) as sock:
            sock.sendall(recorded)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    chunk = sock.recv(1 << 16)
                except TimeoutError:
                    break
                if not chunk:
                    break
                received += chunk
    except OSError:
        pass
    return "READY" in _zmtp_commands(bytes(received[64:]))


def _zmtp_commands(stream: bytes) -> list[str]:
    """Names of the ZMTP commands at the start of a byte stream (after the greeting)."""
    names, i = [], 0
    while i + 2 <= len(stream):
        flags = stream[i]
        if flags & 0x02:
            if i + 9 > len(stream):
                break
            size, i = struct.unpack(">Q", stream[i + 1:i + 9])[0], i + 9
        else:
            size, i = stream[i + 1], i + 2
        if flags & 0x04 and size >= 1 and i + 1 + stream[i] <= len(stream):
            names.append(stream[i + 1:i + 1 + stream[i]].decode(errors="replace"))
        i += size
    return names


# ---- an enrolled insider ----------------------------------------------------------------------

Planner = Callable[[int, Mapping[int, Message]], Mapping[int, tuple[int, ...]]]
"""(round id, each member's request of the planned stage) -> what each member does (e.g. whom it accuses)."""


class Coalition:
    """Colluding insiders in one process: each member posts the requests it receives and the genuine
    replies it computes, per round and kind, and reads the others' (`gather`); a plan that needs all
    of them (an accusation map) is made once per round and attack by `planners[attack]` from the
    members' requests of that stage (`plan`), so that they act as one. Waits are short (`wait_s`):
    a member held up longer than a stage's grace would be cut as a straggler."""

    def __init__(self, *, members: Iterable[int], planners: Mapping[str, Planner] | None = None,
                 wait_s: float = 0.5) -> None:
        self.members = tuple(sorted(set(members)))
        if not self.members:
            raise ValueError("a coalition needs members")
        self.planners = dict(planners or {})
        self.wait_s = wait_s
        self._cond = threading.Condition()
        self._posts: dict[int, dict[int, dict[str, Message]]] = {}
        self._plans: dict[tuple[int, str], Mapping[int, tuple[int, ...]]] = {}

    def post(self, round_id: int, member: int, msg: Message) -> None:
        """Share `msg` (a request this member received or a reply it computed) with the others."""
        with self._cond:
            self._posts.setdefault(round_id, {}).setdefault(member, {})[msg.kind] = msg
            for old in [r for r in self._posts if r < round_id - 3]:
                del self._posts[old]
            self._cond.notify_all()

    def in_round(self, round_id: int) -> tuple[int, ...]:
        """Members that posted anything in this round."""
        with self._cond:
            return tuple(sorted(self._posts.get(round_id, {})))

    def gather(self, round_id: int, kind: str, *, members: Iterable[int] | None = None) -> dict[int, Message]:
        """Each member's (default: each member in the round's) post of `kind`, waiting up to `wait_s`
        for the missing ones."""
        want = set(self.in_round(round_id) if members is None else members)
        deadline = time.monotonic() + self.wait_s
        with self._cond:
            while True:
                posts = {m: p[kind] for m, p in self._posts.get(round_id, {}).items() if m in want and kind in p}
                left = deadline - time.monotonic()
                if posts.keys() >= want or left <= 0:
                    return posts
                self._cond.wait(left)

    def plan(self, round_id: int, attack: str, *, kind: str) -> Mapping[int, tuple[int, ...]]:
        """The round's plan for `attack`, made once by its planner from the members' `kind` requests."""
        key = (round_id, attack)
        with self._cond:
            if key in self._plans:
                return self._plans[key]
        requests = self.gather(round_id, kind)
        with self._cond:
            if key not in self._plans:
                planner = self.planners.get(attack)
                self._plans[key] = dict(planner(round_id, requests)) if planner is not None else {}
            return self._plans[key]

    @property
    def plans(self) -> dict[tuple[int, str], Mapping[int, tuple[int, ...]]]:
        """Every plan made so far, by (round id, attack)."""
        with self._cond:
            return dict(self._plans)


@dataclass(frozen=True)
class StageCall:
    """What an attack sees at one stage of one round."""

    protocol: str
    stage: int
    """Index of the request in the round (0: the first)."""
    request: Message
    reply: Message
    """The genuine reply the real client protocol computed."""
    identity: Identity
    previous: dict[int, Message]
    """The replies of this insider's previous round, by stage."""
    honest: tuple[int, ...]
    max_reply_bytes: int
    attack: str = ""
    """The attack's name in `ATTACKS`."""
    coalition: Coalition | None = None
    stage_timeout: float = 60.0
    """The server's stage timeout (what a staller plays against)."""
    received_at: float = 0.0
    """time.monotonic() when the request arrived."""
    stop: threading.Event | None = None
    """Set when the insider must stop (ends a stall early)."""


Attack = Callable[[StageCall], list[list]]
"""What to put on the wire at one stage, as a list of frame lists (in order)."""


def _with(msg: Message, **changes: object) -> Message:
    fields = {k: v for k, v in changes.items() if k not in ("round", "sender", "kind")}
    return Message(kind=changes.get("kind", msg.kind), round=changes.get("round", msg.round),
                   sender=changes.get("sender", msg.sender), receiver=msg.receiver, fields={**msg.fields, **fields})


def _signed_as(protocol: str) -> str:
    return "lightsecagg" if protocol == "lightsecagg" else "secagg"


def _key_field(reply: Message) -> str:
    return "public_key" if "public_key" in reply.fields else "keys"


def _flip(blob: bytes) -> bytes:
    out = bytearray(blob)
    out[len(out) // 2] ^= 0x01
    return bytes(out)


def honest(call: StageCall) -> list[list]:
    return [encode(call.reply)]


def corrupt_shares(call: StageCall) -> list[list]:
    """Every sealed share (SecAgg) or coded piece (LightSecAgg) fails authentication at its recipient."""
    name = next((n for n in ("ciphertexts", "pieces") if n in call.reply.fields), None)
    if name is None:
        return honest(call)
    return [encode(_with(call.reply, **{name: {c: _flip(b) for c, b in call.reply[name].items()}}))]


def corrupt_some_shares(call: StageCall) -> list[list]:
    """Half its sealed shares fail authentication: the rest are valid, so some neighbours could
    have masked with it (the check stage exists so that none does before it is dropped)."""
    name = next((n for n in ("ciphertexts", "pieces") if n in call.reply.fields), None)
    if name is None:
        return honest(call)
    spoiled = sorted(call.reply[name])[: max(1, len(call.reply[name]) // 2)]
    return [encode(_with(call.reply, **{name: {c: _flip(b) if c in spoiled else b
                                               for c, b in call.reply[name].items()}}))]


def low_order_key(call: StageCall) -> list[list]:
    """An all-zero X25519 key (a low-order point: every agreement with it is zero), validly signed."""
    if call.stage != 0:
        return honest(call)
    name = _key_field(call.reply)
    keys = bytes(len(call.reply[name]))
    signature = call.identity.signing_key.sign(
        advertisement(_signed_as(call.protocol), call.reply.round, call.reply.sender, keys))
    return [encode(_with(call.reply, **{name: keys, "signature": signature}))]


def bad_signature(call: StageCall) -> list[list]:
    """Its round keys signed for another round (a replayed or forged advertisement)."""
    if call.stage != 0:
        return honest(call)
    name = _key_field(call.reply)
    signature = call.identity.signing_key.sign(
        advertisement(_signed_as(call.protocol), call.reply.round + 1, call.reply.sender, call.reply[name]))
    return [encode(_with(call.reply, signature=signature))]


def malformed(call: StageCall) -> list[list]:
    """A masked input one element short: well-formed on the wire, wrong for the round."""
    if "vector" not in call.reply.fields:
        return honest(call)
    return [encode(_with(call.reply, vector=call.reply["vector"][:-1].copy()))]


def oversized(call: StageCall) -> list[list]:
    """A masked input four times the round's largest legitimate reply, sent instead of the real one."""
    if "vector" not in call.reply.fields:
        return honest(call)
    return [encode(_with(call.reply, vector=np.zeros(call.max_reply_bytes, np.uint32)))]


def flood_replies(call: StageCall) -> list[list]:
    """Before its masked input, 256 MiB of maximum-size frames: the server drops them undecoded or
    cuts the connection (then the insider is simply missing from the stage)."""
    if "vector" not in call.reply.fields:
        return honest(call)
    big = np.zeros(32 << 20, np.uint8)
    return [[big]] * 8 + [encode(call.reply)]


def garbage(call: StageCall) -> list[list]:
    """Random bytes, a message of an unknown kind and one from the session round around the real reply."""
    junk = [[os.urandom(secrets.randbelow(1 << 16) + 1) for _ in range(secrets.randbelow(3) + 1)]]
    unknown = encode(_with(call.reply, kind="no_such_kind"))
    return [*junk, unknown, encode(_with(call.reply, round=session.SESSION_ROUND)), encode(call.reply)]


def replay(call: StageCall) -> list[list]:
    """Its previous round's reply for this stage, then the real one, then the real one again."""
    old = call.previous.get(call.stage)
    return [*([encode(old)] if old is not None else []), encode(call.reply), encode(call.reply)]


def spoof(call: StageCall) -> list[list]:
    """Its reply presented as an honest client's, before its own."""
    victim = call.honest[call.stage % len(call.honest)]
    return [encode(_with(call.reply, sender=victim)), encode(call.reply)]


def wrong_stage(call: StageCall) -> list[list]:
    """A reply of another stage's kind (from its previous round, re-stamped), then the real one."""
    other = call.previous.get(call.stage + 1) or call.previous.get(call.stage - 1)
    early = [encode(_with(other, round=call.reply.round))] if other is not None else []
    return [*early, encode(call.reply)]


# ---- colluding insiders (a `Coalition` shares their state) ---------------------------------------

ACCUSATIONS: dict[str, tuple[str, str]] = {
    "share_check": ("check_request", "bad_shares"),    # SecAgg, SecAgg+: the check stage
    "lsa_piece_check": ("lsa_relay", "bad_pieces"),    # LightSecAgg: the check stage
}
"""Reply kind that carries accusations -> (the request kind it answers, the accusation field)."""


def _accuse(attack: str) -> Attack:
    def run(call: StageCall) -> list[list]:
        where = ACCUSATIONS.get(call.reply.kind)
        if where is None or call.coalition is None:
            return honest(call)
        kind, name = where
        targets = call.coalition.plan(call.reply.round, attack, kind=kind).get(call.reply.sender, ())
        accused = tuple(sorted(set(call.reply[name]) | set(targets)))
        return [encode(_with(call.reply, **{name: accused}))]
    run.__doc__ = (f"Accuse honest clients (sealed shares or pieces 'failed to open') as the coalition's "
                   f"'{attack}' planner decides for the whole coalition.")
    return run


def _duplicate(*, half: bool) -> Attack:
    def run(call: StageCall) -> list[list]:
        if call.stage != 0 or call.coalition is None:
            return honest(call)
        source = call.coalition.members[0]
        if call.reply.sender == source:
            return honest(call)
        theirs = call.coalition.gather(call.reply.round, call.reply.kind, members=(source,)).get(source)
        name = _key_field(call.reply)
        if theirs is None:
            return honest(call)
        keys = theirs[name]
        if half and name == "keys":  # SecAgg's c_pk || s_pk: repeat only the masking key s_pk
            keys = call.reply[name][: len(keys) // 2] + keys[len(keys) // 2:]
        signature = call.identity.signing_key.sign(
            advertisement(_signed_as(call.protocol), call.reply.round, call.reply.sender, keys))
        return [encode(_with(call.reply, **{name: keys, "signature": signature}))]
    run.__doc__ = ("The coalition's lowest member advertises its real round keys; every other member "
                   + ("advertises the same masking key (the second half of SecAgg's key pair; the whole key "
                      "elsewhere)" if half else "advertises the same keys")
                   + ", signed with its own enrolled identity (a valid signature: only the repeat gives it away).")
    return run


def wrong_unmask(call: StageCall) -> list[list]:
    """One unmasking seed share (SecAgg) or the aggregate coded piece (LightSecAgg) off by one: a lie
    the server can only catch by cross-checking the redundant shares."""
    r = call.reply
    if r.kind == "unmask_shares":
        seeds = dict(r["seed_shares"])
        owner = next((u for u in sorted(seeds) if u != r.sender), None)
        if owner is None:
            return honest(call)
        seeds[owner] = shamir.to_bytes((shamir.from_bytes(seeds[owner]) + 1) % shamir.PRIME)
        return [encode(_with(r, seed_shares=seeds))]
    if r.kind == "lsa_aggregate_piece":
        piece = r["piece"].copy()
        piece[0] = (int(piece[0]) + 1) % FIELD_P31.modulus
        return [encode(_with(r, piece=piece))]
    return honest(call)


STALL_FRACTION = 0.9


def stall(call: StageCall) -> list[list]:
    """Every reply genuine, sent STALL_FRACTION of the stage timeout after its request arrived: without
    a stall policy it would hold each stage (and every round) to nearly the timeout."""
    wait = max(0.0, call.received_at + STALL_FRACTION * call.stage_timeout - time.monotonic())
    if call.stop is None:
        time.sleep(wait)
    elif call.stop.wait(wait):
        return []
    return honest(call)


def unchecked_reply(client: object, msg: Message, identity: Identity) -> Message | None:
    """What a colluder sends where its own client refused (the survivor set too small, too few
    partners alive or signatures): it signs any announced survivor set and reveals what it holds for
    it, exactly as the client would but without the client's checks. None if it holds nothing."""
    me = msg.receiver
    if msg.kind == "consistency_request" and hasattr(client, "masked_with"):
        survivors = tuple(sorted(set(msg["survivors"])))
        client.survivors, client.alive = survivors, client.masked_with & frozenset(survivors)
        client._next_kinds = ("unmask_request",)
        return client._reply("survivor_signature", signature=sign_survivors(identity, "secagg", msg.round, survivors))
    if msg.kind == "unmask_request" and getattr(client, "held", None):
        seeds = {u: client.held[u][0] for u in client.alive}
        seeds[me] = client.own_shares[0]
        keys = {v: client.held[v][1] for v in client.masked_with - client.alive}
        index = client.noise_layers.spec.reveal_index(len(client.survivors)) if client.noise_layers else -1
        layers = {u: client.held[u][2 + index] for u in client.alive} if index >= 0 else {}
        if index >= 0:
            layers[me] = client.own_shares[2 + index]
        client.held, client._next_kinds, client.finished = {}, (), True
        excess = client.noise_layers.excess(index) if index >= 0 and client.noise_layers.excess else np.zeros(0, np.uint32)
        return client._reply("unmask_shares", seed_shares=seeds, key_shares=keys, layer_shares=layers, layer_index=index,
                             excess=excess)
    if msg.kind == "lsa_survivors" and getattr(client, "_own_piece", None) is not None:
        survivors = tuple(sorted(set(msg["survivors"])))
        if any(c != me and c not in client._held for c in survivors):
            return None
        client._survivors, client._next_kinds = survivors, ("lsa_recover",)
        return client._reply("lsa_survivor_signature",
                             signature=sign_survivors(identity, "lightsecagg", msg.round, survivors))
    if msg.kind == "lsa_recover" and getattr(client, "_own_piece", None) is not None and client._survivors:
        acc = client._own_piece.copy()
        for c in client._survivors:
            if c != me:
                FIELD_P31.add_(acc, client._held[c])
        index = client.noise_layers.spec.reveal_index(len(client._survivors)) if client.noise_layers else -1
        layers = {c: (client._own_layers if c == me else client._held_layers[c])[index]
                  for c in client._survivors} if index >= 0 else {}
        client._held, client._own_piece, client._next_kinds, client.finished = {}, None, (), True
        excess = client.noise_layers.excess(index) if index >= 0 and client.noise_layers.excess else np.zeros(0, np.uint32)
        return client._reply("lsa_aggregate_piece", piece=acc, layer_shares=layers, layer_index=index, excess=excess)
    return None


DROPPED, COUNTED, EITHER = "dropped", "counted", "either"


@dataclass(frozen=True)
class AttackSpec:
    run: Attack
    outcome: str
    """What the server must make of the insider: DROPPED from the round, COUNTED as a contributor
    (its genuine reply is valid and must not be displaced), or EITHER."""
    faulty: str | None = None
    """A regex the server's recorded reason for the insider (`RoundResult.faulty`) must match."""
    accused_by_honest: bool = False
    """Honest receivers report its sealed messages: the server drops one of them with it (a dispute)."""
    coalition: bool = False
    """Needs a `Coalition` (several insiders acting on one plan)."""
    force: Callable[[object, Message, Identity], Message | None] | None = None
    """Where its own client protocol refuses a request, the reply to send anyway."""


ATTACKS: dict[str, AttackSpec] = {
    "corrupt_shares": AttackSpec(corrupt_shares, DROPPED, accused_by_honest=True),
    "corrupt_some_shares": AttackSpec(corrupt_some_shares, DROPPED, accused_by_honest=True),
    "low_order_key": AttackSpec(low_order_key, DROPPED),
    "bad_signature": AttackSpec(bad_signature, DROPPED),
    "malformed": AttackSpec(malformed, DROPPED),
    "oversized": AttackSpec(oversized, DROPPED),
    "flood": AttackSpec(flood_replies, EITHER),
    "garbage": AttackSpec(garbage, COUNTED),
    "replay": AttackSpec(replay, COUNTED),
    "spoof": AttackSpec(spoof, COUNTED),
    "wrong_stage": AttackSpec(wrong_stage, COUNTED),
    "honest": AttackSpec(honest, COUNTED),
    "accuse_classic": AttackSpec(_accuse("accuse_classic"), EITHER, coalition=True),
    "accuse_search": AttackSpec(_accuse("accuse_search"), EITHER, coalition=True),
    "duplicate_keys": AttackSpec(_duplicate(half=False), DROPPED, faulty="advertised a public key that clients",
                                 coalition=True),
    "duplicate_half_key": AttackSpec(_duplicate(half=True), DROPPED, faulty="advertised a public key that clients",
                                     coalition=True),
    "wrong_unmask": AttackSpec(wrong_unmask, COUNTED, faulty=r"sent (a )?wrong"),
    "stall": AttackSpec(stall, DROPPED),
    "collude": AttackSpec(honest, EITHER, coalition=True, force=unchecked_reply),
}


@dataclass
class InsiderLog:
    connections: int = 0
    refused: int = 0
    sent: int = 0
    rounds: dict[int, str] = field(default_factory=dict)
    """Round id -> the attack it ran."""
    errors: list[str] = field(default_factory=list)
    forced: int = 0
    """Replies sent where its own client protocol refused (`AttackSpec.force`)."""
    shutdown_round: int | None = None
    """The round it was in when the server told it to exit (None: it was not told)."""


class Insider:
    """An enrolled client under attacker control: the real client protocol of `protocol` computes
    each genuine reply (input `input_fn(round_id)`), and `plan(round_id)` (an `ATTACKS` name) decides
    what is sent; where the real protocol refuses a request, the attack's `force` may answer anyway.
    With a `coalition`, it shares every request and genuine reply with the other members. Reconnects
    when the server cuts it. `run` until `stop` or the server's shutdown."""

    def __init__(self, *, endpoint: str, client_id: int, protocol: str, curve: CurveClientKeys,
                 identity: Identity, session_text: str, plan: Callable[[int], str],
                 input_fn: Callable[[int], np.ndarray], honest: Iterable[int], max_reply_bytes: int,
                 context: zmq.Context, coalition: Coalition | None = None, stage_timeout: float = 60.0,
                 observe: Callable[[int, Message], None] | None = None,
                 client_params: Mapping[str, object] | None = None) -> None:
        """`coalition`: the insiders it colludes with (it posts every request and genuine reply there);
        `observe(client id, request)`: called on every request (the campaign's record of what the
        server sent); `client_params`: extra keywords of its client protocol (floors)."""
        self.endpoint, self.client_id, self.protocol = endpoint, client_id, protocol
        self.curve, self.identity, self.session_text = curve, identity, session_text
        self.plan, self.input_fn, self.honest = plan, input_fn, tuple(honest)
        self.max_reply_bytes, self.context = max_reply_bytes, context
        self.coalition, self.stage_timeout, self.observe = coalition, stage_timeout, observe
        self.client_params = dict(client_params or {})
        self.log = InsiderLog()

    def run(self, stop: threading.Event) -> InsiderLog:
        replies: dict[int, dict[int, Message]] = {}
        while not stop.is_set():
            peer = RawPeer(self.endpoint, self.context, curve=self.curve, monitor=True)
            self.log.connections += 1
            try:
                if self._register(peer, stop) and self._serve(peer, stop, replies) == "shutdown":
                    return self.log
            finally:
                peer.close()
        return self.log

    def _register(self, peer: RawPeer, stop: threading.Event) -> bool:
        deadline = time.monotonic() + 30.0
        while not stop.is_set() and time.monotonic() < deadline:
            peer.hello(self.client_id, session_text=self.session_text)
            msg = self._recv(peer, 0.5)
            if msg is not None and msg.kind == session.WELCOME:
                return True
            if msg is not None and msg.kind == session.REJECT:  # our last connection not yet freed
                self.log.refused += 1
                time.sleep(0.2)
        return False

    def _serve(self, peer: RawPeer, stop: threading.Event, replies: dict[int, dict[int, Message]]) -> str:
        client_cls = registry.client_class(self.protocol)
        current, protocol, stage, name = -1, None, 0, "honest"
        while not stop.is_set():
            if peer.disconnected():
                return "cut"
            msg = self._recv(peer, 0.2)
            if msg is None:
                continue
            received_at = time.monotonic()
            if msg.kind == session.SHUTDOWN:
                self.log.shutdown_round = current
                return "shutdown"
            if msg.kind in session.SESSION_KINDS:
                continue
            if msg.round > current:
                current, stage = msg.round, 0
                name = self.plan(msg.round)
                self.log.rounds[msg.round] = name
                protocol = client_cls(client_id=self.client_id, round_id=msg.round,
                                      input_fn=lambda r=msg.round: self.input_fn(r),
                                      **registry.with_enrolment(client_cls, self.client_params, identity=self.identity))
            elif msg.round < current or protocol is None:
                continue
            else:
                stage += 1
            spec = ATTACKS[name]
            if self.observe is not None:
                self.observe(self.client_id, msg)
            if self.coalition is not None:
                self.coalition.post(msg.round, self.client_id, msg)
            try:
                reply = protocol.handle(msg)
            except ProtocolError as exc:
                reply = spec.force(protocol, msg, self.identity) if spec.force is not None else None
                if reply is None:
                    self.log.errors.append(f"round {msg.round}: {exc}")
                    continue
                self.log.forced += 1
            if reply is None:
                continue
            if not isinstance(reply, Message):  # a chunked reply: the attacks below tamper with one message
                raise TypeError("the attack driver runs whole-message rounds: start the server without `chunk` "
                                "(chunked uploads are attacked in tests/secagg/test_chunks.py)")
            if self.coalition is not None:
                self.coalition.post(msg.round, self.client_id, reply)
            call = StageCall(protocol=self.protocol, stage=stage, request=msg, reply=reply,
                             identity=self.identity, previous=replies.get(msg.round - 1, {}),
                             honest=self.honest, max_reply_bytes=self.max_reply_bytes, attack=name,
                             coalition=self.coalition, stage_timeout=self.stage_timeout, received_at=received_at,
                             stop=stop)
            for frames in spec.run(call):
                try:
                    peer.sock.send_multipart(frames, copy=False)
                    self.log.sent += 1
                except zmq.ZMQError:
                    return "cut"
            replies.setdefault(msg.round, {})[stage] = reply
            replies.pop(msg.round - 2, None)
        return "stopped"

    @staticmethod
    def _recv(peer: RawPeer, timeout: float) -> Message | None:
        try:
            msg = peer.recv(timeout)
        except ProtocolError:
            return None
        return msg if msg is not None and msg.sender == SERVER else None
