"""The write-ahead log shared by every Raft server on a node, with group commit.

Rule: one ``write_batch`` call takes everything pending from every server (up to
``wal_batch_bytes_max``), writes it with one ``append_parts`` (the records' buffers,
an append's payloads as they are, in one ``pwritev``) and makes it durable with one
``sync``; only then are the operations reported done. Under load more operations gather
while the previous sync runs, so batches grow by themselves; when idle a batch holds one
operation and the latency is one sync.

The writer is synchronous (the simulator calls ``write_batch`` itself); the runtime runs
it in its writer thread (``engine.runtime.wal_writer.WalWriter``).

File format (``wal/<seq:08>.wal``, version 2): a 20-byte header (magic ``QWAL``,
version, seq, CRC32C of the first 16 bytes), then records ``[u32 body length][u32
CRC32C(body)][body]``, integers little-endian. The body's first byte is its type:
``BATCH`` (starts every write; carries an 8-byte marker used to tell a torn tail from
corruption in the middle), ``REGISTER`` (binds a small per-file number to a server's uid,
written once per file before that server's first record), ``RUN``, ``HARD_STATE``,
``RESET`` (the log of a server restarts after an installed snapshot) and ``FORGET`` (the
server is deleted). When the file reaches ``wal_file_bytes_max`` the WAL rolls to the next
file, which starts with the hard state of every server, so that an old file may be
deleted once its entries are in segments, then with the short runs of entries it
carries over (``engine.storage.wal_carry``): those leave with the next file instead.

A ``RUN`` record holds one append of one server, ``count`` contiguous entries from
``first``, in columns so that writing and reading it costs a few calls, not a few per
entry: ``[u8 type][u32 ref][u64 first][u32 count]``, then ``count`` u64 terms, ``count``
u64 ``now_ms``, ``count`` u8 kinds, ``count`` u32 payload lengths, then the payloads one
after the other. A torn or damaged run record loses the whole append, never part of it.

Version 1 files (one ``ENTRY`` record per entry: ``[u8 type][u32 ref][u64 index][u64
term][u64 now_ms][u8 kind]`` then the payload) are still read, so a node upgraded with a
WAL to replay recovers it; only version 2 is written. A file of an unknown version
refuses recovery (a newer build wrote it) rather than being taken for a torn file.
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate
from operator import attrgetter, eq

import crc32c

from engine.errors import RecoveryRefused, StorageFailed
from engine.limits import Limits
from engine.publish_trace import PublishTrace, Stage
from engine.quick_init import quick_init
from engine.raft.entry import Entry, EntryKind
from engine.storage.disk import Disk, DiskFile
from engine.storage.wal_carry import CarryRuns
from engine.storage.wal_stats import WalStats, WalTimes

WAL_DIR = "wal"
_KINDS = tuple(EntryKind)
"""Entry kinds by value, faster than calling the enum."""
_MAGIC = b"QWAL"
_VERSION = 2
_VERSIONS_READ = (1, 2)
_FILE_HEADER = struct.Struct("<4sIQ")
FILE_HEADER_BYTES = _FILE_HEADER.size + 4
_REC = struct.Struct("<II")
_BATCH_MARKER = b"\xa7QBATCH\x5c"
_T_BATCH, _T_REGISTER, _T_ENTRY, _T_HARD, _T_RESET, _T_FORGET, _T_RUN = 0, 1, 2, 3, 4, 5, 6
_BATCH = struct.Struct("<B8sQ")
_REGISTER = struct.Struct("<BI")
_ENTRY = struct.Struct("<BIQQQB")
"""Version 1 only: one record per entry."""
_HARD = struct.Struct("<BIQQB")
_RESET = struct.Struct("<BIQQ")
_RUN = struct.Struct("<BIQI")
_RUN_COLUMN_BYTES = 8 + 8 + 1 + 4
"""Column bytes of one entry in a run record: term, now_ms, kind, payload length."""
_OTHER_OP_BYTES = 64
"""What a hard state, reset or forget record is counted for against the batch limit."""
_INDEX, _TERM, _NOW_MS, _KIND, _DATA = (
    attrgetter(name) for name in ("index", "term", "now_ms", "kind", "data")
)


@dataclass(frozen=True, slots=True)
class HardState:
    """What a Raft server must not forget: its term, its vote in that term, its commit."""

    term: int
    vote: str | None
    commit: int


@quick_init
@dataclass(frozen=True, slots=True)
class AppendOp:
    uid: str
    entries: tuple[Entry, ...]
    """Contiguous; the first one replaces the stored entry at its index and all after."""


@dataclass(frozen=True, slots=True)
class HardStateOp:
    uid: str
    hard_state: HardState


@dataclass(frozen=True, slots=True)
class ResetOp:
    """The server's log restarts after an installed snapshot at ``index``/``term``."""

    uid: str
    index: int
    term: int


