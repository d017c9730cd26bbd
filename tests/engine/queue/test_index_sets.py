"""``index_set`` builds the same set as adding each index, for any order and repeats."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from pyroaring import BitMap64

from engine.index_sets import index_set

indexes = st.lists(st.integers(min_value=0, max_value=2**64 - 1), max_size=300)


@given(indexes)
def test_index_set_is_the_set_of_the_indexes(values: list[int]) -> None:
    got = index_set(np.array(values, dtype=np.uint64))
    assert got == BitMap64(set(values))


@given(indexes, st.integers(min_value=1, max_value=5))
def test_a_strided_view_gives_the_same_set(values: list[int], step: int) -> None:
    array = np.array(values, dtype=np.uint64)[::step]
    assert index_set(array) == BitMap64(set(values[::step]))


def test_millions_of_repeated_indexes() -> None:
    """Entries of 100 messages: every index repeated; the set holds each once."""
    repeated = np.repeat(np.arange(1, 20_001, dtype=np.uint64), 100)
    got = index_set(repeated)
    assert len(got) == 20_000 and got.min() == 1 and got.max() == 20_000
