"""The federated mechanisms at the secure-sum level: one round's release from its members' vectors.

Every mechanism here is a sum of (clipped) client vectors plus noise, opened as a mean. Secure
aggregation computes exactly the ring sum of the members' encoded inputs (that is what its masks
cancel to), so summing the encodings in the ring IS the protocol's output; running the masking
protocol on top would change nothing the audit can see, only the cost. Each class calls the
project's own client and server code for its mechanism, so a fault in that code (or a monkeypatch
of it, `dp.audit.faults`) changes the released values the audit measures:

| mechanism      | client                                         | server (what is released)            |
|----------------|------------------------------------------------|--------------------------------------|
| `plaintext`    | fixed-point encode (`FixedPointEncoder`)       | exact mean (and each upload: not used) |
| `secagg`       | fixed-point encode, ring sum                   | exact mean                           |
| `ddp_skellam`, `ddp_dgauss` | `DistributedDPEncoder.encode` (clip, rotate, round, integer noise) | `decode`: noisy mean |
| `central`      | `CentralDPAggregator.clip`                     | `add_noise` on the sum, / n (trusted) |

`claimed_epsilon` is what the project's accountant says of the mechanism for one client against an
observer of the released values (the audit's threat model), at any delta: the DDP plan's
`epsilon(observer='outsider')`, central DP's outsider mechanism through `dp.ledger.compose_epsilon`,
inf for the noise-free sums.
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

MECHANISMS = ("plaintext", "secagg", "ddp_skellam", "ddp_dgauss", "central")
_DDP_NAMES = {"skellam": "ddp_skellam", "discrete_gaussian": "ddp_dgauss"}


class ReleaseRefused(RuntimeError):
    """The round's sum may not be opened (fewer members than its floor, or more than its ring holds)."""


def rotation_seed(*, trial: int, round: int) -> int:
    """Public per-(trial, round) seed of the DDP rotation (anyone may know it)."""
    return int.from_bytes(hashlib.sha256(f"dp-audit-rotation/{trial}/{round}".encode()).digest()[:8], "big")


class SumMechanism(Protocol):
    name: str
    dim: int
    l2_clip: float

    def release(self, members: Sequence[tuple[int, np.ndarray]], *, trial: int, round: int) -> np.ndarray:
        """The released mean of one round's members ((client id, vector) pairs; an id may repeat if the
        round engine repeats it). Raises ReleaseRefused when the sum may not be opened."""

    def claimed_epsilon(self, *, rounds: int, delta: float) -> float:
        """The accountant's epsilon at `delta` for one client over `rounds` rounds, against observers of
        the released values."""

    def describe(self) -> dict[str, Any]: ...


def _distinct(members: Sequence[tuple[int, np.ndarray]]) -> int:
    return len({int(c) for c, _ in members})