@dataclass(frozen=True, slots=True)
class ForgetOp:
    """The server is deleted: its files go, and its hard state is no longer carried."""

    uid: str


WalOp = AppendOp | HardStateOp | ResetOp | ForgetOp


@dataclass(frozen=True, slots=True)
class WalBatch:
    """The outcome of one group commit: ``ops`` in submission order, durable unless
    ``error`` is set; ``rolled`` names a WAL file that was closed after this batch."""

    ops: tuple[WalOp, ...]
    error: StorageFailed | None
    rolled: int | None
    bytes_written: int
    wal_seq: int
    """The WAL file the ops went to."""
    carried: tuple[str, ...] = ()
    """Servers whose entries in the rolled file were carried into the next one."""


def wal_path(seq: int) -> str:
    return f"{WAL_DIR}/{seq:08d}.wal"


def wal_seqs(disk: Disk) -> list[int]:
    return [int(n[:-4]) for n in disk.listdir(WAL_DIR) if n.endswith(".wal")]


_Pending = tuple[WalOp, list[bytes], int]
"""An operation waiting for the writer, with the encoded tail of its run record (none
for other operations) and the bytes it counts for against ``wal_batch_bytes_max``."""

_NO_TAIL: list[bytes] = []
"""The tail of an operation that is not an append (read only)."""


@lru_cache(maxsize=1024)
def _run_columns(count: int) -> struct.Struct:
    """The columns of a run record of ``count`` entries, packed or unpacked in one call."""
    return struct.Struct(f"<{count}Q{count}Q{count}B{count}I")


def _run_tail(entries: tuple[Entry, ...], entry_bytes_max: int) -> list[bytes]:
    """What follows the header of the run record of ``entries``: the columns, then the
    payloads, as the buffers to write (the payloads themselves: joined, each was copied
    twice more before the kernel's copy, once here and once into the batch). Checks the
    append on the way in, with a few calls rather than a loop: contiguous entries, none
    above ``entry_bytes_max``."""
    assert entries, "empty append"
    first = entries[0].index
    n = len(entries)
    assert all(map(eq, map(_INDEX, entries), range(first, first + n))), (
        "entries of one append must be contiguous"
    )
    parts = list(map(_DATA, entries))
    lengths = list(map(len, parts))
    assert max(lengths) <= entry_bytes_max, "entry above entry_bytes_max"
    columns = _run_columns(n).pack(
        *map(_TERM, entries), *map(_NOW_MS, entries), *map(_KIND, entries), *lengths
    )
    parts.insert(0, columns)
    return parts


def _decode_run(body: memoryview) -> tuple[int, list[Entry]]:
    """The ref and entries of a run record whose CRC was checked."""
    _, ref, first, n = _RUN.unpack_from(body)
    assert 1 <= n <= (len(body) - _RUN.size) // _RUN_COLUMN_BYTES, "run record too short"
    columns = _run_columns(n)
    values = columns.unpack_from(body, _RUN.size)
    terms, now_ms, kinds = values[:n], values[n : 2 * n], values[2 * n : 3 * n]
    ends = list(accumulate(values[3 * n :], initial=_RUN.size + columns.size))
    assert ends[-1] == len(body), "run record length does not match its payloads"
    assert max(kinds) < len(_KINDS), f"unknown entry kind {max(kinds)}"
    return ref, [
        Entry(first + k, terms[k], _KINDS[kinds[k]], now_ms[k], bytes(body[ends[k] : ends[k + 1]]))
        for k in range(n)
    ]


