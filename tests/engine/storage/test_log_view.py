"""A server's log view of its segments: a restart adds every segment of a deep queue one
by one, in order, and must not scan or sort the ones already there for each."""

from __future__ import annotations

import pytest

import engine.storage.server_log as log_module
from engine.storage.disk import FakeDisk
from engine.storage.segment import COMPACTED, OVERWRITES, ReaderCache, SegmentInfo
from engine.storage.server_log import ServerLog

PER_SEGMENT = 10


def _info(seq: int, lo: int, hi: int, flags: int = OVERWRITES) -> SegmentInfo:
    path = f"queues/q/segments/{seq:020d}.seg"
    return SegmentInfo(path, seq, lo, hi, hi - lo + 1, flags, 0, 0, 0, 0, 100)


class _CountingSegment:
    """``_Segment`` that counts every change of ``hi`` after it was made."""

    cuts = 0

    def __init__(self, info: SegmentInfo, hi: int) -> None:
        self.info = info
        self._hi = hi

    @property
    def hi(self) -> int:
        return self._hi

    @hi.setter
    def hi(self, value: int) -> None:
        _CountingSegment.cuts += 1
        self._hi = value


def _view() -> ServerLog:
    disk = FakeDisk()
    return ServerLog("q", disk, ReaderCache(disk, 4))


def test_segments_added_in_order_touch_none_of_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(log_module, "_Segment", _CountingSegment)
    log = _view()
    n = 500
    for seq in range(1, n + 1):
        lo = (seq - 1) * PER_SEGMENT + 1
        assert log.add_segment(_info(seq, lo, lo + PER_SEGMENT - 1)) == []
    assert _CountingSegment.cuts == 0  # was n * (n - 1) / 2: every older one cut again
    assert [(i.seq, hi) for i, hi in log.segment_infos()] == [
        (seq, seq * PER_SEGMENT) for seq in range(1, n + 1)
    ]


def test_an_overwriting_segment_still_cuts_the_older_ones() -> None:
    log = _view()
    for seq in range(1, 6):
        lo = (seq - 1) * PER_SEGMENT + 1
        log.add_segment(_info(seq, lo, lo + PER_SEGMENT - 1))
    # A compacted segment over 1..30 that ends after the next one starts, then a
    # follower's log overwritten from 25 on.
    log.add_segment(_info(6, 1, 30, COMPACTED))
    hidden = log.add_segment(_info(7, 25, 26))
    assert set(hidden) == {_info(s, 0, 0).path for s in (4, 5)}
    view = [(i.seq, i.lo, hi) for i, hi in log.segment_infos()]
    assert view == [(1, 1, 10), (6, 1, 24), (2, 11, 20), (3, 21, 24), (7, 25, 26)]
    log.add_segment(_info(8, 27, 40))
    assert [i.seq for i, _ in log.segment_infos()][-2:] == [7, 8]
