"""Enqueue times of log entries, for queue-level TTL: a step function from Raft index to
leader milliseconds, in 8 bytes per sample and no bytes per message.

Rule of this module: pure, deterministic, no clock; the machine feeds it the leader time
of each enqueue entry (``note``) and asks for the latest time at which an entry can have
been proposed (``bound_ms``).

Leader time never decreases along the log. Enqueue entries are grouped into *intervals*:
an interval opens at an enqueue whose time is at least ``resolution_ms`` past the time
the current one opened, and its sample is (index of its first entry, time of its latest
entry). Every entry of an interval was proposed between the interval's opening time and
its latest time, which are less than ``resolution_ms`` apart, so ``bound_ms`` is never
earlier than an entry's own time and at most ``resolution_ms - 1`` later (exact when the
interval holds one entry). Queue TTL computed from it is never early and at most that
late.

Storage: two ``array('I')`` of offsets from a base index and a base time, 4 bytes each per
sample (``wide`` falls back to 8-byte ``array('q')`` values in the unlikely case that the
samples kept span more than 2^32 entries or ms, about 49 days). A sample is made at most
once per ``resolution_ms`` of leader time in which something was published, so the cost
per message is 8 bytes divided by the messages published per interval: nothing worth
counting for batches, at most 8 bytes for one message every ``resolution_ms`` or slower.
``prune`` forgets the samples that no live message needs; ``restart`` and ``clear`` serve
a queue TTL set and removed (the machine keeps samples only while there is one).
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from typing import Any

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
FORMAT_1_RESOLUTION_MS = 1000
"""The enqueue time resolution of format-1 snapshots: one sample a second."""
_NARROW_MAX = (1 << 32) - 1
_NO_SAMPLES = array("I")
"""The two arrays of every ``EnqueueTimes`` without a sample, shared (never appended to:
``_append`` makes arrays of its own first): most queues have no TTL and keep none, and
two empty arrays cost a queue 160 bytes."""
_ARRAY_HEADER_BYTES = 64


class EnqueueTimes:
    __slots__ = ("_base_index", "_base_ms", "_index", "_ms", "_open_ms", "resolution_ms")

    def __init__(self, resolution_ms: int) -> None:
        assert resolution_ms >= 1
        self.resolution_ms = resolution_ms
        self._base_index = 0
        self._base_ms = 0
        self._index = _NO_SAMPLES
        """Offsets of the first index of each interval from ``_base_index``."""
        self._ms = _NO_SAMPLES
        """Offsets of the latest time of each interval from ``_base_ms``."""
        self._open_ms: int | None = None
        """Opening time of the last interval; None: the next enqueue opens one."""

    def __len__(self) -> int:
        return len(self._index)

    @property
    def wide(self) -> bool:
        return self._index.typecode == "q"

    def nbytes(self) -> int:
        """Resident bytes of the two arrays (their spare capacity not counted); none
        while they are the shared empty ones."""
        if self._index is _NO_SAMPLES:
            return 0
        return 2 * _ARRAY_HEADER_BYTES + self._index.itemsize * 2 * len(self._index)

    def clear(self) -> None:
        self._index = self._ms = _NO_SAMPLES
        self._base_index = self._base_ms = 0
        self._open_ms = None

    def restart(self, now_ms: int) -> None:
        """Forget the samples; every entry so far counts as proposed by ``now_ms`` (true,
        and never early), the next enqueue opens an interval."""
        self.clear()
        self._append(0, now_ms)

    def note(self, index: int, now_ms: int) -> None:
        """An enqueue entry at ``index`` (increasing) applied with leader time ``now_ms``."""
        if self._open_ms is not None and now_ms < self._open_ms + self.resolution_ms:
            if now_ms - self._base_ms > self._ms[-1]:
                # The interval's latest time may pass the narrow offsets' range even
                # though its opening time did not.
                self._fit(self._base_index, now_ms)
                self._ms[-1] = now_ms - self._base_ms
            return
        self._open_ms = now_ms
        # Latest times never decrease (leader time does not); only the first interval
        # after format-1 samples, whose latest times are estimates, can need the max.
        latest = self._base_ms + self._ms[-1] if self._ms else now_ms
        self._append(index, max(now_ms, latest))

    def _append(self, index: int, ms: int) -> None:
        if self._index is _NO_SAMPLES:
            self._index, self._ms = array("I"), array("I")
        if not self._index:
            self._base_index, self._base_ms = index, ms
        self._fit(index, ms)
        self._index.append(index - self._base_index)
        self._ms.append(ms - self._base_ms)

    def _fit(self, index: int, ms: int) -> None:
        """Make the arrays able to hold the offsets of ``index`` and ``ms``: rebased
        when that is enough, else widened to 8-byte values."""
        if not self.wide and max(index - self._base_index, ms - self._base_ms) > _NARROW_MAX:
            self._rebase()
            if max(index - self._base_index, ms - self._base_ms) > _NARROW_MAX:
                self._index = array("q", self._index)
                self._ms = array("q", self._ms)

    def bound_ms(self, index: int) -> int:
        """Latest leader time at which the enqueue entry ``index`` can have been proposed."""
        i = bisect_right(self._index, index - self._base_index) - 1
        assert i >= 0, index
        return self._base_ms + self._ms[i]

    def prune(self, first_live: int, spans: tuple[I64, I64] | None = None) -> None:
        """Forget the samples no live message needs: those of intervals that end before
        ``first_live`` and, when ``spans`` (the first and last indexes of ranges that
        hold every live message) is given, those of intervals that meet no span. The
        last interval is kept: it may still grow."""
        if len(self._index) <= 1:
            return
        code = self._index.typecode
        starts = np.frombuffer(self._index, dtype=code).astype(np.int64)
        keep = np.ones(len(starts), dtype=bool)
        first = int(np.searchsorted(starts, first_live - self._base_index, "right")) - 1
        keep[: max(first, 0)] = False
        if spans is not None:
            keep &= _meets(starts + self._base_index, spans)
        keep[-1] = True
        if keep.all():
            return
        self._index = array(code, np.frombuffer(self._index, dtype=code)[keep].tobytes())
        self._ms = array(code, np.frombuffer(self._ms, dtype=code)[keep].tobytes())
        self._rebase()

    def _rebase(self) -> None:
        """Move the base to the first sample, so that the offsets are as small as can be."""
        if not self._index or not (self._index[0] or self._ms[0]):
            return
        d_index, d_ms = self._index[0], self._ms[0]
        self._index = _minus(self._index, d_index)
        self._ms = _minus(self._ms, d_ms)
        self._base_index += d_index
        self._base_ms += d_ms

    # --- snapshot ---------------------------------------------------------------------

    def to_wire(self) -> list[object]:
        return [
            self._base_index,
            self._base_ms,
            self._open_ms,
            self._index.typecode,
            self._index.tobytes(),
            self._ms.tobytes(),
        ]

    @classmethod
    def from_wire(cls, resolution_ms: int, wire: list[object]) -> EnqueueTimes:
        base_index, base_ms, open_ms, code, index, ms = wire
        assert isinstance(base_index, int) and isinstance(base_ms, int)
        assert open_ms is None or isinstance(open_ms, int)
        assert code in ("I", "q") and isinstance(index, bytes) and isinstance(ms, bytes)
        times = cls(resolution_ms)
        times._base_index, times._base_ms, times._open_ms = base_index, base_ms, open_ms
        if index or ms or code != "I":
            times._index = array(code, index)
            times._ms = array(code, ms)
        return times

    @classmethod
    def from_snapshot(
        cls, resolution_ms: int, version: int, wire: list[Any], *, queue_ttl: bool
    ) -> EnqueueTimes:
        """From a machine snapshot of format ``version`` (``QueueMachine.version``).
        Format 1 kept samples whether or not the queue had a TTL; without one, none are
        kept here."""
        if version >= 2:
            return cls.from_wire(resolution_ms, wire)
        if not queue_ttl:
            return cls(resolution_ms)
        return cls.from_samples_v1(resolution_ms, FORMAT_1_RESOLUTION_MS, *wire)

    @classmethod
    def from_samples_v1(
        cls, resolution_ms: int, old_resolution_ms: int, index: bytes, ms: bytes
    ) -> EnqueueTimes:
        """The samples of a format-1 snapshot: (first index, opening time) every
        ``old_resolution_ms``, whose entries were proposed before opening time +
        ``old_resolution_ms``; that is the latest time kept here. The next enqueue opens
        a new interval."""
        times = cls(resolution_ms)
        for i, t in zip(array("q", index), array("q", ms), strict=True):
            times._append(i, t + old_resolution_ms - 1)
        return times


def _minus(values: array[int], d: int) -> array[int]:
    code = values.typecode
    return array(code, (np.frombuffer(values, dtype=code) - d).astype(code).tobytes())


def _meets(starts: I64, spans: tuple[I64, I64]) -> npt.NDArray[np.bool_]:
    """Which intervals ``[starts[k], starts[k+1])`` (the last one unbounded) contain an
    index of one of the inclusive ranges ``spans[0][j]..spans[1][j]``."""
    lo, hi = spans
    first = np.maximum(np.searchsorted(starts, lo, "right") - 1, 0)
    last = np.searchsorted(starts, hi, "right") - 1
    ok = last >= 0
    marks = np.zeros(len(starts) + 1, dtype=np.int64)
    np.add.at(marks, first[ok], 1)
    np.add.at(marks, last[ok] + 1, -1)
    meets: npt.NDArray[np.bool_] = np.cumsum(marks[:-1]) > 0
    return meets


__all__ = ["EnqueueTimes"]
