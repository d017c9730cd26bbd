"""Repair markers: a server whose durable data was damaged is repaired from its peers.

Rule: the marker is written (atomically, like a checkpoint) before anything is cut or
deleted, and removed only once the server's Raft core has left repair mode and the hard
state recording that is durable (``NodeStorage.finish_repair``), and no WAL file written
before the repair began remains. While it exists the server opens in repair mode, and
every open replays the same cut: recovery (``recovery.py``) applies the WAL files before
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

Planning (``plan_repair``): entries from the first bad index on are lost or untrusted, so
the log is cut before it; if that is at or before the checkpoint, the log restarts after
the checkpoint, unless a live entry the checkpoint names is lost (or only in the mem
table, which a restart empties): then, as for a second damage during a repair, the
server is reset. ``Repairs`` keeps the markers of one node's servers; recovery
(``recovery.py``) applies the plans.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

import crc32c

from engine.errors import RecoveryRefused, StorageFailed
from engine.storage.checkpoint import Checkpoint
from engine.storage.disk import Disk, ensure_dir, parent, write_file_atomic
from engine.storage.server_log import NO_LIVE, ServerLog

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


REPAIR_FILE = "repair"
"""The marker's name in its server's directory."""


def repair_path(uid: str) -> str:
    return f"queues/{uid}/{REPAIR_FILE}"


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
    path = repair_path(uid)
    ensure_dir(disk, parent(path))
    write_file_atomic(disk, path, encode_marker(marker))


def reset_marker(log: ServerLog, reason: str, wal_seq: int) -> RepairMarker:
    """The marker of a reset of ``log`` beginning with WAL file ``wal_seq``."""
    kind = RepairKind.RESETTING
    return RepairMarker(kind, 0, 0, 0, wal_seq, wal_seq, log.next_segment_seq, reason)


def plan_repair(
    log: ServerLog,
    cp: Checkpoint | None,
    first_bad: int,
    kind: RepairKind,
    reason: str,
    wal_seq: int,
    *,
    skip_from: int,
    in_repair: bool,
) -> RepairMarker:
    """The marker of a repair of ``log`` whose entries from ``first_bad`` on are lost or
    untrusted, found with ``cp`` the newest valid checkpoint (see the module's rules);
    ``skip_from`` (or 0) is the first WAL file left out after a corrupt record."""
    base = cp.index if cp is not None else log.snapshot_index()
    if in_repair or (first_bad <= base and cp is None):
        return reset_marker(log, reason, wal_seq)
    restart = (0, 0)
    if first_bad <= base:
        assert cp is not None
        # The log restarts after the checkpoint: a live entry it names must be neither
        # lost nor in the mem table (a restart empties it).
        mem = log.mem
        lost = cp.live_indexes.range_cardinality(first_bad, base + 1)
        in_mem = 0
        if len(mem) and mem.lo <= base:
            in_mem = cp.live_indexes.range_cardinality(mem.lo, min(mem.hi, base) + 1)
        if lost or in_mem:
            return reset_marker(log, reason, wal_seq)
        restart = (cp.index, cp.term)
    return RepairMarker(
        kind,
        first_bad - 1,
        restart[0],
        restart[1],
        skip_from or wal_seq,
        wal_seq,
        log.next_segment_seq,
        reason,
    )


def apply_cut(log: ServerLog, m: RepairMarker) -> None:
    """Show the cut of ``m`` in the view of ``log``."""
    if m.resets:
        log.apply_reset(0, 0)
        log.snapshot_live = NO_LIVE
        return
    log.keep_to(m.keep_to)
    if m.restart_index > log.last_index():
        log.apply_reset(m.restart_index, m.restart_term)


def refusal(uid: str, reason: str) -> str:
    """Why a server whose group has no other member is not repaired."""
    return (
        f"queue {uid}: {reason}; the queue has no other member to repair it from: its "
        "files are left as they are, restore it from a backup"
    )


class Repairs:
    """The servers of one node in repair, with their markers; owner thread only."""

    def __init__(self, disk: Disk, remove: Callable[[str], None]) -> None:
        self.disk = disk
        self._remove = remove
        self._markers: dict[str, RepairMarker] = {}
        self._done: set[str] = set()
        """Servers whose core left repair: their marker goes with the last older WAL file."""
        self.unrepairable: str | None = None
        """The server being opened, if its group has no other member to repair it."""

    def __contains__(self, uid: str) -> bool:
        return uid in self._markers

    def get(self, uid: str) -> RepairMarker | None:
        return self._markers.get(uid)

    def uids(self) -> list[str]:
        return sorted(self._markers)

    def load(self, uid: str, wal_seq: int) -> RepairMarker | None:
        """At recovery: read the marker of ``uid`` (``wal_seq``: the next WAL file)."""
        m = read_marker(self.disk, uid, wal_seq)
        if m is not None:
            self._markers[uid] = m
        return m

    def set(self, uid: str, m: RepairMarker) -> None:
        """Write the marker of ``uid`` durably, before anything of it is applied."""
        if uid == self.unrepairable:
            raise RecoveryRefused(refusal(uid, m.reason))
        try:
            write_marker(self.disk, uid, m)
        except OSError as exc:
            raise StorageFailed(f"repair marker of {uid} could not be written: {exc}") from exc
        self._markers[uid] = m
        self._done.discard(uid)

    def finish(self, uid: str, oldest_wal_seq: int) -> bool:
        """The core of ``uid`` left repair: drop the marker if no WAL file before the
        repair remains (``oldest_wal_seq``), else once ``drop_done`` finds none."""
        if uid not in self._markers:
            return True
        self._done.add(uid)
        return self._maybe_drop(uid, oldest_wal_seq)

    def drop_done(self, oldest_wal_seq: int) -> None:
        for uid in sorted(self._done):
            self._maybe_drop(uid, oldest_wal_seq)

    def _maybe_drop(self, uid: str, oldest_wal_seq: int) -> bool:
        m = self._markers[uid]
        if oldest_wal_seq < m.wal_seq:
            return False
        self._remove(repair_path(uid))
        del self._markers[uid]
        self._done.discard(uid)
        return True

    def forget(self, uid: str) -> None:
        """``uid`` was removed with its files."""
        self._markers.pop(uid, None)
        self._done.discard(uid)


__all__ = [
    "REPAIR_FILE",
    "RepairKind",
    "RepairMarker",
    "Repairs",
    "apply_cut",
    "decode_marker",
    "encode_marker",
    "plan_repair",
    "read_marker",
    "refusal",
    "repair_path",
    "reset_marker",
    "write_marker",
]
