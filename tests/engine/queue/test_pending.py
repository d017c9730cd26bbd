"""The lease table against a plain dict of tag -> ref, with pages that are born short and
grow (``page_refs`` 64, first pages of 16 slots), and its snapshot form."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from engine.queue.pending import FIRST_PAGE_SLOTS, Pending

PAGE_REFS = 64


class PendingMachine(RuleBasedStateMachine):
    @initialize(start=st.integers(min_value=1, max_value=300))
    def start(self, start: int) -> None:
        # A table restored with tags already handed out: its first lease lands anywhere
        # in a page, not only at slot 1.
        self.pending = Pending.from_wire(PAGE_REFS, [start, [], [], []])
        self.oracle: dict[int, int] = {}
        self.next_ref = 1

    @rule(n=st.integers(min_value=1, max_value=80), consumer=st.sampled_from(["a", "b"]))
    def lease(self, n: int, consumer: str) -> None:
        refs = list(range(self.next_ref, self.next_ref + n))
        self.next_ref += n
        array = np.array(refs, dtype=np.uint64) if n > 1 else refs
        first = self.pending.add(array, consumer, 0, expires_ms=1_000)
        for k, ref in enumerate(refs):
            self.oracle[first + k] = ref

    @rule(data=st.data())
    def settle_many(self, data: st.DataObject) -> None:
        if not self.oracle:
            return
        tags = data.draw(st.lists(st.sampled_from(sorted(self.oracle)), unique=True, min_size=1))
        self.pending.remove_many(np.array(tags, dtype=np.uint64))
        for tag in tags:
            del self.oracle[tag]

    @rule(data=st.data())
    def settle_one(self, data: st.DataObject) -> None:
        if not self.oracle:
            return
        tag = data.draw(st.sampled_from(sorted(self.oracle)))
        ref, _level = self.pending.remove(tag)
        assert ref == self.oracle.pop(tag)

    @rule(data=st.data())
    def receipts_match_only_live_leases(self, data: st.DataObject) -> None:
        """Live, settled, never-issued (past a short page's end too) and wrong-ref
        receipts, some repeated: only the first receipt naming a live lease matches."""
        top = self.pending.next_tag + PAGE_REFS
        tag = st.integers(min_value=0, max_value=top)
        ref = st.integers(min_value=0, max_value=self.next_ref + 2)
        pairs = data.draw(st.lists(st.tuples(tag, ref), max_size=12))
        known = sorted(self.oracle.items())
        if known:
            pairs += data.draw(st.lists(st.sampled_from(known), max_size=6))
        pairs = data.draw(st.permutations(pairs))
        got = self.pending.matching(
            np.array([t for t, _ in pairs], dtype=np.uint64),
            np.array([r for _, r in pairs], dtype=np.uint64),
        ).tolist()
        seen: set[int] = set()
        expected = []
        for t, r in pairs:
            ok = r != 0 and self.oracle.get(t) == r and t not in seen
            if ok:
                seen.add(t)
            expected.append(ok)
        assert got == expected
        for t, _r in pairs:
            assert self.pending.ref_at(t) == self.oracle.get(t, 0)

    @rule()
    def snapshot_round_trip(self) -> None:
        wire = self.pending.to_wire()
        for _page_no, raw in wire[1]:  # type: ignore[attr-defined]
            assert len(raw) == PAGE_REFS * 8  # full pages: the bytes do not show growth
        restored = Pending.from_wire(PAGE_REFS, wire)
        assert restored.items() == self.pending.items()
        assert restored.to_wire() == wire
        restored.check()
        self.pending = restored

    @invariant()
    def same_leases(self) -> None:
        self.pending.check()
        assert len(self.pending) == len(self.oracle)
        assert self.pending.items() == sorted(self.oracle.items())


TestPending = PendingMachine.TestCase
TestPending.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)


@given(start=st.integers(min_value=1, max_value=100_000))
def test_a_few_leases_cost_a_short_page(start: int) -> None:
    """One lease in a table of default 4,096-slot pages costs a page of 16 slots (or as
    many as its slot needs), not a whole page: what 10,000 queues woken by one receive
    each used to allocate (32 KiB each)."""
    pending = Pending.from_wire(4096, [start, [], [], []])
    tag = pending.add([7], "c", 0, expires_ms=1)
    slot = tag % 4096
    room = max(FIRST_PAGE_SLOTS, 1 << slot.bit_length())
    assert pending.nbytes() <= room * 8 + 212 + 200
    if slot < FIRST_PAGE_SLOTS:
        assert pending.nbytes() < 1024
    assert pending.ref_at(tag) == 7
    assert pending.ref_at(tag + 1) == 0
