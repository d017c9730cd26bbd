"""Hosting: a node's replicas on its event loop, their storage and their Raft traffic.

Rule: every replica's core and machine change only on the loop. An event (a proposal,
a Raft message, a timer, a finished WAL batch) is stepped into the core at once, and
the replica is scheduled for one ``process`` on the next turn of the loop, so that the
proposals of one turn become one ``Ready`` and one WAL append. ``process`` hands the
``Ready`` to the replica's driver (``engine.runtime.driver``), which calls back the
replica's ``ReplicaIo`` (``engine.runtime.group_io``): writes go to the shared WAL,
messages to the transport, applied entries to ``effects``. The WAL writer thread hands
finished batches back in order (``on_wal_batch_threadsafe``); each tells the driver
which write is durable.

A replica whose storage failed refuses further writes (``fail``); one that read damaged
data stops serving and is repaired from its peers at the next start (``damaged``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from pyroaring import BitMap64

from engine.errors import (
    Backpressure,
    EntryDamaged,
    NoLeader,
    OutcomeUnknown,
    QueueConflict,
    QuorraError,
    StorageFailed,
)
from engine.ids import ServerId
from engine.publish_trace import Stage
from engine.queue import QueueMachine, ReceiptSeal
from engine.queue.snapshots import page_handles, read_snapshot
from engine.raft.config import EMPTY_CONFIGURATION, Configuration
from engine.raft.entry import Entry
from engine.raft.events import (
    Event,
    SnapshotInstalled,
    Tick,
)
from engine.raft.events import HardState as RaftHardState
from engine.raft.events import Persisted as RaftPersisted
from engine.raft.events import Rejected as RaftRejected
from engine.raft.options import SplitMix64
from engine.raft.server import RaftOptions, RaftServer, Role
from engine.raft.snapshot import Snapshot, SnapshotMeta
from engine.runtime import observe
from engine.runtime.driver import ReplicaDriver
from engine.runtime.group_io import ReplicaIo
from engine.runtime.meta import QueueMeta, policy_of
from engine.runtime.replica import NO_CHECKPOINT, CheckpointInfo, Replica, server_id
from engine.runtime.sleepers import Sleeper, matches
from engine.shared_empty import check_shared_empties
from engine.storage import (
    Checkpoint,
    HardStateSaved,
    Persisted,
    Removed,
    ServerLog,
    SnapshotReset,
    WalBatch,
    WriteFailed,
    checkpoint_of,
)

if TYPE_CHECKING:
    from engine.runtime.context import NodeContext

log = logging.getLogger("quorra.engine")


class Hosting:
    """Opens, drives and closes the replicas of a node."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx
        self.rng = random.Random()
        """Seeds each replica's core (election timeouts)."""
        self.batches: deque[WalBatch] = deque()
        """Finished WAL batches handed over by the writer thread, in order."""
        self.drain_scheduled = False
        """A ``drain_batches`` is scheduled on the loop and has not started: a batch the
        writer hands over meanwhile is taken by it, without a wake-up of its own."""
        self.flush_task: asyncio.Task[None] | None = None
        self.wake_loop: Callable[[], None] | None = None
        """Wakes the loop for a drain with the GIL released (``LoopWakeup.set``), once
        the node runs; ``call_soon_threadsafe`` otherwise."""

    # --- opening and closing -----------------------------------------------------------

    def host(self, meta: QueueMeta, sleeper: Sleeper | None = None) -> Replica:
        """Open the replica's storage, restore its machine and start its Raft server; or,
        given the record it slept as at the last clean stop and a log that agrees with
        it, bring it back asleep (``engine.runtime.sleepers``)."""
        ctx = self.ctx
        storage = ctx.storage
        # A lone member cannot be repaired: damage then refuses it, its files untouched.
        asleep_at = None if sleeper is None else sleeper.dormant.applied_index
        rec = storage.open_server(meta.uid, repairable=len(meta.members) > 1, asleep_at=asleep_at)
        if sleeper is not None and meta.members == (ctx.name,) and matches(sleeper, rec):
            return ctx.hibernation.restore(meta, rec, sleeper)
        # Read once: a deep queue's checkpoint names thousands of stored pages, which
        # the page files keep and the machine restores. The state may be a view of a
        # mapped file: it is read where it lies, not copied.
        state = None if rec.checkpoint is None else read_snapshot(cast(bytes, rec.checkpoint.state))
        live = [] if state is None else page_handles(state)
        paging = ctx.pages.paging(meta.uid, rec.log, live)
        machine = QueueMachine(policy_of(meta.args, ctx.limits), ctx.limits, paging)
        base = 0
        checkpoint = NO_CHECKPOINT
        if rec.checkpoint is not None:
            assert state is not None
            machine.restore_state(state)
            base = rec.checkpoint.index
            checkpoint = CheckpointInfo(base, 0, rec.checkpoint.file_bytes)
        snapshot, checkpoint_meta = self.raft_metas(meta.uid, rec.log, rec.checkpoint)
        hs = rec.hard_state
        hard = None
        if hs is not None:
            vote = None if hs.vote is None else ServerId(hs.vote)
            hard = RaftHardState(hs.term, vote, hs.commit)
        sid = server_id(ctx.name, meta.uid)
        # A replica created to join an existing group starts with no configuration: it
        # neither votes nor campaigns until the leader's entries tell it the members.
        # Its own id is the one string of it (an idle queue keeps both).
        bootstrap = EMPTY_CONFIGURATION
        if ctx.name in meta.members:
            ids = (sid if n == ctx.name else server_id(n, meta.uid) for n in meta.members)
            bootstrap = Configuration(tuple(sorted(ids)))
        now, wall = ctx.clock.monotonic_ms(), ctx.clock.wall_ms()
        lone = meta.members == (ctx.name,)
        # A lone voter campaigns on its first tick instead of after an election timeout.
        start_ms = now - ctx.limits.election_timeout_ms_max if lone else now
        options = RaftOptions(sid, SplitMix64(self.rng.getrandbits(64)), ctx.limits)
        if rec.repairing:
            log.warning("queue %s: repairing from its peers: %s", meta.name, rec.repair_reason)
        raft = RaftServer(
            options,
            rec.log,
            hard,
            snapshot,
            bootstrap,
            max(0, start_ms),
            checkpoint_meta,
            repair=rec.repairing,
            wall_ms=wall,
        )
        assert ctx.receipt_key is not None, "start() loads the key before hosting"
        seal = ReceiptSeal(ctx.receipt_key, meta.uid)
        rep = Replica(meta, sid, rec.log, seal, checkpoint=checkpoint)
        rep.hibernation = ctx.hibernation
        rep.driver = ReplicaDriver(
            raft,
            machine,
            ReplicaIo(ctx, rep),
            base_index=base,
            replay_until=rec.log.last_index(),
            hard_state_written=(0, None) if hs is None else (hs.term, hs.vote),
        )
        if rec.checkpoint is not None:  # stats must not walk a deep queue at start
            observe.seed_live_set(rep, base, rec.checkpoint.live_indexes)
        if lone:
            raft.step(Tick(now, wall))
        ctx.replicas[meta.name] = rep
        ctx.by_uid[meta.uid] = rep
        return rep

    def raft_metas(
        self, uid: str, server_log: ServerLog, cp: Checkpoint | None
    ) -> tuple[SnapshotMeta | None, SnapshotMeta | None]:
        """Where the core starts: the snapshot's and the restored checkpoint's index, term
        and configuration. No live entry is read: a restart does not grow with depth."""
        index = server_log.snapshot_index()
        snapshot = None
        if index:
            if cp is not None and cp.index == index:
                config = Configuration.decode(cp.config)
            else:  # the configuration only: no page is read into the state
                config = Configuration.decode(self.stored_snapshot(uid, index).config)
            snapshot = SnapshotMeta(index, server_log.snapshot_term(), config)
        checkpoint = None
        if cp is not None and cp.index >= index:
            checkpoint = SnapshotMeta(cp.index, cp.term, Configuration.decode(cp.config))
        return snapshot, checkpoint

    def raft_snapshot(self, uid: str, index: int) -> Snapshot | None:
        """The storage snapshot as the core ships it to a follower that lags behind it:
        the checkpoint only; the core reads the live entries the follower lacks. The
        pages it names are read into it here, on the loop: a queue's replicas build it
        with ``stored_snapshot`` and ``snapshot_of`` instead, the pages read by a worker
        (``Timers.maybe_offer_snapshot``)."""
        if index == 0:
            return None
        cp = self.stored_snapshot(uid, index)
        return self.snapshot_of(cp, self.ctx.pages.sendable(uid, bytes(cp.state)))

    def stored_snapshot(self, uid: str, index: int) -> Checkpoint:
        """The checkpoint of the storage snapshot at ``index`` (``StorageFailed`` if it
        is not that one or unreadable)."""
        cp = self.ctx.storage.checkpoints(uid).read_snapshot()
        if cp is None or cp.index != index:
            raise StorageFailed(f"queue {uid}: snapshot at {index} unreadable")
        return cp

    @staticmethod
    def snapshot_of(cp: Checkpoint, state: bytes) -> Snapshot:
        """The core's snapshot of checkpoint ``cp``, with ``state`` as a follower is sent
        it (``Pages.sendable``)."""
        config = Configuration.decode(cp.config)
        return Snapshot(cp.index, cp.term, config, state, cp.live_indexes)

    async def await_recovered(self) -> None:
        """Wait until every replica has applied what it knows committed, and a lone
        replica has also led once (its whole log is committed then), up to the limit."""
        ctx = self.ctx
        loop = ctx.loop
        deadline = loop.time() + ctx.limits.leader_wait_ms / 1000

        def recovered(rep: Replica) -> bool:
            if rep.failed is not None or rep.closed or rep.dormant is not None:
                return True  # one brought back asleep recovers at its wake
            raft = rep.raft
            if rep.meta.members == (ctx.name,):
                return raft.role is Role.LEADER and rep.applied_index >= raft.log.last_index()
            return rep.applied_index >= raft.commit

        # Only those not yet recovered are looked at again: a poll over every replica
        # of a node of 10,000 queues, each 5 ms, would take the loop from the recovery.
        waiting = list(ctx.replicas.values())
        while waiting := [rep for rep in waiting if not recovered(rep)]:
            if loop.time() > deadline:
                log.warning("start: some queues are still recovering")
                return
            await asyncio.sleep(ctx.limits.poll_interval_ms / 1000)

    @staticmethod
    def close_replica(rep: Replica, error: QuorraError) -> None:
        rep.closed = True
        rep.close_error = error
        if rep.dormant is None:  # a sleeping one closed its machine as it fell asleep
            rep.machine.close()  # its resident pages stop counting against the node
        for handle in (rep.tick_handle, rep.expire_handle):
            if handle is not None:
                handle.cancel()
        for p in [*rep.proposals.values(), *rep.waiting.values()]:
            if not p.future.done():
                p.future.set_exception(error)
        rep.proposals.clear()
        rep.waiting.clear()
        for f in [*rep.available_waiters, *rep.leader_waiters]:
            if not f.done():
                f.set_result(None)
        check_shared_empties()

    # --- the Raft loop -----------------------------------------------------------------

    def schedule(self, rep: Replica) -> None:
        if not rep.scheduled and not rep.closed:
            rep.scheduled = True
            self.ctx.loop.call_soon(self.process, rep)

    def process(self, rep: Replica, *, proposed: bool = False) -> None:
        """Act on the core's ``Ready``, then on what it changed: the replica's rates,
        read-ahead, members, role and timers (its tail).

        ``proposed``: right after a proposal, whose entry this call submits to an idle
        WAL. The tail then waits for that write's completion, which processes the
        replica again (``on_wal_batch``) and sees whatever this call changed: with one
        publish at a time the tail ran twice per message, the first time with nothing
        applied, between the submit and the loop's wait, while the woken writer may need
        the GIL. Not when the role, leader or term changed: that is acted on at once."""
        rep.scheduled = False
        rep.touched = True  # not idle: the idle sweep starts its count again
        if rep.closed or isinstance(rep.failed, EntryDamaged):
            return
        ctx = self.ctx
        raft = rep.raft
        driver = rep.driver
        try:
            driver.process()
        except EntryDamaged as e:
            self.damaged(rep, e)
            return
        except StorageFailed as e:
            self.fail(rep, e)
            return
        if (
            proposed
            and driver.writes_pending()
            and rep.seen == (int(raft.role), raft.leader, raft.term)
        ):
            return
        rep.sample(ctx.clock.monotonic_ms(), ctx.limits)
        ctx.pages.maybe_read_ahead(rep)
        ctx.membership.maybe_members_changed(rep)
        seen = (int(raft.role), raft.leader, raft.term)
        if seen != rep.seen:
            became_leader = raft.role is Role.LEADER and rep.seen[0] != int(Role.LEADER)
            if rep.seen[0] == int(Role.LEADER) and raft.role is not Role.LEADER:
                self.leadership_lost(rep)
            rep.seen = seen
            for f in rep.leader_waiters:
                if not f.done():
                    f.set_result(None)
            rep.leader_waiters.clear()
            if became_leader:
                rep.expire_inflight = False
        ctx.timers.arm_tick(rep)
        if raft.role is Role.LEADER:
            ctx.timers.arm_expire(rep)

    def leadership_lost(self, rep: Replica) -> None:
        """This replica stopped leading. What it proposed may still commit under the next
        leader (then the caller gets its answer as the entry applies here) or be lost;
        after an election timeout without an answer this node cannot tell, and each
        caller learns so (``OutcomeUnknown``: 503, retry with the same dedup id) rather
        than at its proposal timeout, as when the leader was cut off in a minority."""
        pending = [*rep.proposals.values(), *rep.waiting.values()]
        if not pending:
            return

        def give_up() -> None:
            for p in pending:
                if not p.future.done():
                    p.future.set_exception(
                        OutcomeUnknown(f"queue {rep.name}: its leader stepped down; retry")
                    )

        self.ctx.loop.call_later(self.ctx.limits.election_timeout_ms_max / 1000, give_up)

    def install(self, rep: Replica, snap: Snapshot, given: list[Entry]) -> None:
        """A snapshot from the leader replaces this replica's log and state. ``given`` are
        the live entries this replica lacked; storage keeps the others it holds."""
        storage = self.ctx.storage
        # Until SnapshotReset the log view drops its segments: serve the live entries
        # from memory meanwhile (storage reads the held ones to write them anyway).
        installed = {e.index: e for e in given}
        for index in snap.live_indexes - BitMap64(installed):
            installed[index] = rep.log.read(index)
        cp = checkpoint_of(snap, QueueMachine.version)
        size = storage.install_snapshot(rep.uid, cp, given)
        self.ctx.pages.retain(rep)  # the checkpoints are gone, and what they pinned
        rep.installed_live = installed
        rep.checkpoint = CheckpointInfo(snap.index, self.ctx.clock.wall_ms(), size)
        observe.seed_live_set(rep, snap.index, snap.live_indexes)

    @staticmethod
    def on_rejected(rep: Replica, rej: RaftRejected) -> None:
        if rej.request_id == 0:
            return
        p = rep.proposals.pop(rej.request_id, None)
        if p is None or p.future.done():
            return
        if rej.reason == "backpressure":
            p.future.set_exception(Backpressure(f"queue {rep.name}: too many uncommitted bytes"))
        elif rej.reason == "change_pending":
            p.future.set_exception(
                QueueConflict(f"queue {rep.name}: another membership change is in progress")
            )
        else:
            p.future.set_exception(NoLeader(f"queue {rep.name}: {rej.reason}"))

    # --- durability --------------------------------------------------------------------

    def on_wal_batch_threadsafe(self, batch: WalBatch) -> None:
        """In the writer thread: hand the batch over in order (deque appends are atomic),
        waking the loop only if no drain is scheduled yet. The batch is appended before
        the flag is read and the drain clears the flag before it takes any batch, so a
        batch is either seen by a drain still to come or schedules one."""
        self.batches.append(batch)
        if self.drain_scheduled:
            return
        self.drain_scheduled = True
        wake = self.wake_loop
        if wake is not None:
            wake()
            return
        loop = self.ctx.loop
        with contextlib.suppress(RuntimeError):  # the loop closed after a halt
            loop.call_soon_threadsafe(self.drain_batches)

    def write_lone(self, rep: Replica) -> None:
        """The turn after a lone proposal of ``rep`` was submitted to an idle WAL with
        its writer held (``NodeContext.propose``): if nothing came after it (``rep`` not
        scheduled again, no publish group gathering its next entry, no batch of the
        thread's waiting), write and sync it here, on
        the loop (``WalWriter.write_now``), and complete it at once; else, or when the
        writer declines, let the thread write it. Meanwhile the loop does nothing else:
        no socket is read and no timer runs for the length of one small sync, after
        which what came meanwhile is read and goes to the writer thread together. Work
        seen waiting goes to the thread, whose sync it overlaps: under load the loop
        then keeps preparing the next batch while the disk writes this one."""
        ctx = self.ctx
        writer = ctx.writer
        assert writer is not None
        batch = None
        try:
            if not rep.scheduled and rep.publish_group is None and not self.batches:
                batch = writer.write_now(self._in_order)
        finally:
            writer.release()
        if batch is not None:
            trace = ctx.trace
            if trace is not None:
                trace.stamp(Stage.ON_LOOP)
            self.on_wal_batch(batch)

    def _in_order(self) -> bool:
        """No batch of the writer thread waits for the loop (asked with its turn held)."""
        return not self.batches

    def drain_batches(self) -> None:
        self.drain_scheduled = False
        trace = self.ctx.trace
        if trace is not None:
            trace.stamp(Stage.ON_LOOP)
        while self.batches:
            self.on_wal_batch(self.batches.popleft())

    def on_wal_batch(self, batch: WalBatch) -> None:
        ctx = self.ctx
        storage = ctx.storage
        # Each replica's operations the batch made durable go to its driver in one call
        # (``written_all``), which merges their append acknowledgements.
        durable: dict[str, tuple[Replica, list[Event | None]]] = {}
        for event in storage.complete(batch):
            if isinstance(event, Removed):
                waiter = ctx.removed.get(event.uid)
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)
                continue
            group = ctx.meta_group
            if group is not None and event.uid == group.uid:
                group.on_storage_event(event)
                continue
            rep = ctx.by_uid.get(event.uid)
            if rep is None or rep.closed:
                continue
            if isinstance(event, WriteFailed):
                _written(durable.get(rep.uid))
                self.fail(rep, event.error)
                continue
            entry = durable.get(rep.uid)
            if entry is None:
                entry = durable[rep.uid] = (rep, [])
            if isinstance(event, Persisted):
                entry[1].append(RaftPersisted(event.index, event.term))
            elif isinstance(event, SnapshotReset):
                entry[1].append(SnapshotInstalled(event.index, event.term))
                _written(entry)
                rep.installed_live.clear()  # storage holds them now
            else:
                assert isinstance(event, HardStateSaved)
                entry[1].append(None)
        # Processed now, not at the next turn of the loop: what this batch made durable
        # commits, applies and answers its callers without waiting for another turn.
        for entry in durable.values():
            _written(entry)
            rep = entry[0]
            if not rep.scheduled:
                self.process(rep)
        if storage.rolled_wal_files() and self.flush_task is None and ctx.running:
            self.flush_task = ctx.loop.create_task(self.flush_segments())

    async def flush_segments(self) -> None:
        ctx = self.ctx
        storage = ctx.storage
        flushed = 0
        try:
            while (flush := storage.prepare_segment_flush(self.follows)) is not None:
                await ctx.in_worker(flush.write)
                flushed += len(flush.written)
                if storage.show_flushed(flush):
                    # The WAL file's delete and its directory's sync, off the loop: the
                    # file stays rolled until both are done.
                    await ctx.in_worker(flush.remove_wal_file)
                    storage.wal_file_removed(flush)
        except StorageFailed as e:
            # Nothing is lost: the entries stay in the mem tables and the WAL file stays;
            # the next finished WAL batch tries again.
            log.error("segment flush failed: %s", e.detail)
        finally:
            self.flush_task = None
            ctx.memory.freed_in_bulk(flushed)

    def follows(self, uid: str) -> bool:
        """Whether this node holds a follower's copy of queue ``uid``: nothing reads its
        new segments here unless it comes to lead, so they are written past the page
        cache (``plan_segment_flush``)."""
        rep = self.ctx.by_uid.get(uid)
        return rep is not None and rep.leader_id != rep.server_id

    def damaged(self, rep: Replica, error: EntryDamaged) -> None:
        """A read met damaged data: the repair is recorded and the replica stops serving
        (a leader so steps down: it no longer sends heartbeats); the next start of the
        node opens it in repair mode, repaired from its peers."""
        if rep.failed is not None:
            return  # recorded already: a second record would reset the replica
        try:
            self.ctx.storage.mark_damaged(rep.uid, error)
        except StorageFailed as e:
            log.error("queue %s: the repair could not be recorded: %s", rep.name, e.detail)
        detail = f"{error.detail}; repaired from its peers at the next start"
        self.fail(rep, EntryDamaged(detail, index=error.index))

    @staticmethod
    def fail(rep: Replica, error: Exception) -> None:
        """The disk refused a write of this queue: it refuses further writes."""
        if rep.failed is not None:
            return
        log.error("queue %s: storage failed: %s", rep.name, error)
        rep.failed = error if isinstance(error, StorageFailed) else StorageFailed(str(error))
        for p in [*rep.proposals.values(), *rep.waiting.values()]:
            if not p.future.done():
                p.future.set_exception(rep.failed)
        rep.proposals.clear()
        rep.waiting.clear()


def _written(entry: tuple[Replica, list[Event | None]] | None) -> None:
    """Hand a replica's driver the operations gathered for it, if any (and forget them)."""
    if entry is not None and entry[1] and not entry[0].closed:
        entry[0].driver.written_all(entry[1])
        entry[1].clear()


__all__ = ["Hosting"]
