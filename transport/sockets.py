"""Socket options and optional CurveZMQ security shared by the server and client drivers."""
from __future__ import annotations

import os
import signal
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator


@dataclass(frozen=True)
class SocketOptions:
    sndhwm: int = 1000
    """Queued outgoing messages per peer before sends fail (the server never blocks on a slow peer)."""
    rcvhwm: int = 1000
    """Queued incoming messages per peer before libzmq stops reading it. It counts complete
    messages only, whatever their size or number of frames, and a message still arriving not at all:
    with ZMQ_MAXMSGSIZE (per frame) it bounds no bytes. The server bounds those itself
    (`transport.server.QueueLimits`) and lowers this to 16."""
    linger_ms: int = 1000
    """How long close() keeps trying to deliver queued messages."""
    heartbeat_ms: int = 2000
    """ZMTP heartbeat interval (0 = off); a dead TCP peer is disconnected after heartbeat_timeout_ms."""
    heartbeat_timeout_ms: int = 20000


def send_whole(sock: zmq.Socket, frames: list, *, flags: int = 0, copy: bool = False):
    """`sock.send_multipart(frames)` that Ctrl-C cannot cut in two. pyzmq sends a message frame by frame
    from Python, so a KeyboardInterrupt between two frames left a partial message, and the next send (the
    server's "interrupted" notice) completed it: the peer dropped the malformed whole and never heard why
    the run ended. For the send, SIGINT's Python handler only notes the signal; the handler it replaced
    runs once the message is whole (Python runs signal handlers in the main thread, whichever thread the
    OS delivered the signal to, so this holds in threaded processes too)."""
    if threading.current_thread() is not threading.main_thread():   # only the main thread may set handlers
        return sock.send_multipart(frames, flags=flags, copy=copy)
    noted: list = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: noted.append(frame))
    try:
        return sock.send_multipart(frames, flags=flags, copy=copy)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)
        if noted:
            if callable(previous):
                previous(signal.SIGINT, noted[0])   # Python's default handler raises KeyboardInterrupt
            elif previous != signal.SIG_IGN:        # the OS default (or a handler set outside Python): deliver again
                os.kill(os.getpid(), signal.SIGINT)


def apply_options(sock: zmq.Socket, opts: SocketOptions, *, max_message_bytes: int) -> None:
    sock.setsockopt(zmq.SNDHWM, opts.sndhwm)
    sock.setsockopt(zmq.RCVHWM, opts.rcvhwm)
    sock.setsockopt(zmq.LINGER, opts.linger_ms)
    # libzmq drops (and disconnects) a peer sending any frame above this, before buffering it. It
    # caps each frame, not a message: a message of many frames is buffered whole (see rcvhwm).
    sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    if opts.heartbeat_ms > 0:
        sock.setsockopt(zmq.HEARTBEAT_IVL, opts.heartbeat_ms)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, opts.heartbeat_timeout_ms)


def is_inproc(endpoint: str) -> bool:
    return endpoint.startswith("inproc://")


# ---- CurveZMQ -----------------------------------------------------------------------------

@dataclass(frozen=True)
class CurveServerKeys:
    """The server's key pair and, optionally, the public key each client id must connect with.

    Keys are Z85 text (as from `zmq.curve_keypair()`). With `client_keys`, a connection is
    accepted only from a listed key and a `hello` is accepted only for the id that key is bound
    to, so a client cannot register under another client's id. Without it, any client that
    knows the server's public key may connect (encryption without client authentication).
    """

    public_key: bytes
    secret_key: bytes
    client_keys: Mapping[int, bytes] | None = None


@dataclass(frozen=True)
class CurveClientKeys:
    public_key: bytes
    secret_key: bytes
    server_key: bytes = field(repr=False)


def curve_keypair() -> tuple[bytes, bytes]:
    """(public, secret) Z85 key pair from the OS CSPRNG (libzmq's crypto_box keypair)."""
    return zmq.curve_keypair()


class _Allowlist:
    """ZAP callback: accept exactly the listed client public keys."""

    def __init__(self, keys: Mapping[int, bytes]) -> None:
        self._keys = frozenset(keys.values())

    def callback(self, domain: str, key: bytes) -> bool:
        return key in self._keys


def start_authenticator(context: zmq.Context, keys: CurveServerKeys) -> ThreadAuthenticator:
    """A ZAP handler for the context (one per context), enforcing the client allowlist if given."""
    auth = ThreadAuthenticator(context)
    auth.start()
    if keys.client_keys is None:
        auth.configure_curve(domain="*", location=zmq.auth.CURVE_ALLOW_ANY)
    else:
        auth.configure_curve_callback(domain="*", credentials_provider=_Allowlist(keys.client_keys))
    return auth


def make_curve_server(sock: zmq.Socket, keys: CurveServerKeys) -> None:
    sock.curve_secretkey = keys.secret_key
    sock.curve_publickey = keys.public_key
    sock.curve_server = True


def make_curve_client(sock: zmq.Socket, keys: CurveClientKeys) -> None:
    sock.curve_secretkey = keys.secret_key
    sock.curve_publickey = keys.public_key
    sock.curve_serverkey = keys.server_key


# ---- key files (for the CLI) ---------------------------------------------------------------

def write_keys(directory: Path, *, clients: int) -> None:
    """server.key(_secret) and client-<k>.key(_secret) for k = 1..clients, in ZPL certificate files."""
    directory.mkdir(parents=True, exist_ok=True)
    zmq.auth.create_certificates(str(directory), "server")
    for k in range(1, clients + 1):
        zmq.auth.create_certificates(str(directory), f"client-{k}")


def load_server_keys(directory: Path) -> CurveServerKeys:
    public, secret = zmq.auth.load_certificate(str(directory / "server.key_secret"))
    clients: dict[int, bytes] = {}
    for path in directory.glob("client-*.key"):
        client_id = int(path.stem.removeprefix("client-"))
        clients[client_id], _ = zmq.auth.load_certificate(str(path))
    return CurveServerKeys(public_key=public, secret_key=secret, client_keys=clients)


def load_client_keys(directory: Path, client_id: int) -> CurveClientKeys:
    public, secret = zmq.auth.load_certificate(str(directory / f"client-{client_id}.key_secret"))
    server_public, _ = zmq.auth.load_certificate(str(directory / "server.key"))
    return CurveClientKeys(public_key=public, secret_key=secret, server_key=server_public)
