"""The log of one server against a plain model, through syncs, overwrites, WAL rolls,
segment flushes, snapshots and crashes (clean or tearing the last write) on the fake
disk. Another server shares the WAL so that group commits mix servers."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from pyroaring import BitMap64

from engine.raft.entry import Entry, EntryKind
from engine.storage import Checkpoint, FakeDisk, HardState, NodeStorage, Persisted
from tests.engine.storage.conftest import small_limits

Model = dict[int, Entry]


def _apply(model: Model, entries: list[Entry]) -> None:
    for index in [i for i in model if i >= entries[0].index]:
        del model[index]
    for e in entries:
        model[e.index] = e


class LogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.disk = FakeDisk()
        self.limits = small_limits()
        self.storage = NodeStorage.open(self.disk, self.limits)
        self.storage.open_server("q")
        self.storage.open_server("other")
        self.durable: Model = {}
        self.pending: list[list[Entry]] = []
        self.term = 1
        self.snapshot = 0
        self.other_last = 0
        self.hard_state: HardState | None = None
        self.live: dict[int, Entry] = {}
        """Entries a snapshot from the leader named live, readable below the snapshot."""

    def _submitted_last(self) -> int:
        model = dict(self.durable)
        for entries in self.pending:
            _apply(model, entries)
        return max(model, default=self.snapshot)

    @rule(n=st.integers(1, 6), back=st.integers(0, 4), size=st.integers(1, 120))
    def append(self, n: int, back: int, size: int) -> None:
        start = max(self.snapshot + 1, self._submitted_last() + 1 - back)
        if back:
            self.term += 1
        entries = [
            Entry(i, self.term, EntryKind.COMMAND, i, bytes([i % 251]) * size)
            for i in range(start, start + n)
        ]
        self.storage.append("q", entries)
        self.pending.append(entries)
        self.storage.append("other", [Entry(self.other_last + 1, 1, EntryKind.NOOP, 0, b"o")])
        self.other_last += 1

    @rule(term=st.integers(1, 5))
    def save_hard_state(self, term: int) -> None:
        self.hard_state = HardState(term, "q", 0)
        self.storage.save_hard_state("q", self.hard_state)
        self.sync()

    @rule()
    def sync(self) -> None:
        events = self.storage.sync()
        mine = [e for e in events if isinstance(e, Persisted) and e.uid == "q"]
        assert [(e.index, e.term) for e in mine] == [
            (p[-1].index, p[-1].term) for p in self.pending
        ]
        for entries in self.pending:
            _apply(self.durable, entries)
        self.pending.clear()

    @precondition(lambda self: len(self.durable) > 0)
    @rule(frac=st.floats(0, 1))
    def checkpoint_and_release(self, frac: float) -> None:
        self.sync()
        indexes = sorted(i for i in self.durable if i > self.snapshot)
        if not indexes:
            return
        c = indexes[int(frac * (len(indexes) - 1))]
        self.storage.write_checkpoint(
            "q", Checkpoint(c, self.durable[c].term, 1, b"", BitMap64(), b"m")
        )
        assert self.storage.release_cursor("q", c) == c
        self.snapshot = c
        self.live.clear()  # the checkpoint above names no live entry
        for i in [i for i in self.durable if i <= c]:
            del self.durable[i]

    @rule(ahead=st.integers(-3, 5), live=st.sets(st.integers(0, 6), max_size=3))
    def install_snapshot(self, ahead: int, live: set[int]) -> None:
        """A snapshot from the leader replaces the log; its live entries stay readable."""
        self.sync()
        last = max(self.durable, default=self.snapshot)
        index = max(self.snapshot + 1, last + ahead)
        self.term += 1
        live_entries = [
            Entry(i, self.term, EntryKind.COMMAND, i, b"live%d" % i)
            for i in sorted({index - k for k in live if index - k >= 1})
        ]
        cp = Checkpoint(
            index, self.term, 1, b"", BitMap64([e.index for e in live_entries]), b"leader"
        )
        self.storage.install_snapshot("q", cp, live_entries)
        self.sync()
        self.durable.clear()
        self.snapshot = index
        self.live = {e.index: e for e in live_entries}

    @rule(torn=st.booleans(), seed=st.integers(0, 2**16))
    def crash(self, torn: bool, seed: int) -> None:
        if torn:
            self.storage.write_batch()  # written, maybe partly, never reported
        self.disk.crash(random.Random(seed) if torn else None)
        self.storage = NodeStorage.open(self.disk, self.limits)
        rec = self.storage.open_server("q")
        self.other_last = self.storage.open_server("other").log.last_index()
        got = self._view()
        candidates = [dict(self.durable)]
        for entries in self.pending if torn else []:
            for k in range(len(entries)):
                model = dict(candidates[-1])
                _apply(model, entries[k : k + 1] if k else entries[:1])
                candidates.append(model)
        assert got in candidates, f"log after crash {sorted(got)} matches no durable prefix"
        self.durable = got
        self.pending.clear()
        if not torn:
            assert rec.hard_state == self.hard_state
        self.hard_state = rec.hard_state
        self.term = max([self.term, *(e.term for e in got.values())])

    def _view(self) -> Model:
        log = self.storage.log("q")
        got = log.entries(log.first_index(), log.last_index() + 1, 1 << 30)
        return {e.index: e for e in got}

    @invariant()
    def log_matches_the_model(self) -> None:
        log = self.storage.log("q")
        assert log.snapshot_index() == self.snapshot
        assert log.first_index() == self.snapshot + 1
        assert self._view() == self.durable
        assert log.last_index() == max(self.durable, default=self.snapshot)
        for index, entry in self.live.items():
            assert log.read(index) == entry

    @invariant()
    def read_many_reads_what_read_reads(self) -> None:
        """Every stored entry, every second one and the live ones alone, with runs
        split by a small byte bound too: the same entries as ``read`` one by one."""
        log = self.storage.log("q")
        stored = sorted({*self.durable, *self.live})
        for indexes in (stored, stored[::2], sorted(self.live)):
            expected = [log.read(i) for i in indexes]
            assert log.read_many(indexes, 1 << 30) == expected
            assert log.read_many(indexes, 100) == expected
        for index in range(1, self.snapshot + 1):  # dead ones: read and read_many agree
            asked = sorted({*self.live, index})
            try:
                expected = [log.read(i) for i in asked]
            except LookupError:
                with pytest.raises(LookupError):
                    log.read_many(asked, 1 << 30)
            else:
                assert log.read_many(asked, 1 << 30) == expected


TestLog = LogMachine.TestCase
TestLog.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
