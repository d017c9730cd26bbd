"""The mem table of one server's log: its entries written to the WAL and not yet to a
segment (``engine.storage.server_log``).

Rule: changed only on the node's own thread, by its ``ServerLog``.
"""

from __future__ import annotations

import bisect
from typing import cast

from engine.raft.entry import Entry, EntryKind
from engine.shared_empty import EMPTY_LIST

_KINDS = tuple(EntryKind)
"""Entry kinds by value, faster than calling the enum."""
MEM_ROW_OVERHEAD_BYTES = 120
"""What a mem-table row costs beside its data: the tuple, the header of the ``bytes``
object and the two list slots, rounded up (counted by the memory alarm)."""


MemRow = tuple[int, int, int, bytes]
"""An entry as the mem table holds it: (term, kind, now_ms, data), its index implied."""


class MemTable:
    """Contiguous entries ``lo .. hi`` held in memory until flushed to a segment.

    Held as tuples of plain values, not ``Entry`` objects: the garbage collector stops
    tracking such tuples, so the entries waiting for their segment (up to a WAL file's
    worth) neither make full collections more frequent nor longer. Reads build the
    entries again."""

    # Slots: one per queue, thousands on a node (no instance dict each).
    __slots__ = (
        "_rows",
        "_wal_seqs",
        "bytes",
        "lo",
    )

    def __init__(self) -> None:
        self.lo = 0
        self._rows: list[tuple[int, int, int, bytes]] = EMPTY_LIST
        """(term, kind, now_ms, data) of each entry from ``lo``; while none, the shared
        empty list (most queues of a node are idle, their rows flushed), lists of its
        own from the first ``put``."""
        self._wal_seqs: list[int] = EMPTY_LIST
        self.bytes = 0
        """What the rows hold: their data plus ``MEM_ROW_OVERHEAD_BYTES`` each."""

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def hi(self) -> int:
        return self.lo + len(self._rows) - 1 if self._rows else 0

    def put(self, entries: tuple[Entry, ...], wal_seq: int) -> None:
        """Entries from ``entries[0].index`` replace everything at that index and after."""
        first = entries[0].index
        if not self._rows or first < self.lo:
            self.clear()
            self.lo = first
        else:
            assert first <= self.hi + 1, f"gap in mem table: {first} after {self.hi}"
            self._cut(first - self.lo, len(self._rows))
        if self._rows is EMPTY_LIST:
            self._rows, self._wal_seqs = [], []
        self._rows.extend([(e.term, int(e.kind), e.now_ms, e.data) for e in entries])
        self._wal_seqs.extend([wal_seq] * len(entries))
        self.bytes += sum(len(e.data) for e in entries) + MEM_ROW_OVERHEAD_BYTES * len(entries)

    def get(self, index: int) -> Entry | None:
        if self._rows and self.lo <= index <= self.hi:
            term, kind, now_ms, data = self._rows[index - self.lo]
            return Entry(index, term, _KINDS[kind], now_ms, data)
        return None

    def slice(self, lo: int, hi: int) -> list[Entry]:
        """The entries from ``lo`` (at least ``self.lo``) below ``hi``."""
        start = max(lo, self.lo)
        rows = self._rows[start - self.lo : max(0, hi - self.lo)]
        return [
            Entry(i, term, _KINDS[kind], now_ms, data)
            for i, (term, kind, now_ms, data) in enumerate(rows, start)
        ]

    def indexes_of_kind(self, kind: EntryKind, lo: int, hi: int) -> list[int]:
        """Indexes of the entries of ``kind`` from ``lo`` (at least ``self.lo``) below ``hi``."""
        start = max(lo, self.lo)
        rows = self._rows[start - self.lo : max(0, hi - self.lo)]
        return [i for i, row in enumerate(rows, start) if row[1] == kind]

    def flushable(self, wal_seq: int) -> list[Entry]:
        """The leading entries written to WAL files up to ``wal_seq``."""
        return self.slice(self.lo, self.lo + self.flushable_count(wal_seq))

    def flushable_count(self, wal_seq: int) -> int:
        """How many leading entries were written to WAL files up to ``wal_seq``."""
        return bisect.bisect_right(self._wal_seqs, wal_seq)

    def flushable_rows(self, wal_seq: int) -> list[MemRow]:
        """The rows of ``flushable``, from ``lo``, as they are held: a segment flush is
        planned on the node's thread, and building an ``Entry`` for each of a WAL file's
        rows there held the event loop for about 2 ms per thousand entries."""
        return self._rows[: self.flushable_count(wal_seq)]

    def carry(self, wal_seq: int) -> None:
        """The rows of WAL file ``wal_seq`` were carried into the next file when it rolled
        (``engine.storage.wal_carry``): they leave with that file's flush."""
        n = bisect.bisect_left(self._wal_seqs, wal_seq)
        self._wal_seqs[n:] = [s + 1 if s == wal_seq else s for s in self._wal_seqs[n:]]

    def drop_flushed(self, wal_seq: int) -> None:
        n = bisect.bisect_right(self._wal_seqs, wal_seq)
        self._cut(0, n)
        if self._rows:
            self.lo += n
        else:
            self.clear()

    def truncate_after(self, index: int) -> None:
        """Drop the entries after ``index``."""
        if not self._rows or index >= self.hi:
            return
        if index < self.lo:
            self.clear()
            return
        self._cut(index - self.lo + 1, len(self._rows))

    def packed_rows(self) -> tuple[int, list[object], list[int]]:
        """(``lo``, the rows flat, their WAL seqs): what a packed log keeps of it."""
        flat: list[object] = []
        for row in self._rows:
            flat += row
        return self.lo, flat, list(self._wal_seqs)

    @classmethod
    def of_rows(cls, lo: int, flat: list[object], wal_seqs: list[int]) -> MemTable:
        """The table ``packed_rows`` gave (``flat``, ``wal_seqs``) of."""
        table = cls()
        table.lo = lo
        rows = [cast(MemRow, tuple(flat[k : k + 4])) for k in range(0, len(flat), 4)]
        table._rows, table._wal_seqs = rows, list(wal_seqs)
        data = sum(len(row[3]) for row in rows)
        table.bytes = data + MEM_ROW_OVERHEAD_BYTES * len(rows)
        return table

    @property
    def first_wal_seq(self) -> int:
        """The WAL file its first row was written to (0 while empty)."""
        return self._wal_seqs[0] if self._wal_seqs else 0

    def clear(self) -> None:
        self.lo = 0
        self._rows = self._wal_seqs = EMPTY_LIST
        self.bytes = 0

    def _cut(self, start: int, stop: int) -> None:
        """Drop rows ``start`` below ``stop`` (positions, not indexes) and their bytes."""
        cut = self._rows[start:stop]
        self.bytes -= sum(len(row[3]) for row in cut) + MEM_ROW_OVERHEAD_BYTES * len(cut)
        del self._rows[start:stop]
        del self._wal_seqs[start:stop]
        assert self.bytes >= 0


NO_MEM = MemTable()
"""The mem table of every log that holds none: nothing is ever put into it (a log takes
a table of its own first), and what else a table does is nothing on an empty one."""


__all__ = ["MEM_ROW_OVERHEAD_BYTES", "NO_MEM", "MemRow", "MemTable"]
