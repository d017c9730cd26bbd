"""A snapshot as values: ``SnapshotMeta`` (what the core needs to start) and ``Snapshot``
(the checkpoint promoted to the snapshot, as the core ships it to a lagging follower).

Following Ra's hybrid-machine design, a snapshot does not fold payloads into the machine
state: ``live_indexes`` names the log entries at or below ``index`` that the machine
still needs, and those entries stay in the log (storage keeps them through compaction).
Neither value carries their payloads: a restart needs none of them (the runtime restores
the machine from the checkpoint file and hands the core a ``SnapshotMeta``), and a leader
reads the live entries a follower lacks from its ``LogStore`` in bounded messages, after
the checkpoint's bytes (see ``engine.raft.server``). The file format belongs to
``engine.storage``; this module only defines the values and the byte form of the
checkpoint the core ships in chunks.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack
from pyroaring import BitMap64

from engine.raft.config import Configuration


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    """Where the log before the snapshot ends: its index, term and configuration."""

    index: int
    term: int
    config: Configuration
    """The configuration in force at ``index``."""

    def __post_init__(self) -> None:
        assert self.index >= 1 and self.term >= 1


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Machine state at ``index`` and the set of live entries at or below it."""

    index: int
    term: int
    config: Configuration
    """The configuration in force at ``index``."""
    machine_state: bytes
    live_indexes: BitMap64

    def __post_init__(self) -> None:
        assert self.index >= 1 and self.term >= 1
        assert not self.live_indexes or self.live_indexes.max() <= self.index

    @property
    def meta(self) -> SnapshotMeta:
        return SnapshotMeta(self.index, self.term, self.config)

    def encode(self) -> bytes:
        body = [
            self.index,
            self.term,
            self.config.encode(),
            self.machine_state,
            self.live_indexes.serialize(),
        ]
        return bytes(msgpack.packb(body, use_bin_type=True))

    @staticmethod
    def parse(data: bytes) -> Snapshot | None:
        """The snapshot ``data`` encodes, or ``None`` if it encodes none (the bytes a
        follower assembled from a leader's chunks)."""
        try:
            index, term, config_data, state, live = msgpack.unpackb(data, raw=False)
            live_indexes = BitMap64.deserialize(live) if type(live) is bytes else None
        except (ValueError, TypeError, IndexError, msgpack.UnpackException):
            return None
        if type(index) is not int or type(term) is not int or index < 1 or term < 1:
            return None
        config = Configuration.parse(config_data) if type(config_data) is bytes else None
        if config is None or live_indexes is None or type(state) is not bytes:
            return None
        if live_indexes and live_indexes.max() > index:
            return None
        return Snapshot(index, term, config, state, live_indexes)


__all__ = ["Snapshot", "SnapshotMeta"]
