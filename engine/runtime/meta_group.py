"""The cluster metadata group hosted by a node: one replica of ``engine.cluster.MetaMachine``.

Rule: the metadata is a Raft group like a queue's, on the same driver
(``engine.runtime.driver``), the same shared WAL and the same transport, under the
reserved uid ``META_UID`` (no queue has it: queue uids are 32 hex digits). Its voters
are at first the cluster's initial members, at most ``Limits.meta_voters_max`` of them (the
first in name order); nodes that join later are added by the group's leader, as learners
then voters while there are fewer than that (``engine.runtime.meta_members``). The first leader of a new cluster proposes ``Bootstrap`` and an
``AddNode`` for each initial member; any later leader proposes what of that is missing,
which is nothing once it committed.

Any node proposes a command: on the leader's node it is proposed here, on another it is
forwarded to the leader (``MetaPropose``, one hop) and the answer names the index it
applied at; the caller then waits until its own replica applied that index, so that what
it does next (its reconcile loop, its SQLite) sees the change.

Every applied entry's ``MetaChanged`` goes to the listeners (the reconcile loop, the
app's SQLite mirror), on every replica and during replay too (what they do with it is
idempotent); after a snapshot is installed they hear ``None``: everything may have
changed. The machine asks for checkpoints itself; this module writes them (the machine's
snapshot, no live entries) and compacts the log behind them. The replica's I/O (its WAL
writes, its messages) is ``engine.runtime.group_io.MetaIo``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from pyroaring import BitMap64

from engine.cluster import MetaChanged, MetaMachine, encode_command
from engine.cluster import meta_commands as mc
from engine.cluster.rejoin import started_reports
from engine.errors import NoLeader, QuorraError, StorageFailed
from engine.ids import NodeName, ServerId
from engine.limits import Limits
from engine.queue import Rejected
from engine.raft.config import EMPTY_CONFIGURATION, Configuration
from engine.raft.entry import Entry, EntryKind
from engine.raft.events import HardState as RaftHardState
from engine.raft.events import Persisted as RaftPersisted
from engine.raft.events import Propose, SnapshotInstalled, Tick
from engine.raft.messages import Message
from engine.raft.server import RaftOptions, RaftServer, Role
from engine.raft.state_machine import CheckpointRequest, MachineEffect, ReleaseCursor
from engine.runtime.driver import ReplicaDriver
from engine.runtime.group_io import MetaIo
from engine.runtime.replica import Proposal, node_of, server_id
from engine.runtime.routing import MetaPropose, MetaProposed, MetaReply
from engine.storage import (
    Checkpoint,
    HardStateSaved,
    Persisted,
    ServerLog,
    SnapshotReset,
    StorageEvent,
    WriteFailed,
)

if TYPE_CHECKING:
    from engine.runtime.context import NodeContext

log = logging.getLogger("quorra.engine")

META_UID = "cluster-meta"
"""The metadata group's uid: its directory under ``queues/`` and its name on the wire."""

MetaListener = Callable[[MetaChanged | None], None]
"""Told of each applied ``MetaChanged``; ``None`` after a snapshot replaced the state."""


@dataclass(frozen=True, slots=True)
class MetaBootstrap:
    """What a node of a cluster knows of it before its metadata does."""

    cluster_id: str
    members: dict[str, str]
    """The initial members: node name -> ``host:port`` of its cluster listener. Empty for
    a node that joined later: it starts with no configuration, and the group's leader
    adds it (``engine.runtime.meta_members``)."""
    joined: bool = False
    incarnation: str = ""
    """The id of this node's data directory, recorded by the metadata (``NodeStarted``:
    with the formation, or by its reconcile loop)."""


def meta_raft_limits(limits: Limits) -> Limits:
    """The metadata core's limits: the queues', heartbeats ``meta_heartbeat_intervals``
    times apart (``engine.limits``)."""
    every_ms = limits.heartbeat_interval_ms * limits.meta_heartbeat_intervals
    return dataclasses.replace(limits, heartbeat_interval_ms=every_ms, meta_heartbeat_intervals=1)


