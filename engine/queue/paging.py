"""Paging of the ready index: which pages of a queue's lanes stay in memory, and the page
store the others go to.

Rule of this module: paging is a local storage decision, invisible to Raft and to the
machine's logic. The machine never does I/O itself: it is handed a ``PageSpill`` (the
page store: ``MemorySpill`` here for the tests and the simulator, ``PageFiles`` in
``engine.storage.page_files`` for a node) and calls it only through a ``QueuePager``.
What is ready, and in which order, never depends on what is resident: a page that is
out is loaded when it is read (``RefFifo._head_page`` / ``_hot``), so every replica
delivers the same messages whatever its budget, and ``QueueMachine.snapshot`` is the
same bytes.

Residency. Only full pages strictly between a lane's head page and its tail page are
ever spilled (the tail page is being written, the head page read). A queue keeps at
most ``pages_max`` pages resident, a node at most ``NodePages.pages_max`` over all its
queues (``Limits.paged_index_bytes_per_queue_max`` and ``_per_node_max``, counted in
pages of ``page_refs * 8`` bytes, the size of an unsealed page); pages that cannot be
spilled (heads and tails) count but are never refused, so a queue holds at least its
head and tail pages whatever the budget.

Eviction is Belady's rule, which is exact here rather than an approximation: the order
in which the ready messages will be consumed is known (lanes in delivery order, each a
FIFO), so the page whose next use is furthest away is the resident page farthest from
delivery, and spilling it first minimises the loads, whatever the consumer does next.
Messages published later never reorder the pages already held (a push to a higher
lane delays every page behind it alike). "Oldest loaded" would instead spill the page
read ahead first, the one about to be needed. Across the queues of a node, distances
in messages cannot be compared (their consumers run at unknown rates), so the node's
budget shares the pages out: the queue that needs room gives up its own farthest page
if it holds at least an even share of the pages the node could spill, else the queue
that holds the most gives up its farthest.

Read-ahead. The head page and the next ``read_ahead_pages`` pages in delivery order
(``Limits.page_read_ahead``) are loaded before consumption reaches them, so a steady
consumer does not wait on a load: the runtime prepares the loads on its loop
(``plan_read_ahead``), performs them in a worker (``load_plan``: ``PageSpill.load``,
nothing else is touched) and installs them back on the loop (``finish_read_ahead``),
which drops those no longer needed (the head passed them meanwhile). ``wants_read_ahead`` says when a
plan may find something (the head moved to a new page). A load the head meets before
read-ahead did it is a *wait*, done at once (``page_waits`` counts them).

Damage. Every load checks the stored bytes against the CRC32C kept in the
``SpilledPage``; a page that fails, or that the store has lost, raises ``PageDamaged``.
With a rebuild function (``Paging.read_log`` given to the machine) the page is rebuilt
from its enqueue entries, still live in the log (``engine.queue.page_rebuild``);
otherwise, or if it cannot be, ``PageDamaged`` leaves ``apply``, and the replica must be
repaired from its peers like one with a damaged entry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import crc32c
import numpy as np
import numpy.typing as npt

from engine.errors import PageDamaged, StorageFailed
from engine.index_sets import index_set
from engine.limits import Limits
from engine.queue.pages import RefFifo, SealedPage, SpilledPage, decode_page, encode_page, hot
from engine.queue.refs import FallbackTable, indexes_of, total_size

U64 = npt.NDArray[np.uint64]

PageSummary = tuple[int, int, int, bytes]
"""What a spilled page keeps of its refs: byte total, lowest and highest Raft index, and
the serialized set of its Raft indexes."""
LogReader = Callable[[list[int]], Iterable[tuple[int, bytes]]]
"""``(index, command)`` of the log entries at the given indexes, ascending (those the log
still holds)."""


class PageHost(Protocol):
    """What a pager asks of its queue's machine. One reference to the machine, not two
    bound methods: those were two objects more for the collector to walk per awake queue
    (10,000 queues woken at once after a restart)."""

    def describe_page(self, page: U64) -> PageSummary:
        """The summary of a page about to be stored (``summarize``)."""
        ...

    def rebuild_page(self, lane_no: int, page: SpilledPage) -> U64 | None:
        """The refs of a damaged page of lane number ``lane_no`` (``PageDamaged`` if they
        cannot be found again); None where the queue cannot read its log."""
        ...


class PageSpill(Protocol):
    """Where spilled pages go. ``store`` returns a handle of the store's choosing (an int
    that names the page from then on: only the store knows which names are free, those
    of pages older checkpoints keep included); ``load`` returns exactly the bytes stored
    or raises ``PageDamaged``; ``drop`` says the machine will never load the page again.
    ``store`` may raise ``StorageFailed`` (the page then stays in memory)."""

    def store(self, data: bytes) -> int: ...

    def load(self, handle: int) -> bytes: ...

    def drop(self, handle: int) -> None: ...


class MemorySpill:
    """A page store in memory, for the tests and the simulator. ``pin`` keeps pages a
    snapshot names past their ``drop`` until ``unpin``, as ``PageFiles`` does for
    checkpoints; ``damage`` flips a bit of a stored page."""

    def __init__(self) -> None:
        self._pages: dict[int, bytes] = {}
        self._dropped: set[int] = set()
        self._pins: dict[int, frozenset[int]] = {}
        self._next_handle = 1

    def __len__(self) -> int:
        return len(self._pages)

    def store(self, data: bytes) -> int:
        handle = self._next_handle
        self._next_handle += 1
        self._pages[handle] = bytes(data)
        return handle

    def load(self, handle: int) -> bytes:
        data = self._pages.get(handle)
        if data is None:
            raise PageDamaged(f"page {handle} is missing", handle=handle)
        return data

    def drop(self, handle: int) -> None:
        self._dropped.add(handle)
        self._collect()

    def pin(self, tag: int, handles: Iterable[int]) -> None:
        self._pins[tag] = frozenset(handles)

    def unpin(self, tag: int) -> None:
        self._pins.pop(tag, None)
        self._collect()

    def damage(self, handle: int, bit: int = 100) -> None:
        data = bytearray(self._pages[handle])
        data[bit // 8 % len(data)] ^= 1 << (bit % 8)
        self._pages[handle] = bytes(data)

    def _collect(self) -> None:
        pinned = frozenset().union(*self._pins.values())
        for handle in sorted(self._dropped - pinned):
            self._pages.pop(handle, None)
            self._dropped.discard(handle)


def summarize(page: U64, table: FallbackTable) -> PageSummary:
    indexes = indexes_of(page, table)
    # Neighbours share an entry (a batch) or follow each other: drop the repeats before
    # the set is built, which costs per value handed to it.
    step = np.empty(len(indexes), dtype=bool)
    step[0] = True
    np.not_equal(indexes[1:], indexes[:-1], out=step[1:])
    distinct = indexes[step]
    found = index_set(distinct)
    found.run_optimize()
    return total_size(page, table), int(distinct.min()), int(distinct.max()), found.serialize()


def summarize_compact(page: U64) -> PageSummary:
    """``summarize`` for refs that are all in a compact form (no fallback table)."""
    return summarize(page, FallbackTable())


class _CompactHost:
    """The host of a pager without a machine (the tests'): refs all in compact form, and
    no log to rebuild a page from."""

    __slots__ = ()

    def describe_page(self, page: U64) -> PageSummary:
        return summarize_compact(page)

    def rebuild_page(self, lane_no: int, page: SpilledPage) -> U64 | None:
        return None


COMPACT_HOST: PageHost = _CompactHost()


def page_bytes(limits: Limits) -> int:
    """What the budgets count a page as: an unsealed page of ``page_refs`` refs."""
    return limits.page_refs * 8


@dataclass(frozen=True, slots=True)
class PagingStats:
    """Of one queue's ready index (``QueueStats.paging``)."""

    resident_pages: int = 0
    paged_out_pages: int = 0
    page_writes: int = 0
    """Pages stored (a page loaded and spilled again is not stored again)."""
    page_loads: int = 0
    """Pages read from the store: read-ahead, waits, browse and whole-queue reads."""
    read_ahead_hits: int = 0
    """Pages the head reached after read-ahead had loaded them."""
    page_waits: int = 0
    """Pages the head reached while they were out: loaded then and there."""
    pages_rebuilt: int = 0
    """Damaged or lost pages rebuilt from the log."""
    page_write_failures: int = 0
    """Pages the store refused (they stayed in memory, over the budget)."""


NOT_PAGED = PagingStats()
"""The stats of a machine without paging."""


@dataclass(frozen=True, slots=True)
class Paging:
    """What a node gives a machine to page its ready index: the queue's page store, the
    node's budget, and a reader of log entries to rebuild a damaged page (None: a damaged
    page raises ``PageDamaged``)."""

    spill: PageSpill
    node: NodePages
    read_log: LogReader | None = None


class NodePages:
    """The page budget of a node, shared by the pagers of all its queues."""

    def __init__(self, pages_max: int) -> None:
        assert pages_max >= 1
        self.pages_max = pages_max
        self.resident = 0
        self.warm = 0
        """Resident pages that could be spilled, over every queue."""
        self._pagers: dict[int, QueuePager] = {}
        self._next_key = 0

    @classmethod
    def from_limits(cls, limits: Limits) -> NodePages:
        return cls(max(1, limits.paged_index_bytes_per_node_max // page_bytes(limits)))

    def join(self, pager: QueuePager) -> int:
        key = self._next_key
        self._next_key += 1
        self._pagers[key] = pager
        return key

    def leave(self, key: int) -> None:
        del self._pagers[key]

    def queues(self) -> int:
        return len(self._pagers)

    def spill_one(self, pager: QueuePager) -> bool:
        """Spill one page for the node's budget, asked by ``pager``'s queue: its own
        farthest if it holds at least its share of the node's spillable pages, else the
        farthest of the queue that holds the most (see the module's rule; the scan over
        the queues happens only then). Whether a page was spilled."""
        if self.warm <= 0:
            return False
        if pager.warm * len(self._pagers) >= self.warm:
            victim = pager
        else:
            victim = max(self._pagers.values(), key=lambda p: p.warm)
        return victim.spill_farthest()


@dataclass(frozen=True, slots=True)
class PageLoad:
    """One page ``plan_read_ahead`` wants loaded: ``spill.load(page.handle)``."""

    lane: RefFifo
    number: int
    page: SpilledPage


def load_plan(spill: PageSpill, plan: Sequence[PageLoad]) -> list[bytes | BaseException]:
    """The loads of a read-ahead plan, in a worker: touches the store and nothing else
    (``PageDamaged`` is handed back in place of the page, for ``finish_read_ahead``)."""
    loaded: list[bytes | BaseException] = []
    for load in plan:
        try:
            loaded.append(spill.load(load.page.handle))
        except PageDamaged as e:
            loaded.append(e)
    return loaded


class QueuePager:
    """The residency of one queue's lanes (see the module's rule)."""

    # Slots: one per queue, thousands on a node (no instance dict each).
    __slots__ = (
        "_host",
        "_key",
        "lanes",
        "node",
        "page_loads",
        "page_waits",
        "page_write_failures",
        "page_writes",
        "pages_max",
        "pages_rebuilt",
        "read_ahead_hits",
        "read_ahead_pages",
        "resident",
        "spill",
        "wants_read_ahead",
        "warm",
    )

    def __init__(
        self,
        spill: PageSpill,
        node: NodePages,
        pages_max: int,
        read_ahead_pages: int,
        host: PageHost = COMPACT_HOST,
    ) -> None:
        assert pages_max >= 1 and read_ahead_pages >= 0
        self.spill = spill
        self.node = node
        self.pages_max = pages_max
        self.read_ahead_pages = read_ahead_pages
        self._host = host
        self.lanes: tuple[RefFifo, ...] = ()
        """The lanes in delivery order (``engine.queue.lanes``), set once they exist."""
        self.resident = 0
        self.warm = 0
        self.wants_read_ahead = False
        self.page_writes = self.page_loads = self.read_ahead_hits = 0
        self.page_waits = self.pages_rebuilt = self.page_write_failures = 0
        self._key = node.join(self)

    @classmethod
    def from_limits(cls, paging: Paging, limits: Limits, host: PageHost) -> QueuePager:
        pages_max = max(1, limits.paged_index_bytes_per_queue_max // page_bytes(limits))
        return cls(paging.spill, paging.node, pages_max, limits.page_read_ahead, host)

    def close(self) -> None:
        """The queue is gone or replaced: its pages no longer count against the node.
        Its links to the machine (its ``host``) and to the lanes
        (whose pages point back at it) go too: those are reference cycles, and a machine
        left in one waited for the collector's oldest generation instead of being freed
        when its queue fell asleep (thousands of dropped machines raised the peak that
        the allocator's arenas keep)."""
        self.note(resident=-self.resident, warm=-self.warm)
        self.node.leave(self._key)
        self.lanes = ()
        self._host = COMPACT_HOST

    # --- what the lanes call ------------------------------------------------------------

    def note(self, resident: int = 0, warm: int = 0) -> None:
        self.resident += resident
        self.warm += warm
        self.node.resident += resident
        self.node.warm += warm

    def head_moved(self) -> None:
        self.wants_read_ahead = True

    def make_room(self) -> None:
        """Spill the pages farthest from delivery while over the queue's or the node's
        budget (Belady: see the module's rule)."""
        while self.resident > self.pages_max and self.spill_farthest():
            pass
        node = self.node
        while node.resident > node.pages_max and node.spill_one(self):
            pass

    def spill_farthest(self) -> bool:
        """Spill this queue's resident page farthest from delivery; whether it did."""
        for lane in reversed(self.lanes):
            if lane.farthest_warm() is not None:
                return self._spill(lane)
        return False

    def _spill(self, lane: RefFifo) -> bool:
        """A store that refuses a page (disk full, I/O error) leaves it resident, over
        the budget, rather than fail the command being applied."""
        try:
            lane.spill_farthest()
        except StorageFailed:
            self.page_write_failures += 1
            return False
        return True

    def write(self, page: U64 | SealedPage) -> SpilledPage:
        """Store a page; what stands for it in its lane from then on."""
        refs = hot(page)
        data = encode_page(page)
        size_bytes, lo, hi, indexes = self._host.describe_page(refs)
        handle = self.spill.store(data)
        self.page_writes += 1
        first, last = int(refs[0]), int(refs[-1])
        return SpilledPage(
            handle, len(refs), crc32c.crc32c(data), first, last, size_bytes, lo, hi, indexes
        )

    def load(self, page: SpilledPage) -> U64 | SealedPage:
        """A page the head reached while it was out (a wait)."""
        self.page_waits += 1
        return self._fetch(page)

    def read(self, page: SpilledPage) -> U64:
        """The refs of a spilled page for one read (browse, a whole-queue read), left out."""
        held = page.resident
        return hot(held if held is not None else self._fetch(page))

    def release(self, page: SpilledPage, reached: bool) -> None:
        """The lane let go of a spilled page (the head reached it, or the lane was
        emptied): the store may forget it."""
        if reached and page.prefetched:
            self.read_ahead_hits += 1
        page.prefetched = False
        self.spill.drop(page.handle)

    def _fetch(self, page: SpilledPage) -> U64 | SealedPage:
        try:
            return self._checked(page, self.spill.load(page.handle))
        except PageDamaged:
            lane_no = next((n for n, lane in enumerate(self.lanes) if lane.holds(page)), None)
            refs = None if lane_no is None else self._host.rebuild_page(lane_no, page)
            if refs is None:
                raise
            self.pages_rebuilt += 1
            return refs

    def _checked(self, page: SpilledPage, data: bytes) -> U64 | SealedPage:
        self.page_loads += 1
        if crc32c.crc32c(data) != page.crc:
            raise PageDamaged(f"page {page.handle} fails its CRC32C check", handle=page.handle)
        out = decode_page(data)
        count = len(out.deltas) + 1 if isinstance(out, SealedPage) else len(out)
        assert count == page.count, "a page that passes its CRC is the page stored"
        return out

    # --- read-ahead ---------------------------------------------------------------------

    def plan_read_ahead(self) -> list[PageLoad]:
        """On the loop: the pages out among the head page and the ``read_ahead_pages``
        after it, in delivery order over the lanes, nearest first."""
        self.wants_read_ahead = False
        left = self.read_ahead_pages + 1
        plan: list[PageLoad] = []
        for lane in self.lanes:
            for number, page in lane.window(left):
                left -= 1
                if isinstance(page, SpilledPage) and page.resident is None:
                    plan.append(PageLoad(lane, number, page))
            if left <= 0:
                break
        return plan

    def finish_read_ahead(
        self, plan: Sequence[PageLoad], loaded: Sequence[bytes | BaseException]
    ) -> int:
        """On the loop: install the pages loaded for ``plan``, nearest first, while the
        budgets allow (making room by spilling only pages farther than the one installed);
        a page the head took meanwhile is dropped, a damaged one left out (the head
        rebuilds it when it gets there). Returns the pages installed."""
        installed = 0
        for load, data in zip(plan, loaded, strict=True):
            if isinstance(data, BaseException) or not load.lane.holds(load.page, load.number):
                continue
            if load.page.resident is not None:
                continue
            if not self._room_before(load):
                break
            try:
                page = self._checked(load.page, data)
            except PageDamaged:
                continue
            installed += load.lane.install(load.number, load.page, page)
        return installed

    def read_ahead(self) -> int:
        """``plan_read_ahead``, ``load_plan`` and ``finish_read_ahead`` at once (the tests
        and the simulator, whose stores are in memory)."""
        plan = self.plan_read_ahead()
        return self.finish_read_ahead(plan, load_plan(self.spill, plan))

    def _room_before(self, load: PageLoad) -> bool:
        """Make room for one more resident page by spilling pages farther than ``load``'s;
        whether there is room."""
        lane_no = self.lanes.index(load.lane)
        node = self.node
        while self.resident >= self.pages_max or node.resident >= node.pages_max:
            if not self._spill_beyond(lane_no, load.number):
                return False
        return True

    def _spill_beyond(self, lane_no: int, number: int) -> bool:
        for n in range(len(self.lanes) - 1, lane_no - 1, -1):
            lane = self.lanes[n]
            far = lane.farthest_warm()
            if far is not None and (n > lane_no or far > number):
                return self._spill(lane)
        return False

    # --- what it reports ----------------------------------------------------------------

    def paged_out_pages(self) -> int:
        return sum(lane.out_pages() for lane in self.lanes)

    def stats(self) -> PagingStats:
        return PagingStats(
            resident_pages=self.resident,
            paged_out_pages=self.paged_out_pages(),
            page_writes=self.page_writes,
            page_loads=self.page_loads,
            read_ahead_hits=self.read_ahead_hits,
            page_waits=self.page_waits,
            pages_rebuilt=self.pages_rebuilt,
            page_write_failures=self.page_write_failures,
        )

    def check(self) -> None:
        assert self.resident == sum(lane.resident_pages() for lane in self.lanes)
        assert self.warm == sum(lane.warm_pages() for lane in self.lanes)


__all__ = [
    "COMPACT_HOST",
    "NOT_PAGED",
    "LogReader",
    "MemorySpill",
    "NodePages",
    "PageHost",
    "PageLoad",
    "PageSpill",
    "PageSummary",
    "Paging",
    "PagingStats",
    "QueuePager",
    "load_plan",
    "page_bytes",
    "summarize",
    "summarize_compact",
]
