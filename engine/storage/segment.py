"""Segment files: a server's entries after they leave the WAL, readable one at a time.

Rule: a segment is written whole, to a temporary name, synced, renamed and its directory
synced; it is never modified afterwards except by compaction (``compaction.py``), which
may cut dead data off its end (the data section is last for that reason) or replace it.

File format (``queues/<uid>/segments/<seq:08>.seg``)::

    header   two 64-byte slots: magic "QSEG", version u16, flags u16, count u32, seq u64,
             lo u64, hi u64, index_offset u64, data_offset u64, index CRC32C u32,
             generation u32, header CRC32C u32 (over the slot's first 60 bytes). The
             valid slot with the higher generation is the header; a segment is written
             with slot A only.
    index    count records of 48 bytes, sorted by index, numpy dtype ``INDEX_DTYPE``:
             index, term, now_ms, offset, length, CRC32C of the data, kind
    data     the entries' data, back to back, in index order

The index may be sparse (``count < hi - lo + 1``): the segment writer may skip dead
entries and compaction may rewrite several segments into one. Flag ``OVERWRITES`` marks a
segment written from the mem table: its entries replace every entry at ``lo`` and after
in older segments (a follower's log may have been overwritten); when the writer left
out dead entries, ``lo`` is still the first index it flushed. A compacted segment
carries ``COMPACTED`` instead: it replaces the files it was made from and nothing else. Cutting dead data off the end (compaction phase 2) writes the other header slot
with a smaller ``count``/``hi`` and the next generation, syncs, then truncates: a crash
at any point leaves one valid header. At recovery only the headers are read; a reader loads the index on first use and
checks it, and checks each entry's data on read.
"""

from __future__ import annotations

import functools
import struct
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import crc32c
import numpy as np
import numpy.typing as npt

from engine.errors import EntryDamaged
from engine.raft.entry import Entry, EntryKind
from engine.storage.disk import Disk, DiskFile, ensure_dir, parent, write_file_atomic
from engine.storage.read_cache import ReadCache

_KINDS = tuple(EntryKind)
"""Entry kinds by value, faster than calling the enum."""
_MAGIC = b"QSEG"
_VERSION = 1
_HEADER = struct.Struct("<4sHHIQQQQQII")
SLOT_BYTES = 64
HEADER_BYTES = 2 * SLOT_BYTES
OVERWRITES = 1
COMPACTED = 2
"""Written by compaction phase 3 from several segments (informational)."""
INDEX_DTYPE = np.dtype(
    [
        ("index", "<u8"),
        ("term", "<u8"),
        ("now_ms", "<u8"),
        ("offset", "<u8"),
        ("length", "<u4"),
        ("crc", "<u4"),
        ("kind", "u1"),
        ("pad", "V7"),
    ]
)
assert INDEX_DTYPE.itemsize == 48 and _HEADER.size + 4 == SLOT_BYTES
_INDEX_TERM = struct.Struct("<QQ")
"""A row's first two fields: index, term."""
SMALL_RUN_ROWS = 32
"""Up to this many index rows, a run's bounds are found in Python (``_small_run``)."""
_CRC_HELD = functools.partial(crc32c.crc32c, gil_release_mode=0)
"""The CRC32C of an entry's data, the GIL held (a call per entry: no thread switch)."""
HEAD_READ_BYTES = 4096
"""What recovery reads of a segment's start: the header, and the index when it fits
(a segment of up to 82 rows)."""


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """What recovery learns from a segment's header alone."""

    path: str
    seq: int
    lo: int
    hi: int
    count: int
    flags: int
    generation: int
    index_offset: int
    data_offset: int
    index_crc: int
    bytes: int
    tail_index: int = 0
    """The last entry the index holds (0: not read). A small segment's whole index lies
    in the first ``HEAD_READ_BYTES`` of the file, read with the header: its last row is
    kept, CRC checked, so that the term of a log's last entry is known at recovery
    without opening the segment again."""
    tail_term: int = 0
    """The term of ``tail_index``."""