def _record(body_parts: list[bytes], out: list[bytes]) -> None:
    crc = 0
    n = 0
    for part in body_parts:
        # The GIL stays held (``gil_release_mode=0``): the CRC of an append takes a few
        # microseconds, and a writer that let the GIL go for them had to win it back from
        # a busy loop, a wait of up to a switch interval and two context switches each.
        crc = crc32c.crc32c(part, crc, gil_release_mode=0)
        n += len(part)
    out.append(_REC.pack(n, crc))
    out.extend(body_parts)


def _encode_op(op: WalOp, tail: list[bytes], ref: int, out: list[bytes]) -> None:
    if isinstance(op, AppendOp):
        _record([_RUN.pack(_T_RUN, ref, op.entries[0].index, len(op.entries)), *tail], out)
    elif isinstance(op, HardStateOp):
        _encode_hard_state(ref, op.hard_state, out)
    elif isinstance(op, ResetOp):
        _record([_RESET.pack(_T_RESET, ref, op.index, op.term)], out)
    else:
        _record([_REGISTER.pack(_T_FORGET, ref)], out)


def _ref_in(uid: str, out: list[bytes], known: dict[str, int], new: dict[str, int]) -> int:
    """The file-local number of ``uid``, registering it in ``out`` the first time."""
    ref = known.get(uid) or new.get(uid)
    if ref is None:
        ref = len(known) + len(new) + 1
        new[uid] = ref
        _record([_REGISTER.pack(_T_REGISTER, ref), uid.encode()], out)
    return ref


def _encode_hard_state(ref: int, hs: HardState, out: list[bytes]) -> None:
    vote = b"" if hs.vote is None else hs.vote.encode()
    head = _HARD.pack(_T_HARD, ref, hs.term, hs.commit, hs.vote is not None)
    _record([head, vote], out)


