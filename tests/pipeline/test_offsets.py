"""The stream reader's offsets: ids as runs, read back exactly, old id lists still read."""

from __future__ import annotations

import itertools
import json

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from pipeline.offsets import id_array_runs, id_runs, make_offset, offset_id_array, offset_ids

IDS = st.lists(st.integers(min_value=0, max_value=2**62), max_size=200)
CLUSTERED = st.lists(st.integers(min_value=0, max_value=300), max_size=300)


@given(st.one_of(IDS, CLUSTERED), st.integers(min_value=0, max_value=2**40))
def test_an_offset_names_exactly_the_ids_of_its_batch(ids: list[int], seq: int) -> None:
    offset = json.loads(json.dumps(make_offset(seq, ids)))  # as the offset log keeps it
    assert offset["seq"] == seq
    assert offset_ids(offset) == sorted(set(ids))


@given(CLUSTERED)
def test_runs_are_sorted_disjoint_and_not_adjacent(ids: list[int]) -> None:
    runs = id_runs(ids)
    assert all(first <= last for first, last in runs)
    assert all(a[1] + 1 < b[0] for a, b in itertools.pairwise(runs))


def test_consecutive_ids_are_one_run() -> None:
    assert id_runs([7, 5, 6, 9, 10, 12]) == [[5, 7], [9, 10], [12, 12]]
    assert make_offset(3, range(100, 20_100))["runs"] == [[100, 20_099]]
    assert make_offset(0, ()) == {"seq": 0, "runs": []}


def test_an_offset_written_before_runs_is_read() -> None:
    assert offset_ids({"seq": 3, "ids": [9, 4, 5]}) == [4, 5, 9]
    assert offset_ids({"seq": 0}) == []


@given(st.one_of(IDS, CLUSTERED))
def test_runs_of_an_array_are_the_runs_of_its_ids(ids: list[int]) -> None:
    runs = id_array_runs(np.array(ids, np.int64))
    assert runs == id_runs(ids)
    assert offset_id_array({"seq": 0, "runs": runs}).tolist() == sorted(set(ids))
    assert offset_id_array({"seq": 0, "ids": ids}).tolist() == offset_ids({"ids": ids})
