"""The enqueue command as bytes: a publish batch, one Raft entry, and the reads of it
that the machine (``engine.queue.enqueue``) and the runtime (deliveries) make.

Rule of this module: as ``engine.queue.commands``, encoders build bytes and decoders
read them back, asserting on both sides of the boundary, no machine state. The entry
(1..``SLOTS_PER_ENTRY_MAX`` messages) is laid out so that the machine reads only a fixed
table of per-message records and never touches a body, and so that the runtime finds
message ``k`` in O(1)::

    0   u8  kind = b"E"        1   u8  version = 1
    2   u16 n (messages)       4   n x 32-byte records, then the data area
    record k:  u32 body_len | u32 headers_len | u32 data_offset | u16 dedup_len |
               u8 priority | u8 flags (0) | i64 ttl_ms (-1 = none) | i64 delay_ms (0 = none)
    data of k, at data_offset:  dedup id | headers | body

A record whose flags hold ``FLAG_FRAME`` heads a *frame*: its dedup id is the id of
itself and the ``count - 1`` messages after it (which carry no dedup id and no flag), the
frame deduplicated as one (``engine.queue.enqueue``), and its dedup id area is ``u16
count`` then the id (``dedup_len`` = 2 + the id's length). Readers of a message's body
skip ``dedup_len`` bytes either way, so entries without frames are as they were.

Headers are opaque bytes to the machine (the runtime encodes them, e.g. as a msgpack
map). A message's *size* is ``body_len + headers_len``; that is what ``max_bytes``,
``bytes_ready`` and the packed reference count.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias, cast

import numpy as np
import numpy.typing as npt

from engine.errors import InvalidRequest
from engine.queue.commands import FORMAT_VERSION, Kind, decoder
from engine.queue.refs import SLOTS_PER_ENTRY_MAX

RECORD_DTYPE = np.dtype(
    [
        ("body_len", "<u4"),
        ("headers_len", "<u4"),
        ("data_offset", "<u4"),
        ("dedup_len", "<u2"),
        ("priority", "u1"),
        ("flags", "u1"),
        ("ttl_ms", "<i8"),
        ("delay_ms", "<i8"),
    ]
)
RECORD_BYTES = 32
assert RECORD_DTYPE.itemsize == RECORD_BYTES
_RECORD = struct.Struct("<IIIHBBqq")
assert _RECORD.size == RECORD_BYTES
_ENQ_HEAD = struct.Struct("<BBH")

DEDUP_ID_BYTES_MAX = 255
FLAG_FRAME = 1
"""A record's flag: it heads a frame (see above)."""
_FRAME_COUNT = struct.Struct("<H")
_KIND_ENQUEUE = Kind.ENQUEUE[0]


@dataclass(frozen=True, slots=True)
class NewMessage:
    """One message of a publish batch, as the runtime hands it to ``encode_enqueue``."""

    body: bytes
    headers: bytes = b""
    priority: int = 0
    ttl_ms: int | None = None
    delay_ms: int = 0
    dedup_id: bytes | None = None
    frame_count: int = 0
    """Above 0: ``dedup_id`` is the id of a frame of this message and the next
    ``frame_count - 1`` of the batch (which carry no dedup id), deduplicated as one."""

    def __post_init__(self) -> None:
        assert 0 <= self.priority <= 255
        assert self.ttl_ms is None or self.ttl_ms >= 0
        assert self.delay_ms >= 0
        assert self.dedup_id is None or 1 <= len(self.dedup_id) <= DEDUP_ID_BYTES_MAX
        assert 0 <= self.frame_count <= SLOTS_PER_ENTRY_MAX
        assert not self.frame_count or self.dedup_id is not None

    def dedup_area(self) -> bytes:
        """The bytes of its dedup id area in an entry (a frame's count, then its id)."""
        dedup = self.dedup_id or b""
        return _FRAME_COUNT.pack(self.frame_count) + dedup if self.frame_count else dedup

    def frame_head_alone(self) -> bool:
        """Whether it heads a frame and has its body and that id alone."""
        return (
            self.frame_count > 0
            and not self.headers
            and self.priority == 0
            and self.ttl_ms is None
            and self.delay_ms == 0
        )


