"""Removable noise layers (Dordis's XNoise, EuroSys 2024): the protocol side, which knows no DP.

Distributed DP sizes each client's noise for the floor n_min of survivors; when more survive, the sum
carries more noise than the target. XNoise removes the excess after the round: each client's noise
is a base part plus L layers, layer j belonging to survivor count k = floor + j, and once the
survivor set U is fixed the layers of counts floor .. u_eff - 1 (u_eff = |U| - colluders) of every
survivor are revealed and subtracted, so the noise left is the target for any survivor count.

This module holds what the secure-sum protocol needs: a client's layer secrets form a hash chain
s_{L-1} (fresh) -> s_{L-2} = H(s_{L-1}) -> ... -> s_0, so revealing s_j reveals layers 0..j and
nothing above (preimage resistance). Each s_j is Shamir-shared with the client's unmasking
shares, so a survivor that drops during the removal itself is still removed exactly. A client
reveals (its share of) s_j only for the j its OWN configuration gives for the consistency-signed
survivor set: a server cannot ask for more removal than the survivors warrant.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from secagg import crypto, shamir

MAX_LAYERS = 1024
"""Most layers a round may announce (sizes every share message before it is read)."""


@dataclass(frozen=True)
class LayerSpec:
    """Which layers exist and when each is revealed; the same on the server and every client."""

    count: int
    """L: layers per client, one per survivor count floor .. floor + L - 1."""
    floor: int
    """n_min: the fewest honest survivors the noise is sized for."""
    colluders: int = 0
    """c: colluding clients' noise is not counted, so u_eff = |U| - c honest survivors."""

    def __post_init__(self) -> None:
        for name in ("count", "floor", "colluders"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"{name} must be an int, got {v!r}")
        if not 0 <= self.count <= MAX_LAYERS or self.floor < 1 or self.colluders < 0:
            raise ValueError(f"need 0 <= count <= {MAX_LAYERS}, floor >= 1, colluders >= 0")

    def reveal_index(self, survivors: int) -> int:
        """Highest layer removed for `survivors` survivors (-1: none): layers of counts floor .. u_eff - 1."""
        u_eff = survivors - self.colluders
        return min(u_eff - self.floor, self.count) - 1 if u_eff > self.floor else -1


def _step(secret: int, index: int) -> int:
    """s_{index-1} from s_index: one-way, domain-separated by the index."""
    digest = crypto.hkdf(shamir.to_bytes(secret), crypto.context("noise-layer-chain", index), length=40)
    return int.from_bytes(digest, "little") % shamir.PRIME  # 320 bits mod a 255-bit prime: bias < 2^-64


def chain(top: int, count: int) -> list[int]:
    """[s_0, ..., s_{count-1}] from s_{count-1} = top."""
    if count == 0:
        return []
    out = [top]
    for j in range(count - 1, 0, -1):
        out.append(_step(out[-1], j))
    return out[::-1]


def descend(secret: int, index: int) -> list[int]:
    """[s_0, ..., s_index] from s_index (what a revealed secret opens)."""
    return chain(secret, index + 1)


@dataclass(frozen=True)
class LayerSecrets:
    """One client's layer secrets for one round, with the spec it reveals them by."""

    spec: LayerSpec
    secrets: tuple[int, ...]
    excess: Callable[[int], np.ndarray] | None = field(default=None, compare=False, repr=False)
    """The client's own layers 0..index as a ring vector (set by the DP layer that drew them): sent with
    the unmasking reply so the server only adds, rather than regenerating every survivor's layers. None:
    the server regenerates them from the revealed secret."""

    def __post_init__(self) -> None:
        if len(self.secrets) != self.spec.count:
            raise ValueError(f"{len(self.secrets)} layer secrets for a spec of {self.spec.count}")

    @classmethod
    def fresh(cls, spec: LayerSpec) -> "LayerSecrets":
        """A new chain from the OS CSPRNG (via `shamir.random_element`)."""
        return cls(spec=spec, secrets=tuple(chain(shamir.random_element(), spec.count)))


def layer_key(secret: int, *, client: int, index: int) -> bytes:
    """The 256-bit key of layer `index` of `client` (a CryptoRandom key). The chain is fresh for every
    round and sum, so the client id and index only separate domains."""
    return crypto.hkdf(shamir.to_bytes(secret), crypto.context("noise-layer", client, index))


def layer_keys(revealed: int, index: int, *, client: int) -> list[bytes]:
    """Keys of layers 0..index from the revealed s_index."""
    return [layer_key(s, client=client, index=j) for j, s in enumerate(descend(revealed, index))]
