"""Draining and forgetting nodes on a cluster node: its led queues' replicas moved.

Rule: the metadata says which nodes are ``draining`` or ``lost`` (``POST
/cluster/nodes/{node}/drain`` and ``.../forget`` only set that state); each node moves
the replicas of the queues it leads, one change per queue at a time, each chosen by
``engine.cluster.moving.next_step`` from the metadata and the group as they are now. A
pass runs whenever the reconcile loop is asked for one (every applied change that names
queues or nodes, and every ``Limits.reconcile_interval_ms``), never two at once; a pass
that changed something asks for another. A crash anywhere leaves what the metadata and
the group say, from which the next pass (of whichever node leads then) goes on.

The metadata's leader also forgets each lost node that no creating or live queue places
a replica on any more.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

from engine.cluster import meta_commands as mc
from engine.cluster import moving
from engine.errors import QuorraError
from engine.ids import NodeName
from engine.raft.events import RemoveServer
from engine.raft.server import Role
from engine.runtime.passes import Passes
from engine.runtime.replica import Replica, node_of, server_id
from engine.runtime.routing import DeleteReplica

if TYPE_CHECKING:
    from engine.cluster import QueueRecord
    from engine.runtime.context import NodeContext

log = logging.getLogger("quorra.engine")


class Mover(Passes):
    """Runs a node's passes over the queues it leads (see the module's rule)."""

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.steps = 0
        """Changes made (for the tests and the stats)."""

    async def one_pass(self) -> bool:
        """One step for each queue led here that has one; whether any step ran."""
        group = self.ctx.meta_group
        if group is None or not group.caught_up():
            return False
        machine = group.machine
        if not any(n.state in moving.LEAVING for n in machine.nodes.values()):
            return False
        stepped = False
        for rep in sorted(self.ctx.replicas.values(), key=lambda r: r.name):
            rec = machine.queue_by_uid(rep.uid)
            if rep.closed or rep.raft.role is not Role.LEADER or rec is None:
                continue
            step = moving.next_step(machine.nodes, machine.queues.values(), rec, self.view(rep))
            if step is None:
                continue
            try:
                await self.perform(rep, rec, step)
            except QuorraError as e:
                log.warning("moving %s of queue %s failed: %s", step, rep.name, e)
                continue
            self.steps += 1
            stepped = True
        return await self.maybe_forget() or stepped

    def view(self, rep: Replica) -> moving.GroupView:
        config, changes = rep.raft.config, rep.raft.membership
        busy = changes.catch_up is not None or changes.change is not None
        voters = tuple(sorted(node_of(s) for s in config.voters))
        learners = tuple(sorted(node_of(s) for s in config.learners))
        links = self.ctx.transport.health()
        down = tuple(sorted(n for n, link in links.items() if not link.connected))
        return moving.GroupView(self.ctx.name, voters, learners, busy, down)

    async def perform(self, rep: Replica, rec: QueueRecord, step: moving.Step) -> None:
        membership = self.ctx.membership
        log.info("moving: queue %s: %s", rep.name, step)
        if isinstance(step, moving.TransferLeader):
            await membership.transfer_local(rep, step.target)
        elif isinstance(step, moving.AddReplica):
            await membership.add_member_local(rep, step.target)
        else:
            await self.remove(rep, step.source)

    async def remove(self, rep: Replica, node: str) -> None:
        """``node``'s replica out of the group (if it is in it), out of the metadata,
        then deleted there (a lost node's reconcile loop would drop it as an orphan)."""
        membership = self.ctx.membership
        sid = server_id(node, rep.uid)
        if sid in rep.raft.config.members:
            await membership.change(rep, RemoveServer(membership.request_id(rep), sid))
        await membership.placed(rep, node, added=False)
        with contextlib.suppress(QuorraError):
            await self.ctx.transport.call(NodeName(node), DeleteReplica(rep.uid))

    async def maybe_forget(self) -> bool:
        """On the metadata's leader: forget the lost nodes that hold no replica."""
        group = self.ctx.meta_group
        if group is None or group.raft.role is not Role.LEADER:
            return False
        machine = group.machine
        done = False
        for name in sorted(machine.nodes):
            if machine.nodes[name].state != "lost":
                continue
            if moving.holding(machine.queues.values(), name):
                continue
            try:
                await group.propose(mc.SetNodeState(name, "forgotten"))
            except QuorraError as e:
                log.info("moving: node %s not forgotten yet: %s", name, e)
                continue
            log.warning("node %s is forgotten: it held no replica any more", name)
            done = True
        return done


__all__ = ["Mover"]
