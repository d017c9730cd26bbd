"""The dedup window of one queue: the dedup ids published recently, with the id of the
first message that carried each.

Rule of this module: a dedup id is remembered for ``window_ms`` of leader time from its
first publish, and at most ``ids_max`` ids are kept: beyond that the oldest are
forgotten early (the window shrinks, never grows). Ids are remembered in publish order,
which is also the order of their expiry, so forgetting is always from the front.

A full window holds a million ids, so it is kept in columns rather than a dict of bytes
(about 170 bytes an id): the ids end to end in one bytearray, their offsets, expiries
and first message ids in numpy arrays, in publish order, numbered by a sequence number
that only grows (slot ``seq`` is at ``seq - base`` in the arrays). Forgetting moves the
head; the arrays are compacted or grown when an append finds no room. A ``SlotTable``
finds the slots whose id may be a given one; the id itself decides. The checkpoint form
is the live part of these columns as bytes.

The ids of frames (a publish frame's one id for all its messages: ``enqueue_codec``'s
``FLAG_FRAME``) are kept apart, in a window of their own under the same rule and limits,
with the frame's first message id as first id: a frame id never matches a message's.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import numpy.typing as npt

from engine.queue.dedup_table import Hashes, SlotTable, hash_ids
from engine.shared_empty import check_shared_empties

I64 = npt.NDArray[np.int64]
WIRE_COLUMNS = 2
"""First element of the checkpoint form ``[WIRE_COLUMNS, ids, lengths, expiries, first
ids]``; the older form is a list of ``[expiry, id, first id]``, which ``adopt`` reads too."""
WIRE_FRAMES = 3
"""First element of the checkpoint form of a window that holds frame ids: ``[WIRE_FRAMES,
message ids' form, frame ids' form]``, each as a window without frames has it (so a
window that never saw a frame id is checkpointed as before)."""
_LEN = np.dtype("<u2")
_I64 = np.dtype("<i8")
COMPACT_SLOTS_MIN = 4096
"""Forgotten slots at the front are compacted away once more than this many and more
than the live ones."""
_CHECK_IDS_MAX = 10_000
"""``check`` compares the ids themselves up to this many."""


class _Columns:
    """The ids of a window that holds at least one, and their lookup."""

    __slots__ = ("base", "end", "expiry", "first", "head", "ids", "offsets", "table")

    def __init__(self, capacity: int, seq: int) -> None:
        self.ids = bytearray()
        """The ids of slots ``base`` to ``end``, end to end."""
        self.offsets: I64 = np.zeros(capacity + 1, np.int64)
        """Where the id of each slot starts in ``ids`` (and the next one ends)."""
        self.expiry: I64 = np.zeros(capacity, np.int64)
        self.first: I64 = np.zeros(capacity, np.int64)
        self.base = self.head = self.end = seq
        """Sequence numbers of the arrays' first slot, of the oldest live one, and past
        the newest."""
        self.table: SlotTable | None = SlotTable(0)
        """None after ``adopt`` until first needed (``lookup``): a queue woken to be read
        does not hash a window it will not publish to."""

    @property
    def capacity(self) -> int:
        return len(self.expiry)

    def id_at(self, seq: int) -> bytes:
        i = seq - self.base
        return bytes(self.ids[int(self.offsets[i]) : int(self.offsets[i + 1])])

    def make_room(self, more: int) -> None:
        """Room for ``more`` slots after ``end`` (``compact`` when there is none)."""
        if self.end - self.base + more > self.capacity:
            self.compact(more)

    def compact(self, more: int = 0) -> None:
        """The live slots move to the front of arrays about a quarter larger than they
        and ``more`` slots need (new ones if these are too small or four times too
        large), and the forgotten ids leave ``ids``."""
        live_at, end_at = self.head - self.base, self.end - self.base
        live = end_at - live_at
        capacity = live + more + (live + more) // 4 + 16
        start = int(self.offsets[live_at])
        del self.ids[:start]
        offsets = self.offsets[live_at : end_at + 1] - start
        expiry, first = self.expiry[live_at:end_at], self.first[live_at:end_at]
        if capacity > self.capacity or 4 * capacity < self.capacity:
            self.offsets = np.zeros(capacity + 1, np.int64)
            self.expiry = np.zeros(capacity, np.int64)
            self.first = np.zeros(capacity, np.int64)
        self.offsets[: live + 1] = offsets
        self.expiry[:live] = expiry
        self.first[:live] = first
        self.base = self.head

    def append(self, keys: list[bytes], firsts: list[int], expiry: int, hashes: Hashes) -> None:
        more = len(keys)
        self.make_room(more)
        at = self.end - self.base
        self.ids += b"".join(keys)
        if isinstance(hashes, list):  # a few, one by one: numpy's cost per call is higher
            offset = int(self.offsets[at])
            for i, key in enumerate(keys, at):
                offset += len(key)
                self.offsets[i + 1] = offset
                self.expiry[i] = expiry
                self.first[i] = firsts[i - at]
        else:
            lengths = np.fromiter(map(len, keys), np.int64, count=more)
            self.offsets[at + 1 : at + more + 1] = self.offsets[at] + np.cumsum(lengths)
            self.expiry[at : at + more] = expiry
            self.first[at : at + more] = firsts
        table = self.lookup()
        self.table = table.insert(hashes, self.end, self.head, self.end - self.head)
        self.end += more

    def expired_until(self, now_ms: int) -> int:
        """The sequence number of the oldest live slot whose window ends after
        ``now_ms`` (``end`` if none): looked for in chunks growing from the head, as
        usually none or a few have expired."""
        at, end_at = self.head - self.base, self.end - self.base
        chunk = 64
        while at < end_at:
            later = self.expiry[at : min(end_at, at + chunk)] > now_ms
            if later.any():
                return self.base + at + int(later.argmax())
            at += len(later)
            chunk *= 8
        return self.end

    def nbytes(self) -> int:
        arrays = self.offsets.nbytes + self.expiry.nbytes + self.first.nbytes
        table = 0 if self.table is None else self.table.nbytes
        return int(arrays + table + self.ids.__alloc__())

    def lookup(self) -> SlotTable:
        """The table, built from the live slots' ids if there is none yet."""
        if self.table is None:
            live_at, end_at = self.head - self.base, self.end - self.base
            data = bytes(self.ids)
            bounds = self.offsets[live_at : end_at + 1].tolist()
            hashes = hash_ids([data[a:b] for a, b in itertools.pairwise(bounds)])
            seqs = np.arange(self.head, self.end, dtype=np.int64)
            self.table = SlotTable.build(np.asarray(hashes, np.uint64), seqs)
        return self.table


