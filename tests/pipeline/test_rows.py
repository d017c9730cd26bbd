"""Rows to frames and frames to rows, without Spark: the wire maps a batch write sends
and the Arrow columns a streaming read builds carry exactly what the rows hold."""

from __future__ import annotations

import msgpack
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.source import ARROW_READ_SCHEMA, body_views, headers_array, outgoing
from quorra.client import Delivery

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
