"""The ``quorra`` PySpark data source: batch read (browse), batch write, streaming write;
the streaming read lives in ``pipeline.streaming``.

Batch read browses the queue (``GET /queues/{q}/messages``): nothing is consumed. Browse
cursors are ``lane << 48 | position`` and positions within a lane are contiguous, so the
driver reads the first cursor and ``messages_ready`` and splits the cursor space into
``numPartitions`` disjoint ranges; each task pages through its range (the last range is
open-ended, so every message is read exactly once even if the estimate is off).

Batch write publishes each task's rows on one stream (``quorra.client.Stream``, a
WebSocket per task): publish frames of ``batchSize`` messages, as many unconfirmed as the
server's window allows, and the task ends only once every frame is confirmed (durable on
a quorum); a refused frame fails the task. Each frame gets one dedup id (the frame's, for all its
rows), ``<prefix>-<partition>-f<first row>``: ``prefix`` is drawn once per write job on
the driver (or given as ``dedupPrefix``), partition, row numbers and frame boundaries
(every ``batchSize`` rows) are the same on every attempt of a task, so a retried task
republishes the same frames with the same ids and the server's dedup window (5 minutes
by default) drops the repeats, frame by frame: one id per frame instead of one per row
keeps the window a thousand times smaller. A DataFrame with a ``dedup_id`` column keeps
per-row ids instead: a row without its own gets ``<prefix>-<partition>-<row>``.

Streaming write does the same per micro-batch with ``<query id>-<batch id>-<partition>-
<row>``; the query id survives restarts from a checkpoint, so a replayed micro-batch does
not duplicate either.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructType,
    TimestampType,
)

from pipeline import queues
from pipeline.options import Options
from quorra.client import BODY_MAP_HEAD, Client, DeliveredColumns, Delivery, Stream

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

NAME = "quorra"
READ_SCHEMA = (
    "id long, body binary, body_text string, headers map<string,string>, priority int, "
    "delivery_count int, published_at timestamp"
)
WRITE_COLUMNS = ("body", "headers", "priority", "dedup_id")
ARROW_READ_SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("body", pa.binary()),
        ("body_text", pa.string()),
        ("headers", pa.map_(pa.string(), pa.string())),
        ("priority", pa.int32()),
        ("delivery_count", pa.int32()),
        ("published_at", pa.timestamp("us", tz="UTC")),
    ]
)
ARROW_SHIPPED_SCHEMA = ARROW_READ_SCHEMA.remove(2)
READ_COLUMNS = tuple(ARROW_READ_SCHEMA.names)
_CURSOR_POS_BITS = 48
INT32_MAX = (1 << 31) - 1


class QuorraDataSource(DataSource):
    """``spark.read.format("quorra")`` / ``df.write.format("quorra")`` and their streams."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return READ_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return BrowseReader(Options.parse(self.options), read_columns(schema))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        return PublishWriter(Options.parse(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        return PublishStreamWriter(Options.parse(self.options), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from pipeline.streaming import LeaseStreamReader

        return LeaseStreamReader(Options.parse(self.options), read_columns(schema))


# --- rows ------------------------------------------------------------------------------


def read_types() -> dict[str, DataType]:
    """``READ_SCHEMA``'s columns and their Spark types (built here: parsing DDL needs a
    SparkSession, which Spark's Python workers do not have)."""
    return {
        "id": LongType(),
        "body": BinaryType(),
        "body_text": StringType(),
        "headers": MapType(StringType(), StringType()),
        "priority": IntegerType(),
        "delivery_count": IntegerType(),
        "published_at": TimestampType(),
    }


