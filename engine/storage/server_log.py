"""One Raft server's durable log: its mem table over its segments, behind ``LogStore``.

Rule: this object changes only on the node's own thread, through ``NodeStorage`` when a
WAL batch completes or a segment flush finishes, so the Raft core may read it
synchronously without locks. It shows persisted entries only: entries still in the WAL
writer are in the core's unstable buffer.

Reads go to the mem table first, then to the segment that holds the index, through the
node's ``ReaderCache``; deliveries (``read_many``) look in its read cache of blocks
first and read from a segment a block at a time (``engine.storage.read_cache``).
Entries from ``mem_lo`` on are in the mem table and hide any stale copy in a segment (a
follower's overwritten suffix); ``last_index`` hides anything after it. Each mem-table
entry remembers the WAL file it was written to, so a flush after a WAL roll takes
exactly the entries of the rolled file and no others (``engine.storage.mem_table``).

A sleeping queue's log is kept as ``pack`` gives it (one ``bytes``) in the node's table
(``engine.storage.server_logs``) and made again by ``unpacked``, with no disk read.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass
from typing import cast

import msgpack
from pyroaring import AbstractBitMap64, FrozenBitMap64

from engine.errors import EntryDamaged, StorageFailed
from engine.raft.entry import Entry, EntryKind
from engine.storage.disk import Disk
from engine.storage.mem_table import MEM_ROW_OVERHEAD_BYTES, NO_MEM, MemTable
from engine.storage.read_cache import block_of
from engine.storage.segment import OVERWRITES, ReaderCache, SegmentInfo, segment_path
from engine.storage.wal import HardState

NO_LIVE = FrozenBitMap64()
"""The live set of a log with no snapshot, or one whose snapshot left nothing live: one
for every such log (most queues of a node: an empty ``BitMap64`` costs about 250 bytes,
mostly outside Python's own heap)."""


_PACKED_SEGMENT_FIELDS = 14
"""Items per segment in a packed log: the ``SegmentInfo``'s thirteen, then ``hi``."""


@dataclass(slots=True)
class _Segment:
    info: SegmentInfo
    hi: int
    """Last index this segment still answers for (older segments are cut by newer ones)."""


class ServerLog:
    """The ``LogStore`` of one server (see ``engine.raft.entry``), plus payload reads."""

    # Slots: one per queue, thousands on a node (no instance dict each).
    __slots__ = (
        "_cache",
        "_disk",
        "_his_max",
        "_last",
        "_los",
        "_segments",
        "_snapshot_index",
        "_snapshot_term",
        "cache_hits",
        "failed",
        "hard_state",
        "mem",
        "next_segment_seq",
        "reads",
        "reads_in_memory",
        "segment_bytes",
        "segment_reads",
        "snapshot_live",
        "uid",
    )

    def __init__(self, uid: str, disk: Disk, cache: ReaderCache) -> None:
        self.uid = uid
        self._disk = disk
        self._cache = cache
        self.mem = NO_MEM
        """Entries not yet in a segment; ``NO_MEM`` while none (an idle queue's were
        flushed), a table of its own from the next append."""
        self.reads = 0
        """Entries read (``read``), since the node started."""
        self.reads_in_memory = 0
        """Of those, the entries found in the mem table: no segment file was read."""
        self.cache_hits = 0
        """Of those, the entries ``read_many`` found in the node's read cache."""
        self.segment_reads = 0
        """``pread`` calls ``read_many`` made (each a block the read cache keeps)."""
        self.segment_bytes = 0
        """Entry bytes those reads took from segment files."""
        self._segments: list[_Segment] = []
        self._los: list[int] = []
        """``info.lo`` of each segment, for bisection."""
        self._his_max = 0
        """No segment's ``hi`` is above it (it may be above them all): a segment that
        overwrites from above it cuts nothing, so a restart adding hundreds of segments
        in order does not scan the others for each."""
        self._snapshot_index = 0
        self._snapshot_term = 0
        self.snapshot_live: AbstractBitMap64 = NO_LIVE
        """The live indexes of the snapshot: every other entry at or before it is dead
        (the segment writer skips them, compaction reclaims them). Replaced, never
        changed in place; ``NO_LIVE`` while empty."""
        self._last = 0
        self.hard_state: HardState | None = None
        self.failed: StorageFailed | None = None
        """Set when the disk refused a write for this server; it then refuses writes."""
        self.next_segment_seq = 1

    # -- LogStore ---------------------------------------------------------------------------

    def first_index(self) -> int:
        return self._snapshot_index + 1

    def last_index(self) -> int:
        return self._last

    def snapshot_index(self) -> int:
        return self._snapshot_index

    def snapshot_term(self) -> int:
        return self._snapshot_term

    def term(self, index: int) -> int | None:
        if index == self._snapshot_index:
            return self._snapshot_term  # 0 for index 0 of an empty log
        if index <= self._snapshot_index or index > self._last:
            return None
        entry = self.mem.get(index)
        if entry is not None:
            return entry.term
        seg = self._segment_for(index)
        if seg is None:
            return None
        if index == seg.info.tail_index:  # a small segment's last entry: no read
            return seg.info.tail_term
        cached = self._cached_run(seg.info, index, index + 1)
        return cached[0].term if cached else self._cache.get(seg.info).term(index)

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        if lo < self.first_index():
            raise LookupError(f"entry {lo} is before the first index {self.first_index()}")
        end = min(hi, self._last + 1)
        out: list[Entry] = []
        size = 0
        index = lo
        while index < end:
            run = self._run(index, end, max_bytes - size)
            if not run:
                raise LookupError(f"entry {index} of {self.uid} is not stored")
            for entry in run:
                size += len(entry.data)
                if out and size > max_bytes:
                    return out
                out.append(entry)
            index = out[-1].index + 1
        return out

    def _run(self, index: int, end: int, max_bytes: int) -> list[Entry]:
        """Stored entries from ``index`` on, from one place (mem table or one segment)."""
        if len(self.mem) and index >= self.mem.lo:
            return self.mem.slice(index, end)
        seg = self._segment_for(index)
        if seg is None:
            return []
        stop = min(end, seg.hi + 1, self.mem.lo if len(self.mem) else end)
        cached = self._cached_run(seg.info, index, stop)
        if cached:
            return cached
        return self._cache.get(seg.info).read_run(index, stop, max(max_bytes, 1))

    def config_indexes(self, lo: int, hi: int) -> list[int]:
        """``LogStore.config_indexes``: from the mem table's rows and the segments'
        index sections (read once per segment, checked when opened), no payload."""
        end = min(hi, self._last + 1)
        mem_lo = self.mem.lo if len(self.mem) else end
        out: list[int] = []
        index = max(lo, self.first_index())
        while index < min(end, mem_lo):
            seg = self._segment_for(index)
            if seg is None:  # not stored here: on to the next segment, if any
                k = bisect.bisect_right(self._los, index)
                index = self._los[k] if k < len(self._los) else mem_lo
                continue
            stop = min(end, mem_lo, seg.hi + 1)
            out += self._cache.get(seg.info).indexes_of_kind(EntryKind.CONFIG, index, stop)
            index = stop
        if index < end:
            out += self.mem.indexes_of_kind(EntryKind.CONFIG, index, end)
        return out

    def first_damaged(self, lo: int, max_bytes: int) -> tuple[int | None, str]:
        """The first entry from ``lo`` to the last that is missing or fails its CRC32C
        check, with why (``None`` if all are sound). Segments are checked in runs of
        about ``max_bytes`` without building entries; the mem table's came from WAL
        records that passed their check."""
        end = self._last + 1
        index = lo
        while index < end:
            if len(self.mem) and index >= self.mem.lo:
                if self.mem.hi + 1 < end:
                    return self.mem.hi + 1, f"entry {self.mem.hi + 1} is missing"
                return None, ""
            seg = self._segment_for(index)
            if seg is None:
                return index, f"entry {index} is missing"
            stop = min(end, seg.hi + 1, self.mem.lo if len(self.mem) else end)
            try:
                after = self._check_into_cache(seg.info, index, stop)
                if after is None:
                    after = self._cache.get(seg.info).check_run(index, stop, max(max_bytes, 1))
            except EntryDamaged as e:
                return e.index or index, e.detail
            if after == index:
                return index, f"entry {index} is missing"
            index = after
        return None, ""

    def _check_into_cache(self, info: SegmentInfo, index: int, stop: int) -> int | None:
        """``check_run`` of entries ``index`` below ``stop`` of segment ``info`` that
        together fit in one block of the node's read cache, the entries kept there as
        that block: the replay after recovery and a first delivery then read them from
        memory, where a node of thousands of queues would open each segment again (its
        reader long closed by the bounded ``ReaderCache``). ``None`` when not kept
        (no cache, a larger run, blocks of the segment cached already): check it then."""
        blocks = self._cache.blocks
        if not blocks.bytes_max or blocks.holds(info):
            return None
        reader = self._cache.get(info)
        if reader.run_bytes(index, stop) > blocks.block_bytes:
            return None
        read = reader.read_block(index, stop, stop, blocks.block_bytes, 0)
        if read:
            blocks.put(block_of(info, read))
        return index + len(read)

    def _cached_run(self, info: SegmentInfo, index: int, stop: int) -> list[Entry]:
        """Entries from ``index`` below ``stop`` that the node's read cache holds in one
        block of segment ``info`` (none if it does not hold ``index``)."""
        block = self._cache.blocks.find(info, index, counted=False)
        if block is None:
            return []
        return list(block.entries[index - block.lo : stop - block.lo])

    # -- payload reads ------------------------------------------------------------------------

    def read(self, index: int) -> Entry:
        """The entry at ``index``, also before the snapshot if it is still stored (a live
        entry). Raises ``LookupError`` if absent, ``StorageFailed`` if it fails its CRC."""
        if 0 < index <= self._last:
            self.reads += 1
            entry = self.mem.get(index)
            if entry is not None:
                self.reads_in_memory += 1
                return entry
            seg = self._segment_for(index)
            if seg is not None:
                found = self._cache.get(seg.info).read(index)
                if found is not None:
                    return found
        raise LookupError(f"entry {index} of {self.uid} is not stored")

    def read_many(self, indexes: list[int], run_bytes_max: int) -> list[Entry]:
        """The entries at ``indexes`` (ascending, distinct), as ``read`` gives them: each
        run of consecutive indexes is read from one place at a time, one ``pread`` per
        segment and at most ``run_bytes_max`` (but at least one entry), not one per
        entry; the node's read cache serves what it holds and keeps what is read (with
        the entries after it, a block). Raises as ``read`` does."""
        assert all(a < b for a, b in itertools.pairwise(indexes)), indexes
        out: list[Entry] = []
        k, n = 0, len(indexes)
        while k < n:
            j = k + 1
            while j < n and indexes[j] == indexes[j - 1] + 1:
                j += 1
            index, end = indexes[k], indexes[j - 1] + 1
            while index < end:
                run = self._stored_run(index, end, run_bytes_max)
                out += run
                index = run[-1].index + 1
            k = j
        return out

    def _stored_run(self, index: int, end: int, max_bytes: int) -> list[Entry]:
        """Entries from ``index`` below ``end`` from one place (``read``'s places: the
        mem table or one segment), at least one; ``LookupError`` if ``index`` is absent."""
        if 0 < index <= self._last:
            end = min(end, self._last + 1)
            mem = self.mem
            if len(mem) and mem.lo <= index <= mem.hi:
                run = mem.slice(index, min(end, mem.hi + 1))
                self.reads += len(run)
                self.reads_in_memory += len(run)
                return run
            seg = self._segment_for(index)
            if seg is not None:
                held = min(self._last + 1, seg.hi + 1)
                if len(mem) and index < mem.lo:
                    held = min(held, mem.lo)
                run = self._segment_run(seg.info, index, min(end, held), held, max_bytes)
                if run:
                    self.reads += len(run)
                    return run
        raise LookupError(f"entry {index} of {self.uid} is not stored")

    def _segment_run(
        self, info: SegmentInfo, index: int, stop: int, held: int, max_bytes: int
    ) -> list[Entry]:
        """Entries from ``index`` below ``stop`` of segment ``info`` (which answers for
        this log up to ``held``): from the node's read cache, or read as a block that the
        cache keeps (``engine.storage.read_cache``)."""
        blocks = self._cache.blocks
        block = blocks.find(info, index)
        if block is not None:
            run = list(block.entries[index - block.lo : stop - block.lo])
            self.cache_hits += len(run)
            return run
        ahead = blocks.next_lo(info, index)
        hi = held if ahead is None else min(held, ahead)  # blocks never overlap
        stop = min(stop, hi)
        block_bytes = blocks.block_bytes if blocks.bytes_max else 0
        read = self._cache.get(info).read_block(index, stop, hi, max_bytes, block_bytes)
        if read:
            self.segment_reads += 1
            self.segment_bytes += sum(len(e.data) for e in read)
            if block_bytes:
                blocks.put(block_of(info, read))
        return read[: stop - index]

    def entry(self, index: int) -> Entry:
        """``LogStore.entry``: the same as ``read``."""
        return self.read(index)

    def _segment_for(self, index: int) -> _Segment | None:
        k = bisect.bisect_right(self._los, index) - 1
        if k >= 0 and index <= self._segments[k].hi:
            return self._segments[k]
        return None

    # -- changes, made by NodeStorage on the node's thread --------------------------------

    def apply_append(
        self, entries: tuple[Entry, ...], wal_seq: int, *, gap_allowed: bool = False
    ) -> None:
        first = entries[0].index
        if first > self._last + 1:
            assert gap_allowed, f"{self.uid}: append at {first} after {self._last}"
            self.mem.clear()
        if self.mem is NO_MEM:
            self.mem = MemTable()
        self.mem.put(entries, wal_seq)
        self._last = entries[-1].index

    def drop_flushed(self, wal_seq: int) -> None:
        """The entries of WAL files up to ``wal_seq`` are in segments now: out of the mem
        table, and the table itself once empty."""
        self.mem.drop_flushed(wal_seq)
        if not len(self.mem):
            self.mem = NO_MEM

    def apply_reset(self, index: int, term: int) -> None:
        """The log restarts after a snapshot at ``index`` (installed from the leader).
        Segments stay: the installer removed the older ones before the reset was
        written, so those left hold the snapshot's live entries or were written after
        it (at recovery); ``last_index`` hides anything after ``index``."""
        self.mem.clear()
        self._snapshot_index, self._snapshot_term = index, term
        self._last = index

    def keep_to(self, index: int) -> None:
        """Repair: the log ends at ``index`` at most (what follows is damaged or cannot
        be trusted). Segment entries after it stay on disk, hidden by ``last_index``,
        until entries written later replace them."""
        self.mem.truncate_after(index)
        self._last = min(self._last, max(index, self._snapshot_index))

    def extend_to(self, index: int) -> None:
        """At recovery: segments written during a repair end at ``index``."""
        self._last = max(self._last, index)

    def drop_segments(self) -> list[SegmentInfo]:
        """Take every segment out of the view (their files are being deleted)."""
        infos = [s.info for s in self._segments]
        self._segments = []
        self._los = []
        return infos

    def last_from_segments(self) -> None:
        """At recovery, before the WAL replay: the log ends where its segments end."""
        if self._segments:
            self._last = max(self._snapshot_index, self._segments[-1].hi)

    def add_segment(self, info: SegmentInfo) -> list[str]:
        """Put a new segment in the view; returns paths of segments it hides entirely."""
        hidden: list[str] = []
        if info.flags & OVERWRITES and info.lo <= self._his_max:
            kept: list[_Segment] = []
            for seg in self._segments:
                seg.hi = min(seg.hi, info.lo - 1)
                if seg.hi >= seg.info.lo:
                    kept.append(seg)
                else:
                    hidden.append(seg.info.path)
            self._segments = kept
            self._los = [s.info.lo for s in kept]
            self._his_max = max((s.hi for s in kept), default=0)
        # Inserted in place, not appended and sorted: a restart adds every segment of a
        # deep queue one by one (hundreds), which sorting each time made quadratic.
        at = bisect.bisect_right(self._los, info.lo)
        self._segments.insert(at, _Segment(info, info.hi))
        self._los.insert(at, info.lo)
        self._his_max = max(self._his_max, info.hi)
        self.next_segment_seq = max(self.next_segment_seq, info.seq + 1)
        return hidden

    def set_snapshot(self, index: int, term: int, live: AbstractBitMap64) -> list[str]:
        """The prefix up to ``index`` is covered by a snapshot; returns segments that hold
        no live entry and nothing after ``index`` (they may be deleted)."""
        assert index >= self._snapshot_index
        self._snapshot_index, self._snapshot_term = index, term
        self.snapshot_live = live if live else NO_LIVE
        self._last = max(self._last, index)
        dead = [
            s
            for s in self._segments
            if s.hi <= index and live.range_cardinality(s.info.lo, s.hi + 1) == 0
        ]
        self._segments = [s for s in self._segments if s not in dead]
        self._los = [s.info.lo for s in self._segments]
        return [s.info.path for s in dead]

    def segment_infos(self) -> list[tuple[SegmentInfo, int]]:
        """The segments in the view, each with the last index it answers for."""
        return [(s.info, s.hi) for s in self._segments]

    def forget_reads(self) -> None:
        """Take this log's blocks out of the node's read cache (its queue fell asleep:
        it reads nothing until it wakes, and a block costs its entries' memory)."""
        for seg in self._segments:
            self._cache.blocks.drop(seg.info.path)

    def packable(self) -> bool:
        """Whether ``pack`` may take it: no failed write (the error is not packed)."""
        return self.failed is None

    def pack(self) -> bytes:
        """Everything of this log but its uid, disk and cache as one msgpack array: the
        form a sleeping queue's log takes (``ServerLogs.pack``), a few dozen bytes where
        the objects took about a kilobyte. Its mem table's rows go with it (an idle log
        keeps its last entry or two there, carried from WAL file to WAL file). A
        segment's path is left out when it is the one ``segment_path`` gives its seq
        (always, but for compaction's outputs)."""
        assert self.packable(), f"{self.uid}: a failed log is not packed"
        segments: list[object] = []
        for seg in self._segments:
            i = seg.info
            path = None if i.path == segment_path(self.uid, i.seq) else i.path
            segments += (path, i.seq, i.lo, i.hi, i.count, i.flags, i.generation)
            segments += (i.index_offset, i.data_offset, i.index_crc, i.bytes)
            segments += (i.tail_index, i.tail_term, seg.hi)
        hs = self.hard_state
        fields = (
            self.reads,
            self.reads_in_memory,
            self.cache_hits,
            self.segment_reads,
            self.segment_bytes,
            self._snapshot_index,
            self._snapshot_term,
            self._last,
            self._his_max,
            self.next_segment_seq,
            None if hs is None else (hs.term, hs.vote, hs.commit),
            self.snapshot_live.serialize() if self.snapshot_live else None,
            segments,
            self.mem.packed_rows() if len(self.mem) else None,
        )
        return cast(bytes, msgpack.packb(fields))

    @classmethod
    def unpacked(cls, uid: str, disk: Disk, cache: ReaderCache, packed: bytes) -> ServerLog:
        """The log ``pack`` gave ``packed`` of, as it was (nothing is read from disk: a
        segment is opened when first read, as always)."""
        log = cls(uid, disk, cache)
        (
            log.reads,
            log.reads_in_memory,
            log.cache_hits,
            log.segment_reads,
            log.segment_bytes,
            log._snapshot_index,
            log._snapshot_term,
            log._last,
            log._his_max,
            log.next_segment_seq,
            hs,
            live,
            flat,
            mem,
        ) = msgpack.unpackb(packed)
        if mem is not None:
            log.mem = MemTable.of_rows(*mem)
        if hs is not None:
            log.hard_state = HardState(*hs)
        if live is not None:
            log.snapshot_live = FrozenBitMap64.deserialize(live)
        width = _PACKED_SEGMENT_FIELDS
        for k in range(0, len(flat), width):
            path, seq, *rest, hi = flat[k : k + width]
            info = SegmentInfo(segment_path(uid, seq) if path is None else path, seq, *rest)
            log._segments.append(_Segment(info, hi))
            log._los.append(info.lo)
        return log

    @staticmethod
    def packed_reads(packed: bytes) -> tuple[int, int]:
        """(``reads``, ``reads_in_memory + cache_hits``) of a packed log."""
        reads, in_memory, cache_hits = msgpack.unpackb(packed)[:3]
        return cast(int, reads), cast(int, in_memory) + cast(int, cache_hits)

    def segments_after(self, index: int) -> int:
        """How many segments begin after ``index`` (those written since a checkpoint at it)."""
        return len(self._los) - bisect.bisect_right(self._los, index)

    def is_dead(self, index: int) -> bool:
        """Whether the entry at ``index`` is dead: at or before the snapshot and not one
        of its live indexes."""
        return index <= self._snapshot_index and index not in self.snapshot_live

    # -- compaction (engine.storage.compaction), on the node's thread -------------------------

    def has_segment(self, info: SegmentInfo) -> bool:
        return any(s.info == info for s in self._segments)

    def remove_segments(self, paths: set[str]) -> None:
        """Take segments out of the view (compaction phase 1, or inputs of phase 3)."""
        self._segments = [s for s in self._segments if s.info.path not in paths]
        self._los = [s.info.lo for s in self._segments]

    def replace_segment(self, old: SegmentInfo, new: SegmentInfo) -> None:
        """The same file with a new header (compaction phase 2 cut its dead tail)."""
        for seg in self._segments:
            if seg.info == old:
                assert new.path == old.path and new.lo == old.lo
                seg.info = new
                seg.hi = min(seg.hi, new.hi)
                return
        raise AssertionError(f"segment {old.path} is not in the view")

    def swap_segments(self, inputs: list[SegmentInfo], output: SegmentInfo) -> None:
        """Compaction phase 3: ``output`` holds the live entries of ``inputs``, which
        are consecutive in the view, and replaces them."""
        paths = {i.path for i in inputs}
        kept = [s for s in self._segments if s.info.path not in paths]
        assert len(kept) == len(self._segments) - len(inputs), "inputs left the view"
        kept.append(_Segment(output, output.hi))
        kept.sort(key=lambda s: s.info.lo)
        self._his_max = max(self._his_max, output.hi)
        self._segments = kept
        self._los = [s.info.lo for s in self._segments]


__all__ = ["MEM_ROW_OVERHEAD_BYTES", "NO_LIVE", "MemTable", "ServerLog"]