SEGMENTS_DIR = "segments"
"""The segments' folder in their server's directory."""


def segment_dir(uid: str) -> str:
    return f"queues/{uid}/{SEGMENTS_DIR}"


def segment_path(uid: str, seq: int) -> str:
    return f"{segment_dir(uid)}/{seq:08d}.seg"


def encode_segment(seq: int, entries: Sequence[Entry], flags: int, lo: int | None = None) -> bytes:
    """The bytes of a segment holding ``entries`` (sorted by index, not necessarily dense).
    ``lo`` (at most the first entry's index) makes the segment answer from there: the
    segment writer passes the first index it flushed when it skipped dead entries, so
    that an ``OVERWRITES`` segment still cuts every older copy from that index on."""
    return b"".join(encode_segment_parts(seq, entries, flags, lo))


def encode_segment_parts(
    seq: int, entries: Sequence[Entry], flags: int, lo: int | None = None
) -> list[bytes]:
    """``encode_segment`` as the buffers that make it, in order: the header slots and
    the index, then each entry's data as it is. The segment writer writes them without
    joining them: a segment's bytes joined were a fresh mapping of its size (up to
    ``segment_file_bytes_max``) on every flush, each page of it faulted in to copy
    every payload once more."""
    return encode_segment_rows(
        seq,
        [e.index for e in entries],
        [(e.term, int(e.kind), e.now_ms, e.data) for e in entries],
        flags,
        lo,
    )


def encode_segment_rows(
    seq: int,
    indexes: Sequence[int],
    rows: Sequence[tuple[int, int, int, bytes]],
    flags: int,
    lo: int | None = None,
) -> list[bytes]:
    """``encode_segment_parts`` of the entries ``indexes`` (sorted) whose (term, kind,
    now_ms, data) are ``rows``, as a mem table holds them (``MemTable.flushable_rows``):
    a segment flush encodes them without an ``Entry`` made for each. ``indexes`` may be
    a ``range`` (a dense run)."""
    assert rows and len(indexes) == len(rows)
    lo = indexes[0] if lo is None else lo
    assert 1 <= lo <= indexes[0]
    count = len(rows)
    terms, kinds, nows, datas = zip(*rows, strict=True)
    index = np.zeros(count, dtype=INDEX_DTYPE)
    data_offset = HEADER_BYTES + count * INDEX_DTYPE.itemsize
    lengths = np.fromiter(map(len, datas), dtype=np.uint64, count=count)
    offsets = data_offset + np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.uint64)
    if isinstance(indexes, range) and indexes.step == 1:
        index["index"] = np.arange(indexes.start, indexes.stop, dtype=np.uint64)
    else:
        index["index"] = np.array(indexes, dtype=np.uint64)
    index["term"] = np.array(terms, dtype=np.uint64)
    index["now_ms"] = np.array(nows, dtype=np.uint64)
    index["offset"] = offsets
    index["length"] = lengths
    # The GIL stays held over each entry's CRC, as in the WAL (``wal._record``).
    index["crc"] = np.fromiter(map(_CRC_HELD, datas), np.uint32, count)
    index["kind"] = np.array(kinds, dtype=np.uint8)
    assert bool(np.all(np.diff(index["index"].astype(np.int64)) > 0)), "unsorted entries"
    index_bytes = index.tobytes()
    head = encode_header(seq, flags, count, lo, indexes[-1], data_offset, index_bytes, 1)
    return [b"".join([head, bytes(SLOT_BYTES), index_bytes]), *datas]


def encode_header(
    seq: int,
    flags: int,
    count: int,
    lo: int,
    hi: int,
    data_offset: int,
    index_bytes: bytes,
    generation: int,
) -> bytes:
    """One header slot (64 bytes)."""
    head = _HEADER.pack(
        _MAGIC,
        _VERSION,
        flags,
        count,
        seq,
        lo,
        hi,
        HEADER_BYTES,
        data_offset,
        crc32c.crc32c(index_bytes),
        generation,
    )
    return head + struct.pack("<I", crc32c.crc32c(head))


