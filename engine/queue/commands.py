"""Queue commands as bytes: what the runtime proposes through Raft and the machine applies.

Rule of this module: encoders build bytes, decoders read them back, assert on both sides
of the boundary; no machine state here. Every command starts with a one-byte kind and a
one-byte format version.

The enqueue entry (one Raft entry per publish batch of 1..1024 messages) is laid out so
that the machine reads only a fixed table of per-message records and never touches a
body, and so that the runtime finds message ``k`` in O(1)::

    0   u8  kind = b"E"        1   u8  version = 1
    2   u16 n (messages)       4   n x 32-byte records, then the data area
    record k:  u32 body_len | u32 headers_len | u32 data_offset | u16 dedup_len |
               u8 priority | u8 flags (0) | i64 ttl_ms (-1 = none) | i64 delay_ms (0 = none)
    data of k, at data_offset:  dedup id | headers | body

Headers are opaque bytes to the machine (the runtime encodes them, e.g. as a msgpack
map). A message's *size* is ``body_len + headers_len``; that is what ``max_bytes``,
``bytes_ready`` and the packed reference count.

Receipts-carrying commands (settle, return, discard, extend) carry ``n`` pairs of u64
``(delivery tag, ref)``, read as one numpy array without a Python object per receipt.

A receive that carries the acks of the previous batch is one settle-checkout entry: a
settle command and a checkout command, whole, one after the other, so that the machine
applies them with the very code that applies each alone::

    0   u8  kind = b"A"        1   u8  version = 1
    2   u32 settle_len         6   settle command (settle_len bytes), then checkout command
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from functools import wraps
from typing import Any, ParamSpec, TypeVar, cast

import msgpack
import numpy as np
import numpy.typing as npt

from engine.errors import InvalidRequest
from engine.queue.refs import SLOTS_PER_ENTRY_MAX

FORMAT_VERSION = 1

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
_RECEIPTS_HEAD = struct.Struct("<BBHI")
_EXTEND_HEAD = struct.Struct("<BBHIq")
_CHECKOUT_HEAD = struct.Struct("<BBHqH")
_SIMPLE_HEAD = struct.Struct("<BB")
_SETTLE_CHECKOUT_HEAD = struct.Struct("<BBI")

CONSUMER_ID_BYTES_MAX = 255
_P = ParamSpec("_P")
_R = TypeVar("_R")


def _decoder(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Bytes from the log that do not parse are an ``InvalidRequest``, never a crash."""

    @wraps(fn)
    def decode(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return fn(*args, **kwargs)
        except (struct.error, ValueError, UnicodeDecodeError, IndexError) as e:
            raise InvalidRequest(f"malformed command: {e}") from e

    return decode


DEDUP_ID_BYTES_MAX = 255


class Kind(bytes, Enum):
    ENQUEUE = b"E"
    CHECKOUT = b"C"
    SETTLE = b"S"
    RETURN = b"R"
    DISCARD = b"D"
    EXTEND = b"X"
    PURGE = b"P"
    EXPIRE = b"T"
    POLICY = b"O"
    DEAD_LETTER_CONFIRM = b"K"
    SETTLE_CHECKOUT = b"A"


_KIND_ENQUEUE = Kind.ENQUEUE[0]

# --- enqueue ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NewMessage:
    """One message of a publish batch, as the runtime hands it to ``encode_enqueue``."""

    body: bytes
    headers: bytes = b""
    priority: int = 0
    ttl_ms: int | None = None
    delay_ms: int = 0
    dedup_id: bytes | None = None

    def __post_init__(self) -> None:
        assert 0 <= self.priority <= 255
        assert self.ttl_ms is None or self.ttl_ms >= 0
        assert self.delay_ms >= 0
        assert self.dedup_id is None or 1 <= len(self.dedup_id) <= DEDUP_ID_BYTES_MAX


def encode_enqueue(messages: Sequence[NewMessage | bytes]) -> bytes:
    """One log entry for a publish batch (all or nothing when applied). A message given
    as its body alone (``bytes``) has every other field at its default: most messages
    are published so, and a ``NewMessage`` each cost more than encoding them."""
    n = len(messages)
    assert 1 <= n <= SLOTS_PER_ENTRY_MAX, n
    if n > ENQUEUE_FEW_MAX and set(map(type, messages)) == _BYTES_ONLY:
        return _encode_bodies(cast("Sequence[bytes]", messages))
    records: list[bytes] = []
    data: list[bytes] = []
    offset = _ENQ_HEAD.size + n * RECORD_BYTES
    for m in messages:
        if type(m) is bytes:
            records.append(_RECORD.pack(len(m), 0, offset, 0, 0, 0, -1, 0))
            data.append(m)
            offset += len(m)
            continue
        assert isinstance(m, NewMessage), type(m)
        dedup = m.dedup_id or b""
        records.append(
            _RECORD.pack(
                len(m.body),
                len(m.headers),
                offset,
                len(dedup),
                m.priority,
                0,
                -1 if m.ttl_ms is None else m.ttl_ms,
                m.delay_ms,
            )
        )
        data += (dedup, m.headers, m.body)
        offset += len(dedup) + len(m.headers) + len(m.body)
    assert offset < 1 << 32
    return b"".join([_ENQ_HEAD.pack(Kind.ENQUEUE[0], FORMAT_VERSION, n), *records, *data])


_BYTES_ONLY = {bytes}
_BODY_RECORD = np.frombuffer(_RECORD.pack(0, 0, 0, 0, 0, 0, -1, 0), "<u4")
"""A record of a message that is its body alone, as u32 words: only its body_len (word
0) and data_offset (word 2) differ from one message to the next."""


def _encode_bodies(bodies: Sequence[bytes]) -> bytes:
    """``encode_enqueue`` of messages that are their bodies alone, the record table
    made in one pass of array operations instead of a ``struct.pack`` per message: the
    same bytes (tests/engine/queue/test_commands.py compares them)."""
    n = len(bodies)
    lengths = np.fromiter(map(len, bodies), np.int64, count=n)
    ends = lengths.cumsum()  # the methods: numpy's functions add a Python-level call
    data_at = _ENQ_HEAD.size + n * RECORD_BYTES
    assert data_at + int(ends[-1]) < 1 << 32
    words = np.empty((n, len(_BODY_RECORD)), "<u4")
    words[:] = _BODY_RECORD
    words[:, 0] = lengths
    words[:, 2] = ends - lengths + data_at
    head = _ENQ_HEAD.pack(_KIND_ENQUEUE, FORMAT_VERSION, n)
    return b"".join([head, words.tobytes(), *bodies])


@_decoder
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


@_decoder
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


@_decoder
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
    body_len, headers_len, off, dedup_len, priority, _flags, ttl_ms, delay_ms = _RECORD.unpack_from(
        entry, _ENQ_HEAD.size + slot * RECORD_BYTES
    )
    view = memoryview(entry)
    headers_at = off + dedup_len
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


# --- receipts-carrying commands -----------------------------------------------------


def _encode_receipts(
    kind: Kind, receipts: list[tuple[int, int]], extra: int | None = None
) -> bytes:
    n = len(receipts)
    assert 0 <= n < 1 << 16
    # From the flattened pairs: a third of the cost of converting a list of tuples.
    body = np.fromiter(itertools.chain.from_iterable(receipts), "<u8", count=2 * n).tobytes()
    if extra is None:
        return _RECEIPTS_HEAD.pack(kind[0], FORMAT_VERSION, n, 0) + body
    return _EXTEND_HEAD.pack(kind[0], FORMAT_VERSION, n, 0, extra) + body


def encode_settle(receipts: list[tuple[int, int]]) -> bytes:
    """Ack: each receipt is ``(delivery tag, ref)`` as from ``decode_receipt``."""
    return _encode_receipts(Kind.SETTLE, receipts)


def encode_return(receipts: list[tuple[int, int]]) -> bytes:
    """Nack with requeue: the messages go back to the front of their level."""
    return _encode_receipts(Kind.RETURN, receipts)


def encode_discard(receipts: list[tuple[int, int]]) -> bytes:
    """Nack without requeue: dead-letter with reason ``rejected`` (or drop)."""
    return _encode_receipts(Kind.DISCARD, receipts)


def encode_extend(receipts: list[tuple[int, int]], lease_ms: int) -> bytes:
    """Extend leases to ``now + lease_ms`` (0 = the queue's default)."""
    assert lease_ms >= 0
    return _encode_receipts(Kind.EXTEND, receipts, lease_ms)


@_decoder
def decode_receipts(command: bytes) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64], int]:
    """(tags, refs, lease_ms or 0) of a settle/return/discard/extend command."""
    head = _EXTEND_HEAD if command[0] == Kind.EXTEND[0] else _RECEIPTS_HEAD
    fields = head.unpack_from(command, 0)
    n = fields[2]
    if len(command) != head.size + 16 * n:
        raise InvalidRequest("malformed receipts command")
    pairs = np.frombuffer(command, dtype="<u8", count=2 * n, offset=head.size).reshape(n, 2)
    lease_ms = fields[4] if head is _EXTEND_HEAD else 0
    return pairs[:, 0].astype(np.uint64), pairs[:, 1].astype(np.uint64), int(lease_ms)


