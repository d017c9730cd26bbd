"""Where a client call runs, and the calls one node makes to another.

Rule: a client operation runs on the node of its queue's leader. The node that takes
it checks and admits it, then runs it here when its replica leads, or forwards it to the
leader's node: one hop, the peer never forwards it again, and checks and admits it as
its own (``Node._admit``: a peer cannot bypass the limits of this node). If the node taken for the
leader no longer hosts the queue, the caller gets ``NoLeader`` and retries; while no
leader is known it waits up to ``Limits.leader_wait_ms``. A cluster node with no replica
of the queue forwards the same way, to the leader its members name
(``engine.runtime.forwarding``).

Every call between nodes is one frozen dataclass below, registered with
``engine.runtime.wire``, which checks each field of a call it decodes against its
annotation. ``check_call`` checks a call that did not cross the wire the same way before
it runs, so that a peer cannot make this node run anything else.
"""

from __future__ import annotations

import asyncio
import contextlib
import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, assert_never

from engine.cluster import meta_commands as mc
from engine.cluster.records import split_address
from engine.cluster.rejoin import rejoin_refusal
from engine.cluster.replies import MembersChanged, Ok, QueueCreated, QueueDeleting, QueueExists
from engine.errors import Conflict, NoLeader, QueueNotFound, ValidationFailed, WireError
from engine.ids import NodeName
from engine.raft.server import Role
from engine.runtime import observe, wire
from engine.runtime.api import (
    CheckpointRecord,
    CompactionPhase,
    CompactionRecord,
    OutgoingMessage,
    QueueHistory,
    SegmentInfo,
)
from engine.runtime.meta import QueueMeta, check_meta, check_uid
from engine.runtime.replica import Replica, node_of

if TYPE_CHECKING:
    from engine.runtime.context import NodeContext

SettleHow = Literal["ack", "nack", "discard", "extend"]


@dataclass(frozen=True, slots=True)
class CreateReplica:
    """Host a replica of a queue being created, or of a group this node joins."""

    meta: QueueMeta


@dataclass(frozen=True, slots=True)
class DeleteReplica:
    uid: str


@dataclass(frozen=True, slots=True)
class PublishRouted:
    """A dead-letter copy from a node without the target queue: this node hosts it and
    publishes it as a client would (forwarding it to the leader if need be)."""

    name: str
    messages: list[OutgoingMessage]


@dataclass(frozen=True, slots=True)
class PublishCall:
    name: str
    messages: list[OutgoingMessage]


@dataclass(frozen=True, slots=True)
class ReceiveCall:
    name: str
    consumer: str
    max_messages: int
    wait_ms: int
    lease_ms: int | None
    ack: list[str]
    """Receipts to settle in the same entry as the checkout (none: a plain checkout)."""


@dataclass(frozen=True, slots=True)
class SettleCall:
    name: str
    how: SettleHow
    receipts: list[str]
    lease_ms: int


@dataclass(frozen=True, slots=True)
class BrowseCall:
    name: str
    after: int | None
    limit: int


@dataclass(frozen=True, slots=True)
class StatsCall:
    """The queue's stats on its leader (for a node without a replica of it)."""

    name: str


@dataclass(frozen=True, slots=True)
class SegmentsCall:
    """The segments of the queue's log on its leader (for a node without a replica)."""

    name: str


@dataclass(frozen=True, slots=True)
class CheckpointCall:
    """Checkpoint the leader's replica now (for a node without a replica of the queue);
    answers the ``CheckpointRecord``, which the leader's record listener hears too."""

    name: str


@dataclass(frozen=True, slots=True)
class CompactCall:
    """Compact the leader's replica now (as ``CheckpointCall``); answers the
    ``CompactionRecord``."""

    name: str
    phase: CompactionPhase


@dataclass(frozen=True, slots=True)
class HistoryCall:
    """The queue's checkpoint and compaction runs as the leader's node keeps them (in
    SQLite, ``engine.runtime.leader_history``), for a node without a replica of it."""

    name: str


@dataclass(frozen=True, slots=True)
class LeaderOfCall:
    """Which node leads queue ``name``, as a member knows it (it waits for an election up
    to ``Limits.leader_wait_ms``): asked by a node without a replica of it."""

    name: str