class Wal:
    """The node's WAL. ``submit`` from the servers' side, ``write_batch`` from the writer.

    ``submit`` and ``write_batch`` may run on different threads: the pending list is
    guarded by a lock, everything else belongs to the writer. The per-entry work of an
    append (its columns, the copy of its payloads) is done by ``submit``, while the
    writer syncs the previous batch; the writer adds a header and a CRC per append.
    """

    def __init__(
        self, disk: Disk, limits: Limits, seq: int, hard_states: dict[str, HardState]
    ) -> None:
        self._disk = disk
        self._limits = limits
        self._lock = threading.Lock()
        self._pending: list[_Pending] = []
        self._pending_bytes = 0
        self._hard_states = dict(hard_states)
        self._broken: StorageFailed | None = None
        self.times = WalTimes()
        self.trace: PublishTrace | None = None
        """Stamps the WAL's stages of a traced publish (``engine.publish_trace``)."""
        self.waker: Callable[[], None] | None = None
        """Called by a ``submit`` that found nothing pending; ``WalWriter`` sets it to wake
        its writer. A writer checks ``pending()`` under its own lock before it waits, so
        waking it once per idle period is enough (and spares a notify per submit)."""
        self._seq = seq
        self._size_at_create = 0
        self._carry = CarryRuns(limits.wal_carry_entries_max, limits.wal_carry_log_bytes_max)
        self._file, self._refs, self._size = self._create(seq, {})

    @property
    def seq(self) -> int:
        """The WAL file being written."""
        return self._seq

    def submit(self, op: WalOp) -> None:
        """Queue ``op`` for the next batch. An append's run record is encoded here, on the
        submitter's side, so that the writer only frames, joins, writes and syncs."""
        if self._broken is not None:
            raise self._broken
        if isinstance(op, AppendOp):
            tail = _run_tail(op.entries, self._limits.entry_bytes_max)
            tail_bytes = sum(map(len, tail))
            assert _RUN.size + tail_bytes < 1 << 32, "append above the size of one record"
            size = _REC.size + _RUN.size + tail_bytes
        else:
            tail, size = _NO_TAIL, _OTHER_OP_BYTES
        with self._lock:
            idle = not self._pending
            self._pending.append((op, tail, size))
            self._pending_bytes += size
        if self.trace is not None:
            self.trace.stamp(Stage.SUBMITTED)
        if idle and self.waker is not None:
            self.waker()

    def pending(self) -> bool:
        return bool(self._pending)

    def pending_bytes(self) -> int:
        """What the pending operations count for against ``wal_batch_bytes_max``."""
        return self._pending_bytes

    def stats(self) -> WalStats:
        """Counts and sync times of the group commits so far; safe from any thread."""
        return self.times.stats(self._seq)

    def write_batch(self) -> WalBatch:
        """One group commit: one write and one sync of every pending operation (up to the
        batch limit). Returns the batch, with ``error`` set if the disk refused it."""
        taken = self._take()
        trace = self.trace
        if trace is not None and taken:
            trace.stamp(Stage.TAKEN)
        ops = tuple(op for op, _, _ in taken)
        seq = self._seq
        if self._broken is not None:
            return WalBatch(ops, self._broken, None, 0, seq)
        out: list[bytes] = []
        self._batch_header(out)
        new_refs: dict[str, int] = {}
        for op, tail, _ in taken:
            _encode_op(op, tail, self._ref(op.uid, out, new_refs), out)
        size = sum(map(len, out))
        started = time.perf_counter()
        try:
            self._file.append_parts(out)
            if trace is not None:
                trace.stamp(Stage.WRITTEN)
            self._file.sync()
        except OSError as exc:
            return WalBatch(ops, self._fail(exc), None, 0, seq)
        if trace is not None:
            trace.stamp(Stage.SYNCED)
        self.times.record(time.perf_counter() - started, size)
        self._size += size
        self._refs.update(new_refs)
        carry = self._carry
        for op in ops:
            if isinstance(op, AppendOp):
                carry.appended(op.uid, op.entries)
            elif isinstance(op, HardStateOp):
                self._hard_states[op.uid] = op.hard_state
            else:
                carry.not_carried(op.uid)
                if isinstance(op, ForgetOp):
                    self._hard_states.pop(op.uid, None)
        rolled, carried = self._maybe_roll()
        return WalBatch(ops, None, rolled, size, seq, carried)

    def roll(self) -> int:
        """Close the current file now (a clean shutdown); returns its seq. Call it from
        the writer's side, with no batch in progress."""
        old_seq, old_file = self._seq, self._file
        self._carry.clear()
        self._file, self._refs, self._size = self._create(old_seq + 1, {})
        old_file.close()
        return old_seq

    def roll_if_written(self) -> WalBatch | None:
        """An idle writer's roll: close the current file if any operation went into it
        (a batch with no ops that names it rolled), else None. A file that cannot be made
        now leaves the current one in use, as ``_maybe_roll`` does."""
        if self._size <= self._size_at_create or self._broken is not None:
            return None
        rolled, carried = self._roll_to_next()
        return None if rolled is None else WalBatch((), None, rolled, 0, rolled, carried)

    @property
    def idle_roll_s(self) -> float:
        return self._limits.wal_idle_roll_ms / 1000

    def close(self) -> None:
        self._file.close()

    # -- inside the writer ----------------------------------------------------------------

    def _take(self) -> list[_Pending]:
        with self._lock:
            budget = self._limits.wal_batch_bytes_max
            if self._pending_bytes <= budget:
                taken, self._pending, self._pending_bytes = self._pending, [], 0
                return taken
            size_taken = 0
            n = 0
            for _, _, size in self._pending:
                if n and size_taken + size > budget:
                    break
                size_taken += size
                n += 1
            taken, self._pending = self._pending[:n], self._pending[n:]
            self._pending_bytes -= size_taken
            return taken

    def _batch_header(self, out: list[bytes]) -> None:
        _record([_BATCH.pack(_T_BATCH, _BATCH_MARKER, self._seq)], out)

    def _ref(self, uid: str, out: list[bytes], new_refs: dict[str, int]) -> int:
        return _ref_in(uid, out, self._refs, new_refs)

    def _fail(self, exc: OSError) -> StorageFailed:
        """Undo a failed write: cut the file back to its last durable size. If even that
        fails, nothing more is written to this WAL until the node restarts."""
        error = StorageFailed(f"WAL write failed: {exc.strerror or exc}")
        try:
            self._file.truncate(self._size)
            self._file.sync()
        except OSError as again:
            self._broken = StorageFailed(f"WAL unusable after a failed write: {again}")
            return self._broken
        return error

    def _create(
        self, seq: int, carried: dict[str, tuple[Entry, ...]]
    ) -> tuple[DiskFile, dict[str, int], int]:
        """A new WAL file that starts with every server's hard state, then the runs it
        carries, durable with its directory entry before any batch is reported done."""
        self._disk.makedirs(WAL_DIR)
        f = self._disk.open(wal_path(seq), create=True)
        f.truncate(0)
        head = _FILE_HEADER.pack(_MAGIC, _VERSION, seq)
        out = [head, struct.pack("<I", crc32c.crc32c(head))]
        refs: dict[str, int] = {}
        self._seq = seq
        self._batch_header(out)
        for uid in sorted(self._hard_states):
            ref = _ref_in(uid, out, {}, refs)
            _encode_hard_state(ref, self._hard_states[uid], out)
        for uid, run in carried.items():
            tail = _run_tail(run, self._limits.entry_bytes_max)
            _encode_op(AppendOp(uid, run), tail, _ref_in(uid, out, {}, refs), out)
        data = b"".join(out)
        f.append(data)
        f.sync()
        self._disk.sync_dir(WAL_DIR)
        self._size_at_create = len(data)
        return f, refs, len(data)

    def _maybe_roll(self) -> tuple[int | None, tuple[str, ...]]:
        if self._size < self._limits.wal_file_bytes_max:
            return None, ()
        return self._roll_to_next()

    def _roll_to_next(self) -> tuple[int | None, tuple[str, ...]]:
        """Start the next file, with the runs it carries, and close the current one; its
        seq and the servers carried, or None (and the current file still in use, its
        runs kept) when the next cannot be made now."""
        old_seq, old_file = self._seq, self._file
        runs = dict(self._carry.runs)
        limits = self._limits
        carried = self._carry.take(min(limits.wal_carry_bytes_max, limits.wal_file_bytes_max // 4))
        try:
            self._file, self._refs, self._size = self._create(old_seq + 1, carried)
        except OSError:
            # What was written is durable; keep writing the old file and try again later.
            self._seq = old_seq
            self._carry.runs = runs
            return None, ()
        old_file.close()
        return old_seq, tuple(carried)


# --- reading at recovery ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WalFile:
    seq: int
    ops: list[WalOp]
    good_bytes: int
    """Length of the valid prefix; ``ops`` are the operations in it."""
    size: int
    corrupt_at: int | None = None
    """Set when the bytes after the valid prefix are not a torn tail: a valid batch
    follows at ``valid_at``, so synced data was damaged (the caller decides what to do)."""
    valid_at: int | None = None


def _records(data: memoryview, start: int) -> Iterator[tuple[int, memoryview]]:
    """(offset, body) of each valid record from ``start``; stops at the first bad one."""
    pos, end = start, len(data)
    while pos + _REC.size <= end:
        n, crc = _REC.unpack_from(data, pos)
        body_end = pos + _REC.size + n
        if n == 0 or body_end > end:
            return
        body = data[pos + _REC.size : body_end]
        if crc32c.crc32c(body) != crc:
            return
        yield pos, body
        pos = body_end


def _valid_batch_after(view: memoryview, pos: int) -> int | None:
    """Offset of a valid BATCH record after ``pos``: proof that the bad bytes at ``pos``
    are corruption of synced data, not a torn last write."""
    data = bytes(view)
    at = data.find(_BATCH_MARKER, pos + 1)
    while at >= 0:
        start = at - _REC.size - 1
        if start > pos:
            for _, body in _records(view, start):
                if body[0] == _T_BATCH:
                    return start
                break
        at = data.find(_BATCH_MARKER, at + 1)
    return None


def read_wal_file(disk: Disk, seq: int) -> WalFile:
    """Parse one WAL file up to its first bad record; says whether what follows is a torn
    tail or corruption of synced data (``corrupt_at``)."""
    data = disk.read_mapped(wal_path(seq))
    head = bytes(data[: _FILE_HEADER.size])
    crc_ok = (
        len(data) >= FILE_HEADER_BYTES
        and crc32c.crc32c(head) == struct.unpack_from("<I", data, _FILE_HEADER.size)[0]
    )
    magic, version, file_seq = _FILE_HEADER.unpack(head) if crc_ok else (b"", 0, 0)
    if magic != _MAGIC or file_seq != seq:
        return WalFile(seq, [], 0, len(data))
    if version not in _VERSIONS_READ:
        raise RecoveryRefused(
            f"WAL file {wal_path(seq)} has format version {version}, this build reads "
            f"versions {', '.join(map(str, _VERSIONS_READ))}: start the build that wrote it"
        )
    uids: dict[int, str] = {}
    ops: list[WalOp | list[Entry]] = []
    owners: list[str] = []
    good = FILE_HEADER_BYTES
    for pos, body in _records(data, FILE_HEADER_BYTES):
        _decode(body, uids, ops, owners)
        good = pos + _REC.size + len(body)
    later = _valid_batch_after(data, good) if good < len(data) else None
    done: list[WalOp] = []
    for op, owner in zip(ops, owners, strict=True):
        done.append(AppendOp(owner, tuple(op)) if isinstance(op, list) else op)
    return WalFile(seq, done, good, len(data), None if later is None else good, later)


def _decode(
    body: memoryview, uids: dict[int, str], ops: list[WalOp | list[Entry]], owners: list[str]
) -> None:
    """Append the operation in ``body``; runs of entries of one server become one list."""
    kind = body[0]
    op: WalOp
    if kind == _T_RUN:
        ref, entries = _decode_run(body)
        _add_entries(uids[ref], entries, ops, owners)
        return
    if kind == _T_ENTRY:
        _, ref, index, term, now_ms, ek = _ENTRY.unpack_from(body)
        entry = Entry(index, term, _KINDS[ek], now_ms, bytes(body[_ENTRY.size :]))
        _add_entries(uids[ref], [entry], ops, owners)
        return
    if kind == _T_REGISTER:
        _, ref = _REGISTER.unpack_from(body)
        uids[ref] = bytes(body[_REGISTER.size :]).decode()
        return
    if kind == _T_HARD:
        _, ref, term, commit, has_vote = _HARD.unpack_from(body)
        vote = bytes(body[_HARD.size :]).decode() if has_vote else None
        op = HardStateOp(uids[ref], HardState(term, vote, commit))
    elif kind == _T_RESET:
        _, ref, index, term = _RESET.unpack_from(body)
        op = ResetOp(uids[ref], index, term)
    elif kind == _T_FORGET:
        _, ref = _REGISTER.unpack_from(body)
        op = ForgetOp(uids[ref])
    else:
        assert kind == _T_BATCH, f"unknown WAL record type {kind}"
        return
    ops.append(op)
    owners.append(op.uid)


def _add_entries(
    uid: str, entries: list[Entry], ops: list[WalOp | list[Entry]], owners: list[str]
) -> None:
    last = ops[-1] if ops else None
    if isinstance(last, list) and owners[-1] == uid and last[-1].index + 1 == entries[0].index:
        last.extend(entries)
    else:
        ops.append(entries)
        owners.append(uid)


__all__ = [
    "AppendOp",
    "ForgetOp",
    "HardState",
    "HardStateOp",
    "ResetOp",
    "Wal",
    "WalBatch",
    "WalFile",
    "WalOp",
    "read_wal_file",
    "wal_path",
    "wal_seqs",
]
