"""Queue commands as bytes: what the runtime proposes through Raft and the machine applies.

Rule of this module: encoders build bytes, decoders read them back, assert on both sides
of the boundary; no machine state here. Every command starts with a one-byte kind and a
one-byte format version. The enqueue command, a publish batch, has a module of its own
(``engine.queue.enqueue_codec``).

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
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from functools import wraps
from typing import ParamSpec, TypeVar

import msgpack
import numpy as np
import numpy.typing as npt

from engine.errors import InvalidRequest
from engine.quick_init import quick_init

FORMAT_VERSION = 1

_RECEIPTS_HEAD = struct.Struct("<BBHI")
_EXTEND_HEAD = struct.Struct("<BBHIq")
_CHECKOUT_HEAD = struct.Struct("<BBHqH")
_SIMPLE_HEAD = struct.Struct("<BB")
_SETTLE_CHECKOUT_HEAD = struct.Struct("<BBI")

CONSUMER_ID_BYTES_MAX = 255
_P = ParamSpec("_P")
_R = TypeVar("_R")


def decoder(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Bytes from the log that do not parse are an ``InvalidRequest``, never a crash."""

    @wraps(fn)
    def decode(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return fn(*args, **kwargs)
        except (struct.error, ValueError, UnicodeDecodeError, IndexError) as e:
            raise InvalidRequest(f"malformed command: {e}") from e

    return decode


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


@decoder
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


@decoder
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


@quick_init
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


@decoder
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


@decoder
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


@decoder
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


@decoder
def command_kind(command: bytes) -> Kind:
    if len(command) < 2 or command[1] != FORMAT_VERSION:
        raise InvalidRequest("unknown command format")
    try:
        return Kind(command[:1])
    except ValueError as e:
        raise InvalidRequest("unknown command kind") from e


__all__ = [
    "OVERFLOW_DROP_HEAD",
    "OVERFLOW_REJECT_PUBLISH",
    "POLICY_FIELDS",
    "RECEIPTS_FEW_MAX",
    "Checkout",
    "Kind",
    "QueuePolicy",
    "command_kind",
    "decode_checkout",
    "decode_dead_letter_confirm",
    "decode_policy",
    "decode_receipts",
    "decode_receipts_few",
    "decoder",
    "encode_checkout",
    "encode_dead_letter_confirm",
    "encode_discard",
    "encode_expire",
    "encode_extend",
    "encode_policy",
    "encode_purge",
    "encode_return",
    "encode_settle",
    "encode_settle_checkout",
    "split_settle_checkout",
]
