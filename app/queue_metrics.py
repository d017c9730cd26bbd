"""Per-queue Prometheus metrics, in the style of rabbitmq_prometheus: ``quorra_queue_*``
with a ``queue`` label, read from the engine's stats at scrape time (nothing is kept
between scrapes, so a deleted queue's series disappear with it).

Counters (``..._total``) are the queue machine's own counts (replicated state, so they
survive restarts and agree across replicas).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from engine.errors import QueueNotFound
from engine.runtime.api import QueueEngine
from engine.storage import SYNC_BUCKETS_S
from engine.storage.wal_stats import RECENT_SYNCS

GAUGES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("messages_ready", "Messages ready to be delivered.", ("messages_ready",)),
    ("messages_unacked", "Messages delivered and not yet settled.", ("messages_unacked",)),
    ("messages_ready_bytes", "Body bytes of ready messages.", ("bytes_ready",)),
    ("consumers", "Consumers holding leases.", ("consumers",)),
    ("memory_bytes", "Engine memory used by the queue.", ("memory_bytes",)),
    (
        "memory_per_message_bytes",
        "Engine memory per queued message, the queue's fixed part left out.",
        ("memory_per_message_bytes",),
    ),
    ("publish_rate", "Messages published per second, recently.", ("publish_rate",)),
    ("deliver_rate", "Messages delivered per second, recently.", ("deliver_rate",)),
    ("ack_rate", "Messages acknowledged per second, recently.", ("ack_rate",)),
    ("raft_term", "Current Raft term of the queue's group.", ("raft", "term")),
    ("raft_commit_index", "Raft commit index.", ("raft", "commit_index")),
    ("raft_last_applied", "Last Raft index applied to the machine.", ("raft", "last_applied")),
    ("log_first_index", "First index kept in the log.", ("log", "first_index")),
    ("log_last_index", "Last index in the log.", ("log", "last_index")),
    ("log_segments", "Segment files of the log.", ("log", "segments")),
    ("log_bytes", "Bytes of the log on disk.", ("log", "bytes")),
    ("log_live_entries", "Log entries holding live messages.", ("log", "live_entries")),
    ("log_dead_entries", "Log entries compaction may reclaim.", ("log", "dead_entries")),
    ("checkpoint_index", "Raft index of the newest checkpoint.", ("checkpoint", "index")),
    ("checkpoint_bytes", "Bytes of the newest checkpoint.", ("checkpoint", "bytes")),
    (
        "index_resident_pages",
        "Pages of the ready index in memory.",
        ("paging", "resident_pages"),
    ),
    (
        "index_resident_bytes",
        "Bytes of the ready index in memory, pages counted at their budget size.",
        ("paging", "resident_bytes"),
    ),
    (
        "index_paged_out_pages",
        "Pages of the ready index in page files on disk.",
        ("paging", "paged_out_pages"),
    ),
    (
        "index_read_ahead_hit_ratio",
        "Share of the pages consumers reached that read-ahead had loaded in time.",
        ("paging", "read_ahead_hit_rate"),
    ),
    (
        "read_cache_hit_ratio",
        "Share of the log entries read that were served from memory, not a segment file.",
        ("read_cache", "hit_rate"),
    ),
)
COUNTERS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("messages_published", "Messages published (confirmed).", ("published",)),
    ("messages_delivered", "Deliveries to consumers (redeliveries count).", ("delivered",)),
    ("messages_acked", "Messages acknowledged.", ("acked",)),
    ("messages_dead_lettered", "Messages dead-lettered.", ("dead_lettered",)),
    ("messages_expired", "Messages whose TTL ended on the queue.", ("expired",)),
    (
        "messages_dropped",
        "Messages dropped (overflow drop-head, no dead-letter target).",
        ("dropped",),
    ),
    (
        "index_page_waits",
        "Ready-index pages a consumer reached before read-ahead loaded them (since start).",
        ("paging", "page_waits"),
    ),
    (
        "index_page_loads",
        "Ready-index pages read from page files (since start).",
        ("paging", "page_loads"),
    ),
    (
        "index_page_writes",
        "Ready-index pages written to page files (since start).",
        ("paging", "page_writes"),
    ),
    (
        "index_pages_rebuilt",
        "Damaged ready-index pages rebuilt from the log (since start).",
        ("paging", "pages_rebuilt"),
    ),
    (
        "read_cache_hits",
        "Log entries read from memory: the mem table or the node's read cache (since start).",
        ("read_cache", "hits"),
    ),
    (
        "read_cache_misses",
        "Log entries read from segment files (since start).",
        ("read_cache", "misses"),
    ),
    (
        "segment_reads",
        "Reads (pread) of blocks of entries from segment files (since start).",
        ("read_cache", "segment_reads"),
    ),
    (
        "segment_read_bytes",
        "Entry bytes read from segment files, the entries read ahead included (since start).",
        ("read_cache", "segment_bytes"),
    ),
)


def _number(stats: Mapping[str, object], path: tuple[str, ...]) -> float | None:
    value: object = stats
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    if isinstance(value, dict | list):
        value = len(value)  # e.g. consumers as {consumer: leases}
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


class QueueCollector(Collector):
    """Reads the node from ``get_node`` at scrape time; no node, no queue series."""

    def __init__(self, get_node: Callable[[], QueueEngine | None]) -> None:
        self.get_node = get_node

    def describe(self) -> list[Metric]:
        return []  # collected on demand; describing would call the engine at registration

    def collect(self) -> Iterator[Metric]:
        node = self.get_node()
        if node is None:
            return
        names = sorted(q.name for q in node.queues())
        # Each queue's figures are read out of its stats at once, and the stats dropped:
        # with the stats of 2,000 sleeping queues held until the last family was written,
        # a scrape raised the server's peak RSS by 12.2 KB a queue and three scrapes left
        # 5.1 KB a queue resident; with their figures only, 9.6 and 3.2 KB (the rest is
        # the text, a string per line until it is joined). A queue's figures are an
        # array of floats and a mask of those its stats lack (about 0.5 KB).
        paths = [path for _m, _t, path in GAUGES] + [path for _m, _t, path in COUNTERS]
        figures: list[tuple[str, array[float], int]] = []
        for name in names:
            try:
                stats = node.stats(name)
            except QueueNotFound:  # deleted between the two calls
                continue
            numbers = [_number(stats, path) for path in paths]
            del stats
            missing = sum(1 << k for k, number in enumerate(numbers) if number is None)
            values = array("d", [0.0 if number is None else number for number in numbers])
            figures.append((name, values, missing))
        for k, (metric, text, _path) in enumerate(GAUGES):
            family = GaugeMetricFamily(f"quorra_queue_{metric}", text, labels=["queue"])
            for name, values, missing in figures:
                if not missing >> k & 1:
                    family.add_metric([name], values[k])
            yield family
        for k, (metric, text, _path) in enumerate(COUNTERS, start=len(GAUGES)):
            family_c = CounterMetricFamily(f"quorra_queue_{metric}", text, labels=["queue"])
            for name, values, missing in figures:
                if not missing >> k & 1:
                    family_c.add_metric([name], values[k])
            yield family_c
        yield GaugeMetricFamily("quorra_queues", "Queues on this node.", value=len(figures))
        yield from _memory_families(node)
        yield from _wal_families(node)


NODE_MEMORY: tuple[tuple[str, str, str], ...] = (
    ("engine_memory_bytes", "Engine memory of every queue on this node.", "memory_bytes"),
    (
        "queues_sleeping",
        "Idle queues of this node asleep: kept as a compact record until a request.",
        "queues_sleeping",
    ),
    (
        "engine_memory_bytes_max",
        "The node's engine memory limit: publishes beyond it are refused (memory alarm).",
        "memory_bytes_max",
    ),
    (
        "index_resident_pages",
        "Ready-index pages in memory over every queue of this node.",
        "resident_pages",
    ),
    (
        "index_resident_pages_max",
        "The node's budget of ready-index pages in memory.",
        "resident_pages_max",
    ),
    (
        "index_paged_out_pages",
        "Ready-index pages in page files over every queue of this node.",
        "paged_out_pages",
    ),
    (
        "read_cache_bytes",
        "Bytes of segment blocks in the node's read cache, shared by its queues.",
        "read_cache_bytes",
    ),
    (
        "read_cache_bytes_max",
        "The node's read cache budget.",
        "read_cache_bytes_max",
    ),
    (
        "read_cache_blocks",
        "Blocks of segment entries in the node's read cache.",
        "read_cache_blocks",
    ),
    (
        "mem_table_bytes",
        "Entries in the WAL's mem tables, not yet in segments (counted by the memory alarm).",
        "mem_table_bytes",
    ),
)
NODE_COUNTERS: tuple[tuple[str, str, str], ...] = (
    (
        "read_cache_lookup_hits",
        "Lookups in the node's read cache that found their block (since start).",
        "read_cache_hits",
    ),
    (
        "read_cache_lookup_misses",
        "Lookups in the node's read cache that read a segment (since start).",
        "read_cache_misses",
    ),
    (
        "read_cache_evictions",
        "Blocks the node's read cache evicted to stay in its budget (since start).",
        "read_cache_evictions",
    ),
)


def _memory_families(node: QueueEngine) -> Iterator[Metric]:
    """The node's totals (``QueueEngine.memory``)."""
    memory = node.memory()
    for metric, text, key in NODE_MEMORY:
        number = _number(memory, (key,))
        if number is not None:
            yield GaugeMetricFamily(f"quorra_{metric}", text, value=number)
    for metric, text, key in NODE_COUNTERS:
        number = _number(memory, (key,))
        if number is not None:
            yield CounterMetricFamily(f"quorra_{metric}", text, value=number)
    yield GaugeMetricFamily(
        "quorra_memory_alarm",
        "1 while the node refuses publishes for its engine memory limit.",
        value=1.0 if memory.get("alarm") else 0.0,
    )
    refused = _number(memory, ("publishes_refused",))
    if refused is not None:
        yield CounterMetricFamily(
            "quorra_memory_alarm_publishes_refused",
            "Publishes refused by the memory alarm since the node started.",
            value=refused,
        )