@dataclass(frozen=True)
class DistributedDP:
    """Distributed DP (`dp.distributed`): each member encodes with its own integer noise share."""

    config: Any
    """A `dp.distributed.DistributedDPConfig`."""
    dim: int
    noise_seed: int | None = None
    """TESTS ONLY: derive each member's rounding and noise from this public seed and (trial, round,
    member), so a statistical test of the audit is repeatable; None (always, in an audit whose result is
    reported) draws them from the OS CSPRNG as a deployment does."""
    encoder: Any = field(init=False, repr=False)
    name: str = field(init=False)
    l2_clip: float = field(init=False)

    def __post_init__(self) -> None:
        from dp.distributed import DistributedDPEncoder

        object.__setattr__(self, "encoder", DistributedDPEncoder.from_config(self.config, dim=self.dim))
        object.__setattr__(self, "name", _DDP_NAMES[self.config.mechanism])
        object.__setattr__(self, "l2_clip", float(self.config.l2_clip))

    def release(self, members: Sequence[tuple[int, np.ndarray]], *, trial: int, round: int) -> np.ndarray:
        from dp.distributed import InsufficientNoiseError, TooManyClientsError

        n = _distinct(members)
        if n < self.config.protocol_floor():  # the protocol would abort before unmasking
            raise ReleaseRefused(f"{n} members < the protocol floor {self.config.protocol_floor()}")
        seed = rotation_seed(trial=trial, round=round)
        layers = self._layers(len(members), trial=trial, round=round)
        vectors = np.stack([self.encoder.encode(np.asarray(x, dtype=np.float64), round_seed=seed,
                                                rng=self._test_rng(trial, round, i), noise_layers=layers[i], client=i + 1)
                            for i, (_, x) in enumerate(members)])
        ring_sum = np.add.reduce(vectors, axis=0, dtype=np.uint32)  # uint32 arithmetic wraps: the sum mod 2^32
        if self.config.exact_noise:  # XNoise: every member sends its excess for the survivor count; the server subtracts it
            spec = self.config.layer_spec()
            index = spec.reveal_index(n)
            excess = np.zeros_like(ring_sum)
            for secrets in layers:
                self.encoder.ring.add_(excess, secrets.excess(index) if index >= 0 else np.zeros_like(ring_sum))
            ring_sum = self.encoder.remove_layers(ring_sum, spec=spec, index=index, revealed={}, excess=excess)
        try:
            return self.encoder.decode(ring_sum, round_seed=seed, n_clients=n)
        except (InsufficientNoiseError, TooManyClientsError) as exc:
            raise ReleaseRefused(str(exc)) from exc

    def _layers(self, count: int, *, trial: int, round: int) -> list:
        """Each member's XNoise layer secrets (with its excess function), or None per member without
        exact noise: from the OS CSPRNG, or (tests) from the public noise seed."""
        if not self.config.exact_noise:
            return [None] * count
        import dataclasses
        import hashlib

        from secagg import shamir
        from secagg.noise_layers import LayerSecrets, chain

        spec = self.config.layer_spec()
        out = []
        for i in range(count):
            if self.noise_seed is None:
                secrets = LayerSecrets.fresh(spec)
            else:
                top = int.from_bytes(hashlib.sha256(f"audit-test-layers/{self.noise_seed}/{trial}/{round}/{i}".encode())
                                     .digest(), "little") % shamir.PRIME
                secrets = LayerSecrets(spec=spec, secrets=tuple(chain(top, spec.count)))
            out.append(dataclasses.replace(secrets, excess=self.encoder.excess_fn(secrets, client=i + 1)))
        return out

    def _test_rng(self, trial: int, round: int, member: int):
        if self.noise_seed is None:
            return None
        import hashlib

        from secagg.prg import CryptoRandom

        return CryptoRandom(hashlib.sha256(f"audit-test-noise/{self.noise_seed}/{trial}/{round}/{member}".encode()).digest())

    def claimed_epsilon(self, *, rounds: int, delta: float) -> float:
        return float(self.encoder.plan.epsilon(observer="outsider", rounds=rounds, delta=delta))

    def describe(self) -> dict[str, Any]:
        p = self.encoder.plan
        return {"mechanism": self.name, "dim": self.dim, "noise_multiplier": p.noise_multiplier,
                "l2_clip": self.l2_clip, "min_clients": self.config.n_min,
                "expected_clients": self.config.expected_clients, "bits": self.config.bits,
                "exact_noise": self.config.exact_noise,
                "sampling_rate": self.config.sampling_rate, "scale": p.scale, "l2_inflation": p.inflation}


@dataclass(frozen=True)
class CentralDP:
    """Central DP (`dp.central`): members clip; the trusted server noises the exact sum once."""

    config: Any
    """A `dp.central.CentralDPConfig`."""
    dim: int
    aggregator: Any = field(init=False, repr=False)
    name: str = field(init=False, default="central")
    l2_clip: float = field(init=False)

    def __post_init__(self) -> None:
        from dp.central import CentralDPAggregator

        object.__setattr__(self, "aggregator", CentralDPAggregator(self.config))
        object.__setattr__(self, "l2_clip", float(self.config.l2_clip))

    def release(self, members: Sequence[tuple[int, np.ndarray]], *, trial: int, round: int) -> np.ndarray:
        n = _distinct(members)
        if n < max(2, self.config.min_cohort):
            raise ReleaseRefused(f"{n} members < the release floor {max(2, self.config.min_cohort)}")
        total = np.sum([self.aggregator.clip(np.asarray(x, dtype=np.float64)) for _, x in members], axis=0)
        return self.aggregator.add_noise(total) / n

    def claimed_epsilon(self, *, rounds: int, delta: float) -> float:
        from dp.ledger import compose_epsilon

        remaining = delta - rounds * self.config.boundary_delta
        if remaining <= 0:
            return math.inf
        mech = self.config.outsider_mechanism(self.aggregator.noise_multiplier)
        return float(compose_epsilon([(mech, rounds)], delta=remaining))

    def describe(self) -> dict[str, Any]:
        return {"mechanism": self.name, "dim": self.dim, "noise_multiplier": self.aggregator.noise_multiplier,
                "l2_clip": self.l2_clip, "sampling_rate": self.config.sampling_rate, "trusted_aggregator": True}


