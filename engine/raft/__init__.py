"""engine.raft: a sans-IO Raft core (see engine/__init__.py for the layering).

Drive a ``RaftServer`` with events (``Tick``, ``Receive``, ``Propose``, ``ReadIndex``,
``AddServer``, ``RemoveServer``, ``DemoteServer``, ``TransferLeadership``, ``Persisted``,
``SnapshotTaken``, ``SnapshotInstalled``) and act on the ``Ready`` it returns, in the
order ``engine.raft.events`` states.
"""

from engine.raft.config import EMPTY_CONFIGURATION, Configuration
from engine.raft.entry import Entry, EntryKind, LogStore
from engine.raft.events import (
    Accepted,
    AddServer,
    Completed,
    DemoteServer,
    Event,
    HardState,
    Persisted,
    Propose,
    ReadIndex,
    ReadReady,
    Ready,
    Receive,
    Rejected,
    RemoveServer,
    SnapshotInstalled,
    SnapshotTaken,
    Tick,
    TransferLeadership,
)
from engine.raft.options import Fault, RaftOptions, RandomSource
from engine.raft.role import Role
from engine.raft.server import RaftServer
from engine.raft.snapshot import Snapshot, SnapshotMeta
from engine.raft.state_machine import ApplyMeta, Machine

__all__ = [
    "EMPTY_CONFIGURATION",
    "Accepted",
    "AddServer",
    "ApplyMeta",
    "Completed",
    "Configuration",
    "DemoteServer",
    "Entry",
    "EntryKind",
    "Event",
    "Fault",
    "HardState",
    "LogStore",
    "Machine",
    "Persisted",
    "Propose",
    "RaftOptions",
    "RaftServer",
    "RandomSource",
    "ReadIndex",
    "ReadReady",
    "Ready",
    "Receive",
    "Rejected",
    "RemoveServer",
    "Role",
    "Snapshot",
    "SnapshotInstalled",
    "SnapshotMeta",
    "SnapshotTaken",
    "Tick",
    "TransferLeadership",
]
