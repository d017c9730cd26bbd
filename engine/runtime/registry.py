"""Queue create and delete on a cluster node: through the metadata group.

Rule: the metadata log decides that a queue exists; replicas follow. A create proposes
``CreateQueue`` (the machine makes the name unique cluster-wide, assigns the uid and
places the replicas with ``engine.cluster.placement``; the same name and arguments again
answer the same queue), a delete proposes ``DeleteQueue`` (the queue is ``deleting``
until every member reported its replica dropped, then a tombstone). Every node's
reconcile loop (``engine.runtime.reconciling``) then creates or drops its replica; a
member that is down does so when it comes back. The caller waits for this node's own
pass: once a create answers, the queue is served here if this node is a member (its
group elected a leader: the first entry applied here), up to ``Limits.leader_wait_ms``.

A policy change commits in the queue's own log first (its replicas apply it in order
with the messages, as on a single node), then the queue's leader proposes the policy it
applied to the metadata (``record_policy``), so that every node lists it and a replica
created later is defined with it. A crash, or a metadata without a leader, between the
two leaves the metadata behind the queue's log; the leader's reconcile pass proposes it
again (``Reconciler.policies``), so the two agree once the pass runs. The record keeps
the policy the queue was created with (``QueueRecord.created_policy``): a replica
created later starts from it and replays the change from the log.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from engine.cluster import QueueCreated, QueueDeleting, QueueExists
from engine.cluster import meta_commands as mc
from engine.errors import NoLeader, QuorraError
from engine.runtime.api import QueueArgs, QueueInfo
from engine.runtime.meta import policy_of
from engine.runtime.reconciling import args_of

if TYPE_CHECKING:
    from engine.runtime.context import NodeContext
    from engine.runtime.meta_group import MetaGroup
    from engine.runtime.replica import Replica

log = logging.getLogger("quorra.engine")


class Registry:
    """A cluster node's queue creates and deletes (see the module's rule)."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx

    @property
    def group(self) -> MetaGroup:
        group = self.ctx.meta_group
        assert group is not None, "a cluster node"
        return group

    async def create_queue(self, name: str, args: QueueArgs) -> tuple[QueueInfo, bool]:
        """``args`` checked already (``replicas`` resolved)."""
        ctx = self.ctx
        assert args.replicas is not None
        policy = policy_of(args, ctx.limits)
        async with ctx.admit():
            await self.group.wait_bootstrapped()
            reply = await self.group.propose(mc.CreateQueue(name, args.replicas, policy))
            assert isinstance(reply, QueueCreated | QueueExists), reply
            record = self.group.machine.queue_by_uid(reply.uid)
            if record is None:
                raise NoLeader(f"queue {name}: not applied on {ctx.name} yet, retry")
            info = QueueInfo(record.name, record.uid, args_of(record), record.created_at_ms)
            if ctx.name in record.members:
                await self.wait_served(record.uid)
            else:
                await ctx.forwarder.wait_live(record.name)
            return info, isinstance(reply, QueueCreated)

    async def wait_served(self, uid: str) -> None:
        """Until this node's replica of ``uid`` applied its group's first entry (a leader
        was elected), up to the limit: the reconcile pass creates it meanwhile."""
        ctx = self.ctx
        ctx.reconciler.trigger()
        loop = ctx.loop
        deadline = loop.time() + ctx.limits.leader_wait_ms / 1000
        while loop.time() < deadline:
            rep = ctx.by_uid.get(uid)
            if rep is not None and (rep.applied_index > 0 or rep.closed):
                return
            await asyncio.sleep(ctx.limits.poll_interval_ms / 1000)

    async def record_policy(self, rep: Replica) -> None:
        """The metadata's record takes the policy ``rep``'s log applied (see the
        module's rule); a failure is left to the reconcile pass."""
        group = self.ctx.meta_group
        if group is None:
            return
        rec = group.machine.queue_by_uid(rep.uid)
        if rec is None or rec.policy == rep.machine.policy:
            return
        try:
            await group.propose(mc.SetQueuePolicy(rep.uid, rep.machine.policy))
        except QuorraError as e:
            log.warning("queue %s: policy not recorded in the metadata yet: %s", rep.name, e)
            self.ctx.reconciler.trigger()

    async def delete_queue(self, name: str) -> None:
        """Returns once the delete committed and this node dropped its replica (up to
        the limit); the other members drop theirs as they reconcile."""
        ctx = self.ctx
        async with ctx.admit():
            reply = await self.group.propose(mc.DeleteQueue(name, ""))
            assert isinstance(reply, QueueDeleting), reply
            ctx.reconciler.trigger()
            loop = ctx.loop
            deadline = loop.time() + ctx.limits.leader_wait_ms / 1000
            while reply.uid in ctx.by_uid and loop.time() < deadline:
                await asyncio.sleep(ctx.limits.poll_interval_ms / 1000)


__all__ = ["Registry"]