@dataclass(frozen=True, slots=True)
class LedStatsCall:
    """The stats of those of queues ``names`` that this node's replicas lead, by name
    (``engine.runtime.leader_stats``: one call per leader node refreshes a queue list)."""

    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PurgeCall:
    name: str


@dataclass(frozen=True, slots=True)
class UpdatePolicyCall:
    name: str
    changes: dict[str, object]


@dataclass(frozen=True, slots=True)
class TransferCall:
    name: str
    node: str


@dataclass(frozen=True, slots=True)
class AddMemberCall:
    name: str
    node: str


@dataclass(frozen=True, slots=True)
class RemoveMemberCall:
    name: str
    node: str


@dataclass(frozen=True, slots=True)
class MetaPropose:
    """Propose an encoded metadata command (``engine.cluster.meta_commands``) on the node
    of the metadata group's leader; answers ``MetaProposed``."""

    command: bytes


@dataclass(frozen=True, slots=True)
class JoinCall:
    """Node ``node``, reached by its peers at ``address``, joins the cluster (sent on a
    join connection, ``engine.runtime.tcp_join``); answers ``Joined``."""

    node: str
    address: str


@dataclass(frozen=True, slots=True)
class Joined:
    """The cluster ``node`` joined: its id, and every node it holds (name -> address)."""

    cluster_id: str
    members: dict[str, str]


MetaReply = Ok | QueueCreated | QueueExists | QueueDeleting | MembersChanged
"""What a committed metadata command answers (a rejection travels as its error)."""


@dataclass(frozen=True, slots=True)
class MetaProposed:
    """The metadata command committed at ``index`` with ``reply``."""

    index: int
    reply: MetaReply


wire.register((Ok, QueueCreated, QueueExists, QueueDeleting, MembersChanged, MetaProposed, Joined))
wire.register((SegmentInfo, CheckpointRecord, CompactionRecord, QueueHistory))

LeaderCall = (
    PublishCall
    | ReceiveCall
    | SettleCall
    | BrowseCall
    | StatsCall
    | SegmentsCall
    | CheckpointCall
    | CompactCall
    | HistoryCall
    | PurgeCall
    | UpdatePolicyCall
    | TransferCall
    | AddMemberCall
    | RemoveMemberCall
)
"""A client operation on queue ``name``, run by the node of its leader."""
NodeCall = (
    CreateReplica
    | DeleteReplica
    | PublishRouted
    | MetaPropose
    | JoinCall
    | LeaderOfCall
    | LedStatsCall
    | LeaderCall
)
"""Every call a node makes to another."""

PROPOSING_CALL_TYPES = (
    PublishRouted,
    MetaPropose,
    LeaderOfCall,
    PublishCall,
    ReceiveCall,
    SettleCall,
    BrowseCall,
    StatsCall,
    SegmentsCall,
    PurgeCall,
    UpdatePolicyCall,
)
"""The calls whose work on the leader's node is at most one proposal (or a read): they
take no longer than ``Limits.leader_wait_ms + proposal_timeout_ms`` (plus a receive's
wait); the others (replicas, members, leadership) may take several steps."""

CALL_TYPES: tuple[type[Any], ...] = (
    CreateReplica,
    MetaPropose,
    JoinCall,
    DeleteReplica,
    PublishRouted,
    PublishCall,
    ReceiveCall,
    SettleCall,
    BrowseCall,
    StatsCall,
    SegmentsCall,
    CheckpointCall,
    CompactCall,
    HistoryCall,
    LeaderOfCall,
    LedStatsCall,
    PurgeCall,
    UpdatePolicyCall,
    TransferCall,
    AddMemberCall,
    RemoveMemberCall,
)
_SHAPES = wire.register(CALL_TYPES)


def check_call(call: object) -> NodeCall:
    """``call`` as a ``NodeCall``, or ``WireError`` (a ``ValidationFailed``) if it is not
    one: a call that did not cross the wire is checked by the shapes decoding uses."""
    shape = _SHAPES.get(type(call))
    if shape is None:
        raise WireError(f"not a call: {type(call).__name__}")
    shape.check(call)
    return typing.cast(NodeCall, call)