RECEIPTS_FEW_MAX = 16
"""Receipts commands of at most this many receipts are decoded with ``struct``."""
_PAIRS = [struct.Struct(f"<{2 * n}Q") for n in range(RECEIPTS_FEW_MAX + 1)]


@_decoder
def decode_receipts_few(command: bytes) -> tuple[list[tuple[int, int]], int] | None:
    """((tag, ref) pairs, lease_ms or 0) of a settle/return/discard/extend command of at
    most ``RECEIPTS_FEW_MAX`` receipts, checked as ``decode_receipts`` checks it; ``None``
    for more receipts."""
    head = _EXTEND_HEAD if command[0] == Kind.EXTEND[0] else _RECEIPTS_HEAD
    fields = head.unpack_from(command, 0)
    n = fields[2]
    if n > RECEIPTS_FEW_MAX:
        return None
    if len(command) != head.size + 16 * n:
        raise InvalidRequest("malformed receipts command")
    flat = _PAIRS[n].unpack_from(command, head.size)
    lease_ms = fields[4] if head is _EXTEND_HEAD else 0
    return list(zip(flat[0::2], flat[1::2], strict=True)), int(lease_ms)


# --- checkout and simple commands ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class Checkout:
    consumer: str
    max_messages: int
    lease_ms: int
    """0 means the queue's ``lease_ms``."""


