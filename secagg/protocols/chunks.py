"""Masked inputs sent in chunks and folded into the sum as they arrive (sans-IO).

A masked input y_u of d values travels as ceil(d / size) chunk messages ``(index, values)``; the
server adds each chunk into its running sum at once, so it holds the sum (4d bytes) and one chunk per
message being read, never a whole input, whatever N is. The client masks chunk by chunk too (the
keystream window of each chunk, `secagg.prg.apply_masks_(offset=)`), so it never holds a masked copy,
and a driver that sends each chunk as it is made overlaps masking the next chunk with sending the last.

A chunk cannot be taken back out of the sum without its values, and a client whose chunks stop half
way cannot be unmasked for the chunks it sent either (that would need both its self-mask seed and its
masking key, which SecAgg never reveals for one client). So when some client leaves its stream
incomplete (silent, or dropped for a bad chunk), the chunk indices it had sent are *tainted*: the
server clears those slices of the sum and asks every client whose stream was complete to send those
chunks again (`RepairPlan`). The values are identical to the ones it already sent (the same input and
masks), so a resend tells the server nothing new. One more round trip, only when a stream breaks; if a
complete client then fails to resend, the tainted slices cannot be rebuilt without it and the round
aborts (the stated limit: it takes a broken stream and a failed resend in the same round).
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from secagg.messages import ProtocolError
from secagg.ring import Ring

MIN_CHUNK = 1 << 12
"""Fewest values in a chunk a client accepts to send (16 KiB): a server cannot make a client send a
d-value input as millions of tiny messages. The last chunk of an input may be shorter."""


DEFAULT_CHUNK = 1 << 18
"""Values per chunk when a server streams by default (1 MiB of uint32)."""
AUTO_FROM = 1 << 22
"""With ``chunk="auto"`` (the servers' default), inputs of at least this many values (16 MiB) stream in
`DEFAULT_CHUNK`-value chunks; shorter ones travel in one message."""


def plan_for(chunk: int | str | None, length: int, *, max_length: int) -> "ChunkPlan | None":
    """The chunk plan a server's `chunk` argument asks for: None (one message), "auto" (chunks of
    `DEFAULT_CHUNK` values from `AUTO_FROM` values on) or a size in [MIN_CHUNK, max_length]; a size at
    least the length means one message too. ValueError for anything else."""
    if chunk == "auto":
        chunk = DEFAULT_CHUNK if length >= AUTO_FROM else None
    if chunk is None:
        return None
    if isinstance(chunk, bool) or not isinstance(chunk, int) or not MIN_CHUNK <= chunk <= max_length:
        raise ValueError(f"chunk must be 'auto', None or in [{MIN_CHUNK}, {max_length}] values (clients refuse "
                         f"smaller), got {chunk!r}")
    return ChunkPlan(length, chunk) if chunk < length else None


def check_max_streams(max_streams: int | None) -> int | None:
    """A server's `max_streams`: None (every client streams at once) or a positive integer."""
    if max_streams is not None and (isinstance(max_streams, bool) or not isinstance(max_streams, int) or max_streams < 1):
        raise ValueError(f"max_streams must be a positive integer or None, got {max_streams!r}")
    return max_streams


def stream_window(max_streams: int | None, *, streaming: bool, expected: int) -> int | None:
    """`ServerProtocol.send_window` for a stage of chunked uploads paced to `max_streams` clients at once: a
    network driver asks the next client as one finishes, so the chunks queued at the server are bounded by
    that many connections' windows whatever N (fewer uploads side by side). None: not paced."""
    if max_streams is None or not streaming or max_streams >= expected:
        return None
    return max_streams


@dataclass(frozen=True)
class ChunkPlan:
    """How a vector of `length` values is cut: chunks of `size` values, the last one shorter."""

    length: int
    size: int

    def __post_init__(self) -> None:
        if self.length < 1 or self.size < 1:
            raise ValueError("length and chunk size must be positive")

    @property
    def count(self) -> int:
        return -(-self.length // self.size)

    def bounds(self, index: int) -> tuple[int, int]:
        """[start, end) of chunk `index`."""
        if not 0 <= index < self.count:
            raise ProtocolError(f"chunk index {index} outside 0..{self.count - 1}")
        start = index * self.size
        return start, min(start + self.size, self.length)


class ChunkFolder:
    """Folds chunk messages into a running sum, validating each before it costs anything: the index is in
    the plan and among those asked for, not sent before by this client, and the values are exactly that
    chunk's length and in the ring. Tracks, per client, which chunks it has sent."""

    def __init__(self, plan: ChunkPlan, ring: Ring, *, wanted: Iterable[int] | None = None) -> None:
        self.plan, self.ring = plan, ring
        self.wanted = np.zeros(plan.count, dtype=bool)
        if wanted is None:
            self.wanted[:] = True
        else:
            indices = list(wanted)
            for index in indices:
                plan.bounds(index)
            self.wanted[indices] = True
        self.need = int(self.wanted.sum())
        self.got: dict[int, np.ndarray] = {}

    def fold(self, total: np.ndarray, sender: int, index: int, values: np.ndarray) -> bool:
        """Add chunk `index` of `sender` into `total` (the whole sum, in place); True once the sender has
        sent every wanted chunk. Raises ProtocolError, with `total` unchanged, for a bad chunk."""
        start, end = self.plan.bounds(index)
        if not self.wanted[index]:
            raise ProtocolError(f"chunk {index} was not asked for")
        got = self.got.get(sender)
        if got is not None and got[index]:
            raise ProtocolError(f"chunk {index} sent twice")
        if values.shape != (end - start,):
            raise ProtocolError(f"chunk {index} has {values.shape[0]} values, expected {end - start}")
        try:
            self.ring.validate(values, length=end - start)
        except ValueError as exc:
            raise ProtocolError(str(exc)) from exc
        if got is None:
            got = self.got[sender] = np.zeros(self.plan.count, dtype=bool)
        self.ring.add_(total[start:end], values)
        got[index] = True
        return self.complete(sender)

    def complete(self, sender: int) -> bool:
        got = self.got.get(sender)
        return got is not None and int(got.sum()) == self.need

    def tainted(self, kept: Iterable[int]) -> list[int]:
        """Chunk indices folded from a client not in `kept` (its stream broke): what must be rebuilt."""
        kept = set(kept)
        out = np.zeros(self.plan.count, dtype=bool)
        for sender, got in self.got.items():
            if sender not in kept:
                out |= got
        return [int(i) for i in np.flatnonzero(out)]

    def clear(self, total: np.ndarray, indices: Iterable[int]) -> None:
        """Zero the slices of `total` of chunks `indices` (before they are rebuilt from resends)."""
        for index in indices:
            start, end = self.plan.bounds(index)
            total[start:end] = 0


__all__ = ["MIN_CHUNK", "DEFAULT_CHUNK", "AUTO_FROM", "plan_for", "ChunkPlan", "ChunkFolder"]
