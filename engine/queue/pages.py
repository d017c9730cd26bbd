"""A FIFO of packed references in fixed-size pages (the ready messages of one lane).

Rule of this module: no Python object per message. A page is a numpy ``uint64`` array of
``page_refs`` slots; the FIFO is a deque of pages, with a read offset in the first page
and a fill count in the last. Only the head page is read and only the tail page is
written, so every page in between is immutable while it sits there: such a *cold* page
could be spilled to disk as one contiguous block (``page.tobytes()``) and loaded back
when it reaches the head, without touching the others (the Qpid paged-queue design,
restricted to what a FIFO needs).

A page that is full and no longer the head is *sealed*: if every step between
neighbouring refs fits in a signed 32-bit integer (refs of consecutive slots and entries
differ by small multiples of 2^15..2^25), it is kept as its first ref plus int32 deltas,
4 bytes per message instead of 8, and expanded back when it reaches the head. Deltas
are taken modulo 2^64, so the round trip is exact for every form of ref.

A FIFO restored from a snapshot *adopts* the snapshot's array (``adopt``): its pages
but the tail one are read-only views into it, unsealed, so that a restore copies nothing.

Positions are absolute: ``head_pos`` counts every ref ever popped, so a browse cursor
stays valid while the head moves.

A page array is never reused once it leaves the FIFO, and a page is only ever replaced,
never changed, except for the slots past the tail's fill count. So ``freeze`` takes the
refs of a moment in time proportional to the number of pages, not of refs, and the
copy of them (``FrozenRefs.to_array``) may be made later, on another thread, while the
FIFO moves on: a checkpoint of a deep queue does not hold up the event loop.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

U64 = npt.NDArray[np.uint64]
_ARRAY_HEADER_BYTES = 112
_I32_MIN = -(1 << 31)
_I32_MAX = (1 << 31) - 1


class SealedPage:
    """A full page stored as its first ref and the int32 steps between neighbours."""

    __slots__ = ("deltas", "first")

    def __init__(self, first: int, deltas: npt.NDArray[np.int32]) -> None:
        self.first = first
        self.deltas = deltas

    @classmethod
    def maybe_seal(cls, page: U64) -> SealedPage | None:
        steps = np.diff(page).view(np.int64)
        if len(steps) and (steps.min() < _I32_MIN or steps.max() > _I32_MAX):
            return None
        return cls(int(page[0]), steps.astype(np.int32))

    def expand(self) -> U64:
        out = np.empty(len(self.deltas) + 1, dtype=np.uint64)
        out[0] = self.first
        np.cumsum(self.deltas.astype(np.int64).view(np.uint64), out=out[1:])
        out[1:] += np.uint64(self.first)
        return out

    def nbytes(self) -> int:
        return int(self.deltas.nbytes) + _ARRAY_HEADER_BYTES + 56


Page = U64 | SealedPage


class FrozenRefs:
    """The refs a ``RefFifo`` held when ``freeze`` was called."""

    __slots__ = ("_head", "_page_refs", "_pages", "_tail", "head_pos")

    def __init__(
        self, pages: tuple[Page, ...], head: int, tail: int, page_refs: int, head_pos: int
    ) -> None:
        self._pages = pages
        self._head = head
        self._tail = tail
        self._page_refs = page_refs
        self.head_pos = head_pos

    def chunks(self) -> Iterator[U64]:
        last = len(self._pages) - 1
        for i, page in enumerate(self._pages):
            lo = self._head if i == 0 else 0
            hi = self._tail if i == last else self._page_refs
            if hi > lo:
                hot = page.expand() if isinstance(page, SealedPage) else page
                yield hot[lo:hi]

    def to_array(self) -> U64:
        parts = list(self.chunks())
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.uint64)


class RefFifo:
    __slots__ = ("_head", "_len", "_page_refs", "_pages", "_tail", "head_pos")

    def __init__(self, page_refs: int) -> None:
        assert page_refs >= 16 and page_refs & (page_refs - 1) == 0
        self._page_refs = page_refs
        self._pages: deque[Page] = deque()
        self._head = 0
        """Read offset in ``_pages[0]``."""
        self._tail = 0
        """Fill count of ``_pages[-1]``."""
        self._len = 0
        self.head_pos = 0

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def nbytes(self) -> int:
        """Resident bytes of the pages (array headers included)."""
        return sum(
            p.nbytes() if isinstance(p, SealedPage) else int(p.nbytes) + _ARRAY_HEADER_BYTES
            for p in self._pages
        )

    def _new_tail_page(self) -> U64:
        """Append an empty page; seal the one before it unless it is the head."""
        if len(self._pages) >= 2:
            prev = self._pages[-1]
            assert not isinstance(prev, SealedPage)
            sealed = SealedPage.maybe_seal(prev)
            if sealed is not None:
                self._pages[-1] = sealed
        page = np.empty(self._page_refs, dtype=np.uint64)
        self._pages.append(page)
        self._tail = 0
        return page

    def _hot(self, i: int) -> U64:
        page = self._pages[i]
        return page.expand() if isinstance(page, SealedPage) else page

    def _head_page(self) -> U64:
        page = self._pages[0]
        if isinstance(page, SealedPage):
            page = self._pages[0] = page.expand()
        return page

    def push(self, ref: int) -> None:
        if not self._pages or self._tail == self._page_refs:
            self._new_tail_page()
        tail = self._pages[-1]
        assert not isinstance(tail, SealedPage)
        tail[self._tail] = ref
        self._tail += 1
        self._len += 1

    def push_many(self, refs: U64) -> None:
        done = 0
        n = len(refs)
        while done < n:
            if not self._pages or self._tail == self._page_refs:
                self._new_tail_page()
            tail = self._pages[-1]
            assert not isinstance(tail, SealedPage)
            k = min(n - done, self._page_refs - self._tail)
            tail[self._tail : self._tail + k] = refs[done : done + k]
            self._tail += k
            done += k
        self._len += n

    def adopt(self, refs: U64, head_pos: int) -> None:
        """Fill an empty FIFO with ``refs`` (a restored snapshot) without copying them: every
        page but the tail one is a read-only view into ``refs``, which must never change.
        Such pages are read, never written (only the tail page is), and are not sealed."""
        assert not self._pages and refs.dtype == np.uint64
        n = len(refs)
        cut = (n - 1) // self._page_refs * self._page_refs if n else 0
        for lo in range(0, cut, self._page_refs):
            self._pages.append(refs[lo : lo + self._page_refs])
        if n:
            tail = np.empty(self._page_refs, dtype=np.uint64)
            tail[: n - cut] = refs[cut:]
            self._pages.append(tail)
            self._tail = n - cut
        self._len = n
        self.head_pos = head_pos

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
            self._pages.popleft()
            self._head = 0
            if not self._pages:
                self._tail = 0
        assert self._len >= 0

    def clear(self) -> U64:
        """Remove everything; returns the refs that were there, in order."""
        out = self.to_array()
        self.head_pos += self._len
        self._pages.clear()
        self._head = self._tail = self._len = 0
        return out

    def freeze(self) -> FrozenRefs:
        """The refs now, in time proportional to the pages (see the module's rule)."""
        return FrozenRefs(
            tuple(self._pages), self._head, self._tail, self._page_refs, self.head_pos
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


__all__ = ["RefFifo", "SealedPage"]
