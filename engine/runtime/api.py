"""What the app may ask of a node: the one surface between ``app/`` and the engine.

The app calls these ``async`` methods and reads these frozen values; it never touches the
engine's files, Raft servers or machines. Queues are addressed by their user-given name;
the node keeps the name -> internal uid map in its own durable records (its directories
use the uid, never the name), and the app mirrors definitions into SQLite.

Errors are the closed set of ``engine.errors``: ``QueueNotFound``, ``QueueConflict``,
``ValidationFailed``, ``MessageTooLarge``, ``QueueFull``, ``Backpressure``, ``NoLeader``,
``StorageFailed``. A call that raises has had no effect, with one exception stated by
Raft itself: a proposal whose outcome is unknown (leadership lost after the entry was
appended) raises ``NoLeader`` and may still commit; publishes carry ``dedup_id`` for
exactly this reason.

The node is one of possibly several: nothing here assumes the queue's leader is local.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, TypeAlias

from engine.publish_trace import PublishTrace
from engine.quick_init import quick_init
from engine.storage.wal_stats import WalStats

Trigger = Literal["manual", "auto"]
CompactionPhase = Literal["auto", 1, 2, 3]


@dataclass(frozen=True, slots=True)
class QueueArgs:
    """The arguments of ``PUT /queues/{name}`` (API.md), validated by the node."""

    replicas: int | None = None
    """``None``: min(3, nodes in the cluster)."""
    max_length: int | None = None
    max_bytes: int | None = None
    overflow: str = "reject-publish"
    delivery_limit: int | None = 20
    dead_letter_queue: str | None = None
    message_ttl_ms: int | None = None
    priorities: int = 1
    lease_ms: int = 30_000
    max_message_bytes: int = 1 << 20


@dataclass(frozen=True, slots=True)
class QueueInfo:
    name: str
    uid: str
    args: QueueArgs
    created_at_ms: int


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    """One message of a publish batch. ``headers`` are string pairs, at most
    ``Limits.headers_bytes_max`` encoded."""

    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    priority: int = 0
    ttl_ms: int | None = None
    delay_ms: int = 0
    dedup_id: str | None = None
    frame_count: int = 0
    """Above 0: ``dedup_id`` is the id of a frame of this message and the next
    ``frame_count - 1`` of its batch (which carry no dedup id), deduplicated as one: a
    frame whose id was seen within the window is a duplicate whole."""


def _slot_setter(name: str) -> Callable[[OutgoingMessage, object], None]:
    """The setter of one of ``OutgoingMessage``'s slots (its member descriptor)."""
    setter: Callable[[OutgoingMessage, object], None] = vars(OutgoingMessage)[name].__set__
    return setter


_new_object = object.__new__
_set_body = _slot_setter("body")
_set_headers = _slot_setter("headers")
_set_priority = _slot_setter("priority")
_set_ttl_ms = _slot_setter("ttl_ms")
_set_delay_ms = _slot_setter("delay_ms")
_set_dedup_id = _slot_setter("dedup_id")
_set_frame_count = _slot_setter("frame_count")


def body_only(body: bytes) -> OutgoingMessage:
    """``OutgoingMessage(body)``: every other field at its default, as most messages are
    published. Made through the slots' own setters: the frozen dataclass's ``__init__``
    sets each field by ``object.__setattr__``, which looks the slot up first, and took
    about twice as long (1.1 us a message on this machine, a twentieth of a stream
    publish's server CPU)."""
    message: OutgoingMessage = _new_object(OutgoingMessage)
    _set_body(message, body)
    _set_headers(message, {})
    _set_priority(message, 0)
    _set_ttl_ms(message, None)
    _set_delay_ms(message, 0)
    _set_dedup_id(message, None)
    _set_frame_count(message, 0)
    return message


KeyedItem: TypeAlias = tuple[str, bytes]
"""A message given as its ``dedup_id`` and its body, every other field at its default:
how batch writers publish (the Spark connector gives each row an id, so that a retried
task publishes nothing twice); no ``OutgoingMessage`` is made for it."""

PublishItem: TypeAlias = OutgoingMessage | bytes | KeyedItem


def item_body(item: PublishItem) -> bytes:
    """The body of ``item``."""
    if isinstance(item, bytes):
        return item
    if isinstance(item, tuple):
        return item[1]
    return item.body


def outgoing(item: PublishItem) -> OutgoingMessage:
    """``item`` as the ``OutgoingMessage`` it stands for."""
    if isinstance(item, bytes):
        return body_only(item)
    if isinstance(item, tuple):
        return OutgoingMessage(item[1], dedup_id=item[0])
    return item


"""A message of a publish batch: an ``OutgoingMessage``, or its body alone (``bytes``),
the message with every other field at its default. Most messages are published so, and
an ``OutgoingMessage`` each (a frozen dataclass, six fields set one by one) cost more
than parsing and encoding them."""


@dataclass(frozen=True, slots=True)
class ReceivedMessage:
    id: int
    receipt: str
    body: bytes
    headers: dict[str, str]
    priority: int
    delivery_count: int
    """Deliveries including this one (1 on first delivery)."""
    published_at_ms: int
    lease_expires_at_ms: int


