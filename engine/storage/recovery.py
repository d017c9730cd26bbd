"""Recovery of one node's storage: replaying the WAL, reading segment headers, opening a
server and deciding its repair.

Rule: ``replay`` reads the WAL files and replays them into mem tables (a torn tail of
the last file is cut off) and reads the header of every segment; ``open_server`` then
loads a server's newest valid checkpoint and reads the log after it (what the Raft core
replays anyway). Nothing here reads the whole log: the work grows with the WAL (bounded
by ``wal_file_bytes_max``), the number of segment files, the checkpoint size and the log
after the checkpoint, not with the number of messages on a queue.

Damage found here is repaired from the server's peers, never served. The log is cut
before the first entry that cannot be trusted, so it stays a prefix: a corrupt entry
after the checkpoint, committed entries missing, or, after a corrupt WAL record (its
owner unknown), everything of every server after it. If a live entry before the
checkpoint is lost, or the checkpoint or a segment's header is damaged, the server is
reset to an empty log (term kept) and the leader sends a snapshot. Each repair is
planned by ``repair.plan_repair`` and its marker written before anything is cut or
deleted. Runs on the storage's owner thread.
"""

from __future__ import annotations

import dataclasses

from engine.errors import EntryDamaged, RecoveryRefused
from engine.limits import Limits
from engine.storage.checkpoint import Checkpoint, CheckpointStore
from engine.storage.compaction import INTENT_SUFFIX, recover_intents
from engine.storage.disk import Disk, ensure_dir
from engine.storage.reaper import QUEUES_DIR, Reaper, server_root
from engine.storage.repair import (
    REPAIR_FILE,
    RepairKind,
    RepairMarker,
    Repairs,
    apply_cut,
    plan_repair,
    refusal,
    reset_marker,
)
from engine.storage.segment import SEGMENTS_DIR, SegmentInfo, read_segment_info, segment_dir
from engine.storage.server_log import ServerLog
from engine.storage.server_logs import ServerLogs
from engine.storage.storage_events import Recovered
from engine.storage.wal import ForgetOp, HardStateOp, WalOp, read_wal_file, wal_path, wal_seqs


