"""What every formulation shares: length-grouped training batches."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fl_algorithms.tasks.formulation import FormulationSettings, length_grouped


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(1, 64), min_size=0, max_size=90), batch=st.integers(1, 9),
       groups=st.integers(1, 4), seed=st.integers(0, 2**31 - 1))
def test_grouping_sorts_each_run_of_batches_and_keeps_its_members(lengths, batch, groups, seed):
    """A permutation of `order` that moves no example out of its run of groups * batch_size, sorts each
    run longest first, and keeps the order of equal lengths."""
    lengths = torch.tensor(lengths, dtype=torch.long)
    order = torch.randperm(len(lengths), generator=torch.Generator().manual_seed(seed))
    grouped = length_grouped(order, lengths, batch_size=batch, groups=groups)
    run = batch * groups
    assert sorted(grouped.tolist()) == sorted(order.tolist())
    for start in range(0, len(order), run):
        mine, theirs = grouped[start:start + run].tolist(), order[start:start + run].tolist()
        assert set(mine) == set(theirs)
        keys = [int(lengths[i]) for i in mine]
        assert keys == sorted(keys, reverse=True)
        for value in set(keys):  # ties keep the random order's sequence
            assert [i for i in mine if lengths[i] == value] == [i for i in theirs if lengths[i] == value]


def test_no_grouping_returns_the_order_and_equal_lengths_leave_it_unchanged():
    order = torch.randperm(50, generator=torch.Generator().manual_seed(1))
    assert torch.equal(length_grouped(order, torch.arange(50), batch_size=4, groups=0), order)
    assert torch.equal(length_grouped(order, torch.full((50,), 64), batch_size=4, groups=3), order)


def test_grouping_cuts_padding_of_varied_lengths():
    lengths = torch.randint(5, 65, (400,), generator=torch.Generator().manual_seed(0))
    order = torch.randperm(400, generator=torch.Generator().manual_seed(2))

    def padded(o: torch.Tensor) -> int:
        return sum(int(lengths[o[s:s + 16]].max()) * len(o[s:s + 16]) for s in range(0, len(o), 16))

    assert padded(length_grouped(order, lengths, batch_size=16, groups=4)) < 0.8 * padded(order)


def test_bad_grouping_is_refused():
    with pytest.raises(ValueError, match="length_groups"):
        FormulationSettings(length_groups=-1)
    with pytest.raises(ValueError, match="non-negative"):
        length_grouped(torch.arange(3), torch.ones(3), batch_size=2, groups=-1)
