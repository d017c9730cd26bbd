"""The reconcile loop of a cluster node: its replicas made to match the metadata.

Rule: the plan is ``engine.cluster.reconcile.plan`` (pure); this module runs it. A pass
runs after every applied ``MetaChanged`` that names queues or nodes, after a snapshot,
and every ``Limits.reconcile_interval_ms``; passes never overlap (a change during a pass
asks for one more). A pass plans only once the node's metadata replica is caught up
(``MetaGroup.caught_up``), runs the actions in order and stops at the first that fails,
then proposes the reports of the actions that ran. Every action is idempotent and keyed
by uid, so a crash anywhere in a pass, or a report that never committed, is finished by
a later pass: a create writes the replica's definition before it hosts it (the catalog's
rule), a delete removes the definition first. A pass also reports, once, the data
directory the node runs from (``NodeStarted``: ``engine.cluster.rejoin``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import TYPE_CHECKING

from engine.cluster import MetaChanged, QueueRecord, reconcile
from engine.cluster import meta_commands as mc
from engine.cluster.rejoin import started_reports
from engine.errors import QuorraError
from engine.queue import QueuePolicy
from engine.raft.role import Role
from engine.runtime.api import QueueArgs
from engine.runtime.meta import QueueMeta, queue_meta
from engine.runtime.passes import Passes

if TYPE_CHECKING:
    from engine.cluster.meta_machine import MetaMachine
    from engine.runtime.context import NodeContext

log = logging.getLogger("quorra.engine")


class Reconciler(Passes):
    """Runs a node's reconcile passes (see the module's rule)."""

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.passes = 0
        """Passes that planned (for the tests and the stats)."""
        self.left_alone: dict[str, str] = {}
        """Uid -> why this node leaves its replica alone (an operator's to decide)."""
        self.timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Listen to the metadata and arm the timer (a cluster node, once started)."""
        group = self.ctx.meta_group
        assert group is not None
        group.listeners.append(self.on_change)
        self.arm()

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def on_change(self, change: MetaChanged | None) -> None:
        if change is None or change.queues or change.nodes:
            self.trigger()

    def arm(self) -> None:
        ctx = self.ctx
        if not ctx.running:
            return
        delay_s = ctx.limits.reconcile_interval_ms / 1000
        self.timer = ctx.loop.call_later(delay_s, self.on_timer)

    def on_timer(self) -> None:
        self.timer = None
        self.trigger()
        self.arm()

    def trigger(self) -> None:
        """Ask for a pass: now, or after the one running."""
        super().trigger()
        # The same moments serve the moves off leaving nodes and the metadata's members.
        self.ctx.mover.trigger()
        self.ctx.meta_members.trigger()

    async def one_pass(self) -> bool:
        ctx = self.ctx
        group = ctx.meta_group
        if group is None or not group.caught_up():
            return False
        self.passes += 1
        registry = group.machine.hosted_by(ctx.name)
        local: dict[str, reconcile.LocalState] = dict.fromkeys(ctx.by_uid, "hosted")
        for meta, _error in ctx.failed.values():
            local[meta.uid] = "broken"
        for uid in ctx.catalog.unreadable:
            local[uid] = "broken"
        actions = reconcile.plan(ctx.name, registry, local)
        done: list[reconcile.Action] = []
        for action in actions:
            try:
                await self.perform(action)
            except QuorraError as e:
                log.warning("reconcile: %s of %s failed: %s", type(action).__name__, action.uid, e)
                break
            done.append(action)
        reports = [*reconcile.reports(ctx.name, done), *self.started(group.machine)]
        for command in [*reports, *self.policies(group.machine)]:
            try:
                await group.propose(command)
            except QuorraError as e:
                # The next pass reports it again.
                log.info("reconcile: report %s not committed: %s", type(command).__name__, e)
                return False
        return False

    def started(self, machine: MetaMachine) -> list[mc.MetaCommand]:
        """``NodeStarted`` while the metadata records this node without the data
        directory it runs from (``engine.cluster.rejoin``); where this node leads the
        metadata, also for the peers it heard name theirs in a handshake."""
        group = self.ctx.meta_group
        if group is None:
            return []
        mine: dict[str, str] = {self.ctx.name: group.boot.incarnation}
        heard = group.heard if group.raft.role is Role.LEADER else mine
        return list(started_reports(machine.nodes, heard))

    def policies(self, machine: MetaMachine) -> list[mc.MetaCommand]:
        """``SetQueuePolicy`` for each queue this node leads whose record lags the policy
        its log applied: a crash between the queue's commit and the metadata's (or a
        lost proposal), ``engine.runtime.registry.record_policy``. Only the leader's
        replica proposes; a deposed one that proposed an older policy is corrected by
        the next leader's pass."""
        commands: list[mc.MetaCommand] = []
        for rep in self.ctx.replicas.values():
            if rep.dormant is not None:
                continue  # sleeping: no change since the passes before it fell asleep
            rec = machine.queue_by_uid(rep.uid)
            if rec is None or rec.state != "live" or rep.raft.role is not Role.LEADER:
                continue
            if rec.policy != rep.machine.policy:
                commands.append(mc.SetQueuePolicy(rep.uid, rep.machine.policy))
        return commands

    async def perform(self, action: reconcile.Action) -> None:
        catalog = self.ctx.catalog
        if isinstance(action, reconcile.CreateReplica):
            await catalog.create_replica(self.definition(action.record, action.bootstrap))
        elif isinstance(action, reconcile.DeleteReplica):
            log.info("reconcile: dropping replica %s (%s)", action.uid, action.reason)
            await catalog.delete_replica(action.uid)
        elif (
            isinstance(action, reconcile.LeaveAlone)
            and self.left_alone.get(action.uid) != action.reason
        ):
            log.warning("reconcile: replica %s left alone: %s", action.uid, action.reason)
            self.left_alone[action.uid] = action.reason

    def definition(self, rec: QueueRecord, bootstrap: tuple[str, ...]) -> QueueMeta:
        """The replica's definition: a founder starts from the group's first
        configuration; a later member with none that names it (it waits for the leader
        to add it, as a member added by ``AddMember`` does)."""
        members = bootstrap
        if not members:
            members = tuple(m for m in rec.members if m != self.ctx.name) or rec.bootstrap
        args = args_of(rec, rec.created_policy)
        return queue_meta(rec.name, rec.uid, args, rec.created_at_ms, members)


def args_of(rec: QueueRecord, policy: QueuePolicy | None = None) -> QueueArgs:
    """The ``PUT /queues/{name}`` arguments a queue record stands for (with ``policy``
    in place of its current one)."""
    chosen = rec.policy if policy is None else policy
    fields = {f.name: getattr(chosen, f.name) for f in dataclasses.fields(chosen)}
    return QueueArgs(replicas=rec.replicas, **fields)


__all__ = ["Reconciler", "args_of"]
