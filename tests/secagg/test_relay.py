"""The stores a LightSecAgg party keeps between stages: sealed blobs (`SealedStore`) and aggregate pieces
read a block of columns at a time (`RowStore`), in memory or spilled to an unlinked file."""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from secagg.lcc import LagrangeCode, betas
from secagg.prg import random_vector
from secagg.protocols.relay import RowStore, SealedStore
from secagg.reed_solomon import locate_vector_errors
from secagg.ring import FIELD_P31


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 6), length=st.integers(1, 50), spill=st.booleans(), data=st.data())
def test_a_row_store_reads_back_any_rows_and_columns_as_written(rows, length, spill, data):
    matrix = np.arange(rows * length, dtype=np.uint32).reshape(rows, length) * np.uint32(2654435761)
    store = RowStore(rows, length, spill=spill)
    for r in data.draw(st.permutations(range(rows))):  # rows arrive in any order
        store.put(r, matrix[r])
    assert store.shape == (rows, length) and (store._file is not None) is spill
    pick = data.draw(st.lists(st.integers(0, rows - 1), min_size=1, max_size=rows, unique=True))
    c0 = data.draw(st.integers(0, length - 1))
    c1 = data.draw(st.integers(c0, length))
    view = store.select(pick)
    assert view.shape == (len(pick), length)
    assert np.array_equal(view[:, c0:c1], matrix[pick, c0:c1])
    sub = data.draw(st.lists(st.integers(0, len(pick) - 1), min_size=1, max_size=len(pick), unique=True))
    assert np.array_equal(view.select(sub)[:, :], matrix[[pick[i] for i in sub]])  # a view of a view
    store.close()
    assert store._file is None and store._data is None


def test_a_row_store_refuses_bad_rows_and_reads():
    store = RowStore(2, 4, spill=True)
    with pytest.raises(ValueError, match="holds 4 values"):
        store.put(0, np.zeros(3, np.uint32))
    with pytest.raises(TypeError, match=r"store\[:, c0:c1\]"):
        store[0]
    with pytest.raises(TypeError, match=r"store\[:, c0:c1\]"):
        store[0:1, 0:2]
    with pytest.raises(ValueError, match="at least one row"):
        RowStore(0, 4, spill=False)


def test_a_spilled_row_cut_short_on_disk_is_an_error_not_a_silent_zero():
    store = RowStore(2, 8, spill=True)
    store.put(0, np.ones(8, np.uint32))
    store.put(1, np.ones(8, np.uint32))
    os.ftruncate(store._file.fileno(), 4 * 12)  # row 1 loses its last 4 words
    with pytest.raises(OSError, match="truncated"):
        store[:, 0:8]


def test_an_aggregate_piece_altered_on_disk_is_located_like_a_lying_helper():
    """The Reed–Solomon check reads the spilled rows block by block; a row changed on disk is a wrong piece."""
    code = LagrangeCode(num_coded=7, num_nodes=4, privacy=2, length=40_000)
    coded = code.encode(random_vector(FIELD_P31, 40_000))
    store = RowStore(7, code.piece_length, spill=True)
    for r in range(7):
        store.put(r, coded[r])
    fd = store._file.fileno()
    offset = 4 * (5 * code.piece_length + 17)
    os.pwrite(fd, bytes([os.pread(fd, 1, offset)[0] ^ 1]), offset)
    assert locate_vector_errors(betas(7), store, k=4) == {5}


def test_a_sealed_store_reads_back_spilled_blobs_per_receiver():
    for spill in (True, False):
        store = SealedStore(spill=spill)
        store.put(1, {2: b"a" * 10, 3: b"b" * 7})
        store.put(4, {2: b"c" * 5})
        assert store.for_receiver(2, [1, 4]) == {1: b"a" * 10, 4: b"c" * 5}
        assert store.bytes_held == 22
        store.close()
