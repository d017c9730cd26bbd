"""Segment flush and checkpoint write, each prepared → written off the loop → finished.

Rule: ``NodeStorage`` prepares them on its owner thread and finishes them there; ``write``
touches the disk only, so it may run in a worker thread. A segment flush takes the
entries of the oldest rolled WAL file from every mem table (``plan_segment_flush``);
once written, the segments join the views and the entries leave the mem tables
(``show_segment_flush``), and only then may the WAL file go. A flush planned against an
older generation of a log (the server was removed or reset meanwhile) wrote stale
segments: they are deleted instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter

from engine.errors import StorageFailed
from engine.limits import Limits
from engine.raft.entry import Entry
from engine.storage.checkpoint import Checkpoint, CheckpointStore
from engine.storage.disk import (
    Disk,
    ensure_dir,
    parent,
    write_file_atomic,
    write_files_atomic,
)
from engine.storage.mem_table import MemRow
from engine.storage.reaper import Reaper
from engine.storage.segment import (
    OVERWRITES,
    SegmentInfo,
    encode_segment_rows,
    read_segment_info,
    segment_info_of,
    segment_path,
)
from engine.storage.server_log import ServerLog
from engine.storage.server_logs import ServerLogs
from engine.storage.wal import WAL_DIR, wal_path

_DATA = attrgetter("data")
_ROW_DATA = itemgetter(3)
_Plan = tuple[str, int, int, Sequence[int], list[MemRow], int, bool]


@dataclass(slots=True)
class SegmentFlush:
    """The entries of one rolled WAL file, to be written into segments. ``write`` does
    the I/O and may run in a worker thread; it touches nothing shared."""

    disk: Disk
    limits: Limits
    wal_seq: int
    plans: list[_Plan]
    """(uid, log generation, first segment seq, the entries' indexes (a ``range`` while
    none is left out), their mem-table rows, first index flushed, uncached): dead
    entries are left out, the first segment still answers from the first index. An
    uncached log's segments leave the page cache once written, but for their headers and
    indexes (``plan_segment_flush``)."""
    covered: list[str] = field(default_factory=list)
    """The logs whose rows of the file this flush takes: those of ``plans`` and those
    whose rows were all dead (``show_segment_flush`` drops their rows, and no other's)."""
    last: bool = True
    """Whether it takes the file's last rows (then the file may go once it is shown):
    a file of more logs than ``Limits.segment_flush_logs_max`` takes several flushes."""
    written: list[tuple[str, int, list[SegmentInfo]]] = field(default_factory=list)

    def write(self) -> None:
        """Write the segments. A flush of many logs (``segment_flush_batch_plans_min``)
        writes them all and syncs them together; a smaller one writes each segment
        atomically on its own, the queues' on several threads where the disk allows it
        (``Limits.segment_flush_writers_max``). On a disk error, remove what this flush
        wrote and raise ``StorageFailed``: the entries stay in the mem tables and the
        WAL file stays, so a later flush can try again."""
        paths: list[str] = []
        """Every path written to (appended to by the writer threads: atomic)."""
        threads = min(self.limits.segment_flush_writers_max, len(self.plans))
        try:
            if len(self.plans) >= self.limits.segment_flush_batch_plans_min:
                written = self._write_batched(paths)
            elif threads <= 1 or not self.disk.concurrent:
                written = [self._write_plan(plan, paths) for plan in self.plans]
            else:
                # Leaving the block waits for every thread, failed or not: the cleanup
                # below then sees every path written.
                with ThreadPoolExecutor(threads, thread_name_prefix="quorra-flush") as pool:
                    written = list(pool.map(lambda plan: self._write_plan(plan, paths), self.plans))
            self.written.extend(written)
        except OSError as exc:
            self.written.clear()
            for path in paths:
                with contextlib.suppress(OSError):
                    self.disk.remove(path)
            raise StorageFailed(f"segment flush of WAL file {self.wal_seq} failed: {exc}") from exc

    def _write_batched(self, paths: list[str]) -> list[tuple[str, int, list[SegmentInfo]]]:
        """Every segment of every plan written at once by ``write_files_atomic``, one
        thread: two syncs in all, where one queue's segment costs two fsyncs. They stay
        in the page cache, uncached or not: a WAL file shared by that many logs gives
        each a quarter MiB on average, whose new pages cost little next to the syncs."""
        files: list[tuple[str, bytes]] = []
        written: list[tuple[str, int, list[SegmentInfo]]] = []
        for uid, generation, seq, indexes, rows, first, _ in self.plans:
            infos: list[SegmentInfo] = []
            lo: int | None = first
            for start, stop in _row_chunks(rows, self.limits):
                path = segment_path(uid, seq)
                parts = encode_segment_rows(
                    seq, indexes[start:stop], rows[start:stop], OVERWRITES, lo
                )
                data = b"".join(parts)
                files.append((path, data))
                infos.append(segment_info_of(path, data))
                lo = None
                seq += 1
            written.append((uid, generation, infos))
        write_files_atomic(self.disk, files, paths)
        return written

    def _write_plan(self, plan: _Plan, paths: list[str]) -> tuple[str, int, list[SegmentInfo]]:
        """The segments of one log, in order."""
        uid, generation, seq, indexes, rows, first, uncached = plan
        infos: list[SegmentInfo] = []
        lo: int | None = first
        for start, stop in _row_chunks(rows, self.limits):
            path = segment_path(uid, seq)
            paths.append(path)
            ensure_dir(self.disk, parent(path))
            head, *payloads = encode_segment_rows(
                seq, indexes[start:stop], rows[start:stop], OVERWRITES, lo
            )
            write_file_atomic(self.disk, path, head, payloads, cached=not uncached)
            lo = None
            info = read_segment_info(self.disk, path)
            assert info is not None, f"segment {path} unreadable right after writing"
            infos.append(info)
            seq += 1
        return uid, generation, infos

    def remove_wal_file(self) -> None:
        """Delete the flushed WAL file and sync its directory: once the flush is shown
        and it took the file's last rows (``NodeStorage.show_flushed``), so its segments
        are durable and in the views. Touches the disk only, so it may run in a worker
        thread: the directory sync held the event loop for up to several milliseconds
        per flush on a disk. A file already gone (a delete interrupted before it was
        recorded) is not an error. On a disk error, ``StorageFailed``: the file stays
        rolled, and the next flush of it (nothing left to write) tries again."""
        path = wal_path(self.wal_seq)
        try:
            if self.disk.exists(path):
                self.disk.remove(path)
            self.disk.sync_dir(WAL_DIR)
        except OSError as exc:
            raise StorageFailed(f"delete of flushed WAL file {self.wal_seq} failed: {exc}") from exc


@dataclass(eq=False, slots=True)
class CheckpointWrite:
    """A checkpoint file of ``uid`` to write: ``write`` does the I/O and may run in a
    worker thread; it touches the disk only. ``bytes``: the size of the file written."""

    uid: str
    store: CheckpointStore
    bytes: int = 0

    def write(self, cp: Checkpoint) -> None:
        try:
            self.bytes = self.store.write(cp)
        except OSError as exc:
            raise StorageFailed(f"checkpoint of {self.uid} at {cp.index} failed: {exc}") from exc


def segment_chunks(entries: list[Entry], limits: Limits) -> list[list[Entry]]:
    """``entries`` cut into segments of at most ``segment_entries_max`` entries and
    ``segment_file_bytes_max`` bytes of data (an entry alone may be larger)."""
    sizes = list(map(len, map(_DATA, entries)))
    return [entries[start:stop] for start, stop in chunk_bounds(sizes, limits)]


def chunk_bounds(sizes: list[int], limits: Limits) -> list[tuple[int, int]]:
    """``segment_chunks`` of entries of data ``sizes``, as (start, stop) positions."""
    count = len(sizes)
    if (
        count
        and count <= limits.segment_entries_max
        and sum(sizes) <= limits.segment_file_bytes_max
    ):
        return [(0, count)]  # the common case, without a step per entry on the node's thread
    out: list[tuple[int, int]] = []
    start = size = 0
    for k, length in enumerate(sizes):
        if k > start and (
            k - start >= limits.segment_entries_max or size + length > limits.segment_file_bytes_max
        ):
            out.append((start, k))
            start, size = k, 0
        size += length
    if start < count:
        out.append((start, count))
    return out


def _row_chunks(rows: list[MemRow], limits: Limits) -> list[tuple[int, int]]:
    """``chunk_bounds`` of mem-table rows."""
    return chunk_bounds(list(map(len, map(_ROW_DATA, rows))), limits)


def plan_segment_flush(
    disk: Disk,
    limits: Limits,
    logs: ServerLogs,
    wal_seq: int,
    uncached: Callable[[str], bool] | None = None,
) -> SegmentFlush:
    """The flush of WAL file ``wal_seq``: its entries of every log, with segment seqs
    taken from each log now. The data of the logs ``uncached`` picks (a node's follower
    copies, which nothing reads while it follows) leave the page cache once written:
    on a virtual machine that gives memory freed a while ago back to its host, each new
    page of cache costs a fault in the host, and the segments of all three copies of a
    queue kept there took a fifth of a three-node cluster's CPU; dropped, their pages
    are reused by the next writes before they go back to the host.

    It takes at most ``Limits.segment_flush_logs_max`` logs: those awake first, then as
    many packed ones as fit, unpacked for it (``ServerLogs.rows_to_flush``); the file's
    other logs wait for the next flush of it (``SegmentFlush.last``), so that what a
    flush holds at once (unpacked logs, entries, encoded segments) is a group's."""
    room = limits.segment_flush_logs_max
    flush = SegmentFlush(disk, limits, wal_seq, [])
    # Packed logs have no entries here; sorted, for the simulator's sake.
    awake = sorted(logs.items(), key=itemgetter(0))
    for uid, log in awake:
        if log.mem.flushable_count(wal_seq):
            if len(flush.covered) == room:
                flush.last = False
                break
            _plan(flush, logs, uid, log, uncached)
    if flush.last:
        unpacked = logs.rows_to_flush(wal_seq, room - len(flush.covered))
        for uid in unpacked:
            found = logs.find_for_flush(uid)
            assert found is not None
            if found.mem.flushable_count(wal_seq):
                _plan(flush, logs, uid, found, uncached)
        flush.last = not logs.packed_rows_due(wal_seq)
    return flush


def _plan(
    flush: SegmentFlush,
    logs: ServerLogs,
    uid: str,
    log: ServerLog,
    uncached: Callable[[str], bool] | None,
) -> None:
    """The rows of WAL file ``flush.wal_seq`` of ``log`` (it has some) into ``flush``,
    as the mem table holds them: no ``Entry`` is made for them on the node's thread."""
    rows = log.mem.flushable_rows(flush.wal_seq)
    flush.covered.append(uid)
    first = log.mem.lo
    indexes: Sequence[int] = range(first, first + len(rows))
    if first <= log.snapshot_index():
        # Entries that died before reaching a segment are never written.
        kept = [k for k in range(len(rows)) if not log.is_dead(first + k)]
        indexes, rows = [first + k for k in kept], [rows[k] for k in kept]
    if rows:
        cold = uncached is not None and uncached(uid)
        seq = log.next_segment_seq
        flush.plans.append((uid, logs.generation(uid), seq, indexes, rows, first, cold))
        log.next_segment_seq += len(_row_chunks(rows, flush.limits))


def show_segment_flush(flush: SegmentFlush, logs: ServerLogs, reaper: Reaper) -> None:
    """Put the written segments in the views and drop the flushed entries from the mem
    tables; segments of a log removed or reset meanwhile are stale and deleted."""
    for uid, generation, infos in flush.written:
        log = logs.find_for_flush(uid)
        if log is None or generation != logs.generation(uid):
            for info in infos:
                reaper.remove(info.path)
            continue
        for info in infos:
            for hidden in log.add_segment(info):
                reaper.retire(hidden)
    for uid in flush.covered:
        covered = logs.find_for_flush(uid)
        if covered is not None:
            covered.drop_flushed(flush.wal_seq)


__all__ = [
    "CheckpointWrite",
    "SegmentFlush",
    "chunk_bounds",
    "plan_segment_flush",
    "segment_chunks",
    "show_segment_flush",
]
