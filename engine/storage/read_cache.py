"""The node's cache of segment reads: blocks of entries read for deliveries, bounded by bytes.

Rule: one ``ReadCache`` per node, shared by every server's log, used on the node's
thread only (as ``ServerLog`` is). It holds *blocks*: runs of consecutive entries read
from one segment with one ``pread``. It never serves an entry of a segment other than
the one it was read from: a block is found by the segment's path and must carry the
same ``SegmentInfo`` (header generation, count, CRC of the index), so a segment cut or
replaced by compaction, or a path reused after a server was removed, finds nothing
stale. Its bytes (entry data plus ``ENTRY_OVERHEAD_BYTES`` per entry) never pass
``bytes_max``: a block that alone would is not kept. The memory alarm may take bytes
back (``shrink_to``) for a publish.

Policy, and why. A queue is consumed front to back, and a publish batch is one entry
holding up to a thousand messages, so consecutive receives read the same entries again
(a receive of 100 messages of such a queue spans one or two entries, each read by
several receives). A delivery read from a segment therefore reads a block: the entries
it wants and, after them, those that fit in ``Limits.read_cache_block_bytes``, as far as
the segment holds them; the next receives of the queue, by any consumer, find them
here. Blocks of one segment never overlap (a read stops before the next cached block),
so a lookup is one bisection. Eviction is least recently used, by bytes: a consumer's
reuse distance is short (the block read last is the one the next receive needs) and a
block the consumers of its queue have passed is never read again but for a
redelivery, so the least recently used block is the one least likely to be needed;
a scan larger than the cache, where LRU does badly, does not occur, since no consumer
goes back over what it has consumed.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.raft.entry import Entry

if TYPE_CHECKING:
    from engine.storage.segment import SegmentInfo

ENTRY_OVERHEAD_BYTES = 120
"""What an entry costs in memory beside its data: the ``Entry`` object (five slots) and
the header of its ``bytes`` object, rounded up."""


@dataclass(frozen=True, slots=True)
class Block:
    """Entries ``lo .. lo + len(entries) - 1``, read from the segment ``info``."""

    info: SegmentInfo
    entries: tuple[Entry, ...]
    bytes: int

    @property
    def lo(self) -> int:
        return self.entries[0].index

    @property
    def end(self) -> int:
        """The index after the last entry."""
        return self.entries[-1].index + 1


def block_of(info: SegmentInfo, entries: list[Entry]) -> Block:
    """A block of ``entries`` (consecutive indexes) read from ``info``, with its cost."""
    assert entries and entries[-1].index - entries[0].index == len(entries) - 1
    size = sum(len(e.data) for e in entries) + ENTRY_OVERHEAD_BYTES * len(entries)
    return Block(info, tuple(entries), size)


@dataclass(slots=True)
class _SegmentBlocks:
    """The cached blocks of one segment file, ordered by ``lo``, disjoint."""

    info: SegmentInfo
    los: list[int] = field(default_factory=list)
    blocks: list[Block] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ReadCacheStats:
    """The node's cache now (``bytes``, ``blocks``) and since the node started."""

    bytes: int
    bytes_max: int
    blocks: int
    hits: int
    misses: int
    evictions: int


class ReadCache:
    """A byte-bounded LRU of blocks of segment entries (see the module's rule)."""

    def __init__(self, bytes_max: int, block_bytes: int) -> None:
        assert bytes_max >= 0 and block_bytes >= 1
        self.bytes_max = bytes_max
        self.block_bytes = block_bytes
        self.bytes = 0
        self.hits = 0
        """Lookups that found their entry (``find``)."""
        self.misses = 0
        self.evictions = 0
        """Blocks dropped to make room (not those of a segment that changed or left)."""
        self._segments: dict[str, _SegmentBlocks] = {}
        self._lru: OrderedDict[tuple[str, int], Block] = OrderedDict()
        """Every block by (path, lo), least recently used first."""

    def __len__(self) -> int:
        return len(self._lru)

    def find(self, info: SegmentInfo, index: int, *, counted: bool = True) -> Block | None:
        """The block of segment ``info`` holding ``index``, made most recently used;
        counted in ``hits`` and ``misses`` unless not ``counted`` (a read that is no
        delivery: the replay after a restart, whose misses say nothing of deliveries)."""
        blocks = self._current(info)
        if blocks is not None:
            k = bisect.bisect_right(blocks.los, index) - 1
            if k >= 0 and index < blocks.blocks[k].end:
                block = blocks.blocks[k]
                self._lru.move_to_end((info.path, block.lo))
                self.hits += counted
                return block
        self.misses += counted
        return None

    def holds(self, info: SegmentInfo) -> bool:
        """Whether any block of segment ``info`` is cached."""
        return self._current(info) is not None

    def next_lo(self, info: SegmentInfo, index: int) -> int | None:
        """The first index after ``index`` that starts a cached block of ``info``: a
        block read from ``index`` stops before it, so blocks never overlap."""
        blocks = self._current(info)
        if blocks is None:
            return None
        k = bisect.bisect_right(blocks.los, index)
        return blocks.los[k] if k < len(blocks.los) else None

    def put(self, block: Block) -> bool:
        """Keep ``block`` (most recently used), evicting the least recently used blocks
        until the bytes fit; whether it was kept (not if it alone passes the bound)."""
        if block.bytes > self.bytes_max:
            return False
        path = block.info.path
        blocks = self._current(block.info)
        if blocks is None:
            blocks = self._segments[path] = _SegmentBlocks(block.info)
        k = bisect.bisect_right(blocks.los, block.lo)
        assert k == 0 or blocks.blocks[k - 1].end <= block.lo, "overlapping blocks"
        assert k == len(blocks.los) or block.end <= blocks.los[k], "overlapping blocks"
        blocks.los.insert(k, block.lo)
        blocks.blocks.insert(k, block)
        self._lru[(path, block.lo)] = block
        self.bytes += block.bytes
        self.shrink_to(self.bytes_max)
        assert self.bytes <= self.bytes_max
        return True

    def shrink_to(self, bytes_max: int) -> None:
        """Evict the least recently used blocks until at most ``bytes_max`` bytes are
        held (the memory alarm takes the memory back for a publish)."""
        while self.bytes > max(bytes_max, 0):
            (path, lo), _ = next(iter(self._lru.items()))
            self._remove(path, lo)
            self.evictions += 1

    def drop(self, path: str) -> None:
        """Forget every block of the segment file ``path`` (it changed or left)."""
        blocks = self._segments.pop(path, None)
        if blocks is None:
            return
        for block in blocks.blocks:
            del self._lru[(path, block.lo)]
            self.bytes -= block.bytes

    def stats(self) -> ReadCacheStats:
        return ReadCacheStats(
            self.bytes, self.bytes_max, len(self._lru), self.hits, self.misses, self.evictions
        )

    def _current(self, info: SegmentInfo) -> _SegmentBlocks | None:
        """The blocks of ``info``'s path if they were read from this very segment;
        blocks of an older version of the file are dropped."""
        blocks = self._segments.get(info.path)
        if blocks is not None and blocks.info != info:
            self.drop(info.path)
            return None
        return blocks

    def _remove(self, path: str, lo: int) -> None:
        block = self._lru.pop((path, lo))
        self.bytes -= block.bytes
        blocks = self._segments[path]
        k = bisect.bisect_left(blocks.los, lo)
        assert blocks.los[k] == lo
        del blocks.los[k]
        del blocks.blocks[k]
        if not blocks.los:
            del self._segments[path]


__all__ = ["ENTRY_OVERHEAD_BYTES", "Block", "ReadCache", "ReadCacheStats", "block_of"]
