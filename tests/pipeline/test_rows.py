"""Rows to frames and frames to rows, without Spark: the wire maps a batch write sends
and the Arrow columns a streaming read builds carry exactly what the rows hold."""

from __future__ import annotations

import msgpack
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from app.api.stream import publish_frame
from app.deliver_frames import deliver_column_chunks
from app.negotiation import unpackb
from engine.limits import Limits
from engine.runtime.api import ReceivedBatch, SettleResult
from pipeline.source import (
    ARROW_READ_SCHEMA,
    READ_COLUMNS,
    bodies_alone,
    body_views,
    columns_record_batch,
    headers_array,
    outgoing,
    packed_bodies,
    project,
    read_columns,
    shipped,
    to_record_batch,
)
from quorra.client import DeliveredColumns, Delivery
from quorra.client._ledger import Ledger

BODY_TYPES = [pa.binary(), pa.string(), pa.large_binary(), pa.large_string()]
bodies = st.lists(st.one_of(st.none(), st.binary(max_size=40)), max_size=30)


def as_type(values: list[bytes | None], type_: pa.DataType) -> pa.Array:
    if pa.types.is_string(type_) or pa.types.is_large_string(type_):
        text = [None if v is None else v.decode("latin-1") for v in values]
        return pa.array(text, type_)
    return pa.array(values, type_)


@settings(deadline=None)  # a shared 2-core machine: no per-example time limit
@given(bodies, st.sampled_from(BODY_TYPES), st.integers(0, 30), st.integers(0, 30))
def test_body_views_are_each_rows_bytes(
    values: list[bytes | None], type_: pa.DataType, start: int, length: int
) -> None:
    column = as_type(values, type_).slice(start, length)  # a slice keeps its offset
    expected = [v.encode("utf-8") if isinstance(v, str) else (v or b"") for v in column.to_pylist()]
    assert [bytes(v) for v in body_views(column)] == expected


def test_wire_maps_carry_body_dedup_id_and_only_set_fields() -> None:
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array([b"a", None, b"c"]),
            pa.array([{"k": "v"}, None, {}], pa.map_(pa.string(), pa.string())),
            pa.array([3, None, 0], pa.int32()),
            pa.array([None, "own", None]),
        ],
        names=["body", "headers", "priority", "dedup_id"],
    )
    packed = msgpack.packb(outgoing(batch, "job-0", 7), use_bin_type=True)
    assert msgpack.unpackb(packed) == [
        {"body": b"a", "headers": {"k": "v"}, "priority": 3, "dedup_id": "job-0-7"},
        {"body": b"", "dedup_id": "own"},
        {"body": b"c", "dedup_id": "job-0-9"},
    ]
    # Without a dedup_id column no row has an id: its frame's stands for it.
    only_body = msgpack.unpackb(msgpack.packb(outgoing(batch.select([0]), "job-0", 0)))
    assert only_body == [{"body": b"a"}, {"body": b""}, {"body": b"c"}]
    no_ids = msgpack.unpackb(msgpack.packb(outgoing(batch.select([0, 2]), "job-0", 0)))
    assert no_ids == [{"body": b"a", "priority": 3}, {"body": b""}, {"body": b"c"}]


def ledger() -> Ledger:
    ready = {"op": "ready", "window_messages": 10_000, "batch_messages_max": 1000,
             "prefetch_max": 100}  # fmt: skip
    return Ledger(ready, None)


@settings(deadline=None)
@given(
    bodies.filter(len),
    st.sampled_from(BODY_TYPES),
    st.integers(0, 30),
    st.integers(1, 30),
    st.integers(1, 29),
    st.one_of(st.none(), st.text(min_size=1, max_size=20)),
)
def test_packed_bodies_make_the_frame_the_wire_maps_make(
    values: list[bytes | None],
    type_: pa.DataType,
    start: int,
    length: int,
    cut: int,
    dedup_id: str | None,
) -> None:
    """A body column packed at once, cut in two pieces anywhere between rows, is the
    frame its wire maps make: the server reads the same messages from either."""
    column = as_type(values, type_).slice(min(start, len(values) - 1), length)
    packed = packed_bodies(column)
    assert packed is not None
    data, ends = packed
    assert len(ends) == len(column) + 1 and ends[0] == 0 and ends[-1] == len(data)
    at = ends[min(cut, len(column))]
    pieces = [data[:at], data[at:]]
    batch = pa.RecordBatch.from_arrays([column], names=["body"])
    assert bodies_alone(batch)
    seq, frame = ledger().publish_frame_of_packed(len(column), pieces, dedup_id)
    expected_seq, expected = ledger().publish_frame_of_maps(outgoing(batch, "p", 0), dedup_id)
    assert seq == expected_seq == 1
    assert msgpack.unpackb(frame) == msgpack.unpackb(expected)
    read = publish_frame(dict(unpackb(frame)), 0, Limits())  # type: ignore[arg-type]
    assert read == publish_frame(dict(unpackb(expected)), 0, Limits())  # type: ignore[arg-type]


