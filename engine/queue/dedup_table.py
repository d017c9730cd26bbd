"""The lookup of the dedup window (``engine.queue.dedup``): 64-bit hashes of dedup ids to
the sequence numbers of the window's slots that hold them.

Rule of this module: the table only proposes candidates. Two ids may share a hash, and
the hashes are Python's ``hash`` of the id's bytes, salted per process, so a replica's
table is its own: the window compares the full id of every candidate before it calls a
message a duplicate (a false duplicate would lose a message), and nothing of the table
is ever written out.

A hash picks one bucket of ``BUCKET_CELLS`` cells in two numpy arrays (hashes, sequence
numbers; -1 for a cell never used), so a lookup reads one row. An id whose bucket is
full goes to the stash, a dict (a few per cent of the ids at the loads kept). Slots
leave the window oldest first, so a cell whose sequence number is below the window's
first live slot is free again and nothing is ever deleted from the arrays; the stash
drops its dead entries from its front, as it is filled in publish order too. The table
is rebuilt larger once the live ids pass ``LOAD_MAX`` of its cells, or its stash grows
past ``STASH_SHARE_MAX``. A batch is looked up and inserted with a fixed number of numpy
operations; a few ids take a scalar path, cheaper than numpy's fixed cost per call.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

BUCKET_CELLS = 8
"""Eight, so that a bucket's free flags make one 64-bit word (``_free_masks``)."""
LOAD_MAX = 0.95
"""Live ids past this fraction of the cells make the table rebuild."""
LOAD_REBUILT = 0.6
"""Live ids right after a rebuild, as a fraction of the new table's cells (2% of them in
the stash, 11% at ``LOAD_MAX``: ids per bucket are Poisson-distributed)."""
LOAD_MIN = 0.1
"""Live ids below this fraction of the cells (of more than ``SHRINK_CELLS_MIN``) make the
table rebuild smaller, once the window has shrunk."""
SHRINK_CELLS_MIN = 1 << 14
STASH_SHARE_MAX = 0.15
"""A stash larger than this share of the live ids (plus ``STASH_SLACK``) makes the
table rebuild: it holds dead entries behind live ones."""
STASH_SLACK = 64
SCALAR_MAX = 8
"""Up to this many ids a lookup or an insert takes the scalar path."""
_GATHER_BITS = 0x0102040810204080
"""Times a word of eight 0/1 bytes, byte c lands on bit 56 + c."""
I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
Hashes = U64 | list[int]
"""The hashes of a batch's ids (``hash_ids``)."""
_U64_MASK = (1 << 64) - 1
Stashed = int | tuple[int, ...]
"""A stash entry: a sequence number, or several for ids of one hash (in order)."""


def _select_table() -> I64:
    """``[mask, r]``: the cell of the r-th free one (0 first) of a bucket whose free cells
    are the bits of ``mask``, or ``BUCKET_CELLS`` if it has fewer."""
    table = np.full((1 << BUCKET_CELLS, BUCKET_CELLS + 1), BUCKET_CELLS, np.int64)
    for mask in range(1 << BUCKET_CELLS):
        free = [c for c in range(BUCKET_CELLS) if mask >> c & 1]
        table[mask, : len(free)] = free
    return table


_SELECT = _select_table()


def _ranks(at: I64) -> I64:
    """The rank of each item among the equal ones before it in ``at``, which is sorted."""
    index = np.arange(len(at), dtype=np.int64)
    starts = np.empty(len(at), bool)
    starts[:1] = True
    np.not_equal(at[1:], at[:-1], out=starts[1:])
    return index - np.maximum.accumulate(np.where(starts, index, 0))


def hash_ids(ids: list[bytes]) -> Hashes:
    """The table's hashes of ``ids``, as unsigned 64-bit integers: a list of ints for up
    to ``SCALAR_MAX`` ids, else an array."""
    if len(ids) <= SCALAR_MAX:
        return [hash(i) & _U64_MASK for i in ids]
    return np.array([hash(i) for i in ids], dtype=np.int64).view(np.uint64)