def read_columns(schema: StructType) -> tuple[str, ...]:
    """The columns a read produces, in the order of ``schema``: the read schema
    (``READ_SCHEMA``) or a schema the query gave (``.schema(...)``) naming some of its
    columns with their types. Fewer columns cost less: ``body_text`` is a second copy of
    every body, and each column goes through Spark's JVM row by row."""
    types = read_types()
    names = tuple(field.name for field in schema.fields)
    for field in schema.fields:
        if field.name not in types:
            raise ValueError(
                f"quorra data source: no column {field.name!r} to read "
                f"(the columns are {', '.join(READ_COLUMNS)})"
            )
        if field.dataType != types[field.name]:
            raise ValueError(
                f"quorra data source: column {field.name!r} is "
                f"{types[field.name].simpleString()}, not {field.dataType.simpleString()}"
            )
    if len(set(names)) != len(names) or not names:
        raise ValueError("quorra data source: the read schema needs distinct column names")
    return names


def text_or_none(body: bytes | None) -> str | None:
    if body is None:
        return None
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return None


def to_record_batch(messages: list[Delivery], text: bool = True) -> pa.RecordBatch:
    """Messages as one Arrow batch of ``READ_SCHEMA`` (without ``body_text`` unless
    ``text``: ``with_text`` adds it where the batch is read, so it is not shipped)."""
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array([m.id for m in messages], pa.int64()),
            pa.array([m.body for m in messages], pa.binary()),
            headers_array(messages),
            pa.array([m.priority for m in messages], pa.int32()),
            pa.array([m.delivery_count for m in messages], pa.int32()),
            pa.array([m.published_at_ms * 1000 for m in messages], ARROW_READ_SCHEMA[6].type),
        ],
        schema=ARROW_SHIPPED_SCHEMA,
    )
    return with_text(batch) if text else batch


def columns_record_batch(columns: DeliveredColumns) -> pa.RecordBatch:
    """A columnar deliver frame as one Arrow batch of the shipped schema (no
    ``body_text``), built from its arrays and its one buffer of bodies: no Python object
    per message."""
    n = len(columns)
    body = pa.Array.from_buffers(
        pa.binary(),
        n,
        [None, pa.py_buffer(columns.body_offsets.astype(np.int32)), pa.py_buffer(columns.bodies)],
    )
    header_offsets = columns.header_offsets
    headers = pa.MapArray.from_arrays(
        pa.array(
            np.zeros(n + 1, np.int32) if header_offsets is None else header_offsets.astype(np.int32)
        ),
        pa.array(columns.header_keys, pa.string()),
        pa.array(columns.header_values, pa.string()),
        type=ARROW_READ_SCHEMA[3].type,
    )
    return pa.RecordBatch.from_arrays(
        [
            pa.array(columns.ids.astype(np.int64)),
            body,
            headers,
            pa.array(columns.priorities.astype(np.int32)),
            pa.array(np.minimum(columns.delivery_counts, INT32_MAX).astype(np.int32)),
            pa.array(columns.published_at_ms.astype(np.int64) * 1000, ARROW_READ_SCHEMA[6].type),
        ],
        schema=ARROW_SHIPPED_SCHEMA,
    )


def headers_array(messages: list[Delivery]) -> pa.MapArray:
    """The ``headers`` column from flat keys, values and offsets (most messages have
    none: no Python list per row, unlike a list of pairs per message)."""
    offsets = [0]
    keys: list[str] = []
    values: list[str] = []
    for m in messages:
        if m.headers:
            keys.extend(m.headers)
            values.extend(m.headers.values())
        offsets.append(len(keys))
    return pa.MapArray.from_arrays(
        pa.array(offsets, pa.int32()),
        pa.array(keys, pa.string()),
        pa.array(values, pa.string()),
        type=ARROW_READ_SCHEMA[3].type,
    )


