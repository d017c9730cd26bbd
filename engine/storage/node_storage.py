"""The storage of one node: the shared WAL, every server's log, segments and checkpoints.

Rule: ``NodeStorage`` is used from one thread, its owner (the runtime's event loop, or
the simulator; ``take_over`` hands it to another thread while the owner waits, as the
runtime does to open and close it in a worker). Its entry points assert that, and its
collaborators (``Recovery``, ``Repairs``, ``Reaper``, ``CompactionDriver``) are reached
only through them. The only work that may run elsewhere is ``Wal.write_batch`` (the WAL
writer thread), ``SegmentFlush.write``, ``CompactionJob.run`` and
``CheckpointWrite.write`` (workers), which touch the disk and nothing of this object;
each is prepared and finished on the owner's thread (``finish_segment_flush``,
``finish_compaction``, ``finish_checkpoint``).

Recovery (``NodeStorage.open`` and ``open_server``, in ``recovery.py``) reads the WAL,
segment headers, a server's newest valid checkpoint and the log after it, never the
whole log. Damage found then, or by a read while serving (``mark_damaged``), is repaired
from the server's peers, never served (``repair.py`` plans it and has the marker that
makes it survive a crash; the Raft core's repair mode keeps it safe).
``Recovered.repairing`` tells the caller to start the core in repair mode; a group of
one member cannot be repaired and its caller refuses it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from pyroaring import BitMap64

from engine.errors import EntryDamaged, StorageFailed
from engine.limits import DEFAULT_LIMITS, Limits
from engine.raft.entry import Entry
from engine.storage.checkpoint import Checkpoint, CheckpointStore
from engine.storage.compaction import (
    CompactionJob,
    CompactionResult,
    Phase,
    SegmentStat,
    log_stats,
)
from engine.storage.compaction_driver import CompactionDriver
from engine.storage.disk import Disk
from engine.storage.flush import (
    CheckpointWrite,
    SegmentFlush,
    plan_segment_flush,
    show_segment_flush,
)
from engine.storage.read_cache import ReadCache
from engine.storage.reaper import PinnedReader, Reaper, SegmentPins
from engine.storage.recovery import Recovery
from engine.storage.repair import RepairKind, Repairs
from engine.storage.segment import ReaderCache, read_segment_info, segment_path, write_segment
from engine.storage.server_log import ServerLog
from engine.storage.server_logs import ServerLogs
from engine.storage.storage_events import (
    HardStateSaved,
    Persisted,
    Recovered,
    Removed,
    SnapshotReset,
    StorageEvent,
    WriteFailed,
)
from engine.storage.wal import (
    AppendOp,
    ForgetOp,
    HardState,
    HardStateOp,
    ResetOp,
    Wal,
    WalBatch,
    WalOp,
    wal_path,
)

_NOT_OWNER = "NodeStorage is used from its owner thread only (see the module's rule)"


class NodeStorage:
    """Storage of every Raft server on one node. Build it with ``NodeStorage.open``."""

    def __init__(self, disk: Disk, limits: Limits) -> None:
        self.disk = disk
        self.limits = limits
        blocks = ReadCache(limits.read_cache_bytes_max, limits.read_cache_block_bytes)
        self.cache = ReaderCache(
            disk, limits.segment_readers_open_max, blocks, limits.read_run_bytes_max
        )
        self._logs = ServerLogs(disk, self.cache)
        self._reaper = Reaper(disk, self.cache)
        self._repairs = Repairs(disk, self._reaper.remove)
        self._recovery = Recovery(disk, limits, self._logs, self._reaper, self._repairs)
        self._compaction = CompactionDriver(disk, limits, self._logs, self._reaper, self._repairs)
        self._rolled: list[int] = []
        """WAL files closed and waiting for their entries to reach segments."""
        self._checkpoint_writes: set[CheckpointWrite] = set()
        """Prepared and not finished: their workers may be writing."""
        self._owner = threading.current_thread()
        self.wal: Wal

    @property
    def pins(self) -> SegmentPins:
        """The segments readers and compactions have pinned."""
        return self._reaper.pins

    def take_over(self) -> None:
        """The calling thread owns this storage from now on; the previous owner waits
        (the runtime opens and closes it in a worker)."""
        self._owner = threading.current_thread()

    def _owned(self) -> bool:
        return threading.current_thread() is self._owner

    # -- opening and repair -------------------------------------------------------------

    @classmethod
    def open(cls, disk: Disk, limits: Limits = DEFAULT_LIMITS) -> NodeStorage:
        """Recover the node's storage. A WAL file corrupt in a place a crash cannot
        explain (durable data was lost) puts every server into repair (see
        ``recovery.py``); ``open_server`` says which are repairing."""
        node = cls(disk, limits)
        seqs = node._recovery.replay()
        hard_states = {
            uid: log.hard_state for uid, log in node._logs.items() if log.hard_state is not None
        }
        node._rolled = [s for s in seqs if disk.exists(wal_path(s))]
        node.wal = Wal(disk, limits, (seqs[-1] + 1) if seqs else 1, hard_states)
        return node

    def _oldest_wal_seq(self) -> int:
        return self._rolled[0] if self._rolled else self.wal.seq

    def repairing(self, uid: str) -> bool:
        """Whether server ``uid`` is in repair (its marker is on disk)."""
        assert self._owned(), _NOT_OWNER
        return uid in self._repairs

    def finish_repair(self, uid: str) -> bool:
        """The core of ``uid`` left repair mode and the hard state recording its vote is
        durable (``Ready.repaired``, then ``HardStateSaved``): the marker is removed once
        no WAL file from before the repair remains (else by the segment flush that
        deletes the last one). Says whether it is gone."""
        assert self._owned(), _NOT_OWNER
        return self._repairs.finish(uid, self._oldest_wal_seq())

    def mark_damaged(self, uid: str, error: EntryDamaged) -> None:
        """A read while serving found entries of ``uid`` damaged from ``error.index`` on:
        only the marker is written (nothing is cut or deleted now); the next open of the
        storage applies it and the server starts in repair mode. What the server writes
        meanwhile goes to the WAL file being written, before the one the repair begins
        with: the next open cuts it too (the server is repairing: safe, if wasteful)."""
        assert self._owned(), _NOT_OWNER
        cp, _ = self.checkpoints(uid).load_newest()
        wal_seq = self.wal.seq + 1
        self._recovery.begin_repair(
            uid, cp, error.index, RepairKind.CUT, error.detail, wal_seq, apply=False
        )

    def servers(self) -> list[str]:
        """Uids of every server with data on this node, sorted."""
        assert self._owned(), _NOT_OWNER
        return self._logs.uids()

    def mem_table_bytes(self) -> int:
        """What the mem tables of every server hold: the entries of the WAL files not yet
        flushed to segments (at most about ``wal_file_bytes_max`` per file)."""
        assert self._owned(), _NOT_OWNER
        return self._logs.mem_bytes()

    def open_server(
        self, uid: str, *, repairable: bool = True, asleep_at: int | None = None
    ) -> Recovered:
        """Open (or create) the storage of server ``uid`` and say what to restore. Damaged
        data is cut or reset and the server marked repairing (see ``recovery.py``).
        Without ``repairable`` (the group has no other member) damage raises
        ``RecoveryRefused`` before any file is changed, for an operator to look at.
        ``asleep_at``: the applied index of the record it slept as at the last clean
        stop, if any (its log's tail is then not read: ``Recovery._repair_tail``)."""
        assert self._owned(), _NOT_OWNER
        return self._recovery.open_server(
            uid, self.wal.seq, repairable=repairable, asleep_at=asleep_at
        )

    # -- writing ------------------------------------------------------------------------------

    def append(self, uid: str, entries: list[Entry]) -> None:
        """Queue ``entries`` for the next group commit; from ``entries[0].index`` they
        replace what is stored. ``Persisted`` follows once durable."""
        assert self._owned(), _NOT_OWNER
        self._submit(AppendOp(uid, tuple(entries)))

    def save_hard_state(self, uid: str, hard_state: HardState) -> None:
        """Queue the hard state for the next group commit; ``HardStateSaved`` follows."""
        assert self._owned(), _NOT_OWNER
        self._submit(HardStateOp(uid, hard_state))

    def _submit(self, op: WalOp) -> None:
        log = self._logs.get(op.uid)
        if log.failed is not None:
            raise log.failed
        self.wal.submit(op)

    def write_batch(self) -> WalBatch:
        """One group commit, on the caller's thread (the simulator; tests)."""
        assert self._owned(), _NOT_OWNER
        return self.wal.write_batch()

    def complete(self, batch: WalBatch) -> list[StorageEvent]:
        """Apply a finished WAL batch to the mem tables and say what became durable."""
        assert self._owned(), _NOT_OWNER
        if batch.error is not None:
            failed: list[StorageEvent] = []
            for uid in dict.fromkeys(op.uid for op in batch.ops):
                self._logs.get(uid).failed = batch.error
                failed.append(WriteFailed(uid, batch.error))
            return failed
        events: list[StorageEvent] = []
        for op in batch.ops:
            self._logs.apply(op, batch.wal_seq)
            if isinstance(op, AppendOp):
                last = op.entries[-1]
                events.append(Persisted(op.uid, last.index, last.term))
            elif isinstance(op, HardStateOp):
                events.append(HardStateSaved(op.uid, op.hard_state))
            elif isinstance(op, ResetOp):
                events.append(SnapshotReset(op.uid, op.index, op.term))
            else:
                self._reaper.delete_server(op.uid)
                self._repairs.forget(op.uid)
                events.append(Removed(op.uid))
        if batch.rolled is not None:
            self._rolled.append(batch.rolled)
            for uid in batch.carried:
                self._logs.carry(uid, batch.rolled)
        return events

    def sync(self) -> list[StorageEvent]:
        """Everything pending made durable, and rolled WAL files flushed to segments:
        what the simulator calls where the runtime's threads would run."""
        assert self._owned(), _NOT_OWNER
        events: list[StorageEvent] = []
        while self.wal.pending():
            events.extend(self.complete(self.wal.write_batch()))
        self.flush_segments()
        return events

    # -- segments -----------------------------------------------------------------------------

    def rolled_wal_files(self) -> list[int]:
        """WAL files closed and waiting for their entries to reach segments."""
        assert self._owned(), _NOT_OWNER
        return list(self._rolled)

    def prepare_segment_flush(
        self, uncached: Callable[[str], bool] | None = None
    ) -> SegmentFlush | None:
        """The flush of the oldest rolled WAL file, or ``None`` if none is waiting; the
        data of the logs whose uid ``uncached`` answers true for leave the page cache
        once written."""
        assert self._owned(), _NOT_OWNER
        if not self._rolled:
            return None
        return plan_segment_flush(self.disk, self.limits, self._logs, self._rolled[0], uncached)

    def finish_segment_flush(self, flush: SegmentFlush) -> None:
        """Put the written segments in the views, drop the flushed entries from the mem
        tables, then delete the WAL file if no other log holds rows of it (else the next
        flush takes the next group of its logs): ``show_flushed``, then
        ``flush.remove_wal_file()`` and ``wal_file_removed``, all on this thread."""
        if self.show_flushed(flush):
            flush.remove_wal_file()
            self.wal_file_removed(flush)

    def show_flushed(self, flush: SegmentFlush) -> bool:
        """Put the written segments in the views and drop the flushed entries from the
        mem tables. Returns whether the WAL file may go now (no other log holds rows of
        it): then ``flush.remove_wal_file()`` (disk only: in a worker thread if need
        be), then ``wal_file_removed(flush)`` back on this thread. Until then the file
        stays rolled (``rolled_wal_files``), and a repair waiting for it stays."""
        assert self._owned(), _NOT_OWNER
        assert self._rolled and self._rolled[0] == flush.wal_seq
        show_segment_flush(flush, self._logs, self._reaper)
        self._logs.repack()
        return flush.last  # else the file's other logs: the next flush

    def wal_file_removed(self, flush: SegmentFlush) -> None:
        """``flush.remove_wal_file()`` deleted the WAL file ``show_flushed`` let go."""
        assert self._owned(), _NOT_OWNER
        assert self._rolled and self._rolled[0] == flush.wal_seq and flush.last
        self._rolled.pop(0)
        self._repairs.drop_done(self._oldest_wal_seq())

    def flush_segments(self) -> StorageFailed | None:
        """Flush every rolled WAL file, on this thread. A disk error stops it and is
        returned; nothing is lost (the entries stay in mem tables and the WAL) and the
        next call tries again."""
        assert self._owned(), _NOT_OWNER
        while (flush := self.prepare_segment_flush()) is not None:
            try:
                flush.write()
            except StorageFailed as error:
                return error
            self.finish_segment_flush(flush)
        return None

    def pin_reader(self, uid: str, lo: int = 1, hi: int | None = None) -> PinnedReader:
        """Pin the segments of ``uid`` that answer for indexes ``lo .. hi``: they stay
        on disk, unchanged, until ``release`` (see ``engine.storage.compaction``)."""
        assert self._owned(), _NOT_OWNER
        log = self._logs.get(uid)
        top = log.last_index() if hi is None else hi
        segments = [(i, h) for i, h in log.segment_infos() if i.lo <= top and h >= lo]
        for info, _ in segments:
            self.pins.pin(info.path)
        return PinnedReader(self.disk, segments, self._reaper.unpin)

    # -- compaction ------------------------------------------------------------------------

    def segment_stats(self, uid: str) -> list[SegmentStat]:
        """Every segment of ``uid`` counted against its snapshot's live set."""
        assert self._owned(), _NOT_OWNER
        return log_stats(self._logs.get(uid), self.cache)

    def prepare_compaction(self, uid: str, phase: Phase = "auto") -> CompactionJob:
        """On the node's thread: promote the newest checkpoint to the snapshot (phases
        ``auto`` and 1), plan the phases and pin what phases 2 and 3 will work on. Then
        ``job.run()`` (a worker may run it) and ``finish_compaction(job)`` here."""
        assert self._owned(), _NOT_OWNER
        return self._compaction.prepare(uid, phase)

    def finish_compaction(self, job: CompactionJob) -> CompactionResult:
        """Apply what the job did to the view and delete what it freed. Raises
        ``StorageFailed`` after that if the job met a disk error."""
        assert self._owned(), _NOT_OWNER
        return self._compaction.finish(job)

    def compact(self, uid: str, phase: Phase = "auto") -> CompactionResult:
        """Prepare, run and finish a compaction on this thread (simulator, tests, tools)."""
        assert self._owned(), _NOT_OWNER
        job = self.prepare_compaction(uid, phase)
        job.run()
        return self.finish_compaction(job)

    # -- checkpoints and snapshots -------------------------------------------------------------

    def checkpoints(self, uid: str) -> CheckpointStore:
        assert self._owned(), _NOT_OWNER
        return CheckpointStore(self.disk, uid, self.limits.checkpoints_kept_max)

    def write_checkpoint(self, uid: str, cp: Checkpoint) -> int:
        """Durably write a checkpoint (``CheckpointRequest``) on this thread; the log is
        not truncated. Returns the size of the file."""
        job = self.prepare_checkpoint(uid)
        try:
            job.write(cp)
        finally:
            self.finish_checkpoint(job)
        return job.bytes

    def prepare_checkpoint(self, uid: str) -> CheckpointWrite:
        """A checkpoint write of ``uid``, to ``write`` in a worker, then finish here."""
        assert self._owned(), _NOT_OWNER
        job = CheckpointWrite(uid, self.checkpoints(uid))
        self._checkpoint_writes.add(job)
        return job

    def finish_checkpoint(self, job: CheckpointWrite) -> None:
        """The worker of ``job`` is done (written or failed)."""
        assert self._owned(), _NOT_OWNER
        self._checkpoint_writes.discard(job)

    def release_cursor(self, uid: str, index: int) -> int | None:
        """``ReleaseCursor``: promote the newest checkpoint at or below ``index`` to the
        snapshot and delete segments holding only dead entries before it. Returns the
        snapshot index, or ``None`` if no checkpoint qualifies."""
        assert self._owned(), _NOT_OWNER
        return self._compaction.promote(uid, index)

    def held_live(self, uid: str, live: BitMap64) -> BitMap64:
        """The indexes of ``live`` (a leader's snapshot) this server already stores as
        committed entries, so a catch-up needs only the others: an entry at or below
        the durable commit index is the leader's entry (Raft's log matching)."""
        assert self._owned(), _NOT_OWNER
        log = self._logs.get(uid)
        commit = log.hard_state.commit if log.hard_state is not None else 0
        held = BitMap64()
        for index in live[: live.rank(min(commit, log.last_index()))]:
            try:
                log.read(index)
            except LookupError:
                continue
            held.add(index)
        return held

    def install_snapshot(self, uid: str, cp: Checkpoint, live_entries: Sequence[Entry] = ()) -> int:
        """A snapshot from the leader replaces the whole log of ``uid``: the snapshot file
        is written durably, every segment deleted, the snapshot's live entries written
        to a new segment, then a reset record goes through the WAL (``SnapshotReset``
        follows; until then the log view is unchanged). ``live_entries`` may hold only
        the live entries this server lacks (see ``held_live``): the others are read from
        its own log before it is replaced. Returns the bytes of the snapshot file."""
        assert self._owned(), _NOT_OWNER
        log = self._logs.get(uid)
        if log.failed is not None:
            raise log.failed
        given = BitMap64(e.index for e in live_entries)
        assert len(given) == len(live_entries) and given.issubset(cp.live_indexes)
        held = [log.read(i) for i in cp.live_indexes - given]
        live_entries = sorted([*live_entries, *held], key=lambda e: e.index)
        try:
            size = self.checkpoints(uid).install_snapshot(cp)
            stale = log.drop_segments()
            pending, _ = self._logs.installed.pop(uid, (None, None))
            for info in [*stale, *([pending] if pending else [])]:
                self._reaper.retire(info.path)
            written = None
            if live_entries:
                seq = log.next_segment_seq
                log.next_segment_seq += 1
                write_segment(self.disk, uid, seq, live_entries, 0)
                written = read_segment_info(self.disk, segment_path(uid, seq))
                assert written is not None
            self._logs.installed[uid] = (written, cp.live_indexes)
        except OSError as exc:
            raise StorageFailed(f"snapshot install of {uid} failed: {exc}") from exc
        self.wal.submit(ResetOp(uid, cp.index, cp.term))
        return size

    def remove_server(self, uid: str) -> None:
        """Delete server ``uid``: a forget record goes through the WAL, then its files
        are deleted (``Removed`` follows). A crash in between finishes it at recovery."""
        assert self._owned(), _NOT_OWNER
        self.wal.submit(ForgetOp(uid))

    def log(self, uid: str) -> ServerLog:
        assert self._owned(), _NOT_OWNER
        return self._logs.existing(uid)

    def pack_log(self, uid: str) -> bool:
        """Keep the log of ``uid`` packed while its queue sleeps, unless a write of it
        failed (or once its mem table's rows are flushed, if they are many): ``log``
        unpacks it again, ``log_view`` reads it as it is. Nothing is written: the disk
        is the same either way. Says whether it is packed now."""
        assert self._owned(), _NOT_OWNER
        return self._logs.pack(uid)

    def log_packed(self, uid: str) -> bool:
        assert self._owned(), _NOT_OWNER
        return self._logs.is_packed(uid)

    def log_view(self, uid: str) -> ServerLog:
        """The log of ``uid`` to read, not change (a packed one stays packed)."""
        assert self._owned(), _NOT_OWNER
        return self._logs.view(uid)

    def log_reads(self, uid: str) -> tuple[int, int]:
        """(entries read, of those served from memory) of the log of ``uid``."""
        assert self._owned(), _NOT_OWNER
        return self._logs.reads(uid)

    def close(self, *, flush: bool = True) -> None:
        """Stop cleanly: whatever is pending is made durable; with ``flush`` the WAL is
        rolled and every mem table written to segments, so the next start replays no
        WAL. A crash instead of ``close`` loses nothing that was reported durable."""
        assert self._owned(), _NOT_OWNER
        assert not self._checkpoint_writes, "close waits for the checkpoint writes"
        self.sync()
        if flush:
            self._rolled.append(self.wal.roll())
            self.flush_segments()
        self.wal.close()
        self.cache.close()


__all__ = [
    "CheckpointWrite",
    "HardStateSaved",
    "NodeStorage",
    "Persisted",
    "Recovered",
    "Removed",
    "SegmentFlush",
    "SnapshotReset",
    "StorageEvent",
    "WriteFailed",
]
