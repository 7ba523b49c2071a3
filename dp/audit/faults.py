"""Deliberate faults, applied in memory (monkeypatch, undone on exit), for the audit to catch.

Each fault is a context manager that patches the project's own DP code the way a real bug would
break it; nothing on disk changes. Inside the context every mechanism built on that code is faulty
(the secure-sum level of `dp.audit.mechanisms` and a `SimulationRunner` run alike).

| fault                     | what it breaks                                                          |
|---------------------------|-------------------------------------------------------------------------|
| `ddp_noise_halved`        | every DDP noise share has half its stddev (Skellam and discrete Gaussian) |
| `noise_share_missing`     | in every DDP secure sum, the first member to encode adds no noise share |
| `clipping_skipped`        | no L2 clipping: DDP encodes, and central DP's client clip, pass the update as is |
| `client_counted_twice`    | the cohort sampler lists its first client twice: it encodes twice and both enter the sum |
| `sampling_rate_understated` | the accountant gets a sampling rate ten times below the real one (DDP and central outsiders) |

What each does to a client's privacy depends on the configuration (a missing share among many is
harmless; among n_min = 2 it halves the noise variance), which is why the self-test
(`dp.audit.selftest`) states the configuration each fault is audited in.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from unittest import mock

import numpy as np


@contextlib.contextmanager
def ddp_noise_halved() -> Iterator[None]:
    """Skellam(lam) -> Skellam(lam / 4) and N_Z(sigma) -> N_Z(sigma / 2): each share's stddev halved."""
    import dp.distributed as ddp

    skellam, dgauss = ddp.skellam, ddp.discrete_gaussian
    with mock.patch.object(ddp, "skellam", lambda lam, n, rng: skellam(lam / 4.0, n, rng)), \
            mock.patch.object(ddp, "discrete_gaussian", lambda sigma, n, rng: dgauss(sigma / 2.0, n, rng)):
        yield


@contextlib.contextmanager
def noise_share_missing() -> Iterator[None]:
    """The first DDP encode after each decode (the first member of every secure sum) adds no noise."""
    from dp.distributed import DistributedDPEncoder

    noise, decode = DistributedDPEncoder._noise, DistributedDPEncoder.decode_with_report
    armed = [True]

    def patched_noise(self, rng):
        if armed[0]:
            armed[0] = False
            return np.zeros(self.plan.padded_dim, dtype=np.int64)
        return noise(self, rng)

    def patched_decode(self, *args, **kwargs):
        armed[0] = True
        return decode(self, *args, **kwargs)

    with mock.patch.object(DistributedDPEncoder, "_noise", patched_noise), \
            mock.patch.object(DistributedDPEncoder, "decode_with_report", patched_decode):
        yield


@contextlib.contextmanager
def clipping_skipped() -> Iterator[None]:
    """DDP encodes with the clip (and the conditional-rounding bound that follows from it) lifted;
    central DP's client-side `clip_l2` returns its input (weighted) unchanged."""
    import dp.central as central
    from dp.distributed import DistributedDPEncoder

    encode = DistributedDPEncoder.encode_with_report

    def unclipped(self, x, **kwargs):
        plan = self.plan
        self.plan = dataclasses.replace(plan, config=dataclasses.replace(plan.config, l2_clip=math.inf),
                                        rounding_threshold=math.inf)
        try:
            return encode(self, x, **kwargs)
        finally:
            self.plan = plan

    def no_clip(x, *, l2_clip, weight=1.0):
        return weight * np.asarray(x, dtype=np.float64)

    with mock.patch.object(DistributedDPEncoder, "encode_with_report", unclipped), \
            mock.patch.object(central, "clip_l2", no_clip):
        yield


@contextlib.contextmanager
def client_counted_twice() -> Iterator[None]:
    """Every cohort sampler of `dp.sampling` returns its first client a second time."""
    import dp.sampling as sampling

    patches = []
    for cls in (sampling.PoissonSampler, sampling.FixedSizeSampler, sampling.EveryoneSampler, sampling.SeededSampler):
        original = cls.sample

        def twice(self, clients, original=original):
            cohort = original(self, clients)
            return cohort + cohort[:1]

        patches.append(mock.patch.object(cls, "sample", twice))
    with contextlib.ExitStack() as stack:
        for p in patches:
            stack.enter_context(p)
        yield


@contextlib.contextmanager
def sampling_rate_understated(factor: float = 10.0) -> Iterator[None]:
    """The accountant sees sampling rate q / factor: the DDP plan's outsider mechanism and central DP's
    outsider mechanism are built with it, while the cohorts are still drawn at q."""
    from dp.central import CentralDPConfig
    from dp.distributed import DistributedDPPlan

    plan_mechanism, central_mechanism = DistributedDPPlan.mechanism, CentralDPConfig.outsider_mechanism

    def understated(mech):
        return dataclasses.replace(mech, sampling_rate=mech.sampling_rate / factor)

    def plan_patched(self, observer):
        mech = plan_mechanism(self, observer)
        return understated(mech) if str(getattr(observer, "value", observer)) == "outsider" else mech

    with mock.patch.object(DistributedDPPlan, "mechanism", plan_patched), \
            mock.patch.object(CentralDPConfig, "outsider_mechanism", lambda self, z: understated(central_mechanism(self, z))):
        yield


@dataclass(frozen=True)
class Fault:
    name: str
    description: str
    patch: Callable[[], contextlib.AbstractContextManager]


FAULTS: dict[str, Fault] = {f.name: f for f in (
    Fault("ddp_noise_halved", "distributed DP noise halved (each share's stddev / 2)", ddp_noise_halved),
    Fault("noise_share_missing", "one client's DDP noise share missing from every secure sum", noise_share_missing),
    Fault("clipping_skipped", "L2 clipping skipped: the canary update, 4x beyond the clip, enters as is", clipping_skipped),
    Fault("client_counted_twice", "a client counted twice: the sampler lists it again, both encodings summed",
          client_counted_twice),
    Fault("sampling_rate_understated", "the accountant given a sampling rate ten times below the real one",
          sampling_rate_understated),
)}

__all__ = ["FAULTS", "Fault", "ddp_noise_halved", "noise_share_missing", "clipping_skipped", "client_counted_twice",
           "sampling_rate_understated"]