class Recovery:
    """What recovery found, kept for the servers opened later."""

    def __init__(
        self, disk: Disk, limits: Limits, logs: ServerLogs, reaper: Reaper, repairs: Repairs
    ) -> None:
        self.disk = disk
        self.limits = limits
        self.logs = logs
        self.reaper = reaper
        self.repairs = repairs
        self._damaged_segments: dict[str, list[str]] = {}
        self._later_segments: dict[str, list[SegmentInfo]] = {}
        """Segments written during a repair, put in the view after its cut."""
        self._cut_applied: set[str] = set()
        self._wal_damage: tuple[int, int] | None = None
        """(WAL seq, byte) of the first corrupt record of synced data."""
        self._damaged_at: dict[str, tuple[int, int]] = {}
        """(last index, commit index) of each server at the corrupt record."""
        self._held: dict[str, list[str]] = {}
        """What each server's directory held when ``replay`` listed it, until opened."""

    # -- the node's files -----------------------------------------------------------------

    def replay(self) -> list[int]:
        """Load every server's segments and replay the WAL files into the mem tables; a
        WAL file corrupt in a place a crash cannot explain (durable data was lost) puts
        every server into repair. Returns the seqs of the WAL files found."""
        self.disk.makedirs(QUEUES_DIR)
        seqs = sorted(wal_seqs(self.disk))
        next_seq = (seqs[-1] + 1) if seqs else 1
        for uid in self.disk.listdir(QUEUES_DIR):
            # One listing of the server's directory says which of its files and folders
            # exist (each made with its first file): the marker is read and the segments
            # listed only where they are, and ``open_server`` listing it again is spared.
            held = self._held[uid] = self.disk.listdir(server_root(uid))
            marker = self.repairs.load(uid, next_seq) if REPAIR_FILE in held else None
            log = self.logs.get(uid)
            if SEGMENTS_DIR in held:
                self._load_segments(log, marker.segment_seq if marker else None)
        for k, seq in enumerate(seqs):
            self._apply_cuts(seq)
            wal_file = read_wal_file(self.disk, seq)
            bad_at = wal_file.corrupt_at
            if bad_at is None and wal_file.good_bytes < wal_file.size:
                if k == len(seqs) - 1:
                    self._cut_torn_tail(seq, wal_file.good_bytes)
                else:
                    bad_at = wal_file.good_bytes  # bad bytes, yet a later file follows
            for op in wal_file.ops:
                if self._replays(op, seq):
                    self.logs.apply(op, seq, recovering=True)
            if bad_at is not None and self._wal_damage is None:
                self._on_wal_damage(seq, bad_at)
        self._apply_cuts(next_seq)
        for uid in sorted(self.logs.forgotten):
            self.reaper.delete_server(uid)
            self.repairs.forget(uid)
        return seqs

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

    def _load_segments(self, log: ServerLog, later_from: int | None = None) -> None:
        """Put the server's segments in its view; those from seq ``later_from`` on (written
        during a repair) wait for the repair's cut (``_apply_cuts``)."""
        directory = segment_dir(log.uid)
        names = self.disk.listdir(directory)
        leftovers = [name for name in names if name.endswith((".tmp", INTENT_SUFFIX))]
        if leftovers:  # rare (a crash during a write): cleaned up, then listed again
            for name in names:
                if name.endswith(".tmp"):
                    self.disk.remove(f"{directory}/{name}")
            recover_intents(self.disk, log.uid)
            names = self.disk.listdir(directory)
        for name in names:
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
                self.reaper.remove(hidden)
        log.last_from_segments()

    def _replays(self, op: WalOp, seq: int) -> bool:
        """Whether recovery applies ``op`` of WAL file ``seq``. Hard states and removals
        are whole in themselves; entries and resets after a corrupt record are left out
        (they may follow entries that were in it), but for a server whose repair began
        after that corruption was found, from the file its repair began with."""
        if isinstance(op, HardStateOp | ForgetOp):
            return True
        m = self.repairs.get(op.uid)
        if self._wal_damage is None:
            return m is None or not m.skip_from <= seq < m.wal_seq
        return m is not None and m.skip_from == self._wal_damage[0] + 1 and seq >= m.wal_seq

    def _on_wal_damage(self, seq: int, at: int) -> None:
        self._wal_damage = (seq, at)
        for uid in self.logs.uids():
            log = self.logs.existing(uid)
            m = self.repairs.get(uid)
            if m is not None and m.kind is RepairKind.WAL and m.skip_from == seq + 1:
                continue  # a repair begun at an earlier open for this very corruption
            commit = log.hard_state.commit if log.hard_state is not None else 0
            self._damaged_at[uid] = (log.last_index(), commit)

    def _apply_cuts(self, seq: int) -> None:
        """Before WAL file ``seq``: replay the cut of each repair that began with this
        file or earlier, then show the segments written since."""
        for uid in self.repairs.uids():
            m = self.repairs.get(uid)
            assert m is not None
            if uid in self._cut_applied or m.wal_seq > seq:
                continue
            self._cut_applied.add(uid)
            log = self.logs.get(uid)
            apply_cut(log, m)
            later = self._later_segments.pop(uid, [])
            for info in later:
                for hidden in log.add_segment(info):
                    self.reaper.remove(hidden)
            if later:
                log.extend_to(max(info.hi for info in later))
            log.next_segment_seq = max(log.next_segment_seq, m.segment_seq)

    # -- repairs --------------------------------------------------------------------------

    def begin_repair(
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
        """Entries from ``first_bad`` on are lost or untrusted: write the marker of the
        repair, then cut the log or reset it. Without ``apply`` only the marker is
        written (a reset is left to the next open). Returns the checkpoint in use."""
        log = self.logs.get(uid)
        damage = self._wal_damage
        skip_from = damage[0] + 1 if damage and kind is RepairKind.WAL else 0
        m = plan_repair(
            log,
            cp,
            first_bad,
            kind,
            reason,
            wal_seq,
            skip_from=skip_from,
            in_repair=uid in self.repairs,
        )
        if m.resets:
            self._reset(uid, m, apply=apply)
            return None
        self.repairs.set(uid, m)
        if apply:
            apply_cut(log, m)
        return cp

    def _reset(self, uid: str, m: RepairMarker, *, apply: bool = True) -> None:
        """Empty the server's log and delete its segments and checkpoints (its term and
        vote stay in the WAL); the marker says so first, so a crash finishes it."""
        assert m.kind is RepairKind.RESETTING
        log = self.logs.get(uid)
        self.repairs.set(uid, m)
        if not apply:
            return
        log.drop_segments()
        self.reaper.empty_dirs(uid)
        self._damaged_segments.pop(uid, None)
        self.logs.installed.pop(uid, None)
        self.logs.new_generation(uid)
        apply_cut(log, m)
        self.repairs.set(uid, dataclasses.replace(m, kind=RepairKind.RESET))

    # -- opening a server -----------------------------------------------------------------

    def open_server(
        self, uid: str, wal_seq: int, *, repairable: bool, asleep_at: int | None = None
    ) -> Recovered:
        """Open (or create) the storage of server ``uid`` (``wal_seq``: the WAL file being
        written). Without ``repairable`` damage raises ``RecoveryRefused`` before any
        file is changed. ``asleep_at``: the applied index of the record the server slept
        as at the last clean stop (``engine.runtime.sleepers``), see ``_repair_tail``."""
        m = self.repairs.get(uid)
        if m is not None and not repairable:
            raise RecoveryRefused(refusal(uid, m.reason))
        self.repairs.unrepairable = None if repairable else uid
        try:
            return self._open_server(uid, wal_seq, asleep_at)
        finally:
            self.repairs.unrepairable = None

    def _open_server(self, uid: str, wal_seq: int, asleep_at: int | None) -> Recovered:
        log = self.logs.get(uid)
        # What ``replay`` listed: nothing made or removed a checkpoint or snapshot folder
        # since (a reset empties them; an empty one reads as holding none).
        held = self._held.pop(uid, None)
        if held is None:
            held = self.disk.listdir(server_root(uid))
        if not held:
            # A new server: its directory makes it known to a later recovery (a corrupt
            # WAL record puts every known server into repair).
            ensure_dir(self.disk, server_root(uid))
        m = self.repairs.get(uid)
        if m is not None and m.kind is RepairKind.RESETTING:
            self._reset(uid, reset_marker(log, m.reason, m.wal_seq))
        damaged_segments = self._damaged_segments.get(uid)
        if damaged_segments:
            reason = f"segment {damaged_segments[0]} is damaged (its header fails its check)"
            self._reset(uid, reset_marker(log, reason, wal_seq))
        cp, damaged, snapshot_index = self._load_checkpoint(uid, held)
        if snapshot_index and (cp is None or cp.index < snapshot_index):
            reason = (
                f"snapshot at index {snapshot_index} is damaged and no newer checkpoint is "
                "valid; the log before it is gone"
            )
            self._reset(uid, reset_marker(log, reason, wal_seq))
            cp, snapshot_index = None, 0
        cp = self._repair_after_wal_damage(uid, cp, wal_seq)
        if cp is not None:
            try:
                self._recover_prefix(log, cp, snapshot_index)
            except EntryDamaged as e:
                cp = self.begin_repair(uid, cp, e.index, RepairKind.CUT, e.detail, wal_seq)
                if cp is not None:
                    self._recover_prefix(log, cp, snapshot_index)
        cp = self._repair_missing(uid, cp, wal_seq)
        cp = self._repair_tail(uid, cp, wal_seq, asleep_at)
        m = self.repairs.get(uid)
        why = None if m is None else f"queue {uid}: {m.reason}"
        return Recovered(log, cp, log.hard_state, damaged, m is not None, why)

    def _load_checkpoint(
        self, uid: str, held: list[str]
    ) -> tuple[Checkpoint | None, list[str], int]:
        """The newest valid checkpoint or snapshot, the damaged ones skipped, and the
        snapshot's index. Their directories are made with their first file: a server
        whose directory (``held``: what it holds) has neither has none, seen in one
        listing (five per server otherwise, a tenth of a start of 10,000 idle queues)."""
        if "checkpoints" not in held and "snapshots" not in held:
            return None, [], 0
        checkpoints = CheckpointStore(self.disk, uid, self.limits.checkpoints_kept_max)
        cp, damaged = checkpoints.load_newest()
        return cp, damaged, checkpoints.snapshot_index()

    def _repair_after_wal_damage(
        self, uid: str, cp: Checkpoint | None, wal_seq: int
    ) -> Checkpoint | None:
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
        cp = self.begin_repair(uid, cp, first_bad, RepairKind.WAL, reason, wal_seq)
        del self._damaged_at[uid]  # kept if the repair was refused, for a later open
        return cp

    def _repair_missing(self, uid: str, cp: Checkpoint | None, wal_seq: int) -> Checkpoint | None:
        """Committed entries missing (lost from the WAL without a trace): as after a
        corrupt WAL record, with no commit index known right."""
        log = self.logs.get(uid)
        hs = log.hard_state
        if uid in self.repairs or hs is None or hs.commit <= log.last_index():
            return cp
        last = log.last_index()
        first_bad = 1 if cp is not None else last + 1
        reason = (
            f"commit index {hs.commit} is beyond the last stored entry {last}: committed "
            "entries are missing"
        )
        return self.begin_repair(uid, cp, first_bad, RepairKind.CUT, reason, wal_seq)

    def _repair_tail(
        self, uid: str, cp: Checkpoint | None, wal_seq: int, asleep_at: int | None
    ) -> Checkpoint | None:
        """Read the log after the checkpoint (the core replays it anyway): the first
        entry that fails its check or is missing starts the repair.

        A server that comes back asleep has nothing to replay: the record it slept as
        holds its machine's state at ``asleep_at``, the end of its log, as a checkpoint
        would, so the read is skipped; what a delivery later reads of the log (the
        bodies of its ready messages) is checked when read, as a body stored before any
        checkpoint is. The record is used only if it matches the log
        (``sleepers.matches``), which this end already does. Reading every sleeping
        queue's whole log made a restart with 10,000 of them take seconds per wake and
        sleep they had been through."""
        log = self.logs.get(uid)
        if (
            asleep_at is not None
            and asleep_at == log.last_index()
            and self.repairs.get(uid) is None
        ):
            return cp
        base = cp.index if cp is not None else log.snapshot_index()
        bad, detail = self._first_unreadable(log, base + 1)
        if bad is None:
            return cp
        return self.begin_repair(uid, cp, bad, RepairKind.CUT, detail, wal_seq)

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
                self.reaper.remove(path)
        elif log.last_index() < cp.index:
            log.apply_reset(cp.index, cp.term)


__all__ = ["Recovery"]