def write_segment(disk: Disk, uid: str, seq: int, entries: Sequence[Entry], flags: int) -> None:
    path = segment_path(uid, seq)
    ensure_dir(disk, parent(path))
    write_file_atomic(disk, path, encode_segment(seq, entries, flags))


def segment_seq(name: str) -> int | None:
    """The seq of a segment file name (``<seq:08>.seg``), ``None`` for other names."""
    stem, dot, ext = name.partition(".")
    return int(stem) if dot and ext == "seg" and stem.isdigit() else None


def slot_offset(generation: int) -> int:
    """Where the header of ``generation`` goes: generations alternate between the two
    slots, so writing the next one never overwrites the valid one."""
    assert generation >= 1
    return ((generation - 1) % 2) * SLOT_BYTES


def read_segment_info(disk: Disk, path: str) -> SegmentInfo | None:
    """The header of a segment (the valid slot of the higher generation), or ``None``
    if neither slot is valid."""
    f = disk.open(path)
    try:
        head, size = f.pread(0, HEAD_READ_BYTES), f.size()
    finally:
        f.close()
    slots = [_slot(head[k : k + SLOT_BYTES], size) for k in (0, SLOT_BYTES)]
    valid = [slot for slot in slots if slot is not None]
    return _info(path, max(valid, key=lambda slot: slot.generation), size, head) if valid else None


def segment_info_of(path: str, data: bytes) -> SegmentInfo:
    """The header of a segment ``encode_segment`` just made, read from its bytes."""
    slot = _slot(data[:SLOT_BYTES], len(data))
    assert slot is not None, f"segment {path} unreadable as encoded"
    return _info(path, slot, len(data), memoryview(data)[:HEAD_READ_BYTES])


class _Slot(NamedTuple):
    """A valid header slot: ``SegmentInfo``'s fields after its path, in order."""

    seq: int
    lo: int
    hi: int
    entry_count: int  # ``SegmentInfo.count`` (``count`` is a tuple method)
    flags: int
    generation: int
    index_offset: int
    data_offset: int
    index_crc: int


def _info(path: str, slot: _Slot, size: int, head: bytes | memoryview) -> SegmentInfo:
    """The ``SegmentInfo`` of ``slot``, with its index's last row when the whole index
    lies in ``head`` and passes its CRC (else without: the row is read on demand). Made
    once: a start reads the header of every segment of every queue, and each frozen
    dataclass made (or ``dataclasses.replace``d) costs a few microseconds."""
    end = slot.index_offset + slot.entry_count * INDEX_DTYPE.itemsize
    tail_index = tail_term = 0
    if end <= len(head) and crc32c.crc32c(head[slot.index_offset : end]) == slot.index_crc:
        tail_index, tail_term = _INDEX_TERM.unpack_from(head, end - INDEX_DTYPE.itemsize)
    return SegmentInfo(path, *slot, size, tail_index=tail_index, tail_term=tail_term)


def _slot(head: bytes, size: int) -> _Slot | None:
    if len(head) < SLOT_BYTES or crc32c.crc32c(head[:60]) != struct.unpack_from("<I", head, 60)[0]:
        return None
    magic, version, flags, count, seq, lo, hi, index_offset, data_offset, index_crc, gen = (
        _HEADER.unpack_from(head)
    )
    if magic != _MAGIC or version != _VERSION or not (1 <= lo <= hi) or count < 1:
        return None
    if data_offset < index_offset + count * INDEX_DTYPE.itemsize or data_offset > size:
        return None
    return _Slot(seq, lo, hi, count, flags, gen, index_offset, data_offset, index_crc)


