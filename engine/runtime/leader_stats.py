"""The leader's stats of a queue, on a node whose replica of it follows or that has none.

Rule: a follower's copy of a queue lags its leader's (entries not yet applied here, and
the leader's own figures: consumers, leases, rates); a node without a replica has none.
So the stats shown on such a node are its leader's, marked as such (``remote.from_node``,
``remote.age_ms``), two ways:

* one queue now (``GET /queues/{name}``): ``leader_stats`` asks the leader's node
  (``StatsCall``), bounded by ``Limits.leader_stats_deadline_ms`` so that a dead or
  cut-off leader costs a short wait, not a call deadline; the answer has age 0;
* every listed queue (``GET /queues``, the dashboard, the metrics): asking each leader
  per queue per listing would cost a call per queue per request; instead, every half
  ``Limits.remote_stats_max_age_ms``, ``LedStats`` asks each node that leads queues this
  node lists one ``LedStatsCall`` naming them (``Limits.led_stats_queues_max`` at most
  per call), within the same deadline, and keeps the answers with the time they came. A
  listing reads what is kept (``stats_of``), ``status: "stale"`` once older than
  ``remote_stats_max_age_ms`` (a leader that stopped answering). Queues with no replica
  here are kept in the forwarder's cache (``engine.runtime.forwarding``), which this
  refresh fills for those whose leader it knows, so that its own per-queue fetch seldom
  runs.

Both share one fallback: with no leader, no answer in time, or nothing kept from the
current leader, a follower shows its own copy marked ``status: "stale"``, its age the
time since this replica last heard from a leader (None if it never did)
(``stale_stats``). A replica that leads, or a node without peers, shows its own copy as
it is.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from engine.errors import QuorraError
from engine.ids import NodeName
from engine.raft.server import Role
from engine.runtime import observe
from engine.runtime.forwarding import aged, with_age
from engine.runtime.replica import Replica, node_of
from engine.runtime.routing import LedStatsCall, StatsCall

if TYPE_CHECKING:
    from engine.runtime.context import NodeContext

log = logging.getLogger("quorra.engine")


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


class LedStats:
    """The kept leader stats of this node's followed and remote queues."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx
        self.kept: dict[str, tuple[dict[str, object], NodeName, int]] = {}
        """Queue name -> its leader's stats, that leader, when they came (monotonic ms)."""
        self.rounds = 0

    def start(self) -> None:
        self.ctx.spawn(self.run())

    async def run(self) -> None:
        interval_s = self.ctx.limits.remote_stats_max_age_ms / 2000
        while self.ctx.running:
            await self.refresh()
            await asyncio.sleep(interval_s)

    def wanted(self) -> dict[NodeName, list[str]]:
        """Each other node that leads queues listed here, with those queues."""
        ctx = self.ctx
        asked: dict[NodeName, list[str]] = {}
        for name, rep in ctx.replicas.items():
            if rep.dormant is not None:
                continue  # a sleeping queue is a lone voter, its own leader: nothing to ask
            leader = rep.raft.leader
            if rep.raft.role is Role.LEADER or leader is None or name in ctx.failed:
                continue
            node = NodeName(node_of(leader))
            if node != ctx.name:
                asked.setdefault(node, []).append(name)
        for rec in ctx.forwarder.remotes():
            known = ctx.forwarder.leaders.get(rec.name)
            if known is not None and known != ctx.name:
                asked.setdefault(known, []).append(rec.name)
        return asked

    async def refresh(self) -> None:
        """One round: a call per leader node (per chunk of its queues), all at once."""
        ctx = self.ctx
        asked = self.wanted()
        listed = {name for names in asked.values() for name in names}
        for name in [n for n in self.kept if n not in listed]:
            del self.kept[name]  # led here now, deleted, or its leader unknown
        size = ctx.limits.led_stats_queues_max
        calls = [
            self.ask(node, tuple(names[i : i + size]))
            for node, names in sorted(asked.items())
            for i in range(0, len(names), size)
        ]
        await asyncio.gather(*calls)
        self.rounds += 1

    async def ask(self, node: NodeName, names: tuple[str, ...]) -> None:
        ctx = self.ctx
        deadline_s = ctx.limits.leader_stats_deadline_ms / 1000
        try:
            call = ctx.transport.call(node, LedStatsCall(names))
            answer = await asyncio.wait_for(call, deadline_s)
        except (QuorraError, TimeoutError) as e:
            log.debug("led stats: %s did not answer: %s", node, e)
            return  # what is kept ages, and is shown stale
        if not isinstance(answer, dict):
            return
        now = ctx.clock.monotonic_ms()
        for name in names:
            stats = answer.get(name)
            if not isinstance(stats, dict):
                continue
            self.kept[name] = (stats, node, now)
            if name not in ctx.replicas:
                ctx.forwarder.stats[name] = (stats, now)

    def stats_of(self, rep: Replica) -> dict[str, object] | None:
        """The leader's stats of follower ``rep``'s queue, with their age (see the
        module's rule); ``None`` when ``rep`` leads (its own are the leader's)."""
        ctx = self.ctx
        if rep.dormant is not None:
            return None  # sleeping: a lone voter that leads (read without waking it)
        leader = rep.raft.leader
        if rep.raft.role is Role.LEADER:
            return None
        kept = self.kept.get(rep.name)
        if kept is None or leader is None or kept[1] != node_of(leader):
            return stale_stats(ctx, rep)
        return aged(kept[0], kept[1], ctx.clock.monotonic_ms() - kept[2], ctx.limits)


__all__ = ["LedStats", "leader_stats", "stale_stats"]
