"""pipeline: moving queue data between Quorra and Spark, and queue analytics.

Modules
-------
``source``      the ``quorra`` PySpark data source: batch read (browse), batch write,
                streaming write; ``register(spark)`` adds it to a session
``streaming``   its streaming read (leases, acks on Spark's commit; design in its docstring)
``options``     the data source's options (url, token, queue, batchSize, leaseMs,
                maxMessagesPerTrigger, waitMs, numPartitions, dedupPrefix, ...)
``queues``      queue definitions, stats, browse and history through ``quorra.client``
                (messages move on its streams: ``source``, ``streaming``)
``session``     a SparkSession with the source registered (``local[*]`` or any master)
``report``      ``quorra pipeline report``: per-queue analytics -> Parquet + JSON summary
``jobs``        the demo's jobs: write a generated dataset, stream a queue into Parquet
``cli``         ``quorra pipeline report|demo``
``localserver`` a throwaway ``quorra serve`` on 127.0.0.1 (demo, tests, bench)

Use from PySpark::

    from pipeline.session import spark_session
    spark = spark_session("local[*]")       # or: pipeline.source.register(spark)
    opts = {"url": "http://127.0.0.1:8000", "token": TOKEN, "queue": "orders"}
    df = spark.read.format("quorra").options(**opts).load()           # browse
    df.select("body").write.format("quorra").options(**opts).mode("append").save()
    stream = spark.readStream.format("quorra").options(**opts).load()  # consume

Read schema: ``id long, body binary, body_text string (null unless UTF-8),
headers map<string,string>, priority int, delivery_count int, published_at timestamp``.
A query may read fewer of them by giving a schema of some (``spark.readStream
.format("quorra").schema("id long, body binary")``, any order, the same types): the
reader then builds and ships only those (and ``body`` for ``body_text``), so Spark's JVM
converts no column the query does not use; old queries, without a schema, are unchanged.
Write columns: ``body`` (binary or string, required), ``headers`` (map), ``priority``
(int), ``dedup_id`` (string). Without a ``dedup_id`` column each publish frame gets one
id derived from job/batch, partition and its first row (the frame's, for all its rows:
a retried task resends the same frames); with one, each row keeps its own (derived from
job/batch, partition and row when null).

The report summary (what the dashboard shows on a queue's page)
----------------------------------------------------------------
``quorra pipeline report --out DIR`` writes ``DIR/summary.json`` (all queues:
``{"generated_at_ms": int, "queues": {name: <queue summary>}}``) and, per queue,
``DIR/<queue>/summary.json`` holding one *queue summary*::

    {
      "queue": "orders",
      "generated_at_ms": 1763790000000,
      "throughput": {"windows": 2,
                     "mean_published_per_s": 75.0, "peak_published_per_s": 100.0,
                     "mean_delivered_per_s": 60.0, "peak_delivered_per_s": 80.0,
                     "mean_acked_per_s": 57.5, "peak_acked_per_s": 70.0,
                     "mean_log_entries_per_s": 50.0},
      "time_queued_ms": {"consumed": {"count": 10, "p50": 550.0, "p95": 955.0, "max": 1000.0},
                         "ready": {"count": 2, "p50": 3500.0, "p95": 4850.0, "max": 5000.0}},
      "redelivery_rate": 0.2,            # share of deliveries that were not final
      "dead_letter_rate": 0.006667,      # dead_lettered / published
      "compaction": {"runs": 2, "bytes_reclaimed_total": 5000000,
                     "bytes_reclaimed_per_run_mean": 2500000.0,
                     "reclaimed_fraction": 0.416667,          # reclaimed / bytes before
                     "live_dead_ratio_after_last_run": null,  # null: no dead entries left
                     "live_dead_ratio_now": 3.4}
    }

Any figure without data is ``null`` (``count`` 0). Rates are per second, times in ms,
ratios in [0, 1] except live/dead ratios. The Parquet tables next to it
(``throughput``, ``time_queued``, ``compactions``, ``live_dead``) hold the series the
figures come from; ``pipeline.report`` states every formula.
"""
