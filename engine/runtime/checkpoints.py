"""Checkpoints and compaction of the replicas a node hosts.

Rule: the machine is captured on the loop before the next entry applies (``capture``:
a frozen view, no copy), encoded and written by a worker, and the file is finished on
the loop; storage objects are touched only on the loop. Writes, cursor releases and
compactions of one queue take turns under its ``disk_lock``. A checkpoint is taken when
the machine asks (``CheckpointRequest``), once ``Limits.replay_bytes_max`` of the log
has applied since the last one, at a clean stop (``Limits.stop_checkpoint_bytes_min``), and on
demand; compaction follows each automatic one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import TYPE_CHECKING

from engine.errors import NoLeader, NotFound, QuorraError, StorageFailed, ValidationFailed
from engine.queue.machine import FrozenMachine
from engine.runtime import observe
from engine.runtime.api import (
    CheckpointRecord,
    CompactionPhase,
    CompactionRecord,
    HistorySource,
    QueueHistory,
    RecordListener,
    Trigger,
)
from engine.runtime.replica import CheckpointInfo, Replica
from engine.storage import Checkpoint
from engine.storage.flush import CheckpointWrite
from engine.storage.page_files import PageFiles

if TYPE_CHECKING:
    from engine.runtime.context import NodeContext

log = logging.getLogger("quorra.engine")

_STOP_CHECKPOINTS_AT_ONCE = 8


@dataclasses.dataclass(frozen=True, slots=True)
class Captured:
    """A checkpoint taken on the loop but not yet encoded: ``build`` copies the ready
    refs out of the frozen pages, off the event loop (``QueueMachine.freeze``)."""

    index: int
    term: int
    machine_version: int
    config: bytes
    frozen: FrozenMachine
    pages: PageFiles | None = None
    """The page files holding the pages the checkpoint names (pinned at the capture):
    made durable before the checkpoint is written. None if it names none."""

    def build(self) -> Checkpoint:
        live, state = self.frozen.live_indexes(), self.frozen.encode()
        return Checkpoint(self.index, self.term, self.machine_version, self.config, live, state)


class Checkpoints:
    """The node's checkpoint and compaction runs, the listener told of each, and where
    the app keeps them (``history``)."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx
        self.listener: RecordListener | None = None
        self.history: HistorySource | None = None

    def capture(self, rep: Replica, index: int, term: int) -> Captured:
        """The machine state as of ``index``, taken before the next entry applies: frozen
        here, encoded by the worker that writes it (``Captured.build``)."""
        rep.bytes_since_capture = 0
        config = rep.raft.config_at(index).encode()
        frozen = rep.machine.freeze()
        pages = self.ctx.pages.pin_capture(rep, index, frozen)
        return Captured(index, term, rep.machine.version, config, frozen, pages)

    async def auto_checkpoint(
        self, rep: Replica, cp: Captured | None, release_index: int | None
    ) -> None:
        try:
            async with rep.disk_lock:
                if cp is not None:
                    record = await self.write(rep, cp, "auto")
                    await self.notify(record)
                if cp is not None or release_index is not None:
                    # Compaction runs after each checkpoint (and when the machine releases
                    # its prefix): promote the newest checkpoint, then the phases, cheapest
                    # first, until dead entries are within the configured ratio.
                    compaction = await self.compact_locked(rep, "auto", "auto")
                    if compaction.phase != "none":
                        await self.notify(compaction)
        except (StorageFailed, OSError) as e:
            log.error("queue %s: checkpoint failed: %s", rep.name, e)

    async def write(self, rep: Replica, cp: Captured, trigger: Trigger) -> CheckpointRecord:
        ctx = self.ctx
        storage = ctx.storage
        started = time.perf_counter()
        taken_at = ctx.clock.wall_ms()
        async with ctx.job():
            job = storage.prepare_checkpoint(rep.uid)
            try:
                live_entries = await ctx.in_worker(_write_checkpoint, job, cp)
            finally:
                storage.finish_checkpoint(job)
                if cp.pages is not None:
                    ctx.pages.captured_done(rep, cp.index)
        size = job.bytes
        if cp.index >= rep.checkpoint.index:
            rep.checkpoint = CheckpointInfo(cp.index, taken_at, size)
        return CheckpointRecord(
            queue=rep.name,
            index=cp.index,
            term=cp.term,
            taken_at_ms=taken_at,
            bytes=size,
            live_entries=live_entries,
            trigger=trigger,
            duration_ms=round((time.perf_counter() - started) * 1000, 3),
        )

    async def notify(self, record: CheckpointRecord | CompactionRecord) -> None:
        if self.listener is None:
            return
        try:
            await self.listener(record)
        except Exception:  # the listener belongs to the app; its failure is not ours
            log.exception("record listener failed")

    async def history_of(self, rep: Replica) -> QueueHistory:
        """The runs of ``rep``'s queue the app keeps on this node, newest first, at most
        ``Limits.history_records_max`` of each (``HistoryCall``)."""
        if self.history is None:
            raise NotFound(f"node {self.ctx.name} keeps no history of its queues")
        limit = self.ctx.limits.history_records_max
        try:
            kept = await self.history(rep.name, rep.uid, limit)
        except Exception:  # the source belongs to the app (SQLite): its failure is not ours
            log.exception("history source failed")
            raise QuorraError(f"node {self.ctx.name} could not read its history") from None
        return QueueHistory(kept.snapshots[:limit], kept.compactions[:limit])

    async def checkpoint(self, name: str, trigger: Trigger) -> CheckpointRecord:
        ctx = self.ctx
        rep = ctx.replica(name)
        if rep.failed is not None:
            raise rep.failed
        if rep.applied_index == 0 or rep.applied_term == 0:
            raise NoLeader(f"queue {name}: nothing applied yet, retry")
        async with ctx.admit():
            cp = self.capture(rep, rep.applied_index, rep.applied_term)
            async with rep.disk_lock:
                record = await self.write(rep, cp, trigger)
        if trigger == "auto":
            await self.notify(record)
        return record

    async def compact(
        self, name: str, phase: CompactionPhase, trigger: Trigger
    ) -> CompactionRecord:
        """Storage compaction (``engine.storage.compaction``): ``auto`` and 1 first make
        the newest checkpoint the snapshot. Planned and applied on the loop, its I/O in
        a worker; ``phase`` of the record lists the phases that ran ("none" if none)."""
        ctx = self.ctx
        rep = ctx.replica(name)
        if phase not in ("auto", 1, 2, 3):
            raise ValidationFailed("phase is auto, 1, 2 or 3")
        # Awake, so that the log it compacts is the one its Raft core reads (a sleeping
        # core is rebuilt from the log as it finds it).
        rep.wake()
        async with ctx.admit(), rep.disk_lock:
            return await self.compact_locked(rep, phase, trigger)

    async def compact_locked(
        self, rep: Replica, phase: CompactionPhase, trigger: Trigger
    ) -> CompactionRecord:
        """One compaction run; the caller holds ``rep.disk_lock``."""
        ctx = self.ctx
        storage = ctx.storage
        started_ms, before = ctx.clock.wall_ms(), observe.segment_totals(rep)
        async with ctx.job():
            job = storage.prepare_compaction(rep.uid, phase)
            await ctx.in_worker(job.run)
            result = storage.finish_compaction(job)
        ctx.pages.retain(rep)  # a promotion drops the checkpoints before the snapshot
        ran = ",".join(str(p) for p in result.phases) or "none"
        duration_ms = result.duration_s * 1000
        return observe.compaction_record(rep, ran, trigger, started_ms, duration_ms, before)

    async def before_stop(self) -> None:
        """Checkpoint every queue with ``Limits.stop_checkpoint_bytes_min`` applied since its
        last checkpoint (or too many segments written, ``checkpoint_due``): a restart after a
        clean stop then restores the machine and applies nothing of the log (up to
        ``Limits.replay_bytes_max`` otherwise). Compaction's phase 1 follows, which only
        deletes: the checkpoint becomes the snapshot (else the checkpoints of every stop
        stay on disk until the next compaction) and the segments it leaves dead go.
        ``_STOP_CHECKPOINTS_AT_ONCE`` queues at a time: each is a few file syncs."""
        due = [
            rep
            for rep in self.ctx.replicas.values()
            if rep.failed is None
            and not rep.closed
            and rep.dormant is None  # slept under the stop minimum (hibernation)
            and rep.applied_term != 0
            and self.checkpoint_due(rep)
        ]
        slots = asyncio.Semaphore(_STOP_CHECKPOINTS_AT_ONCE)
        await asyncio.gather(*(self._at_stop(rep, slots) for rep in due))

    async def _at_stop(self, rep: Replica, slots: asyncio.Semaphore) -> None:
        async with slots:
            if rep.closed or rep.failed is not None:
                return
            cp = self.capture(rep, rep.applied_index, rep.applied_term)
            try:
                async with rep.disk_lock:
                    await self.notify(await self.write(rep, cp, "auto"))
                    compaction = await self.compact_locked(rep, 1, "auto")
            except (StorageFailed, OSError) as e:
                log.error("queue %s: checkpoint at stop failed: %s", rep.name, e)
                return
            if compaction.phase != "none":
                await self.notify(compaction)

    def checkpoint_due(self, rep: Replica) -> bool:
        """Whether a clean stop, or the idle sweep before ``rep`` sleeps, checkpoints it
        first: it applied ``Limits.stop_checkpoint_bytes_min`` since its last checkpoint, or wrote
        more than ``Limits.queue_sleep_segments_max`` segments (see there)."""
        limits = self.ctx.limits
        return (
            rep.bytes_since_capture >= limits.stop_checkpoint_bytes_min
            or rep.log.segments_after(rep.checkpoint.index) > limits.queue_sleep_segments_max
        )


def _write_checkpoint(job: CheckpointWrite, captured: Captured) -> int:
    """On a worker: encode and write (touches no storage object); the live entries. The
    pages it names are durable before it is (the page files' durability order)."""
    cp = captured.build()
    if captured.pages is not None:
        try:
            captured.pages.sync(cp.index)
        except OSError as e:
            raise StorageFailed(f"checkpoint of {job.uid} at {cp.index}: pages: {e}") from e
    job.write(cp)
    return len(cp.live_indexes)


__all__ = ["Captured", "Checkpoints"]
