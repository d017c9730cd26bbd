"""The bytes between two nodes over TCP: frames, the items they carry, the handshake's.

Rule: everything here is pure and total on peer bytes. A frame is a 4-byte big-endian
unsigned length, then that many bytes of one msgpack document; ``FrameDecoder`` cuts a
byte stream into frames and refuses a length above its cap. After the handshake a frame
is a msgpack array of items ``[kind, key, value]`` (``Kind``), encoded through
``engine.runtime.wire``; each frame stands alone, so losing one whole frame loses what
it carried and nothing else. A frame that carries blobs (an append's entries, a
snapshot's bytes: ``wire.encode_chunks``) is instead ``BLOBS_MARK``, the document's
length, the document, then the blobs it stands for. ``decode_items`` checks every
item's shape. Whatever the bytes, these functions return or raise ``FrameError``,
nothing else.

Handshake frames are plain msgpack maps (no extension types), tagged by ``"t"``:
``hello`` (dialer: magic, protocol version, cluster id, both node names, lane, limits
fingerprint, nonce, the id of its data directory), ``challenge`` (acceptor: its nonce,
the id of its data directory and its MAC), ``proof`` (dialer: its MAC), ``welcome``, or
``refused`` with a reason; ``forgotten`` (either side, with a MAC of its own role) in
place of a proof or a welcome tells the other node that the cluster forgot it, and
``lost_data`` likewise that the cluster knows it from another data directory. Each MAC
is HMAC-SHA256 with the cluster secret over a role label and the transcript
(``transcript``): both nonces, both names, both data directory ids, the cluster id, the
version, the lane and the fingerprint. Each side proves it
knows the secret over the other's fresh nonce, so a recorded handshake cannot be
replayed, and the role label keeps one side's MAC from serving as the other's.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import hmac
import json
import typing
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgpack

from engine.errors import QuorraError
from engine.limits import KIB, Limits
from engine.raft.messages import AppendRequest, Message, SnapshotChunk
from engine.runtime import wire
from engine.runtime.routing import CALL_TYPES
from engine.runtime.wire import Chunks

PROTOCOL_VERSION = 3
MAGIC = "quorra-cluster"
HEADER_BYTES = 4
HANDSHAKE_FRAME_BYTES_MAX = 4 * KIB
"""Before a peer is authenticated it may send no more than this per frame."""
NONCE_BYTES = 32
REASON_CHARS_MAX = 200
ARRAY_HEADER_BYTES_MAX = 5
BLOBS_MARK = b"\xc1"
"""Starts a frame whose document is followed by blobs (``wire.encode_chunks``): then
come the document's length (4 bytes, big-endian), the document, the blobs. No msgpack
document starts with this byte (msgpack never uses it)."""
FRAME_HEADERS_BYTES_MAX = len(BLOBS_MARK) + 4 + ARRAY_HEADER_BYTES_MAX
MESSAGE_TYPES: tuple[type[Any], ...] = typing.get_args(Message)


class FrameError(Exception):
    """Bytes from a peer that are not a frame of this protocol; the connection closes."""


class Lane(enum.IntEnum):
    """The two connections between a pair of nodes. Heartbeats, votes and every small
    answer go on ``CONTROL``; appends, snapshot chunks and calls on ``BULK``, so that a
    backlog of bulk bytes never delays what keeps leaders and elections alive."""

    CONTROL = 0
    BULK = 1


class Kind(enum.IntEnum):
    RAFT = 0
    """key: the group's uid; value: a Raft message."""
    CALL = 1
    """key: the call id; value: a call of ``engine.runtime.routing``."""
    ANSWER = 2
    """key: the id of the call answered; value: its result."""
    FAILURE = 3
    """key: the id of the call answered; value: its operating error."""
    PING = 4
    """key: the sender's monotonic clock in microseconds; value: None."""
    PONG = 5
    """key: the key of the ping answered; value: None."""


class Item(NamedTuple):
    kind: Kind
    key: int | str
    value: object


def lane_of(message: object) -> Lane:
    return Lane.BULK if isinstance(message, AppendRequest | SnapshotChunk) else Lane.CONTROL


# --- frames ---------------------------------------------------------------------------


class FrameDecoder:
    """Cuts a byte stream into frame payloads; holds at most one frame and one read."""

    def __init__(self, frame_bytes_max: int) -> None:
        self.frame_bytes_max = frame_bytes_max
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def next_frame(self) -> bytes | None:
        """The next whole frame's payload, None until it has all arrived, or
        ``FrameError`` if its length is above the cap."""
        buffer = self._buffer
        if len(buffer) < HEADER_BYTES:
            return None
        end = HEADER_BYTES + frame_length(buffer[:HEADER_BYTES], self.frame_bytes_max)
        if len(buffer) < end:
            return None
        payload = bytes(buffer[HEADER_BYTES:end])
        del buffer[:end]
        return payload

    @property
    def buffered_bytes(self) -> int:
        return len(self._buffer)

    def take_buffered(self) -> bytes:
        """The bytes fed and not cut yet, which the decoder no longer holds."""
        data = bytes(self._buffer)
        self._buffer.clear()
        return data


