"""Session messages the transport exchanges itself, around and between protocol rounds.

A client registers with `hello` (its client id is the message's sender, and `session` says what
it expects the server to run: protocol and round parameters, '' for anything) and is answered
with `welcome` or `reject`; a hello whose session differs from the server's is refused with a
reason starting with `SESSION_MISMATCH` that names both sides. `shutdown` ends a client's loop. These kinds are reserved: protocols and
higher layers (`ServerDriver.broadcast` / `collect`) use any other kind.
"""
from __future__ import annotations

from secagg.messages import SERVER, Bytes, Int, Message, Schema, Value

HELLO, WELCOME, REJECT, SHUTDOWN = "hello", "welcome", "reject", "shutdown"
SESSION_KINDS = frozenset({HELLO, WELCOME, REJECT, SHUTDOWN})
SESSION_MISMATCH = "session mismatch"
MAX_SESSION_BYTES = 192
SESSION_ROUND = 0
"""Round number carried by session messages (protocol rounds may use any round id)."""

SCHEMAS = {
    HELLO: Schema(HELLO, {"wire_version": Int(0, 255), "session": Bytes(MAX_SESSION_BYTES)}),
    WELCOME: Schema(WELCOME, {}),
    REJECT: Schema(REJECT, {"reason": Bytes(256)}),
    SHUTDOWN: Schema(SHUTDOWN, {}),
}


def hello(client_id: int, *, wire_version: int, session: str = "") -> Message:
    return Message(kind=HELLO, round=SESSION_ROUND, sender=client_id, receiver=SERVER,
                   fields={"wire_version": wire_version, "session": session_bytes(session)})


def session_bytes(session: str) -> bytes:
    """The wire form of a session description; ValueError if it does not fit a hello."""
    raw = session.encode()
    if len(raw) > MAX_SESSION_BYTES:
        raise ValueError(f"session description is {len(raw)} bytes, at most {MAX_SESSION_BYTES}")
    return raw


def session_mismatch(*, server: str, client: str) -> str:
    """'' if a client expecting `client` may join a server running `server` ('' matches anything)."""
    if not server or not client or server == client:
        return ""
    return f"{SESSION_MISMATCH}: the server runs '{server}' but this client expects '{client}'"


def to_client(kind: str, client_id: int, **fields: Value) -> Message:
    return Message(kind=kind, round=SESSION_ROUND, sender=SERVER, receiver=client_id, fields=fields)


def reply_to(msg: Message, kind: str, **fields: Value) -> Message:
    """The answer to `msg`: same round, sender and receiver swapped. For client-side handlers."""
    return Message(kind=kind, round=msg.round, sender=msg.receiver, receiver=msg.sender, fields=fields)
