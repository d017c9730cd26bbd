"""The log as one server's core sees it: stable storage (``LogStore``) plus the unstable
tail the core appended and storage has not yet reported durable.

Rules: indexes are contiguous from ``snapshot_index + 1`` to ``last_index()``; entries at
``offset`` and after live in ``unstable`` and hide whatever storage still holds there;
``stable_last`` is the highest index whose whole prefix is durable *in this log*.
"""

from __future__ import annotations

from engine.raft.entry import Entry, LogStore
from engine.shared_empty import EMPTY_LIST


class RaftLog:
    __slots__ = (
        "handed_out",
        "offset",
        "snapshot_index",
        "snapshot_term",
        "stable_last",
        "store",
        "unstable",
    )

    def __init__(self, store: LogStore, snapshot_index: int, snapshot_term: int) -> None:
        self.store = store
        self.snapshot_index = snapshot_index
        self.snapshot_term = snapshot_term
        last = max(store.last_index(), snapshot_index)
        self.unstable: list[Entry] = EMPTY_LIST
        """The shared empty list while nothing is unstable (an idle replica's usual
        state): one list fewer per replica for the collector to walk."""
        self.offset = last + 1
        """Index of ``unstable[0]``; always ``stable end + 1`` of the logical log."""
        self.handed_out = self.offset
        """Entries below this index were handed to storage in a ``Ready``."""
        self.stable_last = last

    def last_index(self) -> int:
        return self.offset - 1 + len(self.unstable)

    def last_term(self) -> int:
        term = self.term(self.last_index())
        assert term is not None
        return term

    def term(self, index: int) -> int | None:
        if index >= self.offset:
            pos = index - self.offset
            return self.unstable[pos].term if pos < len(self.unstable) else None
        if index == self.snapshot_index:
            return self.snapshot_term
        if index < self.snapshot_index:
            return None
        if index == 0:
            return 0
        return self.store.term(index)

    def matches(self, index: int, term: int) -> bool:
        return self.term(index) == term

    def last_index_of_term(self, term: int, upto: int) -> int:
        """The last index at or below ``upto`` whose entry has ``term``; 0 if none is
        held (a leader's hint for a follower whose log diverges in ``term``)."""
        index = min(upto, self.last_index())
        while index > self.snapshot_index:
            t = self.term(index)
            if t is None or t < term:
                return 0
            if t == term:
                return index
            index -= 1
        return 0

    def entries(self, lo: int, hi: int, max_bytes: int, max_count: int) -> list[Entry]:
        """Entries ``lo <= index < hi``, at most ``max_count``, stopping before the one that
        passes ``max_bytes`` (at least one). Raises ``LookupError`` below the snapshot."""
        hi = min(hi, lo + max_count)
        if lo >= hi:
            return []
        if lo <= self.snapshot_index:
            raise LookupError(lo)
        out: list[Entry] = []
        if lo < self.offset:
            out = self.store.entries(lo, min(hi, self.offset), max_bytes)
            if lo + len(out) < min(hi, self.offset):
                return out
            lo = self.offset
        if lo < hi:
            start = lo - self.offset
            tail = self.unstable[start : start + (hi - lo)]
            if max_bytes < (1 << 62):
                size = sum(len(e.data) for e in out)
                for n, entry in enumerate(tail):
                    size += len(entry.data)
                    if size > max_bytes and (out or n):
                        tail = tail[:n]
                        break
            out = out + tail if out else tail
        return out

    def append(self, entries: list[Entry]) -> None:
        """Append after ``last_index()`` or replace from ``entries[0].index`` on."""
        first = entries[0].index
        assert self.snapshot_index < first <= self.last_index() + 1
        if first >= self.offset:
            if self.unstable is EMPTY_LIST:
                self.unstable = list(entries)
            else:
                del self.unstable[first - self.offset :]
                self.unstable.extend(entries)
        else:
            self.unstable = list(entries)
            self.offset = first
        self.handed_out = min(self.handed_out, first)
        self.stable_last = min(self.stable_last, first - 1)

    def take_unpersisted(self) -> list[Entry]:
        start = self.handed_out - self.offset
        if start >= len(self.unstable):
            return []
        out = self.unstable[start:] if start else list(self.unstable)
        self.handed_out = self.last_index() + 1
        return out

    def maybe_persisted(self, index: int, term: int) -> bool:
        """Storage reports entries up to ``index`` durable; ignored when stale."""
        if index <= self.stable_last or index > self.last_index() or self.term(index) != term:
            return False
        if index >= self.handed_out:
            return False
        self.stable_last = index
        if index >= self.offset:
            if index == self.last_index():
                self.unstable = EMPTY_LIST
            else:
                del self.unstable[: index - self.offset + 1]
            self.offset = index + 1
        return True

    def restore(self, index: int, term: int) -> None:
        """Discard the whole log in favour of a snapshot at ``index``."""
        self.unstable = EMPTY_LIST
        self.offset = self.handed_out = index + 1
        self.snapshot_index, self.snapshot_term = index, term
        self.stable_last = index

    def compacted(self, index: int, term: int) -> None:
        """Storage compacted up to a snapshot at ``index`` (already durable)."""
        assert index <= self.stable_last
        if index > self.snapshot_index:
            self.snapshot_index, self.snapshot_term = index, term


__all__ = ["RaftLog"]