def _le_bytes(column: I64) -> bytes:
    """An int64 column as little-endian bytes, copied once on a little-endian host."""
    return column.astype(_I64, copy=False).tobytes()


def _as_list(hashes: Hashes) -> list[int]:
    return hashes if isinstance(hashes, list) else hashes.tolist()


def _mark_repeats(keys: list[tuple[int, bytes]], ids: list[int], duplicate: list[bool]) -> None:
    """``find_duplicates`` within the batch (two of its ids have one hash): a later
    message with an earlier one's id."""
    seen: dict[bytes, int] = {}
    for k, key in keys:
        if duplicate[k]:
            continue
        first = seen.get(key)
        if first is not None:
            duplicate[k] = True
            ids[k] = first
        else:
            seen[key] = ids[k]


class DedupWindow:
    __slots__ = ("_batch", "_columns", "_frames", "_ids_max", "_window_ms")

    def __init__(self, window_ms: int, ids_max: int) -> None:
        self._window_ms = window_ms
        self._ids_max = ids_max
        self._columns: _Columns | None = None
        """Made by the first id remembered and dropped once empty (most queues publish
        without dedup ids)."""
        self._frames: DedupWindow | None = None
        """The frame ids' window, made by the first frame id looked for."""
        self._batch: tuple[list[tuple[int, bytes]], Hashes] | None = None
        """The keys ``find_duplicates`` was last given and their hashes, which
        ``remember`` takes again for the same batch."""

    def __len__(self) -> int:
        """The message ids remembered (``frames`` holds the frame ids)."""
        c = self._columns
        return 0 if c is None else c.end - c.head

    def nbytes(self) -> int:
        own = 0 if self._columns is None else self._columns.nbytes()
        return own + (0 if self._frames is None else self._frames.nbytes())

    def frames(self) -> DedupWindow:
        """The window of frame ids: ``find_duplicates`` and ``remember`` there take
        (frame, frame id) keys and each frame's first message id."""
        if self._frames is None:
            self._frames = DedupWindow(self._window_ms, self._ids_max)
        return self._frames

    def frame_count(self) -> int:
        """The frame ids remembered."""
        return 0 if self._frames is None else len(self._frames)

    def prune(self, now_ms: int) -> None:
        """Forget the ids whose window ended at or before ``now_ms``."""
        if self._frames is not None:
            self._frames.prune(now_ms)
        c = self._columns
        if c is None or c.expiry[c.head - c.base] > now_ms:
            return
        self._forget_until(c, c.expired_until(now_ms))

    def _forget_until(self, c: _Columns, seq: int) -> None:
        c.head = seq
        if c.head == c.end:
            self._columns = None
        elif c.head - c.base > max(COMPACT_SLOTS_MIN, c.end - c.head):
            c.compact()

    def find_duplicates(
        self, keys: list[tuple[int, bytes]], ids: list[int], duplicate: list[bool]
    ) -> None:
        """Mark the messages of a batch that repeat a remembered id or an earlier one of
        the same batch: ``duplicate[slot]`` becomes True and ``ids[slot]`` the first
        message's id. ``keys``: (slot, dedup id) of the messages that carry one."""
        hashes = hash_ids([key for _k, key in keys])
        self._batch = (keys, hashes)
        c = self._columns
        if c is not None:
            for q, seq in zip(*c.lookup().candidates(hashes, c.head), strict=True):
                k, key = keys[q]
                if not duplicate[k] and c.id_at(seq) == key:
                    duplicate[k] = True
                    ids[k] = int(c.first[seq - c.base])
        if len(keys) > 1 and len(set(_as_list(hashes))) < len(keys):
            _mark_repeats(keys, ids, duplicate)

    def remember(
        self, keys: list[tuple[int, bytes]], ids: list[int], duplicate: list[bool], now_ms: int
    ) -> None:
        """Remember the ids of the batch's messages that are not duplicates."""
        batch, self._batch = self._batch, None
        if not keys:
            return
        hashes = batch[1] if batch is not None and batch[0] is keys else None
        if True in duplicate:
            new = [q for q, (k, _key) in enumerate(keys) if not duplicate[k]]
            if not new:
                return
            if isinstance(hashes, list):
                hashes = [hashes[q] for q in new]
            elif hashes is not None:
                hashes = hashes[new]
            keys = [keys[q] for q in new]
        c = self._columns
        if c is None:
            c = self._columns = _Columns(len(keys), 0)
        new_ids = [key for _k, key in keys]
        c.append(
            new_ids,
            [ids[k] for k, _key in keys],
            now_ms + self._window_ms,
            hash_ids(new_ids) if hashes is None else hashes,
        )
        if c.end - c.head > self._ids_max:
            self._forget_until(c, c.end - self._ids_max)

    def to_wire(self) -> list[Any]:
        """The live slots' columns as bytes: what a checkpoint holds, the same bytes on
        every replica that applied the same entries."""
        if self._frames is not None and len(self._frames):
            return [WIRE_FRAMES, self._own_wire(), self._frames.to_wire()]
        return self._own_wire()

    def _own_wire(self) -> list[Any]:
        c = self._columns
        if c is None:
            return []
        live_at, end_at = c.head - c.base, c.end - c.base
        offsets = c.offsets[live_at : end_at + 1]
        # A full window is tens of MB, frozen on the loop at every checkpoint: each
        # column is copied once (a bytearray slice, ``astype`` and ``tobytes`` would
        # copy it two or three times).
        with memoryview(c.ids) as ids:
            live_ids = bytes(ids[int(offsets[0]) : int(offsets[-1])])
        lengths = np.empty(end_at - live_at, _LEN)
        np.subtract(offsets[1:], offsets[:-1], out=lengths, casting="unsafe")
        return [
            WIRE_COLUMNS,
            live_ids,
            lengths.tobytes(),
            _le_bytes(c.expiry[live_at:end_at]),
            _le_bytes(c.first[live_at:end_at]),
        ]

    def adopt(self, wire: list[Any]) -> None:
        """Fill an empty window from ``to_wire``'s form, or from the older form: a list of
        ``[expiry, id, first message id]``."""
        assert self._columns is None and not self.frame_count()
        if not wire:
            return
        if wire[0] == WIRE_FRAMES:
            _tag, own, frames = wire
            self.adopt(own)
            self._frames = None
            if frames:
                self.frames().adopt(frames)
            return
        if isinstance(wire[0], int):
            tag, ids, lengths_b, expiry_b, first_b = wire
            assert tag == WIRE_COLUMNS, tag
            lengths = np.frombuffer(lengths_b, _LEN).astype(np.int64)
            expiry = np.frombuffer(expiry_b, _I64)
            first = np.frombuffer(first_b, _I64)
        else:
            ids = b"".join(key for _e, key, _m in wire)
            lengths = np.fromiter((len(key) for _e, key, _m in wire), np.int64, count=len(wire))
            expiry = np.fromiter((e for e, _k, _m in wire), np.int64, count=len(wire))
            first = np.fromiter((m for _e, _k, m in wire), np.int64, count=len(wire))
        n = len(lengths)
        assert len(expiry) == len(first) == n and int(lengths.sum()) == len(ids)
        c = _Columns(n, 0)
        c.ids += ids
        np.cumsum(lengths, out=c.offsets[1 : n + 1])
        c.expiry[:n] = expiry
        c.first[:n] = first
        c.end = n
        c.table = None
        self._columns = c

    def check(self) -> None:
        check_shared_empties()
        if self._frames is not None:
            self._frames.check()
        c = self._columns
        if c is None:
            return
        assert c.base <= c.head < c.end <= c.base + c.capacity
        assert c.end - c.head <= self._ids_max
        live_at, end_at = c.head - c.base, c.end - c.base
        assert int(c.offsets[end_at]) == len(c.ids)
        assert bool(np.all(np.diff(c.offsets[live_at : end_at + 1]) >= 1))
        if c.table is not None:
            c.table.check(c.head, c.end)
        if c.end - c.head <= _CHECK_IDS_MAX:
            live = [c.id_at(seq) for seq in range(c.head, c.end)]
            assert len(set(live)) == len(live), "an id is remembered once"


__all__ = ["DedupWindow"]
