"""Paging of the ready index: what stays resident, read-ahead, budgets, damaged pages,
checkpoints that name stored pages (``engine.queue.paging``)."""

from __future__ import annotations

import dataclasses
import gc

import numpy as np
import pytest

from engine.errors import PageDamaged, StorageFailed
from engine.limits import Limits
from engine.queue import (
    CheckedOut,
    NewMessage,
    Purged,
    QueueMachine,
    QueuePolicy,
    encode_checkout,
    encode_enqueue,
    encode_purge,
    encode_return,
)
from engine.queue.pages import RefFifo, SpilledPage
from engine.queue.paging import MemorySpill, NodePages, Paging, QueuePager
from engine.queue.snapshots import PAGED_VERSION, inline_snapshot, page_handles_of, read_snapshot
from engine.raft.state_machine import ApplyMeta
from tests.engine.queue.test_paging_stateful import PAGE, refs_from

LIMITS = Limits(
    page_refs=PAGE,
    paged_index_bytes_per_queue_max=6 * PAGE * 8,
    paged_index_bytes_per_node_max=64 * PAGE * 8,
    page_read_ahead=2,
)
BIG_PAGES = Limits(
    page_refs=1024,
    paged_index_bytes_per_queue_max=3 * 1024 * 8,
    paged_index_bytes_per_node_max=64 * 1024 * 8,
    page_read_ahead=1,
)
"""Pages of a realistic size, for what is measured in bytes."""


def paged_lanes(
    lanes: int, pages_max: int, read_ahead: int = 2, node: NodePages | None = None
) -> tuple[QueuePager, tuple[RefFifo, ...], MemorySpill]:
    spill = MemorySpill()
    pager = QueuePager(spill, node or NodePages(1000), pages_max, read_ahead)
    fifos = tuple(RefFifo(PAGE, pager) for _ in range(lanes))
    pager.lanes = fifos
    return pager, fifos, spill


def push_pages(fifo: RefFifo, pages: int, index: int = 1) -> list[int]:
    refs = refs_from(index, pages * PAGE)
    fifo.push_many(np.array(refs, dtype=np.uint64))
    return refs


def resident_numbers(fifo: RefFifo) -> list[int]:
    return [n for n, page in fifo.window(len(fifo)) if not _out(page)]


def _out(page: object) -> bool:
    return isinstance(page, SpilledPage) and page.resident is None


def test_a_steady_consumer_never_waits_on_a_load() -> None:
    """Read-ahead keeps the next pages loaded: every page the head reaches was loaded
    before, and no more than head, read-ahead and tail pages are resident."""
    pager, (fifo,), spill = paged_lanes(1, pages_max=6, read_ahead=2)
    refs = push_pages(fifo, 40)
    taken: list[int] = []
    while fifo:
        if pager.wants_read_ahead:
            pager.read_ahead()
        taken += fifo.pop_many(PAGE).tolist()
        assert pager.resident <= 6
    stats = pager.stats()
    assert taken == refs
    assert stats.page_waits == 0
    assert stats.read_ahead_hits == stats.page_writes == stats.page_loads > 30
    assert len(spill) == 0, "every stored page was dropped once read"


def test_a_consumer_without_read_ahead_waits_at_each_page() -> None:
    pager, (fifo,), _ = paged_lanes(1, pages_max=1, read_ahead=0)
    refs = push_pages(fifo, 10)
    assert fifo.pop_many(len(refs)).tolist() == refs
    stats = pager.stats()
    assert stats.page_waits == stats.page_writes == 8 and stats.read_ahead_hits == 0


def test_the_pages_farthest_from_delivery_are_spilled_first() -> None:
    """Belady: the second lane is delivered after the whole first lane, so its pages go
    first, from its far end; the first lane keeps the pages next to its head."""
    pager, (first, second), _ = paged_lanes(2, pages_max=7)
    push_pages(second, 10, index=1)
    assert resident_numbers(second) == [0, 1, 2, 3, 4, 5, 9]  # near its head, and its tail
    push_pages(first, 10, index=1000)
    assert resident_numbers(second) == [0, 9]  # head and tail only
    assert resident_numbers(first) == [0, 1, 2, 3, 9]
    assert pager.resident == 7


def test_a_queue_keeps_its_head_and_tail_pages_whatever_the_budget() -> None:
    pager, lanes, _ = paged_lanes(3, pages_max=1)
    for k, lane in enumerate(lanes):
        push_pages(lane, 5, index=1 + 1000 * k)
    assert pager.resident == 6 and pager.warm == 0
    assert all(lane.nbytes() < 3 * PAGE * 8 + 3 * 400 for lane in lanes)