KeyedBody: TypeAlias = tuple[bytes, bytes]
"""A message given as its dedup id (1..``DEDUP_ID_BYTES_MAX`` bytes) and its body, in
that order (the order of its bytes in the entry), every other field at its default: how
batch writers publish (the Spark connector gives each row an id, so that a retried task
publishes nothing twice), encoded without a ``NewMessage`` each."""


def encode_enqueue(messages: Sequence[NewMessage | bytes | KeyedBody]) -> bytes:
    """One log entry for a publish batch (all or nothing when applied). A message given
    as its body alone (``bytes``) has every other field at its default: most messages
    are published so, and a ``NewMessage`` each cost more than encoding them."""
    n = len(messages)
    assert 1 <= n <= SLOTS_PER_ENTRY_MAX, n
    if n > ENQUEUE_FEW_MAX:
        kinds = set(map(type, messages))
        if kinds == _BYTES_ONLY:
            return _encode_bodies(cast("Sequence[bytes]", messages))
        if kinds == _KEYED_ONLY:
            return _encode_keyed(cast("Sequence[KeyedBody]", messages))
        if kinds == _FRAMED_BODIES and all(
            type(m) is bytes or cast("NewMessage", m).frame_head_alone() for m in messages
        ):
            return _encode_framed(cast("Sequence[bytes | NewMessage]", messages))
    records: list[bytes] = []
    data: list[bytes] = []
    offset = _ENQ_HEAD.size + n * RECORD_BYTES
    for m in messages:
        if type(m) is bytes:
            records.append(_RECORD.pack(len(m), 0, offset, 0, 0, 0, -1, 0))
            data.append(m)
            offset += len(m)
            continue
        if type(m) is tuple:
            dedup, body = m
            assert 1 <= len(dedup) <= DEDUP_ID_BYTES_MAX
            records.append(_RECORD.pack(len(body), 0, offset, len(dedup), 0, 0, -1, 0))
            data += m
            offset += len(dedup) + len(body)
            continue
        assert isinstance(m, NewMessage), type(m)
        dedup = m.dedup_area()
        records.append(
            _RECORD.pack(
                len(m.body),
                len(m.headers),
                offset,
                len(dedup),
                m.priority,
                FLAG_FRAME if m.frame_count else 0,
                -1 if m.ttl_ms is None else m.ttl_ms,
                m.delay_ms,
            )
        )
        data += (dedup, m.headers, m.body)
        offset += len(dedup) + len(m.headers) + len(m.body)
    assert offset < 1 << 32
    return b"".join([_ENQ_HEAD.pack(Kind.ENQUEUE[0], FORMAT_VERSION, n), *records, *data])


def enqueue_bytes(messages: Sequence[NewMessage | bytes | KeyedBody]) -> int:
    """The length of ``encode_enqueue(messages)``, without encoding them."""
    total = _ENQ_HEAD.size + len(messages) * RECORD_BYTES
    for m in messages:
        if type(m) is bytes:
            total += len(m)
        elif type(m) is tuple:
            total += len(m[0]) + len(m[1])
        else:
            assert isinstance(m, NewMessage), type(m)
            total += len(m.dedup_area()) + len(m.headers) + len(m.body)
    return total


_BYTES_ONLY = {bytes}
_KEYED_ONLY = {tuple}
_FRAMED_BODIES = {bytes, NewMessage}
_BODY_RECORD = np.frombuffer(_RECORD.pack(0, 0, 0, 0, 0, 0, -1, 0), "<u4")
"""A record of a message that is its body alone, as u32 words: only its body_len (word
0) and data_offset (word 2) differ from one message to the next."""


def _encode_bodies(bodies: Sequence[bytes]) -> bytes:
    """``encode_enqueue`` of messages that are their bodies alone, the record table
    made in one pass of array operations instead of a ``struct.pack`` per message: the
    same bytes (tests/engine/queue/test_commands.py compares them)."""
    lengths = np.fromiter(map(len, bodies), np.int64, count=len(bodies))
    return b"".join([_head_and_table(lengths, None), *bodies])


