"""The options of the ``quorra`` data source, parsed once from Spark's string options.

Every option has a default except ``url``-less use, which fails early with the option's
name. Names are case-insensitive (Spark passes a case-insensitive dict).

=======================  =========  ====================================================
option                   default    meaning
=======================  =========  ====================================================
url                      http://127.0.0.1:8000  server base URL
token                    (required)  bearer token (or env QUORRA_TOKEN on the driver)
queue                    (required)  queue name
batchSize                1000       messages per publish frame / browse page (≤ 1000)
leaseMs                  60000      stream read: lease asked for each received message
maxMessagesPerTrigger    10000      stream read: messages per micro-batch (the reader's
                                    prefetch credit is two of them)
waitMs                   200        stream read: how long a trigger waits for a full batch
numPartitions            4          batch read / stream read: Spark partitions per scan
dedupPrefix              (random)   batch write: stable prefix of derived dedup ids
recoverTimeoutMs         leaseMs+10000  stream read: how long a restarted query waits
                                    for the messages of an uncommitted batch to return
=======================  =========  ====================================================

Spark's JVM spends a fixed time on every micro-batch (offset and commit logs, planning,
tasks), so a stream of small messages is read with less CPU per row in large ones: up to
half the reader's credit, which is at most 8 connections of the server's
``prefetch_max`` (40,000 with the default 10,000), the next batch is delivered while
Spark runs one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_URL = "http://127.0.0.1:8000"
BATCH_MESSAGES_MAX = 1000
"""The server's ``Limits.batch_messages_max`` and ``receive_messages_max``."""


@dataclass(frozen=True, slots=True)
class Options:
    url: str
    token: str
    queue: str
    batch_size: int = BATCH_MESSAGES_MAX
    lease_ms: int = 60_000
    max_messages_per_trigger: int = 10_000
    wait_ms: int = 200
    num_partitions: int = 4
    dedup_prefix: str | None = None
    recover_timeout_ms: int = 70_000
    fail_first_attempt_after_rows: int | None = None
    """Fault injection for tests: the first attempt of every write task fails after
    publishing this many rows (option ``testFailFirstAttemptAfterRows``)."""

    @staticmethod
    def parse(raw: Mapping[str, str]) -> Options:
        opts = {str(k).lower(): str(v) for k, v in raw.items()}
        token = opts.get("token") or os.environ.get("QUORRA_TOKEN", "")
        queue = opts.get("queue", "")
        if not token:
            raise ValueError("quorra data source: option 'token' is required")
        if not queue:
            raise ValueError("quorra data source: option 'queue' is required")
        lease_ms = _int(opts, "leasems", 60_000, 1_000)
        fail_after = opts.get("testfailfirstattemptafterrows")
        return Options(
            url=opts.get("url", DEFAULT_URL),
            token=token,
            queue=queue,
            batch_size=min(_int(opts, "batchsize", BATCH_MESSAGES_MAX, 1), BATCH_MESSAGES_MAX),
            lease_ms=lease_ms,
            max_messages_per_trigger=_int(opts, "maxmessagespertrigger", 10_000, 1),
            wait_ms=min(_int(opts, "waitms", 200, 0), 20_000),
            num_partitions=_int(opts, "numpartitions", 4, 1),
            dedup_prefix=opts.get("dedupprefix") or None,
            recover_timeout_ms=_int(opts, "recovertimeoutms", lease_ms + 10_000, 0),
            fail_first_attempt_after_rows=int(fail_after) if fail_after else None,
        )


def _int(opts: Mapping[str, str], key: str, default: int, minimum: int) -> int:
    value = int(opts.get(key, default))
    if value < minimum:
        raise ValueError(f"quorra data source: option {key!r} must be at least {minimum}")
    return value
