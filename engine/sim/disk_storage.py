"""The simulator's storage plug (``engine.sim.storage.SimStorage``) on the real code.

Rule: one ``SimDiskStorage`` per simulated server, each with its own ``FakeDisk`` (a
server is a node); every call goes to ``NodeStorage`` exactly as the runtime's would, so
the simulator's crashes, torn writes and bit flips hit the real WAL, segment and
checkpoint code. Entries become visible when synced: the Raft core keeps unsynced
entries in its own unstable buffer. ``corrupt`` flips a bit in a durable file of a
crashed server (the WAL before its last batch, a segment's data, its index or header, a
checkpoint) and recovers again: the server restarts on what recovery made of it.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

from engine.errors import EntryDamaged
from engine.ids import ServerId
from engine.limits import DEFAULT_LIMITS, KIB, Limits
from engine.raft.config import Configuration
from engine.raft.entry import Entry
from engine.raft.events import HardState as RaftHardState
from engine.raft.snapshot import Snapshot
from engine.storage.checkpoint import Checkpoint, checkpoint_of
from engine.storage.compaction import CompactionResult
from engine.storage.disk import FakeDisk
from engine.storage.node_storage import NodeStorage, WriteFailed
from engine.storage.segment import read_segment_info, segment_dir
from engine.storage.server_log import ServerLog
from engine.storage.wal import FILE_HEADER_BYTES, HardState, read_wal_file, wal_seqs

UID = "server"
SMALL_FILES = dataclasses.replace(
    DEFAULT_LIMITS,
    wal_file_bytes_max=4 * KIB,
    wal_batch_bytes_max=2 * KIB,
    entry_bytes_max=2 * KIB,
    segment_entries_max=8,
    segment_file_bytes_max=4 * KIB,
    segment_readers_open_max=2,
    checkpoints_kept_max=3,
    batch_bytes_max=256,
    message_bytes_max=64,
    message_bytes_max_ceiling=128,
)
"""Small files, so that WAL rolls, segment flushes and many segments happen in short runs."""


def _checkpoint(snapshot: Snapshot) -> Checkpoint:
    return checkpoint_of(snapshot, 0)


class SimDiskStorage:
    """``SimStorage`` backed by ``NodeStorage`` on a ``FakeDisk``."""

    def __init__(self, disk: FakeDisk | None = None, limits: Limits = DEFAULT_LIMITS) -> None:
        self.disk = disk if disk is not None else FakeDisk()
        self.limits = limits
        self.compactions: list[CompactionResult] = []
        """What the compaction after each snapshot did (it survives reopens)."""
        self._open()

    def _open(self) -> None:
        self.node = NodeStorage.open(self.disk, self.limits)
        self.recovered = self.node.open_server(UID)
        hs = self.recovered.hard_state
        self._written_hs = None if hs is None else RaftHardState(hs.term, _vote(hs.vote), hs.commit)
        self._durable = (self._written_hs, self._log.last_index())

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

    def config_indexes(self, lo: int, hi: int) -> list[int]:
        return self._log.config_indexes(lo, hi)

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
            self._written_hs = hard_state

    def sync(self) -> None:
        for event in self.node.sync():
            assert not isinstance(event, WriteFailed), event
        self._durable = (self._written_hs, self._log.last_index())

    def durable(self) -> tuple[RaftHardState | None, int]:
        return self._durable

    def repairing(self) -> bool:
        return self.node.repairing(UID)

    def finish_repair(self) -> None:
        self.node.finish_repair(UID)

    def mark_damaged(self, error: EntryDamaged) -> None:
        self.node.mark_damaged(UID, error)

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

    def corrupt(self, rng: random.Random) -> str | None:
        """Flip one bit of a durable file of this (crashed) server and recover again;
        says what was hit, or ``None`` if nothing fit."""
        choices: list[tuple[str, str]] = [("wal", f"wal/{n}") for n in self.disk.listdir("wal")]
        seg = segment_dir(UID)
        for name in self.disk.listdir(seg):
            if name.endswith(".seg"):
                choices += [("segment data", f"{seg}/{name}"), ("segment index", f"{seg}/{name}")]
        for directory in (f"queues/{UID}/checkpoints", f"queues/{UID}/snapshots"):
            choices += [("checkpoint", f"{directory}/{n}") for n in self.disk.listdir(directory)]
        kind = rng.choice(sorted({k for k, _ in choices}))
        path = rng.choice([p for k, p in choices if k == kind])
        bit = self._bit_to_flip(rng, kind, path)
        if bit is None:
            return None
        self.disk.flip_bit(path, bit)
        self.disk.crash()
        self._open()
        return f"{kind} {path} bit {bit}"

    def rot(self, rng: random.Random) -> str | None:
        """Flip one bit in the data of a segment of this running server (bit rot found
        by a later read, if any reads it); says what was hit."""
        seg = segment_dir(UID)
        paths = [f"{seg}/{n}" for n in self.disk.listdir(seg) if n.endswith(".seg")]
        if not paths:
            return None
        path = rng.choice(paths)
        bit = self._bit_to_flip(rng, "segment data", path)
        if bit is None:
            return None
        self.disk.flip_bit(path, bit)
        return f"segment data {path} bit {bit} (while running)"

    def _bit_to_flip(self, rng: random.Random, kind: str, path: str) -> int | None:
        size = len(self.disk.read(path))
        if kind == "wal":
            return self._wal_bit(rng, path, size)
        if kind == "checkpoint":
            return rng.randrange(size * 8) if size else None
        info = read_segment_info(self.disk, path)
        if info is None or not 0 < info.data_offset < size:
            return None
        if kind == "segment data":
            return rng.randrange(info.data_offset * 8, size * 8)
        return rng.randrange(info.data_offset * 8)

    def _wal_bit(self, rng: random.Random, path: str, size: int) -> int | None:
        """A bit whose flip recovery can tell from a torn write: a valid batch follows
        it, or the file is not the last one. (A flip in the last batch of the last file
        looks like a torn write and would lose durable data unseen.)"""
        seq = int(path.rsplit("/", 1)[1].split(".")[0])
        last = max(wal_seqs(self.disk))
        for _ in range(8):
            if size <= FILE_HEADER_BYTES:
                return None
            bit = rng.randrange(FILE_HEADER_BYTES * 8, size * 8)
            self.disk.flip_bit(path, bit)
            found = read_wal_file(self.disk, seq)
            self.disk.flip_bit(path, bit)
            if found.corrupt_at is not None or (found.good_bytes < size and seq != last):
                return bit
        return None

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


__all__ = ["SMALL_FILES", "SimDiskStorage"]
