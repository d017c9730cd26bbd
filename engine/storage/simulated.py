"""The simulator's storage plug (``engine.sim.storage.SimStorage``) on the real code.

Rule: one ``SimDiskStorage`` per simulated server, each with its own ``FakeDisk`` (a
server is a node); every call goes to ``NodeStorage`` exactly as the runtime's would, so
the simulator's crashes, torn writes and bit flips hit the real WAL, segment and
checkpoint code. Entries become visible when synced: the Raft core keeps unsynced
entries in its own unstable buffer.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from engine.ids import ServerId
from engine.limits import DEFAULT_LIMITS, Limits
from engine.raft.config import Configuration
from engine.raft.events import HardState as RaftHardState
from engine.raft.log import Entry
from engine.raft.snapshot import Snapshot
from engine.storage.checkpoint import Checkpoint
from engine.storage.compaction import CompactionResult
from engine.storage.disk import FakeDisk
from engine.storage.log import ServerLog
from engine.storage.node import NodeStorage, WriteFailed
from engine.storage.wal import HardState

UID = "server"


def _checkpoint(snapshot: Snapshot) -> Checkpoint:
    return Checkpoint(
        snapshot.index,
        snapshot.term,
        0,
        snapshot.config.encode(),
        snapshot.live_indexes,
        snapshot.machine_state,
    )


class SimDiskStorage:
    """``SimStorage`` backed by ``NodeStorage`` on a ``FakeDisk``."""

    def __init__(self, disk: FakeDisk | None = None, limits: Limits = DEFAULT_LIMITS) -> None:
        self.disk = disk if disk is not None else FakeDisk()
        self.limits = limits
        self.compactions: list[CompactionResult] = []
        """What the compaction after each snapshot did (it survives reopens)."""
        self.refused: str | None = None
        """The ``RecoveryRefused`` message of the last reopen, if recovery refused."""
        self._open()

    def _open(self) -> None:
        self.node = NodeStorage.open(self.disk, self.limits)
        self.recovered = self.node.open_server(UID)

    @property
    def _log(self) -> ServerLog:
        return self.node.log(UID)

    # -- LogStore --------------------------------------------------------------------------

    def first_index(self) -> int:
        return self._log.first_index()

    def last_index(self) -> int:
        return self._log.last_index()

    def snapshot_index(self) -> int:
        return self._log.snapshot_index()

    def term(self, index: int) -> int | None:
        return self._log.term(index)

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        return self._log.entries(lo, hi, max_bytes)

    def entry(self, index: int) -> Entry:
        return self._log.read(index)

    # -- SimStorage -------------------------------------------------------------------------

    def write(
        self,
        hard_state: RaftHardState | None,
        snapshot: Snapshot | None,
        entries: list[Entry],
        snapshot_entries: Sequence[Entry] = (),
    ) -> None:
        if snapshot is not None:
            self.node.install_snapshot(UID, _checkpoint(snapshot), snapshot_entries)
        if entries:
            self.node.append(UID, entries)
        if hard_state is not None:
            hs = HardState(hard_state.term, hard_state.vote, hard_state.commit)
            self.node.save_hard_state(UID, hs)

    def sync(self) -> None:
        for event in self.node.sync():
            assert not isinstance(event, WriteFailed), event

    def save_snapshot(self, snapshot: Snapshot) -> None:
        self.node.write_checkpoint(UID, _checkpoint(snapshot))
        assert self.node.release_cursor(UID, snapshot.index) == snapshot.index
        # Every snapshot is followed by a compaction, so the simulation's crashes, torn
        # writes and invariants also cover the compacted log.
        self.compactions.append(self.node.compact(UID, "auto"))

    def crash(self, rng: random.Random, tear: bool) -> None:
        if tear and self.node.wal.pending():
            self.node.write_batch()  # written, maybe in part, never reported durable
        self.disk.crash(rng if tear else None)
        self._open()

    def recover(self) -> tuple[RaftHardState | None, Snapshot | None]:
        hs = self.recovered.hard_state
        raft_hs = None if hs is None else RaftHardState(hs.term, _vote(hs.vote), hs.commit)
        cp = self.recovered.checkpoint
        return raft_hs, None if cp is None else _snapshot(cp)

    def snapshot(self) -> Snapshot | None:
        cp = self.node.checkpoints(UID).read_snapshot()
        return None if cp is None else _snapshot(cp)


def _snapshot(cp: Checkpoint) -> Snapshot:
    config = Configuration.decode(cp.config)
    return Snapshot(cp.index, cp.term, config, bytes(cp.state), cp.live_indexes)


def _vote(vote: str | None) -> ServerId | None:
    return None if vote is None else ServerId(vote)


__all__ = ["SimDiskStorage"]