def _encode_keyed(messages: Sequence[KeyedBody]) -> bytes:
    """``_encode_bodies`` for messages given as their dedup ids and bodies: each
    message's data is its id, then its body."""
    n = len(messages)
    dedup_lens = np.fromiter([len(d) for d, _b in messages], np.int64, count=n)
    body_lens = np.fromiter([len(b) for _d, b in messages], np.int64, count=n)
    assert int(dedup_lens.min()) >= 1 and int(dedup_lens.max()) <= DEDUP_ID_BYTES_MAX
    table = _head_and_table(body_lens, dedup_lens)
    return b"".join([table, *itertools.chain.from_iterable(messages)])


def _encode_framed(messages: Sequence[bytes | NewMessage]) -> bytes:
    """``_encode_bodies`` for bodies some of which head a frame (``frame_head_alone``):
    a head's data is its dedup id area, then its body."""
    n = len(messages)
    body_lens = np.fromiter(
        [len(m) if type(m) is bytes else len(cast("NewMessage", m).body) for m in messages],
        np.int64,
        count=n,
    )
    heads = [k for k, m in enumerate(messages) if type(m) is not bytes]
    areas = [cast("NewMessage", messages[k]).dedup_area() for k in heads]
    dedup_lens = np.zeros(n, np.int64)
    dedup_lens[heads] = [len(a) for a in areas]
    flags = np.zeros(n, np.int64)
    flags[heads] = FLAG_FRAME
    table = _head_and_table(body_lens, dedup_lens, flags)
    data: list[bytes] = []
    at = 0
    for k, area in zip(heads, areas, strict=True):
        data += cast("Sequence[bytes]", messages[at:k])
        data += (area, cast("NewMessage", messages[k]).body)
        at = k + 1
    data += cast("Sequence[bytes]", messages[at:])
    return b"".join([table, *data])


def _head_and_table(
    body_lens: npt.NDArray[Any],
    dedup_lens: npt.NDArray[Any] | None,
    flags: npt.NDArray[Any] | None = None,
) -> bytes:
    """The entry's head and record table for messages of these body (and dedup id)
    lengths, every other field at its default: word 0 of a record is its body's length,
    word 2 its data's offset, word 3 its dedup id's length (priority and flags, the
    word's upper bytes, are 0 but for ``flags``)."""
    n = len(body_lens)
    sizes = body_lens if dedup_lens is None else dedup_lens + body_lens
    ends = sizes.cumsum()  # the methods: numpy's functions add a Python-level call
    data_at = _ENQ_HEAD.size + n * RECORD_BYTES
    assert data_at + int(ends[-1]) < 1 << 32
    words = np.empty((n, len(_BODY_RECORD)), "<u4")
    words[:] = _BODY_RECORD
    words[:, 0] = body_lens
    words[:, 2] = ends - sizes + data_at
    if dedup_lens is not None:
        words[:, 3] = dedup_lens if flags is None else dedup_lens | (flags << 24)
    return _ENQ_HEAD.pack(_KIND_ENQUEUE, FORMAT_VERSION, n) + words.tobytes()


@decoder
def enqueue_records(command: bytes) -> npt.NDArray[Any]:
    """The record table of an enqueue entry as a numpy structured array (no copy)."""
    kind, version, n = _ENQ_HEAD.unpack_from(command, 0)
    assert kind == Kind.ENQUEUE[0] and version == FORMAT_VERSION
    if not 1 <= n <= SLOTS_PER_ENTRY_MAX or len(command) < _ENQ_HEAD.size + n * RECORD_BYTES:
        raise InvalidRequest("malformed enqueue entry")
    recs = np.frombuffer(command, dtype=RECORD_DTYPE, count=n, offset=_ENQ_HEAD.size)
    ends = (
        recs["data_offset"].astype(np.int64)
        + recs["dedup_len"]
        + recs["headers_len"]
        + recs["body_len"]
    )
    if int(ends.max()) > len(command):
        raise InvalidRequest("malformed enqueue entry")
    return recs


