"""The bridge between algorithms and secure-sum protocols: the only code that unwraps a Masked part.

Client half (`SecureAggregator.client_encode`): the Masked parts a client adds to one secure sum are
encoded into one ring vector, `[w, w*clip(x)]` per part (fixed point), or clipped, rotated and
noised as a whole (distributed DP). A cluster-indexed part (`Masked(..., cluster=a, clusters=K)`)
becomes K blocks of which only block a is non-zero, so the server learns per-cluster sums and
weights but not who is in which cluster.

Server half (`SecureAggregator.server_decode`): the protocol's ring sum is decoded into per-part
weighted means (or a Released noisy mean, charged to the ledger). The round engine
(`fl_algorithms.engine.round`) builds the AggregateView from these; drivers move the vectors.

Limits enforced here, for both runtimes:
  * cohort size: a sum of more members than the encoding can add without wrap (`max_clients`, or
    the distributed-DP plan's `expected_clients`) is refused (`check_members`) before its protocol
    runs and again before decoding;
  * survivors: the protocol server is built (`server_protocol` / `protocol_params`) with its
    survivor minimum raised to the distributed-DP plan's n_min (the noise is calibrated for that
    many), or to `min_release_group` for noise-free sums, so it aborts before unmasking fewer;
  * disclosure: every noise-free aggregate passes a `secagg.disclosure_guard.DisclosureGuard`
    before server code sees it: at least `min_release_group` contributors per sum and per non-empty
    cluster of a cluster-indexed part, and no two sums of the same part in one round (or of a
    `fixed_parts` part in the whole run) whose difference isolates a client. A refused release
    raises DisclosureError, which fails that sum only. DP-noised releases are recorded and allowed.
"""
from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fl_algorithms.api import _SECURE_LAYER, DEFAULT_SUM, AggregateView, GroupAggregate, Upload
from secagg.disclosure_guard import DisclosureError, DisclosureGuard, GuardConfig
from secagg.encoding import EncodingConfig, FixedPointEncoder
from secagg.protocols import registry
from secagg.protocols.base import MAX_VECTOR_LENGTH
from secagg.simulate import run_round
from dp.sampling import SamplingRecord

MAX_PART_LENGTH = MAX_VECTOR_LENGTH
"""Largest Masked part: a layout naming more is refused before it costs memory."""
MAX_PARTS = 64
"""Most Masked parts in one secure sum."""
MAX_CLUSTERS = 1024
"""Most clusters of one cluster-indexed part."""
MIN_RELEASE_GROUP = 5
"""Default fewest contributors of a noise-free release (a sum, or one cluster of a cluster-indexed part)."""
_STATE_FORMAT = "fedsecure-nlp/secure-aggregator/v1"


def _one_release_epsilon(charge: Any, delta: float = 1e-5) -> float:
    """Epsilon of one use of a ledger charge's mechanism at `delta` (the guard's noisy-release test)."""
    from dp.ledger import compose_epsilon

    return compose_epsilon([(charge.mechanism, 1)], delta=delta)