def test_memory_stays_bounded_at_any_depth() -> None:
    pager, (fifo,), _ = paged_lanes(1, pages_max=4)
    push_pages(fifo, 500)
    assert pager.resident == 4
    assert fifo.nbytes() < 4 * (PAGE * 8 + 112) + 496 * 300


def test_the_node_budget_takes_pages_from_the_queue_that_holds_most() -> None:
    node = NodePages(8)
    big, (big_lane,), _ = paged_lanes(1, pages_max=100, node=node)
    small, (small_lane,), _ = paged_lanes(1, pages_max=100, node=node)
    push_pages(big_lane, 7)
    assert node.resident == 7
    push_pages(small_lane, 4, index=10_000)
    assert node.resident == 8
    assert small.resident == 4 and big.resident == 4  # the big one gave up its far pages
    assert resident_numbers(big_lane) == [0, 1, 2, 6]
    push_pages(small_lane, 4, index=20_000)  # now the small one holds its share
    assert small.resident == 4 and resident_numbers(small_lane) == [0, 1, 2, 7]
    small.close()
    assert node.resident == 4 and node.queues() == 1


def test_a_store_that_refuses_pages_leaves_them_resident() -> None:
    class Full(MemorySpill):
        def store(self, data: bytes) -> int:
            raise StorageFailed("disk full")

    pager = QueuePager(Full(), NodePages(100), 2, 1)
    fifo = RefFifo(PAGE, pager)
    pager.lanes = (fifo,)
    refs = push_pages(fifo, 6)
    assert pager.resident == 6 and pager.stats().page_write_failures > 0
    assert fifo.pop_many(len(refs)).tolist() == refs


# --- the machine ---------------------------------------------------------------------


class Queue:
    """A paged machine and the same machine unpaged, fed the same entries."""

    def __init__(self, limits: Limits = LIMITS, rebuild: bool = True, priorities: int = 2) -> None:
        self.spill = MemorySpill()
        self.node = NodePages.from_limits(limits)
        self.entries: dict[int, bytes] = {}
        read_log = self.read_log if rebuild else None
        policy = QueuePolicy(priorities=priorities, delivery_limit=None)
        self.paged = QueueMachine(policy, limits, Paging(self.spill, self.node, read_log))
        self.plain = QueueMachine(policy, limits)
        self.index = 0

    def read_log(self, indexes: list[int]) -> list[tuple[int, bytes]]:
        return [(i, self.entries[i]) for i in indexes if i in self.entries]

    def apply(self, command: bytes) -> object:
        self.index += 1
        self.entries[self.index] = command
        meta = ApplyMeta(self.index, 1, 1_000 + self.index)
        expected = self.plain.apply(meta, command)
        got = self.paged.apply(meta, command)
        assert got == expected
        return got[0]

    def publish(self, batches: int, per_batch: int, priority: int = 0) -> None:
        for _ in range(batches):
            self.apply(
                encode_enqueue(
                    [NewMessage(b"m" * (k % 7), priority=priority) for k in range(per_batch)]
                )
            )

    def take(self, n: int) -> CheckedOut:
        reply = self.apply(encode_checkout("c", n, 60_000))
        assert isinstance(reply, CheckedOut)
        return reply

    def spilled(self) -> list[SpilledPage]:
        assert self.paged.pager is not None
        return [
            p
            for lane in self.paged.pager.lanes
            for p in lane.freeze().parts()
            if isinstance(p, SpilledPage)
        ]


def test_a_paged_machine_delivers_what_an_unpaged_one_does() -> None:
    q = Queue()
    q.publish(30, 7)
    q.publish(40, 1, priority=1)
    q.publish(5, 30)
    assert q.paged.pager is not None and q.paged.pager.stats().paged_out_pages > 10
    while q.plain.stats().messages_ready:
        q.take(23)
        q.paged.pager.read_ahead()
    assert q.paged.snapshot() == q.plain.snapshot()
    assert q.paged.pager.stats().resident_pages == 0
    assert q.paged.stats().paging.page_loads > 0


