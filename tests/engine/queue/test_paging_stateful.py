"""The paged ready index against the in-memory one, under budgets down to one page.

Two state machines: paged lanes (``RefFifo`` with a ``QueuePager`` on a ``MemorySpill``)
against plain lists, with pushes, pops, browsing, read-ahead (also finished after the
head moved on), frozen states read later, drains and restores from snapshots that name
stored pages; and the whole ``QueueMachine`` paged, against the plain model of the
machine's stateful test and against the same machine unpaged (the oracle: same replies,
same effects, same snapshot bytes), with checkpoints restored from their stored pages
and pages damaged and rebuilt from the log.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from engine.errors import PageDamaged
from engine.queue import QueueMachine, QueuePolicy
from engine.queue.page_rebuild import rebuild_refs
from engine.queue.pages import FrozenRefs, RefFifo, SpilledPage
from engine.queue.paging import MemorySpill, NodePages, Paging, QueuePager, load_plan
from engine.raft.state_machine import ApplyMeta
from tests.engine.queue.test_machine_stateful import LIMITS, START, QueueMachineVsModel

PAGE = 16
SIZE_SHIFT = 4
INDEX_SHIFT = 19


def refs_from(index: int, n: int) -> list[int]:
    """Compact refs of single-message entries ``index``.. (sizes vary a little)."""
    return [((index + k) << INDEX_SHIFT) | ((k % 50) << SIZE_SHIFT) for k in range(n)]


class PagedLanesVsLists(RuleBasedStateMachine):
    @initialize(
        lanes=st.integers(1, 3),
        pages_max=st.integers(1, 10),
        node_pages_max=st.integers(1, 24),
        read_ahead=st.integers(0, 3),
    )
    def setup(self, lanes: int, pages_max: int, node_pages_max: int, read_ahead: int) -> None:
        self.spill = MemorySpill()
        self.node = NodePages(node_pages_max)
        self.pages_max, self.read_ahead_pages = pages_max, read_ahead
        self.model: list[list[int]] = [[] for _ in range(lanes)]
        self.pager, self.fifos = self._lanes(lanes)
        # A second queue on the node: the node's budget takes pages from the larger.
        self.neighbour, (self.other,) = self._lanes(1)
        self.other.push_many(np.array(refs_from(1 << 30, 5 * PAGE), dtype=np.uint64))
        self.index = 1
        self.frozen: list[tuple[FrozenRefs, list[int]]] = []
        self.tags = 0

    def _lanes(self, n: int) -> tuple[QueuePager, tuple[RefFifo, ...]]:
        pager = QueuePager(self.spill, self.node, self.pages_max, self.read_ahead_pages)
        fifos = tuple(RefFifo(PAGE, pager) for _ in range(n))
        pager.lanes = fifos
        return pager, fifos

    @rule(data=st.data(), n=st.one_of(st.integers(1, 3), st.integers(4, 3 * PAGE)))
    def push(self, data: st.DataObject, n: int) -> None:
        lane = data.draw(st.integers(0, len(self.fifos) - 1))
        refs = refs_from(self.index, n)
        self.index += n
        if n == 1:
            self.fifos[lane].push(refs[0])
        else:
            self.fifos[lane].push_many(np.array(refs, dtype=np.uint64))
        self.model[lane] += refs

    @rule(data=st.data(), n=st.one_of(st.integers(1, 3), st.integers(4, 3 * PAGE)))
    def pop(self, data: st.DataObject, n: int) -> None:
        lane = data.draw(st.integers(0, len(self.fifos) - 1))
        fifo = self.fifos[lane]
        if n <= 3:
            got = [fifo.pop() for _ in range(min(n, len(fifo)))]
        else:
            got = fifo.pop_many(n).tolist()
        assert got == self.model[lane][: len(got)]
        assert len(got) == min(n, len(self.model[lane]))
        del self.model[lane][: len(got)]

    @rule(data=st.data(), offset=st.integers(0, 4 * PAGE), limit=st.integers(1, 2 * PAGE))
    def browse(self, data: st.DataObject, offset: int, limit: int) -> None:
        lane = data.draw(st.integers(0, len(self.fifos) - 1))
        fifo = self.fifos[lane]
        got = fifo.slice_from(fifo.head_pos + offset, limit).tolist()
        assert got == self.model[lane][offset : offset + limit]

    @rule()
    def read_ahead(self) -> None:
        self.pager.read_ahead()

    @rule(data=st.data(), n=st.integers(1, 3 * PAGE), load_first=st.booleans())
    def read_ahead_while_the_head_moves(
        self, data: st.DataObject, n: int, load_first: bool
    ) -> None:
        """The worker's loads race the loop: the head may take a planned page first."""
        plan = self.pager.plan_read_ahead()
        if load_first:
            loaded = load_plan(self.spill, plan)
        self.pop(data, n)
        if not load_first:
            loaded = load_plan(self.spill, plan)
        self.pager.finish_read_ahead(plan, loaded)

    @rule(data=st.data())
    def freeze(self, data: st.DataObject) -> None:
        lane = data.draw(st.integers(0, len(self.fifos) - 1))
        frozen = self.fifos[lane].freeze()
        self.tags += 1
        self.spill.pin(self.tags, [p.handle for p in frozen.parts() if isinstance(p, SpilledPage)])
        self.frozen.append((frozen, list(self.model[lane])))

    @rule(data=st.data(), read=st.booleans())
    def drain(self, data: st.DataObject, read: bool) -> None:
        lane = data.draw(st.integers(0, len(self.fifos) - 1))
        chunks, unread, _unread_bytes = self.fifos[lane].drain(read)
        got = [ref for chunk in chunks for ref in chunk.tolist()]
        assert len(got) + unread == len(self.model[lane])
        assert not read or unread == 0
        if not unread:
            assert got == self.model[lane]
        self.model[lane] = []

    @rule()
    def restore(self) -> None:
        """Lanes rebuilt from what a checkpoint keeps: the refs held only in memory, and
        the stored pages by name (read back through their wire form)."""
        wires: list[tuple[int, list[np.ndarray], list[tuple[int, list[object]]]]] = []
        handles: list[int] = []
        for fifo in self.fifos:
            inline: list[np.ndarray] = []
            spilled: list[tuple[int, list[object]]] = []
            at = 0
            frozen = fifo.freeze()
            for part in frozen.parts():
                if isinstance(part, SpilledPage):
                    spilled.append((at, part.to_wire()))
                    handles.append(part.handle)
                    at += part.count
                else:
                    inline.append(part.copy())
                    at += len(part)
            wires.append((frozen.head_pos, inline, spilled))
        self.tags += 1
        self.spill.pin(self.tags, handles)
        self.pager.close()
        self.pager, self.fifos = self._lanes(len(self.fifos))
        for fifo, (head_pos, inline, spilled) in zip(self.fifos, wires, strict=True):
            refs = np.concatenate(inline) if inline else np.empty(0, dtype=np.uint64)
            pages = [(at, SpilledPage.from_wire(wire)) for at, wire in spilled]
            fifo.adopt(refs, head_pos, pages)
        self.pager.make_room()

    @invariant()
    def agrees(self) -> None:
        for fifo, model in zip(self.fifos, self.model, strict=True):
            fifo.check()
            assert len(fifo) == len(model)
            assert fifo.to_array().tolist() == model
        self.pager.check()
        self.neighbour.check()
        for frozen, expected in self.frozen:
            assert frozen.to_array().tolist() == expected

    @invariant()
    def within_budget(self) -> None:
        """Over a budget only with nothing left to spill (head and tail pages)."""
        assert self.pager.resident <= self.pager.pages_max or self.pager.warm == 0
        assert self.node.resident <= self.node.pages_max or self.node.warm == 0
        assert self.node.resident == self.pager.resident + self.neighbour.resident


