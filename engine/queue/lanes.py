"""The ready messages of one queue: two FIFOs of packed refs per priority level.

Rule of this module: it is the only place that knows how lanes are numbered. Each level
has a *returns* lane (messages given back after a delivery), served before its *main*
lane (first deliveries in publish order), and levels are strict: a higher level is
always served first. So the lanes are kept in delivery order, the returns lane of level
``level`` at number ``2 * (top - level)`` and its main lane right after it; snapshots
list them in that order and browse cursors name a lane by its number.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
from pyroaring import BitMap64

from engine.queue.pages import FrozenRefs, RefFifo, SpilledPage
from engine.queue.refs import FallbackTable, indexes_of, indexes_of_parts

if TYPE_CHECKING:
    from engine.queue.paging import QueuePager

U64 = npt.NDArray[np.uint64]

_CURSOR_POS_BITS = 48
"""A browse cursor is ``lane number << 48 | absolute position in the lane``."""


class Lanes:
    """The lanes of a queue with ``levels`` priority levels (0 is the lowest)."""

    # One slot: the lanes of each level are found from their numbers, not kept in tuples
    # of their own (an idle queue would hold ~200 bytes of tuples naming the same lanes).
    __slots__ = ("fifos",)

    def __init__(self, levels: int, page_refs: int, pager: QueuePager | None = None) -> None:
        self.fifos = tuple(RefFifo(page_refs, pager) for _ in range(2 * levels))
        """Every lane, in delivery order."""
        if pager is not None:
            pager.lanes = self.fifos

    @property
    def levels(self) -> int:
        return len(self.fifos) // 2

    def returns(self, level: int) -> RefFifo:
        """The returns lane of ``level``."""
        return self.fifos[2 * (self.levels - 1 - level)]

    def main(self, level: int) -> RefFifo:
        """The main lane of ``level``."""
        return self.fifos[2 * (self.levels - 1 - level) + 1]

    def by_level(self) -> Iterator[tuple[int, RefFifo, RefFifo]]:
        """(level, returns lane, main lane) from the highest level down: delivery order."""
        fifos = self.fifos
        top = len(fifos) // 2 - 1
        for k in range(0, len(fifos), 2):
            yield top - k // 2, fifos[k], fifos[k + 1]

    def drop_order(self) -> list[RefFifo]:
        """The lanes from the lowest level up, each level's returns lane first: the order
        in which overflow ``drop-head`` takes messages."""
        fifos = self.fifos
        return [lane for k in range(len(fifos) - 2, -1, -2) for lane in fifos[k : k + 2]]

    def count(self) -> int:
        return sum(len(lane) for lane in self.fifos)

    def chunks(self) -> Iterator[U64]:
        """Every ready ref, a page at a time, in delivery order."""
        for lane in self.fifos:
            yield from lane.chunks()

    def nbytes(self) -> int:
        return sum(lane.nbytes() for lane in self.fifos)

    def drain(self, read: bool) -> tuple[list[U64], int, int]:
        """Remove every ready ref: ``RefFifo.drain`` over the lanes, in delivery order."""
        chunks: list[U64] = []
        unread = unread_bytes = 0
        for lane in self.fifos:
            got, count, size = lane.drain(read)
            chunks += got
            unread += count
            unread_bytes += size
        return chunks, unread, unread_bytes

    def freeze(self) -> tuple[FrozenRefs, ...]:
        return tuple(lane.freeze() for lane in self.fifos)

    def adopt(self, wire: list[Any]) -> None:
        """Fill empty lanes from a snapshot's ``[head_pos, refs, spilled]`` lanes (as
        ``engine.queue.snapshots.read_snapshot`` gives them; no copy)."""
        for lane, (head_pos, refs, spilled) in zip(self.fifos, wire, strict=True):
            lane.adopt(refs, head_pos, spilled)

    def live_indexes(self, others: Iterable[U64], table: FallbackTable) -> BitMap64:
        return index_set_of(self.freeze(), others, table)

    def spans(self, table: FallbackTable) -> list[tuple[int, int]]:
        return spans_of(self.freeze(), table)

    def browse(self, after: int | None, limit: int) -> list[tuple[int, int, int]]:
        """Up to ``limit`` (cursor, ref, level) of ready messages in delivery order, after
        the one at ``after`` (a cursor; None = from the start)."""
        lane_no, pos = (0, 0) if after is None else _split_cursor(after + 1)
        out: list[tuple[int, int, int]] = []
        top = self.levels - 1
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


def index_set_of(
    lanes: Iterable[FrozenRefs], others: Iterable[U64], table: FallbackTable
) -> BitMap64:
    """The Raft indexes of the refs of ``lanes`` and ``others``: spilled pages give the
    set they keep, nothing is read from the page store. A page at a time, each expanded
    page dropped before the next (they stay in the CPU cache)."""
    spilled: list[SpilledPage] = []

    def chunks() -> Iterator[U64]:
        for lane in lanes:
            for part in lane.parts():
                if isinstance(part, SpilledPage):
                    spilled.append(part)
                else:
                    yield part
        yield from others

    live = indexes_of_parts(chunks(), table)
    for page in spilled:
        live |= page.index_set()
    return live


def spans_of(lanes: Iterable[FrozenRefs], table: FallbackTable) -> list[tuple[int, int]]:
    """(lowest, highest) Raft index of each page of ready refs (see ``live_spans``)."""
    out: list[tuple[int, int]] = []
    for lane in lanes:
        for part in lane.parts():
            if isinstance(part, SpilledPage):
                out.append((part.index_lo, part.index_hi))
            else:
                indexes = indexes_of(part, table)
                out.append((int(indexes.min()), int(indexes.max())))
    return out


def _split_cursor(cursor: int) -> tuple[int, int]:
    return cursor >> _CURSOR_POS_BITS, cursor & ((1 << _CURSOR_POS_BITS) - 1)


__all__ = ["Lanes", "index_set_of", "spans_of"]
