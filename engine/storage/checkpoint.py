"""Checkpoints and the snapshot of one server: the machine's light state at an index.

Rule: a checkpoint file is complete or absent (temporary name, sync, rename, directory
sync), and is checked whole by CRC32C before it is used. At most
``checkpoints_kept_max`` are kept; past that the one whose removal leaves the most even
spacing is deleted (never the newest nor the oldest), which thins them from the middle.
``promote`` turns the newest checkpoint at or below an index into the snapshot: it moves
to ``snapshots/``, and every older checkpoint and snapshot is deleted. The log before a
snapshot is needed only for the live entries it names.

File format (``checkpoints/<index:020>.chk``, same in ``snapshots/``): a 56-byte header
(magic ``QCHK``, version u16, flags u16, index u64, term u64, machine version u32,
config length u32, live length u64, state length u64, 4 zero bytes), then the cluster
configuration (bytes given by the runtime), the live indexes (``BitMap64.serialize``),
the machine state, and the CRC32C of all that precedes it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import crc32c
from pyroaring import BitMap64

from engine.storage.disk import Disk, ensure_dir, write_file_atomic

if TYPE_CHECKING:
    from engine.raft.snapshot import Snapshot

_MAGIC = b"QCHK"
_VERSION = 1
_HEADER = struct.Struct("<4sHHQQIIQQ4x")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    index: int
    term: int
    machine_version: int
    config: bytes
    """The cluster configuration in force at ``index``, encoded by the Raft layer."""
    live_indexes: BitMap64
    state: bytes | memoryview
    """``machine.snapshot()`` after applying ``index``. A loaded checkpoint holds a
    read-only view of the mapped file: ``restore`` from it directly (numpy and msgpack
    read buffers) or copy it with ``bytes()``."""
    file_bytes: int = field(default=0, compare=False)
    """The size of the file it was read from (0 for one made in memory): its size is
    known without encoding it again, which copies the whole state."""

    def __post_init__(self) -> None:
        assert self.index >= 1 and self.term >= 1
        assert len(self.live_indexes) == 0 or self.live_indexes.max() <= self.index


def checkpoint_of(snapshot: Snapshot, machine_version: int) -> Checkpoint:
    """The checkpoint that keeps ``snapshot`` (one a leader sent, to install): its
    machine's state as it came, written by a machine of ``machine_version``."""
    return Checkpoint(
        snapshot.index,
        snapshot.term,
        machine_version,
        snapshot.config.encode(),
        snapshot.live_indexes,
        snapshot.machine_state,
    )


def encode_checkpoint(cp: Checkpoint) -> bytes:
    live = cp.live_indexes.serialize()
    head = _HEADER.pack(
        _MAGIC,
        _VERSION,
        0,
        cp.index,
        cp.term,
        cp.machine_version,
        len(cp.config),
        len(live),
        len(cp.state),
    )
    crc = crc32c.crc32c(
        cp.state, crc32c.crc32c(live, crc32c.crc32c(cp.config, crc32c.crc32c(head)))
    )
    return b"".join([head, cp.config, live, cp.state, struct.pack("<I", crc)])


def decode_checkpoint(data: bytes | memoryview) -> Checkpoint | None:
    """The checkpoint in ``data``, or ``None`` if it is damaged in any way."""
    if len(data) < _HEADER.size + 4:
        return None
    magic, version, _, index, term, mv, config_n, live_n, state_n = _HEADER.unpack_from(data)
    if magic != _MAGIC or version != _VERSION or index < 1 or term < 1:
        return None
    end = _HEADER.size + config_n + live_n + state_n
    if end + 4 != len(data):
        return None
    view = memoryview(data)
    if crc32c.crc32c(view[:end]) != struct.unpack_from("<I", data, end)[0]:
        return None
    at = _HEADER.size
    config = bytes(view[at : at + config_n])
    live = BitMap64.deserialize(bytes(view[at + config_n : at + config_n + live_n]))
    state = view[at + config_n + live_n : end]
    return Checkpoint(index, term, mv, config, live, state, len(data))


