"""The bytes of what crosses a transport: msgpack, with frozen dataclasses as extension types.

Rule: every value a ``Transport`` carries (Raft messages, node-to-node calls
(``engine.runtime.routing``) and their answers, operating errors) encodes to one msgpack
document and decodes to an equal value. A dataclass is the extension type ``DATACLASS``
holding ``[type name, [field values...]]`` in field order; an operating error travels as
``ERROR``: ``[class name, detail]``.

Decoding trusts nothing: the bytes may come from any peer. Only registered dataclasses
decode (here, and the calls ``routing`` registers), so a peer cannot make this node build
anything else; each is rebuilt by keyword through its ``Shape`` (``engine.runtime.shapes``),
every field checked against its annotation: the integers of Raft messages are
non-negative and below ``INT_MAX`` (an entry's index and term at least 1; a snapshot
answer's ``next_offset`` may be -1). A document is bounded in size, strings, items and
depth of nested dataclasses (``Limits.wire_*``). Whatever the bytes, ``decode`` returns
a value or raises ``WireError``, nothing else.

The in-memory transport can round-trip everything through this module
(``InMemoryNetwork(wire=True)``), so the tests prove what a network transport carries.
"""

from __future__ import annotations

import dataclasses
import operator
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

import msgpack

from engine import errors
from engine.errors import WireError
from engine.limits import DEFAULT_LIMITS, KIB, Limits
from engine.raft.entry import Entry
from engine.raft.messages import (
    INT_MAX,
    AppendRequest,
    AppendResponse,
    Heartbeat,
    HeartbeatResponse,
    SnapshotChunk,
    SnapshotResponse,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from engine.runtime import shapes
from engine.runtime.api import (
    BrowsedMessage,
    OutgoingMessage,
    QueueArgs,
    QueueInfo,
    ReceivedBatch,
    ReceivedMessage,
    SettleResult,
)
from engine.runtime.meta import QueueMeta

Buffer = bytes | bytearray | memoryview
"""What a document is decoded from."""
DATACLASS = 1
ERROR = 2
BLOB = 3
"""Stands for the next byte string of the blobs that follow a document
(``encode_chunks``); its payload is the string's length, 4 bytes big-endian."""

_SHAPES: dict[str, shapes.Shape] = {}
"""Every type that decodes, by name."""
_BY_CLASS: dict[type[Any], shapes.Shape] = {}
_GETTERS: dict[type[Any], Callable[[object], list[object]]] = {}
"""How each registered type encodes (``_getter``)."""


def register(
    classes: Iterable[type[Any]],
    *,
    ints: shapes.Bounds | None = None,
    bounds: Mapping[type[Any], Mapping[str, shapes.Bounds]] | None = None,
) -> dict[type[Any], shapes.Shape]:
    """Let ``classes`` cross the wire (in order: each may hold earlier registered ones);
    returns their shapes. ``ints`` bounds their int fields, ``bounds`` some by name."""
    new = shapes.shapes_of(classes, ints=ints, bounds=bounds, known=_BY_CLASS)
    for cls, shape in new.items():
        assert shape.name not in _SHAPES, f"two wire types named {shape.name}"
        _SHAPES[shape.name] = _BY_CLASS[cls] = shape
        _GETTERS[cls] = _getter(shape)
    return new


def _getter(shape: shapes.Shape) -> Callable[[object], list[object]]:
    """What a value of ``shape`` encodes as: ``[name, [field values...]]``, its fields
    read by one ``attrgetter`` call (a tuple packs as the array a list does)."""
    name = shape.name
    names = [field for field, _convert in shape.fields]
    if len(names) < 2:
        # attrgetter of one name returns the value itself, of none is refused.
        return lambda value: [name, [getattr(value, field) for field in names]]
    get = operator.attrgetter(*names)
    return lambda value: [name, get(value)]


_RAFT_INTS = (0, INT_MAX)
register(
    (
        Entry,
        AppendRequest,
        AppendResponse,
        Heartbeat,
        HeartbeatResponse,
        SnapshotChunk,
        SnapshotResponse,
        TimeoutNow,
        VoteRequest,
        VoteResponse,
    ),
    ints=_RAFT_INTS,
    bounds={
        Entry: {"index": (1, INT_MAX), "term": (1, INT_MAX)},
        SnapshotResponse: {"next_offset": (-1, INT_MAX)},
    },
)
register(
    (
        QueueArgs,
        QueueMeta,
        QueueInfo,
        OutgoingMessage,
        ReceivedMessage,
        BrowsedMessage,
        SettleResult,
        ReceivedBatch,
    )
)
_ERRORS: dict[str, type[errors.QuorraError]] = {
    name: cls
    for name, cls in vars(errors).items()
    if isinstance(cls, type) and issubclass(cls, errors.QuorraError)
}


def _default(value: object) -> msgpack.ExtType:
    # A registered type is looked up first: ``is_dataclass`` and a field list built by
    # name cost a forwarded publish a fifth of the sending loop, once per message.
    getter = _GETTERS.get(type(value))
    if getter is not None:
        return msgpack.ExtType(DATACLASS, encode(getter(value)))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        raise AssertionError(f"{type(value).__name__} is not a wire type")
    if isinstance(value, errors.QuorraError):
        return msgpack.ExtType(ERROR, encode([type(value).__name__, value.detail]))
    raise TypeError(f"cannot encode {type(value).__name__}")


class _Packers(threading.local):
    """This thread's idle packers. ``msgpack.packb`` makes a packer for every call, and
    each dataclass is encoded by a nested call (``_default``): an append of large entries
    cost a fresh buffer per level, grown by reallocations and page faults (a third of the
    leader's loop in a replicated publish). A kept packer's buffer is already grown.
    Encoding nests, so a call takes a packer of its own from the list and gives it back."""

    def __init__(self) -> None:
        self.idle: list[msgpack.Packer] = []


_PACKERS = _Packers()
_PACKERS_KEPT_MAX = DEFAULT_LIMITS.wire_packers_kept_per_thread_max
_PACKER_KEPT_BYTES_MAX = DEFAULT_LIMITS.wire_packer_kept_bytes_max


def encode(value: object) -> bytes:
    packer = _take_packer()
    data = bytes(packer.pack(value))
    _give_packer(packer, len(data))
    return data


def _take_packer() -> msgpack.Packer:
    idle = _PACKERS.idle
    if idle:
        return idle.pop()
    return msgpack.Packer(default=_default, use_bin_type=True, autoreset=True)


def _give_packer(packer: msgpack.Packer, packed_bytes: int) -> None:
    idle = _PACKERS.idle
    if packed_bytes <= _PACKER_KEPT_BYTES_MAX and len(idle) < _PACKERS_KEPT_MAX:
        idle.append(packer)


# --- chunks: what is sent, without copying large byte strings -------------------------

CHUNK_BYTES_MIN = 4 * KIB
"""A byte string at least this long inside a chunked type is a blob in
``encode_chunks``; shorter ones are cheaper to copy than to send as separate buffers.
Runs of shorter parts are joined into one buffer."""
_CHUNKED: frozenset[type[Any]] = frozenset({AppendRequest, Entry, SnapshotChunk})
"""The types whose fields ``encode_chunks`` encodes one by one: those that carry entries
and snapshot bytes. Any other value is encoded whole (one chunk)."""
WHOLE_BYTES_MAX = 64 * KIB
"""An append whose entries are all shorter than ``CHUNK_BYTES_MIN`` and hold at most this
many bytes together is encoded whole (``blob_free``): one packer call makes the bytes the
walk field by field makes, in about a third of the time (a replicated publish of one
small message was walked twice on the leader, once per follower), and the copies a whole
encoding makes cost less than the walk at this size."""
_FIXEXT_CODES = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}
_BLOB_HEADER = bytes([_FIXEXT_CODES[4], BLOB])


