"""ZeroMQ transport for the sans-IO protocols in `secagg.protocols`.

The same protocol objects run in simulation (`InprocFederation`: every party in one process
over inproc://, clients in threads) and in deployment (`python -m transport.cli server|client`:
separate processes over tcp://). Messages are framed without pickle (`framing`): a versioned
header and raw buffers, numpy arrays zero-copy, strict size limits; every received message is
validated and a bad one is dropped, never fatal.

Server side (one thread):

    driver = ServerDriver("tcp://127.0.0.1:5555")          # or context=shared ctx, "inproc://..."
    driver.wait_for_clients(count=n, timeout=60)            # or ids=[...]
    report = driver.run_round(protocol, stage_timeout=30)   # RoundReport: .result, .stage_seconds,
                                                            #   .bytes_received, .rejected, ...
    driver.broadcast("model", {"weights": w}, round_id=r)   # any non-session kind, same socket
    acks = driver.collect("ack", round_id=r, timeout=30)    # CollectResult: .replies, .missing
    driver.shutdown()

Client side (a process, or a thread with a shared context):

    run_client(endpoint=..., client_id=k, factory=lambda round_id: SomeClient(...),
               handlers={"model": on_model})                 # handler(msg) -> reply_to(msg, ...) | None
"""
from transport.client import (ClientConfig, ClientSession, ClientSummary, ProtocolMismatchError, RegistrationError,
                              run_client)
from transport.framing import FrameLimits, decode, encode
from transport.server import CollectResult, QueueLimits, RoundReport, ServerConfig, ServerDriver
from transport.session import reply_to
from transport.simulation import InprocFederation
from transport.sockets import CurveClientKeys, CurveServerKeys, SocketOptions, curve_keypair

__all__ = [
    "ClientConfig", "ClientSession", "ClientSummary", "CollectResult", "CurveClientKeys", "CurveServerKeys",
    "FrameLimits", "InprocFederation", "ProtocolMismatchError", "QueueLimits", "RegistrationError", "RoundReport", "ServerConfig", "ServerDriver",
    "SocketOptions", "curve_keypair", "decode", "encode", "reply_to", "run_client",
]