@dataclass(frozen=True, slots=True)
class BrowsedMessage:
    id: int
    cursor: int
    """Pass as ``after`` to continue after this message."""
    body: bytes
    headers: dict[str, str]
    priority: int
    delivery_count: int
    published_at_ms: int


@quick_init
@dataclass(frozen=True, slots=True)
class SettleResult:
    settled: int
    stale: tuple[int, ...]
    """Positions (0-based) of receipts whose lease had expired: HTTP 409 per receipt."""


@quick_init
@dataclass(frozen=True, slots=True)
class ReceivedBatch:
    """The messages one receive leased, as parallel lists (no object per message: a
    batch is encoded into an answer straight from them), and what the acks it carried
    settled (``ack_and_receive``; none: ``SettleResult(0, ())``), from one durable step."""

    settled: SettleResult
    ids: list[int]
    receipts: list[str]
    bodies: list[bytes]
    headers: list[dict[str, str]]
    priorities: list[int]
    delivery_counts: list[int]
    published_at_ms: list[int]
    lease_expires_at_ms: int

    def columns(
        self,
    ) -> tuple[
        list[int], list[str], list[bytes], list[dict[str, str]], list[int], list[int], list[int]
    ]:
        """The per-message lists, in the order of ``ReceivedMessage``'s fields: one
        row per message by ``zip(*batch.columns())`` (an answer is built from them)."""
        return (
            self.ids,
            self.receipts,
            self.bodies,
            self.headers,
            self.priorities,
            self.delivery_counts,
            self.published_at_ms,
        )

    def consistent(self) -> bool:
        """Every list has one item per message (a batch from a peer is checked)."""
        n = len(self.ids)
        return all(len(column) == n for column in self.columns())

    @property
    def messages(self) -> list[ReceivedMessage]:
        expires_ms = self.lease_expires_at_ms
        return [
            ReceivedMessage(id_, receipt, body, headers, priority, count, published, expires_ms)
            for id_, receipt, body, headers, priority, count, published in zip(
                *self.columns(), strict=True
            )
        ]


@dataclass(frozen=True, slots=True)
class CheckpointRecord:
    queue: str
    index: int
    term: int
    taken_at_ms: int
    bytes: int
    live_entries: int
    trigger: Trigger
    duration_ms: float


@dataclass(frozen=True, slots=True)
class CompactionRecord:
    queue: str
    phase: str
    """``auto`` or the phases that ran, e.g. ``"1,2"``."""
    trigger: Trigger
    started_at_ms: int
    duration_ms: float
    segments_before: int
    segments_after: int
    bytes_before: int
    bytes_after: int
    live_entries: int
    dead_entries_before: int
    dead_entries_after: int


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    name: str
    first_index: int
    last_index: int
    bytes: int
    live_entries: int
    dead_entries: int


RecordListener = Callable[[CheckpointRecord | CompactionRecord], Awaitable[None]]
"""The app registers one to store automatic checkpoints and compactions in SQLite."""


@dataclass(frozen=True, slots=True)
class QueueHistory:
    """A queue's checkpoint and compaction runs as one node keeps them, newest first."""

    snapshots: list[CheckpointRecord]
    compactions: list[CompactionRecord]


HistorySource = Callable[[str, str, int], Awaitable[QueueHistory]]
"""The app registers one to read a queue's history (name, uid, at most that many runs of
each kind) from SQLite, for the nodes without a replica that ask this one."""

HistoryStatus = Literal["ok", "absent"]


@dataclass(frozen=True, slots=True)
class LeaderHistory:
    """A queue's history as a node without a replica of it learnt it from its leader's
    node: ``ok`` with that node's runs, or ``absent`` (no leader, or it did not answer in
    time, ``detail`` says why) with none."""

    status: HistoryStatus
    from_node: str | None
    history: QueueHistory
    detail: str = ""