class Chunks(NamedTuple):
    """A document's bytes as buffers to write in order (``parts``, ``document_bytes``
    long), and the blobs it stands for (``encode_chunks``), to write after it."""

    parts: list[bytes]
    document_bytes: int
    blobs: list[bytes]
    blobs_bytes: int

    @property
    def size(self) -> int:
        """The bytes of the document and its blobs."""
        return self.document_bytes + self.blobs_bytes

    def joined(self) -> bytes:
        """The document alone."""
        return b"".join(self.parts)


def encode_chunks(value: object) -> Chunks:
    """``value`` encoded as by ``encode``, except that each byte string of a chunked
    type (an entry's data, a snapshot's bytes) that is ``CHUNK_BYTES_MIN`` or longer is
    left out of the document, a ``BLOB`` extension in its place, and listed in ``blobs``
    (the object itself, not a copy), in the document's order; ``decode`` takes them back.
    ``encode`` nests a packer per dataclass, and each level copies the level below into
    a fresh buffer: a leader's append of 100 KiB entries was copied six times per
    follower, in fresh (page-faulting) memory, over a third of its loop in a replicated
    publish; and decoding copied each entry once per level again (three times), a third
    of a follower's loop. Out of the document, a blob is copied once, by ``decode``."""
    if blob_free(value):
        data = encode(value)
        return Chunks([data], len(data), [], 0)
    return walked_chunks(value)


