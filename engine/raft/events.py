"""What goes into the Raft core (events) and what comes out (one ``Ready`` value).

Rule for the runtime, in this order, for each ``Ready``:

1. write ``hard_state``, ``snapshot_to_install`` (with ``snapshot_entries``: the live
   entries this server lacked; storage keeps the others, which it holds as committed
   entries) and ``entries_to_persist`` to storage (entries starting at index ``i``
   replace every stored entry at ``i`` and after);
2. send ``messages`` at once (leader traffic that depends on nothing unpersisted);
3. apply ``committed_entries`` in order (``COMMAND`` entries only reach the machine),
   then answer ``reads``;
4. once step 1 is durable: send ``messages_after_persist`` and hand the core
   ``Persisted(index, term)`` of the last entry written (and ``SnapshotInstalled`` for
   an installed snapshot).

The core counts an entry as applied once it is handed out in ``committed_entries``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.ids import ServerId
from engine.quick_init import quick_init
from engine.raft.entry import Entry
from engine.raft.messages import Message
from engine.raft.snapshot import Snapshot

# --- events in ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Tick:
    now_ms: int
    """The runtime's monotonic clock, which drives every timer; the core ignores a value
    not above one it has seen."""
    wall_ms: int | None = None
    """The wall clock, only stamped into the entries a leader appends (never below the
    newest stamp this server knows, see ``RaftServer.stamp_ms``); ``None``: ``now_ms``
    serves as both (the simulator, tests)."""


@dataclass(frozen=True, slots=True)
class Receive:
    message: Message


@quick_init
@dataclass(frozen=True, slots=True)
class Propose:
    """Append ``commands`` (one entry each) if this server leads; answered in
    ``Ready.accepted`` or ``Ready.rejected``."""

    request_id: int
    commands: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class ReadIndex:
    """A linearizable read: answered in ``Ready.reads`` with the index the machine must
    have applied before it is read (the runtime has applied it when it sees the answer)."""

    request_id: int


@dataclass(frozen=True, slots=True)
class AddServer:
    """Add ``server`` as a learner, then promote it to voter once it has caught up.
    ``learner_only``: add it as a learner and stop there (it replicates the log but
    never votes). A server that is a learner already is only promoted."""

    request_id: int
    server: ServerId
    learner_only: bool = False


@dataclass(frozen=True, slots=True)
class RemoveServer:
    request_id: int
    server: ServerId


@dataclass(frozen=True, slots=True)
class DemoteServer:
    """Make voter ``server`` a learner: it keeps replicating the log and votes no more
    (one server's change of the voters, as a removal is). Never the leader itself:
    transfer its leadership first."""

    request_id: int
    server: ServerId


@dataclass(frozen=True, slots=True)
class TransferLeadership:
    request_id: int
    target: ServerId


@quick_init
@dataclass(frozen=True, slots=True)
class Persisted:
    """Storage has made every entry up to ``index`` durable; ``term`` is the term of the
    entry at ``index`` (a stale report after a truncation is recognised by it)."""

    index: int
    term: int


@dataclass(frozen=True, slots=True)
class SnapshotTaken:
    """The runtime has durably written ``snapshot`` (taken at an applied index) and
    compacted storage up to it; the leader ships it to followers that lag behind it,
    with the live entries they lack, read from the ``LogStore`` when they are sent. A
    restarted core has none until the runtime hands it one (when a follower lags)."""

    snapshot: Snapshot


@dataclass(frozen=True, slots=True)
class SnapshotInstalled:
    """The ``Ready.snapshot_to_install`` at ``index`` is durable."""

    index: int
    term: int


Event = (
    Tick
    | Receive
    | Propose
    | ReadIndex
    | AddServer
    | RemoveServer
    | DemoteServer
    | TransferLeadership
    | Persisted
    | SnapshotTaken
    | SnapshotInstalled
)

# --- outputs ----------------------------------------------------------------------------


@quick_init
@dataclass(frozen=True, slots=True)
class HardState:
    term: int
    vote: ServerId | None
    commit: int


@quick_init
@dataclass(frozen=True, slots=True)
class Accepted:
    """Proposal ``request_id`` became entries ``first_index..last_index`` of ``term``.
    It succeeded once an entry at ``last_index`` with this term is applied."""

    request_id: int
    first_index: int
    last_index: int
    term: int


@dataclass(frozen=True, slots=True)
class Rejected:
    request_id: int
    reason: str
    """``not_leader``, ``transferring``, ``backpressure``, ``change_pending``,
    ``not_caught_up``, ``lost_leadership``, ``bad_request`` or ``timeout``."""
    leader: ServerId | None


@dataclass(frozen=True, slots=True)
class Completed:
    """A membership change was committed (``index`` is its entry) or a transfer was handed
    to the target (``index`` 0)."""

    request_id: int
    index: int


@dataclass(frozen=True, slots=True)
class ReadReady:
    request_id: int
    index: int


@dataclass(slots=True)
class Ready:
    hard_state: HardState | None = None
    snapshot_to_install: Snapshot | None = None
    snapshot_entries: list[Entry] = field(default_factory=list)
    """The live entries of ``snapshot_to_install`` this server lacked, in index order."""
    entries_to_persist: list[Entry] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    messages_after_persist: list[Message] = field(default_factory=list)
    committed_entries: list[Entry] = field(default_factory=list)
    reads: list[ReadReady] = field(default_factory=list)
    accepted: list[Accepted] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)
    completed: list[Completed] = field(default_factory=list)
    repaired: bool = False
    """The server left repair mode (its vote for the leader is in ``hard_state``): once
    that hard state is durable, storage's repair marker may be removed, not before."""

    def is_empty(self) -> bool:
        return not (
            self.repaired
            or self.hard_state
            or self.snapshot_to_install
            or self.entries_to_persist
            or self.messages
            or self.messages_after_persist
            or self.committed_entries
            or self.reads
            or self.accepted
            or self.rejected
            or self.completed
        )


__all__ = [
    "Accepted",
    "AddServer",
    "Completed",
    "DemoteServer",
    "Event",
    "HardState",
    "Persisted",
    "Propose",
    "ReadIndex",
    "ReadReady",
    "Ready",
    "Receive",
    "Rejected",
    "RemoveServer",
    "SnapshotInstalled",
    "SnapshotTaken",
    "Tick",
    "TransferLeadership",
]