class SlotTable:
    __slots__ = ("_hashes", "_overflowed", "_seqs", "_stash")

    def __init__(self, cells_min: int) -> None:
        buckets = max(1, -(-cells_min // BUCKET_CELLS))
        self._hashes: U64 = np.zeros((buckets, BUCKET_CELLS), np.uint64)
        self._seqs: I64 = np.full((buckets, BUCKET_CELLS), -1, np.int64)
        self._stash: dict[int, Stashed] = {}
        """Hash -> sequence number(s) of the ids whose bucket was full, in the order
        they came."""
        self._overflowed = np.zeros(buckets, bool)
        """The buckets that were full for some id since the table was built: only the
        ids of these are looked for in the stash."""

    @classmethod
    def build(cls, hashes: U64, seqs: I64) -> SlotTable:
        """A table of these ids, sized for them at ``LOAD_REBUILT``: the ids of a bucket
        take its cells, those past its last cell go to the stash."""
        table = cls(int(len(seqs) / LOAD_REBUILT) + 1)
        at = table._bucket(hashes)
        order = np.argsort(at)
        at = at[order]
        rank = _ranks(at)
        fits = rank < BUCKET_CELLS
        cells = at[fits] * BUCKET_CELLS + rank[fits]
        table._hashes.reshape(-1)[cells] = hashes[order[fits]]
        table._seqs.reshape(-1)[cells] = seqs[order[fits]]
        rest = order[~fits]
        rest = rest[np.argsort(seqs[rest])]
        table._overflowed[at[~fits]] = True
        table._add_to_stash(hashes[rest].tolist(), seqs[rest].tolist(), 0)
        return table

    @property
    def nbytes(self) -> int:
        stash_bytes = 100 * len(self._stash)  # a dict entry and its two ints
        arrays = self._hashes.nbytes + self._seqs.nbytes + self._overflowed.nbytes
        return int(arrays) + stash_bytes

    def _bucket(self, hashes: U64) -> I64:
        return (hashes % np.uint64(len(self._seqs))).astype(np.int64)

    def candidates(self, hashes: Hashes, live_from: int) -> tuple[list[int], list[int]]:
        """(query index, sequence number) of every live id whose hash equals a
        query's."""
        if isinstance(hashes, list):
            return self._candidates_few(hashes, live_from)
        found_q: list[int] = []
        found_s: list[int] = []
        at = self._bucket(hashes)
        rows, cells = np.nonzero(self._hashes[at] == hashes[:, None])
        if len(rows):
            seqs = self._seqs[at[rows], cells]
            live = seqs >= live_from
            found_q += rows[live].tolist()
            found_s += seqs[live].tolist()
        if self._stash:
            queries = np.flatnonzero(self._overflowed[at])
            for q, h in zip(queries.tolist(), hashes[queries].tolist(), strict=True):
                self._stash_candidate(q, h, live_from, found_q, found_s)
        return found_q, found_s

    def _candidates_few(self, hashes: list[int], live_from: int) -> tuple[list[int], list[int]]:
        found_q: list[int] = []
        found_s: list[int] = []
        n = len(self._seqs)
        for q, h in enumerate(hashes):
            at = h % n
            row_h = self._hashes[at].tolist()
            if h in row_h:
                row_s = self._seqs[at].tolist()
                for c in range(BUCKET_CELLS):
                    if row_h[c] == h and row_s[c] >= live_from:
                        found_q.append(q)
                        found_s.append(row_s[c])
            if self._stash and self._overflowed[at]:
                self._stash_candidate(q, h, live_from, found_q, found_s)
        return found_q, found_s

    def _stash_candidate(
        self, q: int, h: int, live_from: int, found_q: list[int], found_s: list[int]
    ) -> None:
        got = self._stash.get(h)
        if got is None:
            return
        for seq in (got,) if isinstance(got, int) else got:
            if seq >= live_from:
                found_q.append(q)
                found_s.append(seq)

    def insert(self, hashes: Hashes, first_seq: int, live_from: int, live: int) -> SlotTable:
        """Add new ids, numbered from ``first_seq`` on (none of them live in the table
        already, their sequence numbers above all others); the table, or the rebuilt one
        that replaces it. ``live``: the live ids before these."""
        self._trim_stash(live_from)
        live += len(hashes)
        stash_max = STASH_SHARE_MAX * live + STASH_SLACK
        size = self._seqs.size
        too_large = size > SHRINK_CELLS_MIN and live < LOAD_MIN * size
        if live > LOAD_MAX * size or len(self._stash) > stash_max or too_large:
            keep = self._seqs >= live_from
            stashed = self._stash_items(live_from)
            stash_hashes = np.array([h for h, _s in stashed], dtype=np.uint64)
            stash_seqs = np.array([s for _h, s in stashed], dtype=np.int64)
            seqs = np.arange(first_seq, first_seq + len(hashes), dtype=np.int64)
            return SlotTable.build(
                np.concatenate([self._hashes[keep], stash_hashes, np.asarray(hashes, np.uint64)]),
                np.concatenate([self._seqs[keep], stash_seqs, seqs]),
            )
        if isinstance(hashes, list):
            self._place_few(hashes, first_seq, live_from)
            return self
        seqs = np.arange(first_seq, first_seq + len(hashes), dtype=np.int64)
        at = self._bucket(hashes)
        order = np.argsort(at, kind="stable")
        at = at[order]
        rank = np.minimum(_ranks(at), BUCKET_CELLS)
        cell = _SELECT[self._free_masks(at, live_from), rank]
        placed = cell < BUCKET_CELLS
        cells = at[placed] * BUCKET_CELLS + cell[placed]
        self._hashes.reshape(-1)[cells] = hashes[order[placed]]
        self._seqs.reshape(-1)[cells] = seqs[order[placed]]
        if not placed.all():
            self._overflowed[at[~placed]] = True
            rest = np.sort(order[~placed])
            self._add_to_stash(hashes[rest].tolist(), seqs[rest].tolist(), live_from)
        return self

    def _free_masks(self, at: I64, live_from: int) -> U64:
        """The free cells of buckets ``at`` as bit masks (bit c for cell c): a bucket's
        eight flags are one word, gathered into its low byte by one multiplication."""
        rows = np.ascontiguousarray(self._seqs[at] < live_from)
        masks: U64 = (rows.view(np.uint64)[:, 0] * np.uint64(_GATHER_BITS)) >> np.uint64(56)
        return masks

    def _place_few(self, hashes: list[int], first_seq: int, live_from: int) -> None:
        n = len(self._seqs)
        for s, h in enumerate(hashes, first_seq):
            at = h % n
            row_s = self._seqs[at].tolist()
            free = next((c for c, got in enumerate(row_s) if got < live_from), None)
            if free is None:
                self._overflowed[at] = True
                self._add_to_stash([h], [s], live_from)
            else:
                self._hashes[at, free] = h
                self._seqs[at, free] = s

    def _add_to_stash(self, hashes: list[int], seqs: list[int], live_from: int) -> None:
        stash = self._stash
        for h, s in zip(hashes, seqs, strict=True):
            got = stash.pop(h, None)
            if got is None:
                stash[h] = s
            else:
                # Moved to the end, so that the stash stays in publish order.
                older = (got,) if isinstance(got, int) else got
                stash[h] = (*(seq for seq in older if seq >= live_from), s)

    def _trim_stash(self, live_from: int) -> None:
        """Drop the dead entries at the front of the stash."""
        stash = self._stash
        while stash:
            h = next(iter(stash))
            got = stash[h]
            if (got if isinstance(got, int) else got[-1]) >= live_from:
                break
            del stash[h]

    def _stash_items(self, live_from: int) -> list[tuple[int, int]]:
        return [
            (h, seq)
            for h, got in self._stash.items()
            for seq in ((got,) if isinstance(got, int) else got)
            if seq >= live_from
        ]

    def check(self, live_from: int, live_end: int) -> None:
        live_cells = int(np.count_nonzero(self._seqs >= live_from))
        stashed = self._stash_items(live_from)
        assert live_cells + len(stashed) == live_end - live_from, "each live id once"
        assert int(self._seqs.max(initial=-1)) < live_end
        assert all(s < live_end for _h, s in stashed)
        assert all(self._overflowed[h % len(self._seqs)] for h, _s in stashed)
        assert live_end - live_from <= LOAD_MAX * self._seqs.size + BUCKET_CELLS


__all__ = ["SlotTable", "hash_ids"]