class Router:
    """Runs a node's client operations at their leader, and the calls of its peers."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx

    def led_stats(self, names: tuple[str, ...]) -> dict[str, dict[str, object]]:
        """The stats of those of ``names`` whose replica here leads (``LedStatsCall``)."""
        ctx = self.ctx
        now = ctx.clock.monotonic_ms()
        out: dict[str, dict[str, object]] = {}
        for name in names:
            rep = ctx.replicas.get(name)
            if rep is not None and name not in ctx.failed and rep.raft.role is Role.LEADER:
                out[name] = observe.queue_stats(rep, now, ctx.limits)
        return out

    async def leader_node(self, rep: Replica) -> NodeName:
        """The node of the replica's leader; waits for an election up to the limit."""
        ctx = self.ctx
        loop = ctx.loop
        deadline = loop.time() + ctx.limits.leader_wait_ms / 1000
        while True:
            if rep.closed:
                raise rep.close_error or QueueNotFound(f"queue {rep.name} is gone")
            raft = rep.raft
            if raft.role is Role.LEADER:
                return ctx.name
            if raft.leader is not None:
                return NodeName(node_of(raft.leader))
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise NoLeader(f"queue {rep.name} has no leader yet")
            waiter: asyncio.Future[None] = loop.create_future()
            rep.own_leader_waiters().append(waiter)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter, remaining)

    def check_known(self, name: str) -> None:
        """``QueueNotFound`` (or the error of its failed replica) unless this node hosts
        queue ``name`` or serves it by forwarding (``engine.runtime.forwarding``)."""
        ctx = self.ctx
        if name in ctx.replicas or ctx.forwarder.remote(name) is None:
            ctx.replica(name)

    async def route(self, call: LeaderCall) -> object:
        ctx = self.ctx
        if call.name not in ctx.replicas and ctx.forwarder.remote(call.name) is not None:
            return await ctx.forwarder.forward(call)
        rep = ctx.replica(call.name)
        leader = await self.leader_node(rep)
        if leader == ctx.name:
            return await self.local(call)
        try:
            return await ctx.transport.call(leader, call)
        except QueueNotFound:
            # This node hosts the queue: the node it took for the leader no longer does.
            raise NoLeader(f"queue {call.name}: its leader moved, retry") from None

    async def on_call(self, src: NodeName, call: NodeCall) -> object:
        """From the transport: a request of node ``src`` (never forwarded again)."""
        ctx = self.ctx
        if not ctx.running:
            raise NoLeader(f"node {ctx.name} is stopping")
        call = check_call(call)
        if isinstance(call, CreateReplica):
            check_meta(call.meta, ctx.limits)
            await ctx.catalog.create_replica(call.meta)
            return None
        if isinstance(call, DeleteReplica):
            check_uid(call.uid)
            await ctx.catalog.delete_replica(call.uid)
            return None
        if isinstance(call, PublishRouted):
            return await ctx.ops.publish(call.name, call.messages)
        if isinstance(call, LeaderOfCall):
            return await self.leader_node(ctx.replica(call.name))
        if isinstance(call, LedStatsCall):
            return self.led_stats(call.names[: ctx.limits.led_stats_queues_max])
        if isinstance(call, MetaPropose):
            group = ctx.meta_group
            if group is None:
                raise NoLeader(f"node {ctx.name} hosts no cluster metadata")
            index, reply = await group.propose_local(call.command)
            return MetaProposed(index, reply)
        if isinstance(call, JoinCall):
            return await self.join(call)
        # A client operation another node took: checked and admitted here too, as the
        # node that took it did (its checks are not this node's to trust).
        ctx.ops.check(call)
        async with ctx.admit():
            return await self.local(call)

    async def join(self, call: JoinCall) -> Joined:
        """Record the joining node in the metadata (through its leader), and tell it the
        cluster: the metadata group's leader then adds it (``engine.runtime.meta_members``).
        A node the metadata records already is refused (``Conflict``) where it votes, a
        node that lost its data (``engine.cluster.rejoin``): checked before its
        ``AddNode`` and, for a node known then, again once it applied here (this
        replica's configuration then holds every change committed before it: a
        placement or a promotion in between). A new node is not checked again: a queue
        placed on it meanwhile holds nothing it could have forgotten. Otherwise the same
        node at the same address again is answered the same, at another address refused."""
        ctx = self.ctx
        group = ctx.meta_group
        if group is None:
            raise NoLeader(f"node {ctx.name} hosts no cluster metadata")
        if split_address(call.address) is None:
            raise ValidationFailed(f"{call.address!r:.80} is not host:port")
        async with ctx.admit():
            await group.wait_bootstrapped()
            self._check_rejoin(call.node)
            known = group.machine.nodes.get(call.node)
            await group.propose(mc.AddNode(call.node, call.address))
            if known is not None and known.state != "forgotten":
                self._check_rejoin(call.node)
        machine = group.machine
        members = {n: r.address for n, r in sorted(machine.nodes.items()) if r.state != "forgotten"}
        return Joined(machine.cluster_id, members)

    async def run_job(self, rep: Replica, call: CheckpointCall | CompactCall) -> object:
        """A checkpoint or compaction another node asked for: its record also goes to
        this node's record listener, which keeps the queue's history where its replica
        is (as it does for those this node runs by itself)."""
        jobs = self.ctx.checkpoints
        record: CheckpointRecord | CompactionRecord
        if isinstance(call, CheckpointCall):
            record = await jobs.checkpoint(rep.name, "manual")
        else:
            record = await jobs.compact(rep.name, call.phase, "manual")
        await jobs.notify(record)
        return record

    def _check_rejoin(self, node: str) -> None:
        group = self.ctx.meta_group
        assert group is not None
        machine = group.machine
        voters = [node_of(s) for s in group.raft.config.voters]
        why = rejoin_refusal(machine.nodes, machine.queues, voters, node)
        if why is not None:
            raise Conflict(why)

    async def local(self, call: LeaderCall) -> object:
        """Run ``call`` on this node, whose replica must lead."""
        ctx = self.ctx
        rep = ctx.replica(call.name)
        if rep.raft.role is not Role.LEADER:
            raise NoLeader(f"queue {rep.name}: leadership moved, retry")
        ops, membership = ctx.ops, ctx.membership
        if isinstance(call, PublishCall):
            return await ops.publish_local(rep, call.messages)
        if isinstance(call, ReceiveCall):
            return await ops.receive_local(
                rep, call.consumer, call.max_messages, call.wait_ms, call.lease_ms, call.ack
            )
        if isinstance(call, SettleCall):
            return await ops.settle_local(rep, call.how, call.receipts, call.lease_ms)
        if isinstance(call, BrowseCall):
            return ops.browse_local(rep, call.after, call.limit)
        if isinstance(call, StatsCall):
            return observe.queue_stats(rep, ctx.clock.monotonic_ms(), ctx.limits)
        if isinstance(call, SegmentsCall):
            return observe.segment_infos(rep, observe.live_indexes(rep))
        if isinstance(call, CheckpointCall | CompactCall):
            return await self.run_job(rep, call)
        if isinstance(call, HistoryCall):
            return await ctx.checkpoints.history_of(rep)
        if isinstance(call, PurgeCall):
            return await ops.purge_local(rep)
        if isinstance(call, AddMemberCall):
            return await membership.add_member_local(rep, call.node)
        if isinstance(call, RemoveMemberCall):
            return await membership.remove_member_local(rep, call.node)
        if isinstance(call, TransferCall):
            await membership.transfer_local(rep, call.node)
            return None
        if isinstance(call, UpdatePolicyCall):
            return await ctx.catalog.update_policy_local(rep, call.changes)
        assert_never(call)


__all__ = [
    "CALL_TYPES",
    "PROPOSING_CALL_TYPES",
    "AddMemberCall",
    "BrowseCall",
    "CheckpointCall",
    "CompactCall",
    "CreateReplica",
    "DeleteReplica",
    "HistoryCall",
    "JoinCall",
    "Joined",
    "LeaderCall",
    "LeaderOfCall",
    "LedStatsCall",
    "MetaPropose",
    "MetaProposed",
    "MetaReply",
    "NodeCall",
    "PublishCall",
    "PublishRouted",
    "PurgeCall",
    "ReceiveCall",
    "RemoveMemberCall",
    "Router",
    "SegmentsCall",
    "SettleCall",
    "SettleHow",
    "StatsCall",
    "TransferCall",
    "UpdatePolicyCall",
    "check_call",
]
