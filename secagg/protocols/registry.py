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


def default_ring(name: str):
    """The ring a protocol sums in: F_p for LightSecAgg (Lagrange coding needs a field), else Z_2^32."""
    from secagg.ring import FIELD_P31, RING_2_32

    if name not in _PROTOCOLS:
        raise ValueError(f"unknown protocol '{name}'; choose one of {names()}")
    return FIELD_P31 if name == "lightsecagg" else RING_2_32


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


def with_enrolment(cls: type, params: dict, **enrolment) -> dict:
    """Constructor keywords plus the enrolment ones (`roster` for servers, `identity` for clients)
    that `cls` accepts and that are set: the plain protocol takes none."""
    import inspect

    accepted = inspect.signature(cls).parameters
    return {**params, **{k: v for k, v in enrolment.items() if v is not None and k in accepted}}
