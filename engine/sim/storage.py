"""Simulated persistence for one server: what was synced survives a crash, the rest is lost.

``SimStorage`` is the plug point: the simulator talks to a server's storage only through
it, so the real ``engine.storage`` code on a fake disk can replace ``MemStorage``. Writes
become visible to reads at once (a page cache) and durable at ``sync``; ``crash`` keeps
the durable state and, when told to, a torn prefix of the first unsynced write.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from engine.errors import EntryDamaged
from engine.raft.entry import Entry, EntryKind, LogStore
from engine.raft.events import HardState
from engine.raft.snapshot import Snapshot


class SimStorage(LogStore, Protocol):
    def write(
        self,
        hard_state: HardState | None,
        snapshot: Snapshot | None,
        entries: list[Entry],
        snapshot_entries: Sequence[Entry] = (),
    ) -> None:
        """Buffer one ``Ready``'s writes (snapshot, then entries, then hard state). An
        installed snapshot's live entries are ``snapshot_entries`` plus the others,
        which this storage holds already."""
        ...

    def sync(self) -> None:
        """Make every buffered write durable, in order."""
        ...

    def save_snapshot(self, snapshot: Snapshot) -> None:
        """Durably write a snapshot taken locally and compact the log up to it (keeping
        the live entries)."""
        ...

    def crash(self, rng: random.Random, tear: bool) -> None:
        """Lose what is not durable; with ``tear``, keep a prefix of the first unsynced
        write's entries (a torn write)."""
        ...

    def recover(self) -> tuple[HardState | None, Snapshot | None]:
        """The hard state and the snapshot (no payloads): the machine restores from it."""
        ...

    def snapshot(self) -> Snapshot | None:
        """The newest durable snapshot, for a leader to ship to a lagging follower."""
        ...

    def repairing(self) -> bool:
        """Durable data was lost: the server starts its core in repair mode."""
        ...

    def finish_repair(self) -> None:
        """The repaired core's vote is durable (the driver calls this only then): the
        repair is over for storage too."""
        ...

    def durable(self) -> tuple[HardState | None, int]:
        """What a crash now would keep: the hard state and the last index of the log."""
        ...

    def mark_damaged(self, error: EntryDamaged) -> None:
        """A read met damaged data: record the repair (the server then crashes and
        restarts in repair mode)."""
        ...

    def corrupt(self, rng: random.Random) -> str | None:
        """Flip a bit in a durable file of this crashed server and recover again; says
        what was hit (``None``: nothing, or no disk to damage)."""
        ...

    def rot(self, rng: random.Random) -> str | None:
        """Flip a bit in the data of a segment of this running server; says what was
        hit (``None``: nothing, or no disk to damage)."""
        ...


@dataclass
class _State:
    hard_state: HardState | None = None
    snapshot: Snapshot | None = None
    entries: list[Entry] = field(default_factory=list)
    """Contiguous from ``snapshot index + 1``."""
    live: dict[int, Entry] = field(default_factory=dict)

    def copy(self) -> _State:
        return _State(self.hard_state, self.snapshot, list(self.entries), dict(self.live))

    @property
    def snap_index(self) -> int:
        return self.snapshot.index if self.snapshot else 0

    def put_entries(self, entries: list[Entry]) -> None:
        if not entries:
            return
        first = self.snap_index + 1
        start = entries[0].index
        assert first <= start <= first + len(self.entries), "entries are contiguous"
        del self.entries[start - first :]
        self.entries.extend(entries)

    def entry(self, index: int) -> Entry:
        if index <= self.snap_index:
            if index not in self.live:
                raise LookupError(index)
            return self.live[index]
        pos = index - self.snap_index - 1
        if pos >= len(self.entries):
            raise LookupError(index)
        return self.entries[pos]

    def install(self, snapshot: Snapshot, given: Sequence[Entry]) -> None:
        live = {e.index: e for e in given}
        for index in snapshot.live_indexes:
            if index not in live:
                live[index] = self.entry(index)  # held: a committed entry of ours
        self.snapshot = snapshot
        self.entries = []
        self.live = live

    def compact(self, snapshot: Snapshot) -> None:
        first = self.snap_index + 1
        drop = snapshot.index - first + 1
        for e in self.entries[:drop]:
            if e.index in snapshot.live_indexes:
                self.live[e.index] = e
        self.live = {i: e for i, e in self.live.items() if i in snapshot.live_indexes}
        del self.entries[:drop]
        self.snapshot = snapshot


