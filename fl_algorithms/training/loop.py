"""The local training loop every trainer runs, and the seeding that makes a client's runs repeatable.

One loop (`run_epochs`): per batch, zero the gradients, compute the loss (a tensor, or an objective's
terms with ``.total()`` and ``.parts``, such as FedMCP's ``LossTerms``), add an optional penalty
(FedProx's proximal term), backpropagate and step; report the mean loss, the mean of every named part
and the step count.

Seeding (`seeded`): a client's local run forks torch's global RNG and seeds it (dropout; Opacus'
sampling and noise), and hands out a generator for the batch order, so two runs that differ only in
the aggregation protocol differ only by what the aggregation did, and a resumed run repeats the
uninterrupted one. Seeds come from (seed, client id, how many times the client trained):
`sequence_seed` for one stream per run, `tagged_seed` where one client draws several independent
streams (FedMCP's fit, FedRep's body and head steps).
"""
from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar

import numpy as np
import torch

B = TypeVar("B")


class Terms(Protocol):
    """A loss with named parts to report (FedMCP's ``LossTerms`` is one)."""

    parts: Mapping[str, float]

    def total(self) -> torch.Tensor: ...


def run_epochs(*, batches: Callable[[], Iterable[B]], loss: Callable[[B], torch.Tensor | Terms],
               optimizer: torch.optim.Optimizer, epochs: int, penalty: Callable[[], torch.Tensor] | None = None,
               timer: MutableMapping[str, float] | None = None) -> dict[str, float]:
    """`epochs` passes over ``batches()`` (called once per epoch, so it may reshuffle).

    The caller puts the model in training mode. `timer`, if given, accumulates the seconds spent in
    ``backward`` and in the ``optimizer`` step.
    """
    sums: dict[str, float] = {"train_loss": 0.0}
    steps = 0
    for _ in range(epochs):
        for batch in batches():
            optimizer.zero_grad(set_to_none=True)
            out = loss(batch)
            value, parts = (out, {}) if isinstance(out, torch.Tensor) else (out.total(), out.parts)
            if penalty is not None:
                value = value + penalty()
            start = time.perf_counter()
            value.backward()
            if timer is not None:
                timer["backward"] += time.perf_counter() - start
            start = time.perf_counter()
            optimizer.step()
            if timer is not None:
                timer["optimizer"] += time.perf_counter() - start
            steps += 1
            sums["train_loss"] += float(value.detach())
            for key, part in parts.items():
                sums[key] = sums.get(key, 0.0) + part
    return {**{key: total / max(steps, 1) for key, total in sums.items()}, "steps": float(steps)}


def sequence_seed(seed: int, client_id: int, calls: int) -> int:
    """A 32-bit seed from numpy's SeedSequence over (seed, client id, call count)."""
    return int(np.random.SeedSequence([seed, client_id, calls]).generate_state(1)[0])


def tagged_seed(*parts: Any) -> int:
    """A 31-bit seed from the repr of `parts` (ints and strings), e.g. (seed, client, calls, 'fit')."""
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


@contextmanager
def seeded(seed: int) -> Iterator[torch.Generator]:
    """Fork torch's global RNG, seed it with `seed`, and yield a generator seeded with seed + 1."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield torch.Generator().manual_seed(seed + 1)


__all__ = ["Terms", "run_epochs", "sequence_seed", "tagged_seed", "seeded"]