def test_only_a_body_column_is_packed() -> None:
    body = pa.array([b"a"])
    assert bodies_alone(pa.RecordBatch.from_arrays([body, pa.array([1])], names=["body", "n"]))
    for other in ("headers", "priority", "dedup_id"):
        batch = pa.RecordBatch.from_arrays([body, pa.array([None])], names=["body", other])
        assert not bodies_alone(batch)
    assert packed_bodies(pa.array([b"a"], pa.binary_view())) is None
    assert packed_bodies(pa.array(["a"]).dictionary_encode()) is None


headers = st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3)


@settings(deadline=None)
@given(st.lists(headers, max_size=20))
def test_headers_column_equals_the_pairs_of_each_message(
    per_message: list[dict[str, str]],
) -> None:
    messages = [Delivery(i, "r", b"", h, 0, 1, 0, 0) for i, h in enumerate(per_message)]
    built = headers_array(messages)
    pairs = pa.array([list(h.items()) for h in per_message], ARROW_READ_SCHEMA[3].type)
    assert built.type == pairs.type and built.equals(pairs)


RECEIPT = st.text("0123456789abcdef", min_size=64, max_size=64)
DELIVERY = st.builds(
    Delivery,
    id=st.integers(0, 2**62),
    receipt=RECEIPT,
    body=st.binary(max_size=40),
    headers=st.dictionaries(st.text(max_size=6), st.text(max_size=6), max_size=3),
    priority=st.integers(0, 255),
    delivery_count=st.integers(0, 1000),
    published_at_ms=st.integers(0, 2**42),
    lease_expires_at_ms=st.just(2**41),
)


@settings(deadline=None)
@given(st.lists(DELIVERY, min_size=1, max_size=30, unique_by=lambda d: d.id))
def test_a_columnar_frame_makes_the_rows_its_deliveries_make(messages: list[Delivery]) -> None:
    batch = ReceivedBatch(
        SettleResult(0, ()),
        [m.id for m in messages],
        [m.receipt for m in messages],
        [m.body for m in messages],
        [m.headers for m in messages],
        [m.priority for m in messages],
        [m.delivery_count for m in messages],
        [m.published_at_ms for m in messages],
        messages[0].lease_expires_at_ms,
    )
    frame = msgpack.unpackb(deliver_column_chunks(batch).joined(), raw=False)
    rows = columns_record_batch(DeliveredColumns.of(frame))
    rows.validate(full=True)
    assert rows.equals(to_record_batch(messages, text=False))


@settings(deadline=None)
@given(
    st.lists(DELIVERY, max_size=20, unique_by=lambda d: d.id),
    st.permutations(READ_COLUMNS).flatmap(
        lambda cols: st.integers(1, len(cols)).map(lambda k: tuple(cols[:k]))
    ),
)
def test_a_read_of_some_columns_gets_those_of_the_full_rows_and_ships_no_other(
    messages: list[Delivery], columns: tuple[str, ...]
) -> None:
    full = to_record_batch(messages)
    sent = shipped(to_record_batch(messages, text=False), columns)
    needed = set(columns) - {"body_text"} | ({"body"} if "body_text" in columns else set())
    assert set(sent.schema.names) == needed
    assert project(sent, columns).equals(full.select(list(columns)))


def test_a_schema_names_read_columns_with_their_types() -> None:
    given = StructType([StructField("body_text", StringType()), StructField("id", LongType())])
    assert read_columns(given) == ("body_text", "id")
    with pytest.raises(ValueError, match="no column 'bodytext'"):
        read_columns(StructType([StructField("bodytext", StringType())]))
    with pytest.raises(ValueError, match="'id' is bigint, not int"):
        read_columns(StructType([StructField("id", IntegerType())]))
