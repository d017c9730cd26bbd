"""A stream's ``deliver`` frame written as chunks around the message bodies, not packed.

Rule: ``deliver_chunks(batch)`` gives the MessagePack of ``{"op": "deliver",
"messages": [...]}`` (one map per message, in ``ReceivedMessage``'s field order) as a
list of ``bytes`` whose concatenation is that frame: each body is a chunk of its own,
the very ``bytes`` object of the batch, and the map's other fields around it are one
chunk between two bodies (the end of one message's map and the start of the next's),
written for the whole batch at once into one numpy array, a column at a time. The
WebSocket protocol writes the chunks with one ``writelines`` (app/ws_protocol.py), so no
buffer of the frame's size is ever filled: packing a delivery of a thousand 1 KiB
messages (a dict each, then msgpack over them into a kept packer's buffer) cost 3-4 us
a message on this machine under load, the chunks 0.8, and a body is copied once fewer
(by the kernel only). The chunks are ``bytes``: nothing changes under a frame the
transport still holds.

The integers are written at fixed widths (uint64, priority uint8, the body's length
uint32, a receipt as str8): a decoder reads the same values as from ``msgpack.packb``,
which picks the shortest form; ``tests/app/test_deliver_frames.py`` decodes both and
compares. A batch where some message has headers writes those maps with msgpack, in a
chunk of their own.

``deliver_column_chunks(batch)`` writes the columnar form a consumer asks for with
``"columns": true`` in its ``consume`` frame (README.md, "Streams"): one map of packed
little-endian arrays, a column each, its last field ``bodies`` the bodies concatenated
(each body again a chunk of its own, after the map's other fields in one chunk). A
reader builds its columns from a few buffers (an Arrow column straight from
``body_offsets`` and ``bodies``), with no map or object per message.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import msgpack
import numpy as np

from engine.runtime.api import ReceivedBatch

_RECEIPT_BYTES = 64
_U32_MAX = (1 << 32) - 1

_FRAME_HEAD = b"\x82\xa2op\xa7deliver\xa8messages\xdd"
"""The frame's map (two keys) up to its list's header (array32, its length next)."""
_ARRAY_LEN = struct.Struct(">I")
_HEADERS_KEY = b"\xa7headers"
_NO_HEADERS = _HEADERS_KEY + b"\x80"

# Constant runs of a message's map: keys with the type byte of their value.
_TO_PRIORITY = _NO_HEADERS + b"\xa8priority\xcc"  # the headers an empty map; uint8
_TO_COUNT = b"\xaedelivery_count\xcf"  # uint64, as the two after it
_TO_PUBLISHED = b"\xafpublished_at_ms\xcf"
_TO_EXPIRES = b"\xb3lease_expires_at_ms\xcf"
_TO_ID = b"\x88\xa2id\xcf"  # a map of 8 keys, its "id" uint64
_TO_RECEIPT = b"\xa7receipt\xd9\x40"  # str8 of 64 characters
_TO_BODY = b"\xa4body\xc6"  # bin32, its length next

_BETWEEN = np.dtype(
    [
        ("to_priority", f"S{len(_TO_PRIORITY)}"),
        ("priority", "u1"),
        ("to_count", f"S{len(_TO_COUNT)}"),
        ("count", ">u8"),
        ("to_published", f"S{len(_TO_PUBLISHED)}"),
        ("published", ">u8"),
        ("to_expires", f"S{len(_TO_EXPIRES)}"),
        ("expires", ">u8"),
        ("to_id", f"S{len(_TO_ID)}"),
        ("id", ">u8"),
        ("to_receipt", f"S{len(_TO_RECEIPT)}"),
        ("receipt", f"S{_RECEIPT_BYTES}"),
        ("to_body", f"S{len(_TO_BODY)}"),
        ("body_len", ">u4"),
    ]
)
"""The chunk between two bodies: the end of one message's map (from its headers on),
then the start of the next one's (up to its body). Record ``k`` of a frame's array
holds the end of message ``k - 1`` and the start of message ``k``."""
_TAIL_BYTES = len(_TO_PRIORITY) + 1 + len(_TO_COUNT) + len(_TO_PUBLISHED) + len(_TO_EXPIRES) + 24
"""Where a record's part of the next message starts."""
assert _BETWEEN.itemsize == (
    _TAIL_BYTES + len(_TO_ID) + 8 + len(_TO_RECEIPT) + _RECEIPT_BYTES + len(_TO_BODY) + 4
), "a packed record, no padding"
_CONSTANTS = {
    "to_priority": _TO_PRIORITY,
    "to_count": _TO_COUNT,
    "to_published": _TO_PUBLISHED,
    "to_expires": _TO_EXPIRES,
    "to_id": _TO_ID,
    "to_receipt": _TO_RECEIPT,
    "to_body": _TO_BODY,
}
_MESSAGE_STRUCT = struct.Struct(
    f">{len(_TO_ID)}sQ{len(_TO_RECEIPT)}s{_RECEIPT_BYTES}s{len(_TO_BODY)}sI"
)
"""A message's map up to its body, for a batch with headers."""
_TO_PRIORITY_KEY = _TO_PRIORITY[len(_NO_HEADERS) :]
_REST_STRUCT = struct.Struct(
    f">{len(_TO_PRIORITY_KEY)}sB{len(_TO_COUNT)}sQ{len(_TO_PUBLISHED)}sQ{len(_TO_EXPIRES)}sQ"
)
"""A message's map after its headers, for a batch with headers."""


