"""Membership and leadership of a queue's Raft group, as the node changes them.

Rule: one change at a time, run on the leader's node (``routing``). An added member's
replica is created first (it starts with no configuration: it neither votes nor
campaigns), joins as a learner, catches up and becomes a voter; a removed member's
replica is deleted once the change commits. On a cluster node the metadata follows too
(``AddMember`` before the replica is created, ``RemoveMember`` once the group no longer
names it), so that every node's reconcile loop agrees with the group. The queue's definition follows the group's
configuration as its entries reach the log (``maybe_members_changed``), so that a
restart bootstraps from the right members. A leadership transfer returns once the new
node leads.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from typing import TYPE_CHECKING

from engine.cluster.meta_commands import AddMember, RemoveMember
from engine.errors import NoLeader, QueueConflict, QueueNotFound, QuorraError, ValidationFailed
from engine.ids import NodeName, ServerId
from engine.raft.events import AddServer, RemoveServer, TransferLeadership
from engine.runtime.api import QueueInfo
from engine.runtime.catalog import queue_info
from engine.runtime.replica import Proposal, Replica, node_of, server_id
from engine.runtime.routing import (
    AddMemberCall,
    CreateReplica,
    DeleteReplica,
    RemoveMemberCall,
    TransferCall,
)

if TYPE_CHECKING:
    from engine.runtime.context import NodeContext


class Membership:
    """Adds and removes a queue's replicas and moves its leadership."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx

    def maybe_members_changed(self, rep: Replica) -> None:
        """The group's configuration changed (a config entry is in the log): the queue's
        definition follows it, so a restart bootstraps from the right members.

        Asked after every step of every replica: the usual answer (the voters, one by
        one, are the definition's members, and no learner) is found without building
        the sorted set of names that a change needs, and is remembered until the
        configuration or the definition changes (each is replaced, never changed in
        place)."""
        config = rep.raft.config
        meta = rep.meta
        checked = rep.members_checked
        if checked is not None and checked[0] is config and checked[1] is meta:
            return  # neither changed since they last agreed
        known = meta.members
        if (
            not config.learners
            and len(config.voters) == len(known)
            and all(node_of(v) == m for v, m in zip(config.voters, known, strict=True))
        ):
            rep.members_checked = (config, meta)
            return
        members = tuple(sorted({node_of(m) for m in config.members}))
        if not members or members == rep.meta.members or self.ctx.name not in members:
            return
        rep.meta = dataclasses.replace(rep.meta, members=members)
        self.ctx.catalog.write_meta(rep)

    async def add_member(self, name: str, node: str) -> QueueInfo:
        """Add a replica of the queue on ``node`` (``POST /queues/{name}/members``): it
        joins as a learner, catches up, and becomes a voter; one change at a time."""
        members = self.members_of(name)
        if node not in self.ctx.transport.nodes():
            raise ValidationFailed(f"{node} is not a node of this cluster")
        if node in members:
            raise QueueConflict(f"queue {name} already has a replica on {node}")
        async with self.ctx.admit():
            result = await self.ctx.router.route(AddMemberCall(name, node))
        assert isinstance(result, QueueInfo)
        return result

    async def remove_member(self, name: str, node: str) -> QueueInfo:
        """Remove the queue's replica on ``node`` (``DELETE /queues/{name}/members/{node}``)."""
        members = self.members_of(name)
        if node not in members:
            raise QueueNotFound(f"queue {name} has no replica on {node}")
        if len(members) == 1:
            raise QueueConflict(f"queue {name} has one replica: delete the queue instead")
        async with self.ctx.admit():
            result = await self.ctx.router.route(RemoveMemberCall(name, node))
        assert isinstance(result, QueueInfo)
        return result

    async def add_member_local(self, rep: Replica, node: str) -> QueueInfo:
        sid = server_id(node, rep.uid)
        # On a cluster node the metadata places the replica first: the target's
        # reconcile loop would drop a replica that no record places there.
        await self.placed(rep, node, added=True)
        await self.ctx.transport.call(NodeName(node), CreateReplica(rep.meta))
        try:
            await self.change(rep, AddServer(self.request_id(rep), sid))
        except QuorraError:
            await self._undo_add(rep, node, sid)
            raise
        return queue_info(rep.meta)

    async def placed(self, rep: Replica, node: str, *, added: bool) -> None:
        """Record in the metadata (a cluster node's) that the queue's replica on ``node``
        is added or removed, against the members' generation this node knows; a
        metadata that already says so changes nothing."""
        group = self.ctx.meta_group
        if group is None:
            return
        record = group.machine.queue_by_uid(rep.uid)
        if record is None or (node in record.members) == added:
            return
        command = AddMember if added else RemoveMember
        await group.propose(command(rep.uid, node, record.generation))

    async def _undo_add(self, rep: Replica, node: str, sid: ServerId) -> None:
        """An addition that failed leaves no replica behind: a learner it left in the
        group is removed first, then the new replica deleted. If the server became a
        voter after all, or the learner cannot be removed now (another change pending,
        no leader), the replica stays: the group still names it."""
        config = rep.raft.config
        if sid in config.voters:
            return
        with contextlib.suppress(QuorraError):
            if sid in config.members:
                await self.change(rep, RemoveServer(self.request_id(rep), sid))
            await self.placed(rep, node, added=False)
            await self.ctx.transport.call(NodeName(node), DeleteReplica(rep.uid))

    async def remove_member_local(self, rep: Replica, node: str) -> QueueInfo:
        await self.change(rep, RemoveServer(self.request_id(rep), server_id(node, rep.uid)))
        await self.placed(rep, node, added=False)
        info = queue_info(rep.meta)
        if node == self.ctx.name:
            await self.ctx.catalog.delete_replica(rep.uid)
        else:
            with contextlib.suppress(NoLeader, QueueNotFound):
                await self.ctx.transport.call(NodeName(node), DeleteReplica(rep.uid))
        return info

    @staticmethod
    def request_id(rep: Replica) -> int:
        request_id = rep.next_request_id
        rep.next_request_id += 1
        return request_id

    async def transfer_leadership(self, name: str, node: str) -> None:
        """Hand the queue's leadership to its replica on ``node`` (``POST
        /queues/{name}/leader``); returns once that node leads, or raises ``NoLeader``."""
        if node not in self.members_of(name):
            raise ValidationFailed(f"queue {name} has no replica on {node}")
        async with self.ctx.admit():
            await self.ctx.router.route(TransferCall(name, node))
        loop = self.ctx.loop
        deadline = loop.time() + self.ctx.limits.leader_wait_ms / 1000
        while await self.leader_seen(name) != node:
            if loop.time() > deadline:
                raise NoLeader(f"queue {name}: {node} did not take over in time, retry")
            await asyncio.sleep(self.ctx.limits.poll_interval_ms / 1000)

    def members_of(self, name: str) -> tuple[str, ...]:
        """The queue's members: its replica's here, else the metadata's (a queue this
        node serves by forwarding), else ``QueueNotFound``."""
        remote = self.ctx.forwarder.remote(name)
        return self.ctx.replica(name).meta.members if remote is None else remote.members

    async def leader_seen(self, name: str) -> str | None:
        """The queue's leader as its replica here knows it, or as a member says now."""
        ctx = self.ctx
        if ctx.forwarder.remote(name) is None:
            rep = ctx.replica(name)
            if rep.closed:
                raise NoLeader(f"queue {name}: its replica here closed, retry")
            return None if rep.raft.leader is None else node_of(rep.raft.leader)
        ctx.forwarder.forget(name)
        with contextlib.suppress(NoLeader):
            return await ctx.forwarder.leader(name)
        return None

    async def transfer_local(self, rep: Replica, node: str) -> None:
        if node == self.ctx.name:
            return
        event = TransferLeadership(self.request_id(rep), server_id(node, rep.uid))
        await self._step_and_wait(rep, event, self.ctx.limits.leader_wait_ms, f"transfer to {node}")

    async def change(self, rep: Replica, event: AddServer | RemoveServer) -> None:
        """Step a membership change and wait until its entry commits."""
        timeout_ms = self.ctx.limits.proposal_timeout_ms
        await self._step_and_wait(rep, event, timeout_ms, "membership change")

    async def _step_and_wait(
        self,
        rep: Replica,
        event: AddServer | RemoveServer | TransferLeadership,
        timeout_ms: int,
        what: str,
    ) -> None:
        """Step ``event`` on the leader's core and wait for its completion (or its
        refusal, raised as the operating error it maps to)."""
        ctx = self.ctx
        future: asyncio.Future[object] = ctx.loop.create_future()
        rep.own_proposals()[event.request_id] = Proposal(future, None)
        ctx.timers.tick(rep)
        rep.raft.step(event)
        ctx.hosting.schedule(rep)
        try:
            await asyncio.wait_for(future, timeout_ms / 1000)
        except TimeoutError:
            raise NoLeader(f"queue {rep.name}: {what} timed out") from None
        finally:
            rep.proposals.pop(event.request_id, None)


__all__ = ["Membership"]
