"""A snapshot as a value: checkpoint (machine state at an index) + the live entries before it.

Following Ra's hybrid-machine design, a snapshot does not fold payloads into the machine
state: ``live_indexes`` names the log entries at or below ``index`` that the machine
still needs, and ``live_entries`` carries them so a lagging follower can be installed
from the snapshot alone. The file format belongs to ``engine.storage``; this module only
defines the in-memory value and the byte form the core ships in chunks.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack
from pyroaring import BitMap64

from engine.raft.config import Configuration
from engine.raft.log import Entry, EntryKind


@dataclass(frozen=True, slots=True)
class Snapshot:
    index: int
    term: int
    config: Configuration
    """The configuration in force at ``index``."""
    machine_state: bytes
    live_indexes: BitMap64
    live_entries: tuple[Entry, ...]
    """The entries named by ``live_indexes``, in index order."""

    def __post_init__(self) -> None:
        assert self.index >= 1 and self.term >= 1
        assert len(self.live_entries) == len(self.live_indexes)
        assert all(e.index <= self.index for e in self.live_entries)

    def encode(self) -> bytes:
        entries = [[e.index, e.term, int(e.kind), e.now_ms, e.data] for e in self.live_entries]
        body = [
            self.index,
            self.term,
            self.config.encode(),
            self.machine_state,
            self.live_indexes.serialize(),
            entries,
        ]
        return bytes(msgpack.packb(body, use_bin_type=True))

    @staticmethod
    def decode(data: bytes) -> Snapshot:
        index, term, config, state, live, entries = msgpack.unpackb(data, raw=False)
        return Snapshot(
            index=index,
            term=term,
            config=Configuration.decode(config),
            machine_state=state,
            live_indexes=BitMap64.deserialize(live),
            live_entries=tuple(Entry(i, t, EntryKind(k), n, d) for i, t, k, n, d in entries),
        )


__all__ = ["Snapshot"]