@dataclass(frozen=True)
class NoiseFree:
    """Plaintext or SecAgg(+) without noise: the fixed-point encoding of `secagg.encoding`, summed."""

    protocol: str
    """'plaintext' or 'secagg'."""
    dim: int
    l2_clip: float = 1.0
    """Not enforced (nothing is clipped in L2): the scale of the audit's canary and background updates."""
    coordinate_clip: float = 8.0
    max_clients: int = 1000
    min_release_group: int = 2
    encoder: Any = field(init=False, repr=False)
    name: str = field(init=False)

    def __post_init__(self) -> None:
        if self.protocol not in ("plaintext", "secagg"):
            raise ValueError(f"a noise-free mechanism is 'plaintext' or 'secagg', got {self.protocol!r}")
        from secagg.encoding import EncodingConfig, FixedPointEncoder
        from secagg.ring import RING_2_32

        object.__setattr__(self, "encoder", FixedPointEncoder(EncodingConfig(
            clip=self.coordinate_clip, max_weight=1.0, max_clients=self.max_clients), ring=RING_2_32))
        object.__setattr__(self, "name", self.protocol)

    def release(self, members: Sequence[tuple[int, np.ndarray]], *, trial: int, round: int) -> np.ndarray:
        n = len(members)
        if _distinct(members) < self.min_release_group:
            raise ReleaseRefused(f"{n} members < min_release_group={self.min_release_group}")
        vectors = np.stack([self.encoder.encode(np.asarray(x, dtype=np.float64), weight=1.0)[0] for _, x in members])
        return self.encoder.decode(np.add.reduce(vectors, axis=0, dtype=np.uint32), n_clients=n).mean

    def claimed_epsilon(self, *, rounds: int, delta: float) -> float:
        return math.inf

    def describe(self) -> dict[str, Any]:
        return {"mechanism": self.name, "dim": self.dim, "coordinate_clip": self.coordinate_clip,
                "server_sees_uploads": self.protocol == "plaintext"}


def make_mechanism(kind: str, *, dim: int, l2_clip: float = 1.0, noise_multiplier: float | None = None,
                   target_epsilon: float | None = None, delta: float = 1e-5, rounds: int = 1,
                   min_clients: int = 2, expected_clients: int = 4, bits: int = 20,
                   sampling_rate: float = 1.0, population: int | None = None,
                   noise_seed: int | None = None) -> SumMechanism:
    """A mechanism of `kind` (MECHANISMS) with the project's configs: z = `noise_multiplier`, or the z
    meeting `target_epsilon` at `delta` over `rounds` rounds (outsider, amplified by `sampling_rate`)."""
    if kind in ("plaintext", "secagg"):
        return NoiseFree(protocol=kind, dim=dim, l2_clip=l2_clip, max_clients=max(expected_clients, 2),
                         min_release_group=max(2, min_clients))
    if kind in ("ddp_skellam", "ddp_dgauss"):
        from dp.distributed import DistributedDPConfig

        config = DistributedDPConfig(l2_clip=l2_clip, noise_multiplier=noise_multiplier, target_epsilon=target_epsilon,
                                     delta=delta, mechanism="skellam" if kind == "ddp_skellam" else "discrete_gaussian",
                                     expected_clients=expected_clients, min_clients=min_clients, bits=bits,
                                     rounds=rounds, sampling_rate=sampling_rate, population=population)
        return DistributedDP(config=config, dim=dim, noise_seed=noise_seed)
    if kind == "central":
        from dp.central import CentralDPConfig

        config = CentralDPConfig(l2_clip=l2_clip, noise_multiplier=noise_multiplier, target_epsilon=target_epsilon,
                                 delta=delta, rounds=rounds, sampling_rate=sampling_rate, population=population,
                                 min_cohort=max(2, min_clients))
        return CentralDP(config=config, dim=dim)
    raise ValueError(f"mechanism is one of {MECHANISMS}, got {kind!r}")


__all__ = ["MECHANISMS", "ReleaseRefused", "SumMechanism", "DistributedDP", "CentralDP", "NoiseFree", "make_mechanism",
           "rotation_seed"]
