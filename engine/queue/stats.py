"""What a queue machine reports about itself: counts, counters, memory, browse items.

Rule of this module: frozen values only, computed by ``QueueMachine.stats`` and
``QueueMachine.browse``; the memory figures are estimates (see ``MemoryUse.estimate``).
"""

from __future__ import annotations

import dataclasses

from engine.queue.paging import NOT_PAGED, PagingStats

COUNTERS = (
    "published",
    "duplicates",
    "delivered",
    "acked",
    "returned",
    "dead_lettered",
    "expired",
    "dropped",
)
"""The machine's running counters, in the order its snapshot keeps them."""
(PUBLISHED, DUPLICATES, DELIVERED, ACKED, RETURNED, DEAD_LETTERED, EXPIRED, DROPPED) = range(8)
"""The place of each counter in the machine's list of them (a list of eight ints costs an
idle queue 120 bytes, a dict of them 272)."""
assert len(COUNTERS) == 8 and COUNTERS[DROPPED] == "dropped"

_DICT_ENTRY_BYTES_ESTIMATE = 100
_FIXED_BYTES_ESTIMATE = 1100
_LEVEL_BYTES_ESTIMATE = 440
"""An empty machine holds about ``_FIXED + _LEVEL * priorities`` bytes (tracemalloc: 1.8
KB with one level and a few messages; each level has two lanes, whose empty FIFOs share
one empty list; a queue without TTL keeps no enqueue times, one without leases no lease
tables, one without returns, TTLs, dedup ids, delays, dead letters or large messages no
tables of those). ``test_an_idle_queue_is_small``
holds the estimate to what tracemalloc measures."""


@dataclasses.dataclass(frozen=True, slots=True)
class MemoryUse:
    """Estimated engine memory of one queue, by what holds it."""

    index_bytes: int
    """Ready messages: pages of packed refs, 8 bytes per message, 4 in sealed pages; a
    page that is out (``engine.queue.paging``) costs only its descriptor."""
    enqueue_times_bytes: int
    """Enqueue times for queue TTL, kept only while the queue has one: 8 bytes per 10 ms
    interval in which something was published and that a held message still needs
    (``engine.queue.enqueue_times``)."""
    leases_bytes: int
    """Leased messages: pages of the delivery-tag ring (8 bytes per slot) and lease groups."""
    extras_bytes: int
    """Paid only by the messages that need it (about 100 bytes each): redelivery counts,
    per-message TTL, delayed and dead-lettering messages, large refs; and the dedup
    window's columns and table, counted as they are."""
    fixed_bytes: int
    """The queue's own structures, whatever its depth."""

    @classmethod
    def estimate(
        cls,
        index_bytes: int,
        enqueue_times_bytes: int,
        leases_bytes: int,
        extras: int,
        priorities: int,
        dedup_bytes: int = 0,
    ) -> MemoryUse:
        """``extras``: the number of entries of the sparse tables (dicts, heap)."""
        return cls(
            index_bytes=index_bytes,
            enqueue_times_bytes=enqueue_times_bytes,
            leases_bytes=leases_bytes,
            extras_bytes=extras * _DICT_ENTRY_BYTES_ESTIMATE + dedup_bytes,
            fixed_bytes=_FIXED_BYTES_ESTIMATE + _LEVEL_BYTES_ESTIMATE * priorities,
        )

    @property
    def total_bytes(self) -> int:
        return (
            self.index_bytes
            + self.enqueue_times_bytes
            + self.leases_bytes
            + self.extras_bytes
            + self.fixed_bytes
        )


@dataclasses.dataclass(frozen=True, slots=True)
class QueueStats:
    messages_ready: int
    messages_delayed: int
    messages_unacked: int
    messages_dead_lettering: int
    bytes_ready: int
    bytes_unacked: int
    consumers: dict[str, int]
    """Leased messages per consumer id (consumers with an active lease)."""
    published: int
    duplicates: int
    delivered: int
    acked: int
    returned: int
    dead_lettered: int
    expired: int
    dropped: int
    memory_bytes: int
    """Estimate of the engine memory this queue's state holds (``memory.total_bytes``)."""
    memory: MemoryUse
    last_applied: int
    dead_bytes: int
    """Log bytes no longer needed since the last checkpoint request."""
    paging: PagingStats = NOT_PAGED
    """Pages of the ready index in memory and out (all zero for a machine not paged)."""


@dataclasses.dataclass(frozen=True, slots=True)
class BrowseItem:
    cursor: int
    """Pass as ``after`` to continue after this item."""
    ref: int
    priority: int
    delivery_count: int
    """Deliveries so far (0 for a message never delivered)."""


__all__ = ["COUNTERS", "BrowseItem", "MemoryUse", "QueueStats"]
