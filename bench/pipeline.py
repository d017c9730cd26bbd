"""Rows per second of Spark's batch write and streaming read through Quorra's data source.

N rows of 1 KiB (default 1,000,000) through the ``quorra`` data source in local mode,
next to stream and REST publish and consume rates measured on the same server in the
same run.

    quorra bench pipeline [--json] [--quick] [--rows N] [--master local[*]]
                          [--server URL --token T]

Without ``--server`` it starts a throwaway local server (``quorra serve`` on 127.0.0.1).
Messages per micro-batch: ``--trigger-rows`` (40,000: the largest whose credit of two
micro-batches the reader's connections can hold, 8 x the server's ``prefetch_max``); Spark
partitions: the number of cores. Per-batch progress goes to stderr. ``--quick``: 2,000
rows, 1 s REST and stream phases, one partition, micro-batches of 1,000.

JSON keys (``JSON_KEYS``), the headline being ``write_rows_per_s``; figures are rows or
messages per second of wall time:

* ``bench``: "pipeline";
* ``machine``: ``bench.machine_info()`` at the start (load average, CPU governor);
* ``rows``: rows written and read (``--rows``);
* ``body_bytes``: bytes per row's body (1024);
* ``master``: the Spark master (``--master``);
* ``stream_publish_msgs_per_s``: ``quorra bench rest``'s stream publish phase
  (``bench/_stream_load.py`` through ``bench.rest.run_phase``: 2 load-generator processes,
  4 connections in all, frames of 100, a window of 1,000, ``--rest-seconds``) against
  the same server: what plain ``quorra.client`` streams reach;
* ``stream_consume_msgs_per_s``: its stream consume phase (the same connections, a
  prefetch of 1,000, one ack frame per delivery frame) draining what that published;
* ``rest_publish_msgs_per_s``: ``quorra bench rest``'s publish phase
  (``bench.rest.run_phase``: 2 load-generator processes x 4 clients, batches of 100,
  JSON, ``--rest-seconds``) against the same server;
* ``rest_consume_msgs_per_s``: its consume phase, the same way;
* ``rest_single_client_publish_msgs_per_s``: one HTTP client publishing the N rows in
  batches of 1000 (MessagePack), each waiting for its confirm;
* ``rest_single_client_consume_msgs_per_s``: one client receiving 1000 at a time and
  acking each batch (the REST path a user's script takes);
* ``spark_session_start_s``: time to start the SparkSession;
* ``write_rows_per_s``: the headline: ``df.write.format("quorra")`` of N generated rows,
  from job submission to the last confirm (tasks included; the SparkSession is up and
  warm: a write of ``WARM_UP_FRACTION`` of N rows to another queue and a streaming read
  of them ran before, so the JVM has compiled both paths and the Python workers run,
  as in a pipeline that runs for more than a minute);
* ``stream_read_rows_per_s``: a streaming query (``quorra`` source -> ``noop`` sink)
  from ``start()`` until the queue holds nothing ready or leased, i.e. every row was
  processed by Spark *and* acked after its micro-batch committed (the query's start-up
  included);
* ``stream_read_s``: that time;
* ``stream_rows_through_spark_s``: the time until Spark had processed every row (acks
  of the last batches still in flight);
* ``stream_trigger_rows``: messages per micro-batch (``maxMessagesPerTrigger``);
* ``stream_batch_ms``: the median of each part of a micro-batch's ``durationMs``
  (Spark's progress: ``latestOffset`` waits for deliveries, ``walCommit`` writes the
  offset, ``addBatch`` runs the tasks, ...), over the batches of at least half a trigger;
* ``cpu_us_per_row``: CPU microseconds per message or row of each phase
  (``stream_publish``, ``stream_consume``, ``write``, ``stream_read``), by process kind
  (``spark_jvm``, ``spark_python``: Spark's Python workers and its streaming source
  runner, ``server``, ``bench``: this process and its load generators, whose start-up
  counts in the stream phases) and in ``total``, from ``/proc`` (``bench/_cpu_tree.py``;
  the server's only when the bench started it): on a machine shared with other work the
  rates move with the load, these much less, and on 2 cores a rate is about 2 s of CPU
  over ``total``, so they say where a ratio is lost;
* ``write_vs_stream_publish``: ``write_rows_per_s`` / ``stream_publish_msgs_per_s``
  (target 0.8);
* ``stream_read_vs_stream_consume``: ``stream_read_rows_per_s`` /
  ``stream_consume_msgs_per_s`` (target 0.8);
* ``write_vs_rest_publish``: ``write_rows_per_s`` / ``rest_publish_msgs_per_s``;
* ``write_vs_rest_single_client_publish``: the same against the single client;
* ``stream_read_vs_rest_consume``: ``stream_read_rows_per_s`` / ``rest_consume_msgs_per_s``;
* ``stream_read_vs_rest_single_client_consume``: the same against the single client.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import _cpu_tree
from pipeline import queues
from quorra.client import Client

JSON_KEYS = (
    "bench",
    "machine",
    "rows",
    "body_bytes",
    "master",
    "stream_publish_msgs_per_s",
    "stream_consume_msgs_per_s",
    "rest_publish_msgs_per_s",
    "rest_consume_msgs_per_s",
    "rest_single_client_publish_msgs_per_s",
    "rest_single_client_consume_msgs_per_s",
    "spark_session_start_s",
    "write_rows_per_s",
    "stream_read_rows_per_s",
    "stream_read_s",
    "stream_rows_through_spark_s",
    "stream_trigger_rows",
    "stream_batch_ms",
    "cpu_us_per_row",
    "write_vs_stream_publish",
    "stream_read_vs_stream_consume",
    "write_vs_rest_publish",
    "write_vs_rest_single_client_publish",
    "stream_read_vs_rest_consume",
    "stream_read_vs_rest_single_client_consume",
)
HEADLINE_KEY = "write_rows_per_s"
QUICK_ROWS = 2_000
QUICK_REST_SECONDS = 1.0
QUICK_TRIGGER_ROWS = 1_000
BODY_BYTES = 1024
REST_BATCH = 1000
TRIGGER_ROWS = 40_000
"""Spark's JVM spends a fixed time per micro-batch (offset and commit logs, planning,
task set-up). On 300,000 rows in one JVM, 40,000 rows per trigger first and 20,000 after
(warmer): 28.2 against 29.9 us of JVM CPU per row, 62.5 against 66.4 in all (load 10-15):
a small gain. Past 40,000 the reader's credit (two micro-batches, at most ``STREAMS_MAX``
connections of ``prefetch_max``) no longer holds the next batch while Spark runs one, and
triggers wait for deliveries."""
STREAM_SHAPE = {"clients": 2, "window": 1000, "frame_messages": 100, "prefetch": 1000}
"""``quorra bench rest``'s stream phases: per generator process (2 of them)."""
STREAM_PROCS = 2
WARM_UP_FRACTION = 0.1


