"""The node's memory alarm: publishes are refused while the engine's memory would pass
``Limits.engine_memory_bytes_max``, and accepted again once it is back under.

Rule: the engine's memory is the sum over the node's queues of what each machine
estimates it holds (``memory_bytes``: its resident index pages, leases, per-message
extras and fixed part; pages in page files cost nothing here), the publish bytes in
flight, the WAL's mem tables (entries durable in the WAL and not yet in segments) and
the node's read cache of segment blocks. Summing over every queue costs in proportion
to the queues, so the sum is taken again at most every ``Limits.memory_check_interval_ms``,
and at most once per ``Limits.memory_check_spacing_factor`` times the last sum took (on
a node of 10,000 queues, every 10 s rather than the whole time), and a publish compares
the last sum plus its own size with the limit. The read cache is memory the node can
give back at once: before a publish is refused, the cache evicts what it must for the
publish to fit, and the publish is refused only if emptying it would not do. Nothing is
kept raised: a publish after the memory went down (consumers, a purge, pages spilled,
the mem tables flushed at the WAL's roll, which a refused publish asks for) finds the
alarm cleared, within one interval. Like RabbitMQ's memory alarm, only publishes are
refused: consuming, acknowledging and purging are what bring the memory down. On the
node's loop only.

The node also gives the C allocator's free memory back (``trim``, glibc's
``malloc_trim`` where the app provides it) right after it freed much at once: a segment
flush of many logs (their entries, encoded segments and unpacked logs are dropped when it
is shown) or a sweep that put many queues to sleep. The app trims every 10 s anyway
(``app/memory_trim.py``), but until then the server's RSS showed the flush's peak: 2,000
idle queues read 7.8 KiB each 7 s after their publish, 6.6 KiB after the trim.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from engine.errors import MemoryAlarm

if TYPE_CHECKING:
    from engine.runtime.context import NodeContext


class MemoryWatch:
    """The last sum of the node's engine memory, and whether it raised the alarm."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx
        self.engine_bytes = 0
        """At the last sum."""
        self.summed_ms: int | None = None
        self.sum_took_ms = 0
        """What the last sum took (``monotonic_ms`` before and after it)."""
        self.refused = 0
        """Publishes refused since the node started."""
        self.trim: Callable[[], object] | None = None
        """Gives the C allocator's free memory back (``Node.trim_memory_with``), or None."""
        self.trims = 0
        """Trims run after bulk frees (``freed_in_bulk``)."""
        self.trim_running = False

    def freed_in_bulk(self, objects: int) -> None:
        """``objects`` (logs flushed, queues put to sleep) were just dropped: trim on a
        worker if they are at least ``Limits.bulk_free_trim_min`` and no trim is running."""
        least = self.ctx.limits.bulk_free_trim_min
        if self.trim is None or objects < least or self.trim_running:
            return
        self.trim_running = True
        self.ctx.spawn(self._trimming(self.trim))

    async def _trimming(self, trim: Callable[[], object]) -> None:
        try:
            await self.ctx.in_worker(trim)
            self.trims += 1
        finally:
            self.trim_running = False

    def sum_engine_bytes(self) -> int:
        """The engine's memory but the read cache's (which is given back on demand)."""
        ctx = self.ctx
        reps = [rep for rep in ctx.replicas.values() if not rep.closed]
        queues = sum(
            rep.inflight_publish_bytes
            + (
                rep.machine.memory_use().total_bytes
                if rep.dormant is None
                else rep.dormant.record_bytes  # asleep: its record, not waking it
            )
            for rep in reps
        )
        return queues + (ctx.storage.mem_table_bytes() if ctx.has_storage else 0)

    def alarmed(self) -> bool:
        """Whether a publish would be refused now (memory at its limit with the read
        cache emptied), summed afresh."""
        return self.sum_engine_bytes() >= self.ctx.limits.engine_memory_bytes_max

    def check_publish(self, size: int) -> None:
        """Raise ``MemoryAlarm`` if a publish of ``size`` bytes would take the engine's
        memory past the limit even with the read cache emptied; else take back from the
        read cache what the publish needs under the limit (the least recently used
        blocks), so that the memory, the cache's included, is under it when the publish
        is accepted. Consumers may fill the cache again; the next publish takes it back."""
        ctx = self.ctx
        limits = ctx.limits
        now = ctx.clock.monotonic_ms()
        spacing_ms = max(
            limits.memory_check_interval_ms,
            limits.memory_check_spacing_factor * self.sum_took_ms,
        )
        if self.summed_ms is None or now - self.summed_ms >= spacing_ms:
            self.engine_bytes = self.sum_engine_bytes()
            self.summed_ms = ctx.clock.monotonic_ms()
            self.sum_took_ms = self.summed_ms - now
        if self.engine_bytes + size > limits.engine_memory_bytes_max:
            self.refused += 1
            if ctx.writer is not None and ctx.has_storage and ctx.storage.mem_table_bytes():
                ctx.writer.request_roll()  # the mem tables empty once their file rolls
            raise MemoryAlarm(
                f"node {ctx.name}: engine memory {self.engine_bytes} bytes, at most "
                f"{limits.engine_memory_bytes_max}; consume or purge, then retry"
            )
        if ctx.has_storage:
            room = limits.engine_memory_bytes_max - self.engine_bytes - size
            blocks = ctx.storage.cache.blocks
            if blocks.bytes > room:  # else ``shrink_to`` evicts nothing (most publishes)
                blocks.shrink_to(room)


__all__ = ["MemoryWatch"]
