"""Sealed client-to-client messages the server relays, held between the stage that brings them and the
stage that delivers them (LightSecAgg's coded pieces: N (N - 1) of them, about 8 N d bytes at T = U / 2).

In memory they would make the server O(N d) whatever else is streamed, so past `SPILL_FROM` bytes they
are spilled as they arrive to an unlinked temporary file (`tempfile.TemporaryFile`: no name on disk,
gone when closed or when the process ends) and read back one receiver at a time, when that receiver's
relay is built (`LazyRequests`). What is spilled is ciphertext the server already holds (AES-GCM, bound
to round, sender and receiver), so the disk learns nothing the server does not; a piece altered on
disk fails authentication at its receiver like one altered in transit, and is reported.
"""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence

from secagg.messages import Message

SPILL_FROM = 256 << 20
"""With ``spill="auto"``: relays of more sealed bytes than this (256 MiB) in all are spilled to disk."""


class SealedStore:
    """Sealed blobs by (sender, receiver): in memory, or appended to an unlinked temporary file."""

    def __init__(self, *, spill: bool) -> None:
        self.spill = spill
        self._file = tempfile.TemporaryFile(prefix="fedsecure-relay-") if spill else None
        self._where: dict[tuple[int, int], tuple[int, int] | bytes] = {}
        self._end = 0
        self.bytes_held = 0
        """Sealed bytes stored so far (on disk when spilled)."""

    def put(self, sender: int, pieces: Mapping[int, bytes]) -> None:
        """Store `sender`'s blobs, one per receiver; a spilled blob is written at once and not kept."""
        for receiver, blob in pieces.items():
            if self._file is None:
                self._where[(sender, receiver)] = blob
            else:
                os.pwrite(self._file.fileno(), blob, self._end)
                self._where[(sender, receiver)] = (self._end, len(blob))
                self._end += len(blob)
            self.bytes_held += len(blob)

    def for_receiver(self, receiver: int, senders: Sequence[int]) -> dict[int, bytes]:
        """The blobs `senders` addressed to `receiver` (read back from disk when spilled)."""
        out = {}
        for sender in senders:
            where = self._where[(sender, receiver)]
            if isinstance(where, bytes):
                out[sender] = where
            else:
                offset, size = where
                blob = os.pread(self._file.fileno(), size, offset)
                if len(blob) != size:
                    raise OSError(f"spilled relay truncated: {len(blob)} of {size} bytes read back")
                out[sender] = blob
        return out

    def close(self) -> None:
        """Forget every blob (the spill file is deleted)."""
        self._where.clear()
        if self._file is not None:
            self._file.close()
            self._file = None


class LazyRequests(Mapping[int, Message]):
    """A stage's requests built one at a time, when a driver asks for each (`make(client)`), so that a
    driver sending them in turn never holds them all. Keys are fixed up front, like a dict's."""

    def __init__(self, clients: Sequence[int], make: Callable[[int], Message]) -> None:
        self._clients = tuple(clients)
        self._set = frozenset(self._clients)
        self._make = make

    def __getitem__(self, client: int) -> Message:
        if client not in self._set:
            raise KeyError(client)
        return self._make(client)

    def __iter__(self) -> Iterator[int]:
        return iter(self._clients)

    def __len__(self) -> int:
        return len(self._clients)


__all__ = ["SPILL_FROM", "SealedStore", "LazyRequests"]
