"""The ``quorra`` data source in local Spark against a real server on 127.0.0.1."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from pipeline import queues
from pipeline.queues import pending as queue_pending
from quorra.client import Client

pytestmark = [pytest.mark.spark, pytest.mark.integration]

DRAIN_TIMEOUT_S = 180.0


def read_queue(spark: Any, options: dict[str, str], **extra: str) -> Any:
    return spark.read.format("quorra").options(**options, **extra).load()


def ready(client: Client, queue: str) -> int:
    return int(queues.queue_info(client, queue)["stats"]["messages_ready"])


def test_round_trip_of_25k_rows_keeps_content(
    spark: Any, client: Client, options: dict[str, str]
) -> None:
    rows = 25_000  # 25 publish frames and browse pages of 1,000, over two partitions
    client.call("PATCH", f"/queues/{options['queue']}", {"max_length": None})
    source = spark.range(0, rows, numPartitions=2).selectExpr(
        "cast(concat('row-', cast(id as string), '-', repeat(chr(65 + id % 26), id % 40)) "
        "as binary) as body",
        "map('n', cast(id as string)) as headers",
    )
    source.write.format("quorra").options(**options).mode("append").save()
    assert ready(client, options["queue"]) == rows

    back = read_queue(spark, options, numPartitions="2")
    got = back.selectExpr("id", "body", "body_text", "headers['n'] as n", "delivery_count")
    got = got.cache()
    try:
        assert got.count() == rows
        assert got.select("id").distinct().count() == rows
        expected = source.selectExpr("body", "headers['n'] as n")
        assert expected.exceptAll(got.select("body", "n")).count() == 0
        assert got.select("body", "n").exceptAll(expected).count() == 0
        assert got.where("body_text is null or cast(body as string) != body_text").count() == 0
        assert got.where("delivery_count != 0").count() == 0
    finally:
        got.unpersist()
    assert ready(client, options["queue"]) == rows  # browsing consumed nothing


def test_retried_write_task_does_not_duplicate(
    spark: Any, client: Client, options: dict[str, str]
) -> None:
    rows = 2_000
    df = spark.range(0, rows, numPartitions=2).selectExpr("cast(id as string) as body")
    # The first attempt of each task fails after publishing 300 rows; the retry
    # publishes all of its rows again with the same derived dedup ids.
    df.write.format("quorra").options(
        **options, batchSize="100", testFailFirstAttemptAfterRows="300"
    ).mode("append").save()
    assert ready(client, options["queue"]) == rows
    bodies = [r.body_text for r in read_queue(spark, options).select("body_text").collect()]
    assert sorted(int(b) for b in bodies) == list(range(rows))


def test_retried_write_of_frames_across_arrow_batches_does_not_duplicate(
    spark: Any, client: Client, options: dict[str, str]
) -> None:
    rows = 2_000
    # Arrow batches of 70 rows into frames of 100: most frames hold rows of two batches,
    # and the retry must cut them at the same rows to give them the same ids.
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "70")
    try:
        df = spark.range(0, rows, numPartitions=2).selectExpr("cast(id as string) as body")
        df.write.format("quorra").options(
            **options, batchSize="100", testFailFirstAttemptAfterRows="250"
        ).mode("append").save()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert ready(client, options["queue"]) == rows
    bodies = [r.body_text for r in read_queue(spark, options).select("body_text").collect()]
    assert sorted(int(b) for b in bodies) == list(range(rows))


def run_stream_until_drained(
    client: Client, queue: str, query: Any, timeout_s: float = DRAIN_TIMEOUT_S
) -> None:
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if query.exception() is not None or not query.isActive:
                return
            if queue_pending(client, queue) == 0:
                return
            time.sleep(0.2)
        raise AssertionError(f"stream did not drain {queue} in {timeout_s}s")
    finally:
        query.stop()


def test_failed_micro_batch_is_replayed_and_output_is_exactly_once(
    spark: Any, client: Client, options: dict[str, str], tmp_path: Path
) -> None:
    queue, total = options["queue"], 3_000
    for start in range(0, total, 1000):
        client.publish(queue, [b"m-%d" % i for i in range(start, start + 1000)])
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    failed_batch: dict[str, list[int]] = {}

    def sink(df: Any, batch_id: int) -> None:
        if batch_id == 1 and not failed_batch:
            failed_batch["ids"] = sorted(r.id for r in df.select("id").collect())
            raise RuntimeError("injected failure of micro-batch 1")
        df.write.mode("overwrite").parquet(str(out / f"batch={batch_id}"))

    stream_options = {**options, "maxMessagesPerTrigger": "1000", "leaseMs": "4000"}

    def start() -> Any:
        return (
            spark.readStream.format("quorra")
            .options(**stream_options)
            .load()
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="100 milliseconds")
            .start()
        )

    first = start()
    run_stream_until_drained(client, queue, first)
    assert first.exception() is not None and "injected failure" in str(first.exception())
    assert len(failed_batch["ids"]) == 1000

    second = start()
    run_stream_until_drained(client, queue, second)
    assert second.exception() is None
    assert queue_pending(client, queue) == 0

    result = spark.read.parquet(str(out))
    ids = [r.id for r in result.select("id").collect()]
    assert len(ids) == total and len(set(ids)) == total
    replayed = sorted(r.id for r in spark.read.parquet(str(out / "batch=1")).collect())
    assert replayed == failed_batch["ids"]
    bodies = sorted(r.body_text for r in result.select("body_text").collect())
    assert bodies == sorted(f"m-{i}" for i in range(total))


def test_a_stream_read_with_a_schema_of_some_columns_gets_those_and_acks_all(
    spark: Any, client: Client, options: dict[str, str], tmp_path: Path
) -> None:
    queue, total = options["queue"], 2_000
    client.publish(queue, [b"s-%d" % i for i in range(1000)])
    client.publish(queue, [b"s-%d" % i for i in range(1000, total)])
    query = (
        spark.readStream.format("quorra")
        .options(**options, maxMessagesPerTrigger="1000")
        .schema("body_text string, id long")
        .load()
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    run_stream_until_drained(client, queue, query)
    assert query.exception() is None
    result = spark.read.parquet(str(tmp_path / "out"))
    assert result.columns == ["body_text", "id"]
    assert sorted(r.body_text for r in result.collect()) == sorted(f"s-{i}" for i in range(total))
    narrow = spark.read.format("quorra").options(**options).schema("id long, priority int")
    assert narrow.load().columns == ["id", "priority"]


def test_stream_copy_between_queues_is_exactly_once(
    spark: Any, client: Client, options: dict[str, str], tmp_path: Path
) -> None:
    source_queue, total = options["queue"], 2_000
    target_queue = f"{source_queue}-copy"
    queues.create_queue(client, target_queue)
    client.publish(source_queue, [b"c-%d" % i for i in range(1000)])
    client.publish(source_queue, [b"c-%d" % i for i in range(1000, total)])
    query = (
        spark.readStream.format("quorra")
        .options(**options, maxMessagesPerTrigger="1000")
        .load()
        .selectExpr("body", "map('copied-from', cast(id as string)) as headers")
        .writeStream.format("quorra")
        .options(**{**options, "queue": target_queue})
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    run_stream_until_drained(client, source_queue, query)
    assert query.exception() is None
    copied = read_queue(spark, {**options, "queue": target_queue}).collect()
    assert sorted(r.body_text for r in copied) == sorted(f"c-{i}" for i in range(total))
    assert all("copied-from" in r.headers for r in copied)


def test_demo_writes_streams_and_counts(
    spark: Any, quorra_server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from pipeline.cli import main

    argv = ["demo", "--server", quorra_server.url, "--token", quorra_server.token]
    argv += ["--queue", "pipeline-demo-test", "--rows", "2000", "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    counts = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert counts["written"] == counts["streamed"] == counts["streamed_distinct"] == 2000
    assert spark.read.parquet(str(tmp_path / "out")).count() == 2000