def test_a_closed_paged_machine_is_freed_without_the_cycle_collector() -> None:
    """A queue that falls asleep closes its machine and drops it: nothing of it may wait
    for the collector (thousands of such machines kept the allocator's arenas)."""
    q = Queue()
    q.publish(30, 7)
    q.take(5)
    gc.collect()
    gc.disable()
    try:
        q.paged.close()
        del q.paged
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_a_damaged_page_is_detected_and_rebuilt_from_the_log() -> None:
    q = Queue()
    q.publish(20, 7)
    q.publish(50, 1)
    q.publish(4, 30)  # refs of the long form
    for _ in range(40):  # fallback refs (40 KB messages) among small ones
        q.apply(encode_enqueue([NewMessage(b"a"), NewMessage(b"L" * 40_000), NewMessage(b"b")]))
    pages = q.spilled()
    assert len(pages) >= 6
    for page in pages[::2]:
        q.spill.damage(page.handle, bit=8 * 20)
    q.spill.drop(pages[1].handle)  # lost
    while q.plain.stats().messages_ready:
        q.take(50)
    assert q.paged.snapshot() == q.plain.snapshot()
    assert q.paged.stats().paging.pages_rebuilt == len(pages[::2]) + 1


def test_a_damaged_page_without_the_log_stops_the_machine() -> None:
    q = Queue(rebuild=False)
    q.publish(20, 7)
    page = q.spilled()[0]
    q.spill.damage(page.handle)
    with pytest.raises(PageDamaged) as caught:
        while q.plain.stats().messages_ready:
            q.take(50)
    assert caught.value.handle == page.handle


def test_a_damaged_page_of_a_returns_lane_is_not_guessed() -> None:
    q = Queue(dataclasses.replace(LIMITS, paged_index_bytes_per_queue_max=PAGE * 8))
    q.publish(10, 7)
    taken = q.take(60)
    q.apply(encode_return(list(zip(taken.tags, taken.refs, strict=True))))
    q.publish(10, 7)
    returns = [p for p in q.spilled() if p.first in set(taken.refs)]
    assert returns
    q.spill.damage(returns[0].handle)
    with pytest.raises(PageDamaged, match="returns lane"):
        q.paged.browse(None, 1000)


def test_a_checkpoint_names_stored_pages_instead_of_copying_them() -> None:
    """Its size does not grow with the pages out; restored on the same store, or sent
    inline to a follower, it is the same state."""
    q = Queue(BIG_PAGES)
    q.publish(400, 100)
    frozen = q.paged.freeze()
    q.spill.pin(1, frozen.page_handles())
    checkpoint = frozen.encode()
    full = q.paged.snapshot()
    state = read_snapshot(checkpoint)
    assert state.version == PAGED_VERSION
    whole = np.frombuffer(checkpoint, dtype=np.uint8)
    # Read without msgpack's copies: the held refs are views into the checkpoint.
    assert all(np.shares_memory(refs, whole) for _h, refs, _s in state.lanes if len(refs))
    assert len(checkpoint) * 5 < len(full)
    assert inline_snapshot(checkpoint, q.spill.load) == full == q.plain.snapshot()
    assert inline_snapshot(full, q.spill.load) is full
    assert page_handles_of(checkpoint) == frozen.page_handles() != []
    assert page_handles_of(full) == []
    for _ in range(10):  # the live machine moves on and drops pages the checkpoint names
        q.take(1000)
    restored = QueueMachine(q.paged.policy, BIG_PAGES, Paging(q.spill, q.node))
    restored.restore(checkpoint)
    assert restored.snapshot() == full
    plain = QueueMachine(q.paged.policy, BIG_PAGES)
    plain.restore(full)
    assert restored.live_indexes() == frozen.live_indexes() == plain.live_indexes()
    assert restored.stats().bytes_ready == plain.stats().bytes_ready
    restored.check_invariants()


def test_a_purge_reads_no_page_that_is_out() -> None:
    q = Queue()
    q.publish(40, 10)
    assert q.paged.pager is not None
    loads = q.paged.pager.stats().page_loads
    reply = q.apply(encode_purge())
    assert reply == Purged(400)
    assert q.paged.pager.stats().page_loads == loads
    assert len(q.spill) == 0 and q.paged.pager.resident == 0


def test_the_stats_report_the_pages_of_a_queue() -> None:
    q = Queue(BIG_PAGES)
    q.publish(250, 100)
    stats = q.paged.stats()
    assert stats.paging.resident_pages == 3  # the budget: the two next to the head, the tail
    assert stats.paging.paged_out_pages == 25 - 3 == stats.paging.page_writes
    assert stats.memory.index_bytes * 4 < q.plain.stats().memory.index_bytes
    assert q.plain.stats().paging.resident_pages == 0
