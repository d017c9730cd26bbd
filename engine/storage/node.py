"""The storage of one node: the shared WAL, every server's log, segments and checkpoints.

Rule: ``NodeStorage`` is used from one thread (the runtime's event loop, or the
simulator). The only work that may run elsewhere is ``Wal.write_batch`` (the WAL writer
thread) and ``SegmentFlush.write`` (a worker); their results come back through
``complete`` and ``finish_segment_flush`` on the node's thread.

Recovery (``NodeStorage.open``) reads the WAL files and replays them into mem tables
(a torn tail of the last file is cut off), reads the header of every segment, and opens
a fresh WAL file. ``open_server`` then loads a server's newest valid checkpoint. Nothing
here reads the whole log: the work grows with the WAL (bounded by
``wal_file_bytes_max``), the number of segment files and the checkpoint size, not with
the number of messages on a queue.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter

from pyroaring import BitMap64

from engine.errors import RecoveryRefused, StorageFailed
from engine.limits import DEFAULT_LIMITS, Limits
from engine.raft.log import Entry
from engine.storage.checkpoint import Checkpoint, CheckpointStore
from engine.storage.compaction import (
    CompactionJob,
    CompactionResult,
    Phase,
    PinnedReader,
    SegmentPins,
    SegmentStat,
    intent_path,
    log_stats,
    new_job,
    plan_phases,
    recover_intents,
    segment_stat,
)
from engine.storage.disk import Disk, parent, write_file_atomic
from engine.storage.log import ServerLog
from engine.storage.segment import (
    OVERWRITES,
    ReaderCache,
    SegmentInfo,
    encode_segment,
    read_segment_info,
    segment_dir,
    segment_path,
    write_segment,
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
    read_wal_file,
    wal_path,
    wal_seqs,
)

QUEUES_DIR = "queues"
_DATA = attrgetter("data")


@dataclass(frozen=True, slots=True)
class Persisted:
    """Entries of ``uid`` up to ``index`` (of ``term``) are durable: the runtime hands the
    Raft core ``engine.raft.events.Persisted(index, term)``."""

    uid: str
    index: int
    term: int


@dataclass(frozen=True, slots=True)
class HardStateSaved:
    """The hard state of ``uid`` is durable: messages that depend on it may be sent."""

    uid: str
    hard_state: HardState


@dataclass(frozen=True, slots=True)
class SnapshotReset:
    """The log of ``uid`` restarts after the installed snapshot at ``index``."""

    uid: str
    index: int
    term: int


@dataclass(frozen=True, slots=True)
class Removed:
    """Server ``uid`` and all its files are gone."""

    uid: str


@dataclass(frozen=True, slots=True)
class WriteFailed:
    """The disk refused a write for ``uid``; nothing of it is durable, the server
    refuses further writes with ``error`` until it is opened again."""

    uid: str
    error: StorageFailed


StorageEvent = Persisted | HardStateSaved | SnapshotReset | Removed | WriteFailed


@dataclass(frozen=True, slots=True)
class Recovered:
    """What ``open_server`` found for one server."""

    log: ServerLog
    checkpoint: Checkpoint | None
    """Restore the machine from it, then apply the committed entries after its index."""
    hard_state: HardState | None
    damaged: list[str]
    """Checkpoint files that failed their check and were passed over."""


@dataclass(slots=True)
class SegmentFlush:
    """The entries of one rolled WAL file, to be written into segments. ``write`` does
    the I/O and may run in a worker thread; it touches nothing shared."""

    disk: Disk
    limits: Limits
    wal_seq: int
    plans: list[tuple[str, int, int, list[Entry], int]]
    """(uid, log generation, first segment seq, entries, first index flushed): dead
    entries are left out, the first segment still answers from the first index."""
    written: list[tuple[str, int, list[SegmentInfo]]] = field(default_factory=list)

    def write(self) -> None:
        """Write the segments. On a disk error, remove what this flush wrote and raise
        ``StorageFailed``: the entries stay in the mem tables and the WAL file stays,
        so a later flush can try again."""
        paths: list[str] = []
        try:
            for uid, generation, seq, entries, first in self.plans:
                infos: list[SegmentInfo] = []
                lo: int | None = first
                for chunk in _chunks(entries, self.limits):
                    path = segment_path(uid, seq)
                    paths.append(path)
                    self.disk.makedirs(parent(path))
                    data = encode_segment(seq, chunk, OVERWRITES, lo)
                    write_file_atomic(self.disk, path, data)
                    lo = None
                    info = read_segment_info(self.disk, path)
                    assert info is not None, f"segment {path} unreadable right after writing"
                    infos.append(info)
                    seq += 1
                self.written.append((uid, generation, infos))
        except OSError as exc:
            self.written.clear()
            for path in paths:
                with contextlib.suppress(OSError):
                    self.disk.remove(path)
            raise StorageFailed(f"segment flush of WAL file {self.wal_seq} failed: {exc}") from exc


def _chunks(entries: list[Entry], limits: Limits) -> list[list[Entry]]:
    """``entries`` cut into segments of at most ``segment_entries_max`` entries and
    ``segment_file_bytes_max`` bytes of data (an entry alone may be larger)."""
    if (
        entries
        and len(entries) <= limits.segment_entries_max
        and sum(map(len, map(_DATA, entries))) <= limits.segment_file_bytes_max
    ):
        return [entries]  # the common case, without a step per entry on the node's thread
    out: list[list[Entry]] = []
    current: list[Entry] = []
    size = 0
    for e in entries:
        if current and (
            len(current) >= limits.segment_entries_max
            or size + len(e.data) > limits.segment_file_bytes_max
        ):
            out.append(current)
            current, size = [], 0
        current.append(e)
        size += len(e.data)
    if current:
        out.append(current)
    return out


class NodeStorage:
    """Storage of every Raft server on one node. Build it with ``NodeStorage.open``."""

    def __init__(self, disk: Disk, limits: Limits) -> None:
        self.disk = disk
        self.limits = limits
        self.cache = ReaderCache(disk, limits.segment_readers_open_max)
        self._logs: dict[str, ServerLog] = {}
        self._generations: dict[str, int] = {}
        self._rolled: list[int] = []
        self._damaged_segments: dict[str, list[str]] = {}
        self._forgotten: set[str] = set()
        """Servers whose removal is in the WAL (their files may remain after a crash)."""
        self._installed: dict[str, tuple[SegmentInfo | None, BitMap64]] = {}
        """Segment of live entries written by ``install_snapshot`` and the snapshot's live
        set, shown at the reset."""
        self.pins = SegmentPins()
        self._retired: set[str] = set()
        """Segment files out of every view, kept until their last pin is released."""
        self._intents: dict[str, set[str]] = {}
        """Phase-3 intent files and the inputs still on disk they wait for."""
        self._compacting: set[str] = set()
        self.wal: Wal

    # -- opening --------------------------------------------------------------------------

    @classmethod
    def open(cls, disk: Disk, limits: Limits = DEFAULT_LIMITS) -> NodeStorage:
        """Recover the node's storage. Raises ``RecoveryRefused`` if a WAL file is corrupt
        in a place a crash cannot explain (durable entries were lost)."""
        node = cls(disk, limits)
        disk.makedirs(QUEUES_DIR)
        for uid in disk.listdir(QUEUES_DIR):
            node._load_segments(node._log(uid))
        seqs = sorted(wal_seqs(disk))
        for k, seq in enumerate(seqs):
            wal_file = read_wal_file(disk, seq)
            if wal_file.corrupt_at is not None:
                raise RecoveryRefused(
                    f"WAL file {wal_path(seq)} is corrupt at byte {wal_file.corrupt_at} with "
                    f"valid data at byte {wal_file.valid_at}: durable entries were lost; "
                    "restore this node from its peers"
                )
            if wal_file.good_bytes < wal_file.size:
                if k != len(seqs) - 1:
                    raise RecoveryRefused(
                        f"WAL file {wal_path(seq)} ends with {wal_file.size - wal_file.good_bytes}"
                        " bad bytes but is not the last one: durable entries were lost"
                    )
                node._cut_torn_tail(seq, wal_file.good_bytes)
            for op in wal_file.ops:
                node._apply(op, seq, recovering=True)
        for uid in sorted(node._forgotten):
            node._delete_files(uid)
        hard_states = {
            uid: log.hard_state for uid, log in node._logs.items() if log.hard_state is not None
        }
        node._rolled = [s for s in seqs if disk.exists(wal_path(s))]
        node.wal = Wal(disk, limits, (seqs[-1] + 1) if seqs else 1, hard_states)
        return node

    def _cut_torn_tail(self, seq: int, good_bytes: int) -> None:
        if good_bytes == 0:
            self.disk.remove(wal_path(seq))
            self.disk.sync_dir("wal")
            return
        f = self.disk.open(wal_path(seq))
        try:
            f.truncate(good_bytes)
            f.sync()
        finally:
            f.close()

    def _log(self, uid: str) -> ServerLog:
        log = self._logs.get(uid)
        if log is None:
            log = self._logs[uid] = ServerLog(uid, self.disk, self.cache)
            self._generations[uid] = self._generations.get(uid, 0) + 1
        return log

    def _load_segments(self, log: ServerLog) -> None:
        directory = segment_dir(log.uid)
        for name in self.disk.listdir(directory):
            if name.endswith(".tmp"):
                self.disk.remove(f"{directory}/{name}")
        recover_intents(self.disk, log.uid)
        for name in self.disk.listdir(directory):
            path = f"{directory}/{name}"
            if not name.endswith(".seg"):
                continue
            info = read_segment_info(self.disk, path)
            if info is None:
                self._damaged_segments.setdefault(log.uid, []).append(path)
                continue
            for hidden in log.add_segment(info):
                self._remove(hidden)
        log.last_from_segments()

    def servers(self) -> list[str]:
        """Uids of every server with data on this node, sorted."""
        return sorted(self._logs)

    def open_server(self, uid: str) -> Recovered:
        """Open (or create) the storage of server ``uid`` and say what to restore. Raises
        ``RecoveryRefused`` if its data cannot be served safely."""
        log = self._log(uid)
        self.disk.makedirs(segment_dir(uid))
        damaged_segments = self._damaged_segments.get(uid)
        if damaged_segments:
            raise RecoveryRefused(
                f"queue {uid}: segment {damaged_segments[0]} is damaged (header or index "
                "fails its check); restore this replica from its peers"
            )
        checkpoints = CheckpointStore(self.disk, uid, self.limits.checkpoints_kept_max)
        cp, damaged = checkpoints.load_newest()
        snapshot_index = checkpoints.snapshot_index()
        if snapshot_index and (cp is None or cp.index < snapshot_index):
            raise RecoveryRefused(
                f"queue {uid}: snapshot at index {snapshot_index} is damaged and no newer "
                "checkpoint is valid; the log before it is gone"
            )
        if cp is not None:
            self._recover_prefix(log, cp, snapshot_index)
        hs = log.hard_state
        if hs is not None and hs.commit > log.last_index():
            raise RecoveryRefused(
                f"queue {uid}: commit index {hs.commit} is beyond the last stored entry "
                f"{log.last_index()}: committed entries are missing"
            )
        return Recovered(log, cp, hs, damaged)

    def _recover_prefix(self, log: ServerLog, cp: Checkpoint, snapshot_index: int) -> None:
        """Apply Raft's rule for a snapshot: keep the log if it holds the snapshot's entry
        with the same term, else it restarts after the snapshot."""
        if snapshot_index and snapshot_index == cp.index:
            if log.term(cp.index) not in (None, cp.term) or log.last_index() < cp.index:
                log.apply_reset(cp.index, cp.term)
            for path in log.set_snapshot(cp.index, cp.term, cp.live_indexes):
                self._remove(path)
        elif log.last_index() < cp.index:
            log.apply_reset(cp.index, cp.term)

    # -- writing ------------------------------------------------------------------------------

    def append(self, uid: str, entries: list[Entry]) -> None:
        """Queue ``entries`` for the next group commit; from ``entries[0].index`` they
        replace what is stored. ``Persisted`` follows once durable."""
        self._submit(AppendOp(uid, tuple(entries)))

    def save_hard_state(self, uid: str, hard_state: HardState) -> None:
        """Queue the hard state for the next group commit; ``HardStateSaved`` follows."""
        self._submit(HardStateOp(uid, hard_state))

    def _submit(self, op: WalOp) -> None:
        log = self._log(op.uid)
        if log.failed is not None:
            raise log.failed
        self.wal.submit(op)

    def write_batch(self) -> WalBatch:
        """One group commit, on the caller's thread (the simulator; tests)."""
        return self.wal.write_batch()

    def complete(self, batch: WalBatch) -> list[StorageEvent]:
        """Apply a finished WAL batch to the mem tables and say what became durable."""
        if batch.error is not None:
            failed: list[StorageEvent] = []
            for uid in dict.fromkeys(op.uid for op in batch.ops):
                self._log(uid).failed = batch.error
                failed.append(WriteFailed(uid, batch.error))
            return failed
        events: list[StorageEvent] = []
        for op in batch.ops:
            self._apply(op, batch.wal_seq)
            if isinstance(op, AppendOp):
                last = op.entries[-1]
                events.append(Persisted(op.uid, last.index, last.term))
            elif isinstance(op, HardStateOp):
                events.append(HardStateSaved(op.uid, op.hard_state))
            elif isinstance(op, ResetOp):
                events.append(SnapshotReset(op.uid, op.index, op.term))
            else:
                self._delete_files(op.uid)
                events.append(Removed(op.uid))
        if batch.rolled is not None:
            self._rolled.append(batch.rolled)
        return events

    def _apply(self, op: WalOp, wal_seq: int, *, recovering: bool = False) -> None:
        if isinstance(op, ForgetOp):
            self._logs.pop(op.uid, None)
            self._installed.pop(op.uid, None)
            self._forgotten.add(op.uid)
            return
        self._forgotten.discard(op.uid)
        log = self._log(op.uid)
        if isinstance(op, AppendOp):
            # At recovery a record may follow entries that are gone: superseded by an
            # overwrite later in the WAL, or before a snapshot whose reset record was in
            # a deleted WAL file. The mem table then restarts at the record.
            log.apply_append(op.entries, wal_seq, gap_allowed=recovering)
        elif isinstance(op, HardStateOp):
            log.hard_state = op.hard_state
        else:
            self._generations[op.uid] = self._generations.get(op.uid, 0) + 1
            log.apply_reset(op.index, op.term)
            installed = self._installed.pop(op.uid, None)
            if installed is not None:
                segment, live = installed
                log.snapshot_live = live
                if segment is not None:
                    log.add_segment(segment)

    def sync(self) -> list[StorageEvent]:
        """Everything pending made durable, and rolled WAL files flushed to segments:
        what the simulator calls where the runtime's threads would run."""
        events: list[StorageEvent] = []
        while self.wal.pending():
            events.extend(self.complete(self.wal.write_batch()))
        self.flush_segments()
        return events

    # -- segments -----------------------------------------------------------------------------

    def rolled_wal_files(self) -> list[int]:
        """WAL files closed and waiting for their entries to reach segments."""
        return list(self._rolled)

    def prepare_segment_flush(self) -> SegmentFlush | None:
        """The flush of the oldest rolled WAL file, or ``None`` if none is waiting."""
        if not self._rolled:
            return None
        seq = self._rolled[0]
        plans = []
        for uid in sorted(self._logs):
            log = self._logs[uid]
            entries = log.mem.flushable(seq)
            if not entries:
                continue
            first = entries[0].index
            if first <= log.snapshot_index():
                # Entries that died before reaching a segment are never written.
                entries = [e for e in entries if not log.is_dead(e.index)]
            if entries:
                plans.append((uid, self._generations[uid], log.next_segment_seq, entries, first))
                log.next_segment_seq += len(_chunks(entries, self.limits))
        return SegmentFlush(self.disk, self.limits, seq, plans)

    def finish_segment_flush(self, flush: SegmentFlush) -> None:
        """Put the written segments in the views, drop the flushed entries from the mem
        tables, then delete the WAL file."""
        assert self._rolled and self._rolled[0] == flush.wal_seq
        for uid, generation, infos in flush.written:
            log = self._logs.get(uid)
            if log is None or generation != self._generations[uid]:
                for info in infos:  # removed or reset meanwhile: these are stale
                    self._remove(info.path)
                continue
            for info in infos:
                for hidden in log.add_segment(info):
                    self._retire(hidden)
            log.mem.drop_flushed(flush.wal_seq)
        for uid in self._logs:
            self._logs[uid].mem.drop_flushed(flush.wal_seq)
        self.disk.remove(wal_path(flush.wal_seq))
        self.disk.sync_dir("wal")
        self._rolled.pop(0)

    def flush_segments(self) -> StorageFailed | None:
        """Flush every rolled WAL file, on this thread. A disk error stops it and is
        returned; nothing is lost (the entries stay in mem tables and the WAL) and the
        next call tries again."""
        while (flush := self.prepare_segment_flush()) is not None:
            try:
                flush.write()
            except StorageFailed as error:
                return error
            self.finish_segment_flush(flush)
        return None

    def _remove(self, path: str) -> None:
        self.cache.evict(path)
        if self.disk.exists(path):
            self.disk.remove(path)
            self.disk.sync_dir(parent(path))

    def _retire(self, path: str) -> None:
        """A segment left the view: delete it now, or when its last pin is released."""
        self.cache.evict(path)
        if self.pins.pinned(path):
            self._retired.add(path)
            return
        self._remove(path)
        self._settle_intents(path)

    def _settle_intents(self, path: str) -> None:
        """Delete the phase-3 intents that waited only for ``path`` to be gone."""
        for intent, waiting in list(self._intents.items()):
            waiting.discard(path)
            if not waiting:
                del self._intents[intent]
                self._remove(intent)

    def _unpin(self, paths: list[str]) -> None:
        for path in paths:
            if self.pins.unpin(path) and path in self._retired:
                self._retired.discard(path)
                self._remove(path)
                self._settle_intents(path)

    def pin_reader(self, uid: str, lo: int = 1, hi: int | None = None) -> PinnedReader:
        """Pin the segments of ``uid`` that answer for indexes ``lo .. hi``: they stay
        on disk, unchanged, until ``release`` (see ``engine.storage.compaction``)."""
        log = self._log(uid)
        top = log.last_index() if hi is None else hi
        segments = [(i, h) for i, h in log.segment_infos() if i.lo <= top and h >= lo]
        for info, _ in segments:
            self.pins.pin(info.path)
        return PinnedReader(self.disk, segments, self._unpin)

    # -- compaction ------------------------------------------------------------------------

    def segment_stats(self, uid: str) -> list[SegmentStat]:
        """Every segment of ``uid`` counted against its snapshot's live set."""
        return log_stats(self._log(uid), self.cache)

    def prepare_compaction(self, uid: str, phase: Phase = "auto") -> CompactionJob:
        """On the node's thread: promote the newest checkpoint to the snapshot (phases
        ``auto`` and 1), plan the phases and pin what phases 2 and 3 will work on. Then
        ``job.run()`` (a worker may run it) and ``finish_compaction(job)`` here."""
        assert phase in ("auto", 1, 2, 3), phase
        log = self._log(uid)
        if log.failed is not None:
            raise log.failed
        assert uid not in self._compacting, f"{uid}: one compaction at a time"
        started = time.perf_counter()
        promoted = False
        before = None
        if phase in ("auto", 1):
            cp, _ = self.checkpoints(uid).load_newest()
            if cp is not None and cp.index > log.snapshot_index():
                # Counted against the new snapshot, before promotion deletes anything.
                before = [
                    segment_stat(self.cache, info, hi, cp.index, cp.live_indexes)
                    for info, hi in log.segment_infos()
                ]
                promoted = self.release_cursor(uid, cp.index) is not None
        now = log_stats(log, self.cache)
        plan = plan_phases(now, phase, self.limits, self.pins.pinned)
        job = new_job(
            self.disk,
            self.limits,
            log,
            self._generations[uid],
            now if before is None else before,
            plan,
            promoted=promoted,
            started=started,
        )
        for path in job.pinned_paths():
            self.pins.pin(path)
        self._compacting.add(uid)
        return job

    def finish_compaction(self, job: CompactionJob) -> CompactionResult:
        """Apply what the job did to the view and delete what it freed. Raises
        ``StorageFailed`` after that if the job met a disk error."""
        uid = job.uid
        self._compacting.discard(uid)
        log = self._logs.get(uid)
        current = log if log is not None and self._generations[uid] == job.generation else None
        phases: list[int] = []
        if current is not None:
            gone = {s.info.path for s in job.deletes if current.has_segment(s.info)}
            current.remove_segments(gone)
            for path in sorted(gone):
                self._retire(path)
            if gone or job.promoted:
                phases.append(1)
            if self._finish_cuts(current, job):
                phases.append(2)
        if self._finish_groups(current, job):
            phases.append(3)
        self._unpin(job.pinned_paths())
        result = self._result(job, phases)
        if job.error is not None:
            raise job.error
        return result

    def _finish_cuts(self, log: ServerLog, job: CompactionJob) -> bool:
        changed = False
        for cut in job.cuts:
            if cut.new is not None and log.has_segment(cut.stat.info):
                log.replace_segment(cut.stat.info, cut.new)
                self.cache.evict(cut.new.path)
                changed = True
        return changed

    def _finish_groups(self, log: ServerLog | None, job: CompactionJob) -> bool:
        changed = False
        for group in job.groups:
            if group.output is None:
                continue
            intent = intent_path(job.uid, group.out_seq)
            inputs = [s.info for s in group.used]
            if log is None or not all(log.has_segment(i) for i in inputs):
                # The log was reset or an input hidden meanwhile: undo this rewrite.
                self._remove(group.output.path)
                self._remove(intent)
                continue
            log.swap_segments(inputs, group.output)
            changed = True
            self._intents[intent] = {i.path for i in inputs}
            for info in inputs:
                self._retire(info.path)
        return changed

    def _result(self, job: CompactionJob, phases: list[int]) -> CompactionResult:
        log = self._logs.get(job.uid)
        after = log_stats(log, self.cache) if log is not None else []
        return CompactionResult(
            uid=job.uid,
            phases=tuple(phases),
            snapshot_index=job.snap,
            segments_before=len(job.before),
            segments_after=len(after),
            bytes_before=sum(s.info.bytes for s in job.before),
            bytes_after=sum(s.info.bytes for s in after),
            live_entries=sum(s.live for s in after),
            dead_entries_before=sum(s.dead for s in job.before),
            dead_entries_after=sum(s.dead for s in after),
            duration_s=time.perf_counter() - job.started,
            transient_bytes_max=job.transient_bytes_max,
            deferred_files=len(self._retired),
        )

    def compact(self, uid: str, phase: Phase = "auto") -> CompactionResult:
        """Prepare, run and finish a compaction on this thread (simulator, tests, tools)."""
        job = self.prepare_compaction(uid, phase)
        job.run()
        return self.finish_compaction(job)

    # -- checkpoints and snapshots -------------------------------------------------------------

    def checkpoints(self, uid: str) -> CheckpointStore:
        return CheckpointStore(self.disk, uid, self.limits.checkpoints_kept_max)

    def write_checkpoint(self, uid: str, cp: Checkpoint) -> None:
        """Durably write a checkpoint (``CheckpointRequest``); the log is not truncated."""
        try:
            self.checkpoints(uid).write(cp)
        except OSError as exc:
            raise StorageFailed(f"checkpoint of {uid} at {cp.index} failed: {exc}") from exc

    def release_cursor(self, uid: str, index: int) -> int | None:
        """``ReleaseCursor``: promote the newest checkpoint at or below ``index`` to the
        snapshot and delete segments holding only dead entries before it. Returns the
        snapshot index, or ``None`` if no checkpoint qualifies."""
        store = self.checkpoints(uid)
        try:
            promoted = store.promote(index)
        except OSError as exc:
            raise StorageFailed(f"promotion of a checkpoint of {uid} failed: {exc}") from exc
        if promoted is None:
            return None
        snapshot = store.read_snapshot()
        assert snapshot is not None, f"{uid}: promoted snapshot {promoted} unreadable"
        for path in self._log(uid).set_snapshot(promoted, snapshot.term, snapshot.live_indexes):
            self._retire(path)
        return promoted

    def held_live(self, uid: str, live: BitMap64) -> BitMap64:
        """The indexes of ``live`` (a leader's snapshot) this server already stores as
        committed entries, so a catch-up needs only the others: an entry at or below
        the durable commit index is the leader's entry (Raft's log matching)."""
        log = self._log(uid)
        commit = log.hard_state.commit if log.hard_state is not None else 0
        held = BitMap64()
        for index in live[: live.rank(min(commit, log.last_index()))]:
            try:
                log.read(index)
            except LookupError:
                continue
            held.add(index)
        return held

    def install_snapshot(
        self, uid: str, cp: Checkpoint, live_entries: Sequence[Entry] = ()
    ) -> None:
        """A snapshot from the leader replaces the whole log of ``uid``: the snapshot file
        is written durably, every segment deleted, the snapshot's live entries written
        to a new segment, then a reset record goes through the WAL (``SnapshotReset``
        follows; until then the log view is unchanged). ``live_entries`` may hold only
        the live entries this server lacks (see ``held_live``): the others are read from
        its own log before it is replaced."""
        log = self._log(uid)
        if log.failed is not None:
            raise log.failed
        given = BitMap64(e.index for e in live_entries)
        assert len(given) == len(live_entries) and given.issubset(cp.live_indexes)
        held = [log.read(i) for i in cp.live_indexes - given]
        live_entries = sorted([*live_entries, *held], key=lambda e: e.index)
        try:
            self.checkpoints(uid).install_snapshot(cp)
            stale = log.drop_segments()
            pending, _ = self._installed.pop(uid, (None, None))
            for info in [*stale, *([pending] if pending else [])]:
                self._retire(info.path)
            written = None
            if live_entries:
                seq = log.next_segment_seq
                log.next_segment_seq += 1
                write_segment(self.disk, uid, seq, live_entries, 0)
                written = read_segment_info(self.disk, segment_path(uid, seq))
                assert written is not None
            self._installed[uid] = (written, cp.live_indexes)
        except OSError as exc:
            raise StorageFailed(f"snapshot install of {uid} failed: {exc}") from exc
        self.wal.submit(ResetOp(uid, cp.index, cp.term))

    def remove_server(self, uid: str) -> None:
        """Delete server ``uid``: a forget record goes through the WAL, then its files
        are deleted (``Removed`` follows). A crash in between finishes it at recovery."""
        self.wal.submit(ForgetOp(uid))

    def _delete_files(self, uid: str) -> None:
        root = f"{QUEUES_DIR}/{uid}"
        for directory in (segment_dir(uid), f"{root}/checkpoints", f"{root}/snapshots"):
            for name in self.disk.listdir(directory):
                self._remove(f"{directory}/{name}")
            self.disk.remove_dir(directory)
        self.disk.remove_dir(root)
        self.disk.sync_dir(QUEUES_DIR)

    def log(self, uid: str) -> ServerLog:
        return self._logs[uid]

    def close(self, *, flush: bool = True) -> None:
        """Stop cleanly: whatever is pending is made durable; with ``flush`` the WAL is
        rolled and every mem table written to segments, so the next start replays no
        WAL. A crash instead of ``close`` loses nothing that was reported durable."""
        self.sync()
        if flush:
            self._rolled.append(self.wal.roll())
            self.flush_segments()
        self.wal.close()
        self.cache.close()


__all__ = [
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
