"""The queue machine's snapshot: its fields by name, writing it, and reading it without
copying its ref arrays.

Rule of this module: the format is one msgpack array with the fields of
``SnapshotState`` in that order (a NamedTuple packs as an array, so naming the fields
changes no byte); checkpoints on disk are read back, so a change of it is a new
``QueueMachine.version`` that still reads the old ones.

Almost all of a deep queue's snapshot is the ready lanes, one msgpack ``bin`` of packed
refs each (8 bytes per message), unless the pages are in a page store
(``engine.queue.paging``): a checkpoint (``FrozenMachine.encode``) then names each page
that has a stored copy instead of copying it, as a third element of its lane, a ``bin``
holding the msgpack list of ``[position among the lane's refs, *SpilledPage.to_wire()]``;
such a snapshot is format 3 (``PAGED_VERSION``), read back only by a machine given the
same page store. ``QueueMachine.snapshot`` and ``FrozenMachine.encode_inline`` always
hold every ref (format 2, what replicas compare and a follower is sent);
``inline_snapshot`` turns a format 3 snapshot into that. ``msgpack.unpackb`` copies each ``bin`` into a new
``bytes`` object, and at millions of messages the fresh memory costs more than the rest
of recovery. So the lanes are found by hand and returned as read-only numpy views into
the snapshot; the small elements before them and everything after them go through
msgpack as usual. Anything unexpected falls back to ``msgpack.unpackb`` of the whole.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import crc32c
import msgpack
import numpy as np
import numpy.typing as npt
from pyroaring import BitMap64

from engine.errors import PageDamaged
from engine.queue.lanes import index_set_of
from engine.queue.pages import FrozenRefs, SpilledPage, decode_page, hot
from engine.queue.refs import FallbackTable

U64 = npt.NDArray[np.uint64]
PAGED_VERSION = 3
"""The format of a snapshot whose lanes name pages in a page store."""


class MachineClock(NamedTuple):
    now_ms: int
    last_index: int
    dead_bytes: int
    delayed_seq: int


class SnapshotState(NamedTuple):
    """The snapshot's top-level array, field by field (each in its wire form)."""

    version: int
    policy: dict[str, Any]
    clock: Sequence[int]
    """A ``MachineClock`` (read back as a plain list)."""
    counters: list[int]
    """In the order of ``engine.queue.stats.COUNTERS``."""
    lanes: list[Any]
    """``[head_pos, refs]`` or ``[head_pos, refs, spilled]`` per lane, in delivery order
    (``engine.queue.lanes``): refs are bytes when written, a read-only uint64 array when
    read; read back, a lane is always ``[head_pos, refs, [(position, SpilledPage)...]]``."""
    fallback: list[Any]
    pending: list[Any]
    delivered_before: list[Any]
    """``[ref, deliveries]`` pairs."""
    expires_at: list[Any]
    """``[ref, ms]`` pairs."""
    delayed: list[Any]
    """The delayed heap, ``[due_ms, seq, ref, level]`` items in heap order."""
    dead_letters: list[Any]
    dedup: list[Any]
    enqueue_times: list[Any]
    """Format 2: ``EnqueueTimes.to_wire``; format 1: two arrays of one-second samples."""


LANES_AT = SnapshotState._fields.index("lanes")
"""Position of the lanes in the snapshot's top-level array."""
_PREFIX_BYTES_MAX = 1 << 16
"""The elements before the lanes (version, policy, clock, counters) fit in this."""
_UNPACK = {"raw": False, "strict_map_key": False, "use_list": True}
SMALL_SNAPSHOT_BYTES = 4096
"""Up to this size ``read_snapshot`` unpacks the snapshot whole and copies its lanes
(a few refs): reading it piece by piece to keep views is for deep lanes, and costs a
small queue's wake twice the time of one ``unpackb``."""
_U8, _U16, _U32, _U64 = (struct.Struct(f">{c}") for c in "BHIQ")
_UINT = {0xCC: _U8, 0xCD: _U16, 0xCE: _U32, 0xCF: _U64}
_BIN_LEN = {0xC4: _U8, 0xC5: _U16, 0xC6: _U32}