class ReadScratch:
    """The buffer that a node's runs of entries are read into, kept from one read to the
    next, out of which each entry's data is copied (``SegmentReader.read_block``).

    A run is read whole with one ``pread`` (a block of the read cache, up to
    ``Limits.read_run_bytes_max``), and each entry's data copied out of it as
    ``bytes``. Read into a fresh ``bytes`` each time, a run is a fresh mapping of its
    size (the server's malloc maps every buffer over 256 KiB: app/server.py
    ``tune_malloc``), whose pages fault in as the kernel copies into it: on this
    virtual machine that cost about as much as the read. The kept buffer faults in once.
    Nothing read through it outlives the read: the entries' data are copies, so the
    buffer is reused at the next read with no view of it left. Used on the node's
    thread only, as the ``ReaderCache`` whose readers share it."""

    __slots__ = ("_buffer", "_bytes_max")

    def __init__(self, bytes_max: int) -> None:
        assert bytes_max >= 1
        self._bytes_max = bytes_max
        """A longer run is read into a buffer of its own, as without a scratch."""
        self._buffer = bytearray()
        """Grown to the longest run read so far (up to ``bytes_max``), at first use."""

    def read(self, file: DiskFile, offset: int, length: int) -> memoryview:
        """``length`` bytes of ``file`` at ``offset`` (fewer at its end): a view valid
        until the next ``read``."""
        if length > self._bytes_max:
            return memoryview(file.pread(offset, length))
        if len(self._buffer) < length:
            self._buffer = bytearray(min(self._bytes_max, max(length, 2 * len(self._buffer))))
        view = memoryview(self._buffer)[:length]
        return view[: file.pread_into(offset, view)]


