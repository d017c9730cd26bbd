"""Spark jobs over Quorra queues: write a generated dataset, stream a queue into Parquet.

``stream_to_parquet`` runs a streaming query (``quorra`` source -> Parquet file sink,
exactly-once per micro-batch) until the queue holds nothing ready or leased for
``idle_s``: the reader acks a batch at the trigger after it commits, so "nothing leased"
means every row is in the sink and settled.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline import queues

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

TRIGGER = "100 milliseconds"
POLL_S = 0.5
"""Stats walk the queue on the server: poll them gently."""


@dataclass(frozen=True)
class StreamRun:
    seconds: float
    batches: int


def generated_dataset(
    spark: SparkSession, rows: int, body_bytes: int = 64, partitions: int = 4
) -> DataFrame:
    """Rows ``seq`` 0..rows-1 with a text body of ``body_bytes`` (``seq`` padded with 'x')
    and a header carrying the row number."""
    return spark.range(0, rows, numPartitions=partitions).selectExpr(
        "id as seq",
        f"rpad(concat('row-', cast(id as string), '-'), {body_bytes}, 'x') as body",
        "map('seq', cast(id as string)) as headers",
    )


def write_queue(df: DataFrame, options: dict[str, str]) -> None:
    df.select("body", "headers").write.format("quorra").options(**options).mode("append").save()


def stream_to_parquet(
    spark: SparkSession,
    options: dict[str, str],
    out: Path,
    checkpoint: Path,
    timeout_s: float = 600.0,
    idle_s: float = 0.5,
) -> StreamRun:
    """Consume the queue into Parquet at ``out`` until it is drained and settled."""
    started = time.monotonic()
    reader = spark.readStream.format("quorra").options(**options).load()
    query = (
        reader.writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime=TRIGGER)
        .start()
    )
    idle_since: float | None = None
    try:
        with queues.connect(options["url"], options["token"]) as client:
            while time.monotonic() - started < timeout_s:
                if query.exception() is not None:
                    raise RuntimeError(f"streaming query failed: {query.exception()}")
                if queues.pending(client, options["queue"]) == 0:
                    idle_since = idle_since or time.monotonic()
                    if time.monotonic() - idle_since >= idle_s:
                        break
                else:
                    idle_since = None
                time.sleep(POLL_S)
            else:
                raise TimeoutError(f"queue not drained in {timeout_s}s")
        batches = int(query.lastProgress["batchId"]) + 1 if query.lastProgress else 0
    finally:
        query.stop()
    return StreamRun(time.monotonic() - started, batches)