def _parser() -> argparse.ArgumentParser:
    import bench

    p = bench.parser("pipeline", __doc__)
    p.add_argument("--rows", type=int, default=1_000_000, help="rows to write and read")
    p.add_argument("--master", default="local[*]", help="Spark master")
    p.add_argument("--server", help="server URL (default: start a local one)")
    p.add_argument("--token", default="", help="token for --server")
    p.add_argument("--partitions", type=int, default=0, help="Spark partitions (0: cores)")
    p.add_argument("--rest-seconds", type=float, default=10.0, help="per bench-rest phase")
    p.add_argument(
        "--trigger-rows", type=int, default=TRIGGER_ROWS, help="messages per micro-batch"
    )
    return p


def rest_publish(client: Client, queue: str, rows: int) -> float:
    body = b"x" * BODY_BYTES
    started = time.perf_counter()
    for start in range(0, rows, REST_BATCH):
        client.publish(queue, [body] * min(REST_BATCH, rows - start))
    return rows / (time.perf_counter() - started)


def rest_consume(client: Client, queue: str, rows: int) -> float:
    started = time.perf_counter()
    consumed = 0
    while consumed < rows:
        messages = client.receive(queue, max_messages=REST_BATCH, wait_ms=1000, lease_ms=60_000)
        if not messages:
            raise RuntimeError(f"queue {queue} ran dry after {consumed} of {rows}")
        client.ack(queue, [m.receipt for m in messages])
        consumed += len(messages)
    return rows / (time.perf_counter() - started)


class _RemoteServer:
    """A server ``bench.rest.run_phase`` measures from outside: its CPU time is not
    known here (the server may be on another machine)."""

    def cpu_s(self) -> float:
        return 0.0


def rest_bench_rates(
    client: Client, url: str, token: str, seconds: float, start_delay_s: float
) -> dict[str, float]:
    """``quorra bench rest``'s publish and consume phases (its own load generators:
    2 processes x 4 clients, batches of 100, JSON) against this server."""
    from bench import rest

    queues.create_queue(client, "bench-batch")
    base = rest.server_spec(url, token, seconds) | {"queue": "bench-batch"}
    base |= {"batch": 100, "clients": 4}
    server = _RemoteServer()
    publish = rest.run_phase(server, dict(base, kind="publish"), 2, start_delay_s)
    consume = rest.run_phase(server, dict(base, kind="consume"), 2, start_delay_s)
    return {"publish": publish["msgs_per_s"], "consume": consume["msgs_per_s"]}


