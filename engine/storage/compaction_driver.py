"""Driving compaction for one node's storage: promotion, then prepare → run → finish.

Rule: ``prepare`` and ``finish`` run on the storage's owner thread and are the only
places a compaction changes a view; ``CompactionJob.run`` (``compaction.py`` has the
design) does the I/O between them and may run in a worker. One compaction per server at
a time. A job finished against an older generation of its log (the server was removed or
reset meanwhile) changes no view: what it wrote is undone and what it pinned released.
During a repair a compaction only deletes segments, since segments may hold entries past
the repair's cut.
"""

from __future__ import annotations

import time

from engine.errors import StorageFailed
from engine.limits import Limits
from engine.storage.checkpoint import CheckpointStore
from engine.storage.compaction import (
    CompactionJob,
    CompactionResult,
    Phase,
    intent_path,
    log_stats,
    new_job,
    plan_phases,
    segment_stat,
)
from engine.storage.disk import Disk
from engine.storage.reaper import Reaper
from engine.storage.repair import Repairs
from engine.storage.server_log import ServerLog
from engine.storage.server_logs import ServerLogs


class CompactionDriver:
    """Promotes checkpoints and prepares and finishes the compactions of every server."""

    def __init__(
        self, disk: Disk, limits: Limits, logs: ServerLogs, reaper: Reaper, repairs: Repairs
    ) -> None:
        self.disk = disk
        self.limits = limits
        self.logs = logs
        self.reaper = reaper
        self.repairs = repairs
        self._compacting: set[str] = set()

    def promote(self, uid: str, index: int) -> int | None:
        """Promote the newest checkpoint of ``uid`` at or below ``index`` to the snapshot
        and retire the segments holding only dead entries before it."""
        store = CheckpointStore(self.disk, uid, self.limits.checkpoints_kept_max)
        try:
            promoted = store.promote(index)
        except OSError as exc:
            raise StorageFailed(f"promotion of a checkpoint of {uid} failed: {exc}") from exc
        if promoted is None:
            return None
        snapshot = store.read_snapshot()
        assert snapshot is not None, f"{uid}: promoted snapshot {promoted} unreadable"
        for path in self.logs.get(uid).set_snapshot(promoted, snapshot.term, snapshot.live_indexes):
            self.reaper.retire(path)
        return promoted

    def prepare(self, uid: str, phase: Phase) -> CompactionJob:
        assert phase in ("auto", 1, 2, 3), phase
        log = self.logs.get(uid)
        if log.failed is not None:
            raise log.failed
        assert uid not in self._compacting, f"{uid}: one compaction at a time"
        started = time.perf_counter()
        promoted = False
        before = None
        cache = self.logs.cache
        if phase in ("auto", 1):
            store = CheckpointStore(self.disk, uid, self.limits.checkpoints_kept_max)
            cp, _ = store.load_newest()
            if cp is not None and cp.index > log.snapshot_index():
                # Counted against the new snapshot, before promotion deletes anything.
                before = [
                    segment_stat(cache, info, hi, cp.index, cp.live_indexes)
                    for info, hi in log.segment_infos()
                ]
                promoted = self.promote(uid, cp.index) is not None
        now = log_stats(log, cache)
        plan = plan_phases(now, phase, self.limits, self.reaper.pins.pinned)
        if uid in self.repairs:
            plan = (plan[0], [], [])
        job = new_job(
            self.disk,
            self.limits,
            log,
            self.logs.generation(uid),
            now if before is None else before,
            plan,
            promoted=promoted,
            started=started,
        )
        for path in job.pinned_paths():
            self.reaper.pins.pin(path)
        self._compacting.add(uid)
        return job

    def finish(self, job: CompactionJob) -> CompactionResult:
        uid = job.uid
        self._compacting.discard(uid)
        log = self.logs.find(uid)
        current = log if log is not None and self.logs.generation(uid) == job.generation else None
        phases: list[int] = []
        if current is not None:
            gone = {s.info.path for s in job.deletes if current.has_segment(s.info)}
            current.remove_segments(gone)
            for path in sorted(gone):
                self.reaper.retire(path)
            if gone or job.promoted:
                phases.append(1)
            if self._finish_cuts(current, job):
                phases.append(2)
        if self._finish_groups(current, job):
            phases.append(3)
        self.reaper.unpin(job.pinned_paths())
        result = self._result(job, phases)
        if job.error is not None:
            raise job.error
        return result

    def _finish_cuts(self, log: ServerLog, job: CompactionJob) -> bool:
        changed = False
        for cut in job.cuts:
            if cut.new is not None and log.has_segment(cut.stat.info):
                log.replace_segment(cut.stat.info, cut.new)
                self.logs.cache.evict(cut.new.path)
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
                self.reaper.remove(group.output.path)
                self.reaper.remove(intent)
                continue
            log.swap_segments(inputs, group.output)
            changed = True
            self.reaper.wait_for(intent, {i.path for i in inputs})
            for info in inputs:
                self.reaper.retire(info.path)
        return changed

    def _result(self, job: CompactionJob, phases: list[int]) -> CompactionResult:
        log = self.logs.find(job.uid)
        after = log_stats(log, self.logs.cache) if log is not None else []
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
            deferred_files=self.reaper.deferred_files,
        )


__all__ = ["CompactionDriver"]
