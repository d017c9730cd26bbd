"""Hibernation: an idle queue of one member sleeps, and wakes on the first thing that
needs it (issue 17).

A sleeping replica keeps its ``Replica`` (the name, the uid, the receipt seal, the
storage log, the checkpoint it knows of) and swaps its machine, Raft core and driver
for a ``Dormant`` record: the machine's snapshot bytes, the Raft positions, the stats it
had and its live set (``engine.runtime.sleeping``). Stats, listings, the dashboard and
``/metrics`` read the record; anything else that reaches for the driver (a publish, a
receive, a settle, a browse, a policy change, a checkpoint or compaction by hand, a Raft
message) wakes it first, synchronously (``Replica.driver``), so concurrent requests
find it awake: the first one woke it, the others wait for its leader like the first.

Why the record stays in memory (rather than a checkpoint and a closed replica): a wake
from it reads nothing from disk and replays nothing. What else stays is packed when the
queue falls asleep: its storage log (``ServerLogs.pack``: segment list, positions, hard
state, live set) and its page files' bookkeeping (``PageFiles.pack``) each become one
``bytes`` in their node table, and the record is its policy head (shared) and one
``bytes`` (``Dormant``). The count of objects matters more than their bytes: thousands
of queues falling asleep together free their awake objects, and every object that
outlives the sleep and was made while the queue was awake keeps its allocator pool (and
its arena) from being given back; those made at the sleep fill freed space instead.
Fewer objects no longer pay, though: with every object a sleeping queue keeps dropped
by hand (record, packed log, hard state, seal, meta, the replica and its keys), the RSS
of 2,000 of them fell by under 60 bytes a queue, as the few left per queue (the uid
keys, the WAL's references) hold the arenas still. What holds is the most memory that
was ever in use, mostly by the queues awake at once: hence ``_sweeping``'s catch-up.
Readers of a sleeping queue's log get an unpacked copy (``NodeStorage.log_view``) or its
counters (``log_reads``); whatever changes it (a wake, compaction, a delete) unpacks it
for good. Sleeping writes nothing, so the disk is exactly as it was awake and a crash
while sleeping is recovery as usual. Nothing is compacted while it
sleeps (compaction follows checkpoints, which a sleeping queue does not take), and it
sleeps only once what it applied since its last checkpoint is under
``Limits.stop_checkpoint_bytes_min`` (else it is checkpointed first), so a clean stop
has nothing to checkpoint for it either.

Only a lone voter sleeps: its leadership needs no heartbeat, and it wakes leading in the
term it slept in, without an election, a new term or a first entry (nothing to write
before its first request's entry; ``RaftServer.resume_as_sole_leader``). The idle sweep
runs on a timer and looks at ``Limits.queue_sleep_sweep_max`` replicas per run, in
turns, never at every queue of the node at once (a run that put that many to sleep is
followed by the next soon, ``Limits.queue_sleep_catch_up_ms``, so a burst of woken
queues is not held awake for many runs); a replica touched since its last look
(``Replica.touched``, set by each ``process``) starts its idle time again. A queue
sleeps only when nothing of it would happen by itself: no proposal, waiter, long poll,
lease, timer, write, read-ahead, snapshot or checkpoint in flight, and it leads with
everything applied.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from pyroaring import BitMap64

from engine.queue import ReceiptSeal
from engine.raft.events import HardState as RaftHardState
from engine.raft.events import Tick
from engine.raft.options import SplitMix64
from engine.raft.server import RaftOptions, RaftServer, Role
from engine.raft.snapshot import SnapshotMeta
from engine.runtime import observe
from engine.runtime.driver import ReplicaDriver
from engine.runtime.group_io import ReplicaIo
from engine.runtime.meta import QueueMeta
from engine.runtime.replica import NO_CHECKPOINT, CheckpointInfo, Replica, server_id
from engine.runtime.sleepers import Sleeper
from engine.runtime.sleeping import Dormant, may_sleep, put_to_sleep, raft_positions, wake
from engine.storage import Recovered, ServerLog

if TYPE_CHECKING:
    from engine.runtime.context import NodeContext

log = logging.getLogger("quorra.engine")


class Hibernation:
    """The node's idle sweep, and the sleep and wake of its replicas."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx
        self.order: list[str] = []
        """The names the current round of sweeps goes through: those awake at its start."""
        self.cursor = 0
        self.slept = 0
        self.woken = 0
        self.restored = 0
        """Replicas brought back asleep at start (``restore``)."""

    def start(self) -> None:
        """Run the sweep until the node stops (``Node.start``)."""
        self.ctx.spawn(self._sweeping())

    async def _sweeping(self) -> None:
        ctx = self.ctx
        limits = ctx.limits
        catch_up_ms = min(limits.queue_sleep_catch_up_ms, limits.queue_sleep_sweep_ms)
        wait_ms = limits.queue_sleep_sweep_ms
        while True:
            await asyncio.sleep(wait_ms / 1000)
            wait_ms = limits.queue_sleep_sweep_ms
            if not ctx.running or ctx.stopping:
                continue
            slept = self.sweep(ctx.clock.monotonic_ms())
            if slept >= limits.queue_sleep_sweep_max:
                wait_ms = catch_up_ms  # more are idle: see ``Limits.queue_sleep_catch_up_ms``
            ctx.memory.freed_in_bulk(slept)

    def sweep(self, now_ms: int) -> int:
        """Look at the next few replicas: those idle long enough fall asleep, those that
        need a checkpoint first are given one (see ``Limits.queue_sleep_sweep_ms`` for how
        many it looks at). How many fell asleep."""
        ctx = self.ctx
        limits = ctx.limits
        if self.cursor >= len(self.order):
            # Only the queues awake now: with thousands asleep and an idle time of one
            # sweep, a round that went through every name cost more than its looks.
            awake = [name for name, rep in ctx.replicas.items() if rep.dormant is None]
            self.order, self.cursor = awake, 0
        # Each queue looked at about once per idle time: a look is a few field reads.
        per_idle = limits.queue_sleep_idle_ms // limits.queue_sleep_sweep_ms
        looks = len(self.order) // max(1, per_idle) + 1
        slept = 0
        while self.cursor < len(self.order) and looks and slept < limits.queue_sleep_sweep_max:
            name = self.order[self.cursor]
            self.cursor += 1
            looks -= 1
            rep = ctx.replicas.get(name)
            if rep is None or rep.dormant is not None:
                continue
            if rep.touched:
                rep.touched, rep.quiet_since_ms = False, now_ms
                continue
            if now_ms - rep.quiet_since_ms < limits.queue_sleep_idle_ms or not self.idle(rep):
                continue
            if ctx.checkpoints.checkpoint_due(rep):
                # Checkpointed first, so that neither a stop nor a restart has to apply
                # its log again, and compacted (the segments its wakes wrote); it sleeps
                # at a later sweep.
                cp = ctx.checkpoints.capture(rep, rep.applied_index, rep.applied_term)
                ctx.spawn(ctx.checkpoints.auto_checkpoint(rep, cp, None))
                continue
            self.sleep(rep)
            slept += 1
        return slept

    def idle(self, rep: Replica) -> bool:
        """Whether ``rep`` (awake) may sleep now: see the module's rules."""
        ctx = self.ctx
        if rep.closed or rep.failed is not None or rep.meta.members != (ctx.name,):
            return False
        if rep.scheduled or rep.proposals or rep.waiting or rep.installed_live:
            return False
        if rep.available_waiters or rep.leader_waiters or rep.inflight_publish_bytes:
            return False
        if rep.building_snapshot or rep.reading_ahead or rep.live_build is not None:
            return False
        if (rep.meta_task is not None and not rep.meta_task.done()) or rep.disk_busy:
            return False
        driver = rep.driver
        machine = driver.machine
        if not may_sleep(machine):  # first: a consumer holding leases is the usual case
            return False
        raft = driver.raft
        if raft.role is not Role.LEADER or raft.has_ready() or raft.uncommitted:
            return False
        if driver.writes_pending() or driver.after_persist:
            return False
        last = raft.log.last_index()
        if raft.commit != last or driver.applied_index != last:
            return False
        pager = machine.pager
        return pager is None or pager.paged_out_pages() == 0

    def sleep(self, rep: Replica) -> None:
        """Swap ``rep``'s machine, core and driver for its record."""
        ctx = self.ctx
        driver = rep.driver
        live = observe.live_indexes(rep)
        record = put_to_sleep(driver.machine, raft_positions(driver.raft))
        dormant = Dormant(record, driver.applied_index, driver.applied_term, live.serialize())
        driver.machine.close()  # its resident pages stop counting against the node
        rep.log.forget_reads()  # and its blocks of segment reads
        for handle in (rep.tick_handle, rep.expire_handle):
            if handle is not None:
                handle.cancel()
        rep.tick_handle = rep.expire_handle = None
        rep.fall_asleep(dormant)
        self.pack_log(rep)
        ctx.pages.pack(rep.uid)
        self.slept += 1

    def pack_log(self, rep: Replica) -> None:
        """Have the node's storage keep the log of ``rep`` (asleep) packed (or once the
        entries its mem table holds are flushed, if they are more than a few)."""
        self.ctx.storage.pack_log(rep.uid)

    def log_view(self, rep: Replica) -> ServerLog:
        return self.ctx.storage.log_view(rep.uid)

    def log_reads(self, rep: Replica) -> tuple[int, int]:
        return self.ctx.storage.log_reads(rep.uid)

    def at_stop(self) -> list[Sleeper]:
        """At a clean stop, before the replicas close: every lone voter idle now falls
        asleep (whatever its idle time; up to ``observe.LIVE_SET_INLINE_MAX`` messages),
        and the records of all those asleep, which the stop saves for the next start
        (``engine.runtime.sleepers``)."""
        ctx = self.ctx
        out: list[Sleeper] = []
        for rep in ctx.replicas.values():
            if rep.closed or rep.failed is not None or rep.meta.members != (ctx.name,):
                continue
            if rep.dormant is None:
                if not self.idle(rep):
                    continue
                if ctx.checkpoints.checkpoint_due(rep):
                    continue  # not checkpointed at the stop (it failed): replayed instead
                s = rep.machine.stats()
                if s.messages_ready > observe.LIVE_SET_INLINE_MAX:
                    # Its live set would be walked on the loop (a deep queue's is built
                    # on a worker), its record be its whole index: it restarts from its
                    # checkpoint, as before.
                    continue
                self.sleep(rep)
            assert rep.dormant is not None
            pages = ctx.pages.packed(rep.uid)
            out.append(Sleeper(rep.uid, rep.dormant, rep.bytes_since_capture, pages))
        return out

    def restore(self, meta: QueueMeta, rec: Recovered, sleeper: Sleeper) -> Replica:
        """At start, ``Hosting.host`` of a queue whose opened storage agrees with the record
        it slept as at the last clean stop (``sleepers.matches``): the replica, asleep as
        it was, without a machine, core or driver, made from the record's packed forms
        (neither the record nor its page files are unpacked, nor its checkpoint's state
        read: a start with 10,000 sleeping queues spent a second on those)."""
        ctx = self.ctx
        cp = rec.checkpoint
        checkpoint = NO_CHECKPOINT
        if cp is not None:
            checkpoint = CheckpointInfo(cp.index, 0, cp.file_bytes)
        ctx.pages.restore_packed(meta.uid, sleeper.pages)
        assert ctx.receipt_key is not None, "start() loads the key before hosting"
        seal = ReceiptSeal(ctx.receipt_key, meta.uid)
        sid = server_id(ctx.name, meta.uid)
        rep = Replica(meta, sid, rec.log, seal, checkpoint=checkpoint)
        rep.hibernation = self
        rep.bytes_since_capture = sleeper.bytes_since_capture
        rep.fall_asleep(sleeper.dormant)
        ctx.replicas[meta.name] = rep
        ctx.by_uid[meta.uid] = rep
        self.pack_log(rep)
        self.restored += 1
        return rep

    def wake(self, rep: Replica) -> None:
        """Rebuild ``rep``'s machine, core and driver from its record, as ``Hosting.host``
        does from a checkpoint: the machine restored at the applied index, the core from
        the positions. The core leads again in its term at once, without an election
        (``RaftServer.resume_as_sole_leader``: it slept a lone voter that led with every
        entry it appended stored, and its record matches its durable log and hard
        state); one that may not campaigns at once."""
        ctx = self.ctx
        dormant = rep.dormant
        assert dormant is not None and not rep.closed
        record, live = dormant.unpacked()
        pos = record.raft
        assert pos is not None, "a hosted replica sleeps with its positions"
        server_log = ctx.storage.log(rep.uid)  # unpacked again, if it was packed
        machine = wake(record, ctx.limits, ctx.pages.paging_again(rep.uid, server_log))
        config = pos.configuration
        snap_index = server_log.snapshot_index()
        snapshot = None
        if snap_index:  # the core reads only its index and term; the log is unchanged
            snapshot = SnapshotMeta(snap_index, server_log.snapshot_term(), config)
        base = SnapshotMeta(dormant.applied_index, dormant.applied_term, config)
        now, wall = ctx.clock.monotonic_ms(), ctx.clock.wall_ms()
        options = RaftOptions(
            rep.server_id, SplitMix64(ctx.hosting.rng.getrandbits(64)), ctx.limits
        )
        raft = RaftServer(
            options,
            server_log,
            RaftHardState(pos.term, pos.vote, pos.commit),
            snapshot,
            config,
            max(0, now - ctx.limits.election_timeout_ms_max),  # campaigns at its first tick
            base,
            wall_ms=wall,
        )
        driver = ReplicaDriver(
            raft,
            machine,
            ReplicaIo(ctx, rep),
            base_index=dormant.applied_index,
            replay_until=server_log.last_index(),
            hard_state_written=(pos.term, pos.vote),
        )
        # Where it stands until it applies again: a queue woken without an election
        # applies nothing before it may sleep again (a browse), and sleeps as it was.
        driver.applied_term = dormant.applied_term
        rep.wake_with(driver, server_log)
        observe.seed_live_set(rep, dormant.applied_index, BitMap64.deserialize(live))
        if not raft.resume_as_sole_leader():
            raft.step(Tick(now, wall))  # campaigns at once
        self.woken += 1
        ctx.hosting.schedule(rep)


__all__ = ["Hibernation"]
