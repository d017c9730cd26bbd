"""Enqueue times (engine.queue.enqueue_times): bounds never early and less than the resolution
late, pruning that keeps every live entry's bound, exact snapshots, format-1 samples."""

from __future__ import annotations

from array import array

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.queue.enqueue_times import EnqueueTimes

steps = st.lists(
    st.tuples(
        st.one_of(st.integers(1, 3), st.integers(1, 5_000_000_000)),  # index gap
        st.one_of(st.integers(0, 4), st.integers(0, 30), st.integers(0, 6_000_000_000)),
    ),
    min_size=1,
    max_size=60,
)


def _fill(resolution_ms: int, moves: list[tuple[int, int]]) -> tuple[EnqueueTimes, dict[int, int]]:
    times = EnqueueTimes(resolution_ms)
    index, now = 0, 1_000
    truth: dict[int, int] = {}
    for gap, ms in moves:
        index += gap
        now += ms
        times.note(index, now)
        truth[index] = now
    return times, truth


@settings(max_examples=300, deadline=None)
@given(moves=steps, resolution_ms=st.sampled_from([1, 10, 1000]), data=st.data())
def test_bounds_are_never_early_and_less_than_the_resolution_late(
    moves: list[tuple[int, int]], resolution_ms: int, data: st.DataObject
) -> None:
    times, truth = _fill(resolution_ms, moves)
    for index, ms in truth.items():
        assert ms <= times.bound_ms(index) < ms + resolution_ms
    last = max(truth)
    wire = times.to_wire()
    again = EnqueueTimes.from_wire(resolution_ms, wire)
    assert again.to_wire() == wire
    live = sorted(data.draw(st.sets(st.sampled_from(sorted(truth)))))
    before = {index: times.bound_ms(index) for index in live}
    lo = np.array(live, dtype=np.int64)
    times.prune(live[0] if live else last + 1, (lo, lo))
    assert {index: times.bound_ms(index) for index in live} == before
    assert len(times) <= len(live) + 1
    index, now = last + 1, max(truth.values()) + data.draw(st.integers(0, 20))
    times.note(index, now)  # the series goes on after a prune
    assert now <= times.bound_ms(index) < now + resolution_ms


def test_an_entry_alone_in_its_interval_is_exact_and_samples_are_per_interval() -> None:
    times = EnqueueTimes(10)
    for k in range(100):  # one entry per ms: 10 per interval
        times.note(k + 1, 5_000 + k)
    assert len(times) == 10
    assert times.bound_ms(1) == 5_009 and times.bound_ms(100) == 5_099
    times.note(101, 5_200)
    assert times.bound_ms(101) == 5_200
    assert times.nbytes() == 2 * 64 + 8 * 11


def test_offsets_widen_when_the_kept_samples_span_more_than_32_bits() -> None:
    times = EnqueueTimes(10)
    times.note(1, 0)
    times.note(2, 1 << 33)
    assert times.wide
    assert times.bound_ms(1) == 0 and times.bound_ms(2) == 1 << 33
    times.prune(2)
    assert len(times) == 1 and times.bound_ms(2) == 1 << 33


def test_an_open_interval_whose_latest_time_passes_32_bits_widens() -> None:
    """The interval opened within the narrow offsets' range; a later entry of the same
    interval is past it (an OverflowError in the apply before)."""
    times = EnqueueTimes(10)
    times.note(1, 1_000)
    times.note(2, 1_000 + (1 << 32) - 1)
    assert not times.wide
    times.note(3, 1_000 + (1 << 32))
    assert times.wide
    assert times.bound_ms(1) == 1_000 and times.bound_ms(3) == 1_000 + (1 << 32)


def test_format_1_samples_keep_their_bound() -> None:
    index, ms = array("q", [3, 7]), array("q", [1_000, 2_500])
    times = EnqueueTimes.from_samples_v1(10, 1000, index.tobytes(), ms.tobytes())
    assert [times.bound_ms(i) for i in (3, 6, 7, 9)] == [1_999, 1_999, 3_499, 3_499]
    times.note(10, 3_000)  # opens a new interval: not 499 ms late
    assert times.bound_ms(10) == 3_499  # never before an earlier entry's bound


def test_times_without_samples_share_their_arrays_and_cost_nothing() -> None:
    """No TTL, no samples: the arrays are the shared empty ones (160 bytes a queue
    otherwise); the first sample makes arrays of its own, a clear gives them back."""
    a, b = EnqueueTimes(10), EnqueueTimes(10)
    assert a.nbytes() == 0 and a.to_wire() == b.to_wire()
    a.note(5, 1_000)
    assert a.bound_ms(5) == 1_000 and b.nbytes() == 0 and len(b) == 0
    assert a.nbytes() > 0
    restored = EnqueueTimes.from_wire(10, b.to_wire())
    assert restored.nbytes() == 0 and restored.to_wire() == b.to_wire()
    a.clear()
    assert a.nbytes() == 0 and a.to_wire() == b.to_wire()
    a.restart(2_000)
    assert a.bound_ms(7) == 2_000 and b.nbytes() == 0
