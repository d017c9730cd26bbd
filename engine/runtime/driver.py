"""The replica driver: what every host of a Raft replica does with each ``Ready``, in
the order durability requires, with no event loop, clock or I/O of its own.

A host (the server's ``engine.runtime.hosting``, the simulator's ``engine.sim.world``) owns
the I/O: it writes what the driver hands it, tells the driver when each write is
durable, and runs the effects. The driver owns the ordering rules, so the simulator's
seeds exercise the very code the server runs:

* the term and vote are written before any message that depends on them goes out; the
  commit index alone is never written (Raft learns it again), so it costs no fsync;
* each ``Ready`` queues its writes as numbered operations; messages that must wait for
  the disk (votes, append acknowledgements) go once every operation queued before them
  is durable, in order;
* a core that left repair mode has its vote in a write: the storage's repair marker
  goes only once that write is durable;
* committed entries apply to the machine once, after a checkpoint's (``base_index``).

The host calls ``process`` after stepping the core and ``written`` once per operation,
in the order the operations were queued (``written_all`` for the operations one write
made durable: their acknowledgements are merged).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, Protocol, TypeVar

from engine.raft.entry import Entry, EntryKind
from engine.raft.events import (
    Accepted,
    Completed,
    Event,
    HardState,
    ReadReady,
    Ready,
    Rejected,
    SnapshotTaken,
)
from engine.raft.messages import Message
from engine.raft.options import Fault
from engine.raft.replication import supersedes
from engine.raft.server import RaftServer, Role
from engine.raft.snapshot import Snapshot
from engine.raft.state_machine import ApplyMeta, Machine, MachineEffect
from engine.shared_empty import EMPTY_LIST

M = TypeVar("M", bound=Machine)


class ReplicaHost(Protocol):
    """The I/O and effects of one replica, as its host performs them."""

    def on_ready(self, rd: Ready) -> None:
        """Before ``rd`` is acted on (the simulator's checkers look at it)."""

    def write_hard_state(self, hs: HardState) -> None:
        """Queue a write of the term and vote: one operation."""

    def install_snapshot(self, snapshot: Snapshot, given: list[Entry]) -> None:
        """Queue the replacement of the log by ``snapshot`` (``given``: the live entries
        this replica lacked): one operation. The driver restores the machine after."""

    def append_entries(self, entries: list[Entry]) -> None:
        """Queue a write of ``entries``: one operation."""

    def writes_queued(self) -> None:
        """The operations of one ``Ready`` are queued: start writing them."""

    def send(self, message: Message) -> None: ...

    def applied(self, entry: Entry, reply: object, effects: list[MachineEffect]) -> None:
        """The machine applied command ``entry``: its reply and effects."""

    def passed(self, entry: Entry) -> None:
        """``entry`` is applied without the machine: not a command (a configuration, a
        leader's first entry), or held by the state the machine was restored from."""

    def accepted(self, accepted: Accepted) -> None: ...

    def rejected(self, rejected: Rejected) -> None: ...

    def completed(self, completed: Completed) -> None: ...

    def read_ready(self, read: ReadReady) -> None: ...

    def repaired(self) -> None:
        """The repaired core's vote is durable: storage may forget that it was repairing."""


class ReplicaDriver(Generic[M]):
    """Drives one replica's Raft core and machine for a host (see the module's rules).
    It holds the only references its replica keeps to them (``raft``, ``machine``)."""

    __slots__ = (
        "_send_at_once",
        "after_persist",
        "applied_index",
        "applied_term",
        "base_index",
        "hard_state_written",
        "host",
        "machine",
        "ops_done",
        "ops_submitted",
        "raft",
        "repair_done_at_op",
        "replay_until",
    )

    def __init__(
        self,
        raft: RaftServer,
        machine: M,
        host: ReplicaHost,
        *,
        base_index: int = 0,
        replay_until: int = 0,
        hard_state_written: tuple[int, str | None] = (0, None),
        fault: Fault = Fault.NONE,
    ) -> None:
        self.raft = raft
        self.machine = machine
        self.host = host
        self.base_index = base_index
        """The machine was restored at this index: entries up to it are in its state and
        are not applied again."""
        self.replay_until = replay_until
        """Entries up to this index were in the log at recovery: applying them is a
        replay (the host throws leader-only effects of a replay away)."""
        self.applied_index = raft.applied
        self.applied_term = 0
        self.hard_state_written = hard_state_written
        """(term, vote) last queued for writing."""
        self.ops_submitted = 0
        self.ops_done = 0
        self.after_persist: list[tuple[int, list[Message]]] = EMPTY_LIST
        """Messages to send once this many operations are durable, oldest first (a
        list: an idle replica's empty deque would hold 760 bytes; the shared empty one
        while none wait, as a lone voter's never do)."""
        self.repair_done_at_op = 0
        """The core left repair mode: once this many operations are durable (its hard
        state among them), storage's repair marker may go."""
        self._send_at_once = fault is Fault.SEND_BEFORE_DURABLE

    def step(self, event: Event) -> None:
        self.raft.step(event)

    def process(self) -> None:
        """Act on every ``Ready`` the core has, until it has none. Storage errors the
        core meets (``EntryDamaged``, ``StorageFailed``) reach the host."""
        raft = self.raft
        while raft.has_ready():
            rd = raft.ready()
            self.host.on_ready(rd)
            self.handle(rd)

    def handle(self, rd: Ready) -> None:
        host = self.host
        ops = 0
        hs = rd.hard_state
        if hs is not None and (hs.term, hs.vote) != self.hard_state_written:
            # Term and vote must be durable before anything depending on them goes out;
            # the commit index need not be, so a change of commit alone is not written.
            host.write_hard_state(hs)
            self.hard_state_written = (hs.term, hs.vote)
            ops += 1
        snapshot = rd.snapshot_to_install
        if snapshot is not None:
            host.install_snapshot(snapshot, rd.snapshot_entries)
            self.machine.restore(snapshot.machine_state)
            self.base_index = snapshot.index
            self.applied_index, self.applied_term = snapshot.index, snapshot.term
            ops += 1
        if rd.entries_to_persist:
            host.append_entries(rd.entries_to_persist)
            ops += 1
        if ops:
            self.ops_submitted += ops
            host.writes_queued()
        for message in rd.messages:
            host.send(message)
        for acc in rd.accepted:
            host.accepted(acc)
        for rej in rd.rejected:
            host.rejected(rej)
        for done in rd.completed:
            host.completed(done)
        if rd.committed_entries:
            self._apply(rd.committed_entries)
        for read in rd.reads:
            host.read_ready(read)
        if rd.repaired:
            assert self.ops_submitted > self.ops_done, "the vote of the repaired core is queued"
            self.repair_done_at_op = self.ops_submitted
        if rd.messages_after_persist:
            if self._send_at_once or (
                self.ops_done >= self.ops_submitted and not self.after_persist
            ):
                for message in rd.messages_after_persist:
                    host.send(message)
            else:
                if self.after_persist is EMPTY_LIST:
                    self.after_persist = []
                self.after_persist.append((self.ops_submitted, rd.messages_after_persist))

    def _apply(self, entries: list[Entry]) -> None:
        machine, host, base = self.machine, self.host, self.base_index
        for e in entries:
            self.applied_index, self.applied_term = e.index, e.term
            if e.kind is EntryKind.COMMAND and e.index > base:
                reply, effects = machine.apply(ApplyMeta(e.index, e.term, e.now_ms), e.data)
                host.applied(e, reply, effects)
            else:
                host.passed(e)

    def written(self, event: Event | None) -> None:
        """The oldest operation not yet durable is: ``written_all`` of that one."""
        self.written_all((event,))

    def written_all(self, events: Iterable[Event | None]) -> None:
        """The oldest operations not yet durable are, one event each, in order: step the
        core with what each teaches it (``Persisted``, ``SnapshotInstalled``; None for a
        hard state), end a repair whose vote they held, then send what waited for them.
        ``process`` acts on the outcome.

        A successful append acknowledgement is left out when the next message released
        is one to the same leader, in the same term, that acknowledges as much or more:
        a follower's WAL batch makes the appends of several turns durable at once, and
        one answer for them saves the leader a decode and a step per append."""
        raft = self.raft
        for event in events:
            self.ops_done += 1
            if event is not None:
                raft.step(event)
        if self.repair_done_at_op and self.ops_done >= self.repair_done_at_op:
            self.repair_done_at_op = 0
            self.host.repaired()
        waiting = self.after_persist
        k = 0
        while k < len(waiting) and waiting[k][0] <= self.ops_done:
            k += 1
        if not k:
            return
        released = waiting[0][1] if k == 1 else _superseded_dropped(waiting[:k])
        if k == len(waiting):
            self.after_persist = EMPTY_LIST
        else:
            del waiting[:k]
        for message in released:
            self.host.send(message)

    def wants_snapshot(self, index: int) -> bool:
        """Whether the core, leading, needs storage's snapshot at ``index``: a follower
        lags behind it and the core does not hold it (a restarted leader starts from the
        snapshot's index, term and configuration only)."""
        raft = self.raft
        if raft.role is not Role.LEADER or not raft.progress:
            return False
        if index <= (raft.snapshot.index if raft.snapshot is not None else 0):
            return False
        return not all(pr.match >= index for pr in raft.progress.values())

    def offer_snapshot(self, snapshot: Snapshot | None) -> None:
        """Hand the core storage's snapshot (``wants_snapshot``), if it has applied it."""
        if snapshot is not None and snapshot.index <= self.raft.applied:
            self.raft.step(SnapshotTaken(snapshot))

    def writes_pending(self) -> bool:
        return self.ops_done < self.ops_submitted


def _superseded_dropped(groups: list[tuple[int, list[Message]]]) -> list[Message]:
    """The messages of ``groups`` in order, less each successful append acknowledgement
    that the one right after it says all of (``replication.supersedes``, the core's rule
    within one ``Ready``)."""
    out: list[Message] = []
    for _, messages in groups:
        for message in messages:
            if out and supersedes(message, out[-1]):
                out[-1] = message
                continue
            out.append(message)
    return out


__all__ = ["ReplicaDriver", "ReplicaHost"]