def walked_chunks(value: object) -> Chunks:
    """``encode_chunks`` of a ``value`` that ``blob_free`` refused, walked field by field
    (for a caller that asked ``blob_free`` already: an append of many small entries is
    walked by it to the end)."""
    parts: list[bytes] = []
    blobs: list[bytes] = []
    packer = _take_packer()
    size = _chunk(value, parts, blobs, packer.pack, inner=False)
    _give_packer(packer, 0)
    return Chunks(coalesced(parts), size, blobs, sum(len(b) for b in blobs))


def blob_free(value: object) -> bool:
    """Whether ``encode_chunks`` would find no blob in ``value``, and it is small enough
    (``WHOLE_BYTES_MAX``) to be encoded whole: then ``encode`` makes the same bytes."""
    kind = type(value)
    if kind is AppendRequest:
        total = 0
        for entry in value.entries:  # type: ignore[attr-defined]
            size = len(entry.data)
            if size >= CHUNK_BYTES_MIN:
                return False
            total += size
        return total <= WHOLE_BYTES_MAX
    if kind is Entry:
        return len(value.data) < CHUNK_BYTES_MIN  # type: ignore[attr-defined]
    return kind not in _CHUNKED


def coalesced(parts: list[bytes]) -> list[bytes]:
    """``parts`` with each run of buffers shorter than ``CHUNK_BYTES_MIN`` joined."""
    out: list[bytes] = []
    run: list[bytes] = []
    for part in parts:
        if len(part) < CHUNK_BYTES_MIN:
            run.append(part)
            continue
        if run:
            out.append(b"".join(run))
            run = []
        out.append(part)
    if run:
        out.append(b"".join(run))
    return out


def _chunk(
    value: object,
    parts: list[bytes],
    blobs: list[bytes],
    pack: Callable[[object], bytes],
    *,
    inner: bool,
) -> int:
    """Append the encoding of ``value`` (by ``pack`` where whole) to ``parts``; its
    length. ``inner``: ``value`` is a field of a chunked type, or an item of a list that
    is one."""
    if inner and type(value) is bytes and len(value) >= CHUNK_BYTES_MIN:
        blobs.append(value)
        parts.append(_BLOB_HEADER + len(value).to_bytes(4, "big"))
        return len(_BLOB_HEADER) + 4
    if inner and type(value) is Entry and len(value.data) < CHUNK_BYTES_MIN:
        # Holds no blob: one packer call, not a walk of its fields (same bytes).
        data = pack(value)
        parts.append(data)
        return len(data)
    if inner and type(value) is list:
        header = array_header(len(value))
        parts.append(header)
        return len(header) + sum(_chunk(item, parts, blobs, pack, inner=True) for item in value)
    shape = _BY_CLASS.get(type(value)) if type(value) in _CHUNKED else None
    if shape is None:
        data = pack(value)
        parts.append(data)
        return len(data)
    name = pack(shape.name)
    body = [b"\x92", name, array_header(len(shape.fields))]
    size = 1 + len(name) + len(body[-1])
    for field, _convert in shape.fields:
        size += _chunk(getattr(value, field), body, blobs, pack, inner=True)
    header = _ext_header(size)
    parts.append(header)
    parts += body
    return len(header) + size


def array_header(count: int) -> bytes:
    """The bytes msgpack starts an array of ``count`` items with."""
    if count < 16:
        return bytes([0x90 | count])
    if count < 1 << 16:
        return b"\xdc" + count.to_bytes(2, "big")
    return b"\xdd" + count.to_bytes(4, "big")


def _ext_header(length: int) -> bytes:
    code = _FIXEXT_CODES.get(length)
    if code is not None:
        return bytes([code, DATACLASS])
    if length < 1 << 8:
        return bytes([0xC7, length, DATACLASS])
    if length < 1 << 16:
        return b"\xc8" + length.to_bytes(2, "big") + bytes([DATACLASS])
    return b"\xc9" + length.to_bytes(4, "big") + bytes([DATACLASS])


