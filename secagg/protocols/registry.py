"""Protocols by name, so configs and CLIs can choose one with a string."""
from __future__ import annotations

import importlib

_PROTOCOLS: dict[str, tuple[str, str, str]] = {
    # name: (module, server class, client class)
    "plain": ("secagg.protocols.plain", "PlainServer", "PlainClient"),
    "secagg": ("secagg.protocols.secagg", "SecAggServer", "SecAggClient"),
    "secagg+": ("secagg.protocols.secagg", "SecAggPlusServer", "SecAggPlusClient"),
    "lightsecagg": ("secagg.protocols.lightsecagg", "LightSecAggServer", "LightSecAggClient"),
}


def names() -> list[str]:
    return sorted(_PROTOCOLS)


def _load(name: str, which: int) -> type:
    if name not in _PROTOCOLS:
        raise ValueError(f"unknown protocol '{name}'; choose one of {names()}")
    module = importlib.import_module(_PROTOCOLS[name][0])
    return getattr(module, _PROTOCOLS[name][which])


def server_class(name: str) -> type:
    return _load(name, 1)


def client_class(name: str) -> type:
    return _load(name, 2)
