from __future__ import annotations

import dataclasses

from engine.limits import DEFAULT_LIMITS, KIB, Limits
from engine.raft.entry import Entry, EntryKind
from engine.storage import FakeDisk, HardState, NodeStorage


def small_limits(**change: int) -> Limits:
    """Limits small enough that a few entries roll the WAL and fill a segment."""
    base = {
        "wal_file_bytes_max": 2 * KIB,
        "wal_batch_bytes_max": 1 * KIB,
        "entry_bytes_max": 512,
        "segment_entries_max": 4,
        "segment_file_bytes_max": 1 * KIB,
        "segment_readers_open_max": 2,
        "checkpoints_kept_max": 3,
        "batch_bytes_max": 256,
        "message_bytes_max": 64,
        "message_bytes_max_ceiling": 128,
    }
    base.update(change)
    return dataclasses.replace(DEFAULT_LIMITS, **base)


def entries(lo: int, n: int, term: int = 1, size: int = 16, tag: str = "") -> list[Entry]:
    return [
        Entry(i, term, EntryKind.COMMAND, i * 10, f"{tag}{i}:{term}:".encode().ljust(size, b"."))
        for i in range(lo, lo + n)
    ]


def one_server(
    disk: FakeDisk, written: list[Entry], hard_state: HardState, limits: Limits | None = None
) -> NodeStorage:
    """Storage on ``disk`` with server ``q`` holding ``written`` and ``hard_state``, synced."""
    storage = NodeStorage.open(disk, limits or small_limits())
    storage.open_server("q")
    storage.append("q", written)
    storage.save_hard_state("q", hard_state)
    storage.sync()
    return storage