class Codec:
    """Decodes documents within ``limits`` (``decode`` uses the default limits)."""

    def __init__(self, limits: Limits) -> None:
        self.document_bytes_max = limits.wire_document_bytes_max
        self.depth_max = limits.wire_depth_max
        self._bounds: dict[str, int] = {
            "max_str_len": limits.wire_str_bytes_max,
            "max_array_len": limits.wire_items_max,
            "max_map_len": limits.wire_items_max,
        }
        self._small = min(self._bounds.values())
        """msgpack bounds a string, list or map by the bytes that hold it: a document no
        longer than this needs no bound of ours (each costs time on every call)."""
        self._hooks = [self._hook(depth) for depth in range(self.depth_max + 1)]
        """The extension hook of each depth of nesting: it decodes the payload with the
        next one; the last refuses. Only the blobs' cursor changes while a document
        decodes."""
        self._blobs = _Blobs()

    def decode(self, data: Buffer, blobs: memoryview | None = None) -> Any:
        """The value ``data`` encodes, taking its ``BLOB`` extensions in order from
        ``blobs`` (each one and no more), or ``WireError``."""
        if len(data) > self.document_bytes_max:
            raise WireError(f"a document of {len(data)} bytes (at most {self.document_bytes_max})")
        cursor = self._blobs
        cursor.view, cursor.at = blobs, 0
        try:
            value = self._unpack(data, self._hooks[0])
            if blobs is not None and cursor.at != len(blobs):
                raise WireError(f"{len(blobs) - cursor.at} bytes of blobs stood for by nothing")
            return value
        except WireError:
            raise
        except (ValueError, TypeError, msgpack.UnpackException) as e:
            raise WireError(f"undecodable: {type(e).__name__}: {e}") from None
        finally:
            cursor.view = None

    def _unpack(self, data: Buffer, hook: Callable[[int, bytes], object]) -> Any:
        if len(data) <= self._small:
            return msgpack.unpackb(data, ext_hook=hook)
        return msgpack.unpackb(data, ext_hook=hook, **self._bounds)

    def _hook(self, depth: int) -> Callable[[int, bytes], object]:
        if depth == self.depth_max:

            def too_deep(code: int, payload: bytes) -> object:
                raise WireError(f"dataclasses nested more than {self.depth_max} deep")

            return too_deep

        def ext_hook(code: int, payload: bytes) -> object:
            # msgpack decodes the payload of an extension by this recursive call: the
            # innermost dataclasses are built (and checked) first.
            if code == BLOB:
                return self._blobs.take(payload)
            if code != DATACLASS and code != ERROR:
                raise WireError(f"unknown extension type {code}")
            value = self._unpack(payload, self._hooks[depth + 1])
            if type(value) is not list or len(value) != 2 or type(value[0]) is not str:
                raise WireError("an extension is not [name, value]")
            if code == DATACLASS:
                return _build(value[0], value[1])
            return _error(value[0], value[1])

        return ext_hook


class _Blobs(threading.local):
    """Where the document being decoded on this thread takes its next blob from."""

    def __init__(self) -> None:
        self.view: memoryview | None = None
        self.at = 0

    def take(self, payload: bytes) -> bytes:
        view = self.view
        if view is None:
            raise WireError("a blob in a document without blobs")
        if len(payload) != 4:
            raise WireError("a blob's extension is not its length")
        end = self.at + int.from_bytes(payload, "big")
        if end > len(view):
            raise WireError(f"a blob past the end of the blobs ({end} > {len(view)} bytes)")
        blob = bytes(view[self.at : end])
        self.at = end
        return blob


def _build(name: str, fields: object) -> object:
    shape = _SHAPES.get(name)
    if shape is None:
        raise WireError(f"not a wire type: {name!r}")
    return shape.build(fields)


def _error(name: str, detail: object) -> errors.QuorraError:
    if type(detail) is not str:
        raise WireError("an error's detail is not a string")
    return _ERRORS.get(name, errors.QuorraError)(detail)


_DEFAULT = Codec(DEFAULT_LIMITS)


def decode(data: Buffer, blobs: memoryview | None = None) -> Any:
    """The value ``data`` encodes, within the default limits, or ``WireError``."""
    return _DEFAULT.decode(data, blobs)


__all__ = [
    "BLOB",
    "CHUNK_BYTES_MIN",
    "DATACLASS",
    "ERROR",
    "Buffer",
    "Chunks",
    "Codec",
    "WireError",
    "array_header",
    "blob_free",
    "coalesced",
    "decode",
    "encode",
    "encode_chunks",
    "register",
    "walked_chunks",
]