def with_text(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Add ``body_text``: the body as a string where it is valid UTF-8, else null."""
    return project(batch, READ_COLUMNS)


def body_text(bodies: pa.Array) -> pa.Array:
    """The bodies as strings where they are valid UTF-8, else null."""
    try:
        return bodies.cast(pa.string())  # validates the whole column at C speed
    except pa.ArrowInvalid:
        return pa.array([text_or_none(b) for b in bodies.to_pylist()], pa.string())


def shipped(batch: pa.RecordBatch, columns: tuple[str, ...]) -> pa.RecordBatch:
    """The columns of a shipped batch (no ``body_text``) that ``columns`` need: the
    body for ``body_text``, no column a query does not read."""
    wanted = set(columns) | ({"body"} if "body_text" in columns else set())
    return batch.select([name for name in batch.schema.names if name in wanted])


def project(batch: pa.RecordBatch, columns: tuple[str, ...]) -> pa.RecordBatch:
    """A batch holding the shipped columns ``columns`` need as the rows of ``columns``
    (in their order), ``body_text`` computed here where it is asked for."""
    arrays = [
        body_text(batch.column("body")) if name == "body_text" else batch.column(name)
        for name in columns
    ]
    schema = pa.schema([ARROW_READ_SCHEMA.field(name) for name in columns])
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


# --- batch read ------------------------------------------------------------------------


@dataclass(frozen=True)
class CursorRange(InputPartition):
    """Browse cursors in ``(after, last]``; ``last`` None = to the end of the queue."""

    after: int | None
    last: int | None


class BrowseReader(DataSourceReader):
    def __init__(self, options: Options, columns: tuple[str, ...] = READ_COLUMNS) -> None:
        self.options = options
        self.columns = columns

    def partitions(self) -> list[CursorRange]:
        return plan_cursor_ranges(self.options)

    def read(self, partition: CursorRange) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        with queues.connect(self.options.url, self.options.token) as client:
            for page in browse_range(client, self.options, partition):
                yield project(to_record_batch(page, text=False), self.columns)


def plan_cursor_ranges(options: Options) -> list[CursorRange]:
    with queues.connect(options.url, options.token) as client:
        first = queues.browse(client, options.queue, after=None, limit=1)
        info = queues.queue_info(client, options.queue)
    ready = int((info.get("stats") or info).get("messages_ready", 0) or 0)
    if not first:
        return [CursorRange(None, None)]
    start = first[0][0] - 1  # ``after`` is exclusive
    parts = max(1, min(options.num_partitions, ready // options.batch_size))
    lane_end = ((first[0][0] >> _CURSOR_POS_BITS) + 1) << _CURSOR_POS_BITS
    bounds = [min(start + (ready * k) // parts, lane_end - 1) for k in range(parts)]
    first_after = None if start < 0 else start
    afters: list[int | None] = [first_after, *bounds[1:]]
    ranges = [CursorRange(afters[k], bounds[k + 1]) for k in range(parts - 1)]
    ranges.append(CursorRange(afters[-1], None))
    return [r for r in ranges if r.last is None or r.after is None or r.last > r.after]


def browse_range(
    client: Client, options: Options, partition: CursorRange
) -> Iterator[list[Delivery]]:
    after = partition.after
    while True:
        page = queues.browse(client, options.queue, after=after, limit=options.batch_size)
        full = len(page) == options.batch_size
        if partition.last is not None:
            page = [(cursor, m) for cursor, m in page if cursor <= partition.last]
        if not page:
            return
        yield [m for _, m in page]
        after = page[-1][0]
        if not full:
            return


# --- batch and streaming write ---------------------------------------------------------


@dataclass
class Published(WriterCommitMessage):
    partition: int
    messages: int


def _column(batch: pa.RecordBatch, name: str) -> list[Any] | None:
    index = batch.schema.get_field_index(name)
    return None if index < 0 else batch.column(index).to_pylist()


Wire = dict[str, object]
"""A message as a publish frame carries it (``quorra.client``'s ``message_map`` shape)."""


def outgoing(batch: pa.RecordBatch, dedup_base: str, first_row: int) -> list[Wire]:
    """The publish messages of one Arrow batch, in wire form; rows numbered from
    ``first_row``. Bodies are views into the batch's buffer (no copy until the frame is
    packed) and no ``Message`` is made per row: this runs once per row written. Without
    a ``dedup_id`` column, no row has an id of its own (its frame's stands for it:
    ``publish_all``)."""
    index = batch.schema.get_field_index("body")
    if index < 0:
        raise ValueError("quorra data source: the DataFrame needs a 'body' column")
    bodies = body_views(batch.column(index))
    headers = _column(batch, "headers")
    priorities = _column(batch, "priority")
    dedup_ids = _column(batch, "dedup_id")
    if headers is None and priorities is None and dedup_ids is None:
        return [{"body": body} for body in bodies]
    messages: list[Wire] = []
    for i, body in enumerate(bodies):
        message: Wire = {"body": body}
        pairs = headers[i] if headers and headers[i] else {}
        if pairs:
            message["headers"] = {str(k): str(v) for k, v in _items(pairs)}
        priority = int(priorities[i] or 0) if priorities else 0
        if priority:
            message["priority"] = priority
        if dedup_ids is not None:
            own = dedup_ids[i] or None
            message["dedup_id"] = own or f"{dedup_base}-{first_row + i}"
        messages.append(message)
    return messages


_OFFSET_TYPES = {
    pa.binary(): np.int32,
    pa.string(): np.int32,
    pa.large_binary(): np.int64,
    pa.large_string(): np.int64,
}


def body_views(column: pa.Array) -> list[bytes | memoryview]:
    """Each row's body as bytes: a view into the column's data buffer for binary and
    string columns (a string column's buffer already holds UTF-8), ``b""`` for null;
    other types (a view's slot, a dictionary) through Python objects."""
    width = _OFFSET_TYPES.get(column.type)
    if width is None:
        return [
            body.encode("utf-8") if isinstance(body, str) else bytes(body or b"")
            for body in column.to_pylist()
        ]
    _, offset_buffer, data_buffer = column.buffers()
    offsets = np.frombuffer(offset_buffer, dtype=width)
    bounds = offsets[column.offset : column.offset + len(column) + 1].tolist()
    data = memoryview(data_buffer if data_buffer is not None else b"")
    views: list[bytes | memoryview] = [data[a:b] for a, b in itertools.pairwise(bounds)]
    if column.null_count:
        for i in np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False)).tolist():
            views[i] = b""
    return views


