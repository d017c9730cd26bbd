"""The ready messages of one queue: two FIFOs of packed refs per priority level.

Rule of this module: it is the only place that knows how lanes are numbered. Each level
has a *returns* lane (messages given back after a delivery), served before its *main*
lane (first deliveries in publish order), and levels are strict: a higher level is
always served first. So the lanes are kept in delivery order, the returns lane of level
``level`` at number ``2 * (top - level)`` and its main lane right after it; snapshots
list them in that order and browse cursors name a lane by its number.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from engine.queue.pages import FrozenRefs, RefFifo

U64 = npt.NDArray[np.uint64]

_CURSOR_POS_BITS = 48
"""A browse cursor is ``lane number << 48 | absolute position in the lane``."""


class Lanes:
    """The lanes of a queue with ``levels`` priority levels (0 is the lowest)."""

    __slots__ = ("by_level", "fifos", "main", "returns")

    def __init__(self, levels: int, page_refs: int) -> None:
        top = levels - 1
        self.fifos = tuple(RefFifo(page_refs) for _ in range(2 * levels))
        """Every lane, in delivery order."""
        self.returns = tuple(self.fifos[2 * (top - level)] for level in range(levels))
        """The returns lane of each level, indexed by level."""
        self.main = tuple(self.fifos[2 * (top - level) + 1] for level in range(levels))
        """The main lane of each level, indexed by level."""
        self.by_level = tuple(
            (level, self.returns[level], self.main[level]) for level in range(top, -1, -1)
        )
        """(level, returns lane, main lane) from the highest level down: delivery order."""

    def drop_order(self) -> list[RefFifo]:
        """The lanes from the lowest level up, each level's returns lane first: the order
        in which overflow ``drop-head`` takes messages."""
        levels = range(len(self.main))
        return [lane for level in levels for lane in (self.returns[level], self.main[level])]

    def count(self) -> int:
        return sum(len(lane) for lane in self.fifos)

    def chunks(self) -> Iterator[U64]:
        """Every ready ref, a page at a time, in delivery order."""
        for lane in self.fifos:
            yield from lane.chunks()

    def nbytes(self) -> int:
        return sum(lane.nbytes() for lane in self.fifos)

    def clear(self) -> U64:
        """Remove every ready ref; returns them in delivery order."""
        return np.concatenate([lane.clear() for lane in self.fifos])

    def freeze(self) -> tuple[FrozenRefs, ...]:
        return tuple(lane.freeze() for lane in self.fifos)

    def adopt(self, wire: list[Any]) -> None:
        """Fill empty lanes from a snapshot's ``[head_pos, refs]`` pairs (no copy)."""
        for lane, (head_pos, refs) in zip(self.fifos, wire, strict=True):
            lane.adopt(refs, head_pos)

    def browse(self, after: int | None, limit: int) -> list[tuple[int, int, int]]:
        """Up to ``limit`` (cursor, ref, level) of ready messages in delivery order, after
        the one at ``after`` (a cursor; None = from the start)."""
        lane_no, pos = (0, 0) if after is None else _split_cursor(after + 1)
        out: list[tuple[int, int, int]] = []
        top = len(self.main) - 1
        while lane_no < len(self.fifos) and len(out) < limit:
            lane = self.fifos[lane_no]
            pos = max(pos, lane.head_pos)
            refs = lane.slice_from(pos, limit - len(out)).tolist()
            level = top - lane_no // 2
            for k, ref in enumerate(refs):
                out.append(((lane_no << _CURSOR_POS_BITS) | (pos + k), ref, level))
            lane_no, pos = lane_no + 1, 0
        return out

    def check(self) -> None:
        for lane in self.fifos:
            lane.check()


def _split_cursor(cursor: int) -> tuple[int, int]:
    return cursor >> _CURSOR_POS_BITS, cursor & ((1 << _CURSOR_POS_BITS) - 1)


__all__ = ["Lanes"]
