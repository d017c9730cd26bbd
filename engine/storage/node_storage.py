"""The storage of one node: the shared WAL, every server's log, segments and checkpoints.

Rule: ``NodeStorage`` is used from one thread, its owner (the runtime's event loop, or
the simulator; ``take_over`` hands it to another thread while the owner waits, as the
runtime does to open and close it in a worker). Its entry points assert that. The only
work that may run elsewhere is ``Wal.write_batch`` (the WAL writer thread),
``SegmentFlush.write``, ``CompactionJob.run`` and ``CheckpointWrite.write`` (workers),
which touch the disk and nothing of this object; each is prepared and finished on the
owner's thread (``finish_segment_flush``, ``finish_compaction``, ``finish_checkpoint``).

Recovery (``NodeStorage.open``) reads the WAL files and replays them into mem tables
(a torn tail of the last file is cut off), reads the header of every segment, and opens
a fresh WAL file. ``open_server`` then loads a server's newest valid checkpoint and
reads the log after it (what the Raft core replays anyway). Nothing here reads the whole
log: the work grows with the WAL (bounded by ``wal_file_bytes_max``), the number of
segment files, the checkpoint size and the log after the checkpoint, not with the number
of messages on a queue.

Damage found at recovery is repaired from the server's peers, never served
(``repair.py`` has the marker that makes it survive a crash; the Raft core's repair mode
keeps it safe). The log is cut before the first entry that cannot be trusted, so it
stays a prefix: a corrupt entry after the checkpoint, committed entries missing, or,
after a corrupt WAL record (its owner unknown), everything of every server after it.
If a live entry before the checkpoint is lost, or the checkpoint or a segment's header
is damaged, the server is reset to an empty log (term kept) and the leader sends a
snapshot. ``Recovered.repairing`` tells the caller to start the core in repair mode;
a group of one member cannot be repaired and its caller refuses it.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Sequence

from pyroaring import BitMap64

from engine.errors import EntryDamaged, RecoveryRefused, StorageFailed
from engine.limits import DEFAULT_LIMITS, Limits
from engine.raft.entry import Entry
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
from engine.storage.disk import Disk, parent
from engine.storage.flush import CheckpointWrite, SegmentFlush, segment_chunks
from engine.storage.repair import (
    RepairKind,
    RepairMarker,
    read_marker,
    repair_path,
    write_marker,
)
from engine.storage.segment import (
    ReaderCache,
    SegmentInfo,
    read_segment_info,
    segment_dir,
    segment_path,
    write_segment,
)
from engine.storage.server_log import ServerLog
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
    read_wal_file,
    wal_path,
    wal_seqs,
)

QUEUES_DIR = "queues"
_NOT_OWNER = "NodeStorage is used from its owner thread only (see the module's rule)"


def _lone(uid: str, reason: str) -> str:
    return (
        f"queue {uid}: {reason}; the queue has no other member to repair it from: its "
        "files are left as they are, restore it from a backup"
    )


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
        self._repairs: dict[str, RepairMarker] = {}
        """Servers in repair, with their markers."""
        self._repair_done: set[str] = set()
        """Servers whose core left repair: their marker goes with the last older WAL file."""
        self._later_segments: dict[str, list[SegmentInfo]] = {}
        """At recovery: segments written during a repair, put in the view after its cut."""
        self._cut_applied: set[str] = set()
        self._wal_damage: tuple[int, int] | None = None
        """At recovery: (WAL seq, byte) of the first corrupt record of synced data."""
        self._unrepairable: str | None = None
        """The server being opened, if its group has no other member to repair it."""
        self._damaged_at: dict[str, tuple[int, int]] = {}
        """At recovery: (last index, commit index) of each server at the corrupt record."""
        self._checkpoint_writes: set[CheckpointWrite] = set()
        """Prepared and not finished: their workers may be writing."""
        self._owner = threading.current_thread()
        self.wal: Wal

    def take_over(self) -> None:
        """The calling thread owns this storage from now on; the previous owner waits
        (the runtime opens and closes it in a worker)."""
        self._owner = threading.current_thread()

    def _owned(self) -> bool:
        return threading.current_thread() is self._owner

    # -- opening --------------------------------------------------------------------------

    @classmethod
    def open(cls, disk: Disk, limits: Limits = DEFAULT_LIMITS) -> NodeStorage:
        """Recover the node's storage. A WAL file corrupt in a place a crash cannot
        explain (durable data was lost) puts every server into repair (see the module's
        rules); ``open_server`` says which are repairing."""
        node = cls(disk, limits)
        disk.makedirs(QUEUES_DIR)
        seqs = sorted(wal_seqs(disk))
        next_seq = (seqs[-1] + 1) if seqs else 1
        for uid in disk.listdir(QUEUES_DIR):
            marker = read_marker(disk, uid, next_seq)
            if marker is not None:
                node._repairs[uid] = marker
            node._load_segments(node._log(uid), marker.segment_seq if marker else None)
        for k, seq in enumerate(seqs):
            node._apply_cuts(seq)
            wal_file = read_wal_file(disk, seq)
            bad_at = wal_file.corrupt_at
            if bad_at is None and wal_file.good_bytes < wal_file.size:
                if k == len(seqs) - 1:
                    node._cut_torn_tail(seq, wal_file.good_bytes)
                else:
                    bad_at = wal_file.good_bytes  # bad bytes, yet a later file follows
            for op in wal_file.ops:
                if node._replays(op, seq):
                    node._apply(op, seq, recovering=True)
            if bad_at is not None and node._wal_damage is None:
                node._on_wal_damage(seq, bad_at)
        node._apply_cuts(next_seq)
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

    def _load_segments(self, log: ServerLog, later_from: int | None = None) -> None:
        """Put the server's segments in its view; those from seq ``later_from`` on (written
        during a repair) wait for the repair's cut (``_apply_cuts``)."""
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
            if later_from is not None and info.seq >= later_from:
                self._later_segments.setdefault(log.uid, []).append(info)
                continue
            for hidden in log.add_segment(info):
                self._remove(hidden)
        log.last_from_segments()

    # -- repair -------------------------------------------------------------------------

    def _replays(self, op: WalOp, seq: int) -> bool:
        """Whether recovery applies ``op`` of WAL file ``seq``. Hard states and removals
        are whole in themselves; entries and resets after a corrupt record are left out
        (they may follow entries that were in it), but for a server whose repair began
        after that corruption was found, from the file its repair began with."""
        if isinstance(op, HardStateOp | ForgetOp):
            return True
        m = self._repairs.get(op.uid)
        if self._wal_damage is None:
            return m is None or not m.skip_from <= seq < m.wal_seq
        return m is not None and m.skip_from == self._wal_damage[0] + 1 and seq >= m.wal_seq

    def _on_wal_damage(self, seq: int, at: int) -> None:
        self._wal_damage = (seq, at)
        for uid in sorted(self._logs):
            m = self._repairs.get(uid)
            if m is not None and m.kind is RepairKind.WAL and m.skip_from == seq + 1:
                continue  # a repair begun at an earlier open for this very corruption
            log = self._logs[uid]
            commit = log.hard_state.commit if log.hard_state is not None else 0
            self._damaged_at[uid] = (log.last_index(), commit)

    def _apply_cuts(self, seq: int) -> None:
        """At recovery, before WAL file ``seq``: replay the cut of each repair that began
        with this file or earlier, then show the segments written since."""
        for uid in sorted(self._repairs):
            m = self._repairs[uid]
            if uid in self._cut_applied or m.wal_seq > seq:
                continue
            self._cut_applied.add(uid)
            log = self._log(uid)
            self._cut(log, m)
            later = self._later_segments.pop(uid, [])
            for info in later:
                for hidden in log.add_segment(info):
                    self._remove(hidden)
            if later:
                log.extend_to(max(info.hi for info in later))
            log.next_segment_seq = max(log.next_segment_seq, m.segment_seq)

    def _cut(self, log: ServerLog, m: RepairMarker) -> None:
        if m.resets:
            log.apply_reset(0, 0)
            log.snapshot_live = BitMap64()
            return
        log.keep_to(m.keep_to)
        if m.restart_index > log.last_index():
            log.apply_reset(m.restart_index, m.restart_term)

    def _begin_repair(
        self,
        uid: str,
        cp: Checkpoint | None,
        first_bad: int,
        kind: RepairKind,
        reason: str,
        wal_seq: int,
        *,
        apply: bool = True,
    ) -> Checkpoint | None:
        """Entries from ``first_bad`` on are lost or untrusted: cut the log before it, or
        restart it after the checkpoint if no live entry of it is lost, else reset. A
        second damage during a repair resets. Without ``apply`` only the marker is
        written (a reset is left to the next open). Returns the checkpoint in use."""
        log = self._log(uid)
        base = cp.index if cp is not None else log.snapshot_index()
        restart = (0, 0)
        if uid in self._repairs or (first_bad <= base and cp is None):
            self._reset(uid, reason, wal_seq, apply=apply)
            return None
        if first_bad <= base:
            assert cp is not None
            # The log restarts after the checkpoint: a live entry it names must be neither
            # lost nor in the mem table (a restart empties it).
            mem = log.mem
            lost = cp.live_indexes.range_cardinality(first_bad, base + 1)
            in_mem = 0
            if len(mem) and mem.lo <= base:
                in_mem = cp.live_indexes.range_cardinality(mem.lo, min(mem.hi, base) + 1)
            if lost or in_mem:
                self._reset(uid, reason, wal_seq, apply=apply)
                return None
            restart = (cp.index, cp.term)
        skip_from = self._wal_damage[0] + 1 if self._wal_damage and kind is RepairKind.WAL else 0
        m = RepairMarker(
            kind,
            first_bad - 1,
            restart[0],
            restart[1],
            skip_from or wal_seq,
            wal_seq,
            log.next_segment_seq,
            reason,
        )
        self._set_marker(uid, m)
        if apply:
            self._cut(log, m)
        return cp

    def _reset(self, uid: str, reason: str, wal_seq: int, *, apply: bool = True) -> None:
        """Empty the server's log and delete its segments and checkpoints (its term and
        vote stay in the WAL); the marker says so first, so a crash finishes it."""
        log = self._log(uid)
        m = RepairMarker(
            RepairKind.RESETTING, 0, 0, 0, wal_seq, wal_seq, log.next_segment_seq, reason
        )
        self._set_marker(uid, m)
        if not apply:
            return
        log.drop_segments()
        root = f"{QUEUES_DIR}/{uid}"
        for directory in (segment_dir(uid), f"{root}/checkpoints", f"{root}/snapshots"):
            for name in self.disk.listdir(directory):
                self._remove(f"{directory}/{name}")
        self._damaged_segments.pop(uid, None)
        self._installed.pop(uid, None)
        self._generations[uid] = self._generations.get(uid, 0) + 1
        self._cut(log, m)
        self._set_marker(uid, dataclasses.replace(m, kind=RepairKind.RESET))

    def _set_marker(self, uid: str, m: RepairMarker) -> None:
        if uid == self._unrepairable:
            raise RecoveryRefused(_lone(uid, m.reason))
        try:
            write_marker(self.disk, uid, m)
        except OSError as exc:
            raise StorageFailed(f"repair marker of {uid} could not be written: {exc}") from exc
        self._repairs[uid] = m
        self._repair_done.discard(uid)

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
        if uid not in self._repairs:
            return True
        self._repair_done.add(uid)
        return self._maybe_drop_marker(uid)

    def _maybe_drop_marker(self, uid: str) -> bool:
        m = self._repairs[uid]
        oldest = self._rolled[0] if self._rolled else self.wal.seq
        if oldest < m.wal_seq:
            return False
        self._remove(repair_path(uid))
        del self._repairs[uid]
        self._repair_done.discard(uid)
        return True

    def mark_damaged(self, uid: str, error: EntryDamaged) -> None:
        """A read while serving found entries of ``uid`` damaged from ``error.index`` on:
        only the marker is written (nothing is cut or deleted now); the next open of the
        storage applies it and the server starts in repair mode. What the server writes
        meanwhile goes to the WAL file being written, before the one the repair begins
        with: the next open cuts it too (the server is repairing: safe, if wasteful)."""
        assert self._owned(), _NOT_OWNER
        cp, _ = self.checkpoints(uid).load_newest()
        wal_seq = self.wal.seq + 1
        self._begin_repair(uid, cp, error.index, RepairKind.CUT, error.detail, wal_seq, apply=False)

    def servers(self) -> list[str]:
        """Uids of every server with data on this node, sorted."""
        assert self._owned(), _NOT_OWNER
        return sorted(self._logs)

    def open_server(self, uid: str, *, repairable: bool = True) -> Recovered:
        """Open (or create) the storage of server ``uid`` and say what to restore. Damaged
        data is cut or reset and the server marked repairing (see the module's rules).
        Without ``repairable`` (the group has no other member) damage raises
        ``RecoveryRefused`` before any file is changed, for an operator to look at."""
        assert self._owned(), _NOT_OWNER
        if uid in self._repairs and not repairable:
            raise RecoveryRefused(_lone(uid, self._repairs[uid].reason))
        self._unrepairable = None if repairable else uid
        try:
            return self._open_server(uid)
        finally:
            self._unrepairable = None

    def _open_server(self, uid: str) -> Recovered:
        log = self._log(uid)
        self.disk.makedirs(segment_dir(uid))
        m = self._repairs.get(uid)
        if m is not None and m.kind is RepairKind.RESETTING:
            self._reset(uid, m.reason, m.wal_seq)
        damaged_segments = self._damaged_segments.get(uid)
        if damaged_segments:
            reason = f"segment {damaged_segments[0]} is damaged (its header fails its check)"
            self._reset(uid, reason, self.wal.seq)
        checkpoints = CheckpointStore(self.disk, uid, self.limits.checkpoints_kept_max)
        cp, damaged = checkpoints.load_newest()
        snapshot_index = checkpoints.snapshot_index()
        if snapshot_index and (cp is None or cp.index < snapshot_index):
            reason = (
                f"snapshot at index {snapshot_index} is damaged and no newer checkpoint is "
                "valid; the log before it is gone"
            )
            self._reset(uid, reason, self.wal.seq)
            cp, snapshot_index = None, 0
        cp = self._repair_after_wal_damage(uid, cp)
        if cp is not None:
            try:
                self._recover_prefix(log, cp, snapshot_index)
            except EntryDamaged as e:
                cp = self._begin_repair(uid, cp, e.index, RepairKind.CUT, e.detail, self.wal.seq)
                if cp is not None:
                    self._recover_prefix(log, cp, snapshot_index)
        cp = self._repair_missing(uid, cp)
        cp = self._repair_tail(uid, cp)
        m = self._repairs.get(uid)
        why = None if m is None else f"queue {uid}: {m.reason}"
        return Recovered(log, cp, log.hard_state, damaged, m is not None, why)

    def _repair_after_wal_damage(self, uid: str, cp: Checkpoint | None) -> Checkpoint | None:
        """After a corrupt WAL record the log is an older state of itself: the entries
        up to the commit index it knew then are right, those after may be older versions
        of entries rewritten later. A newer checkpoint counts them committed, so they are
        not kept past that commit index then."""
        at = self._damaged_at.get(uid)
        if at is None:
            return cp
        assert self._wal_damage is not None
        last, trusted = at
        first_bad = last + 1
        if cp is not None and cp.index > trusted:
            first_bad = min(last, trusted) + 1
        seq, byte = self._wal_damage
        reason = (
            f"WAL file {wal_path(seq)} is corrupt at byte {byte}: what was written after it is lost"
        )
        cp = self._begin_repair(uid, cp, first_bad, RepairKind.WAL, reason, self.wal.seq)
        del self._damaged_at[uid]  # kept if the repair was refused, for a later open
        return cp

    def _repair_missing(self, uid: str, cp: Checkpoint | None) -> Checkpoint | None:
        """Committed entries missing (lost from the WAL without a trace): as after a
        corrupt WAL record, with no commit index known right."""
        log = self._log(uid)
        hs = log.hard_state
        if uid in self._repairs or hs is None or hs.commit <= log.last_index():
            return cp
        last = log.last_index()
        first_bad = 1 if cp is not None else last + 1
        reason = (
            f"commit index {hs.commit} is beyond the last stored entry {last}: committed "
            "entries are missing"
        )
        return self._begin_repair(uid, cp, first_bad, RepairKind.CUT, reason, self.wal.seq)

    def _repair_tail(self, uid: str, cp: Checkpoint | None) -> Checkpoint | None:
        """Read the log after the checkpoint (the core replays it anyway): the first
        entry that fails its check or is missing starts the repair."""
        log = self._log(uid)
        base = cp.index if cp is not None else log.snapshot_index()
        bad, detail = self._first_unreadable(log, base + 1)
        if bad is None:
            return cp
        return self._begin_repair(uid, cp, bad, RepairKind.CUT, detail, self.wal.seq)

    def _first_unreadable(self, log: ServerLog, lo: int) -> tuple[int | None, str]:
        if lo < log.first_index() and lo <= log.last_index():
            return lo, f"entry {lo} is missing"
        return log.first_damaged(lo, self.limits.committed_bytes_per_ready_max)

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
        assert self._owned(), _NOT_OWNER
        self._submit(AppendOp(uid, tuple(entries)))

    def save_hard_state(self, uid: str, hard_state: HardState) -> None:
        """Queue the hard state for the next group commit; ``HardStateSaved`` follows."""
        assert self._owned(), _NOT_OWNER
        self._submit(HardStateOp(uid, hard_state))

    def _submit(self, op: WalOp) -> None:
        log = self._log(op.uid)
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

    def prepare_segment_flush(self) -> SegmentFlush | None:
        """The flush of the oldest rolled WAL file, or ``None`` if none is waiting."""
        assert self._owned(), _NOT_OWNER
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
                log.next_segment_seq += len(segment_chunks(entries, self.limits))
        return SegmentFlush(self.disk, self.limits, seq, plans)

    def finish_segment_flush(self, flush: SegmentFlush) -> None:
        """Put the written segments in the views, drop the flushed entries from the mem
        tables, then delete the WAL file."""
        assert self._owned(), _NOT_OWNER
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
        for uid in sorted(self._repair_done):
            self._maybe_drop_marker(uid)

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
        assert self._owned(), _NOT_OWNER
        log = self._log(uid)
        top = log.last_index() if hi is None else hi
        segments = [(i, h) for i, h in log.segment_infos() if i.lo <= top and h >= lo]
        for info, _ in segments:
            self.pins.pin(info.path)
        return PinnedReader(self.disk, segments, self._unpin)

    # -- compaction ------------------------------------------------------------------------

    def segment_stats(self, uid: str) -> list[SegmentStat]:
        """Every segment of ``uid`` counted against its snapshot's live set."""
        assert self._owned(), _NOT_OWNER
        return log_stats(self._log(uid), self.cache)

    def prepare_compaction(self, uid: str, phase: Phase = "auto") -> CompactionJob:
        """On the node's thread: promote the newest checkpoint to the snapshot (phases
        ``auto`` and 1), plan the phases and pin what phases 2 and 3 will work on. Then
        ``job.run()`` (a worker may run it) and ``finish_compaction(job)`` here."""
        assert self._owned(), _NOT_OWNER
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
        if uid in self._repairs:
            # Segments may hold entries past the repair's cut: only delete during it.
            plan = (plan[0], [], [])
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
        assert self._owned(), _NOT_OWNER
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
        assert self._owned(), _NOT_OWNER
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

    def install_snapshot(self, uid: str, cp: Checkpoint, live_entries: Sequence[Entry] = ()) -> int:
        """A snapshot from the leader replaces the whole log of ``uid``: the snapshot file
        is written durably, every segment deleted, the snapshot's live entries written
        to a new segment, then a reset record goes through the WAL (``SnapshotReset``
        follows; until then the log view is unchanged). ``live_entries`` may hold only
        the live entries this server lacks (see ``held_live``): the others are read from
        its own log before it is replaced. Returns the bytes of the snapshot file."""
        assert self._owned(), _NOT_OWNER
        log = self._log(uid)
        if log.failed is not None:
            raise log.failed
        given = BitMap64(e.index for e in live_entries)
        assert len(given) == len(live_entries) and given.issubset(cp.live_indexes)
        held = [log.read(i) for i in cp.live_indexes - given]
        live_entries = sorted([*live_entries, *held], key=lambda e: e.index)
        try:
            size = self.checkpoints(uid).install_snapshot(cp)
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
        return size

    def remove_server(self, uid: str) -> None:
        """Delete server ``uid``: a forget record goes through the WAL, then its files
        are deleted (``Removed`` follows). A crash in between finishes it at recovery."""
        assert self._owned(), _NOT_OWNER
        self.wal.submit(ForgetOp(uid))

    def _delete_files(self, uid: str) -> None:
        root = f"{QUEUES_DIR}/{uid}"
        self._remove(repair_path(uid))
        self._repairs.pop(uid, None)
        for directory in (segment_dir(uid), f"{root}/checkpoints", f"{root}/snapshots"):
            for name in self.disk.listdir(directory):
                self._remove(f"{directory}/{name}")
            self.disk.remove_dir(directory)
        self.disk.remove_dir(root)
        self.disk.sync_dir(QUEUES_DIR)

    def log(self, uid: str) -> ServerLog:
        assert self._owned(), _NOT_OWNER
        return self._logs[uid]

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
