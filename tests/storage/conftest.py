from __future__ import annotations

import dataclasses

from engine.limits import DEFAULT_LIMITS, KIB, Limits
from engine.raft.log import Entry, EntryKind


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