def encode_checkout(consumer: str, max_messages: int, lease_ms: int = 0) -> bytes:
    raw = consumer.encode("utf-8")
    assert 1 <= len(raw) <= CONSUMER_ID_BYTES_MAX and 1 <= max_messages < 1 << 16
    assert lease_ms >= 0
    return (
        _CHECKOUT_HEAD.pack(Kind.CHECKOUT[0], FORMAT_VERSION, max_messages, lease_ms, len(raw))
        + raw
    )


@_decoder
def decode_checkout(command: bytes) -> Checkout:
    _k, _v, n, lease_ms, clen = _CHECKOUT_HEAD.unpack_from(command, 0)
    raw = command[_CHECKOUT_HEAD.size :]
    if len(raw) != clen or clen == 0:
        raise InvalidRequest("malformed checkout command")
    return Checkout(consumer=raw.decode("utf-8"), max_messages=n, lease_ms=lease_ms)


def encode_settle_checkout(
    receipts: list[tuple[int, int]], consumer: str, max_messages: int, lease_ms: int = 0
) -> bytes:
    """A receive carrying acks: settle ``receipts`` (as ``encode_settle``), then check out
    (as ``encode_checkout``), in one log entry."""
    settle = encode_settle(receipts)
    checkout = encode_checkout(consumer, max_messages, lease_ms)
    head = _SETTLE_CHECKOUT_HEAD.pack(Kind.SETTLE_CHECKOUT[0], FORMAT_VERSION, len(settle))
    return head + settle + checkout