def _wal_families(node: QueueEngine) -> Iterator[Metric]:
    """The node's shared WAL: how long each group commit's write and sync took."""
    wal = node.wal_stats()
    if wal is None:
        return
    buckets = [
        (repr(bound), count) for bound, count in zip(SYNC_BUCKETS_S, wal.sync_buckets, strict=True)
    ]
    buckets.append(("+Inf", wal.batches))
    yield HistogramMetricFamily(
        "quorra_wal_sync_seconds",
        "Time of each WAL group commit (one write and one fdatasync); publishes wait for it.",
        buckets=buckets,
        sum_value=wal.sync_seconds_sum,
    )
    # The dashboard's figures, for ``quorra status`` and for alerts: the histogram says
    # how many syncs were slow since the start, these say how slow the recent ones are.
    recent = GaugeMetricFamily(
        "quorra_wal_sync_recent_seconds",
        f"Time of the last WAL group commits (at most {RECENT_SYNCS}) at a quantile; "
        "quantile 1 is the slowest.",
        labels=["quantile"],
    )
    for quantile, ms in (
        ("0.5", wal.recent_p50_ms),
        ("0.99", wal.recent_p99_ms),
        ("1", wal.recent_max_ms),
    ):
        recent.add_metric([quantile], ms / 1000)
    yield recent
    yield GaugeMetricFamily(
        "quorra_wal_sync_recent_syncs",
        "Group commits that quorra_wal_sync_recent_seconds covers.",
        value=wal.recent_syncs,
    )
    yield CounterMetricFamily(
        "quorra_wal_written_bytes", "Bytes written to the WAL.", value=wal.bytes_written
    )
    yield GaugeMetricFamily(
        "quorra_wal_file", "Sequence number of the WAL file being written.", value=wal.file_seq
    )
