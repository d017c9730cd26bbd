"""A queue's stats from its leader, asked on a node whose replica of it follows.

Rule: a follower's copy of the queue lags its leader's (entries not yet applied here,
and the leader's own figures: consumers, leases, rates), so ``GET /queues/{name}`` on a
node that does not lead asks the leader's node (``StatsCall``), bounded by
``Limits.leader_stats_deadline_ms`` so that a dead or cut-off leader costs a short wait,
not a call deadline. The answer is marked as the leader's (``remote.from_node``, age 0).
When there is no leader, or it does not answer in time, the node answers with its own
copy marked ``status: "stale"``, its age being the time since this replica last heard
from a leader (None if it never did). A replica that leads, or a node without peers,
answers with its own copy as it is.
"""

from __future__ import annotations

from engine.errors import QuorraError
from engine.ids import NodeName
from engine.raft.server import Role
from engine.runtime import observe
from engine.runtime.context import NodeContext
from engine.runtime.forwarding import with_age
from engine.runtime.replica import Replica, node_of
from engine.runtime.routing import StatsCall


async def leader_stats(ctx: NodeContext, rep: Replica) -> dict[str, object]:
    """The stats of ``rep``'s queue as its leader has them (see the module's rule)."""
    raft = rep.raft
    leader = None if raft.leader is None else NodeName(node_of(raft.leader))
    if raft.role is Role.LEADER or leader == ctx.name:
        return observe.queue_stats(rep, ctx.clock.monotonic_ms(), ctx.limits)
    if leader is not None:
        try:  # the call's deadline is short (``tcp_calls.call_deadline_ms``)
            answer = await ctx.transport.call(leader, StatsCall(rep.name))
        except QuorraError:
            answer = None
        if isinstance(answer, dict):
            return with_age(answer, leader, 0)
    return stale_stats(ctx, rep)


def stale_stats(ctx: NodeContext, rep: Replica) -> dict[str, object]:
    """``rep``'s own stats, marked stale, aged since it last heard from a leader."""
    now = ctx.clock.monotonic_ms()
    own = observe.queue_stats(rep, now, ctx.limits)
    contact = rep.raft.leader_contact_ms
    age_ms = now - contact if contact >= 0 else None
    return {**own, "status": "stale", "remote": {"from_node": ctx.name, "age_ms": age_ms}}


__all__ = ["leader_stats", "stale_stats"]
