"""Repair markers: a server whose durable data was damaged is repaired from its peers.

Rule: the marker is written (atomically, like a checkpoint) before anything is cut or
deleted, and removed only once the server's Raft core has left repair mode and the hard
state recording that is durable (``NodeStorage.finish_repair``), and no WAL file written
before the repair began remains. While it exists the server opens in repair mode, and
every open replays the same cut: ``NodeStorage.open`` applies the WAL files before
``wal_seq`` (leaving out the entries and resets of files ``skip_from .. wal_seq - 1``,
which followed a corrupt WAL record), then keeps the log up to ``keep_to`` only and, if
``restart_index`` is set, restarts it after that checkpoint (a reset empties it); then
the segments from ``segment_seq`` on and the WAL files from ``wal_seq`` on, which hold
what the server wrote during its repair, are applied after the cut.

File format (``queues/<uid>/repair``): a 56-byte header (magic ``QREP``, version u16,
kind u16, keep_to u64, restart_index u64, restart_term u64, skip_from u64, wal_seq u64,
segment_seq u64),
the reason in UTF-8, and the CRC32C of all that precedes it. A marker that fails its
check is read as a reset (the log is emptied): the conservative choice.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

import crc32c

from engine.storage.disk import Disk, write_file_atomic

_MAGIC = b"QREP"
_VERSION = 1
_HEADER = struct.Struct("<4sHHQQQQQQ")


class RepairKind(IntEnum):
    CUT = 0
    """The log keeps a prefix (a corrupt entry, or committed entries missing)."""
    RESET = 1
    """The log and checkpoints are gone: the leader sends a snapshot."""
    WAL = 2
    """A WAL record of unknown owner was corrupt: what followed it was left out."""
    RESETTING = 3
    """A reset whose files may not all be deleted yet: the next open deletes them."""


_KINDS = tuple(int(k) for k in RepairKind)


@dataclass(frozen=True, slots=True)
class RepairMarker:
    kind: RepairKind
    keep_to: int
    restart_index: int
    restart_term: int
    skip_from: int
    wal_seq: int
    segment_seq: int
    """Segments from this seq on were written during the repair (after the cut)."""
    reason: str

    def __post_init__(self) -> None:
        assert self.skip_from <= self.wal_seq
        if self.kind in (RepairKind.RESET, RepairKind.RESETTING):
            assert self.keep_to == self.restart_index == 0

    @property
    def resets(self) -> bool:
        return self.kind in (RepairKind.RESET, RepairKind.RESETTING)


def repair_path(uid: str) -> str:
    return f"queues/{uid}/repair"


def encode_marker(m: RepairMarker) -> bytes:
    head = _HEADER.pack(
        _MAGIC,
        _VERSION,
        int(m.kind),
        m.keep_to,
        m.restart_index,
        m.restart_term,
        m.skip_from,
        m.wal_seq,
        m.segment_seq,
    )
    body = head + m.reason.encode()
    return body + struct.pack("<I", crc32c.crc32c(body))


def decode_marker(data: bytes, wal_seq: int) -> RepairMarker:
    """The marker in ``data``; a damaged one is a reset before WAL file ``wal_seq``."""
    ok = len(data) >= _HEADER.size + 4 and crc32c.crc32c(data[:-4]) == int.from_bytes(
        data[-4:], "little"
    )
    if ok:
        magic, version, kind, keep_to, r_index, r_term, skip_from, seq, seg = _HEADER.unpack_from(
            data
        )
        ok = magic == _MAGIC and version == _VERSION and kind in _KINDS
    if not ok:
        kind = RepairKind.RESETTING
        return RepairMarker(kind, 0, 0, 0, wal_seq, wal_seq, 0, "repair marker damaged")
    reason = data[_HEADER.size : -4].decode(errors="replace")
    return RepairMarker(RepairKind(kind), keep_to, r_index, r_term, skip_from, seq, seg, reason)


def read_marker(disk: Disk, uid: str, wal_seq: int) -> RepairMarker | None:
    path = repair_path(uid)
    if not disk.exists(path):
        return None
    return decode_marker(disk.read(path), wal_seq)


def write_marker(disk: Disk, uid: str, marker: RepairMarker) -> None:
    write_file_atomic(disk, repair_path(uid), encode_marker(marker))


__all__ = [
    "RepairKind",
    "RepairMarker",
    "decode_marker",
    "encode_marker",
    "read_marker",
    "repair_path",
    "write_marker",
]
