"""Client operations on a node that hosts no replica of their queue.

Rule: on a cluster node, a queue that is live in the metadata but has no replica here is
served by forwarding, as a queue whose replica here follows is (``routing``): each call
goes in one hop to the node of the queue's leader, which checks and admits it as its
own and never forwards it again. This node learns the leader from the queue's members:
it asks them in turn (``LeaderOfCall``; a member waits for an election up to
``Limits.leader_wait_ms``) and keeps the answer per queue until a call through it fails,
so that only the first call of a run pays the question. A failed call is not retried
here (it may have run): the client retries, with its dedup id, and the next call asks
again. The leader's stats are kept the same way, for ``GET /queues`` and the dashboard,
with the time they were fetched (``stats_age_ms``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from engine.cluster.records import QueueRecord
from engine.errors import NoLeader, QueueNotFound, QuorraError
from engine.ids import NodeName
from engine.limits import Limits
from engine.runtime.routing import LeaderCall, LeaderOfCall, StatsCall

if TYPE_CHECKING:
    from engine.runtime.context import NodeContext

log = logging.getLogger("quorra.engine")


class Forwarder:
    """A node's view of the queues it does not host: their leaders and last stats."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx
        self.leaders: dict[str, NodeName] = {}
        """Queue name -> the node last known to lead it (from a member's answer)."""
        self.stats: dict[str, tuple[dict[str, object], int]] = {}
        """Queue name -> the leader's last stats and when they came (monotonic ms)."""
        self.refreshing: set[str] = set()

    def remote(self, name: str) -> QueueRecord | None:
        """The metadata record of ``name`` if it is live and has no replica here: this
        node is no member, or a member whose replica its reconcile pass has not created
        yet (a replica being added here: served by forwarding until it exists)."""
        ctx = self.ctx
        group = ctx.meta_group
        if group is None or name in ctx.replicas or name in ctx.failed:
            return None
        rec = group.machine.queues.get(name)
        if rec is None or rec.state != "live":
            return None
        return rec

    def remotes(self) -> list[QueueRecord]:
        """Every live queue that has no replica here, by name."""
        group = self.ctx.meta_group
        if group is None:
            return []
        names = sorted(group.machine.queues)
        return [rec for rec in map(self.remote, names) if rec is not None]

    def record(self, name: str) -> QueueRecord:
        rec = self.remote(name)
        if rec is None:
            raise QueueNotFound(f"no queue {name}")
        return rec

    def forget(self, name: str) -> None:
        self.leaders.pop(name, None)

    def prune(self) -> None:
        """Drop what is kept about queues that are no longer remote (deleted, or hosted
        here now)."""
        for cache in (self.leaders, self.stats):
            for name in [n for n in cache if self.remote(n) is None]:
                del cache[name]

    def bound(self) -> None:
        """Prune once a cache holds more entries than the metadata holds queues (not
        deleted), so that none ever does: a check per fetch, a walk only when a queue
        went away (not one walk per fetch, which a listing of many queues would pay
        once per queue)."""
        group = self.ctx.meta_group
        live = 0 if group is None else group.machine.live_queue_count()
        if max(len(self.leaders), len(self.stats)) > live:
            self.prune()

    async def leader(self, name: str) -> NodeName:
        """The node of the leader of remote queue ``name``: the kept answer, or the first
        member that names one, within ``Limits.leader_wait_ms``."""
        rec = self.record(name)
        known = self.leaders.get(name)
        if known is not None:
            return known
        ctx = self.ctx
        deadline = ctx.loop.time() + ctx.limits.leader_wait_ms / 1000
        last: QuorraError = NoLeader(f"queue {name} has no leader yet")
        for member in _leader_first(rec, ctx.name):
            remaining_s = deadline - ctx.loop.time()
            if remaining_s <= 0:
                break
            try:
                ask = ctx.transport.call(NodeName(member), LeaderOfCall(name))
                answer = await asyncio.wait_for(ask, remaining_s)
            except QuorraError as e:  # that member is down, or has no replica yet
                last = e
                continue
            except TimeoutError:
                last = NoLeader(f"node {member} did not answer in time")
                continue
            if isinstance(answer, str) and answer in rec.members:
                self.leaders[name] = NodeName(answer)
                self.bound()
                return NodeName(answer)
        raise NoLeader(f"queue {name}: no member named its leader ({last.detail})")

    async def forward(self, call: LeaderCall) -> object:
        """Run ``call`` on the node of its remote queue's leader (one hop)."""
        leader = await self.leader(call.name)
        try:
            return await self.ctx.transport.call(leader, call)
        except QueueNotFound:
            self.forget(call.name)
            if self.remote(call.name) is None:
                raise
            raise NoLeader(f"queue {call.name}: its leader moved, retry") from None
        except NoLeader:
            self.forget(call.name)
            raise

    async def fetch_stats(self, name: str) -> dict[str, object]:
        """The leader's stats of remote queue ``name``, kept for ``cached_stats``."""
        answer = await self.forward(StatsCall(name))
        if not isinstance(answer, dict):
            raise NoLeader(f"queue {name}: its leader sent no stats")
        self.stats[name] = (answer, self.ctx.clock.monotonic_ms())
        self.bound()
        return with_age(answer, self.leaders.get(name), 0)

    def cached_stats(self, name: str) -> dict[str, object] | None:
        """The kept stats of remote queue ``name`` with their age, or None; kept stats
        older than ``Limits.remote_stats_max_age_ms`` are fetched again meanwhile."""
        ctx = self.ctx
        self.record(name)
        kept = self.stats.get(name)
        now = ctx.clock.monotonic_ms()
        if kept is None or now - kept[1] > ctx.limits.remote_stats_max_age_ms:
            self.refresh(name)
        if kept is None:
            return None
        return aged(kept[0], self.leaders.get(name), now - kept[1], ctx.limits)

    def refresh(self, name: str) -> None:
        if name in self.refreshing or not self.ctx.running:
            return
        self.refreshing.add(name)

        async def run() -> None:
            try:
                with contextlib.suppress(QuorraError):
                    await self.fetch_stats(name)
            finally:
                self.refreshing.discard(name)

        self.ctx.spawn(run())

    async def wait_live(self, name: str) -> None:
        """After a create through this node, which is no member: until a member names
        the queue's leader (its replicas exist and elected one), up to the limit."""
        ctx = self.ctx
        loop = ctx.loop
        deadline = loop.time() + ctx.limits.leader_wait_ms / 1000
        while loop.time() < deadline:
            if self.remote(name) is not None:
                with contextlib.suppress(QuorraError):
                    await self.leader(name)
                    return
            await asyncio.sleep(ctx.limits.poll_interval_ms / 1000)


def _leader_first(rec: QueueRecord, me: str) -> list[str]:
    """The members to ask (not this node), the placement's leader hint first."""
    others = [m for m in rec.members if m != me]
    return sorted(others, key=lambda m: (m != rec.leader, m))


def with_age(stats: dict[str, object], leader: str | None, age_ms: int) -> dict[str, object]:
    """A remote queue's stats as the leader sent them, marked as fetched ``age_ms`` ago
    from ``leader``."""
    return {**stats, "remote": {"from_node": leader, "age_ms": age_ms}}


def aged(
    stats: dict[str, object], leader: str | None, age_ms: int, limits: Limits
) -> dict[str, object]:
    """Kept stats of a queue's leader, marked as fetched ``age_ms`` ago from ``leader``,
    and ``status: "stale"`` past ``Limits.remote_stats_max_age_ms``."""
    marked = with_age(stats, leader, age_ms)
    if age_ms > limits.remote_stats_max_age_ms:
        marked["status"] = "stale"
    return marked


__all__ = ["Forwarder", "aged", "with_age"]