def _items(
    pairs: dict[object, object] | list[tuple[object, object]],
) -> list[tuple[object, object]]:
    """A map column's value: a dict, or Arrow's list of (key, value) pairs."""
    return list(pairs.items()) if isinstance(pairs, dict) else list(pairs)


def packed_bodies(column: pa.Array) -> tuple[memoryview, list[int]] | None:
    """A column of bodies as the MessagePack of each row's message ``{"body": ...}``, one
    after another in one buffer (``BODY_MAP_HEAD``, the length, the body: the bodies of
    ``body_views``), and where each row's ends (``n + 1`` offsets from 0); made at C
    speed, no Python object per row. ``None`` for a type ``body_views`` reads through
    Python objects."""
    if column.type not in _OFFSET_TYPES:
        return None
    n = len(column)
    if column.null_count:
        column = pc.fill_null(column, b"" if column.type in _BINARY_TYPES else "")
    column = column.cast(pa.large_binary() if column.type in _LARGE_TYPES else pa.binary())
    _, offset_buffer, _ = column.buffers()
    width = _OFFSET_TYPES[column.type]
    offsets = np.frombuffer(offset_buffer, dtype=width)[column.offset : column.offset + n + 1]
    heads = np.empty((n, _HEAD_BYTES), np.uint8)
    heads[:, : len(BODY_MAP_HEAD)] = np.frombuffer(BODY_MAP_HEAD, np.uint8)
    heads[:, len(BODY_MAP_HEAD) :] = np.diff(offsets).astype(">u4").view(np.uint8).reshape(n, 4)
    head_offsets = np.arange(0, _HEAD_BYTES * (n + 1), _HEAD_BYTES, dtype=width)
    head_column = pa.Array.from_buffers(
        column.type, n, [None, pa.py_buffer(head_offsets), pa.py_buffer(heads)]
    )
    joined = pc.binary_join_element_wise(head_column, column, pa.scalar(b"", column.type))
    ends = (offsets - offsets[0] + head_offsets).tolist()
    data = joined.buffers()[2]
    return memoryview(data if data is not None else b"")[: ends[-1]], ends


