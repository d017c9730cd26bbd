"""Leased (checked-out) messages, keyed by a dense delivery tag.

Rule of this module: one 8-byte slot per leased message, nothing else per message in
the common case. Tags are assigned from a counter, one per delivery (a redelivery gets a
new tag), so they are dense and increasing, as rabbit_fifo keys its checked-out messages.
The ring is a map ``page number -> uint64 array`` of up to ``page_refs`` slots; slot
``tag % page_refs`` holds the ref, 0 once settled. A page is freed as soon as its last
live slot is settled, so holes cost memory only while a page still holds a live lease.
A page is born only as long as its first lease needs (a power of two, at least
``FIRST_PAGE_SLOTS``) and doubles as later tags reach its end: a queue whose consumer
holds a few leases keeps 128 bytes of table, not the 32 KiB of a whole default page,
which 10,000 queues each woken by one receive used to allocate. Slots past a short
page's end hold nothing; snapshots write every page at its full length, so their bytes
do not depend on how a page grew.

What is shared by the messages of one checkout is stored once, in a ``LeaseGroup``: the
consumer, the lease expiry and the priority level (a checkout takes levels in turn, so
the tags of one level are contiguous and each group has one level). ``extend`` on part
of a group stores a per-tag expiry override, paid only by the messages extended.

Sizes are O(1): counters, never a scan. Ordering is kept only where the semantics need
it: the expiry heap (earliest lease first); the tag ring is unordered by time.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right

import numpy as np
import numpy.typing as npt

from engine.queue import commands as cmd
from engine.shared_empty import EMPTY_DICT, EMPTY_LIST, check_shared_empties

U64 = npt.NDArray[np.uint64]


_GROUP_BYTES_ESTIMATE = 200
_PAGE_BYTES_ESTIMATE = 212
"""The ndarray object and the two dict entries of a page, beside its slots."""
FIRST_PAGE_SLOTS = 16
_OVERRIDE_BYTES_ESTIMATE = 150


class LeaseGroup:
    __slots__ = ("consumer", "count", "expires_ms", "first_tag", "live", "priority")

    def __init__(self, first_tag: int, count: int, consumer: str, priority: int, expires_ms: int):
        self.first_tag = first_tag
        self.count = count
        self.live = count
        self.consumer = consumer
        self.priority = priority
        self.expires_ms = expires_ms


def tag_in(group: LeaseGroup, tag: int) -> bool:
    return group.first_tag <= tag < group.first_tag + group.count


class Pending:
    __slots__ = (
        "_consumers",
        "_groups",
        "_heap",
        "_overrides",
        "_page_live",
        "_page_refs",
        "_pages",
        "_shift",
        "_size",
        "_starts",
        "next_tag",
    )

    def __init__(self, page_refs: int) -> None:
        assert page_refs >= 16 and page_refs & (page_refs - 1) == 0
        self._page_refs = page_refs
        self._shift = page_refs.bit_length() - 1
        self._pages: dict[int, U64] = EMPTY_DICT
        self._page_live: dict[int, int] = EMPTY_DICT
        self._size = 0
        self.next_tag = 1
        self._groups: dict[int, LeaseGroup] = EMPTY_DICT
        self._starts: list[int] = EMPTY_LIST
        """First tags of live groups, increasing."""
        self._heap: list[tuple[int, int, int]] = EMPTY_LIST
        """(expires_ms, 0, group first tag) or (expires_ms, 1, tag of an override)."""
        self._overrides: dict[int, int] = EMPTY_DICT
        self._consumers: dict[str, int] = EMPTY_DICT

    def _own(self) -> None:
        """Give the tables their own containers before a lease is stored."""
        if self._starts is EMPTY_LIST:
            self._pages, self._page_live, self._groups = {}, {}, {}
            self._starts, self._heap = [], []
            self._overrides, self._consumers = {}, {}

    def _maybe_release(self) -> None:
        """Once the last lease is settled, hand the containers back: what is left in the
        heap are stale entries, which ``next_expiry_ms`` would only skip."""
        if self._size == 0 and not self._overrides:
            assert not self._groups and not self._pages and not self._consumers
            self._pages = self._page_live = self._groups = self._overrides = EMPTY_DICT
            self._consumers = EMPTY_DICT
            self._starts = EMPTY_LIST
            self._heap = EMPTY_LIST

    def __len__(self) -> int:
        return self._size

    def consumers(self) -> dict[str, int]:
        """Leased messages per consumer, sorted by consumer id."""
        return {c: self._consumers[c] for c in sorted(self._consumers)}

    def nbytes(self) -> int:
        return (
            sum(page.nbytes + _PAGE_BYTES_ESTIMATE for page in self._pages.values())
            + len(self._groups) * _GROUP_BYTES_ESTIMATE
            + len(self._overrides) * _OVERRIDE_BYTES_ESTIMATE
        )

    # --- adding -------------------------------------------------------------------

    def add(self, refs: U64 | list[int], consumer: str, priority: int, expires_ms: int) -> int:
        """Lease ``refs`` (tags ``first..first+n-1``); returns the first tag."""
        n = len(refs)
        assert n >= 1
        self._own()
        first = self.next_tag
        done = 0
        while done < n:
            tag = first + done
            page_no = tag >> self._shift
            at = tag & (self._page_refs - 1)
            page = self._pages.get(page_no)
            k = min(n - done, self._page_refs - at)
            if page is None or len(page) < at + k:  # a new page, or one to double
                grown = np.zeros(self._room(at + k), dtype=np.uint64)
                if page is None:
                    self._page_live[page_no] = 0
                else:
                    grown[: len(page)] = page
                page = self._pages[page_no] = grown
            if k == 1:  # a single lease: a scalar store, no array built from a list
                page[at] = refs[done]
            else:
                page[at : at + k] = refs[done : done + k]
            self._page_live[page_no] += k
            done += k
        self.next_tag += n
        self._size += n
        group = LeaseGroup(first, n, consumer, priority, expires_ms)
        self._groups[first] = group
        self._starts.append(first)
        heapq.heappush(self._heap, (expires_ms, 0, first))
        self._consumers[consumer] = self._consumers.get(consumer, 0) + n
        return first

    def _room(self, end: int) -> int:
        """Slots of a page that must hold slots ``0..end-1``: the next power of two."""
        return min(self._page_refs, max(FIRST_PAGE_SLOTS, 1 << (end - 1).bit_length()))

    # --- reading ------------------------------------------------------------------

    def ref_at(self, tag: int) -> int:
        """The ref leased under ``tag``, or 0 if the tag is settled or unknown."""
        page = self._pages.get(tag >> self._shift)
        at = tag & (self._page_refs - 1)
        return 0 if page is None or at >= len(page) else int(page[at])

    def group_of(self, tag: int) -> LeaseGroup:
        i = bisect_right(self._starts, tag) - 1
        assert i >= 0
        group = self._groups[self._starts[i]]
        assert group.first_tag <= tag < group.first_tag + group.count
        return group

    def expires_ms(self, tag: int) -> int:
        return self._overrides.get(tag, self.group_of(tag).expires_ms)

    def live_receipts(self, command: bytes) -> tuple[list[int], tuple[int, ...], int]:
        """(tags of the receipts of a settle, return, discard or extend ``command`` that
        name a live lease, in command order; positions of the stale ones; lease_ms of an
        extend or 0). A few receipts are read one by one."""
        few = cmd.decode_receipts_few(command)
        if few is not None:
            pairs, lease_ms = few
            live, stale = self.matching_few(pairs)
            return live, stale, lease_ms
        tags, refs, lease_ms = cmd.decode_receipts(command)
        ok = self.matching(tags, refs)
        return tags[ok].tolist(), tuple(np.flatnonzero(~ok).tolist()), lease_ms

    def matching(self, tags: U64, refs: U64) -> npt.NDArray[np.bool_]:
        """Which receipts name a live lease; a repeated receipt matches only once (its
        first matching occurrence)."""
        n = len(tags)
        if n == 0:
            return np.zeros(0, dtype=bool)
        current = np.zeros(n, dtype=np.uint64)
        page_nos = tags >> np.uint64(self._shift)
        slots = tags & np.uint64(self._page_refs - 1)
        for p, sel in self._by_page(page_nos):
            page = self._pages.get(p)
            if page is None:
                continue
            at = slots[sel]
            if len(page) == self._page_refs:
                current[sel] = page[at]
            else:  # a short page: what lies past its end was never leased
                inside = at < len(page)
                found = np.zeros(len(at), dtype=np.uint64)
                found[inside] = page[at[inside]]
                current[sel] = found
        ok: npt.NDArray[np.bool_] = (current == refs) & (refs != 0)
        if n > 1:
            good = np.flatnonzero(ok)
            live = tags[good]
            # Receipts in delivery order (the usual: a settle of the last checkout) are
            # increasing, so none repeats: one comparison instead of a sort (np.unique).
            if len(live) > 1 and not (live[1:] > live[:-1]).all():
                _, first = np.unique(live, return_index=True)
                if len(first) < len(good):
                    ok[:] = False
                    ok[good[first]] = True
        return ok

    def matching_few(self, pairs: list[tuple[int, int]]) -> tuple[list[int], tuple[int, ...]]:
        """``matching`` for a few receipts, one by one: (tags of the receipts that name a live
        lease, in receipt order; positions of the others)."""
        live: list[int] = []
        stale: list[int] = []
        for k, (tag, ref) in enumerate(pairs):
            if ref != 0 and tag not in live and self.ref_at(tag) == ref:
                live.append(tag)
            else:
                stale.append(k)
        return live, tuple(stale)

    @staticmethod
    def _by_page(page_nos: U64) -> list[tuple[int, slice | npt.NDArray[np.bool_]]]:
        lo, hi = int(page_nos.min()), int(page_nos.max())
        if lo == hi:
            return [(lo, slice(None))]
        return [(p, page_nos == p) for p in np.unique(page_nos).tolist()]

    def refs(self) -> U64:
        """Every leased ref, in tag order."""
        parts = [self._pages[p] for p in sorted(self._pages)]
        if not parts:
            return np.empty(0, dtype=np.uint64)
        whole: U64 = np.concatenate(parts)
        live: U64 = whole[whole != 0]
        return live

    def items(self) -> list[tuple[int, int]]:
        """(tag, ref) of every lease in tag order (tests and snapshots)."""
        out: list[tuple[int, int]] = []
        for p in sorted(self._pages):
            page = self._pages[p]
            for at in np.flatnonzero(page).tolist():
                out.append(((p << self._shift) | at, int(page[at])))
        return out

    # --- removing -----------------------------------------------------------------

    def remove(self, tag: int) -> tuple[int, int]:
        """Forget a live lease; returns (ref, priority level)."""
        page_no = tag >> self._shift
        page = self._pages[page_no]
        at = tag & (self._page_refs - 1)
        ref = int(page[at])
        assert ref != 0, tag
        page[at] = 0
        self._page_live[page_no] -= 1
        if self._page_live[page_no] == 0:
            del self._pages[page_no], self._page_live[page_no]
        self._size -= 1
        self._overrides.pop(tag, None)
        group = self.group_of(tag)
        group.live -= 1
        left = self._consumers[group.consumer] - 1
        if left:
            self._consumers[group.consumer] = left
        else:
            del self._consumers[group.consumer]
        if group.live == 0:
            del self._groups[group.first_tag]
            i = bisect_right(self._starts, group.first_tag) - 1
            del self._starts[i]
            self._maybe_release()
        return ref, group.priority

    def remove_many(self, tags: U64) -> None:
        """Forget live leases (distinct tags, all live), vectorised per page."""
        n = len(tags)
        if n == 0:
            return
        page_nos = tags >> np.uint64(self._shift)
        slots = tags & np.uint64(self._page_refs - 1)
        for p, sel in self._by_page(page_nos):
            at = slots[sel]
            page = self._pages[p]
            assert page[at].all(), "removing a lease that is not live"
            page[at] = 0
            self._page_live[p] -= len(at)
            if self._page_live[p] == 0:
                del self._pages[p], self._page_live[p]
        self._size -= n
        if self._overrides:
            for tag in tags.tolist():
                self._overrides.pop(tag, None)
        # Each tag's group starts at the last first tag at or below it: one search for
        # them all (a settle of a thousand is a few numpy calls, not a loop per tag).
        starts = self._starts
        owner = np.searchsorted(np.array(starts, dtype=np.uint64), tags, side="right") - 1
        one = int(owner[0])
        if (owner == one).all():
            # All in one group (the usual: a settle of one checkout): no np.unique with
            # counts, which sorts and cost several times the rest of this step.
            owners, counts = [one], [n]
        else:
            at, by_owner = np.unique(owner, return_counts=True)
            owners, counts = at.tolist(), by_owner.tolist()
        assert owners[0] >= 0, "a tag below every group"
        done = {starts[i]: count for i, count in zip(owners, counts, strict=True)}
        for first, count in done.items():
            group = self._groups[first]
            assert tag_in(group, first) and group.live >= count
            group.live -= count
            left = self._consumers[group.consumer] - count
            if left:
                self._consumers[group.consumer] = left
            else:
                del self._consumers[group.consumer]
            if group.live == 0:
                del self._groups[first]
                del starts[bisect_right(starts, first) - 1]
        self._maybe_release()

    def extend(self, tag: int, expires_ms: int) -> None:
        self._own()
        self._overrides[tag] = expires_ms
        heapq.heappush(self._heap, (expires_ms, 1, tag))

    def next_expiry_ms(self) -> int | None:
        """Earliest lease expiry, skipping stale heap entries."""
        while self._heap:
            expires_ms, kind, key = self._heap[0]
            if self._heap_entry_live(expires_ms, kind, key):
                return expires_ms
            heapq.heappop(self._heap)
        return None

    def _heap_entry_live(self, expires_ms: int, kind: int, key: int) -> bool:
        if kind == 1:
            return self._overrides.get(key) == expires_ms
        group = self._groups.get(key)
        return group is not None and group.expires_ms == expires_ms

    def take_expired(self, now_ms: int) -> list[int]:
        """Tags whose lease ended at or before ``now_ms``, ordered by (expiry, tag): leases
        that end together come back in delivery order."""
        found: list[tuple[int, int]] = []
        overridden: set[int] = set()
        while self._heap and self._heap[0][0] <= now_ms:
            expires_ms, kind, key = heapq.heappop(self._heap)
            if not self._heap_entry_live(expires_ms, kind, key):
                continue
            if kind == 1:
                if key not in overridden:  # a tag extended twice to the same time
                    overridden.add(key)
                    found.append((expires_ms, key))
                continue
            group = self._groups[key]
            for tag in range(group.first_tag, group.first_tag + group.count):
                if tag not in self._overrides and self.ref_at(tag) != 0:
                    found.append((expires_ms, tag))
        found.sort()
        return [tag for _expires_ms, tag in found]

    # --- snapshot -----------------------------------------------------------------

    def to_wire(self) -> list[object]:
        groups = [
            [g.first_tag, g.count, g.consumer, g.priority, g.expires_ms]
            for g in (self._groups[s] for s in self._starts)
        ]
        full = self._page_refs * 8
        pages = [[p, self._pages[p].tobytes().ljust(full, b"\0")] for p in sorted(self._pages)]
        overrides = sorted(self._overrides.items())
        return [self.next_tag, pages, groups, overrides]

    @classmethod
    def from_wire(cls, page_refs: int, wire: list[object]) -> Pending:
        pending = cls(page_refs)
        next_tag, pages, groups, overrides = wire
        assert isinstance(next_tag, int) and isinstance(pages, list)
        assert isinstance(groups, list) and isinstance(overrides, list)
        pending.next_tag = next_tag
        pending._own()
        for p, raw in pages:
            whole = np.frombuffer(raw, dtype=np.uint64)
            assert len(whole) == page_refs
            held = np.flatnonzero(whole)
            assert len(held) > 0, "a page without a live lease"
            pending._pages[p] = whole[: pending._room(int(held[-1]) + 1)].copy()
            pending._page_live[p] = len(held)
            pending._size += pending._page_live[p]
        for first, count, consumer, priority, expires_ms in groups:
            group = LeaseGroup(first, count, consumer, priority, expires_ms)
            live = pending._live_between(first, first + count)
            group.live = live
            pending._groups[first] = group
            pending._starts.append(first)
            pending._heap.append((expires_ms, 0, first))
            pending._consumers[consumer] = pending._consumers.get(consumer, 0) + live
        for tag, expires_ms in overrides:
            pending._overrides[tag] = expires_ms
            pending._heap.append((expires_ms, 1, tag))
        heapq.heapify(pending._heap)
        pending._maybe_release()
        return pending

    def _live_between(self, lo: int, hi: int) -> int:
        """Live leases among tags ``lo..hi-1``, counted a page at a time."""
        live = 0
        tag = lo
        while tag < hi:
            at = tag & (self._page_refs - 1)
            k = min(hi - tag, self._page_refs - at)
            page = self._pages.get(tag >> self._shift)
            if page is not None:
                live += int(np.count_nonzero(page[at : at + k]))
            tag += k
        return live

    def check(self) -> None:
        check_shared_empties()
        assert self._size == sum(self._page_live.values())
        assert self._size == sum(g.live for g in self._groups.values())
        assert self._size == sum(self._consumers.values())
        assert self._starts == sorted(self._groups)
        for p, page in self._pages.items():
            assert self._page_live[p] == int(np.count_nonzero(page)) > 0


__all__ = ["FIRST_PAGE_SLOTS", "LeaseGroup", "Pending"]