@_decoder
def split_settle_checkout(command: bytes) -> tuple[bytes, bytes]:
    """The settle and the checkout command of a settle-checkout entry, both checked here
    (their kinds, versions and lengths), so that applying the settle part cannot be
    followed by a checkout part that fails to decode."""
    _k, _v, settle_len = _SETTLE_CHECKOUT_HEAD.unpack_from(command, 0)
    start = _SETTLE_CHECKOUT_HEAD.size
    settle, checkout = command[start : start + settle_len], command[start + settle_len :]
    if (
        len(settle) != settle_len
        or settle[:2] != bytes((Kind.SETTLE[0], FORMAT_VERSION))
        or checkout[:2] != bytes((Kind.CHECKOUT[0], FORMAT_VERSION))
    ):
        raise InvalidRequest("malformed settle-checkout command")
    n = _RECEIPTS_HEAD.unpack_from(settle, 0)[2]
    if len(settle) != _RECEIPTS_HEAD.size + 16 * n:
        raise InvalidRequest("malformed settle-checkout command")
    decode_checkout(checkout)
    return settle, checkout


def encode_purge() -> bytes:
    return _SIMPLE_HEAD.pack(Kind.PURGE[0], FORMAT_VERSION)


def encode_expire() -> bytes:
    """The timer command: the leader appends it; its ``now_ms`` drives every expiry."""
    return _SIMPLE_HEAD.pack(Kind.EXPIRE[0], FORMAT_VERSION)


DEAD_LETTER_CONFIRM_REFS_MAX = (1 << 16) - 1
"""A dead-letter confirm names at most this many references (its count is 16 bits)."""


def encode_dead_letter_confirm(refs: list[int]) -> bytes:
    """The target queue holds these dead-lettered messages; the source may forget them."""
    n = len(refs)
    assert n <= DEAD_LETTER_CONFIRM_REFS_MAX
    head = _RECEIPTS_HEAD.pack(Kind.DEAD_LETTER_CONFIRM[0], FORMAT_VERSION, n, 0)
    return head + np.array(refs, dtype="<u8").tobytes()


@_decoder
def decode_dead_letter_confirm(command: bytes) -> npt.NDArray[np.uint64]:
    n = _RECEIPTS_HEAD.unpack_from(command, 0)[2]
    if len(command) != _RECEIPTS_HEAD.size + 8 * n:
        raise InvalidRequest("malformed dead-letter confirm")
    return np.frombuffer(command, dtype="<u8", count=n, offset=_RECEIPTS_HEAD.size).astype(
        np.uint64
    )


# --- policy -------------------------------------------------------------------------