def bodies_alone(batch: pa.RecordBatch) -> bool:
    """Whether each row's message is its body alone: a ``body`` column, and none of the
    other columns a message takes from (``WRITE_COLUMNS``)."""
    names = set(batch.schema.names)
    return "body" in names and names.isdisjoint(WRITE_COLUMNS[1:])


_HEAD_BYTES = len(BODY_MAP_HEAD) + 4
_BINARY_TYPES = (pa.binary(), pa.large_binary())
_LARGE_TYPES = (pa.large_binary(), pa.large_string())


def publish_all(options: Options, batches: Iterator[pa.RecordBatch], dedup_base: str) -> int:
    """Publish every row on one stream, ``batchSize`` per frame, as many frames
    unconfirmed as the server's window holds; returns the row count once every frame is
    confirmed (``PublishFailed`` if one was refused). A frame of rows without ids of
    their own has the id ``<dedup_base>-f<its first row>``. Rows that are their bodies
    alone (a DataFrame of a ``body`` column only) are packed a batch at a time
    (``packed_bodies``); frames are cut at the same rows either way."""
    from pyspark import TaskContext

    context = TaskContext.get()
    fail_after = options.fail_first_attempt_after_rows
    if context is None or context.attemptNumber() > 0:
        fail_after = None
    size = options.batch_size
    queued = 0
    sent = 0
    pending: list[Wire] = []
    pieces: list[memoryview] = []
    with Stream(options.url, options.token, options.queue) as stream:

        def sent_rows(count: int) -> None:
            nonlocal sent
            sent += count
            if fail_after is not None and sent >= fail_after:
                stream.flush()
                raise RuntimeError(f"injected failure after {fail_after} rows (first attempt)")

        def send(chunk: list[Wire]) -> None:
            framed = "dedup_id" not in chunk[0]
            stream.publish_maps(chunk, dedup_id=f"{dedup_base}-f{sent}" if framed else None)
            sent_rows(len(chunk))

        def send_packed() -> None:
            count = queued - sent
            stream.publish_packed(count, pieces, dedup_id=f"{dedup_base}-f{sent}")
            pieces.clear()
            sent_rows(count)

        for batch in batches:
            packed = packed_bodies(batch.column("body")) if bodies_alone(batch) else None
            if packed is None:
                pending.extend(outgoing(batch, dedup_base, queued))
                queued += batch.num_rows
                while len(pending) >= size:
                    chunk, pending = pending[:size], pending[size:]
                    send(chunk)
                continue
            data, ends = packed
            at = 0
            while at < batch.num_rows:
                take = min(size - (queued - sent), batch.num_rows - at)
                pieces.append(data[ends[at] : ends[at + take]])
                queued += take
                at += take
                if queued - sent == size:
                    send_packed()
        if pending:
            chunk, pending = pending, []
            send(chunk)
        if pieces:
            send_packed()
        stream.flush()
    return queued


class PublishWriter(DataSourceArrowWriter):
    def __init__(self, options: Options, schema: StructType) -> None:
        if "body" not in schema.fieldNames():
            raise ValueError("quorra data source: the DataFrame needs a 'body' column")
        self.options = options
        self.prefix = options.dedup_prefix or uuid.uuid4().hex[:16]

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        from pyspark import TaskContext

        context = TaskContext.get()
        partition = context.partitionId() if context else 0
        count = publish_all(self.options, iterator, f"{self.prefix}-{partition}")
        return Published(partition, count)


class PublishStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: Options, schema: StructType) -> None:
        if "body" not in schema.fieldNames():
            raise ValueError("quorra data source: the DataFrame needs a 'body' column")
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None
        query = context.getLocalProperty("sql.streaming.queryId") or "query"
        batch = context.getLocalProperty("streaming.sql.batchId") or "0"
        partition = context.partitionId()
        base = f"{self.options.dedup_prefix or query}-{batch}-{partition}"
        return Published(partition, publish_all(self.options, iterator, base))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        return None

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        return None


def register(spark: SparkSession) -> None:
    """Register the data source with a SparkSession under the name ``quorra``."""
    spark.dataSource.register(QuorraDataSource)
