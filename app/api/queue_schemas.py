"""Request and response bodies of the queue, message and snapshot/compaction endpoints,
one model per direction (``...In``/``...Patch`` in, ``...Out`` out).

Bounds come from ``engine.limits.DEFAULT_LIMITS`` so that the OpenAPI document states
them; the node checks its own limits again (a server may run with smaller ones).
Message bodies are ``str`` in JSON (``encoding`` says how to turn them into bytes) and
raw ``bytes`` in MessagePack.

Every field is strict: an integer is a JSON or MessagePack integer (not ``"1"``, ``1.0``
or ``true``), a boolean a boolean, text is text. The message bodies (publish, receive,
ack, nack, extend) are parsed by app/api/message_bodies.py, not by these models: there
they state the bounds (read by the parser, and in OpenAPI) and explain refusals.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict

from app.names import QUEUE_NAME_CHARS_MAX, QUEUE_NAME_PATTERN
from engine.limits import DEFAULT_LIMITS as LIMITS
from engine.queue.receipts import RECEIPT_CHARS

RECEIPT_PATTERN = rf"^[0-9a-f]{{{RECEIPT_CHARS}}}$"
COUNT_MAX = 1 << 62
"""Ceiling of ``max_length``/``max_bytes``: far beyond any disk, far below int64."""
TTL_MS_MAX = 10 * 365 * 24 * 3600 * 1000
"""Ten years: message and queue TTLs."""
DELAY_MS_MAX = 30 * 24 * 3600 * 1000
DEDUP_ID_CHARS_MAX = 255
CONSUMER_CHARS_MAX = 200


def _integer_or_text(value: object) -> object:
    """A ``Literal`` of integers takes ``true`` and ``1.0`` as 1, even when strict."""
    if isinstance(value, bool | float):
        raise ValueError("an integer or a text, not a boolean or a decimal number")
    return value


Int = Annotated[int, Strict()]
"""Every integer a client sends: an integer, never ``"1"``, ``1.0`` or ``true``."""

QueueNameStr = Annotated[
    str,
    Field(
        min_length=1,
        max_length=QUEUE_NAME_CHARS_MAX,
        pattern=QUEUE_NAME_PATTERN,
        description="A queue name.",
    ),
]
Receipt = Annotated[
    str,
    Field(
        pattern=RECEIPT_PATTERN,
        description=f"{RECEIPT_CHARS} lowercase hex digits, from a receive: good on that "
        "queue, for that delivery only.",
    ),
]
Receipts = Annotated[list[Receipt], Field(min_length=1, max_length=LIMITS.receive_messages_max)]
LeaseMs = Annotated[Int, Field(ge=1, le=LIMITS.lease_ms_max)]
Count = Annotated[Int, Field(ge=0, le=COUNT_MAX)]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


# --- queues ------------------------------------------------------------------------


class QueueArgsIn(_In):
    """``PUT /queues/{name}``; every argument is optional."""

    replicas: Int | None = Field(
        default=None, ge=1, le=7, description="Raft members; null: min(3, nodes)."
    )
    max_length: Count | None = Field(default=None, description="Ready messages at most.")
    max_bytes: Count | None = Field(default=None, description="Ready message bytes at most.")
    overflow: Literal["reject-publish", "drop-head"] = "reject-publish"
    delivery_limit: Int | None = Field(
        default=LIMITS.delivery_limit_default, ge=1, le=1_000_000, description="null: unlimited."
    )
    dead_letter_queue: QueueNameStr | None = None
    message_ttl_ms: Int | None = Field(default=None, ge=0, le=TTL_MS_MAX)
    priorities: Int = Field(default=1, ge=1, le=LIMITS.priorities_max)
    lease_ms: LeaseMs = LIMITS.lease_ms_default
    max_message_bytes: Int = Field(
        default=LIMITS.message_bytes_max, ge=1, le=LIMITS.message_bytes_max_ceiling
    )


class QueuePatch(_In):
    """``PATCH /queues/{name}``: the policies to change; ``null`` clears a limit.
    ``replicas`` and ``priorities`` are fixed at creation."""

    max_length: Count | None = None
    max_bytes: Count | None = None
    overflow: Literal["reject-publish", "drop-head"] = "reject-publish"
    delivery_limit: Int | None = Field(default=None, ge=1, le=1_000_000)
    dead_letter_queue: QueueNameStr | None = None
    message_ttl_ms: Int | None = Field(default=None, ge=0, le=TTL_MS_MAX)
    lease_ms: LeaseMs = LIMITS.lease_ms_default
    max_message_bytes: Int = Field(
        default=LIMITS.message_bytes_max, ge=1, le=LIMITS.message_bytes_max_ceiling
    )

    def changes(self) -> dict[str, object]:
        """Only the fields the client sent."""
        return {name: getattr(self, name) for name in sorted(self.model_fields_set)}


class QueueArgsOut(BaseModel):
    replicas: int | None
    max_length: int | None
    max_bytes: int | None
    overflow: str
    delivery_limit: int | None
    dead_letter_queue: str | None
    message_ttl_ms: int | None
    priorities: int
    lease_ms: int
    max_message_bytes: int


LIVE_ENTRIES_NOTE = (
    "live_entries: log entries that may hold a message (ready, delayed, leased or being "
    "dead-lettered). The set is rebuilt at most every 1 s (for a deep queue every 50 times "
    "its build time, about 5 s at 5 million messages, and in the background: until that "
    "build is done the previous set is used); in between, every entry applied since the "
    "last build counts as live: it may overcount for that long, never undercount. "
    "log.live_set_index is the applied index the set was built at (after a restart, the "
    "checkpoint's; 0 before any set: every entry counts as live)."
)


class QueueOut(BaseModel):
    name: str
    arguments: QueueArgsOut = Field(description="The effective arguments, policies applied.")
    created_at: datetime
    stats: dict[str, object] = Field(
        description="messages_ready, messages_unacked, bytes_ready, consumers, publish_rate, "
        "deliver_rate, ack_rate, memory_bytes, memory_per_message_bytes, memory{index_bytes, "
        "enqueue_times_bytes, leases_bytes, extras_bytes, fixed_bytes}, raft{leader, term, "
        "commit_index, last_applied, members}, log{first_index, last_index, segments, bytes, "
        "live_entries, dead_entries}, checkpoint{index, taken_at, bytes}. memory: the parts "
        "of memory_bytes (ready messages, enqueue times for TTL, leases, per-message extras, "
        "the queue's fixed part); memory_per_message_bytes leaves the fixed part out. "
        "paging{resident_pages, resident_bytes, paged_out_pages, page_writes, page_loads, "
        "read_ahead_hits, page_waits, read_ahead_hit_rate, pages_rebuilt, "
        "page_write_failures}: the ready index's pages in memory and in page files; a wait "
        "is a page a consumer reached before read-ahead loaded it. read_cache{reads, hits, "
        "hit_rate, mem_table_hits, cache_hits, misses, segment_reads, segment_bytes}: log "
        "entries read for deliveries (and browsing, page rebuilds) since the node started; "
        "hits were served from memory (the mem table, or the node's byte-bounded read "
        "cache of segment blocks), misses read from segment files by segment_reads reads "
        "of segment_bytes in all (the entries read ahead with them included). "
        + LIVE_ENTRIES_NOTE
        + " On a cluster node that does not lead the queue, GET /queues/{name} shows the "
        "leader's stats, with remote{from_node: the leader's node, age_ms: 0}; when the "
        "leader cannot answer in time, the node's own copy (or, without a replica of the "
        'queue, the leader\'s stats as last fetched) with status "stale" and '
        "remote{from_node, age_ms}: how old that copy may be (null if unknown)."
    )


class PurgedOut(BaseModel):
    purged: int = Field(description="Ready messages dropped.")


# --- messages ----------------------------------------------------------------------


class MessageIn(_In):
    body: str | bytes = Field(description="Text (JSON, per `encoding`) or raw bytes (MessagePack).")
    encoding: Literal["utf-8", "base64"] = Field(
        default="utf-8", description="How a text body becomes bytes (JSON)."
    )
    headers: dict[str, str] = Field(default_factory=dict)
    priority: Int = Field(default=0, ge=0, le=LIMITS.priorities_max - 1)
    ttl_ms: Int | None = Field(default=None, ge=0, le=TTL_MS_MAX)
    delay_ms: Int = Field(default=0, ge=0, le=DELAY_MS_MAX)
    dedup_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=DEDUP_ID_CHARS_MAX,
        description="A retried publish with the same id within the dedup window (5 minutes) "
        "returns the first id and is not enqueued again.",
    )


class PublishIn(_In):
    messages: list[MessageIn] = Field(
        min_length=1,
        description=f"At most {LIMITS.batch_messages_max} messages and "
        f"{LIMITS.batch_bytes_max} body bytes (else 413); all or nothing.",
    )


class PublishedOut(BaseModel):
    ids: list[int] = Field(description="One per message, in order; durable on a quorum.")


class ReceiveIn(_In):
    max_messages: Int = Field(default=1, ge=1, le=LIMITS.receive_messages_max)
    wait_ms: Int = Field(
        default=0, ge=0, le=LIMITS.receive_wait_ms_max, description="Long-poll for the first."
    )
    lease_ms: LeaseMs | None = Field(default=None, description="null: the queue's lease_ms.")
    consumer: str | None = Field(
        default=None,
        min_length=1,
        max_length=CONSUMER_CHARS_MAX,
        description="A label for the consumers stat; default: the caller's token.",
    )
    ack: list[Receipt] | None = Field(
        default=None,
        max_length=LIMITS.receive_messages_max,
        description="Receipts to settle (as `ack` does) in the same durable step as this "
        "receive: typically the previous batch's. The answer then carries `settled` and "
        "`stale`; it is 200 even when every receipt was stale.",
    )


class ReceivedOut(BaseModel):
    id: int
    receipt: str
    body: str = Field(description="JSON: text per `encoding`; MessagePack: raw bytes.")
    encoding: Literal["utf-8", "base64"] | None = Field(
        default=None, description="JSON only: utf-8 when the body is valid UTF-8, else base64."
    )
    headers: dict[str, str]
    priority: int
    delivery_count: int = Field(description="1 on first delivery.")
    published_at: datetime
    lease_expires_at: datetime


class ReceivedBatchOut(BaseModel):
    messages: list[ReceivedOut]
    settled: int | None = Field(
        default=None, description="Only when the request carried `ack`: receipts settled."
    )
    stale: list[str] | None = Field(
        default=None,
        description="Only when the request carried `ack`: its receipts whose lease had ended "
        "(the message was or will be handed out again), or that this queue did not make.",
    )


class SettleIn(_In):
    receipts: Receipts


class NackIn(_In):
    receipts: Receipts
    requeue: bool = Field(
        default=True, description="false: dead-letter (or drop when the queue has no target)."
    )


class ExtendIn(_In):
    receipts: Receipts
    lease_ms: LeaseMs


class SettledOut(BaseModel):
    settled: int
    stale: list[str] = Field(
        description="Receipts whose lease had ended (the message was or will be handed out "
        "again). When every receipt is stale the answer is 409 instead."
    )


class BrowsedOut(BaseModel):
    id: int
    cursor: int
    body: str
    encoding: Literal["utf-8", "base64"] | None = None
    headers: dict[str, str]
    priority: int
    delivery_count: int
    published_at: datetime


class BrowseOut(BaseModel):
    messages: list[BrowsedOut]
    next_after: int | None = Field(description="Pass as `after` for the next page; null: end.")


# --- snapshots, compaction, segments, cluster ------------------------------------


class SnapshotOut(BaseModel):
    index: int
    term: int
    taken_at: datetime
    bytes: int
    live_entries: int
    trigger: Literal["manual", "auto"]
    duration_ms: float


class CompactionIn(_In):
    phase: Annotated[Literal["auto", 1, 2, 3], BeforeValidator(_integer_or_text)] = "auto"


class CompactionOut(BaseModel):
    phase: str
    trigger: Literal["manual", "auto"]
    started_at: datetime
    duration_ms: float
    segments_before: int
    segments_after: int
    bytes_before: int
    bytes_after: int
    live_entries: int
    dead_entries_before: int
    dead_entries_after: int


class CompactionsOut(BaseModel):
    current: dict[str, object] = Field(
        description="The log now: first_index, last_index, segments, bytes, live_entries, "
        "dead_entries. " + LIVE_ENTRIES_NOTE
    )
    history: list[CompactionOut] = Field(description="Newest first.")


class SegmentOut(BaseModel):
    name: str
    first_index: int
    last_index: int
    bytes: int
    live_entries: int
    dead_entries: int


class MemberIn(_In):
    node: str = Field(min_length=1, max_length=200)


class LeaderIn(_In):
    node: str | None = Field(
        default=None, min_length=1, max_length=200, description="null: any up-to-date member."
    )


class NodeStateOut(BaseModel):
    name: str
    state: Literal["active", "draining", "lost", "forgotten", "unknown"] = Field(
        description="The node's state in the cluster metadata."
    )
    replicas: list[str] = Field(
        description="The queues (of those the caller may see) still placed on the node."
    )


class LeaderOut(BaseModel):
    leader: str = Field(description="The node that leads the queue now.")
