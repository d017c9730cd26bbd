"""The I/O of a Raft group's replica on a node: the ``ReplicaHost`` its driver calls.

Rule: one core for what every group's replica does alike, whether it is a queue's
(``ReplicaIo``) or the cluster metadata's (``MetaIo``): writes go to the node's shared
WAL under the group's uid (refused once that group's log failed), messages go to the
transport, a finished repair tells storage. What differs stays in the two: what an
installed snapshot replaces (a queue's pages, live entries and checkpoint figures; the
metadata's machine only), where applied entries go (``effects``; the ``MetaGroup``),
and what a refused proposal raises (a queue maps backpressure and a pending membership
change to their errors; the metadata proposes no such thing, so ``NoLeader``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from engine.cluster import MetaMachine
from engine.errors import NoLeader
from engine.ids import NodeName
from engine.publish_trace import Stage
from engine.raft.entry import Entry
from engine.raft.events import Accepted, Completed, ReadReady, Ready
from engine.raft.events import HardState as RaftHardState
from engine.raft.events import Rejected as RaftRejected
from engine.raft.messages import Message
from engine.raft.snapshot import Snapshot
from engine.raft.state_machine import MachineEffect
from engine.runtime.replica import Replica, node_of
from engine.storage import checkpoint_of
from engine.storage.wal import AppendOp, HardState, HardStateOp

if TYPE_CHECKING:
    from engine.runtime.context import NodeContext
    from engine.runtime.meta_group import MetaGroup

log = logging.getLogger("quorra.engine")


class GroupIo:
    """What every group's replica does alike (see the module's rule)."""

    __slots__ = ("ctx", "uid")

    def __init__(self, ctx: NodeContext, uid: str) -> None:
        self.ctx = ctx
        self.uid = uid

    def label(self) -> str:
        """How the log names the group (a method: a string kept per replica would cost
        memory on every idle queue)."""
        return f"group {self.uid}"

    def on_ready(self, rd: Ready) -> None:
        """Nothing looks at a ``Ready`` before it is acted on in the server."""

    def write_hard_state(self, hs: RaftHardState) -> None:
        self.submit(HardStateOp(self.uid, HardState(hs.term, hs.vote, hs.commit)))

    def append_entries(self, entries: list[Entry]) -> None:
        self.submit(AppendOp(self.uid, tuple(entries)))

    def submit(self, op: AppendOp | HardStateOp) -> None:
        storage = self.ctx.storage
        failed = storage.log(self.uid).failed
        if failed is not None:
            raise failed
        storage.wal.submit(op)

    def writes_queued(self) -> None:
        """Nothing to do: the submit that found the WAL idle woke its writer already
        (``Wal.waker``), and a busy writer takes what is pending when its sync ends. A
        second notify per ``Ready`` cost a lock and a futex wake on every publish."""

    def send(self, message: Message) -> None:
        self.ctx.transport.send(NodeName(node_of(message.dst)), self.uid, message)

    def read_ready(self, read: ReadReady) -> None:
        """Never called: proposals carry the reads too, no group asks for a ReadIndex."""

    def repaired(self) -> None:
        self.ctx.storage.finish_repair(self.uid)
        log.info("%s: repaired", self.label())


class ReplicaIo(GroupIo):
    """A queue replica's: applied entries resolve proposals and run effects on the node."""

    __slots__ = ("rep",)

    def __init__(self, ctx: NodeContext, rep: Replica) -> None:
        super().__init__(ctx, rep.uid)
        self.rep = rep

    def label(self) -> str:
        return f"queue {self.rep.name}"

    def install_snapshot(self, snapshot: Snapshot, given: list[Entry]) -> None:
        self.ctx.hosting.install(self.rep, snapshot, given)

    def applied(self, entry: Entry, reply: object, effects: list[MachineEffect]) -> None:
        ctx = self.ctx
        if ctx.trace is not None:
            ctx.trace.stamp(Stage.APPLIED)
        ctx.effects.applied(self.rep, entry, reply, effects)

    def passed(self, entry: Entry) -> None:
        self.ctx.effects.passed(self.rep, entry)

    def accepted(self, accepted: Accepted) -> None:
        p = self.rep.proposals.pop(accepted.request_id, None)
        if p is not None and not p.future.done():
            p.term, p.index = accepted.term, accepted.last_index
            self.rep.own_waiting()[accepted.last_index] = p

    def rejected(self, rejected: RaftRejected) -> None:
        self.ctx.hosting.on_rejected(self.rep, rejected)

    def completed(self, completed: Completed) -> None:
        p = self.rep.proposals.pop(completed.request_id, None)
        if p is not None and not p.future.done():
            p.future.set_result(None)


class MetaIo(GroupIo):
    """The metadata replica's: applied entries and proposals' outcomes go to its group."""

    __slots__ = ("group",)

    def __init__(self, group: MetaGroup) -> None:
        super().__init__(group.ctx, group.uid)
        self.group = group

    def label(self) -> str:
        return "metadata"

    def install_snapshot(self, snapshot: Snapshot, given: list[Entry]) -> None:
        cp = checkpoint_of(snapshot, MetaMachine.version)
        self.ctx.storage.install_snapshot(self.uid, cp, given)
        self.group.snapshot_installed = True

    def applied(self, entry: Entry, reply: object, effects: list[MachineEffect]) -> None:
        self.group.applied(entry, reply, effects)

    def passed(self, entry: Entry) -> None:
        self.group.passed(entry)

    def accepted(self, accepted: Accepted) -> None:
        group = self.group
        p = group.proposals.pop(accepted.request_id, None)
        if p is not None and not p.future.done():
            p.term, p.index = accepted.term, accepted.last_index
            group.waiting[accepted.last_index] = p

    def rejected(self, rejected: RaftRejected) -> None:
        p = self.group.proposals.pop(rejected.request_id, None)
        if p is not None and not p.future.done():
            p.future.set_exception(NoLeader(f"metadata: {rejected.reason}"))

    def completed(self, completed: Completed) -> None:
        p = self.group.proposals.pop(completed.request_id, None)
        if p is not None and not p.future.done():
            p.future.set_result(None)


__all__ = ["GroupIo", "MetaIo", "ReplicaIo"]
