"""Packed message references: one unsigned 64-bit integer names one message in the log.

Rule of this module: pure functions over ints and numpy arrays, no state except the
``FallbackTable`` that the machine owns (and snapshots).

A message is identified by the Raft index of its enqueue entry, its slot in that entry
(a publish batch is one entry) and its byte size (body + headers), which the machine
needs for ``max_bytes`` and ``bytes_ready`` without reading the log. Three forms:

========  =====================================================  =====================
tag bits  layout (high to low)                                   used when
========  =====================================================  =====================
``0``     tag:1 | index:44 | size:15 | slot:4                     index < 2^44, size < 2^15, slot < 16
``10``    tag:2 | index:37 | slot:10 | size:15                    index < 2^37, size < 2^15, slot < 1024
``11``    tag:2 | handle:62 (into the machine's ``FallbackTable``) anything else
========  =====================================================  =====================

The first form is the one for single-message entries (and batches of at most 16); the
second is used for every slot of a larger batch. A ref is never 0, because a Raft index is at least 1; 0 marks an empty slot in
the pending ring. Packing is a function of (index, slot, size) except in the fallback
form, whose handle the machine assigns from a counter, so every replica assigns the same.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from pyroaring import BitMap64

from engine.index_sets import add_indexes
from engine.shared_empty import EMPTY_DICT

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]

INDEX_BITS_SHORT = 44
SIZE_BITS = 15
SLOT_BITS_SHORT = 4
INDEX_BITS_LONG = 37
SLOT_BITS_LONG = 10
HANDLE_BITS = 62

INDEX_LIMIT_SHORT = 1 << INDEX_BITS_SHORT
INDEX_LIMIT_LONG = 1 << INDEX_BITS_LONG
SIZE_LIMIT = 1 << SIZE_BITS
SLOT_LIMIT_SHORT = 1 << SLOT_BITS_SHORT
SLOT_LIMIT_LONG = 1 << SLOT_BITS_LONG
SLOTS_PER_ENTRY_MAX = SLOT_LIMIT_LONG
"""A batch entry holds at most this many messages (``message_id`` uses 10 slot bits)."""

_TAG_LONG = 0b10 << 62
_TAG_FALLBACK = 0b11 << 62
_SIZE_MASK = SIZE_LIMIT - 1
_SLOT_MASK_SHORT = SLOT_LIMIT_SHORT - 1
_SLOT_MASK_LONG = SLOT_LIMIT_LONG - 1
_INDEX_MASK_LONG = INDEX_LIMIT_LONG - 1
_HANDLE_MASK = (1 << HANDLE_BITS) - 1
_NO_INDEXES = np.empty(0, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class RefParts:
    index: int
    slot: int
    size: int


def is_fallback(ref: int) -> bool:
    return ref >> 62 == 0b11


def try_pack(index: int, slot: int, size: int, batch: int = 1) -> int | None:
    """The compact ref of message ``slot`` of an entry holding ``batch`` messages, or
    ``None`` when only the fallback form fits. Entries of at most 16 messages use the
    first form, larger batches the second for every slot, so that neighbouring refs
    of one batch differ by small steps (see ``engine.queue.pages``)."""
    assert index >= 1 and 0 <= slot < batch <= SLOTS_PER_ENTRY_MAX and size >= 0
    if size >= SIZE_LIMIT:
        return None
    if index < INDEX_LIMIT_SHORT and batch <= SLOT_LIMIT_SHORT:
        return (index << (SIZE_BITS + SLOT_BITS_SHORT)) | (size << SLOT_BITS_SHORT) | slot
    if index < INDEX_LIMIT_LONG:
        return _TAG_LONG | (index << (SLOT_BITS_LONG + SIZE_BITS)) | (slot << SIZE_BITS) | size
    return None


def unpack_compact(ref: int) -> RefParts:
    """(index, slot, size) of a ref in one of the two compact forms."""
    assert 0 < ref < (1 << 64) and not is_fallback(ref), ref
    if ref >> 63 == 0:
        return RefParts(
            index=ref >> (SIZE_BITS + SLOT_BITS_SHORT),
            slot=ref & _SLOT_MASK_SHORT,
            size=(ref >> SLOT_BITS_SHORT) & _SIZE_MASK,
        )
    return RefParts(
        index=(ref >> (SLOT_BITS_LONG + SIZE_BITS)) & _INDEX_MASK_LONG,
        slot=(ref >> SIZE_BITS) & _SLOT_MASK_LONG,
        size=ref & _SIZE_MASK,
    )


def fallback_ref(handle: int) -> int:
    assert 0 <= handle <= _HANDLE_MASK
    return _TAG_FALLBACK | handle


def fallback_handle(ref: int) -> int:
    assert is_fallback(ref)
    return ref & _HANDLE_MASK


def message_id(index: int, slot: int) -> int:
    """The stable public id of a message: ``index * 1024 + slot`` (what the API shows)."""
    assert index >= 1 and 0 <= slot < SLOTS_PER_ENTRY_MAX
    return (index << SLOT_BITS_LONG) | slot


def message_id_parts(mid: int) -> tuple[int, int]:
    return mid >> SLOT_BITS_LONG, mid & _SLOT_MASK_LONG


class FallbackTable:
    """Refs that do not fit a compact form: handle -> (index, slot, size).

    Entries are few (messages of 32 KiB or more, or logs past 2^37 entries with large
    batches) and are removed when their message leaves the queue.
    """

    __slots__ = ("_entries", "_next_handle")

    def __init__(self) -> None:
        self._entries: dict[int, tuple[int, int, int]] = EMPTY_DICT
        self._next_handle = 0

    def __len__(self) -> int:
        return len(self._entries)

    def pack(self, index: int, slot: int, size: int, batch: int = 1) -> int:
        """The ref of a message, compact when it fits, else a new fallback handle."""
        ref = try_pack(index, slot, size, batch)
        if ref is not None:
            return ref
        handle = self._next_handle
        self._next_handle += 1
        if self._entries is EMPTY_DICT:
            self._entries = {}
        self._entries[handle] = (index, slot, size)
        return fallback_ref(handle)

    def unpack(self, ref: int) -> RefParts:
        if not is_fallback(ref):
            return unpack_compact(ref)
        index, slot, size = self._entries[fallback_handle(ref)]
        return RefParts(index=index, slot=slot, size=size)

    def place(self, ref: int) -> tuple[int, int]:
        """(index, slot) of a ref, as ``unpack`` gives them without building a
        ``RefParts`` (a receive asks it of every message it hands out)."""
        if ref >> 63 == 0:
            return ref >> (SIZE_BITS + SLOT_BITS_SHORT), ref & _SLOT_MASK_SHORT
        if ref >> 62 == 0b10:
            return (ref >> (SLOT_BITS_LONG + SIZE_BITS)) & _INDEX_MASK_LONG, (
                ref >> SIZE_BITS
            ) & _SLOT_MASK_LONG
        index, slot, _size = self._entries[ref & _HANDLE_MASK]
        return index, slot

    def size(self, ref: int) -> int:
        """Byte size of a ref (the hot path of the machine's byte counters)."""
        if ref >> 63 == 0:
            return (ref >> SLOT_BITS_SHORT) & _SIZE_MASK
        if ref >> 62 == 0b10:
            return ref & _SIZE_MASK
        return self._entries[ref & _HANDLE_MASK][2]

    def find(self, index: int, slot: int) -> int | None:
        """The fallback ref of message ``slot`` of entry ``index``, if the table holds
        one (a scan: for rebuilding a damaged page only)."""
        for handle, (i, k, _size) in self._entries.items():
            if i == index and k == slot:
                return fallback_ref(handle)
        return None

    def release(self, ref: int) -> None:
        """Forget a fallback ref whose message left the queue (no-op for compact refs)."""
        if is_fallback(ref):
            del self._entries[fallback_handle(ref)]

    def to_wire(self) -> list[object]:
        return [self._next_handle, [[h, *parts] for h, parts in self._entries.items()]]

    @classmethod
    def from_wire(cls, wire: list[object]) -> FallbackTable:
        table = cls()
        next_handle, rows = wire
        assert isinstance(next_handle, int) and isinstance(rows, list)
        table._next_handle = next_handle
        if rows:
            table._entries = {}
        for row in rows:
            handle, index, slot, size = row
            table._entries[handle] = (index, slot, size)
        return table


SlotRun = tuple[int, int, int]
"""``(index, first slot, count)``: messages ``first .. first + count - 1`` of entry
``index``, one after the other."""


def slot_runs(refs: Iterable[int], table: FallbackTable) -> list[SlotRun]:
    """``refs`` in order as runs of consecutive slots of one entry: what a delivery reads
    (a publish batch is one entry, usually handed out whole or in long stretches), so
    that the reader parses a run's records at once instead of looking up each message."""
    runs: list[SlotRun] = []
    index = slot = first = -1
    place = table.place
    for ref in refs:
        if ref >> 62 == 0b10:  # a slot of a batch of more than 16: the usual case
            i = (ref >> (SLOT_BITS_LONG + SIZE_BITS)) & _INDEX_MASK_LONG
            k = (ref >> SIZE_BITS) & _SLOT_MASK_LONG
        else:
            i, k = place(ref)
        if i == index and k == slot + 1:
            slot = k
            continue
        if index >= 0:
            runs.append((index, first, slot - first + 1))
        index, slot, first = i, k, k
    if index >= 0:
        runs.append((index, first, slot - first + 1))
    return runs


# --- vectorised forms over numpy arrays (hot paths) -------------------------------------


def _one_form(refs: U64) -> int | None:
    """``0`` when every ref is short, ``0b10`` when every ref is long, else ``None``: two
    reductions, so that a uniform array (the usual case) is decoded in one operation."""
    if not len(refs):
        return None
    lo, hi = int(refs.min()) >> 62, int(refs.max()) >> 62
    if hi <= 0b01:
        return 0
    if lo == hi == 0b10:
        return 0b10
    return None


def indexes_of(refs: U64, table: FallbackTable) -> U64:
    """Raft index of each ref."""
    if not len(refs):
        # Most parts of a small queue's state are empty (no delayed, no dead letters, a
        # lane unused): the general decoding below costs ~90 us of array operations on
        # nothing, a queue falling asleep walks several.
        return np.empty(0, dtype=np.uint64)
    form = _one_form(refs)
    if form == 0:
        return refs >> np.uint64(SIZE_BITS + SLOT_BITS_SHORT)
    if form == 0b10:
        out = refs >> np.uint64(SLOT_BITS_LONG + SIZE_BITS)
        out &= np.uint64(_INDEX_MASK_LONG)
        return out
    out = np.empty(refs.shape, dtype=np.uint64)
    short = (refs >> np.uint64(63)) == 0
    out[short] = refs[short] >> np.uint64(SIZE_BITS + SLOT_BITS_SHORT)
    long_ = (refs >> np.uint64(62)) == 0b10
    out[long_] = (refs[long_] >> np.uint64(SLOT_BITS_LONG + SIZE_BITS)) & np.uint64(
        _INDEX_MASK_LONG
    )
    fb = ~(short | long_)
    if fb.any():
        out[fb] = [table.unpack(int(r)).index for r in refs[fb]]
    return out


def indexes_of_parts(parts: Iterable[U64], table: FallbackTable) -> BitMap64:
    """The Raft indexes of the refs in ``parts``, built a part (a page) at a time: no
    array of every ref, which costs more than the set for millions."""
    live = BitMap64()
    for part in parts:
        add_indexes(live, indexes_of(part, table))
    return live


def live_spans(
    ready_spans: Iterable[tuple[int, int]], others: Iterable[U64], table: FallbackTable
) -> tuple[I64, I64]:
    """(first, last) Raft indexes of ranges that hold every live message: one range per
    page of ready refs (``ready_spans``, ``engine.queue.lanes.spans_of``), and one per
    entry of the refs in ``others``."""
    lo: list[int] = []
    hi: list[int] = []
    for first, last in ready_spans:
        lo.append(first)
        hi.append(last)
    parts = [indexes_of(part, table) for part in others if len(part)]
    points = np.unique(np.concatenate(parts)).astype(np.int64) if parts else _NO_INDEXES
    return (
        np.concatenate([np.array(lo, dtype=np.int64), points]),
        np.concatenate([np.array(hi, dtype=np.int64), points]),
    )


def sizes_of(refs: U64, table: FallbackTable) -> U64:
    """Byte size of each ref."""
    form = _one_form(refs)
    if form is not None:
        out = refs >> np.uint64(SLOT_BITS_SHORT) if form == 0 else refs.copy()
        out &= np.uint64(_SIZE_MASK)
        return out
    out = np.empty(refs.shape, dtype=np.uint64)
    short = (refs >> np.uint64(63)) == 0
    out[short] = (refs[short] >> np.uint64(SLOT_BITS_SHORT)) & np.uint64(_SIZE_MASK)
    long_ = (refs >> np.uint64(62)) == 0b10
    out[long_] = refs[long_] & np.uint64(_SIZE_MASK)
    fb = ~(short | long_)
    if fb.any():
        out[fb] = [table.unpack(int(r)).size for r in refs[fb]]
    return out


SMALL_REFS = 64
"""Up to this many refs, ``total_size`` adds them one by one as Python ints: numpy's
reductions cost microseconds each whatever the length, and the wake of a small queue
sums a few refs per lane."""


def total_size(refs: U64, table: FallbackTable) -> int:
    """Sum of the sizes of ``refs``, in one pass of chunks that stay in the CPU cache; a
    masked sum for a chunk whose refs all have the same compact form (the usual case)."""
    if len(refs) <= SMALL_REFS:
        return sum(map(table.size, refs.tolist()))
    total = 0
    step = min(len(refs), 1 << 14)
    work = np.empty(step, dtype=np.uint64)
    for at in range(0, len(refs), step):
        chunk = refs[at : at + step]
        form_lo, form_hi = int(chunk.min()) >> 62, int(chunk.max()) >> 62
        if form_hi <= 0b01:
            shift = SLOT_BITS_SHORT
        elif form_lo == form_hi == 0b10:
            shift = 0
        else:
            total += int(sizes_of(chunk, table).sum())
            continue
        part = work[: len(chunk)]
        np.right_shift(chunk, np.uint64(shift), out=part)
        np.bitwise_and(part, np.uint64(_SIZE_MASK), out=part)
        total += int(part.sum())
    return total


def pack_batch(index: int, sizes: U64, table: FallbackTable) -> U64:
    """Refs of the messages at slots ``0..n-1`` of entry ``index`` (vectorised)."""
    n = len(sizes)
    assert 1 <= n <= SLOTS_PER_ENTRY_MAX
    slots = np.arange(n, dtype=np.uint64)
    small = sizes < np.uint64(SIZE_LIMIT)
    if n <= SLOT_LIMIT_SHORT and index < INDEX_LIMIT_SHORT:
        head = np.uint64(index << (SIZE_BITS + SLOT_BITS_SHORT))
        refs = (head | (sizes << np.uint64(SLOT_BITS_SHORT))) | slots
    elif index < INDEX_LIMIT_LONG:
        head = np.uint64(_TAG_LONG | (index << (SLOT_BITS_LONG + SIZE_BITS)))
        refs = (head | (slots << np.uint64(SIZE_BITS))) | sizes
    else:
        refs = np.zeros(n, dtype=np.uint64)
        small[:] = False
    if not small.all():
        for k in np.flatnonzero(~small).tolist():
            refs[k] = table.pack(index, int(k), int(sizes[k]), n)
    return refs


__all__ = [
    "INDEX_LIMIT_LONG",
    "INDEX_LIMIT_SHORT",
    "SIZE_LIMIT",
    "SLOTS_PER_ENTRY_MAX",
    "SLOT_LIMIT_LONG",
    "SLOT_LIMIT_SHORT",
    "FallbackTable",
    "RefParts",
    "SlotRun",
    "fallback_handle",
    "fallback_ref",
    "indexes_of",
    "indexes_of_parts",
    "is_fallback",
    "live_spans",
    "message_id",
    "message_id_parts",
    "pack_batch",
    "sizes_of",
    "slot_runs",
    "total_size",
    "try_pack",
    "unpack_compact",
]
