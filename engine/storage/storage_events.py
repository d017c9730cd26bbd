"""What storage reports to the runtime: a closed set of frozen events, made by
``NodeStorage`` (engine/storage/node_storage.py) on the loop thread."""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import StorageFailed
from engine.quick_init import quick_init
from engine.storage.checkpoint import Checkpoint
from engine.storage.server_log import ServerLog
from engine.storage.wal import HardState


@quick_init
@dataclass(frozen=True, slots=True)
class Persisted:
    """Entries of ``uid`` up to ``index`` (of ``term``) are durable: the runtime hands the
    Raft core ``engine.raft.events.Persisted(index, term)``."""

    uid: str
    index: int
    term: int


@dataclass(frozen=True, slots=True)
class HardStateSaved:
    """The hard state of ``uid`` is durable: messages that depend on it may be sent."""

    uid: str
    hard_state: HardState


@dataclass(frozen=True, slots=True)
class SnapshotReset:
    """The log of ``uid`` restarts after the installed snapshot at ``index``."""

    uid: str
    index: int
    term: int


@dataclass(frozen=True, slots=True)
class Removed:
    """Server ``uid`` and all its files are gone."""

    uid: str


@dataclass(frozen=True, slots=True)
class WriteFailed:
    """The disk refused a write for ``uid``; nothing of it is durable, the server
    refuses further writes with ``error`` until it is opened again."""

    uid: str
    error: StorageFailed


StorageEvent = Persisted | HardStateSaved | SnapshotReset | Removed | WriteFailed


@dataclass(frozen=True, slots=True)
class Recovered:
    """What ``open_server`` found for one server."""

    log: ServerLog
    checkpoint: Checkpoint | None
    """Restore the machine from it, then apply the committed entries after its index."""
    hard_state: HardState | None
    damaged: list[str]
    """Checkpoint files that failed their check and were passed over."""
    repairing: bool = False
    """Durable data was lost: start the Raft core in repair mode (``finish_repair`` once
    it has left it). Refuse the server if it is the only member of its group."""
    repair_reason: str | None = None


__all__ = [
    "HardStateSaved",
    "Persisted",
    "Recovered",
    "Removed",
    "SnapshotReset",
    "StorageEvent",
    "WriteFailed",
]