class CheckpointStore:
    """The checkpoints and snapshot of one server, in ``queues/<uid>/``."""

    def __init__(self, disk: Disk, uid: str, kept_max: int) -> None:
        assert kept_max >= 2
        self._disk = disk
        self._kept_max = kept_max
        self.checkpoint_dir = f"queues/{uid}/checkpoints"
        self.snapshot_dir = f"queues/{uid}/snapshots"
        # Both directories are made with their first file (``ensure_dir``); a missing one
        # lists as empty.
        for d in (self.checkpoint_dir, self.snapshot_dir):
            for name in disk.listdir(d):
                if name.endswith(".tmp"):
                    disk.remove(f"{d}/{name}")

    def checkpoint_indexes(self) -> list[int]:
        return _indexes(self._disk, self.checkpoint_dir)

    def snapshot_index(self) -> int:
        found = _indexes(self._disk, self.snapshot_dir)
        return found[-1] if found else 0

    def write(self, cp: Checkpoint) -> int:
        """Write ``cp`` durably, then thin the older ones out; the size of the file.
        Touches only the disk: it may run in a worker thread."""
        data = encode_checkpoint(cp)
        ensure_dir(self._disk, self.checkpoint_dir)
        write_file_atomic(self._disk, self._path(self.checkpoint_dir, cp.index), data)
        indexes = self.checkpoint_indexes()
        while len(indexes) > self._kept_max:
            victim = _thinning_victim(indexes)
            self._disk.remove(self._path(self.checkpoint_dir, victim))
            indexes.remove(victim)
        self._disk.sync_dir(self.checkpoint_dir)
        return len(data)

    def install_snapshot(self, cp: Checkpoint) -> int:
        """A snapshot received from the leader: written straight to ``snapshots/``;
        every checkpoint and older snapshot is dropped. The bytes of its file."""
        data = encode_checkpoint(cp)
        ensure_dir(self._disk, self.snapshot_dir)
        write_file_atomic(self._disk, self._path(self.snapshot_dir, cp.index), data)
        self._drop_below(self.snapshot_dir, cp.index)
        self._drop_below(self.checkpoint_dir, cp.index + 1)
        return len(data)

    def promote(self, release_index: int) -> int | None:
        """Make the newest checkpoint at or below ``release_index`` the snapshot; returns
        its index, or ``None`` if there is no such checkpoint."""
        candidates = [i for i in self.checkpoint_indexes() if i <= release_index]
        if not candidates:
            return None
        index = candidates[-1]
        ensure_dir(self._disk, self.snapshot_dir)
        self._disk.rename(
            self._path(self.checkpoint_dir, index), self._path(self.snapshot_dir, index)
        )
        self._disk.sync_dir(self.snapshot_dir)
        self._disk.sync_dir(self.checkpoint_dir)
        self._drop_below(self.snapshot_dir, index)
        self._drop_below(self.checkpoint_dir, index)
        return index

    def load_newest(self) -> tuple[Checkpoint | None, list[str]]:
        """The newest valid checkpoint or snapshot, and the paths of damaged ones skipped.
        A damaged snapshot is reported, not skipped silently: the caller decides."""
        paths = [self._path(self.checkpoint_dir, i) for i in self.checkpoint_indexes()]
        paths += [self._path(self.snapshot_dir, i) for i in _indexes(self._disk, self.snapshot_dir)]
        paths.sort(key=lambda p: int(p.rsplit("/", 1)[1][:-4]), reverse=True)
        damaged: list[str] = []
        for path in paths:
            cp = decode_checkpoint(self._disk.read_mapped(path))
            if cp is not None:
                return cp, damaged
            damaged.append(path)
        return None, damaged

    def read_snapshot(self) -> Checkpoint | None:
        """The snapshot, or ``None`` if there is none or it is damaged."""
        index = self.snapshot_index()
        if not index:
            return None
        return decode_checkpoint(self._disk.read(self._path(self.snapshot_dir, index)))

    def _drop_below(self, directory: str, index: int) -> None:
        removed = False
        for i in _indexes(self._disk, directory):
            if i < index:
                self._disk.remove(self._path(directory, i))
                removed = True
        if removed:
            self._disk.sync_dir(directory)

    @staticmethod
    def _path(directory: str, index: int) -> str:
        return f"{directory}/{index:020d}.chk"


def _indexes(disk: Disk, directory: str) -> list[int]:
    return sorted(int(n[:-4]) for n in disk.listdir(directory) if n.endswith(".chk"))


def _thinning_victim(indexes: list[int]) -> int:
    """The middle checkpoint whose neighbours are closest together: removing it hurts
    the spread of recovery points least (deterministic, ties to the older one)."""
    assert len(indexes) >= 3
    best = min(range(1, len(indexes) - 1), key=lambda k: (indexes[k + 1] - indexes[k - 1], k))
    return indexes[best]


__all__ = [
    "Checkpoint",
    "CheckpointStore",
    "checkpoint_of",
    "decode_checkpoint",
    "encode_checkpoint",
]