def frame_length(header: bytes | bytearray | memoryview, frame_bytes_max: int) -> int:
    """The payload length a frame's header gives, or ``FrameError`` above the cap."""
    length = int.from_bytes(header, "big")
    if length > frame_bytes_max:
        raise FrameError(f"a frame of {length} bytes (at most {frame_bytes_max})")
    return length


def frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(HEADER_BYTES, "big") + payload


_ITEM_HEADER = wire.array_header(3)


def encode_item(kind: Kind, key: int | str, value: object) -> Chunks:
    """One item's bytes, as buffers, and the blobs it stands for (``wire.encode_chunks``:
    an append's entries are neither copied nor nested); ``frames_of`` puts items into
    frames without encoding or joining them."""
    if wire.blob_free(value):
        # No blob: the item is one document, encoded by one call.
        data = wire.encode([int(kind), key, value])
        return Chunks([data], len(data), [], 0)
    head = wire.encode([int(kind), key])
    body = wire.walked_chunks(value)
    # [kind, key] and [kind, key, value] differ only in the array's first byte.
    parts = [_ITEM_HEADER + head[1:], *body.parts]
    return Chunks(parts, len(head) + body.document_bytes, body.blobs, body.blobs_bytes)


def item_fits(item: Chunks, frame_bytes_max: int) -> bool:
    return item.size + FRAME_HEADERS_BYTES_MAX <= frame_bytes_max


def frames_of(items: list[Chunks], frame_bytes_max: int) -> list[Chunks]:
    """The items (each ``item_fits``), in order, in as few whole frames as fit the cap,
    each frame as buffers to write in order (its ``parts``)."""
    out: list[Chunks] = []
    start, size = 0, 0
    for k, item in enumerate(items):
        if k > start and size + item.size + FRAME_HEADERS_BYTES_MAX > frame_bytes_max:
            out.append(_frame_of(items[start:k]))
            start, size = k, 0
        size += item.size
    if start < len(items):
        out.append(_frame_of(items[start:]))
    return out


def _frame_of(items: list[Chunks]) -> Chunks:
    header = wire.array_header(len(items))
    size = len(header) + sum(i.document_bytes for i in items)
    """The document's."""
    blobs = [blob for item in items for blob in item.blobs]
    payload = size
    head = [header]
    if blobs:
        payload += len(BLOBS_MARK) + 4 + sum(i.blobs_bytes for i in items)
        head = [BLOBS_MARK, size.to_bytes(4, "big"), header]
    parts = [payload.to_bytes(HEADER_BYTES, "big"), *head]
    for item in items:
        parts += item.parts
    return Chunks(wire.coalesced(parts) + blobs, HEADER_BYTES + payload, [], 0)


def decode_items(payload: wire.Buffer) -> list[Item]:
    """The items of one frame after the handshake, each checked, or ``FrameError``."""
    view = memoryview(payload)
    blobs = None
    if view[:1] == BLOBS_MARK:
        size = int.from_bytes(view[1:5], "big")
        if len(view) < 5 + size:
            raise FrameError("a frame shorter than its document")
        view, blobs = view[5 : 5 + size], view[5 + size :]
    try:
        value = wire.decode(view, blobs)
    except Exception as e:
        # Peer bytes: whatever the decoder raises (msgpack's errors, a wire type's
        # constructor refusing its fields, a recursion too deep) is a bad frame.
        raise FrameError(f"undecodable frame: {type(e).__name__}") from None
    if not isinstance(value, list) or not value:
        raise FrameError("a frame is a non-empty list of items")
    return [_checked_item(v) for v in value]


def _checked_item(value: object) -> Item:
    if not isinstance(value, list) or len(value) != 3:
        raise FrameError("an item is [kind, key, value]")
    raw_kind, key, body = value
    if type(raw_kind) is not int or raw_kind not in Kind._value2member_map_:
        raise FrameError(f"unknown item kind {raw_kind!r:.40}")
    kind = Kind(raw_kind)
    if kind is Kind.RAFT:
        if type(key) is not str or not isinstance(body, MESSAGE_TYPES):
            raise FrameError("a Raft item is [0, uid, message]")
        return Item(kind, key, body)
    if type(key) is not int:
        raise FrameError(f"item kind {kind.name}: the key is not an integer")
    if kind is Kind.CALL and not isinstance(body, CALL_TYPES):
        raise FrameError(f"not a call: {type(body).__name__}")
    if kind is Kind.FAILURE and not isinstance(body, QuorraError):
        raise FrameError(f"not an operating error: {type(body).__name__}")
    return Item(kind, key, body)


# --- handshake ------------------------------------------------------------------------


