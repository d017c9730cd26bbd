"""The cluster's nodes as the metadata records them: whom the transport reaches, and
who replicates and votes in the metadata group.

Rule: the metadata's node records are the truth about the cluster's nodes; the peers
given at start only bootstrap it. On every replica, each applied change of the nodes
(and a snapshot) tells the transport (``PeerBook``) every node's address: a node that
joined later is reached, a forgotten one no longer (a node the metadata does not know
yet stays: an initial member is known before its ``AddNode`` applies).

On the metadata group's leader, a pass (with each reconcile pass: after every change
and every ``Limits.reconcile_interval_ms``) makes the group's configuration follow the
records, one Raft change at a time, as ``engine.cluster.meta_voters.next_change``
decides: forgotten members removed once they stopped (no answer to the leader for
the longest election timeout), joined nodes added as learners, learners promoted while
there are fewer voters than ``Limits.meta_voters_max`` (so a learner takes a forgotten
voter's place), a draining voter's vote handed to a learner (the learner promoted, then
the draining voter demoted, after a transfer of the leadership if it leads). A change
that fails (a learner not caught up, leadership lost) is tried again by a later pass.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from engine.cluster import MetaChanged
from engine.cluster.meta_voters import VoterChange, next_change
from engine.cluster.records import split_address
from engine.errors import QuorraError
from engine.ids import NodeName
from engine.raft.events import AddServer, DemoteServer, RemoveServer, TransferLeadership
from engine.raft.server import Role
from engine.runtime.passes import Passes
from engine.runtime.replica import Proposal, node_of, server_id
from engine.runtime.transport import PeerBook

if TYPE_CHECKING:
    from engine.runtime.context import NodeContext
    from engine.runtime.meta_group import MetaGroup

log = logging.getLogger("quorra.engine")


class MetaMembers(Passes):
    """Follows the metadata's nodes (see the module's rule)."""

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.changes = 0
        """Membership changes of the metadata group this node made (for the tests)."""

    def on_change(self, change: MetaChanged | None) -> None:
        """A metadata listener."""
        if change is None or change.nodes:
            self.learn_peers()
            self.trigger()

    def learn_peers(self) -> None:
        ctx = self.ctx
        group = ctx.meta_group
        transport = ctx.transport
        if group is None or group.driver is None or not isinstance(transport, PeerBook):
            return
        peers: dict[NodeName, tuple[str, int]] = {}
        gone: list[NodeName] = []
        for name, rec in sorted(group.machine.nodes.items()):
            address = split_address(rec.address)
            if rec.state == "forgotten":
                gone.append(NodeName(name))
            elif address is not None and name != ctx.name:
                peers[NodeName(name)] = address
        transport.learn_peers(peers, gone)

    async def one_pass(self) -> bool:
        ctx = self.ctx
        group = ctx.meta_group
        if group is None or not group.caught_up() or group.raft.role is not Role.LEADER:
            return False
        raft = group.raft
        config = raft.config
        # Heard: answered within the longest election timeout (a follower that is up
        # answers a few heartbeats in it). Not ``recent_active``, which each check of the
        # quorum clears: in the moment after it, a forgotten node that is up but has not
        # applied the entry that forgot it yet would be removed, and never be told.
        since = raft.now_ms - ctx.limits.election_timeout_ms_max
        heard = [node_of(s) for s, pr in raft.progress.items() if pr.heard_ms >= since]
        change = next_change(
            group.machine.nodes,
            [node_of(s) for s in config.voters],
            [node_of(s) for s in config.learners],
            ctx.name,
            ctx.limits.meta_voters_max,
            heard,
        )
        if change is None:
            return False
        return await self.make(group, change)

    async def make(self, group: MetaGroup, change: VoterChange) -> bool:
        """Step ``change`` into the leader's core; whether it committed in time."""
        ctx = self.ctx
        sid = server_id(change.node, group.uid)
        request_id = group.next_request_id
        group.next_request_id += 1
        event: AddServer | RemoveServer | DemoteServer | TransferLeadership
        if change.kind == "remove":
            event = RemoveServer(request_id, sid)
        elif change.kind == "demote":
            event = DemoteServer(request_id, sid)
        elif change.kind == "transfer":
            event = TransferLeadership(request_id, sid)
        else:
            event = AddServer(request_id, sid, learner_only=change.kind == "add_learner")
        future: asyncio.Future[object] = ctx.loop.create_future()
        group.proposals[request_id] = Proposal(future, None)
        log.info("metadata: %s %s", change.kind.replace("_", " "), change.node)
        group.tick()
        group.raft.step(event)
        group.schedule()
        try:
            await asyncio.wait_for(future, ctx.limits.cluster_call_deadline_ms / 1000)
        except (QuorraError, TimeoutError) as e:
            log.info("metadata: %s %s not done (%s)", change.kind, change.node, e or "timeout")
            return False
        finally:
            group.proposals.pop(request_id, None)
        self.changes += 1
        return True


__all__ = ["MetaMembers"]
