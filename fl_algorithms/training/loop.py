"""The local training loop every trainer runs, and the seeding that makes a client's runs repeatable.

One loop (`run_epochs`): per batch, zero the gradients, compute the loss (a tensor, or an objective's
terms with ``.total()`` and ``.parts``, such as FedMCP's ``LossTerms``), add an optional penalty
(FedProx's proximal term), backpropagate and step; report the mean loss, the mean of every named part
and the step count. Under a `TrainingProtocol` the same loop also sets each step's learning rate from
the protocol's schedule (warmup, decay over the run's steps) and clips the gradients to its max norm
before the step, and with `local_steps` it runs that many steps instead of `epochs` passes.

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
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np
import torch

if TYPE_CHECKING:
    from fl_algorithms.training.protocol import TrainingProtocol

B = TypeVar("B")


class Terms(Protocol):
    """A loss with named parts to report (FedMCP's ``LossTerms`` is one)."""

    parts: Mapping[str, float]

    def total(self) -> torch.Tensor: ...


def run_epochs(*, batches: Callable[[], Iterable[B]], loss: Callable[[B], torch.Tensor | Terms],
               optimizer: torch.optim.Optimizer, epochs: int, penalty: Callable[[], torch.Tensor] | None = None,
               timer: MutableMapping[str, float] | None = None,
               protocol: TrainingProtocol | None = None) -> dict[str, float]:
    """`epochs` passes over ``batches()`` (called once per epoch, so it may reshuffle).

    The caller puts the model in training mode. `timer`, if given, accumulates the seconds spent in
    ``backward`` and in the ``optimizer`` step. With `protocol`, every step's lr is the protocol's
    schedule at that step of this run (the run's step count is the first epoch's batch count times the
    epochs, or `local_steps`), gradients are clipped to its `max_grad_norm` before the step, and with
    `local_steps` the batches are cycled until that many steps are done (`epochs` is then not used).
    """
    sums: dict[str, float] = {"train_loss": 0.0}
    steps = 0
    scheduled = protocol is not None and protocol.scheduled
    clip = protocol.max_grad_norm if protocol is not None else None
    budget = protocol.local_steps if protocol is not None else None
    params = [p for group in optimizer.param_groups for p in group["params"]] if clip is not None else []
    if budget is None and epochs < 1:
        return {"train_loss": 0.0, "steps": 0.0}
    first = batches()
    if scheduled or budget is not None:
        first = list(first)  # the run's step count, from the first epoch's batches (drawn once, as ever)
    total = budget if budget is not None else (len(first) * epochs if scheduled else 0)  # type: ignore[arg-type]

    def passes() -> Iterator[Iterable[B]]:
        """The first epoch's batches, then a fresh ``batches()`` per epoch (or until the step budget is spent)."""
        yield first
        if budget is not None:
            while steps < budget and len(first):  # type: ignore[arg-type]
                yield batches()
        else:
            for _ in range(epochs - 1):
                yield batches()

    for epoch_batches in passes():
        for batch in epoch_batches:
            if budget is not None and steps >= budget:
                break
            if scheduled:
                for group in optimizer.param_groups:
                    group["lr"] = protocol.lr_at(steps, total)  # type: ignore[union-attr]
            optimizer.zero_grad(set_to_none=True)
            out = loss(batch)
            value, parts = (out, {}) if isinstance(out, torch.Tensor) else (out.total(), out.parts)
            if penalty is not None:
                value = value + penalty()
            start = time.perf_counter()
            value.backward()
            if timer is not None:
                timer["backward"] += time.perf_counter() - start
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(params, clip)
            start = time.perf_counter()
            optimizer.step()
            if timer is not None:
                timer["optimizer"] += time.perf_counter() - start
            steps += 1
            sums["train_loss"] += float(value.detach())
            for key, part in parts.items():
                sums[key] = sums.get(key, 0.0) + part
    return {**{key: total_ / max(steps, 1) for key, total_ in sums.items()}, "steps": float(steps)}


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