class MetaGroup:
    """This node's replica of the metadata group (see the module's rule)."""

    def __init__(self, ctx: NodeContext, boot: MetaBootstrap) -> None:
        self.ctx = ctx
        self.boot = boot
        voters = sorted(boot.members)[: ctx.limits.meta_voters_max]
        self.voters = tuple(voters)
        self.uid = META_UID
        self.server_id = server_id(ctx.name, META_UID)
        self.listeners: list[MetaListener] = []
        self.driver: ReplicaDriver[MetaMachine] | None = None
        self._log: ServerLog | None = None
        self.proposals: dict[int, Proposal] = {}
        self.waiting: dict[int, Proposal] = {}
        self.next_request_id = 1
        self.scheduled = False
        self.closed = False
        self.failed: Exception | None = None
        self.tick_handle: asyncio.TimerHandle | None = None
        self.tick_due_ms = 0
        self.role_seen = -1
        self.waiters: list[asyncio.Future[None]] = []
        """Woken at every change of leader and every applied entry."""
        self.replay_until = 0
        self.snapshot_installed = False
        self.checkpoint: Checkpoint | None = None
        """Captured as the machine asked, written at its cursor release."""
        self.bootstrapping = False
        self.heard: dict[str, str] = {ctx.name: boot.incarnation}
        """Node -> the data directory it runs from: this node's, and each peer's as its
        last authenticated handshake named it (``Node.stale_peer``, bounded by the
        cluster's nodes): what this node records, leading (``engine.cluster.rejoin``)."""

    # --- opening and closing -----------------------------------------------------------

    def open(self) -> None:
        """Open the group's storage, restore the machine, start the core (on the loop,
        before the WAL writer starts, like ``Hosting.host``)."""
        ctx = self.ctx
        storage = ctx.storage
        repairable = len(self.voters) > 1 or self.boot.joined
        rec = storage.open_server(META_UID, repairable=repairable)
        machine = MetaMachine(ctx.limits)
        base = 0
        if rec.checkpoint is not None:
            machine.restore(bytes(rec.checkpoint.state))
            base = rec.checkpoint.index
        snapshot, checkpoint_meta = ctx.hosting.raft_metas(META_UID, rec.log, rec.checkpoint)
        hs = rec.hard_state
        hard = None
        if hs is not None:
            hard = RaftHardState(hs.term, None if hs.vote is None else ServerId(hs.vote), hs.commit)
        bootstrap = EMPTY_CONFIGURATION
        if ctx.name in self.voters:
            bootstrap = Configuration(tuple(sorted(server_id(n, META_UID) for n in self.voters)))
        now, wall = ctx.clock.monotonic_ms(), ctx.clock.wall_ms()
        lone = self.voters == (ctx.name,)
        start_ms = now - ctx.limits.election_timeout_ms_max if lone else now
        rng = random.Random(ctx.hosting.rng.getrandbits(64))
        options = RaftOptions(self.server_id, rng, meta_raft_limits(ctx.limits))
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
        self.replay_until = rec.log.last_index()
        self._log = rec.log
        self.driver = ReplicaDriver(
            raft,
            machine,
            MetaIo(self),
            base_index=base,
            replay_until=self.replay_until,
            hard_state_written=(0, None) if hs is None else (hs.term, hs.vote),
        )
        if lone:
            raft.step(Tick(now, wall))

    def close(self, error: QuorraError) -> None:
        self.closed = True
        if self.tick_handle is not None:
            self.tick_handle.cancel()
        for p in [*self.proposals.values(), *self.waiting.values()]:
            if not p.future.done():
                p.future.set_exception(error)
        self.proposals.clear()
        self.waiting.clear()
        self.wake()

    @property
    def raft(self) -> RaftServer:
        assert self.driver is not None, "open() first"
        return self.driver.raft

    @property
    def log(self) -> ServerLog:
        assert self._log is not None, "open() first"
        return self._log

    @property
    def machine(self) -> MetaMachine:
        assert self.driver is not None, "open() first"
        return self.driver.machine

    @property
    def applied_index(self) -> int:
        return 0 if self.driver is None else self.driver.applied_index

    def caught_up(self) -> bool:
        """Whether this replica's view may drive the reconcile loop: it knows a leader,
        is bootstrapped and has applied what is committed and what its log held at
        start (a stale view only plans work the next plan undoes, but why do it)."""
        if self.driver is None or self.closed or self.failed is not None:
            return False
        raft = self.raft
        applied = self.applied_index
        held = min(self.replay_until, self.log.last_index())
        return (
            raft.leader is not None
            and bool(self.machine.cluster_id)
            and applied >= raft.commit
            and applied >= held
        )

    # --- the Raft loop -----------------------------------------------------------------

    def schedule(self) -> None:
        if not self.scheduled and not self.closed:
            self.scheduled = True
            self.ctx.loop.call_soon(self.process)

    def process(self) -> None:
        self.scheduled = False
        if self.closed or self.failed is not None or self.driver is None:
            return
        try:
            self.driver.process()
        except StorageFailed as e:
            self.fail(e)
            return
        if self.snapshot_installed:
            self.snapshot_installed = False
            self.tell(None)
        role = int(self.raft.role)
        if role != self.role_seen:
            self.role_seen = role
            if self.raft.role is Role.LEADER:
                self.ctx.spawn(self.maybe_bootstrap())
        self.arm_tick()
        self.wake()

    def wake(self) -> None:
        for f in self.waiters:
            if not f.done():
                f.set_result(None)
        self.waiters.clear()

    async def changed(self, timeout_s: float) -> None:
        """Wait for the next change of leader or applied entry, at most ``timeout_s``."""
        waiter: asyncio.Future[None] = self.ctx.loop.create_future()
        self.waiters.append(waiter)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(waiter, timeout_s)

    def arm_tick(self) -> None:
        due = self.raft.next_deadline_ms()
        if due is None or self.closed:
            return
        if self.tick_handle is not None and self.tick_due_ms <= due:
            return
        if self.tick_handle is not None:
            self.tick_handle.cancel()
        self.tick_due_ms = due
        loop = self.ctx.loop
        delay_s = max(0.0, (due - self.ctx.clock.monotonic_ms()) / 1000) + 0.001
        self.tick_handle = loop.call_at(loop.time() + delay_s, self.on_tick)

    def on_tick(self) -> None:
        self.tick_handle = None
        if self.closed or self.failed is not None:
            return
        self.tick()
        index = self.log.snapshot_index()
        if self.driver is not None and self.driver.wants_snapshot(index):
            try:
                self.driver.offer_snapshot(self.ctx.hosting.raft_snapshot(META_UID, index))
            except (StorageFailed, LookupError) as e:
                log.error("metadata: snapshot for a lagging follower unavailable: %s", e)
        self.schedule()

    def tick(self) -> None:
        clock = self.ctx.clock
        self.raft.step(Tick(clock.monotonic_ms(), clock.wall_ms()))

    def on_message(self, src: NodeName, message: Message) -> None:
        """A peer's Raft message for this group: from ``src``'s member, to this one."""
        receiving = self.ctx.receiving
        if self.driver is None or self.closed or self.failed is not None:
            return
        if message.src != server_id(src, META_UID):
            receiving.refuse("sender_not_the_peer", src, message)
            return
        if message.dst != self.server_id:
            receiving.refuse("not_addressed_here", src, message)
            return
        self.tick()
        receiving.step_core(self.raft, src, message)
        self.schedule()

    def on_storage_event(self, event: StorageEvent) -> None:
        """A WAL batch finished an operation of this group (``Hosting.on_wal_batch``)."""
        driver = self.driver
        if driver is None or self.closed:
            return
        if isinstance(event, WriteFailed):
            self.fail(event.error)
            return
        if isinstance(event, Persisted):
            driver.written(RaftPersisted(event.index, event.term))
        elif isinstance(event, SnapshotReset):
            driver.written(SnapshotInstalled(event.index, event.term))
        else:
            assert isinstance(event, HardStateSaved), event
            driver.written(None)
        self.schedule()

    def fail(self, error: Exception) -> None:
        if self.failed is not None:
            return
        log.error("metadata: storage failed: %s", error)
        self.failed = error if isinstance(error, StorageFailed) else StorageFailed(str(error))
        for p in [*self.proposals.values(), *self.waiting.values()]:
            if not p.future.done():
                p.future.set_exception(self.failed)
        self.proposals.clear()
        self.waiting.clear()

    # --- applying ----------------------------------------------------------------------

    def applied(self, entry: Entry, reply: object, effects: list[MachineEffect]) -> None:
        for effect in effects:
            if isinstance(effect, MetaChanged):
                self.tell(effect)
            elif isinstance(effect, CheckpointRequest):
                config = self.raft.config_at(effect.index).encode()
                self.checkpoint = Checkpoint(
                    effect.index,
                    entry.term,
                    MetaMachine.version,
                    config,
                    BitMap64(),
                    self.machine.snapshot(),
                )
            elif isinstance(effect, ReleaseCursor) and self.checkpoint is not None:
                cp, self.checkpoint = self.checkpoint, None
                self.ctx.spawn(self.write_checkpoint(cp))
        self.passed(entry, reply)

    def passed(self, entry: Entry, reply: object = None) -> None:
        p = self.waiting.pop(entry.index, None)
        if p is None or p.future.done():
            return
        if p.term != entry.term or entry.kind is not EntryKind.COMMAND:
            p.future.set_exception(NoLeader("metadata: leadership changed, retry"))
        elif isinstance(reply, Rejected):
            p.future.set_exception(reply.to_error())
        else:
            p.future.set_result(reply)

    def tell(self, change: MetaChanged | None) -> None:
        self.unhear_forgotten(change)
        for listener in list(self.listeners):
            try:
                listener(change)
            except Exception:  # a listener's failure is its own, not the group's
                log.exception("metadata listener failed")

    def unhear_forgotten(self, change: MetaChanged | None) -> None:
        """A forgotten node may come back only from a new data directory (``--join``): the
        one it was heard from no longer holds it (``engine.cluster.rejoin.heard_refusal``)."""
        names = list(self.heard) if change is None else change.nodes
        for name in names:
            rec = self.machine.nodes.get(name)
            if rec is not None and rec.state == "forgotten" and name != self.ctx.name:
                self.heard.pop(name, None)

    async def write_checkpoint(self, cp: Checkpoint) -> None:
        """Write the captured state, then compact: the log before it is dead."""
        ctx = self.ctx
        storage = ctx.storage
        try:
            async with ctx.job():
                job = storage.prepare_checkpoint(META_UID)
                try:
                    await ctx.in_worker(job.write, cp)
                finally:
                    storage.finish_checkpoint(job)
                compaction = storage.prepare_compaction(META_UID, "auto")
                await ctx.in_worker(compaction.run)
                storage.finish_compaction(compaction)
        except (StorageFailed, OSError) as e:
            log.error("metadata: checkpoint failed: %s", e)

    # --- proposing ---------------------------------------------------------------------

    async def propose(self, command: mc.MetaCommand) -> MetaReply:
        """Commit ``command`` through the group's leader, wherever it is; returns once this
        replica applied it, with the machine's reply (its rejection raised)."""
        data = encode_command(command)
        loop = self.ctx.loop
        deadline = loop.time() + self.ctx.limits.leader_wait_ms / 1000
        while True:
            try:
                index, reply = await self.propose_once(data)
                break
            except NoLeader:
                # Nothing was proposed, or what was is lost with its leader's term (an
                # outcome this node cannot know is ``OutcomeUnknown``, never retried).
                if loop.time() >= deadline:
                    raise
                await self.changed(self.ctx.limits.election_timeout_ms_max / 1000)
        await self.wait_applied(index)
        return reply

    async def propose_once(self, data: bytes) -> tuple[int, MetaReply]:
        leader = await self.leader_node()
        if leader == self.ctx.name:
            return await self.propose_local(data)
        answer = await self.ctx.transport.call(leader, MetaPropose(data))
        assert isinstance(answer, MetaProposed), answer
        return answer.index, answer.reply

    async def propose_local(self, data: bytes) -> tuple[int, MetaReply]:
        """On the leader's node: propose and wait until the entry applies here."""
        if self.closed or self.driver is None:
            raise NoLeader(f"node {self.ctx.name}: metadata closed")
        if self.failed is not None:
            raise self.failed
        if self.raft.role is not Role.LEADER:
            raise NoLeader("metadata: this replica does not lead, retry")
        request_id = self.next_request_id
        self.next_request_id += 1
        future: asyncio.Future[object] = self.ctx.loop.create_future()
        proposal = Proposal(future, None)
        self.proposals[request_id] = proposal
        self.tick()
        self.raft.step(Propose(request_id, (data,)))
        self.schedule()
        try:
            reply = await asyncio.wait_for(future, self.ctx.limits.proposal_timeout_ms / 1000)
        except TimeoutError:
            raise NoLeader("metadata: no quorum in time; the outcome is unknown") from None
        finally:
            self.proposals.pop(request_id, None)
        assert reply is not None, "a command's entry answers a reply"
        return proposal.index, cast(MetaReply, reply)

    async def leader_node(self) -> NodeName:
        loop = self.ctx.loop
        deadline = loop.time() + self.ctx.limits.leader_wait_ms / 1000
        while True:
            if self.closed or self.driver is None:
                raise NoLeader(f"node {self.ctx.name}: metadata closed")
            raft = self.raft
            if raft.role is Role.LEADER:
                return self.ctx.name
            if raft.leader is not None:
                return NodeName(node_of(raft.leader))
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise NoLeader("the cluster metadata has no leader yet")
            await self.changed(remaining)

    def bootstrapped(self) -> bool:
        """The metadata names the cluster and every initial member (this replica's view)."""
        machine = self.machine
        return bool(machine.cluster_id) and all(n in machine.nodes for n in self.boot.members)

    async def wait_bootstrapped(self) -> None:
        """Until ``bootstrapped`` here, up to ``Limits.leader_wait_ms`` (then ``NoLeader``:
        a new cluster places no queue before it knows its nodes)."""
        loop = self.ctx.loop
        deadline = loop.time() + self.ctx.limits.leader_wait_ms / 1000
        while not self.bootstrapped():
            remaining = deadline - loop.time()
            if remaining <= 0 or self.closed:
                raise NoLeader("the cluster metadata is not bootstrapped yet, retry")
            await self.changed(remaining)

    async def wait_applied(self, index: int) -> None:
        loop = self.ctx.loop
        deadline = loop.time() + self.ctx.limits.leader_wait_ms / 1000
        while self.applied_index < index and not self.closed:
            remaining = deadline - loop.time()
            if remaining <= 0:
                log.warning("metadata: index %d not applied here in time", index)
                return
            await self.changed(remaining)

    async def maybe_bootstrap(self) -> None:
        """As a new leader: what of ``Bootstrap`` and the initial ``AddNode``s the
        metadata lacks (nothing, once a leader committed them)."""
        if self.bootstrapping:
            return
        self.bootstrapping = True
        try:
            # The previous terms' entries apply once this leader's first entry commits.
            while self.applied_index < self.raft.commit or self.raft.commit < self.log.last_index():
                if self.raft.role is not Role.LEADER or self.closed:
                    return
                await self.changed(self.ctx.limits.poll_interval_ms / 1000)
            machine = self.machine
            commands: list[mc.MetaCommand] = []
            if not machine.cluster_id:
                commands.append(mc.Bootstrap(self.boot.cluster_id))
            for name, address in sorted(self.boot.members.items()):
                if name not in machine.nodes:
                    commands.append(mc.AddNode(name, address))
            commands += started_reports(machine.nodes, self.heard, self.boot.members)
            for command in commands:
                await self.propose_local(encode_command(command))
        except QuorraError as e:
            log.warning("metadata: bootstrap not finished (%s); the next leader retries", e)
        finally:
            self.bootstrapping = False


__all__ = ["META_UID", "MetaBootstrap", "MetaGroup", "MetaListener", "meta_raft_limits"]