class MemStorage:
    """``SimStorage`` in memory."""

    def __init__(self) -> None:
        self.durable_state = _State()
        self.visible = _State()
        self.entry_reads = 0
        """Single-entry reads (payloads of live entries), counted for tests."""
        self.pending: list[
            tuple[HardState | None, Snapshot | None, list[Entry], Sequence[Entry]]
        ] = []

    # --- LogStore -------------------------------------------------------------------

    def first_index(self) -> int:
        return self.visible.snap_index + 1

    def last_index(self) -> int:
        return self.visible.snap_index + len(self.visible.entries)

    def snapshot_index(self) -> int:
        return self.visible.snap_index

    def term(self, index: int) -> int | None:
        v = self.visible
        snap = v.snap_index
        if index == snap:
            return v.snapshot.term if v.snapshot else 0
        pos = index - snap - 1
        if 0 <= pos < len(v.entries):
            return v.entries[pos].term
        return None

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        v = self.visible
        first = v.snap_index + 1
        if lo < first:
            raise LookupError(lo)
        out = v.entries[lo - first : hi - first]
        size = 0
        for n, e in enumerate(out):
            size += len(e.data)
            if size > max_bytes and n:
                return out[:n]
        return out

    def config_indexes(self, lo: int, hi: int) -> list[int]:
        v = self.visible
        first = v.snap_index + 1
        held = v.entries[max(lo, first) - first : max(hi, first) - first]
        return [e.index for e in held if e.kind is EntryKind.CONFIG]

    # --- SimStorage -----------------------------------------------------------------

    def write(
        self,
        hard_state: HardState | None,
        snapshot: Snapshot | None,
        entries: list[Entry],
        snapshot_entries: Sequence[Entry] = (),
    ) -> None:
        self._apply(self.visible, hard_state, snapshot, entries, snapshot_entries)
        self.pending.append((hard_state, snapshot, entries, snapshot_entries))

    def sync(self) -> None:
        for hs, snap, entries, given in self.pending:
            self._apply(self.durable_state, hs, snap, entries, given)
        self.pending = []

    def save_snapshot(self, snapshot: Snapshot) -> None:
        assert not self.pending or snapshot.index <= self.durable_state.snap_index + len(
            self.durable_state.entries
        ), "a snapshot covers durable entries only"
        self.durable_state.compact(snapshot)
        self.visible.compact(snapshot)

    def crash(self, rng: random.Random, tear: bool) -> None:
        if tear and self.pending:
            _hs, snap, entries, _given = self.pending[0]
            if snap is None and entries:
                keep = rng.randint(1, len(entries))
                self._apply(self.durable_state, None, None, entries[:keep], ())
        self.pending = []
        self.visible = self.durable_state.copy()

    def recover(self) -> tuple[HardState | None, Snapshot | None]:
        return self.visible.hard_state, self.visible.snapshot

    def snapshot(self) -> Snapshot | None:
        return self.durable_state.snapshot

    def entry(self, index: int) -> Entry:
        self.entry_reads += 1
        return self.visible.entry(index)

    def repairing(self) -> bool:
        return False

    def durable(self) -> tuple[HardState | None, int]:
        d = self.durable_state
        return d.hard_state, d.snap_index + len(d.entries)

    def finish_repair(self) -> None:
        """Never repairing (``repairing`` is always false): nothing to finish."""

    def mark_damaged(self, error: EntryDamaged) -> None:
        raise AssertionError(f"memory is never damaged: {error}")

    def corrupt(self, rng: random.Random) -> str | None:
        return None

    def rot(self, rng: random.Random) -> str | None:
        return None

    @staticmethod
    def _apply(
        state: _State,
        hs: HardState | None,
        snap: Snapshot | None,
        entries: list[Entry],
        given: Sequence[Entry],
    ) -> None:
        if snap is not None:
            state.install(snap, given)
        state.put_entries(entries)
        if hs is not None:
            state.hard_state = hs


__all__ = ["MemStorage", "SimStorage"]