TestPagedLanesVsLists = PagedLanesVsLists.TestCase
TestPagedLanesVsLists.settings = settings(
    max_examples=int(os.environ.get("QUORRA_PAGING_EXAMPLES", "120")),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class PagedMachineVsModel(QueueMachineVsModel):
    """The machine's stateful test with a paged machine, and the same machine unpaged
    beside it as the oracle of every reply, effect and snapshot."""

    @initialize(pages=st.integers(1, 10), read_ahead=st.integers(0, 3))
    def paged(self, pages: int, read_ahead: int) -> None:
        page_bytes = LIMITS.page_refs * 8
        self.limits = dataclasses.replace(
            LIMITS,
            paged_index_bytes_per_queue_max=pages * page_bytes,
            paged_index_bytes_per_node_max=(pages + 4) * page_bytes,
            page_read_ahead=read_ahead,
        )
        self.spill = MemorySpill()
        self.node = NodePages.from_limits(self.limits)
        self.entries: dict[int, bytes] = {}
        self.tags = 0
        self.machine = self._paged_machine()
        self.oracle = QueueMachine(QueuePolicy(**START), LIMITS)  # type: ignore[arg-type]

    def _paged_machine(self) -> QueueMachine:
        paging = Paging(self.spill, self.node, self._read_log)
        return QueueMachine(QueuePolicy(**START), self.limits, paging)  # type: ignore[arg-type]

    def _read_log(self, indexes: list[int]) -> list[tuple[int, bytes]]:
        return [(i, self.entries[i]) for i in indexes if i in self.entries]

    def step(self, command: bytes, on_model: Callable[[], Any], gap: int = 1) -> tuple[Any, Any]:
        index = self.index + gap
        self.entries[index] = command
        expected, effects = self.oracle.apply(ApplyMeta(index, 1, self.now), command)
        reply, model = super().step(command, on_model, gap)
        assert reply == expected
        assert self.last_effects == effects
        return reply, model

    def _check_effects(self, effects: list[Any], ready_before: int) -> None:
        self.last_effects = list(effects)
        super()._check_effects(effects, ready_before)

    @precondition(lambda self: self.model.ready_count() < 600)
    @rule(n=st.integers(17, 80), priority=st.integers(0, 3), size=st.integers(0, 200))
    def publish_deep(self, n: int, priority: int, size: int) -> None:
        """Lanes several pages deep, so that there is something to page (not past what
        one browse shows, which the base class compares whole)."""
        self._publish([(size, priority, None, 0, None)] * n, 1)

    @rule(n=st.integers(25, 120))
    def checkout_deep(self, n: int) -> None:
        self.checkout("c1", n, 0)

    @rule()
    def read_ahead(self) -> None:
        assert self.machine.pager is not None
        self.machine.pager.read_ahead()

    @rule()
    def snapshot_and_restore(self) -> None:
        """A checkpoint names the stored pages; the machine restored from it, on the same
        page store, holds the same state."""
        frozen = self.machine.freeze()
        self.tags += 1
        self.spill.pin(self.tags, frozen.page_handles())
        data = frozen.encode()
        fresh = self._paged_machine()
        fresh.restore(data)
        assert fresh.snapshot() == self.machine.snapshot() == self.oracle.snapshot()
        self.machine.close()
        self.machine = fresh

    @rule(data=st.data())
    def damage_a_page_the_log_can_rebuild(self, data: st.DataObject) -> None:
        pager = self.machine.pager
        assert pager is not None
        top = self.machine.policy.priorities - 1
        candidates: list[tuple[int, SpilledPage]] = []
        for n, lane in enumerate(pager.lanes):
            frozen = lane.freeze()
            candidates += [(n, p) for p in frozen.parts() if isinstance(p, SpilledPage) and n % 2]
        if not candidates:
            return
        n, page = data.draw(st.sampled_from(candidates))
        try:
            entries = self._read_log(list(page.index_set()))
            rebuild_refs(page, top - n // 2, top, entries, self.machine._fallback)
        except PageDamaged:
            return  # not rebuildable (a released delayed message, a duplicate): not here
        self.spill.damage(page.handle)

    @invariant()
    def same_as_unpaged(self) -> None:
        assert self.machine.snapshot() == self.oracle.snapshot()
        assert self.machine.live_indexes() == self.oracle.live_indexes()
        pager = self.machine.pager
        assert pager is not None
        assert pager.resident <= pager.pages_max or pager.warm == 0


TestPagedMachineVsModel = PagedMachineVsModel.TestCase
TestPagedMachineVsModel.settings = settings(
    max_examples=int(os.environ.get("QUORRA_PAGING_EXAMPLES", "120")),
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