class FrameChunks(NamedTuple):
    """A frame as chunks to be written one after the other, and their total size."""

    chunks: list[bytes]
    size: int

    def joined(self) -> bytes:
        return b"".join(self.chunks)


def deliver_chunks(batch: ReceivedBatch) -> FrameChunks:
    """The ``deliver`` frame of a received batch (see the module's rule). The fields
    between the bodies are written for the whole batch at once, into one array (a
    column at a time), and cut into chunks of its bytes."""
    n = len(batch.ids)
    assert 1 <= n <= _U32_MAX
    _check(batch)
    if any(batch.headers):
        return _with_headers(batch)
    bodies = batch.bodies
    rows = np.empty(n + 1, _BETWEEN)
    for name, value in _CONSTANTS.items():
        rows[name] = value
    rows["priority"][1:] = batch.priorities
    rows["count"][1:] = batch.delivery_counts
    rows["published"][1:] = batch.published_at_ms
    rows["expires"] = batch.lease_expires_at_ms
    rows["id"][:n] = batch.ids
    rows["receipt"][:n] = np.frombuffer("".join(batch.receipts).encode("ascii"), "S64")
    lengths = list(map(len, bodies))
    rows["body_len"][:n] = lengths
    raw = rows.tobytes()
    step = _BETWEEN.itemsize
    # The records between the bodies cut at once, then interleaved with the bodies by
    # two slice assignments: no Python call per message.
    chunks: list[bytes] = [b""] * (2 * n + 1)
    chunks[0] = _FRAME_HEAD + _ARRAY_LEN.pack(n) + raw[_TAIL_BYTES:step]
    chunks[1::2] = bodies
    chunks[2:-1:2] = [raw[at : at + step] for at in range(step, n * step, step)]
    chunks[-1] = raw[n * step : n * step + _TAIL_BYTES]
    size = len(_FRAME_HEAD) + _ARRAY_LEN.size + n * step + sum(lengths)
    return FrameChunks(chunks, size)


_COLUMNS_HEAD = b"\xa2op\xa7deliver\xa7columns\xc3"
"""The first two fields of a columnar deliver frame (``op``, ``columns`` true)."""
_BODIES_KEY = b"\xa6bodies\xc6"  # bin32, its length next
_LE_U32 = np.dtype("<u4")
_BODY_BYTES_MAX = (1 << 31) - 1
"""Arrow's 32-bit offsets: a frame's bodies stay under 2 GiB (far above a batch's size)."""


