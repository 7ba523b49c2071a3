"""Sealed client-to-client messages the server relays, held between the stage that brings them and the
stage that delivers them (LightSecAgg's coded pieces: N (N - 1) of them, about 8 N d bytes at T = U / 2).

In memory they would make the server O(N d) whatever else is streamed, so past `SPILL_FROM` bytes they
are spilled as they arrive to an unlinked temporary file (`tempfile.TemporaryFile`: no name on disk,
gone when closed or when the process ends) and read back one receiver at a time, when that receiver's
relay is built (`LazyRequests`). What is spilled is ciphertext the server already holds (AES-GCM, bound
to round, sender and receiver), so the disk learns nothing the server does not; a piece altered on
disk fails authentication at its receiver like one altered in transit, and is reported.

`RowStore` does the same for LightSecAgg's aggregate pieces at recovery ((n / (U - T)) x 4d bytes for n
helpers). Those are not sealed, but the server receives them by design: U of them decode only the
aggregate mask of the survivors, which it is meant to remove, so the disk again learns nothing the
server is not meant to know. A LightSecAgg client keeps the pieces it receives in a `SealedStore` of its
own (sealed, so one altered on its disk fails when it is opened again at recovery).
"""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np

from secagg.messages import Message

SPILL_FROM = 256 << 20
"""With ``spill="auto"``: relays of more sealed bytes than this (256 MiB) in all are spilled to disk."""
CLIENT_SPILL_FROM = SPILL_FROM
"""A LightSecAgg client with ``spill="auto"`` spills the pieces it keeps for recovery past this (256 MiB)."""


def spills(spill: bool | str, nbytes: int, *, threshold: int) -> bool:
    """Whether a store of `nbytes` goes to disk: `spill` itself, or with "auto" past `threshold` bytes."""
    return nbytes > threshold if spill == "auto" else bool(spill)


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


class RowStore:
    """An (n, m) uint32 matrix written one row at a time and read one block of columns at a time (LightSecAgg's
    aggregate pieces at recovery: n helpers' pieces of m = d / (U - T) words, (n / (U - T)) x 4d bytes in all).

    In memory, or spilled: each row written to an unlinked temporary file as it arrives, and blocks of
    columns read back with one pread per row, so the holder keeps O(block x n), not O(n m). `select(rows)`
    is the same store seen through a subset of its rows (no copy). Reading is `store[:, c0:c1]`, the one
    form `reed_solomon.locate_vector_errors` and `LagrangeCode.decode_columns` need."""

    def __init__(self, rows: int, length: int, *, spill: bool) -> None:
        if rows < 1 or length < 1:
            raise ValueError("a row store needs at least one row and one column")
        self.spill = spill
        self._length = length
        self._file = tempfile.TemporaryFile(prefix="fedsecure-rows-") if spill else None
        self._data = None if spill else np.empty((rows, length), dtype=np.uint32)
        self._rows = tuple(range(rows))
        self._owner = self

    @property
    def shape(self) -> tuple[int, int]:
        return len(self._rows), self._length

    def put(self, row: int, values: np.ndarray) -> None:
        """Write row `row` of the underlying matrix (uint32, length m)."""
        values = np.ascontiguousarray(values, dtype=np.uint32)
        if values.shape != (self._length,):
            raise ValueError(f"a row holds {self._length} values, got shape {values.shape}")
        owner = self._owner
        if owner._file is None:
            owner._data[row] = values
        else:
            written = os.pwrite(owner._file.fileno(), values.data.cast("B"), 4 * row * self._length)
            if written != values.nbytes:
                raise OSError(f"spilled row {row} cut short: {written} of {values.nbytes} bytes written")

    def select(self, rows: Sequence[int]) -> "RowStore":
        """This store through rows `rows` (indices into this view), in that order."""
        view = object.__new__(RowStore)
        view.spill, view._length, view._owner = self.spill, self._length, self._owner
        view._rows = tuple(self._rows[r] for r in rows)
        return view

    def __getitem__(self, key: tuple[slice, slice]) -> np.ndarray:
        rows, cols = key if isinstance(key, tuple) and len(key) == 2 else (None, None)
        if rows != slice(None) or not isinstance(cols, slice) or cols.step not in (None, 1):
            raise TypeError("a row store is read as store[:, c0:c1]")
        c0, c1, _ = cols.indices(self._length)
        out = np.empty((len(self._rows), max(c1 - c0, 0)), dtype=np.uint32)
        owner = self._owner
        if owner._file is None:
            np.take(owner._data[:, c0:c1], self._rows, axis=0, out=out)
            return out
        for i, r in enumerate(self._rows):
            if out.shape[1]:
                got = os.preadv(owner._file.fileno(), [out[i]], 4 * (r * self._length + c0))
                if got != out[i].nbytes:
                    raise OSError(f"spilled row {r} truncated: {got} of {out[i].nbytes} bytes read back")
        return out

    def close(self) -> None:
        """Forget the rows (the spill file is deleted); views of the store are unusable afterwards."""
        owner = self._owner
        owner._data = None
        if owner._file is not None:
            owner._file.close()
            owner._file = None


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


__all__ = ["CLIENT_SPILL_FROM", "SPILL_FROM", "spills", "SealedStore", "RowStore", "LazyRequests"]