class FrozenMachine:
    """A ``QueueMachine``'s state at one index (``QueueMachine.freeze``). It shares no
    mutable state with the machine, so ``encode`` and ``live_indexes`` may run on another
    thread while the machine applies later entries."""

    __slots__ = ("_lanes", "_others", "_state")

    def __init__(
        self, lanes: tuple[FrozenRefs, ...], state: SnapshotState, others: tuple[U64, ...]
    ) -> None:
        self._lanes = lanes
        self._state = state
        self._others = others

    def encode(self) -> bytes:
        """The snapshot bytes for a checkpoint (``QueueMachine.restore`` reads them): pages
        with a stored copy are named, not copied (format 3; ``page_handles`` lists them,
        the store must keep them while the checkpoint exists). Without such pages, the
        same bytes as ``encode_inline``. Reads nothing from the page store."""
        lanes = [_lane_wire(lane) for lane in self._lanes]
        state = self._state._replace(lanes=lanes)
        if any(len(lane) == 3 for lane in lanes):
            state = state._replace(version=PAGED_VERSION)
        return bytes(msgpack.packb(state, use_bin_type=True))

    def encode_inline(self) -> bytes:
        """The snapshot with every ref in it (format 2): what replicas compare and a
        follower is sent. Reads the pages that are out from the page store."""
        lanes = [[lane.head_pos, lane.to_array().tobytes()] for lane in self._lanes]
        return bytes(msgpack.packb(self._state._replace(lanes=lanes), use_bin_type=True))

    def page_handles(self) -> list[int]:
        """The stored pages ``encode`` names."""
        return [
            part.handle
            for lane in self._lanes
            for part in lane.parts()
            if isinstance(part, SpilledPage)
        ]

    def live_indexes(self) -> BitMap64:
        """``QueueMachine.live_indexes`` as of the freeze (nothing read from the store)."""
        table = FallbackTable.from_wire(self._state.fallback)
        return index_set_of(self._lanes, self._others, table)


def _lane_wire(lane: FrozenRefs) -> list[object]:
    """A lane as ``FrozenMachine.encode`` writes it: its refs held only in memory, and its
    stored pages by name if it has any."""
    spilled: list[list[object]] = []
    at = 0

    def inline() -> Iterator[U64]:
        nonlocal at
        for part in lane.parts():
            if isinstance(part, SpilledPage):
                spilled.append([at, *part.to_wire()])
                at += part.count
            else:
                at += len(part)
                yield part

    # The expanded pages are let go before the copy to bytes (peak memory, and time).
    array = np.concatenate(list(inline()) or [np.empty(0, dtype=np.uint64)])
    refs = array.tobytes()
    del array
    if spilled:
        return [lane.head_pos, refs, msgpack.packb(spilled, use_bin_type=True)]
    return [lane.head_pos, refs]


class _Unexpected(Exception):
    pass


def read_snapshot(data: bytes, whole_max: int = SMALL_SNAPSHOT_BYTES) -> SnapshotState:
    """The snapshot's fields, with ``lanes`` as a list of ``[head_pos, refs]`` where
    ``refs`` is a read-only uint64 array (a view into ``data`` where possible, for a
    snapshot larger than ``whole_max``)."""
    if len(data) > whole_max:
        try:
            return SnapshotState(*_read_with_views(data))
        except (_Unexpected, msgpack.OutOfData, ValueError, struct.error, IndexError):
            pass
    state: list[Any] = msgpack.unpackb(data, **_UNPACK)
    lanes = state[LANES_AT]
    assert isinstance(lanes, list)
    state[LANES_AT] = [
        [lane[0], np.frombuffer(lane[1], dtype=np.uint64), _spilled(lane[2:])] for lane in lanes
    ]
    return SnapshotState(*state)


def _spilled(wire: list[Any]) -> list[tuple[int, SpilledPage]]:
    """The third element of a lane, if any, as (position, page) pairs."""
    if not wire:
        return []
    rows = msgpack.unpackb(wire[0], **_UNPACK)
    return [(int(row[0]), SpilledPage.from_wire(row[1:])) for row in rows]


