"""The timers of the replicas a node hosts, on the loop, armed only when needed.

Rule: a replica has at most two timers. The Raft tick fires at the core's next deadline
(``RaftServer.next_deadline_ms``: heartbeats on a leader with followers, the election
timeout on a follower; none for a lone leader), on the monotonic clock. The expiry timer
runs on the leader only, at the machine's next deadline, which is a leader time stamped
from the wall clock; it proposes ``encode_expire()``, one at a time. An idle
single-replica queue costs no work at all. The core's clocks are stepped (``tick``)
before each event stepped into it, since it stamps entries with the last wall time it saw.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from engine.errors import EntryDamaged, QuorraError, StorageFailed
from engine.queue import encode_expire
from engine.raft.events import Tick
from engine.raft.server import Role
from engine.runtime.replica import Replica
from engine.storage import Checkpoint

if TYPE_CHECKING:
    from engine.runtime.context import NodeContext

log = logging.getLogger("quorra.engine")

_TIMER_CONTEXT = contextvars.Context()
"""The context every timer runs its callback in: the engine keeps no context variables,
and a timer armed without one copies the current context, one more object per armed
replica for the collector to walk (10,000 woken queues, each with a timer)."""


class Timers:
    """Arms and fires the tick and expiry timers of every replica of a node."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx
        # Bound once: a bound method made at each arming is one more object per armed
        # replica that the timer holds until it fires.
        self._on_tick = self.on_tick
        self._on_expire = self.on_expire

    def arm_tick(self, rep: Replica) -> None:
        due = rep.raft.next_deadline_ms()
        if due is None:
            return
        if rep.tick_handle is not None and rep.tick_due_ms <= due:
            return
        if rep.tick_handle is not None:
            rep.tick_handle.cancel()
        rep.tick_due_ms = due
        rep.tick_handle = self.call_at_ms(due - self.ctx.clock.monotonic_ms(), self._on_tick, rep)

    def on_tick(self, rep: Replica) -> None:
        rep.tick_handle = None
        if rep.closed or rep.failed is not None:
            return
        hosting = self.ctx.hosting
        try:
            self.tick(rep)
        except EntryDamaged as e:
            hosting.damaged(rep, e)
            return
        self.maybe_offer_snapshot(rep)
        hosting.schedule(rep)

    def maybe_offer_snapshot(self, rep: Replica) -> None:
        """Hand the core the storage snapshot once a follower lags behind it (its entries
        are gone from the log). Built only then; it carries no payload: the core reads the
        live entries the follower lacks from the log as it sends them. The checkpoint is
        read here; the page files it names (a deep queue's, up to its depth in
        references) are read into it by a worker, off the loop, one build at a time per
        replica, and the result is dropped if the snapshot changed meanwhile."""
        index = rep.log.snapshot_index()
        if rep.building_snapshot or index == 0 or not rep.driver.wants_snapshot(index):
            return
        hosting = self.ctx.hosting
        try:
            cp = hosting.stored_snapshot(rep.uid, index)
        except (StorageFailed, LookupError) as e:
            log.error("queue %s: snapshot for a lagging follower unavailable: %s", rep.name, e)
            return
        rep.building_snapshot = True
        self.ctx.spawn(self._offer_built(rep, cp, bytes(cp.state)))

    async def _offer_built(self, rep: Replica, cp: Checkpoint, state: bytes) -> None:
        ctx = self.ctx
        try:
            async with ctx.job():
                sendable = await ctx.in_worker(ctx.pages.sendable, rep.uid, state)
        except QuorraError as e:  # a page file damaged or gone (a newer snapshot)
            log.error("queue %s: snapshot for a lagging follower unavailable: %s", rep.name, e)
            return
        finally:
            rep.building_snapshot = False
        if rep.closed or rep.failed is not None or rep.log.snapshot_index() != cp.index:
            return
        if rep.driver.wants_snapshot(cp.index):
            rep.driver.offer_snapshot(ctx.hosting.snapshot_of(cp, sendable))
            ctx.hosting.schedule(rep)

    def arm_expire(self, rep: Replica) -> None:
        if rep.expire_inflight or rep.failed is not None:
            return
        due = rep.machine.next_deadline_ms()
        if due is None:
            return
        if rep.expire_handle is not None and rep.expire_due_ms <= due:
            return
        if rep.expire_handle is not None:
            rep.expire_handle.cancel()
        rep.expire_due_ms = due
        # The machine's deadlines are leader times, stamped from the wall clock.
        delay_ms = due - self.ctx.clock.wall_ms()
        rep.expire_handle = self.call_at_ms(delay_ms, self._on_expire, rep)

    def on_expire(self, rep: Replica) -> None:
        rep.expire_handle = None
        if rep.closed or rep.failed is not None or rep.raft.role is not Role.LEADER:
            return
        rep.expire_inflight = True
        ctx = self.ctx

        async def expire() -> None:
            try:
                await ctx.propose(rep, encode_expire())
            except QuorraError:
                pass
            finally:
                rep.expire_inflight = False
                if not rep.closed and rep.raft.role is Role.LEADER:
                    self.arm_expire(rep)

        ctx.spawn(expire())

    def call_at_ms(
        self, delay_ms: int, fn: Callable[[Replica], None], rep: Replica
    ) -> asyncio.TimerHandle:
        loop = self.ctx.loop
        delay_s = max(0.0, delay_ms / 1000) + 0.001
        return loop.call_at(loop.time() + delay_s, fn, rep, context=_TIMER_CONTEXT)

    def tick(self, rep: Replica) -> None:
        """Step the core's clocks (at a deadline, and before a step that must see them:
        a peer's message, a membership change, a proposal, whose entries the core
        stamps with the last wall time it saw), only if a clock moved since the core
        last saw them: a tick of the same clocks changes nothing in it, and within one
        millisecond several messages and proposals come in a row (a follower's every
        append built and stepped a ``Tick`` for nothing)."""
        clock = self.ctx.clock
        now_ms, wall_ms = clock.monotonic_ms(), clock.wall_ms()
        raft = rep.raft
        if now_ms > raft.now_ms or wall_ms != raft.wall_ms:
            raft.step(Tick(now_ms, wall_ms))

    def tick_to_propose(self, rep: Replica) -> None:
        """``tick`` before a proposal."""
        self.tick(rep)


__all__ = ["Timers"]