def deliver_column_chunks(batch: ReceivedBatch) -> FrameChunks:
    """The columnar ``deliver`` frame of a received batch: ``count``, ``ids`` (uint64),
    ``receipts`` (64 ASCII bytes each, back to back), ``priorities`` (uint8),
    ``delivery_counts`` (uint64), ``published_at_ms`` (uint64), ``lease_expires_at_ms``
    (one integer), ``body_offsets`` (uint32, ``count + 1`` of them from 0: body ``k`` is
    ``bodies[body_offsets[k]:body_offsets[k + 1]]``), with headers (only when some
    message has any) ``header_offsets`` (uint32, ``count + 1``: message ``k``'s pairs are
    ``header_keys[o[k]:o[k + 1]]`` and ``header_values`` the same), then ``bodies``.
    Arrays are little-endian, packed, as MessagePack bin."""
    n = len(batch.ids)
    assert 1 <= n <= _U32_MAX
    _check(batch)
    bodies = batch.bodies
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(np.fromiter(map(len, bodies), np.int64, n), out=offsets[1:])
    total = int(offsets[-1])
    assert total <= _BODY_BYTES_MAX, "a frame's bodies under 2 GiB"
    fields: dict[str, object] = {
        "count": n,
        "ids": np.array(batch.ids, "<u8").tobytes(),
        "receipts": "".join(batch.receipts).encode("ascii"),
        "priorities": np.array(batch.priorities, "u1").tobytes(),
        "delivery_counts": np.array(batch.delivery_counts, "<u8").tobytes(),
        "published_at_ms": np.array(batch.published_at_ms, "<u8").tobytes(),
        "lease_expires_at_ms": batch.lease_expires_at_ms,
        "body_offsets": offsets.astype(_LE_U32).tobytes(),
    }
    if any(batch.headers):
        keys: list[str] = []
        values: list[str] = []
        counts = np.zeros(n + 1, np.int64)
        for k, headers in enumerate(batch.headers, 1):
            if headers:
                keys.extend(headers)
                values.extend(headers.values())
            counts[k] = len(keys)
        fields["header_offsets"] = counts.astype(_LE_U32).tobytes()
        fields["header_keys"] = keys
        fields["header_values"] = values
    packer = msgpack.Packer(use_bin_type=True)
    head = [_map_head(len(fields) + 3), _COLUMNS_HEAD]
    for key, value in fields.items():
        head.append(packer.pack(key))
        head.append(packer.pack(value))
    head.append(_BODIES_KEY + _ARRAY_LEN.pack(total))
    first = b"".join(head)
    return FrameChunks([first, *bodies], len(first) + total)


def _map_head(size: int) -> bytes:
    """A MessagePack map's header for ``size`` entries (fixmap or map16)."""
    return bytes([0x80 | size]) if size < 16 else b"\xde" + size.to_bytes(2)


def _with_headers(batch: ReceivedBatch) -> FrameChunks:
    """The frame of a batch where some message has headers: per message, its map up
    to the body, the body, and the rest with the headers packed by msgpack."""
    expires = batch.lease_expires_at_ms
    chunks: list[bytes] = [_FRAME_HEAD + _ARRAY_LEN.pack(len(batch.ids))]
    for id_, receipt, body, headers, priority, count, published in zip(
        *batch.columns(), strict=True
    ):
        chunks.append(
            _MESSAGE_STRUCT.pack(
                _TO_ID, id_, _TO_RECEIPT, receipt.encode("ascii"), _TO_BODY, len(body)
            )
        )
        chunks.append(body)
        chunks.append(_HEADERS_KEY + msgpack.packb(headers, use_bin_type=True))
        chunks.append(
            _REST_STRUCT.pack(
                _TO_PRIORITY_KEY, priority,
                _TO_COUNT, count,
                _TO_PUBLISHED, published,
                _TO_EXPIRES, expires,
            )
        )  # fmt: skip
    return FrameChunks(chunks, sum(map(len, chunks)))


def _check(batch: ReceivedBatch) -> None:
    """Receipts of 64 characters each: the array would pad or cut another length
    (``str.encode`` checks that they are ASCII). The other fields need no check of
    their own: numpy (``OverflowError``) and ``struct`` (``struct.error``) refuse an
    integer its field cannot hold (a priority that is no byte, a body of 4 GiB, a
    negative or 65-bit integer)."""
    assert set(map(len, batch.receipts)) == {_RECEIPT_BYTES}, "receipts of 64 characters"


__all__ = ["FrameChunks", "deliver_chunks", "deliver_column_chunks"]
