"""The I/O of the metadata group's replica (its driver's ``ReplicaHost``).

Rule: as a queue replica's (``hosting.ReplicaIo``), writes go to the node's shared WAL
under the group's uid and messages to the transport; applied entries and the outcomes
of proposals go back to the ``MetaGroup``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from engine.cluster import MetaMachine
from engine.errors import NoLeader
from engine.ids import NodeName
from engine.raft.entry import Entry
from engine.raft.events import Accepted, Completed, ReadReady, Ready
from engine.raft.events import HardState as RaftHardState
from engine.raft.events import Rejected as RaftRejected
from engine.raft.messages import Message
from engine.raft.snapshot import Snapshot
from engine.raft.state_machine import MachineEffect
from engine.runtime.replica import node_of
from engine.storage import Checkpoint
from engine.storage.wal import AppendOp, HardState, HardStateOp

if TYPE_CHECKING:
    from engine.runtime.meta_group import MetaGroup

log = logging.getLogger("quorra.engine")


class MetaIo:
    """The metadata replica's side of its driver (``engine.runtime.driver.ReplicaHost``)."""

    __slots__ = ("group",)

    def __init__(self, group: MetaGroup) -> None:
        self.group = group

    def on_ready(self, rd: Ready) -> None:
        """Nothing looks at a ``Ready`` before it is acted on in the server."""

    def write_hard_state(self, hs: RaftHardState) -> None:
        self._submit(HardStateOp(self.group.uid, HardState(hs.term, hs.vote, hs.commit)))

    def install_snapshot(self, snapshot: Snapshot, given: list[Entry]) -> None:
        cp = Checkpoint(
            snapshot.index,
            snapshot.term,
            MetaMachine.version,
            snapshot.config.encode(),
            snapshot.live_indexes,
            snapshot.machine_state,
        )
        self.group.ctx.storage.install_snapshot(self.group.uid, cp, given)
        self.group.snapshot_installed = True

    def append_entries(self, entries: list[Entry]) -> None:
        self._submit(AppendOp(self.group.uid, tuple(entries)))

    def _submit(self, op: AppendOp | HardStateOp) -> None:
        storage = self.group.ctx.storage
        failed = storage.log(self.group.uid).failed
        if failed is not None:
            raise failed
        storage.wal.submit(op)

    def writes_queued(self) -> None:
        writer = self.group.ctx.writer
        assert writer is not None
        writer.wake()

    def send(self, message: Message) -> None:
        self.group.ctx.transport.send(NodeName(node_of(message.dst)), self.group.uid, message)

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

    def read_ready(self, read: ReadReady) -> None:
        """Never called: the group proposes, it asks for no ReadIndex."""

    def repaired(self) -> None:
        self.group.ctx.storage.finish_repair(self.group.uid)
        log.info("metadata: repaired")


__all__ = ["MetaIo"]