def stream_bench_rates(
    client: Client, url: str, token: str, seconds: float, start_delay_s: float
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """``quorra bench rest``'s stream publish and consume phases (its generators,
    ``bench/_stream_load.py``: 4 connections, window 1,000, prefetch 1,000) here; their
    rates and CPU per message (``bench._cpu_tree``)."""
    from bench import rest
    from bench._stream_load import generator

    queues.create_queue(client, "bench-stream")
    base = rest.server_spec(url, token, seconds) | {"queue": "bench-stream"} | STREAM_SHAPE
    server = _RemoteServer()
    rates, cpu = {}, {}
    for kind in ("stream_publish", "stream_consume"):
        spec = dict(base, kind=kind)
        before = _cpu_tree.snapshot()
        phase = rest.run_phase(server, spec, STREAM_PROCS, start_delay_s, target=generator)
        cpu[kind] = _cpu_tree.cpu_us_per_row(before, _cpu_tree.snapshot(), phase["messages"])
        rates[kind] = phase["msgs_per_s"]
    return rates, cpu


ROW_NUMBER_DIGITS = 16
WRITE_BODY = (
    f"concat(X'{(b'x' * (BODY_BYTES - ROW_NUMBER_DIGITS)).hex()}', "
    f"cast(lpad(cast(id as string), {ROW_NUMBER_DIGITS}, '0') as binary)) as body"
)
"""The written rows' bodies: ``BODY_BYTES`` each, a fixed part and the row's number, so
that every body differs. Spark builds them by copying; built as the row number padded
to ``BODY_BYTES`` (``rpad``), they cost Spark's JVM 8.6-14 us of CPU per row into a
``noop`` sink, against 0.7-1.6 us this way, and the write measured Spark's string
functions more than the connector."""


def spark_write(spark: Any, options: dict[str, str], rows: int, partitions: int) -> float:
    df = spark.range(0, rows, numPartitions=partitions).selectExpr(WRITE_BODY)
    started = time.perf_counter()
    df.write.format("quorra").options(**options).mode("append").save()
    return rows / (time.perf_counter() - started)


def spark_stream_read(
    spark: Any, options: dict[str, str], rows: int, checkpoint: Path, trigger_rows: int
) -> tuple[float, float, dict[str, int]]:
    """Seconds until every row went through Spark, and until the last one was acked;
    the median parts of a micro-batch's time (ms)."""
    started = time.perf_counter()
    query = (
        spark.readStream.format("quorra")
        .options(**options, maxMessagesPerTrigger=str(trigger_rows))
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    try:
        # Stats are not free on the server (they walk the queue): poll Spark's progress
        # until every row went through, then the queue until the last batch is acked.
        seen: dict[int, int] = {}
        while rows_through(query, seen) < rows:
            if query.exception() is not None:
                raise RuntimeError(f"stream failed: {query.exception()}")
            time.sleep(0.1)
        processed_s = time.perf_counter() - started
        with queues.connect(options["url"], options["token"]) as client:
            while queues.pending(client, options["queue"]) > 0:
                time.sleep(0.1)
        elapsed = time.perf_counter() - started
        progress = query.recentProgress
        processed = sum(int(p["numInputRows"]) for p in progress)
        for p in progress:
            print(
                f"stream batch {p['batchId']} at {p['timestamp']}: {p['numInputRows']} rows, "
                f"{p['durationMs']}",
                file=sys.stderr,
            )
    finally:
        query.stop()
    if processed < rows:
        raise RuntimeError(f"stream processed {processed} of {rows} rows")
    return processed_s, elapsed, batch_parts_ms(progress, trigger_rows)


def rows_through(query: Any, seen: dict[int, int]) -> int:
    """Rows Spark has processed, kept by batch id in ``seen``. Each poll fetches the last
    progress only (one JSON over py4j): all recent ones (up to 100, several KB each, on
    the CPUs the measured query runs on) only when a batch went by between two polls."""
    last = query.lastProgress
    if last is None:
        return sum(seen.values())
    batch = int(last["batchId"])
    progress = query.recentProgress if batch > 0 and batch - 1 not in seen else [last]
    for p in progress:
        seen[int(p["batchId"])] = int(p["numInputRows"])
    return sum(seen.values())


def warm_up(
    spark: Any, options: dict[str, str], rows: int, partitions: int, trigger_rows: int
) -> None:
    """Write ``rows`` to a queue of their own and stream them back, unmeasured."""
    warm = dict(options, queue=options["queue"] + "-warm-up")
    with queues.connect(options["url"], options["token"]) as client:
        queues.create_queue(client, warm["queue"])
    spark_write(spark, warm, rows, partitions)
    with tempfile.TemporaryDirectory(prefix="quorra-bench-") as tmp:
        spark_stream_read(spark, warm, rows, Path(tmp) / "ck", trigger_rows)


def batch_parts_ms(progress: list[Any], trigger_rows: int) -> dict[str, int]:
    """The median of each ``durationMs`` part over the batches of at least half a
    trigger (the first and last, partly filled, would skew it)."""
    full = [p["durationMs"] for p in progress if int(p["numInputRows"]) * 2 >= trigger_rows]
    parts = sorted({k for d in full for k in d})
    return {k: round(statistics.median(int(d.get(k, 0)) for d in full)) for k in parts}


def measure(url: str, token: str, args: argparse.Namespace) -> dict[str, Any]:
    import os

    from bench import rest
    from pipeline.session import spark_session

    rows = args.rows
    partitions = args.partitions or os.cpu_count() or 2
    figures: dict[str, Any] = {"rows": rows, "body_bytes": BODY_BYTES, "master": args.master}
    with queues.connect(url, token) as client:
        queues.create_queue(client, "bench-rest")
        queues.create_queue(client, "bench-spark")
        delay_s = rest.QUICK_START_DELAY_S if args.quick else rest.START_DELAY_S
        streams, cpu = stream_bench_rates(client, url, token, args.rest_seconds, delay_s)
        figures["stream_publish_msgs_per_s"] = round(streams["stream_publish"])
        figures["stream_consume_msgs_per_s"] = round(streams["stream_consume"])
        rates = rest_bench_rates(client, url, token, args.rest_seconds, delay_s)
        figures["rest_publish_msgs_per_s"] = round(rates["publish"])
        figures["rest_consume_msgs_per_s"] = round(rates["consume"])
        single_publish = rest_publish(client, "bench-rest", rows)
        figures["rest_single_client_publish_msgs_per_s"] = round(single_publish)
        single_consume = rest_consume(client, "bench-rest", rows)
        figures["rest_single_client_consume_msgs_per_s"] = round(single_consume)
    started = time.perf_counter()
    spark = spark_session(args.master, "quorra-bench-pipeline")
    spark.range(1).count()
    figures["spark_session_start_s"] = round(time.perf_counter() - started, 2)
    options = {"url": url, "token": token, "queue": "bench-spark"}
    options["numPartitions"] = str(partitions)
    warm_up(spark, options, max(1, int(rows * WARM_UP_FRACTION)), partitions, args.trigger_rows)
    before = _cpu_tree.snapshot()
    figures["write_rows_per_s"] = round(spark_write(spark, options, rows, partitions))
    cpu["write"] = _cpu_tree.cpu_us_per_row(before, _cpu_tree.snapshot(), rows)
    with tempfile.TemporaryDirectory(prefix="quorra-bench-") as tmp:
        before = _cpu_tree.snapshot()
        processed_s, elapsed_s, parts_ms = spark_stream_read(
            spark, options, rows, Path(tmp) / "ck", args.trigger_rows
        )
        cpu["stream_read"] = _cpu_tree.cpu_us_per_row(before, _cpu_tree.snapshot(), rows)
    figures["cpu_us_per_row"] = cpu
    figures["stream_read_rows_per_s"] = round(rows / elapsed_s)
    figures["stream_read_s"] = round(elapsed_s, 2)
    figures["stream_rows_through_spark_s"] = round(processed_s, 2)
    figures["stream_trigger_rows"] = args.trigger_rows
    figures["stream_batch_ms"] = parts_ms
    figures["write_vs_stream_publish"] = round(
        figures["write_rows_per_s"] / max(1, figures["stream_publish_msgs_per_s"]), 4
    )
    figures["stream_read_vs_stream_consume"] = round(
        figures["stream_read_rows_per_s"] / max(1, figures["stream_consume_msgs_per_s"]), 4
    )
    for spark_key, rest_key in (
        ("write_rows_per_s", "publish_msgs_per_s"),
        ("stream_read_rows_per_s", "consume_msgs_per_s"),
    ):
        for prefix in ("rest_", "rest_single_client_"):
            ratio = figures[spark_key] / max(1, figures[prefix + rest_key])
            figures[f"{spark_key.split('_rows')[0]}_vs_{prefix}{rest_key.split('_msgs')[0]}"] = (
                round(ratio, 4)
            )
    spark.stop()
    return figures


def main(argv: list[str]) -> int:
    import bench
    from pipeline.localserver import local_server

    args = _parser().parse_args(argv)
    if args.quick:
        args.rows, args.rest_seconds = QUICK_ROWS, QUICK_REST_SECONDS
        args.trigger_rows = QUICK_TRIGGER_ROWS
        args.partitions = args.partitions or 1  # one Python worker to start, not one per core
    result = bench.header("pipeline")
    if args.server:
        result |= measure(args.server, args.token, args)
    else:
        with local_server() as server:
            result |= measure(server.url, server.token, args)
    print(json.dumps(result, indent=None if args.json else 2))
    return 0
