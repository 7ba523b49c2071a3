"""Protocols by name, so configs and CLIs can choose one with a string."""
from __future__ import annotations

from secagg.protocols.plain import PlainClient, PlainServer

SERVERS: dict[str, type] = {"plain": PlainServer}
CLIENTS: dict[str, type] = {"plain": PlainClient}


def register(name: str, server_cls: type, client_cls: type) -> None:
    SERVERS[name] = server_cls
    CLIENTS[name] = client_cls


def names() -> list[str]:
    return sorted(SERVERS)
