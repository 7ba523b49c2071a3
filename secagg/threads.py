"""How many threads the toolkit's own parallel work may use: the request (or every core this process
may run on), capped by $FEDSECURE_MAX_THREADS when it is set.

One cap for everything, torch's intra-op threads (`nlp_models.cpu.set_torch_threads`) and the secure
sums' keystreams alike: `make test` runs two pytest workers on two cores with it set to 1, because a
process asking for two threads beside another busy one spins in barriers instead of working."""
from __future__ import annotations

import os

MAX_THREADS_ENV = "FEDSECURE_MAX_THREADS"


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS reports one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not on Linux
        return max(1, os.cpu_count() or 1)


def thread_cap(requested: int | None = None) -> int:
    """`requested` threads (default: every available core), at most $FEDSECURE_MAX_THREADS."""
    threads = available_cores() if requested is None else requested
    if threads < 1:
        raise ValueError(f"thread counts are positive, got {threads}")
    cap = os.environ.get(MAX_THREADS_ENV)
    if cap:
        try:
            threads = min(threads, max(1, int(cap)))
        except ValueError:
            raise ValueError(f"{MAX_THREADS_ENV} must be a positive integer, got {cap!r}") from None
    return threads
