"""The asyncio node: hosts many queue replicas and implements ``QueueEngine``.

How it runs (one event loop, two kinds of helper threads):

* **Loop.** Every replica's ``RaftServer`` and ``QueueMachine`` change only here. An
  event (a proposal, a Raft message, a timer, a finished WAL batch) is stepped into the
  core at once, and the replica is scheduled for one ``process`` on the next turn of the
  loop, so the proposals of one turn become one ``Ready`` and one WAL append.
* **Ready**, in the order of ``engine.raft.events``: hard state and entries are queued
  in the shared WAL; ``messages`` go out; committed entries apply to the machine, which
  resolves the futures of their proposals and runs effects; ``messages_after_persist``
  wait until every WAL operation queued before them is durable.
* **WAL writer thread** (``WalWriter``): group commit of every pending operation of
  every queue, one write and one fdatasync; the batch comes back to the loop, which
  updates the mem tables, steps ``Persisted`` and releases waiting messages. Nothing is
  acknowledged before the leader's own copy is fsynced and a quorum has it.
* **Workers** (the default executor): segment flushes after a WAL roll, checkpoint
  files, compactions, queue definitions. Each is prepared on the loop, touches only the
  disk in the worker and is finished on the loop (storage is the loop's alone); a stop
  waits for every worker before it closes storage.
* **Timers**, per replica and only when needed: a Raft tick at the core's next deadline
  (heartbeats on a leader with followers, the election timeout on a follower; none for
  a lone leader) and the machine's next deadline on the leader, which proposes
  ``encode_expire()``. An idle single-replica queue costs no work at all.

A client call on a replica that does not lead is forwarded to the leader's node through
the transport (one hop); while no leader is known it waits up to
``Limits.leader_wait_ms`` and then raises ``NoLeader``. Before each proposal the core is
ticked with the node's clocks, because the core stamps entries with the last wall time it saw.

Checkpoints: ``CheckpointRequest`` serialises the machine before the next entry applies
(every replica; also once ``Limits.replay_bytes_max`` of the log has applied since the
last one, which bounds what a restart applies again, and at a clean stop, so that the
next start applies next to nothing), the file is written by a worker, then
``ReleaseCursor`` promotes it to the snapshot and compaction drops the dead entries.
The core learns of that snapshot only when a follower lags behind it: the checkpoint is
then loaded (no payload) and shipped in chunks, then the core reads from the log only
the live entries the follower says it lacks.

Recovery: every ``queues/<uid>/queue.meta`` names a replica; its machine is restored
from the newest checkpoint and the committed entries after it are applied again (their
leader-only effects dropped); ``start`` returns once that is done. The core starts from
the snapshot's and the checkpoint's index, term and configuration only: no live entry
is read, so a restart does not grow with the depth of the queue.

Where each part lives: ``hosting`` (opening replicas, the Raft loop, WAL batches),
``applying`` (effects), ``timers``, ``routing`` (the leader's node; the typed calls
between nodes), ``queue_ops`` (publish, receive, settle, browse, purge), ``catalog``
(queue definitions), ``member_changes`` (members and leadership),
``dead_letter_routing``, ``checkpoints`` (checkpoints and compaction), ``observe``
(stats), ``receiving`` (the checks on peers' Raft messages), ``cluster_view`` (what
the node tells of its cluster). They share the node's ``NodeContext`` (``context``: its
state and the operations every part uses); ``Node`` runs the lifecycle and implements
``QueueEngine`` by delegating to them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from engine.cluster import meta_commands as mc
from engine.cluster.records import NodeState
from engine.cluster.rejoin import heard_refusal, lost_data_refusal
from engine.errors import Conflict, EntryDamaged, NoLeader, QuorraError
from engine.ids import NodeName
from engine.limits import DEFAULT_LIMITS, Limits
from engine.node_key import receipt_key
from engine.publish_trace import PublishTrace
from engine.raft.messages import Message
from engine.raft.role import Role
from engine.runtime import observe
from engine.runtime.api import (
    BrowsedMessage,
    CheckpointRecord,
    CompactionPhase,
    CompactionRecord,
    HistorySource,
    LeaderHistory,
    PublishItem,
    QueueArgs,
    QueueEngine,
    QueueInfo,
    ReceivedBatch,
    ReceivedMessage,
    RecordListener,
    SegmentInfo,
    SettleResult,
    Trigger,
)
from engine.runtime.clock import SYSTEM_CLOCK, Clock
from engine.runtime.cluster_view import cluster_view, placed_on
from engine.runtime.context import NodeContext
from engine.runtime.leader_history import leader_history
from engine.runtime.leader_stats import LedStats, leader_stats
from engine.runtime.meta_group import MetaBootstrap, MetaGroup
from engine.runtime.replica import node_of
from engine.runtime.routing import CheckpointCall, CompactCall, NodeCall, SegmentsCall
from engine.runtime.sleepers import Sleeper, encode_sleepers, write_sleepers
from engine.runtime.transport import LocalTransport, PeerBook, Transport
from engine.runtime.wal_writer import LoopWakeup, WalWriter
from engine.storage import NodeStorage
from engine.storage.read_cache import ReadCacheStats
from engine.storage.wal_stats import WalStats

log = logging.getLogger("quorra.engine")


class Node:
    """One Quorra node. ``Node(data_dir)`` alone is a single-node cluster."""

    def __init__(
        self,
        data_dir: Path | str,
        *,
        node_name: str = "node-1",
        limits: Limits = DEFAULT_LIMITS,
        transport: Transport | None = None,
        receipt_key: bytes | None = None,
        clock: Clock = SYSTEM_CLOCK,
        cluster: MetaBootstrap | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.clock = clock
        """Timers count on its monotonic clock; entries are stamped with its wall clock."""
        self.name = NodeName(node_name)
        self.limits = limits
        self.transport: Transport = transport or LocalTransport(node_name)
        assert self.name in self.transport.nodes(), "the transport knows this node"
        self.context = NodeContext(
            self.data_dir, self.name, limits, clock, self.transport, receipt_key
        )
        """The node's state and parts (``engine.runtime.context``)."""
        if cluster is not None:
            # A cluster node: the metadata group decides which queues exist, and the
            # reconcile loop makes this node's replicas follow it.
            self.context.meta_group = MetaGroup(self.context, cluster)
        self.led_stats = LedStats(self.context)
        """The leaders' stats of the queues this node follows (``engine.runtime.leader_stats``)."""
        self._heard_ms: dict[str, int] = {}
        """Monotonic time of the last Raft message from each node."""
        self.on_forgotten: Callable[[str], None] | None = None
        """Called once, with a message for the operator, when the metadata says this node
        was forgotten (its replicas replaced): the server then refuses to go on."""
        self.forgotten = False
        self._wake_loop: LoopWakeup | None = None
        """Wakes the loop for the writer's finished batches (``Hosting.wake_loop``)."""

    # === lifecycle ===================================================================

    async def start(self) -> None:
        ctx = self.context
        assert not ctx.has_storage, "a Node starts once; make a new one to restart"
        ctx.loop = asyncio.get_running_loop()
        ctx.create_lock = asyncio.Lock()
        if ctx.receipt_key is None:
            ctx.receipt_key = await asyncio.to_thread(receipt_key, self.data_dir)
        storage, metas, sleepers = await asyncio.to_thread(ctx.catalog.open_storage)
        storage.take_over()
        storage.wal.trace = ctx.trace
        ctx.storage = storage
        hosting = ctx.hosting
        for meta in metas:
            try:
                hosting.host(meta, sleepers.get(meta.uid))
            except QuorraError as e:
                log.error("queue %s (%s) not recovered: %s", meta.name, meta.uid, e.detail)
                ctx.failed[meta.name] = (meta, e)
        group = ctx.meta_group
        if group is not None:
            group.open()
            ctx.meta_members.learn_peers()  # the nodes its checkpoint holds
        wake_loop = LoopWakeup(ctx.loop, hosting.drain_batches, storage.wal.pending)
        hosting.wake_loop = wake_loop.set
        self._wake_loop = wake_loop
        ctx.writer = WalWriter(storage.wal, hosting.on_wal_batch_threadsafe)
        ctx.writer.start()
        ctx.running = True
        self.transport.attach(self.name, self)
        for rep in ctx.replicas.values():
            if rep.dormant is None:  # one brought back asleep waits for its first request
                hosting.schedule(rep)
        if isinstance(self.transport, PeerBook):
            self.transport.on_forgotten = self._told_forgotten
            self.transport.on_lost_data = self._told_lost_data
            if group is not None:
                self.transport.refuse_stale(self.stale_peer)
        if group is not None:
            group.listeners.append(self._maybe_forgotten)
            group.listeners.append(ctx.meta_members.on_change)
            group.schedule()
            ctx.reconciler.start()
            self.led_stats.start()
        ctx.hibernation.start()
        await hosting.await_recovered()

    async def stop(self) -> None:
        """Flush and close: everything queued reaches the WAL, rolled files reach segments."""
        await self._shutdown(abandon=False)

    async def halt(self) -> None:
        """Stop as a crash would: what the WAL writer has not taken is lost, nothing is
        flushed to segments. For failover tests; a later ``start`` recovers."""
        await self._shutdown(abandon=True)

    async def _shutdown(self, *, abandon: bool) -> None:
        ctx = self.context
        if not ctx.running:
            return
        if not abandon:
            await self._drain_requests()
            await ctx.checkpoints.before_stop()
        ctx.running = False
        self.transport.detach(self.name)
        ctx.reconciler.stop()
        if ctx.meta_group is not None:
            ctx.meta_group.close(NoLeader("the node is stopping"))
        hosting = ctx.hosting
        sleepers = [] if abandon else ctx.hibernation.at_stop()
        for rep in ctx.replicas.values():
            hosting.close_replica(rep, NoLeader("the node is stopping"))
        await ctx.end_work()
        assert ctx.writer is not None
        await asyncio.to_thread(ctx.writer.stop, abandon=abandon)
        if self._wake_loop is not None:
            self._wake_loop.close()  # the writer is gone: nothing sets it any more
        # Every batch the writer finished reaches the mem tables before a close flushes
        # them (a segment flush deletes the WAL file it came from).
        hosting.drain_batches()
        if hosting.flush_task is not None:
            await asyncio.gather(hosting.flush_task, return_exceptions=True)
        storage = ctx.storage
        if abandon:
            await asyncio.to_thread(_close_files, storage)
        else:
            await asyncio.to_thread(_close_storage, storage, sleepers)

    async def _drain_requests(self) -> None:
        """Refuse new requests, end long polls, and give those in flight a moment."""
        ctx = self.context
        ctx.stopping = True
        for rep in ctx.replicas.values():
            for f in rep.available_waiters:
                if not f.done():
                    f.set_result(None)
        loop = ctx.loop
        deadline = loop.time() + self.limits.stop_grace_ms / 1000
        while ctx.inflight_requests and loop.time() < deadline:
            await asyncio.sleep(self.limits.poll_interval_ms / 1000)

    def set_record_listener(self, listener: RecordListener | None) -> None:
        self.context.checkpoints.listener = listener

    def trace_publishes(self, trace: PublishTrace) -> None:
        """Stamp the stages of publishes into ``trace`` (a measuring aid); before ``start``."""
        assert not self.context.has_storage, "trace_publishes before start"
        self.context.trace = trace

    def trim_memory_with(self, trim: Callable[[], object]) -> None:
        """Call ``trim`` (on a worker) to give the C allocator's free memory back after
        the node freed much at once (``MemoryWatch.freed_in_bulk``)."""
        self.context.memory.trim = trim

    def set_history_source(self, source: HistorySource | None) -> None:
        """Where this node reads the history its peers ask of it (``HistoryCall``)."""
        self.context.checkpoints.history = source

    # === queues ======================================================================

    def queues(self) -> list[QueueInfo]:
        return self.context.catalog.queues()

    async def create_queue(self, name: str, args: QueueArgs) -> tuple[QueueInfo, bool]:
        return await self.context.catalog.create_queue(name, args)

    async def delete_queue(self, name: str) -> None:
        await self.context.catalog.delete_queue(name)

    async def update_policy(self, name: str, changes: dict[str, object]) -> QueueInfo:
        return await self.context.catalog.update_policy(name, changes)

    # === messages ====================================================================

    async def publish(
        self,
        name: str,
        messages: Sequence[PublishItem],
        on_durable: Callable[[], None] | None = None,
    ) -> list[int]:
        return await self.context.ops.publish(name, messages, on_durable)

    async def receive(
        self,
        name: str,
        *,
        consumer: str,
        max_messages: int,
        wait_ms: int,
        lease_ms: int | None,
    ) -> list[ReceivedMessage]:
        batch = await self.context.ops.receive(name, consumer, max_messages, wait_ms, lease_ms, [])
        return batch.messages

    async def ack_and_receive(
        self,
        name: str,
        *,
        ack: list[str],
        consumer: str,
        max_messages: int,
        wait_ms: int,
        lease_ms: int | None,
    ) -> ReceivedBatch:
        return await self.context.ops.receive(name, consumer, max_messages, wait_ms, lease_ms, ack)

    async def ack(self, name: str, receipts: list[str]) -> SettleResult:
        return await self.context.ops.ack(name, receipts)

    async def nack(self, name: str, receipts: list[str], *, requeue: bool) -> SettleResult:
        return await self.context.ops.nack(name, receipts, requeue)

    async def extend(self, name: str, receipts: list[str], lease_ms: int) -> SettleResult:
        return await self.context.ops.extend(name, receipts, lease_ms)

    async def browse(self, name: str, *, after: int | None, limit: int) -> list[BrowsedMessage]:
        return await self.context.ops.browse(name, after, limit)

    async def purge(self, name: str) -> int:
        return await self.context.ops.purge(name)

    # === membership and leadership ===================================================

    async def add_member(self, name: str, node: str) -> QueueInfo:
        """Add a replica of the queue on ``node`` (``POST /queues/{name}/members``): it
        joins as a learner, catches up, and becomes a voter; one change at a time."""
        return await self.context.membership.add_member(name, node)

    async def remove_member(self, name: str, node: str) -> QueueInfo:
        """Remove the queue's replica on ``node`` (``DELETE /queues/{name}/members/{node}``)."""
        return await self.context.membership.remove_member(name, node)

    async def transfer_leadership(self, name: str, node: str) -> None:
        """Hand the queue's leadership to its replica on ``node`` (``POST
        /queues/{name}/leader``); returns once that node leads, or raises ``NoLeader``."""
        await self.context.membership.transfer_leadership(name, node)

    # === checkpoints and compaction ==================================================

    async def checkpoint(self, name: str, *, trigger: Trigger = "manual") -> CheckpointRecord:
        """A checkpoint of the queue's replica here; on a cluster node without one, of
        its leader's (forwarded, as a client operation is)."""
        ctx = self.context
        if self._remote(name):
            record = await ctx.forwarder.forward(CheckpointCall(name))
            if not isinstance(record, CheckpointRecord):  # peer bytes: checked, not asserted
                raise NoLeader(f"queue {name}: its leader sent no checkpoint record")
            return record
        return await ctx.checkpoints.checkpoint(name, trigger)

    async def compact(
        self, name: str, *, phase: CompactionPhase = "auto", trigger: Trigger = "manual"
    ) -> CompactionRecord:
        """Storage compaction (``engine.storage.compaction``); see ``Checkpoints.compact``.
        On a cluster node without a replica of the queue, its leader's (forwarded)."""
        ctx = self.context
        if self._remote(name):
            record = await ctx.forwarder.forward(CompactCall(name, phase))
            if not isinstance(record, CompactionRecord):
                raise NoLeader(f"queue {name}: its leader sent no compaction record")
            return record
        return await ctx.checkpoints.compact(name, phase, trigger)

    def _remote(self, name: str) -> bool:
        """Whether queue ``name`` is served here by forwarding (no replica here)."""
        ctx = self.context
        return name not in ctx.replicas and ctx.forwarder.remote(name) is not None

    # === observation =================================================================

    def stats(self, name: str) -> dict[str, object]:
        ctx = self.context
        failed = ctx.failed.get(name)
        if failed is not None:
            return observe.failed_stats(failed[1])
        if name not in ctx.replicas and ctx.forwarder.remote(name) is not None:
            kept = ctx.forwarder.cached_stats(name)
            return remote_stats_unknown(name) if kept is None else kept
        rep = ctx.replica(name)
        led = None if ctx.meta_group is None else self.led_stats.stats_of(rep)
        if led is not None:
            return led  # a follower: its leader's, as last fetched
        return observe.queue_stats(rep, self.clock.monotonic_ms(), self.limits)

    async def fresh_stats(self, name: str) -> dict[str, object]:
        """``stats``, but asked of the queue's leader now when another node leads it: by
        a follower here (``leader_stats``: its own copy marked stale if the leader does
        not answer), or with no replica here (the kept stats, or stale ones)."""
        ctx = self.context
        rep = ctx.replicas.get(name)
        if rep is not None and name not in ctx.failed and self.transport.nodes() != [self.name]:
            return await leader_stats(ctx, rep)
        if rep is not None or ctx.forwarder.remote(name) is None:
            return self.stats(name)
        try:
            return await ctx.forwarder.fetch_stats(name)
        except QuorraError:
            return self.stats(name)

    def summary(self, name: str) -> dict[str, object]:
        ctx = self.context
        failed = ctx.failed.get(name)
        if failed is not None:
            return observe.failed_stats(failed[1])
        if name not in ctx.replicas and ctx.forwarder.remote(name) is not None:
            return self.stats(name)  # the leader's kept figures: nothing to read here
        return observe.queue_summary(ctx.replica(name), self.clock.monotonic_ms(), self.limits)

    def segments(self, name: str) -> list[SegmentInfo]:
        rep = self.context.replica(name)
        return observe.segment_infos(rep, observe.live_indexes(rep))

    async def fresh_segments(self, name: str) -> list[SegmentInfo]:
        """``segments``; on a cluster node without a replica of the queue, its leader's."""
        if not self._remote(name):
            return self.segments(name)
        answer = await self.context.forwarder.forward(SegmentsCall(name))
        if not isinstance(answer, list) or not all(isinstance(s, SegmentInfo) for s in answer):
            raise NoLeader(f"queue {name}: its leader sent no segments")
        return answer

    async def leader_history(self, name: str) -> LeaderHistory | None:
        if not self._remote(name):
            return None  # hosted here (a damaged replica too: its history stays readable)
        return await leader_history(self.context, name)

    def cluster(self) -> dict[str, object]:
        return cluster_view(self.context, self._heard_ms)

    def _maybe_forgotten(self, _change: object) -> None:
        """A metadata listener: a forgotten node must not serve (its replicas were
        replaced elsewhere), whether it was forgotten while up or came back afterwards."""
        group = self.context.meta_group
        rec = None if group is None else group.machine.nodes.get(self.name)
        if rec is not None and rec.state == "forgotten":
            self._told_forgotten("declared lost, its replicas replaced elsewhere")

    def _told_forgotten(self, why: str) -> None:
        """The metadata, or a peer that knows it (``PeerBook.on_forgotten``), says the
        cluster forgot this node: it stops (once)."""
        if self.forgotten:
            return
        self.forgotten = True
        message = (
            f"node {self.name} was forgotten by its cluster ({why}): it is refused; to"
            " join again, start it with a new data directory"
        )
        log.error("%s", message)
        if self.on_forgotten is not None:
            self.on_forgotten(message)

    def _told_lost_data(self, why: str) -> None:
        """A peer says the cluster knows this node from another data directory: it
        stops (once), since it would vote with an empty log."""
        if self.forgotten:
            return
        self.forgotten = True
        message = f"node {self.name} is refused by its cluster: {why}"
        log.error("%s", message)
        if self.on_forgotten is not None:
            self.on_forgotten(message)

    def stale_peer(self, name: str, incarnation: str) -> str | None:
        """Why peer ``name``, from data directory ``incarnation``, is refused: by the
        metadata's records, or before they hold it by what this node heard since it
        started (``engine.cluster.rejoin``). One accepted proved the secret: the metadata
        may record it (``MetaGroup.heard``), unless it is forgotten."""
        group = self.context.meta_group
        if group is None:
            return None
        nodes = {} if group.driver is None else group.machine.nodes
        why = lost_data_refusal(nodes, name, incarnation) or heard_refusal(
            nodes, group.heard, group.boot.members, name, incarnation
        )
        if why is not None:
            return why  # what was heard stays: the directory it ran from
        rec = nodes.get(name)
        forgotten = rec is not None and rec.state == "forgotten"
        if not forgotten and (
            name in group.heard or len(group.heard) <= self.limits.cluster_nodes_max
        ):
            group.heard[name] = incarnation
        return None

    async def set_node_state(self, node: str, state: NodeState) -> dict[str, object]:
        """Record ``node`` as ``draining`` (``POST /cluster/nodes/{node}/drain``), ``lost``
        (``.../forget``) or ``active`` again in the metadata; the moves off it run in the
        background (``engine.runtime.moving``). Returns the node's state and the queues
        still placed on it."""
        ctx = self.context
        group = ctx.meta_group
        if group is None:
            raise Conflict("this node is not part of a cluster: there is no node to move off")
        async with ctx.admit():
            await group.wait_bootstrapped()
            await group.propose(mc.SetNodeState(node, state))
        ctx.reconciler.trigger()
        return {"name": node, **placed_on(self.context, node)}

    def leader_of(self, name: str) -> str | None:
        rep = self.context.replicas.get(name)
        if rep is None:
            return self.context.forwarder.leaders.get(name)
        leader = rep.leader_id
        return None if leader is None else node_of(leader)

    def memory(self) -> dict[str, object]:
        ctx = self.context
        replicas = [rep for rep in ctx.replicas.values() if not rep.closed]
        cache = (
            ctx.storage.cache.blocks.stats()
            if ctx.has_storage
            else ReadCacheStats(0, self.limits.read_cache_bytes_max, 0, 0, 0, 0)
        )
        memory = observe.node_memory(replicas, ctx.pages.node.pages_max, self.limits, cache)
        memory["mem_table_bytes"] = ctx.storage.mem_table_bytes() if ctx.has_storage else 0
        memory["alarm"] = ctx.memory.alarmed()
        memory["queues_sleeping"] = sum(rep.dormant is not None for rep in replicas)
        memory["publishes_refused"] = ctx.memory.refused
        return memory

    def wal_stats(self) -> WalStats | None:
        ctx = self.context
        return ctx.storage.wal.stats() if ctx.has_storage else None

    # === from the transport ==========================================================

    def on_raft_message(self, src: NodeName, uid: str, message: Message) -> None:
        """From the transport: a message from node ``src`` for the replica of group
        ``uid``, checked (``receiving``) before and by the replica's core."""
        self._heard_ms[src] = self.clock.monotonic_ms()
        ctx = self.context
        group = ctx.meta_group
        if group is not None and uid == group.uid:
            if ctx.running:
                group.on_message(src, message)
            return
        rep = ctx.receiving.replica_for(src, uid, message)
        if rep is None or rep.closed or rep.failed is not None or not ctx.running:
            return
        raft = rep.raft
        commit = raft.commit
        try:
            # The core's clock moves first: a heartbeat restarts the election timer from
            # now, not from the last tick (a follower ticks only at its deadline).
            ctx.timers.tick(rep)
            ctx.receiving.step(rep, src, message)
        except EntryDamaged as e:
            ctx.hosting.damaged(rep, e)
            return
        if raft.commit != commit and raft.role is Role.LEADER:
            # An acknowledgement that commits: apply and confirm now, not after the rest
            # of a busy leader's turn (about 1 ms on average under load, on every
            # replicated publish's path).
            ctx.hosting.process(rep)
        else:
            ctx.hosting.schedule(rep)

    async def on_call(self, src: NodeName, call: NodeCall) -> object:
        """From the transport: a request of node ``src`` (never forwarded again)."""
        return await self.context.router.on_call(src, call)


def remote_stats_unknown(name: str) -> dict[str, object]:
    """Stats of a queue without a replica here whose leader was not asked yet."""
    stats = observe.failed_stats(NoLeader(f"queue {name}: its leader's stats are not here yet"))
    return {**stats, "status": "stale", "remote": {"from_node": None, "age_ms": None}}


def _close_files(storage: NodeStorage) -> None:
    storage.wal.close()
    storage.cache.close()


def _close_storage(storage: NodeStorage, sleepers: list[Sleeper]) -> None:
    """On a worker, which owns the storage from here on (the loop waits for it); once it
    closed cleanly, the records of the queues that sleep (``engine.runtime.sleepers``)."""
    storage.take_over()
    storage.close()
    if sleepers:
        write_sleepers(storage.disk, encode_sleepers(sleepers, storage.limits.sleepers_bytes_max))


def _implements_the_protocol(node: Node) -> QueueEngine:
    """Checked by mypy: ``Node`` is a ``QueueEngine``."""
    return node


__all__ = ["Node"]
