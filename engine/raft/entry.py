"""The log as the Raft core sees it: entries, and a read-only view of stable storage.

Like etcd-io/raft, the core keeps entries that are not yet persisted in its own
*unstable* buffer and hands them out in ``Ready.entries_to_persist``; the runtime writes
them through ``engine.storage`` and reports back with a ``Persisted`` event. Entries that
storage holds are read through ``LogStore``, synchronously: the mem table is in memory,
segment reads go through a bounded reader cache. The core never writes through this view.

Rule of overwrite: persisting entries that start at index ``i`` replaces every entry at
``i`` and after (a follower resolving a conflict).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol

from engine.quick_init import quick_init


class EntryKind(IntEnum):
    COMMAND = 0
    """Data for the machine."""
    NOOP = 1
    """Appended by a new leader at the start of its term."""
    CONFIG = 2
    """A membership change; ``data`` is the encoded new configuration."""


@quick_init
@dataclass(frozen=True, slots=True)
class Entry:
    index: int
    term: int
    kind: EntryKind
    now_ms: int
    """The leader's clock when proposed; handed to the machine in ``ApplyMeta``."""
    data: bytes

    def __post_init__(self) -> None:
        assert self.index >= 1 and self.term >= 1 and self.now_ms >= 0


class LogStore(Protocol):
    """Read-only view of the entries storage holds for one Raft server."""

    def first_index(self) -> int:
        """First index that may be read; ``snapshot_index() + 1`` after a snapshot."""
        ...

    def last_index(self) -> int:
        """Last index written to storage (0 when empty)."""
        ...

    def snapshot_index(self) -> int:
        """Index of the newest snapshot/checkpoint that covers the log prefix, 0 if none."""
        ...

    def term(self, index: int) -> int | None:
        """Term of the entry at ``index``; the snapshot's term at ``snapshot_index()``;
        ``None`` where the entry is unknown or compacted away."""
        ...

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        """Entries ``lo <= index < hi``, contiguous from ``lo``, stopping before the one that
        would pass ``max_bytes`` (at least one entry is returned if ``lo < hi``). Raises
        ``LookupError`` if ``lo`` is below ``first_index()`` or an entry was compacted."""
        ...

    def entry(self, index: int) -> Entry:
        """The entry at ``index``, also a live entry kept before the snapshot (a leader
        ships those to a follower that lacks them). Raises ``LookupError`` if absent."""
        ...

    def config_indexes(self, lo: int, hi: int) -> list[int]:
        """Indexes of the ``CONFIG`` entries stored in ``lo <= index < hi``, from the kinds
        storage keeps beside the payloads: no payload is read (a restart looks for the
        configurations in the log after its checkpoint, which may be tens of MiB)."""
        ...


__all__ = ["Entry", "EntryKind", "LogStore"]