OVERFLOW_REJECT_PUBLISH = "reject-publish"
OVERFLOW_DROP_HEAD = "drop-head"


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """The queue arguments of API.md that the machine enforces. ``None`` = unlimited."""

    max_length: int | None = None
    max_bytes: int | None = None
    overflow: str = OVERFLOW_REJECT_PUBLISH
    delivery_limit: int | None = 20
    dead_letter_queue: str | None = None
    message_ttl_ms: int | None = None
    priorities: int = 1
    lease_ms: int = 30_000
    max_message_bytes: int = 1 << 20

    def check(self, lease_ms_max: int, priorities_max: int, message_bytes_ceiling: int) -> str:
        """Why this policy is invalid, or ``""``."""
        if self.overflow not in (OVERFLOW_REJECT_PUBLISH, OVERFLOW_DROP_HEAD):
            return f"overflow must be {OVERFLOW_REJECT_PUBLISH} or {OVERFLOW_DROP_HEAD}"
        for name in ("max_length", "max_bytes", "message_ttl_ms"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                return f"{name} must be a non-negative integer or null"
        if self.delivery_limit is not None and (
            not isinstance(self.delivery_limit, int) or self.delivery_limit < 1
        ):
            return "delivery_limit must be at least 1 or null"
        if not isinstance(self.priorities, int) or not 1 <= self.priorities <= priorities_max:
            return f"priorities must be 1..{priorities_max}"
        if not isinstance(self.lease_ms, int) or not 1 <= self.lease_ms <= lease_ms_max:
            return f"lease_ms must be 1..{lease_ms_max}"
        if (
            not isinstance(self.max_message_bytes, int)
            or not 1 <= self.max_message_bytes <= message_bytes_ceiling
        ):
            return f"max_message_bytes must be 1..{message_bytes_ceiling}"
        dlq = self.dead_letter_queue
        if dlq is not None and (not isinstance(dlq, str) or not dlq):
            return "dead_letter_queue must be a queue name or null"
        return ""

    def to_wire(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in POLICY_FIELDS}


POLICY_FIELDS = (
    "max_length",
    "max_bytes",
    "overflow",
    "delivery_limit",
    "dead_letter_queue",
    "message_ttl_ms",
    "priorities",
    "lease_ms",
    "max_message_bytes",
)


def encode_policy(changes: dict[str, object]) -> bytes:
    """Change some policy fields (``None`` clears a limit); unknown names are rejected."""
    unknown = sorted(set(changes) - set(POLICY_FIELDS))
    assert not unknown, unknown
    ordered = {name: changes[name] for name in POLICY_FIELDS if name in changes}
    return _SIMPLE_HEAD.pack(Kind.POLICY[0], FORMAT_VERSION) + bytes(msgpack.packb(ordered))


def decode_policy(command: bytes) -> dict[str, object]:
    try:
        changes = msgpack.unpackb(command[_SIMPLE_HEAD.size :], strict_map_key=True)
    except Exception as e:  # msgpack raises several kinds on garbage
        raise InvalidRequest("malformed policy command") from e
    if not isinstance(changes, dict) or not set(changes) <= set(POLICY_FIELDS):
        raise InvalidRequest("malformed policy command")
    return {name: changes[name] for name in POLICY_FIELDS if name in changes}


@_decoder
def command_kind(command: bytes) -> Kind:
    if len(command) < 2 or command[1] != FORMAT_VERSION:
        raise InvalidRequest("unknown command format")
    try:
        return Kind(command[:1])
    except ValueError as e:
        raise InvalidRequest("unknown command kind") from e


__all__ = [
    "ENQUEUE_BODIES_MIN",
    "ENQUEUE_FEW_MAX",
    "OVERFLOW_DROP_HEAD",
    "OVERFLOW_REJECT_PUBLISH",
    "POLICY_FIELDS",
    "RECEIPTS_FEW_MAX",
    "RECORD_DTYPE",
    "Checkout",
    "Kind",
    "MessageView",
    "NewMessage",
    "QueuePolicy",
    "Record",
    "command_kind",
    "decode_checkout",
    "decode_dead_letter_confirm",
    "decode_policy",
    "decode_receipts",
    "decode_receipts_few",
    "encode_checkout",
    "encode_dead_letter_confirm",
    "encode_discard",
    "encode_enqueue",
    "encode_expire",
    "encode_extend",
    "encode_policy",
    "encode_purge",
    "encode_return",
    "encode_settle",
    "encode_settle_checkout",
    "enqueue_count",
    "enqueue_records",
    "enqueue_records_few",
    "message_run",
    "read_message",
    "split_settle_checkout",
]