class SegmentReader:
    """An open segment: its index in memory (checked once), entries read by ``pread``
    (runs through the node's ``ReadScratch``, when given one)."""

    def __init__(self, disk: Disk, info: SegmentInfo, scratch: ReadScratch | None = None) -> None:
        self.info = info
        self._scratch = scratch
        self._file: DiskFile = disk.open(info.path)
        raw = self._file.pread(info.index_offset, info.count * INDEX_DTYPE.itemsize)
        if len(raw) != info.count * INDEX_DTYPE.itemsize or crc32c.crc32c(raw) != info.index_crc:
            self._file.close()
            raise EntryDamaged(
                f"segment {info.path}: index section fails its CRC32C check", index=info.lo
            )
        self.index: npt.NDArray[np.void] = np.frombuffer(raw, dtype=INDEX_DTYPE)
        self._dense = info.count == info.hi - info.lo + 1

    def position(self, index: int) -> int | None:
        """Row of ``index`` in the index section, or ``None`` if the segment lacks it."""
        if not self.info.lo <= index <= self.info.hi:
            return None
        if self._dense:
            return index - self.info.lo
        row = int(np.searchsorted(self.index["index"], index))
        if row < self.info.count and int(self.index["index"][row]) == index:
            return row
        return None

    def term(self, index: int) -> int | None:
        row = self.position(index)
        return None if row is None else int(self.index["term"][row])

    def indexes_of_kind(self, kind: EntryKind, lo: int, hi: int) -> list[int]:
        """Indexes of the entries of ``kind`` from ``lo`` below ``hi`` held here, from the
        index section alone."""
        rows = self.index
        chosen = (rows["kind"] == int(kind)) & (rows["index"] >= lo) & (rows["index"] < hi)
        return [int(i) for i in rows["index"][chosen]]

    def run_bytes(self, lo: int, hi: int) -> int:
        """Data bytes of the entries this segment holds from ``lo`` below ``hi``."""
        rows = self.index
        chosen = (rows["index"] >= lo) & (rows["index"] < hi)
        return int(rows["length"][chosen].sum(dtype=np.int64))

    def read(self, index: int) -> Entry | None:
        row = self.position(index)
        if row is None:
            return None
        rec = self.index[row]
        offset, length = int(rec["offset"]), int(rec["length"])
        data = self._file.pread(offset, length)
        if len(data) != length or crc32c.crc32c(data) != int(rec["crc"]):
            raise EntryDamaged(
                f"segment {self.info.path}: entry {index} fails its CRC32C check", index=index
            )
        return Entry(index, int(rec["term"]), _KINDS[int(rec["kind"])], int(rec["now_ms"]), data)

    def read_run(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        """Entries ``lo, lo+1, ...`` below ``hi`` that this segment holds without a hole,
        with one ``pread``, stopping before the one that would pass ``max_bytes`` (at
        least one entry if ``lo`` is held)."""
        return self.read_block(lo, hi, hi, max_bytes, 0)

    def read_block(
        self, lo: int, want_hi: int, hi: int, want_bytes_max: int, block_bytes: int
    ) -> list[Entry]:
        """``read_run(lo, want_hi, want_bytes_max)`` and, in the same ``pread``, the
        entries after those below ``hi`` as long as all of them together stay within
        ``block_bytes`` (the block a cache keeps, ``engine.storage.read_cache``)."""
        rows, bodies = self._checked_run(lo, want_hi, hi, want_bytes_max, block_bytes)
        return [
            Entry(lo + k, term, _KINDS[kind], now_ms, bytes(body))
            for k, ((term, now_ms, kind), body) in enumerate(zip(rows, bodies, strict=True))
        ]

    def check_run(self, lo: int, hi: int, max_bytes: int) -> int:
        """The CRC32C check of ``read_run`` without building entries. Returns the index
        after the last one checked (``lo`` if ``lo`` is not held)."""
        return lo + len(self._checked_run(lo, hi, hi, max_bytes, 0)[1])

    def _checked_run(
        self, lo: int, want_hi: int, hi: int, want_bytes_max: int, block_bytes: int
    ) -> tuple[list[tuple[int, int, int]], list[memoryview]]:
        """(term, now_ms, kind) of each of ``read_block``'s entries and its body, checked
        against its CRC32C (``EntryDamaged`` at the first that fails). The bodies are
        views of the scratch when there is one: valid until the next read."""
        assert want_hi <= hi
        start = self.position(lo)
        if start is None or want_hi <= lo:
            return [], []
        rows = self.index[start : start + (hi - lo)]
        if len(rows) <= SMALL_RUN_ROWS:
            first, lengths, crcs, meta = self._small_run(
                rows, lo, want_hi, want_bytes_max, block_bytes
            )
        else:
            first, lengths, crcs, meta = self._large_run(
                rows, lo, want_hi, want_bytes_max, block_bytes
            )
        scratch = self._scratch
        length = sum(lengths)
        data = (
            memoryview(self._file.pread(first, length))
            if scratch is None
            else scratch.read(self._file, first, length)
        )
        bodies: list[memoryview] = []
        at = 0
        for length, crc in zip(lengths, crcs, strict=True):
            body = data[at : at + length]
            at += length
            if len(body) != length or crc32c.crc32c(body) != crc:
                index = lo + len(bodies)
                raise EntryDamaged(
                    f"segment {self.info.path}: entry {index} fails its CRC32C check",
                    index=index,
                )
            bodies.append(body)
        return meta, bodies

    @staticmethod
    def _small_run(
        rows: npt.NDArray[np.void], lo: int, want_hi: int, want_bytes_max: int, block_bytes: int
    ) -> tuple[int, list[int], list[int], list[tuple[int, int, int]]]:
        """``_large_run`` of a few rows, in Python: each numpy call costs about a
        microsecond whatever its length, and the first delivery of a queue woken from
        sleep reads a run of one entry out of a segment of ten."""
        table: list[tuple[int, int, int, int, int, int, int, bytes]] = rows.tolist()
        wanted = ahead = 0
        end = 0
        for k, (index, _term, _now, _offset, length, _crc, _kind, _pad) in enumerate(table):
            if index != lo + k:
                break  # a hole: the run stops before it
            end += length
            if end <= want_bytes_max and k < want_hi - lo:
                wanted = k + 1
            if block_bytes and end <= block_bytes:
                ahead = k + 1
        n = max(1, wanted, ahead)
        chosen = table[:n]
        return (
            chosen[0][3],
            [row[4] for row in chosen],
            [row[5] for row in chosen],
            [(row[1], row[2], row[6]) for row in chosen],
        )

    @staticmethod
    def _large_run(
        rows: npt.NDArray[np.void], lo: int, want_hi: int, want_bytes_max: int, block_bytes: int
    ) -> tuple[int, list[int], list[int], list[tuple[int, int, int]]]:
        """The offset of the first of the rows ``_checked_run`` reads, and the lengths,
        CRC32Cs and (term, now_ms, kind) of each: the held run from ``lo`` (no hole),
        its entries below ``want_hi`` within ``want_bytes_max`` (at least one) or, if
        more, those within ``block_bytes``."""
        held = rows["index"] == np.arange(lo, lo + len(rows), dtype=rows["index"].dtype)
        n = len(rows) if bool(held.all()) else int(np.argmin(held))
        ends = np.cumsum(rows["length"][:n], dtype=np.int64)
        wanted = min(want_hi - lo, int(np.searchsorted(ends, want_bytes_max, side="right")))
        ahead = int(np.searchsorted(ends, block_bytes, side="right")) if block_bytes else 0
        n = max(1, wanted, ahead)
        rows = rows[:n]
        meta = list(
            zip(rows["term"].tolist(), rows["now_ms"].tolist(), rows["kind"].tolist(), strict=True)
        )
        return int(rows["offset"][0]), rows["length"].tolist(), rows["crc"].tolist(), meta

    def close(self) -> None:
        self._file.close()


class ReaderCache:
    """A bounded LRU of open segment readers, shared by every server of a node, and the
    node's cache of what deliveries read from them (``blocks``). Its readers read runs
    of entries through one ``ReadScratch`` of up to ``scratch_bytes_max`` (none: 0)."""

    def __init__(
        self,
        disk: Disk,
        open_max: int,
        blocks: ReadCache | None = None,
        scratch_bytes_max: int = 0,
    ) -> None:
        assert open_max >= 1 and scratch_bytes_max >= 0
        self._disk = disk
        self._scratch = ReadScratch(scratch_bytes_max) if scratch_bytes_max else None
        self._open_max = open_max
        self._readers: OrderedDict[str, SegmentReader] = OrderedDict()
        self.blocks = ReadCache(0, 1) if blocks is None else blocks
        """Blocks of entries read for deliveries (none kept unless given a budget)."""

    def get(self, info: SegmentInfo) -> SegmentReader:
        reader = self._readers.get(info.path)
        if reader is not None and reader.info == info:
            self._readers.move_to_end(info.path)
            return reader
        if reader is not None:  # the file changed (compaction cut it)
            self.evict(info.path)
        reader = SegmentReader(self._disk, info, self._scratch)
        self._readers[info.path] = reader
        while len(self._readers) > self._open_max:
            _, old = self._readers.popitem(last=False)
            old.close()
        return reader

    def evict(self, path: str) -> None:
        """The segment file ``path`` changed or is leaving: close its reader and forget
        what was read from it."""
        self.blocks.drop(path)
        reader = self._readers.pop(path, None)
        if reader is not None:
            reader.close()

    def open_count(self) -> int:
        return len(self._readers)

    def close(self) -> None:
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()


__all__ = [
    "COMPACTED",
    "HEADER_BYTES",
    "INDEX_DTYPE",
    "OVERWRITES",
    "SEGMENTS_DIR",
    "SLOT_BYTES",
    "ReadScratch",
    "ReaderCache",
    "SegmentInfo",
    "SegmentReader",
    "encode_header",
    "encode_segment",
    "encode_segment_parts",
    "encode_segment_rows",
    "read_segment_info",
    "segment_dir",
    "segment_info_of",
    "segment_path",
    "segment_seq",
    "slot_offset",
    "write_segment",
]