@dataclass(frozen=True)
class SecureAggregationConfig:
    protocol: str = "secagg+"
    """One of 'plain' (insecure baseline), 'secagg', 'secagg+', 'lightsecagg'."""
    clip: float = 8.0
    """Per-coordinate range of every masked vector; values outside are clipped (and counted)."""
    max_weight: float = 1e4
    """Largest aggregation weight (e.g. a client's example count)."""
    max_clients: int = 1000
    """Most members of one secure sum: the fixed-point scales are set so that this many never wrap,
    and a larger sum is refused (`SecureAggregator.check_members`)."""
    protocol_params: Mapping[str, object] = field(default_factory=dict)
    """Extra keyword arguments of the protocol's server (e.g. degree, threshold_fraction). Its survivor
    minimum is raised to `min_release_group` (noise-free) or the DP plan's n_min (distributed DP)."""
    distributed_dp: Any = None
    """A `dp.distributed.DistributedDPConfig`: each client clips its whole contribution to a sum
    (all its Masked parts together, client-level unit) and adds integer noise before masking; the
    server gets a Released noisy mean (unweighted) and the ledger is debited. None: exact means."""
    central_dp: Any = None
    """A `dp.central.CentralDPConfig`: each client clips its whole contribution to a sum to C (client
    level, unweighted like distributed DP); the server decodes the exact sum and, TRUSTED, adds the
    Gaussian noise once (the ledger records it as non-private against the server). Exclusive with
    distributed_dp. Noise-free sums are still bound by min_release_group."""
    insecure_seed: int | None = None
    """TESTS ONLY. Derives every client's stochastic rounding and DP noise from this public seed
    and (round, sum, client), so that two runtimes can be compared bit for bit. Anyone who knows
    the seed knows the noise and can subtract it: never set it in a run whose privacy you report."""
    min_release_group: int = MIN_RELEASE_GROUP
    """Fewest contributors of a noise-free release: a sum of fewer (or a non-empty cluster of fewer,
    in a cluster-indexed part) is refused before server code sees it, and the protocol never unmasks
    fewer. Lower it only knowingly (small tests); DP-noised releases are not bound by it."""
    colluders: int = 0
    """c: enrolled clients that may collude with the server. Every protocol then needs g + c survivors
    (g = the survivor floor: `min_release_group`, or DDP's n_min) and every client c + 1 live masking
    partners, so neither an input nor a sum over fewer than g honest clients is opened however the
    server chooses the dropouts; SecAgg/SecAgg+ need c below their threshold, LightSecAgg c <= T.
    0 (the default) claims nothing against colluding clients."""
    fixed_parts: tuple[str, ...] = ()
    """Masked parts whose per-client vector is the same in every round (e.g. a fixed document-mean
    summary): the disclosure guard tracks their releases over the whole run (checkpointed with
    `SecureAggregator.state_dict`), so that two rounds' sums over overlapping cohorts cannot be
    differenced to isolate a client. Other parts (fresh model updates) are tracked per round."""

    def __post_init__(self) -> None:
        if self.protocol not in registry.names():
            raise ValueError(f"unknown protocol '{self.protocol}'; choose one of {registry.names()}")
        if isinstance(self.distributed_dp, Mapping):  # from a TOML table
            from dp.distributed import DistributedDPConfig

            object.__setattr__(self, "distributed_dp", DistributedDPConfig(**self.distributed_dp))
        if isinstance(self.central_dp, Mapping):
            from dp.central import CentralDPConfig

            object.__setattr__(self, "central_dp", CentralDPConfig(**self.central_dp))
        if self.central_dp is not None and self.distributed_dp is not None:
            raise ValueError("choose central_dp or distributed_dp, not both")
        if self.distributed_dp is not None and self.distributed_dp.exact_noise and self.protocol == "plain":
            raise ValueError("distributed_dp exact_noise removes noise layers through the secure protocol's shares: "
                             "use 'secagg', 'secagg+' or 'lightsecagg', not 'plain'")
        object.__setattr__(self, "fixed_parts", tuple(sorted({str(p) for p in self.fixed_parts})))
        for name in ("max_clients", "min_release_group", "colluders"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ValueError(f"{name} must be an int, got {value!r}")
            object.__setattr__(self, name, int(value))
        if self.max_clients < 1:
            raise ValueError(f"max_clients must be positive, got {self.max_clients}")
        if self.colluders < 0:
            raise ValueError(f"colluders must be >= 0, got {self.colluders}")
        group = self.min_release_group
        if group < 2:
            raise ValueError(f"min_release_group must be an int >= 2 (one member's sum is its input), got {group}")
        floor, why = self.survivor_floor()
        if self.distributed_dp is None and group > self.max_clients:
            raise ValueError(f"min_release_group={group} exceeds max_clients={self.max_clients}: no noise-free "
                             "sum could ever be released")
        for key in ("min_clients", "target_survivors"):
            given = self.protocol_params.get(key)
            if isinstance(given, int) and not isinstance(given, bool) and given < floor:
                raise ValueError(f"protocol_params {key}={given} is below {why}={floor}: the protocol could "
                                 "unmask a sum that must not be opened; raise it or leave it out")

    def survivor_floor(self) -> tuple[int, str]:
        """(fewest survivors a sum may be unmasked with, the setting that says so)."""
        if self.distributed_dp is not None:
            return self.distributed_dp.protocol_floor(), "distributed_dp min_clients (n_min)"
        return self.min_release_group, "min_release_group"

    @property
    def max_members(self) -> int:
        """Most members of one sum: the DP plan's expected_clients under distributed DP, else max_clients."""
        return self.distributed_dp.expected_clients if self.distributed_dp is not None else self.max_clients

    @property
    def ring(self):
        return registry.default_ring(self.protocol)

    def describe(self) -> dict[str, Any]:
        """What a server and its clients must agree on (compared at every broadcast in deployment)."""
        import dataclasses
        import json

        ddp, central = self.distributed_dp, self.central_dp
        doc = {"protocol": self.protocol, "clip": self.clip, "max_weight": self.max_weight,
               "max_clients": self.max_clients, "protocol_params": dict(self.protocol_params),
               "distributed_dp": None if ddp is None else dataclasses.asdict(ddp),
               "central_dp": None if central is None else dataclasses.asdict(central),
               "insecure_seed": self.insecure_seed, "min_release_group": self.min_release_group,
               "colluders": self.colluders,
               "fixed_parts": list(self.fixed_parts)}
        return json.loads(json.dumps(doc, default=str))  # as it reads after a trip over the wire


@dataclass(frozen=True)
class Layout:
    """Names, lengths and cluster counts of the parts in one sum, in the order they are concatenated.

    Each entry is (name, n, k): k = 0 for an ordinary part, k >= 1 for a cluster-indexed part of
    k blocks of n values each. In the fixed-point ring vector an ordinary part is [w, w x] (n + 1
    values) and each cluster block is [w, w x, member count] (n + 2 values: the count, an exact
    integer 0 or 1 per client, lets the server enforce a minimum group size per cluster).
    """

    parts: tuple[tuple[str, int, int], ...]

    @classmethod
    def of(cls, upload: Upload, parts: tuple[str, ...] | None = None) -> "Layout":
        names = sorted(upload.masked) if parts is None else list(parts)
        missing = [n for n in names if n not in upload.masked]
        if missing:
            raise ValueError(f"the upload lacks the Masked parts {missing} of this sum")
        return cls(tuple((n, len(upload.masked[n]), upload.masked[n].clusters or 0) for n in names))

    @property
    def length(self) -> int:
        """Length of the fixed-point ring vector: a weight slot per part, weight and count slots per cluster block."""
        return sum(_width(n, k) for _, n, k in self.parts)

    @property
    def dim(self) -> int:
        """Number of real values (what distributed DP clips and noises)."""
        return sum(n * max(k, 1) for _, n, k in self.parts)

    def validate(self) -> "Layout":
        """Bounds a layout received from a peer must satisfy before it costs memory."""
        if len(self.parts) > MAX_PARTS:
            raise ValueError(f"{len(self.parts)} parts in one sum (limit {MAX_PARTS})")
        names = [n for n, _, _ in self.parts]
        if len(set(names)) != len(names) or any(not n or len(n) > 128 for n in names):
            raise ValueError("part names must be distinct strings of 1..128 characters")
        for name, n, k in self.parts:
            if not 0 <= n <= MAX_PART_LENGTH or not 0 <= k <= MAX_CLUSTERS or n * max(k, 1) > MAX_PART_LENGTH:
                raise ValueError(f"part '{name}' of {n} values x {k} clusters is outside the limits")
        return self


def _width(n: int, k: int) -> int:
    """Ring values of one part of n values and k clusters (k = 0: an ordinary part)."""
    return n + 1 if k == 0 else k * (n + 2)


@dataclass
class SecureRoundStats:
    seconds: float = 0.0
    clipped: int = 0
    bytes_uploaded: dict[int, int] = field(default_factory=dict)
    dropped: dict[str, frozenset[int]] = field(default_factory=dict)


@dataclass(frozen=True)
class EncodedInput:
    """A client's input to one secure sum: its layout, its ring vector, and how much it clipped."""

    layout: Layout
    vector: np.ndarray
    clipped: int
    noise_layers: Any = None
    """XNoise: this client's removable-noise layer secrets (`secagg.noise_layers.LayerSecrets`) for the
    protocol to share, or None."""


def _key(seed: int, *labels: object) -> bytes:
    return hashlib.sha256("/".join(["fedsecure-insecure-test-seed", str(seed), *map(str, labels)]).encode()).digest()


class SecureAggregator:
    """Both halves of the secure layer, plus an in-memory driver for one-sum rounds.

    With `distributed_dp` set, every sum carries the clients' integer DP noise and is charged to
    `ledger`; `transcript` (a `dp.leakage.Transcript`) records exactly what the server received.
    The server half owns the run's disclosure guard (`guard`); its history of `fixed_parts` is
    server state to checkpoint (`state_dict` / `load_state_dict`).
    """

    def __init__(self, config: SecureAggregationConfig, *, ledger=None, transcript=None,
                 client_side: bool = False) -> None:
        """`client_side=True`: only the client half is used (it encodes; it never decodes or charges)."""
        self.config = config
        self.encoder = FixedPointEncoder(
            EncodingConfig(clip=config.clip, max_weight=config.max_weight, max_clients=config.max_clients),
            ring=config.ring,
        )
        self.ledger, self.transcript = ledger, transcript
        self._ddp: dict[int, Any] = {}
        self._central = None
        if (config.distributed_dp is not None or config.central_dp is not None) and ledger is None and not client_side:
            raise ValueError("distributed or central DP needs a ledger to charge")
        self.guard: DisclosureGuard | None = None if client_side else \
            DisclosureGuard(GuardConfig(min_cohort=config.min_release_group), ledger=ledger,
                            noise_epsilon=_one_release_epsilon)
        self._guard_round: int | None = None
        self._round_keys: set[str] = set()

    @property
    def ddp(self) -> bool:
        return self.config.distributed_dp is not None

    @property
    def central(self):
        """The trusted server's Gaussian mechanism (`dp.central.CentralDPAggregator`), or None."""
        if self.config.central_dp is None:
            return None
        if self._central is None:
            from dp.central import CentralDPAggregator

            self._central = CentralDPAggregator(self.config.central_dp)
        return self._central

    @property
    def amplification_rate(self) -> float:
        """The sampling rate the run's DP mechanism claims against outsiders (1: none, or no DP); Poisson,
        or without replacement for central DP configured with the fixed-size sampler."""
        dp_config = self.config.distributed_dp or self.config.central_dp
        return dp_config.sampling_rate if dp_config is not None else 1.0

    def record_skip(self, *, round: int, sum_name: str, population: Iterable[int],
                    sampling: SamplingRecord | None) -> list:
        """A sampled round whose sum released nothing (cohort below the floor, or aborted): under amplified
        DP it still counts towards the boundary delta (`dp.sampling`), so every client of the population
        gets a zero-cost NoRelease entry (one per run and sum, counting the rounds; why each round released
        nothing is in its RoundRecord). Without amplification nothing is recorded."""
        q = self.amplification_rate
        fixed_size = getattr(self.config.central_dp, "sampler", "poisson") == "fixed_size"
        if q >= 1 or self.ledger is None or fixed_size:  # a fixed-size cohort adds no boundary delta
            return []
        from dp.ledger import NoReleaseMechanism, Observer, PrivacyUnit

        summary_key = "model-update" if sum_name == DEFAULT_SUM else f"model-update/{sum_name}"
        return self.ledger.debit_many(sorted(int(c) for c in population), NoReleaseMechanism("the round released nothing", sampling_rate=q),
                                      unit=PrivacyUnit.CLIENT, observer=Observer.OUTSIDER, round_id=round,
                                      summary_key=summary_key, sampling=sampling)

    @property
    def exact_noise(self) -> bool:
        return self.ddp and self.config.distributed_dp.exact_noise

    def layer_spec(self, members: int | None = None):
        """XNoise layers of a sum of `members` clients (None without exact noise; `members` None: the ring's
        most, expected_clients): from this side's own config, so a client never reveals more than its
        configuration allows."""
        if not self.exact_noise:
            return None
        return self.config.distributed_dp.layer_spec(colluders=self.config.colluders, members=members)

    def ddp_encoder(self, dim: int):
        if dim not in self._ddp:
            from dp.distributed import DistributedDPEncoder

            self._ddp[dim] = DistributedDPEncoder.from_config(self.config.distributed_dp, dim=dim, ring=self.config.ring)
        return self._ddp[dim]

    @staticmethod
    def rotation_seed(round: int, sum_name: str = DEFAULT_SUM) -> int:
        """Public per-round (per-sum) seed of the randomised Hadamard rotation (anyone may know it)."""
        label = f"ddp-rotation/{round}" if sum_name == DEFAULT_SUM else f"ddp-rotation/{round}/{sum_name}"
        return int.from_bytes(hashlib.sha256(label.encode()).digest()[:8], "big")

    def input_length(self, layout: Layout) -> int:
        """Length of the ring vector every member of a sum with this layout contributes."""
        return self.ddp_encoder(layout.dim).length if self.ddp and layout.parts else layout.length

    # ---- limits -----------------------------------------------------------------------------
    @property
    def max_members(self) -> int:
        return self.config.max_members

    def check_members(self, n: int) -> None:
        """Refuse a sum over `n` members that the encoding cannot add without wrap (ValueError).

        Call it when a round is configured, before any client encodes; `run_sum`, `aggregate`,
        `server_protocol` and `server_decode` call it too."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"a sum needs a positive int member count, got {n!r}")
        if self.ddp:
            self.config.distributed_dp.check_cohort(int(n))
        else:
            self.encoder.check_count(int(n))

    def protocol_params(self, *, members: int, overrides: Mapping[str, object] | None = None) -> dict[str, object]:
        """Keyword arguments of the protocol server for one sum of `members` clients: the run's
        `protocol_params`, the sum's `overrides`, then the survivor minimum raised to the floor
        (n_min under distributed DP, else `min_release_group`), so the protocol aborts rather than
        unmask a sum that must not be opened. A sum that cannot reach the floor is refused here."""
        self.check_members(members)
        params = {**dict(self.config.protocol_params), **dict(overrides or {})}
        floor, why = self.config.survivor_floor()
        if members < floor:
            message = f"a secure sum of {members} members cannot reach {why}={floor}"
            if self.ddp:
                from dp.distributed import InsufficientNoiseError

                raise InsufficientNoiseError(message + ": its summed noise would be below the calibrated level")
            raise DisclosureError(message + ": a noise-free sum of fewer may not be released",
                                  summary_key="secure-sum")
        c = self.config.colluders
        if members < floor + c:
            raise DisclosureError(f"a secure sum of {members} members cannot reach {why}={floor} honest survivors "
                                  f"besides {c} colluders", summary_key="secure-sum")
        if self.config.protocol == "lightsecagg":
            import math

            from secagg.protocols.lightsecagg import resolve_count

            target = resolve_count(params.get("target_survivors", 0.8), members, name="target_survivors",
                                   rounding=math.ceil)
            params["target_survivors"] = max(target, floor)
            params["min_group"] = max(int(params.get("min_group", 1)), floor)
            params["colluders"] = c
        elif self.config.protocol != "plain":
            params["min_clients"] = max(int(params.get("min_clients", 2)), floor)
            params["colluders"] = c
        else:
            params["min_clients"] = max(int(params.get("min_clients", 2)), floor + c)
        return params

    def client_protocol_params(self) -> dict[str, object]:
        """Keyword arguments of every client's protocol: its own floors, so that a client refuses a
        round announcing fewer colluders or a smaller group than the run was configured with."""
        floor, _ = self.config.survivor_floor()
        c = self.config.colluders
        if self.config.protocol == "lightsecagg":
            return {"min_colluders": c, "min_group": floor}
        if self.config.protocol in ("secagg", "secagg+"):
            from secagg.protocols.secagg import ClientPolicy

            return {"policy": ClientPolicy(min_colluders=c, min_group=floor)}
        return {}

    def server_protocol(self, *, round_id: int, members: Iterable[int], length: int,
                        overrides: Mapping[str, object] | None = None, sized_for: int | None = None, **extra: object):
        """The configured protocol's server for one sum, built with `protocol_params` (both runtimes
        should build it here). `extra`: constructor arguments that are not survivor policy (e.g. an
        enrolment roster); they may not name the survivor minimum. `sized_for`: the size the members'
        exact-noise layers were drawn for (the broadcast's; default: the members given)."""
        clients = sorted(int(c) for c in members)
        params = self.protocol_params(members=len(clients), overrides=overrides)
        clash = sorted(set(extra) & {"min_clients", "target_survivors", "min_group", "colluders", "round_id", "clients",
                                     "length", "ring", "noise_layers"})
        if clash:
            raise ValueError(f"server_protocol: {clash} are set by the secure layer; pass policy in `overrides`")
        if self.exact_noise:
            params["noise_layers"] = self.layer_spec(len(clients) if sized_for is None else sized_for)
        return registry.server_class(self.config.protocol)(round_id=round_id, clients=clients, length=length,
                                                           ring=self.config.ring, **params, **extra)

    def refuse_forgeable_counts(self, layout: "Layout") -> None:
        """Cluster-indexed parts are noise-free and their per-cluster minimum rests on member counts
        that come from the clients' own (masked, unverifiable) vectors: a malicious client can move
        count into a cluster that holds one honest client, and the server then decodes that client's
        vector. So they are refused when the run declares colluding clients (`colluders` > 0); with
        colluders = 0 they hold against an honest-but-curious server and honest clients only."""
        if self.config.colluders and any(k for _, _, k in layout.parts):
            raise DisclosureError(f"cluster-indexed parts cannot be protected against {self.config.colluders} "
                                  "colluding clients: their member counts can be forged (no proof that a count "
                                  "vector is one-hot); use ordinary parts or colluders=0", summary_key="secure-sum")

    # ---- client half ------------------------------------------------------------------------
    def client_encode(self, upload: Upload, *, parts: tuple[str, ...] | None, round: int,
                      sum_name: str = DEFAULT_SUM, client_id: int = 0, members: int | None = None) -> EncodedInput:
        """Client side: the ring vector of this client's parts in one sum (fixed point or DDP). `members`: how
        many clients the sum has (the broadcast's `sum_sizes`), which sizes exact noise's layers."""
        layout = Layout.of(upload, parts)
        self.refuse_forgeable_counts(layout)
        seed = self.config.insecure_seed
        if self.ddp:
            if any(k for _, _, k in layout.parts):
                raise ValueError("cluster-indexed parts under distributed DP are not supported yet")
            x = np.concatenate([self._part_values(upload, name)[0] for name, _, _ in layout.parts]) \
                if layout.parts else np.zeros(0)
            rng, layers = None, None
            if seed is not None:
                from dp.samplers import CryptoRandom

                rng = CryptoRandom(_key(seed, "ddp", round, sum_name, client_id))
            if self.exact_noise and layout.parts:
                from secagg import shamir
                from secagg.noise_layers import LayerSecrets, chain

                spec = self.layer_spec(members)
                layers = LayerSecrets.fresh(spec) if seed is None else LayerSecrets(spec=spec, secrets=tuple(chain(
                    int.from_bytes(_key(seed, "xnoise", round, sum_name, client_id), "little") % shamir.PRIME, spec.count)))
            encoder = self.ddp_encoder(x.shape[0])
            if layers is not None:  # the client sends its own excess at the removal (the server only adds)
                layers = dataclasses.replace(layers, excess=encoder.excess_fn(layers, client=client_id))
            vec = encoder.encode(x, round_seed=self.rotation_seed(round, sum_name), rng=rng,
                                 noise_layers=layers, client=client_id)
            return EncodedInput(layout=layout, vector=vec, clipped=0, noise_layers=layers)
        clipped_parts = self._central_clip(upload, layout) if self.config.central_dp is not None else None
        pieces, clipped = [], 0
        for index, (name, n, k) in enumerate(layout.parts):
            part = upload.masked[name]
            key = None if seed is None else _key(seed, "rounding", round, sum_name, client_id, index)
            if clipped_parts is not None:  # central DP: unweighted, the whole contribution clipped to C
                vec, report = self.encoder.encode(clipped_parts[name], weight=1.0, rounding_key=key)
                clipped += report.clipped
                pieces.append(vec)
                continue
            values, own = self._part_values(upload, name)
            vec, report = self.encoder.encode(values, weight=part.weight, rounding_key=key)
            clipped += report.clipped + own
            if k == 0:
                pieces.append(vec)
            else:  # cluster-indexed: the client's block [w, w x, 1], zeros (exact) everywhere else
                blocks = np.zeros((k, n + 2), dtype=np.uint32)
                blocks[part.cluster, : n + 1] = vec
                blocks[part.cluster, n + 1] = 1
                pieces.append(blocks.ravel())
        vector = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.uint32)
        return EncodedInput(layout=layout, vector=vector, clipped=clipped)

    def _part_values(self, upload: Upload, name: str) -> tuple[np.ndarray, int]:
        """Part `name`'s values under its own `Masked(clip=)` (coordinates clipped to +-clip, and how many
        were), which may only tighten the run's fixed-point range `clip`: a wider one is refused, never
        silently narrowed to the run's."""
        part = upload.masked[name]
        x = part.unwrap(_SECURE_LAYER)
        if part.clip is None:
            return x, 0
        if part.clip > self.config.clip:
            raise ValueError(f"part {name!r} asks for clip {part.clip:g}, above this run's secure clip "
                             f"{self.config.clip:g} (the fixed-point range every sum is encoded in): raise "
                             f"SecureAggregationConfig.clip or give the part a clip at most {self.config.clip:g}")
        clipped = np.clip(x, -part.clip, part.clip)
        return clipped, int(np.count_nonzero(clipped != x))

    def _central_clip(self, upload: Upload, layout: Layout) -> dict[str, np.ndarray]:
        """Central DP, client side: all of this sum's parts together clipped to L2 norm C, split back."""
        if any(k for _, _, k in layout.parts):
            raise ValueError("cluster-indexed parts under central DP are not supported")
        x = np.concatenate([self._part_values(upload, name)[0] for name, _, _ in layout.parts]) \
            if layout.parts else np.zeros(0)
        from dp.central import clip_l2

        x = clip_l2(x, l2_clip=self.config.central_dp.l2_clip)  # clients clip; only the server calibrates noise
        out, start = {}, 0
        for name, n, _ in layout.parts:
            out[name] = x[start:start + n]
            start += n
        return out

    def encode_upload(self, upload: Upload, layout: Layout) -> tuple[np.ndarray, int]:
        """Client side, fixed point: the ring vector of all Masked parts and how many values were clipped."""
        if Layout.of(upload) != layout:
            raise ValueError(f"upload parts {Layout.of(upload).parts} differ from the round's {layout.parts}")
        enc = self.client_encode(upload, parts=tuple(n for n, _, _ in layout.parts), round=0)
        return enc.vector, enc.clipped

    # ---- server half ------------------------------------------------------------------------
    def _decode_exact(self, ring_sum: np.ndarray, layout: Layout,
                      count: int) -> tuple[dict[str, GroupAggregate], dict[str, list[int]]]:
        """Per-part weighted means from a fixed-point ring sum (cluster k of part p is 'p[k]'), and
        per cluster-indexed part its member count per cluster. Unguarded: `server_decode` only."""
        ring = self.encoder.ring
        if ring_sum.shape != (layout.length,):
            raise ValueError(f"ring sum of shape {ring_sum.shape}, expected ({layout.length},)")
        self.refuse_forgeable_counts(layout)
        out, counts, start = {}, {}, 0
        for name, n, k in layout.parts:
            if k == 0:
                dec = self.encoder.decode(ring_sum[start: start + n + 1], n_clients=count)
                start += n + 1
                out[name] = GroupAggregate(mean=dec.mean, total_weight=dec.total_weight, count=count,
                                           error_bound=self.encoder.mean_error_bound(n_clients=count,
                                                                                     total_weight=dec.total_weight))
                continue
            blocks = ring_sum[start: start + k * (n + 2)].reshape(k, n + 2)
            start += k * (n + 2)
            members = [int(m) for m in ring.to_signed(blocks[:, n + 1])]
            if any(m < 0 for m in members) or sum(members) != count:
                raise ValueError(f"part '{name}': per-cluster member counts {members} do not add up to the "
                                 f"{count} contributors (a corrupted or forged sum)")
            counts[name] = members
            for block, m in enumerate(members):
                key = f"{name}[{block}]"
                if m == 0:  # an empty cluster: nothing to decode
                    if int(ring.to_signed(blocks[block, :1])[0]) != 0:
                        raise ValueError(f"part '{key}': an empty cluster with a non-zero weight (a corrupted sum)")
                    out[key] = GroupAggregate(mean=np.full(n, np.nan), total_weight=0.0, count=0, error_bound=float("nan"))
                    continue
                dec = self.encoder.decode(blocks[block, : n + 1], n_clients=m)
                bound = self.encoder.mean_error_bound(n_clients=m, total_weight=dec.total_weight)
                out[key] = GroupAggregate(mean=dec.mean, total_weight=dec.total_weight, count=m, error_bound=bound)
        return out, counts

    def _summary_key(self, part: str, round: int) -> str:
        """Guard key of one part: run-wide for `fixed_parts`, else per round (fresh vectors each round)."""
        return part if part in self.config.fixed_parts else f"round {round}/{part}"

    def _enter_round(self, round: int) -> None:
        """Forget the per-round guard history of earlier rounds (those vectors are never summed again)."""
        if self._guard_round != round:
            self.guard.forget(self._round_keys)
            self._round_keys.clear()
            self._guard_round = round

    def _use_key(self, part: str, round: int) -> str:
        key = self._summary_key(part, round)
        if part not in self.config.fixed_parts:
            self._round_keys.add(key)
        return key

    def _guard_exact(self, *, layout: Layout, contributors: frozenset[int], counts: Mapping[str, list[int]],
                     round: int, sum_name: str) -> None:
        """Every rule on every part first (nothing recorded), then record: a refusal leaves no trace."""
        guard = self.guard
        keys = {name: self._summary_key(name, round) for name, _, _ in layout.parts}
        try:
            for name, members in counts.items():
                for block, m in enumerate(members):
                    guard.authorize_count(f"{keys[name]}[{block}]", m)
            for name, _, _ in layout.parts:  # a cluster-indexed part also releases its total over all clusters
                guard.check(keys[name], contributors)
        except DisclosureError as exc:
            raise DisclosureError(f"round {round}, secure sum '{sum_name}' refused by the disclosure guard "
                                  f"(min_release_group={self.config.min_release_group}): {exc}",
                                  summary_key=exc.summary_key, exposed=exc.exposed) from exc
        for name, _, _ in layout.parts:
            guard.authorize(self._use_key(name, round), contributors)

    def server_decode(self, ring_sum: np.ndarray, *, layout: Layout, contributors: frozenset[int], round: int,
                      sum_name: str = DEFAULT_SUM, population: Iterable[int] | None = None,
                      sampling: SamplingRecord | None = None, layer_index: int = -1,
                      layer_secrets: Mapping[int, int] | None = None, layer_excess: np.ndarray | None = None,
                      members: int | None = None):
        """Server side: (per-part aggregates, the Released noisy mean under DDP or None). Under exact
        noise, `layer_index`, `layer_excess` and `layer_secrets` (the protocol's `RoundResult`) remove the
        survivors' excess noise layers before anything is decoded; `members` is the sum's size, which
        sized the layers (as in `server_protocol` and the clients' `client_encode`).

        Refuses (ValueError) more contributors than the encoding can sum, and (DisclosureError) a
        noise-free release the disclosure guard refuses; either fails this sum only."""
        if self.guard is None:
            raise RuntimeError("a client-side aggregator does not decode")
        if not layout.parts:
            return {}, None
        contributors = frozenset(int(c) for c in contributors)
        self.check_members(len(contributors))
        self._enter_round(round)
        summary_key = "model-update" if sum_name == DEFAULT_SUM else f"model-update/{sum_name}"
        if not self.ddp:
            groups, counts = self._decode_exact(ring_sum, layout, len(contributors))
            self._guard_exact(layout=layout, contributors=contributors, counts=counts, round=round, sum_name=sum_name)
            if self.config.central_dp is None:
                return groups, None
            return self._central_release(groups, layout=layout, contributors=contributors, round=round,
                                         population=population, summary_key=summary_key, sampling=sampling)
        encoder, spec = self.ddp_encoder(layout.dim), self.layer_spec(members)
        if spec is not None and layer_index >= 0:
            if not set(layer_secrets or {}) <= set(contributors):
                raise ValueError(f"noise layers revealed for {sorted(layer_secrets or {})[:5]}..., not contributors")
            ring_sum = encoder.remove_layers(ring_sum, spec=spec, index=layer_index, revealed=layer_secrets or {},
                                             excess=layer_excess)
        elif layer_index >= 0:
            raise ValueError("noise layers revealed for a sum without exact noise")
        noise = encoder.noise_record(spec=spec, survivors=len(contributors), index=layer_index,
                                     colluders=self.config.colluders)
        released = encoder.release(
            ring_sum, round_seed=self.rotation_seed(round, sum_name), round_id=round, contributors=contributors,
            ledger=self.ledger, population=sorted(population) if population is not None else sorted(contributors),
            summary_key=summary_key, sampling=sampling, noise=noise)
        self.guard.authorize(self._use_key(summary_key, round), contributors, noise=released)
        groups, start = {}, 0
        for name, n, _ in layout.parts:
            groups[name] = GroupAggregate(mean=np.asarray(released.payload[start:start + n]),
                                          total_weight=float(len(contributors)), count=len(contributors),
                                          error_bound=float("nan"))
            start += n
        return groups, released

    def _central_release(self, groups: Mapping[str, GroupAggregate], *, layout: Layout, contributors: frozenset[int],
                         round: int, population: Iterable[int] | None, summary_key: str,
                         sampling: SamplingRecord | None):
        """Central DP, server side: the exact sum of clipped vectors plus the trusted server's noise, charged."""
        count = len(contributors)
        total = np.concatenate([groups[name].mean * count for name, _, _ in layout.parts])
        released = self.central.release(total, round_id=round, contributors=contributors, ledger=self.ledger,
                                        population=sorted(population) if population is not None else sorted(contributors),
                                        summary_key=summary_key, total_weight=float(count), sampling=sampling)
        out, start = {}, 0
        for name, n, _ in layout.parts:
            out[name] = GroupAggregate(mean=np.asarray(released.payload[start:start + n]), total_weight=float(count),
                                       count=count, error_bound=float("nan"))
            start += n
        return out, released

    # ---- server state -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Server state to checkpoint with the run: the guard's run-wide history (`fixed_parts`)."""
        if self.guard is None:
            raise RuntimeError("a client-side aggregator keeps no server state")
        run_wide = [k for k in self.guard.keys() if k not in self._round_keys]
        return {"format": _STATE_FORMAT, "guard": self.guard.state_dict(keys=run_wide)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if self.guard is None:
            raise RuntimeError("a client-side aggregator keeps no server state")
        if state.get("format") != _STATE_FORMAT:
            raise ValueError("not a secure-aggregator state")
        self.guard.load_state_dict(dict(state["guard"]))
        self._guard_round, self._round_keys = None, set()

    def record_individuals(self, round: int, inputs: Mapping[int, EncodedInput], contributors: Iterable[int]) -> None:
        """The plain protocol shows the server every client's vector: record what it saw."""
        if self.transcript is None or self.config.protocol != "plain" or self.ddp:
            return
        for cid in contributors:
            enc, start = inputs[cid], 0
            for name, n, k in enc.layout.parts:
                if k == 0:
                    dec = self.encoder.decode(enc.vector[start:start + n + 1], n_clients=1)
                    self.transcript.record_individual(round, cid, name, dec.weighted_sum / dec.total_weight)
                start += _width(n, k)

    # ---- in-memory driver of one sum --------------------------------------------------------
    def run_sum(self, *, round_id: int, inputs: Mapping[int, np.ndarray], length: int,
                protocol_params: Mapping[str, object] | None = None,
                drop_at: Mapping[str, set[int]] | None = None, bytes_sent: dict[int, int] | None = None,
                noise_layers: Mapping[int, Any] | None = None, sized_for: int | None = None):
        """Run the configured protocol over `inputs` in this process; returns its RoundResult.
        `noise_layers`: each client's XNoise layer secrets (`EncodedInput.noise_layers`).

        The protocol is built by `server_protocol`: a sum over too many members, or too few to reach
        the survivor floor, is refused before anything runs."""
        server = self.server_protocol(round_id=round_id, members=inputs, length=length, overrides=protocol_params,
                                      sized_for=sized_for)
        policy = self.client_protocol_params()
        layers = dict(noise_layers or {})
        if self.exact_noise and set(layers) != set(inputs):
            raise ValueError("exact noise: every input needs its noise layers")
        extra = (lambda cid: {"noise_layers": layers[cid]}) if self.exact_noise else (lambda cid: {})
        clients = {cid: registry.client_class(self.config.protocol)(client_id=cid, round_id=round_id,
                                                                    input_fn=lambda v=vec: v, **policy, **extra(cid))
                   for cid, vec in inputs.items()}
        return run_round(server, clients, drop_at=drop_at, bytes_sent=bytes_sent)

    def plain_sum(self, *, round_id: int, inputs: Mapping[int, np.ndarray], length: int) -> np.ndarray:
        """The plaintext protocol's sum of `inputs` in this config's ring: what the configured protocol's
        sum over the same contributors must equal (`RunConfig.plain_twin`; simulation only)."""
        server = registry.server_class("plain")(round_id=round_id, clients=sorted(inputs), length=length,
                                                ring=self.config.ring, min_clients=1)
        clients = {cid: registry.client_class("plain")(client_id=cid, round_id=round_id, input_fn=lambda v=vec: v)
                   for cid, vec in inputs.items()}
        return run_round(server, clients).ring_sum

    def aggregate(self, *, round: int, uploads: Mapping[int, Upload], drop_at: Mapping[str, set[int]] | None = None,
                  stats: SecureRoundStats | None = None, population: Iterable[int] | None = None,
                  sampling: SamplingRecord | None = None) -> AggregateView:
        """One secure sum of all Masked parts of `uploads`, in memory (all parties in this process).

        `population` (default: the uploaders) is every client that could have been sampled: with
        distributed DP amplified by sampling, all of them are charged against outsiders.
        """
        if not uploads:
            raise ValueError("no uploads to aggregate")
        self.check_members(len(uploads))  # before any client encodes
        inputs = {cid: self.client_encode(up, parts=None, round=round, client_id=cid, members=len(uploads))
                  for cid, up in uploads.items()}
        layouts = {enc.layout for enc in inputs.values()}
        if len(layouts) != 1:
            raise ValueError("all uploads of a round must have the same parts")
        layout = layouts.pop()
        t0 = time.perf_counter()
        sent: dict[int, int] = {}
        result = self.run_sum(round_id=round, inputs={c: e.vector for c, e in inputs.items()},
                              length=self.input_length(layout), drop_at=drop_at, bytes_sent=sent,
                              noise_layers={c: e.noise_layers for c, e in inputs.items()} if self.exact_noise else None)
        groups, released_sum = self.server_decode(result.ring_sum, layout=layout, contributors=result.contributors,
                                                  round=round, population=population if population is not None else uploads,
                                                  sampling=sampling, layer_index=result.layer_index,
                                                  layer_secrets=result.layer_secrets, layer_excess=result.layer_excess,
                                                  members=len(uploads))
        self.record_individuals(round, inputs, result.contributors)
        if stats is not None:
            stats.seconds += time.perf_counter() - t0
            stats.clipped += sum(e.clipped for e in inputs.values())
            stats.dropped = dict(result.dropped)
            stats.bytes_uploaded = sent
        released = {
            name: {cid: uploads[cid].released[name] for cid in result.contributors if name in uploads[cid].released}
            for name in {n for u in uploads.values() for n in u.released}
        }
        if released_sum is not None:
            released["model-update"] = {0: released_sum}
        view = build_view(round=round, groups=groups, released=released, contributors=result.contributors)
        if self.transcript is not None:
            self.transcript.record_view(view, cohort=sorted(uploads))
        return view


def build_view(*, round: int, groups: Mapping[str, GroupAggregate] | None = None,
               released: Mapping[str, Mapping[int, object]], contributors: frozenset[int],
               sums: Mapping[str, Mapping[str, GroupAggregate]] | None = None,
               sum_contributors: Mapping[str, frozenset[int]] | None = None,
               failed: Mapping[str, str] | None = None) -> AggregateView:
    """Construct an AggregateView (secure layer and round engine only)."""
    return AggregateView(round=round, groups=groups, released=released, contributors=contributors,
                         capability=_SECURE_LAYER, sums=sums, sum_contributors=sum_contributors, failed=failed)
