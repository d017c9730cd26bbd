"""A ``deliver`` frame written as chunks decodes to exactly what msgpack makes of the
frame as maps, whatever the batch: its size is the chunks' total, each body is the
batch's own object, and a value a field cannot hold is refused."""

from __future__ import annotations

import struct

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.deliver_frames import FrameChunks, deliver_chunks, deliver_column_chunks
from engine.runtime.api import ReceivedBatch, SettleResult
from quorra.client import DeliveredColumns, Delivery, Problem

U64 = st.integers(0, (1 << 64) - 1)
RECEIPTS = st.text("0123456789abcdef", min_size=64, max_size=64)
HEADERS = st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3)


@st.composite
def batches(draw: st.DrawFn, headers: st.SearchStrategy[dict[str, str]]) -> ReceivedBatch:
    n = draw(st.integers(1, 30))
    column = st.lists
    return ReceivedBatch(
        SettleResult(0, ()),
        draw(column(U64, min_size=n, max_size=n)),
        draw(column(RECEIPTS, min_size=n, max_size=n)),
        draw(column(st.binary(max_size=300), min_size=n, max_size=n)),
        draw(column(headers, min_size=n, max_size=n)),
        draw(column(st.integers(0, 255), min_size=n, max_size=n)),
        draw(column(U64, min_size=n, max_size=n)),
        draw(column(U64, min_size=n, max_size=n)),
        draw(U64),
    )


def as_maps(batch: ReceivedBatch) -> bytes:
    """The frame as the stream packed it before: a dict per message, ``msgpack.packb``."""
    messages = [
        {
            "id": m.id,
            "receipt": m.receipt,
            "body": m.body,
            "headers": m.headers,
            "priority": m.priority,
            "delivery_count": m.delivery_count,
            "published_at_ms": m.published_at_ms,
            "lease_expires_at_ms": m.lease_expires_at_ms,
        }
        for m in batch.messages
    ]
    return msgpack.packb({"op": "deliver", "messages": messages}, use_bin_type=True)


def check(batch: ReceivedBatch, frame: FrameChunks) -> None:
    joined = frame.joined()
    assert frame.size == len(joined)
    assert all(type(chunk) is bytes for chunk in frame.chunks)
    decoded = msgpack.unpackb(joined, raw=False, strict_map_key=True)
    assert decoded == msgpack.unpackb(as_maps(batch), raw=False, strict_map_key=True)
    assert list(decoded["messages"][0]) == list(decoded["messages"][-1])  # field order
    assert list(decoded["messages"][0]) == [
        "id",
        "receipt",
        "body",
        "headers",
        "priority",
        "delivery_count",
        "published_at_ms",
        "lease_expires_at_ms",
    ]


@given(batches(st.just({})))
def test_a_batch_without_headers_decodes_as_its_maps(batch: ReceivedBatch) -> None:
    frame = deliver_chunks(batch)
    check(batch, frame)
    # each body goes out as the batch's own object, between two chunks of fields
    assert frame.chunks[1::2] == batch.bodies
    assert all(a is b for a, b in zip(frame.chunks[1::2], batch.bodies, strict=True))
    assert len(frame.chunks) == 2 * len(batch.ids) + 1


@given(batches(HEADERS))
def test_a_batch_with_headers_decodes_as_its_maps(batch: ReceivedBatch) -> None:
    check(batch, deliver_chunks(batch))


def one(**changes: object) -> ReceivedBatch:
    fields: dict[str, object] = {
        "settled": SettleResult(0, ()),
        "ids": [1],
        "receipts": ["a" * 64],
        "bodies": [b"x"],
        "headers": [{}],
        "priorities": [0],
        "delivery_counts": [1],
        "published_at_ms": [5],
        "lease_expires_at_ms": 9,
    }
    fields.update(changes)
    return ReceivedBatch(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("headers", [{}, {"k": "v"}])
@pytest.mark.parametrize(
    "changes",
    [
        {"priorities": [256]},
        {"priorities": [-1]},
        {"ids": [1 << 64]},
        {"delivery_counts": [-1]},
        {"published_at_ms": [1 << 64]},
        {"lease_expires_at_ms": -1},
    ],
)
def test_a_value_a_field_cannot_hold_is_refused(
    headers: dict[str, str], changes: dict[str, object]
) -> None:
    with pytest.raises((OverflowError, struct.error)):
        deliver_chunks(one(headers=[headers], **changes))


@pytest.mark.parametrize("receipt", ["a" * 63, "a" * 65, "é" * 64])
def test_a_receipt_that_is_not_64_ascii_characters_is_refused(receipt: str) -> None:
    with pytest.raises((AssertionError, UnicodeEncodeError)):
        deliver_chunks(one(receipts=[receipt]))


@given(batches(HEADERS))
def test_a_columnar_frame_reads_back_as_its_batch(batch: ReceivedBatch) -> None:
    frame = deliver_column_chunks(batch)
    joined = frame.joined()
    assert frame.size == len(joined)
    assert all(type(chunk) is bytes for chunk in frame.chunks)
    assert all(any(chunk is body for chunk in frame.chunks) for body in batch.bodies)
    decoded = msgpack.unpackb(joined, raw=False, strict_map_key=True)
    assert decoded["op"] == "deliver"
    assert decoded["columns"] is True
    assert ("header_offsets" in decoded) == any(batch.headers)
    columns = DeliveredColumns.of(decoded)
    assert len(columns) == len(batch.ids)
    assert columns.receipt_list() == batch.receipts
    assert columns.deliveries() == [
        Delivery(m.id, m.receipt, m.body, m.headers, m.priority, m.delivery_count,
                 m.published_at_ms, m.lease_expires_at_ms)
        for m in batch.messages
    ]  # fmt: skip


@given(batches(st.just({})), st.sampled_from(["ids", "receipts", "body_offsets", "count"]))
def test_a_columnar_frame_with_a_short_column_is_refused(batch: ReceivedBatch, key: str) -> None:
    decoded = msgpack.unpackb(deliver_column_chunks(batch).joined(), raw=False)
    decoded[key] = decoded[key] + 1 if key == "count" else decoded[key][:-1]
    with pytest.raises(Problem):
        DeliveredColumns.of(decoded)