ENQUEUE_FEW_MAX = 16
"""Entries of at most this many messages are decoded with ``struct`` into tuples: for so
few records numpy's fixed cost per call is larger than the work."""

ENQUEUE_BODIES_MIN = ENQUEUE_FEW_MAX + 1
"""Entries of at least this many messages, all of them bodies alone, are read by
``enqueue_body_sizes`` (set past ``SLOTS_PER_ENTRY_MAX`` to read them all as records)."""
_BODY_FIXED_WORDS = np.array([1, 3, 4, 5, 6, 7])
"""The words of ``_BODY_RECORD`` that every message that is its body alone has."""


@decoder
def enqueue_body_sizes(command: bytes) -> npt.NDArray[np.uint64] | None:
    """The body sizes of an enqueue entry of at least ``ENQUEUE_BODIES_MIN`` messages
    that are all their bodies alone (every other field at its default: what a publish of
    plain bodies gives), checked as ``enqueue_records`` checks them, in a few array
    operations on the record table read as words; ``None`` for any other entry."""
    kind, version, n = _ENQ_HEAD.unpack_from(command, 0)
    assert kind == _KIND_ENQUEUE and version == FORMAT_VERSION
    if not ENQUEUE_BODIES_MIN <= n <= SLOTS_PER_ENTRY_MAX:
        return None
    if len(command) < _ENQ_HEAD.size + n * RECORD_BYTES:
        raise InvalidRequest("malformed enqueue entry")
    words = np.frombuffer(command, "<u4", count=n * len(_BODY_RECORD), offset=_ENQ_HEAD.size)
    words = words.reshape(n, len(_BODY_RECORD))
    if not (words[:, _BODY_FIXED_WORDS] == _BODY_RECORD[_BODY_FIXED_WORDS]).all():
        return None
    sizes = words[:, 0].astype(np.uint64)
    if int((sizes + words[:, 2]).max()) > len(command):
        raise InvalidRequest("malformed enqueue entry")
    return sizes


Record = tuple[int, int, int, int, int, int, int, int]
"""One record as ``_RECORD`` reads it: (body_len, headers_len, data_offset, dedup_len,
priority, flags, ttl_ms, delay_ms)."""


@decoder
def enqueue_records_few(command: bytes) -> list[Record] | None:
    """The records of an enqueue entry of at most ``ENQUEUE_FEW_MAX`` messages as tuples,
    checked exactly as ``enqueue_records`` checks them; ``None`` for a larger batch."""
    kind, version, n = _ENQ_HEAD.unpack_from(command, 0)
    if n > ENQUEUE_FEW_MAX:
        return None
    assert kind == _KIND_ENQUEUE and version == FORMAT_VERSION
    end = len(command)
    if n == 1 and end >= _ENQ_HEAD.size + RECORD_BYTES:
        record = _RECORD.unpack_from(command, _ENQ_HEAD.size)
        if record[2] + record[3] + record[1] + record[0] > end:
            raise InvalidRequest("malformed enqueue entry")
        return [record]
    if n < 1 or end < _ENQ_HEAD.size + n * RECORD_BYTES:
        raise InvalidRequest("malformed enqueue entry")
    table = memoryview(command)[_ENQ_HEAD.size : _ENQ_HEAD.size + n * RECORD_BYTES]
    records: list[Record] = list(_RECORD.iter_unpack(table))
    for record in records:
        if record[2] + record[3] + record[1] + record[0] > end:
            raise InvalidRequest("malformed enqueue entry")
    return records


def enqueue_count(entry: bytes) -> int:
    return int(_ENQ_HEAD.unpack_from(entry, 0)[2])


@dataclass(frozen=True, slots=True)
class MessageView:
    """Message ``slot`` of an enqueue entry; ``body`` and ``headers`` are views, not copies."""

    body: memoryview
    headers: memoryview
    priority: int
    ttl_ms: int | None
    delay_ms: int
    dedup_id: bytes | None


