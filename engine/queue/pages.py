"""A FIFO of packed references in fixed-size pages (the ready messages of one lane; the
forms a page takes, hot, sealed and spilled, are ``engine.queue.page_forms``).

Rule of this module: no Python object per message. A page is a numpy ``uint64`` array of
``page_refs`` slots; the FIFO is a list of pages, with a read offset in the first page
and a fill count in the last. Only the head page is read and only the tail page is
written, so every page in between is immutable while it sits there: such a *cold* page
can be spilled to a page store as one contiguous block and loaded back when it reaches
the head, without touching the others (the Qpid paged-queue design, restricted to what
a FIFO needs; the policy is ``engine.queue.paging``).

A page that is full and no longer the head is *sealed*: if every step between
neighbouring refs fits in a signed 32-bit integer (refs of consecutive slots and entries
differ by small multiples of 2^15..2^25), it is kept as its first ref plus int32 deltas,
4 bytes per message instead of 8, and expanded back when it reaches the head. Deltas
are taken modulo 2^64, so the round trip is exact for every form of ref.

A *spilled* page (``SpilledPage``, only with a pager) stands in the list for a full page
whose refs are in the pager's store: it keeps what the machine needs without the refs
(count, bytes, the Raft indexes they name) and, while it is loaded again (read-ahead),
the page itself. Only pages strictly between the head page and the tail page are
spilled; ``_warm`` lists the resident ones by absolute page number, so that the pager
finds the farthest one at once. Every read goes through ``_head_page`` or ``_hot``,
which load a spilled page as they meet it: what is ready, and in which order, never
depends on what is resident.

A FIFO restored from a snapshot *adopts* the snapshot's array (``adopt``): its pages
but the tail one (and a head page it must pad) are read-only views into it, unsealed,
so that a restore copies nothing; a snapshot may also name spilled pages instead of
holding their refs (``engine.queue.snapshots``).

An idle queue pays for no full page: the tail page starts at ``TAIL_REFS_MIN`` slots and
doubles as it fills, up to ``page_refs`` (a new array each time, so that a frozen FIFO
keeps the smaller one: the rule below holds), and an empty FIFO shares one empty list
(``_NO_PAGES``) instead of holding its own. Only the tail page may be short: a page is
full (``page_refs`` refs) before another one follows it.

The pages are a list, not a deque: a deque of one page holds 760 bytes (a block of 64
slots), a list 88, and most queues hold one page or none. Taking the head page moves
the others down a slot: 100 KB of pointers for a queue of 50 million messages, once per
``page_refs`` messages consumed; indexing a page by its number (the pager's) is direct.

Positions are absolute: ``head_pos`` counts every ref ever popped, so a browse cursor
stays valid while the head moves.

A page array is never reused once it leaves the FIFO, and a page is only ever replaced,
never changed, except for the slots past the tail's fill count. So ``freeze`` takes the
refs of a moment in time proportional to the number of pages, not of refs, and the
copy of them (``FrozenRefs.to_array``) may be made later, on another thread, while the
FIFO moves on: a checkpoint of a deep queue does not hold up the event loop.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from engine.queue.page_forms import (
    U64,
    Page,
    PageReader,
    SealedPage,
    SpilledPage,
    decode_page,
    encode_page,
    hot,
)
from engine.queue.page_forms import nbytes as _nbytes
from engine.queue.page_forms import refs_of as _refs_of

if TYPE_CHECKING:
    from engine.queue.paging import QueuePager

TAIL_REFS_MIN = 16
"""Slots of a new tail page: it doubles from there as it fills (an idle queue with a
few messages holds 128 bytes of refs, not a page of 32 KiB)."""


_NO_PAGES: list[Page] = []
"""The pages of every empty FIFO: never appended to (``RefFifo._append_page``)."""
_NO_WARM: list[int] = []
"""The warm pages of every FIFO that has none (a FIFO of one or two pages, the usual
queue): never added to, so that a woken queue's two lanes keep no empty list each for
the collector to walk."""
"""Loads the refs of a spilled page for one read, without making it resident."""


def _capacity(refs: int) -> int:
    """Slots of a short tail page for ``refs`` refs: a power of two, at least
    ``TAIL_REFS_MIN`` (the caller caps it at a page)."""
    return max(TAIL_REFS_MIN, 1 << (refs - 1).bit_length())


def _page_len(page: U64 | SealedPage) -> int:
    return len(page.deltas) + 1 if isinstance(page, SealedPage) else len(page)


class FrozenRefs:
    """The refs a ``RefFifo`` held when ``freeze`` was called."""

    __slots__ = ("_head", "_page_refs", "_pages", "_read", "_tail", "head_pos")

    def __init__(
        self,
        pages: tuple[Page, ...],
        head: int,
        tail: int,
        page_refs: int,
        head_pos: int,
        read: PageReader | None = None,
    ) -> None:
        self._pages = pages
        self._head = head
        self._tail = tail
        self._page_refs = page_refs
        self._read = read
        self.head_pos = head_pos

    def _pieces(self) -> Iterator[tuple[Page, int, int]]:
        last = len(self._pages) - 1
        for i, page in enumerate(self._pages):
            lo = self._head if i == 0 else 0
            hi = self._tail if i == last else self._page_refs
            if hi > lo:
                yield page, lo, hi

    def chunks(self) -> Iterator[U64]:
        """Every ref, a page at a time; spilled pages are read (``to_array`` too)."""
        for page, lo, hi in self._pieces():
            yield _refs_of(page, self._read)[lo:hi]

    def parts(self) -> Iterator[U64 | SpilledPage]:
        """The refs in order, a page at a time: the refs of a page held only in memory,
        the ``SpilledPage`` of one that has a stored copy (whole: such a page is full
        and none of it has been taken). Nothing is read from the page store."""
        for page, lo, hi in self._pieces():
            if isinstance(page, SpilledPage):
                assert lo == 0 and hi == page.count
                yield page
            else:
                yield _refs_of(page, None)[lo:hi]

    def to_array(self) -> U64:
        parts = list(self.chunks())
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.uint64)


class RefFifo:
    __slots__ = (
        "_cold",
        "_first_no",
        "_head",
        "_len",
        "_page_refs",
        "_pager",
        "_pages",
        "_tail",
        "_warm",
        "head_pos",
    )

    def __init__(self, page_refs: int, pager: QueuePager | None = None) -> None:
        assert page_refs >= 16 and page_refs & (page_refs - 1) == 0
        self._page_refs = page_refs
        self._pager = pager
        self._pages: list[Page] = _NO_PAGES
        self._head = 0
        """Read offset in ``_pages[0]``."""
        self._tail = 0
        """Fill count of ``_pages[-1]``."""
        self._len = 0
        self.head_pos = 0
        self._first_no = 0
        """Absolute number of ``_pages[0]``: pages are numbered in the order made."""
        self._warm: list[int] = _NO_WARM
        """With a pager: the numbers of the resident pages strictly between the head page
        and the tail page, ascending: the pages the pager may spill."""
        self._cold = 0
        """Spilled pages not resident."""

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def nbytes(self) -> int:
        """Resident bytes of the pages (array headers included)."""
        return sum(p.nbytes() if isinstance(p, SpilledPage) else _nbytes(p) for p in self._pages)

    def _new_tail_page(self) -> U64:
        """Append an empty page; seal the one before it unless it is the head."""
        if len(self._pages) >= 2:
            prev = self._pages[-1]
            assert isinstance(prev, np.ndarray) and len(prev) == self._page_refs
            sealed = SealedPage.maybe_seal(prev)
            if sealed is not None:
                self._pages[-1] = sealed
        page = np.empty(min(self._page_refs, TAIL_REFS_MIN), dtype=np.uint64)
        self._append_page(page)
        self._tail = 0
        if self._pager is not None:
            if len(self._pages) >= 3:
                if self._warm is _NO_WARM:
                    self._warm = []
                self._warm.append(self._first_no + len(self._pages) - 2)
                self._pager.note(resident=1, warm=1)
            else:
                self._pager.note(resident=1)
            self._pager.make_room()
        return page

    def _append_page(self, page: Page) -> None:
        if self._pages is _NO_PAGES:
            self._pages = [page]
        else:
            self._pages.append(page)

    def _tail_room(self, k: int) -> U64:
        """The tail page, replaced by a larger copy (doubling, at most a page) when it has
        no room for ``k`` more refs (``k`` at most what the page lacks to be full)."""
        tail = self._pages[-1]
        assert isinstance(tail, np.ndarray)
        need = self._tail + k
        assert need <= self._page_refs
        if need > len(tail):
            size = min(self._page_refs, max(2 * len(tail), _capacity(need)))
            grown = np.empty(size, dtype=np.uint64)
            grown[: self._tail] = tail[: self._tail]
            tail = grown
            self._pages[-1] = grown
        return tail

    def _head_page(self) -> U64:
        page = self._pages[0]
        if isinstance(page, np.ndarray):
            return page
        out = self._pages[0] = self._heat(page)
        return out

    def _heat(self, page: SealedPage | SpilledPage) -> U64:
        """The head page made hot: expanded, and loaded first if it is spilled (its
        stored copy is then dropped: the head page is never spilled again)."""
        if isinstance(page, SpilledPage):
            pager = self._pager
            assert pager is not None and self._head == 0
            held = page.resident
            if held is None:
                held = pager.load(page)
                page.resident = held
                self._cold -= 1
                pager.note(resident=1)
                pager.make_room()
            pager.release(page, reached=True)
            return hot(held)
        return page.expand()

    def _hot(self, i: int) -> U64:
        page = self._pages[i]
        if isinstance(page, np.ndarray):
            return page
        return _refs_of(page, None if self._pager is None else self._pager.read)

    def push(self, ref: int) -> None:
        if not self._pages or self._tail == self._page_refs:
            self._new_tail_page()
        tail = self._tail_room(1)
        tail[self._tail] = ref
        self._tail += 1
        self._len += 1

    def push_many(self, refs: U64) -> None:
        done = 0
        n = len(refs)
        while done < n:
            if not self._pages or self._tail == self._page_refs:
                self._new_tail_page()
            k = min(n - done, self._page_refs - self._tail)
            tail = self._tail_room(k)
            tail[self._tail : self._tail + k] = refs[done : done + k]
            self._tail += k
            done += k
        self._len += n

    def adopt(
        self, refs: U64, head_pos: int, spilled: Sequence[tuple[int, SpilledPage]] = ()
    ) -> None:
        """Fill an empty FIFO from a snapshot without copying ``refs``, which must never
        change: the lane's refs, but for the full pages it names in ``spilled`` as
        ``(position among the lane's refs, page)``, in order and never last. Pages are
        read-only views into ``refs`` (read, never written: only the tail page is), not
        sealed; the tail page is copied, and so is a partly taken head page that comes
        before a spilled page (it is padded so that the spilled pages stay whole)."""
        assert not self._pages and refs.dtype == np.uint64
        if not spilled and not len(refs):  # an empty lane (a returns lane, most often)
            self.head_pos = head_pos
            return
        taken = done = 0
        for at, page in spilled:
            run = refs[taken : taken + at - done]
            assert len(run) == at - done and page.count == self._page_refs
            self._adopt_run(run, last=False)
            self._append_page(page)
            if page.resident is None:
                self._cold += 1
            taken += len(run)
            done = at + page.count
        self._adopt_run(refs[taken:], last=True)
        assert not spilled or isinstance(self._pages[-1], np.ndarray), "the tail is held"
        self._len = len(refs) + sum(page.count for _at, page in spilled)
        self.head_pos = head_pos
        if self._pager is not None:
            pages = len(self._pages)
            # One pass, no copy of the page list (a deep queue has tens of thousands).
            between = itertools.islice(self._pages, 1, max(1, pages - 1))
            self._warm = [
                n
                for n, p in enumerate(between, 1)
                if not isinstance(p, SpilledPage) or p.resident is not None
            ] or _NO_WARM
            self._pager.note(resident=pages - self._cold, warm=len(self._warm))

    def _adopt_run(self, run: U64, last: bool) -> None:
        size = self._page_refs
        n = len(run)
        at = 0
        if not self._pages and not last and n % size:
            pad = size - n % size
            head = np.empty(size, dtype=np.uint64)
            head[pad:] = run[: size - pad]
            self._append_page(head)
            self._head = pad
            at = size - pad
        cut = at + (n - at - 1) // size * size if last and n > at else n
        assert last or (n - at) % size == 0, "spilled pages are whole"
        for lo in range(at, cut, size):
            self._append_page(run[lo : lo + size])
        if last and n > cut:
            tail = np.empty(min(size, _capacity(n - cut)), dtype=np.uint64)
            tail[: n - cut] = run[cut:]
            self._append_page(tail)
            self._tail = n - cut
        elif last and not self._pages:
            self._tail = 0

    def peek(self) -> int:
        assert self._len > 0
        return int(self._head_page()[self._head])

    def pop(self) -> int:
        ref = self.peek()
        self._advance(1)
        return ref

    def pop_many(self, n: int) -> U64:
        """Up to ``n`` refs from the head, in order, as a new array."""
        n = min(n, self._len)
        if n == 0:
            return np.empty(0, dtype=np.uint64)
        first = self._head_page()
        end = self._page_end(0)
        if self._head + n <= end:
            out = first[self._head : self._head + n].copy()
            self._advance(n)
            return out
        parts: list[U64] = []
        left = n
        while left:
            end = self._page_end(0)
            k = min(left, end - self._head)
            parts.append(self._head_page()[self._head : self._head + k].copy())
            self._advance(k)
            left -= k
        return np.concatenate(parts)

    def _page_end(self, i: int) -> int:
        return self._tail if i == len(self._pages) - 1 else self._page_refs

    def _advance(self, n: int) -> None:
        self._head += n
        self._len -= n
        self.head_pos += n
        assert self._head <= self._page_end(0)
        if self._head == self._page_end(0):
            del self._pages[0]
            self._head = 0
            self._first_no += 1
            if not self._pages:
                self._pages = _NO_PAGES
                self._tail = 0
            if self._pager is not None:
                self._page_taken(self._pager)
        assert self._len >= 0

    def _page_taken(self, pager: QueuePager) -> None:
        """The head page was used up and left (it was resident: the head read it)."""
        warm = 0
        if self._warm and self._warm[0] == self._first_no:
            del self._warm[0]  # the new head page is no longer between head and tail
            warm = -1
        pager.note(resident=-1, warm=warm)
        pager.head_moved()

    # --- paging (the pager calls these) -------------------------------------------------

    def resident_pages(self) -> int:
        return len(self._pages) - self._cold

    def out_pages(self) -> int:
        return self._cold

    def warm_pages(self) -> int:
        return len(self._warm)

    def holds(self, page: SpilledPage, number: int | None = None) -> bool:
        """Whether ``page`` is in this lane (at ``number``, when given: O(1))."""
        if number is None:
            return any(p is page for p in self._pages)
        i = number - self._first_no
        return 0 <= i < len(self._pages) and self._pages[i] is page

    def farthest_warm(self) -> int | None:
        """The number of the resident page farthest from the head that may be spilled."""
        return self._warm[-1] if self._warm else None

    def spill_farthest(self) -> None:
        """Spill ``farthest_warm``: drop the resident copy of a page already stored, or
        store the page (if the store refuses it, ``StorageFailed``, the page stays)."""
        pager = self._pager
        assert pager is not None
        n = self._warm[-1]
        i = n - self._first_no
        assert 0 < i < len(self._pages) - 1
        page = self._pages[i]
        if isinstance(page, SpilledPage):
            assert page.resident is not None
            page.resident = None
            page.prefetched = False
        else:
            self._pages[i] = pager.write(page)  # may raise StorageFailed: nothing changed
        self._warm.pop()
        self._cold += 1
        pager.note(resident=-1, warm=-1)

    def window(self, pages: int) -> Iterator[tuple[int, Page]]:
        """(number, page) of the first ``pages`` pages, from the head."""
        for i in range(min(pages, len(self._pages))):
            yield self._first_no + i, self._pages[i]

    def install(self, n: int, page: SpilledPage, loaded: U64 | SealedPage) -> bool:
        """Make spilled page number ``n`` resident with ``loaded`` (read-ahead), if it is
        still here and out; whether it was."""
        pager = self._pager
        assert pager is not None
        if not self.holds(page, n) or page.resident is not None:
            return False
        i = n - self._first_no
        page.resident = loaded
        page.prefetched = True
        self._cold -= 1
        warm = 0
        if 0 < i < len(self._pages) - 1:
            if self._warm is _NO_WARM:
                self._warm = []
            bisect.insort(self._warm, n)
            warm = 1
        pager.note(resident=1, warm=warm)
        return True

    # --- whole-FIFO operations ------------------------------------------------------------

    def drain(self, read: bool) -> tuple[list[U64], int, int]:
        """Remove everything. Returns the refs read, in order (all of them when ``read``,
        else all but those of spilled pages that are out), and the count and byte total
        of the refs left unread."""
        chunks: list[U64] = []
        unread = unread_bytes = 0
        pager = self._pager
        for page, lo, hi in self.freeze()._pieces():
            if isinstance(page, SpilledPage) and page.resident is None and not read:
                unread += page.count
                unread_bytes += page.size_bytes
            else:
                chunks.append(self._refs(page)[lo:hi])
            if isinstance(page, SpilledPage):
                assert pager is not None
                pager.release(page, reached=False)
        self.head_pos += self._len
        if pager is not None:
            pager.note(resident=-self.resident_pages(), warm=-len(self._warm))
        self._first_no += len(self._pages)
        self._pages = _NO_PAGES
        self._warm = _NO_WARM
        self._head = self._tail = self._len = self._cold = 0
        return chunks, unread, unread_bytes

    def _refs(self, page: Page) -> U64:
        return _refs_of(page, None if self._pager is None else self._pager.read)

    def clear(self) -> U64:
        """Remove everything; returns the refs that were there, in order."""
        chunks, unread, _ = self.drain(read=True)
        assert unread == 0
        return np.concatenate(chunks) if chunks else np.empty(0, dtype=np.uint64)

    def freeze(self) -> FrozenRefs:
        """The refs now, in time proportional to the pages (see the module's rule)."""
        read = None if self._pager is None else self._pager.read
        return FrozenRefs(
            tuple(self._pages), self._head, self._tail, self._page_refs, self.head_pos, read
        )

    def chunks(self) -> Iterator[U64]:
        """Views of the refs in order, one per page (read-only use)."""
        return self.freeze().chunks()

    def to_array(self) -> U64:
        return self.freeze().to_array()

    def slice_from(self, pos: int, limit: int) -> U64:
        """Up to ``limit`` refs starting at absolute position ``pos`` (>= ``head_pos``)."""
        offset = max(0, pos - self.head_pos)
        if offset >= self._len or limit <= 0:
            return np.empty(0, dtype=np.uint64)
        at = self._head + offset
        page_i, in_page = divmod(at, self._page_refs)
        parts: list[U64] = []
        left = min(limit, self._len - offset)
        while left:
            hi = self._page_end(page_i)
            k = min(left, hi - in_page)
            parts.append(self._hot(page_i)[in_page : in_page + k])
            left -= k
            page_i += 1
            in_page = 0
        return np.concatenate(parts)

    def check(self) -> None:
        """Invariants; the tests call it after every step."""
        total = sum(len(c) for c in self.chunks())
        assert total == self._len, (total, self._len)
        assert (self._len == 0) == (not self._pages)
        assert not _NO_PAGES and not _NO_WARM, "a shared empty list was appended to"
        assert not self._pages or self._pages is not _NO_PAGES
        for page in list(self._pages)[:-1]:
            assert isinstance(page, SpilledPage) or _page_len(page) == self._page_refs
        if self._pages:
            tail = self._pages[-1]
            assert isinstance(tail, np.ndarray) and self._tail <= len(tail) <= self._page_refs
        pages = list(self._pages)
        spilled = [i for i, p in enumerate(pages) if isinstance(p, SpilledPage)]
        out = [i for i in spilled if pages[i].resident is None]  # type: ignore[union-attr]
        assert self._cold == len(out), (self._cold, out)
        assert not spilled or spilled[-1] < len(pages) - 1, "the tail page is held"
        assert not spilled or spilled[0] > 0 or self._head == 0
        if self._pager is None:
            assert not spilled and not self._warm
            return
        held = [self._first_no + i for i in range(1, len(pages) - 1) if i not in set(out)]
        assert self._warm == held, (self._warm, held)


__all__ = [
    "FrozenRefs",
    "Page",
    "PageReader",
    "RefFifo",
    "SealedPage",
    "SpilledPage",
    "decode_page",
    "encode_page",
    "hot",
]