class QueueEngine(Protocol):
    """The node as the app sees it (``engine.runtime.Node`` implements it)."""

    async def start(self) -> None:
        """Recover every queue on disk; ready to serve when it returns."""
        ...

    async def stop(self) -> None:
        """Flush and close everything; a later ``start`` loses nothing confirmed."""
        ...

    def set_record_listener(self, listener: RecordListener | None) -> None: ...

    def trace_publishes(self, trace: PublishTrace) -> None:
        """Stamp the stages of publishes into ``trace`` (``engine.publish_trace``), a
        measuring aid the server turns on with ``QUORRA_TRACE_PUBLISH_FILE``."""
        ...

    def leader_of(self, name: str) -> str | None:
        """The node that leads queue ``name`` as this node knows it; None when unknown
        (no such queue here, an election running)."""
        ...

    def queues(self) -> list[QueueInfo]: ...

    async def create_queue(self, name: str, args: QueueArgs) -> tuple[QueueInfo, bool]:
        """Create, or return the existing one with ``False`` when its args are the same;
        ``QueueConflict`` when they differ."""
        ...

    async def delete_queue(self, name: str) -> None: ...

    async def update_policy(self, name: str, changes: dict[str, object]) -> QueueInfo: ...

    async def publish(
        self,
        name: str,
        messages: Sequence[PublishItem],
        on_durable: Callable[[], None] | None = None,
    ) -> list[int]:
        """Ids, once the whole batch is durable on a quorum (all or nothing).

        ``on_durable``, if given, is called once the batch is durable, in the loop turn
        its entry is applied, before this call returns (a stream confirms there rather
        than one loop turn later). It is called only when this node leads the queue:
        the caller checks whether it ran. It must not raise."""
        ...

    async def receive(
        self,
        name: str,
        *,
        consumer: str,
        max_messages: int,
        wait_ms: int,
        lease_ms: int | None,
    ) -> list[ReceivedMessage]:
        """Leases up to ``max_messages``; waits up to ``wait_ms`` for the first to arrive."""
        ...

    async def ack_and_receive(
        self,
        name: str,
        *,
        ack: list[str],
        consumer: str,
        max_messages: int,
        wait_ms: int,
        lease_ms: int | None,
    ) -> ReceivedBatch:
        """``ack`` settled and up to ``max_messages`` leased by one Raft entry, answered
        once it is durable; stale receipts reported as ``ack`` reports them. When none
        is ready it then waits up to ``wait_ms`` for the first, as ``receive``."""
        ...

    async def ack(self, name: str, receipts: list[str]) -> SettleResult: ...

    async def nack(self, name: str, receipts: list[str], *, requeue: bool) -> SettleResult: ...

    async def extend(self, name: str, receipts: list[str], lease_ms: int) -> SettleResult: ...

    async def browse(self, name: str, *, after: int | None, limit: int) -> list[BrowsedMessage]: ...

    async def purge(self, name: str) -> int: ...

    async def checkpoint(self, name: str, *, trigger: Trigger = "manual") -> CheckpointRecord: ...

    async def compact(
        self, name: str, *, phase: CompactionPhase = "auto", trigger: Trigger = "manual"
    ) -> CompactionRecord: ...

    def stats(self, name: str) -> dict[str, object]:
        """The queue stats of API.md: messages_ready, messages_unacked, bytes_ready,
        consumers, publish_rate, deliver_rate, ack_rate, memory_bytes,
        memory_per_message_bytes, memory{...}, raft{...}, log{...}, checkpoint{...}."""
        ...

    async def fresh_stats(self, name: str) -> dict[str, object]:
        """``stats``; on a cluster node without a replica of the queue, asked of its
        leader now (``stats`` shows the leader's last answer, with ``remote.age_ms``)."""
        ...

    def summary(self, name: str) -> dict[str, object]:
        """The counts, rates and memory of ``stats`` (the same keys), without what the
        log must be looked at for: cheap enough to read for every queue of a node."""
        ...

    def segments(self, name: str) -> list[SegmentInfo]: ...

    async def leader_history(self, name: str) -> LeaderHistory | None:
        """``None`` when this node keeps the queue's history itself (it holds a replica,
        or knows no such queue); on a cluster node without one, the runs its leader's
        node keeps, asked now."""
        ...

    async def fresh_segments(self, name: str) -> list[SegmentInfo]:
        """``segments``; on a cluster node without a replica of the queue, its leader's
        (``checkpoint`` and ``compact`` run on the leader's replica there too)."""
        ...

    def cluster(self) -> dict[str, object]:
        """Nodes, their health, and the queues each leads (``GET /cluster``)."""
        ...

    def memory(self) -> dict[str, object]:
        """The node's engine memory over its queues: ``memory_bytes``, the ready-index
        pages in memory (``resident_pages``, ``resident_pages_max``: the node's budget)
        and out (``paged_out_pages``), ``page_waits``, ``read_cache_hit_rate``; the node's
        read cache of segment blocks: ``read_cache_bytes`` (and ``_max``),
        ``read_cache_blocks``, lookups that hit and missed (``read_cache_hits``,
        ``read_cache_misses``) and blocks evicted (``read_cache_evictions``) since the
        start; what the WAL's mem tables hold (``mem_table_bytes``); the memory alarm
        (which counts the mem tables and the read cache too): ``memory_bytes_max``,
        ``alarm`` (publishes are refused), and ``publishes_refused`` since the start."""
        ...

    def wal_stats(self) -> WalStats | None:
        """The node's WAL: group commits, bytes, sync times (``None`` before start)."""
        ...


__all__ = [
    "BrowsedMessage",
    "CheckpointRecord",
    "CompactionPhase",
    "CompactionRecord",
    "HistorySource",
    "HistoryStatus",
    "KeyedItem",
    "LeaderHistory",
    "OutgoingMessage",
    "PublishItem",
    "QueueArgs",
    "QueueEngine",
    "QueueHistory",
    "QueueInfo",
    "ReceivedBatch",
    "ReceivedMessage",
    "RecordListener",
    "SegmentInfo",
    "SettleResult",
    "Trigger",
    "body_only",
    "item_body",
    "outgoing",
]
