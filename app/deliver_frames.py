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


__all__ = ["FrameChunks", "deliver_chunks"]
