"""The delayed messages of one queue: a heap by due time.

Rule of this module: a message published with ``delay_ms`` waits here until a checkout
or expire command applies at or after its due time (leader time), then goes to the tail
of its level's main lane. Messages due at the same time leave in publish order: each
heap item carries a sequence number, kept in the snapshot with the machine's clock.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from engine.shared_empty import EMPTY_LIST

U64 = npt.NDArray[np.uint64]
_NONE_DUE: tuple[tuple[int, int], ...] = ()


class Delayed:
    __slots__ = ("_heap", "seq")

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, int, int]] = EMPTY_LIST
        """Heap of (due_ms, seq, ref, level)."""
        self.seq = 0
        """The sequence number of the next message delayed."""

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, due_ms: int, ref: int, level: int) -> None:
        if self._heap is EMPTY_LIST:
            self._heap = []
        heapq.heappush(self._heap, (due_ms, self.seq, ref, level))
        self.seq += 1

    def pop_due(self, now_ms: int) -> Sequence[tuple[int, int]]:
        """(ref, level) of the messages due at or before ``now_ms``, in due order."""
        heap = self._heap
        if not heap or heap[0][0] > now_ms:
            return _NONE_DUE
        due: list[tuple[int, int]] = []
        while heap and heap[0][0] <= now_ms:
            _due, _seq, ref, level = heapq.heappop(heap)
            due.append((ref, level))
        return due

    def pop_first(self) -> int:
        """The ref of the message due first, taken out."""
        return heapq.heappop(self._heap)[2]

    def next_due_ms(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def refs(self) -> U64:
        """A new array of the refs held (in heap order)."""
        return np.array([r for _d, _s, r, _lv in self._heap], dtype=np.uint64)

    def clear(self) -> U64:
        """Take every message out; returns their refs (in heap order)."""
        refs = self.refs()
        self._heap = EMPTY_LIST
        return refs

    def to_wire(self) -> list[list[int]]:
        return [list(item) for item in self._heap]

    def adopt(self, wire: list[Any], seq: int) -> None:
        """Fill an empty heap from ``to_wire``'s form (already a heap)."""
        assert not self._heap
        self._heap = [(d, s, r, lv) for d, s, r, lv in wire] or EMPTY_LIST
        self.seq = seq


__all__ = ["Delayed"]