def limits_fingerprint(limits: Limits) -> str:
    """Nodes must run with equal limits (frame sizes, timeouts, Raft's bounds)."""
    text = json.dumps(dataclasses.asdict(limits), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Hello:
    version: int
    cluster_id: str
    src: str
    """The dialing node."""
    dst: str
    """The node it means to reach."""
    lane: int
    limits: str
    nonce: bytes
    incarnation: str = ""
    """The id of the dialer's data directory (``NodeRecord.incarnation``)."""


_SCHEMAS: dict[str, dict[str, type[Any]]] = {
    "hello": {
        "magic": str,
        "version": int,
        "cluster": str,
        "src": str,
        "dst": str,
        "lane": int,
        "limits": str,
        "nonce": bytes,
        "incarnation": str,
    },
    "challenge": {"nonce": bytes, "incarnation": str, "mac": bytes},
    "proof": {"mac": bytes},
    "welcome": {},
    "forgotten": {"mac": bytes},
    "lost_data": {"mac": bytes},
    "refused": {"reason": str},
}


def encode_handshake(tag: str, **fields: object) -> bytes:
    assert set(fields) == set(_SCHEMAS[tag]), tag
    return frame(bytes(msgpack.packb({"t": tag, **fields}, use_bin_type=True)))


def encode_hello(hello: Hello) -> bytes:
    return encode_handshake(
        "hello",
        magic=MAGIC,
        version=hello.version,
        cluster=hello.cluster_id,
        src=hello.src,
        dst=hello.dst,
        lane=hello.lane,
        limits=hello.limits,
        nonce=hello.nonce,
        incarnation=hello.incarnation,
    )


def decode_handshake(payload: bytes) -> tuple[str, dict[str, Any]]:
    """``(tag, fields)`` of a handshake frame, every field of its type, or ``FrameError``.
    A hello of another protocol version is returned as far as its version, so that the
    refusal can say so."""
    try:
        value = msgpack.unpackb(payload, raw=False, strict_map_key=True, ext_hook=_no_ext)
    except Exception as e:
        raise FrameError(f"undecodable handshake frame: {type(e).__name__}") from None
    if not isinstance(value, dict):
        raise FrameError("a handshake frame is a map")
    tag = value.pop("t", None)
    schema = _SCHEMAS.get(tag) if isinstance(tag, str) else None
    if schema is None:
        raise FrameError("not a handshake frame")
    if tag == "hello" and (value.get("magic") != MAGIC or type(value.get("version")) is not int):
        raise FrameError("not a Quorra cluster hello")
    if tag == "hello" and value["version"] != PROTOCOL_VERSION:
        return tag, {"version": value["version"]}
    if set(value) != set(schema):
        raise FrameError(f"{tag}: fields {sorted(value)!r:.100}")
    for name, cls in schema.items():
        if type(value[name]) is not cls:
            raise FrameError(f"{tag}.{name}: not a {cls.__name__}")
    return tag, value


def _no_ext(code: int, data: bytes) -> object:
    raise ValueError("no extension types in a handshake")


def hello_of(fields: dict[str, Any]) -> Hello:
    return Hello(
        version=fields["version"],
        cluster_id=fields["cluster"],
        src=fields["src"],
        dst=fields["dst"],
        lane=fields["lane"],
        limits=fields["limits"],
        nonce=fields["nonce"],
        incarnation=fields["incarnation"],
    )


def transcript(hello: Hello, nonce_b: bytes, incarnation_b: str) -> bytes:
    """What both MACs cover: the dialer's hello as each side sees it, and the acceptor's
    nonce and data directory id. Each side builds it from its own values, so any
    difference fails the MAC."""
    parts = [MAGIC, hello.version, hello.cluster_id, hello.src, hello.dst, hello.lane]
    parts += [hello.limits, hello.nonce, hello.incarnation, nonce_b, incarnation_b]
    return bytes(msgpack.packb(parts, use_bin_type=True))


def mac(secret: bytes, role: str, text: bytes) -> bytes:
    return hmac.new(secret, role.encode() + b"\0" + text, hashlib.sha256).digest()


def mac_ok(secret: bytes, role: str, text: bytes, claimed: bytes) -> bool:
    return hmac.compare_digest(mac(secret, role, text), claimed)


def printable(reason: str) -> str:
    """A reason a peer sent, safe to log and to show: short, no control characters."""
    return "".join(c if c.isprintable() else "?" for c in reason[:REASON_CHARS_MAX])


__all__ = [
    "HANDSHAKE_FRAME_BYTES_MAX",
    "MESSAGE_TYPES",
    "NONCE_BYTES",
    "PROTOCOL_VERSION",
    "FrameDecoder",
    "FrameError",
    "Hello",
    "Item",
    "Kind",
    "Lane",
    "decode_handshake",
    "decode_items",
    "encode_handshake",
    "encode_hello",
    "encode_item",
    "frame",
    "frame_length",
    "frames_of",
    "hello_of",
    "item_fits",
    "lane_of",
    "limits_fingerprint",
    "mac",
    "mac_ok",
    "printable",
    "transcript",
]