def page_handles_of(data: bytes) -> list[int]:
    """The stored pages a snapshot names (none unless it is format 3): what the page
    store keeps for the machine restored from it (``PageFiles(..., live=...)``)."""
    return page_handles(read_snapshot(data))


def page_handles(state: SnapshotState) -> list[int]:
    """``page_handles_of`` the snapshot ``read_snapshot`` gave ``state``."""
    return [page.handle for _head, _refs, spilled in state.lanes for _at, page in spilled]


def inline_snapshot(data: bytes, load: Callable[[int], bytes]) -> bytes:
    """A format 3 snapshot (``FrozenMachine.encode``) as a format 2 one: every named page
    read with ``load`` (checked against its CRC32C: ``PageDamaged``) and put in its lane.
    Another snapshot is returned as it is. What a follower is sent from a checkpoint."""
    state = read_snapshot(data)
    if state.version != PAGED_VERSION:
        return data
    lanes: list[list[object]] = []
    for head_pos, refs, spilled in state.lanes:
        parts: list[U64] = []
        taken = done = 0
        for at, page in spilled:
            parts.append(refs[taken : taken + at - done])
            taken += at - done
            stored = load(page.handle)
            if crc32c.crc32c(stored) != page.crc:
                raise PageDamaged(f"page {page.handle} fails its CRC32C check", handle=page.handle)
            parts.append(hot(decode_page(stored)))
            done = at + page.count
        parts.append(refs[taken:])
        lanes.append([head_pos, b"".join(part.tobytes() for part in parts)])
    return bytes(msgpack.packb(state._replace(version=2, lanes=lanes), use_bin_type=True))


def _read_with_views(data: bytes) -> list[Any]:
    head = msgpack.Unpacker(**_UNPACK)
    head.feed(memoryview(data)[:_PREFIX_BYTES_MAX])
    size = head.read_array_header()
    if size <= LANES_AT:
        raise _Unexpected
    state: list[Any] = [head.unpack() for _ in range(LANES_AT)]
    pos = head.tell()
    count, pos = _array_header(data, pos)
    lanes: list[list[object]] = []
    for _ in range(count):
        fields, pos = _array_header(data, pos)
        if fields not in (2, 3):
            raise _Unexpected
        head_pos, pos = _uint(data, pos)
        length, pos = _bin_header(data, pos)
        if length % 8 or pos + length > len(data):
            raise _Unexpected
        refs = np.frombuffer(data, dtype=np.uint64, count=length // 8, offset=pos)
        pos += length
        spilled: list[Any] = []
        if fields == 3:
            length, pos = _bin_header(data, pos)
            if pos + length > len(data):
                raise _Unexpected
            spilled.append(bytes(memoryview(data)[pos : pos + length]))
            pos += length
        lanes.append([head_pos, refs, _spilled(spilled)])
    state.append(lanes)
    tail = msgpack.Unpacker(**_UNPACK, max_buffer_size=max(1, len(data) - pos))
    tail.feed(memoryview(data)[pos:])
    state += [tail.unpack() for _ in range(size - LANES_AT - 1)]
    if tail.tell() != len(data) - pos:
        raise _Unexpected
    return state


def _array_header(data: bytes, pos: int) -> tuple[int, int]:
    marker = data[pos]
    if 0x90 <= marker <= 0x9F:
        return marker & 0x0F, pos + 1
    if marker == 0xDC:
        return _U16.unpack_from(data, pos + 1)[0], pos + 3
    raise _Unexpected


def _uint(data: bytes, pos: int) -> tuple[int, int]:
    marker = data[pos]
    if marker <= 0x7F:
        return marker, pos + 1
    form = _UINT.get(marker)
    if form is None:
        raise _Unexpected
    return form.unpack_from(data, pos + 1)[0], pos + 1 + form.size


def _bin_header(data: bytes, pos: int) -> tuple[int, int]:
    form = _BIN_LEN.get(data[pos])
    if form is None:
        raise _Unexpected
    return form.unpack_from(data, pos + 1)[0], pos + 1 + form.size


__all__ = [
    "LANES_AT",
    "PAGED_VERSION",
    "FrozenMachine",
    "MachineClock",
    "SnapshotState",
    "inline_snapshot",
    "page_handles",
    "page_handles_of",
    "read_snapshot",
]
