"""Every server's log on one node, by uid (``ServerLogs``), awake or packed.

Rule: changed only on the node's own thread, through ``NodeStorage``. A sleeping queue's
log is kept packed (``ServerLog.pack``: one ``bytes`` where the log's objects took about
a kilobyte, and made when it falls asleep, so that the objects its awake spell allocated
are all freed); whatever asks for it to change it unpacks it for good. The two things
storage itself does to an idle log are done to the packed form: a WAL roll carries its
last rows (``carry``), and the flush of their file unpacks it and packs it again after
(``rows_to_flush``, ``repack``).
"""

from __future__ import annotations

from pyroaring import BitMap64

from engine.storage.disk import Disk
from engine.storage.segment import ReaderCache, SegmentInfo
from engine.storage.server_log import NO_LIVE, ServerLog
from engine.storage.wal import AppendOp, ForgetOp, HardStateOp, WalOp

PACKED_ROWS_BYTES_MAX = 1_024
"""A log whose mem table holds more (``MemTable.bytes``) is packed only once its rows
are flushed: a packed log's ``bytes`` over 512 bytes is the C allocator's, which keeps the
holes that packing it again after the flush would leave; the rows of an idle log that
are carried from WAL file to WAL file are a few hundred bytes."""


class ServerLogs:
    """The log of every server on one node, by uid. Each log has a generation: a new
    log (created, or again after a removal) or a reset starts a new one, so a flush or a
    compaction prepared against an older generation knows its result is stale."""

    def __init__(self, disk: Disk, cache: ReaderCache) -> None:
        self.disk = disk
        self.cache = cache
        self._logs: dict[str, ServerLog | bytes] = {}
        """By uid, each log, or a sleeping queue's packed (``pack``): taking one from
        here (``get``, ``find``, ``existing``) unpacks it for good, as whatever asks may
        change it; ``view`` only reads it."""
        self._generations: dict[str, int] = {}
        self.forgotten: set[str] = set()
        """Servers whose removal is in the WAL (their files may remain after a crash)."""
        self.installed: dict[str, tuple[SegmentInfo | None, BitMap64]] = {}
        """Segment of live entries written by ``install_snapshot`` and the snapshot's live
        set, shown at the reset."""
        self._packed_rows: dict[str, tuple[int, int]] = {}
        """Of each packed log with mem-table rows: the WAL file of its first row and the
        rows' ``MemTable.bytes`` (the flush of that file unpacks it, ``rows_to_flush``)."""
        self._repack: dict[str, None] = {}
        """Logs to pack once a flush is shown (``repack``): packed ones that it unpacked,
        and those whose rows were too many to pack when their queue fell asleep."""

    def get(self, uid: str) -> ServerLog:
        """The log of ``uid``, created empty if there is none."""
        log = self.find(uid)
        if log is None:
            log = self._logs[uid] = ServerLog(uid, self.disk, self.cache)
            self.new_generation(uid)
        return log

    def find(self, uid: str) -> ServerLog | None:
        log = self._logs.get(uid)
        if isinstance(log, bytes):
            log = self._logs[uid] = ServerLog.unpacked(uid, self.disk, self.cache, log)
            self._packed_rows.pop(uid, None)
        self._repack.pop(uid, None)  # asked for from outside: it stays as it is now
        return log

    def existing(self, uid: str) -> ServerLog:
        log = self.find(uid)
        if log is None:
            raise KeyError(uid)
        return log

    def pack(self, uid: str) -> bool:
        """Keep the log of ``uid`` packed (its queue fell asleep) if it may be
        (``ServerLog.packable``), or after the next flush if its mem table holds more
        than ``PACKED_ROWS_BYTES_MAX``; says whether it is packed now."""
        log = self._logs[uid]
        if isinstance(log, ServerLog):
            if not log.packable():
                return False
            if log.mem.bytes > PACKED_ROWS_BYTES_MAX:
                self._repack[uid] = None  # packed once its rows are flushed
                return False
            self._logs[uid] = log.pack()
            if len(log.mem):
                self._packed_rows[uid] = (log.mem.first_wal_seq, log.mem.bytes)
        return True

    def rows_to_flush(self, wal_seq: int, most: int | None = None) -> list[str]:
        """Unpack the packed logs with rows of WAL files up to ``wal_seq`` (its flush is
        being planned: it looks at unpacked logs only), at most ``most`` of them (a
        flush takes a bounded group of logs, ``Limits.segment_flush_logs_max``); their
        uids. ``repack`` packs them again."""
        due = [uid for uid, (seq, _) in self._packed_rows.items() if seq <= wal_seq]
        if most is not None:
            del due[most:]
        for uid in due:
            self.find_for_flush(uid)
        return due

    def packed_rows_due(self, wal_seq: int) -> bool:
        """Whether a packed log holds rows of WAL files up to ``wal_seq``."""
        return any(seq <= wal_seq for seq, _ in self._packed_rows.values())

    def find_for_flush(self, uid: str) -> ServerLog | None:
        """``find`` for the flush: a packed log it unpacks is packed again after it."""
        log = self._logs.get(uid)
        if isinstance(log, bytes):
            self._repack[uid] = None
            self._packed_rows.pop(uid, None)
            log = self._logs[uid] = ServerLog.unpacked(uid, self.disk, self.cache, log)
        return log

    def repack(self) -> None:
        """Pack again the logs ``rows_to_flush`` unpacked, that nothing asked for since."""
        due, self._repack = self._repack, {}
        for uid in due:
            if uid in self._logs:
                self.pack(uid)

    def carry(self, uid: str, wal_seq: int) -> None:
        """``MemTable.carry`` in the log of ``uid``, packed or not (a packed one is
        unpacked for it and packed again: an idle log's rows are carried at each roll)."""
        log = self._logs.get(uid)
        if isinstance(log, ServerLog):
            log.mem.carry(wal_seq)
        elif log is not None and uid in self._packed_rows:
            unpacked = ServerLog.unpacked(uid, self.disk, self.cache, log)
            unpacked.mem.carry(wal_seq)
            self._logs[uid] = unpacked.pack()
            self._packed_rows[uid] = (unpacked.mem.first_wal_seq, unpacked.mem.bytes)

    def mem_bytes(self) -> int:
        """What every mem table holds, those of packed logs included."""
        rows = sum(log.mem.bytes for _uid, log in self.items())
        return rows + sum(n for _seq, n in self._packed_rows.values())

    def view(self, uid: str) -> ServerLog:
        """The log of ``uid`` to read only: a packed one is unpacked for the caller and
        stays packed here (the dashboard reads the segments of sleeping queues)."""
        log = self._logs[uid]
        if isinstance(log, bytes):
            return ServerLog.unpacked(uid, self.disk, self.cache, log)
        return log

    def reads(self, uid: str) -> tuple[int, int]:
        """(entries read, of those from memory) of the log of ``uid``, packed or not."""
        log = self._logs[uid]
        if isinstance(log, bytes):
            return ServerLog.packed_reads(log)
        return log.reads, log.reads_in_memory + log.cache_hits

    def is_packed(self, uid: str) -> bool:
        return isinstance(self._logs.get(uid), bytes)

    def uids(self) -> list[str]:
        return sorted(self._logs)

    def items(self) -> list[tuple[str, ServerLog]]:
        """The logs not packed (see ``rows_to_flush`` for the rows of packed ones)."""
        return [(uid, log) for uid, log in self._logs.items() if isinstance(log, ServerLog)]

    def generation(self, uid: str) -> int:
        return self._generations[uid]

    def new_generation(self, uid: str) -> None:
        self._generations[uid] = self._generations.get(uid, 0) + 1

    def apply(self, op: WalOp, wal_seq: int, *, recovering: bool = False) -> None:
        """Show a durable WAL op of file ``wal_seq`` in the log it names."""
        if isinstance(op, ForgetOp):
            self._logs.pop(op.uid, None)
            self._packed_rows.pop(op.uid, None)
            self._repack.pop(op.uid, None)
            self.installed.pop(op.uid, None)
            self.forgotten.add(op.uid)
            return
        self.forgotten.discard(op.uid)
        log = self.get(op.uid)
        if isinstance(op, AppendOp):
            # At recovery a record may follow entries that are gone: superseded by an
            # overwrite later in the WAL, or before a snapshot whose reset record was in
            # a deleted WAL file. The mem table then restarts at the record.
            log.apply_append(op.entries, wal_seq, gap_allowed=recovering)
        elif isinstance(op, HardStateOp):
            log.hard_state = op.hard_state
        else:
            self.new_generation(op.uid)
            log.apply_reset(op.index, op.term)
            installed = self.installed.pop(op.uid, None)
            if installed is not None:
                segment, live = installed
                log.snapshot_live = live if live else NO_LIVE
                if segment is not None:
                    log.add_segment(segment)


__all__ = ["ServerLogs"]