def read_message(entry: bytes, slot: int) -> MessageView:
    """What the runtime calls for each delivered ref: O(1), one record parse."""
    n = enqueue_count(entry)
    assert entry[0] == Kind.ENQUEUE[0] and 0 <= slot < n, (slot, n)
    body_len, headers_len, off, dedup_len, priority, flags, ttl_ms, delay_ms = _RECORD.unpack_from(
        entry, _ENQ_HEAD.size + slot * RECORD_BYTES
    )
    view = memoryview(entry)
    headers_at = off + dedup_len
    if flags & FLAG_FRAME:  # the frame's id stands for the message's
        off += _FRAME_COUNT.size
    body_at = headers_at + headers_len
    assert body_at + body_len <= len(entry)
    return MessageView(
        body=view[body_at : body_at + body_len],
        headers=view[headers_at:body_at],
        priority=priority,
        ttl_ms=None if ttl_ms < 0 else ttl_ms,
        delay_ms=delay_ms,
        dedup_id=bytes(view[off:headers_at]) if dedup_len else None,
    )


def message_run(entry: bytes, first: int, count: int) -> tuple[list[bytes], list[bytes] | None]:
    """(bodies, headers) of messages ``first .. first + count - 1`` of an enqueue entry
    as bytes, what a receive hands out: the run's records parsed at once, no object per
    message in between; headers ``None`` when none of them has any (the usual case)."""
    size = len(entry)
    assert entry[0] == _KIND_ENQUEUE and first >= 0 and count >= 1
    assert first + count <= enqueue_count(entry)
    at = _ENQ_HEAD.size + first * RECORD_BYTES
    records = list(_RECORD.iter_unpack(memoryview(entry)[at : at + count * RECORD_BYTES]))
    bodies: list[bytes] = []
    headers_bytes = 0
    for body_len, headers_len, off, dedup_len, _p, _f, _t, _d in records:
        body_at = off + dedup_len + headers_len
        end = body_at + body_len
        if end > size:
            raise AssertionError(f"a record of entry slot {first} points past its end")
        bodies.append(entry[body_at:end])
        headers_bytes |= headers_len
    if not headers_bytes:
        return bodies, None
    return bodies, [entry[r[2] + r[3] : r[2] + r[3] + r[1]] for r in records]


def dedup_id_at(entry: bytes, record: Any) -> bytes:
    off = int(record["data_offset"])
    return bytes(entry[off : off + int(record["dedup_len"])])


Frame = tuple[int, int, bytes]
"""A frame of an enqueue entry: its first slot, its message count and its dedup id."""


@decoder
def frames_at(
    command: bytes, heads: list[tuple[int, int, int]], flags: list[int], dedup_lens: list[int]
) -> list[Frame]:
    """The frames of an entry whose records ``heads`` (slot, data offset, dedup length)
    carry ``FLAG_FRAME``; ``flags`` and ``dedup_lens`` are every record's. A frame past
    the entry's end, over a message with a dedup id or flag of its own, or with another
    flag is malformed (``InvalidRequest``)."""
    n = len(flags)
    frames: list[Frame] = []
    for k, off, dedup_len in heads:
        (count,) = _FRAME_COUNT.unpack_from(command, off)
        if (
            flags[k] != FLAG_FRAME
            or dedup_len <= _FRAME_COUNT.size
            or not 1 <= count <= n - k
            or any(flags[k + 1 : k + count])
            or any(dedup_lens[k + 1 : k + count])
        ):
            raise InvalidRequest("malformed enqueue entry: a bad frame")
        frames.append((k, count, bytes(command[off + _FRAME_COUNT.size : off + dedup_len])))
    return frames


__all__ = [
    "DEDUP_ID_BYTES_MAX",
    "ENQUEUE_BODIES_MIN",
    "ENQUEUE_FEW_MAX",
    "FLAG_FRAME",
    "RECORD_BYTES",
    "RECORD_DTYPE",
    "Frame",
    "KeyedBody",
    "MessageView",
    "NewMessage",
    "Record",
    "dedup_id_at",
    "encode_enqueue",
    "enqueue_body_sizes",
    "enqueue_count",
    "enqueue_records",
    "enqueue_records_few",
    "frames_at",
    "message_run",
    "read_message",
]
