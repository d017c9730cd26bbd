"""The live set behind stats is reused for longer when it is costly to build, so that a
deep queue's stats do not keep the event loop busy; a reused set counts the entries
applied since it was built as live, so that no entry holding a message shows as dead."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from pyroaring import BitMap64

from engine.runtime import observe
from engine.runtime.api import QueueArgs
from tests.engine.runtime.util import msgs, run, started


class _Machine:
    def __init__(self, held: int = 0) -> None:
        self.builds = 0
        self.messages = held
        self.frozen_builds: list[threading.Thread] = []
        self.release = threading.Event()
        self.release.set()

    def live_indexes(self) -> BitMap64:
        self.builds += 1
        return BitMap64([self.builds])

    def held(self) -> int:
        return self.messages

    def stats(self) -> Any:
        return SimpleNamespace(
            messages_ready=self.messages,
            messages_unacked=0,
            messages_delayed=0,
            messages_dead_lettering=0,
        )

    def freeze(self) -> Any:
        machine = self

        class Frozen:
            def live_indexes(self) -> BitMap64:
                machine.release.wait(10)
                machine.frozen_builds.append(threading.current_thread())
                return BitMap64([100 + len(machine.frozen_builds)])

        return Frozen()


class _Log:
    """Entries from 1 in segments, none in the mem table."""

    mem: tuple[()] = ()

    def segment_infos(self) -> list[tuple[Any, int]]:
        return [(SimpleNamespace(lo=1), 100)]


def _replica(machine: _Machine, applied: int) -> Any:
    return SimpleNamespace(
        machine=machine,
        applied_index=applied,
        live_cache=None,
        live_build=None,
        log=_Log(),
        dormant=None,
    )


def _wait_for_build(rep: Any) -> None:
    rep.live_build[2].result(timeout=10)


def test_reused_while_nothing_applied_and_rebuilt_once_stale() -> None:
    m = _Machine()
    rep = _replica(m, 5)
    assert list(observe.live_indexes(rep)) == [1]
    rep.applied_index = 7
    assert list(observe.live_indexes(rep)) == [1, 6, 7]  # fresh enough, plus what applied since
    machine, applied, _, live, cost = rep.live_cache
    rep.live_cache = (machine, applied, time.monotonic() - 2 * observe.LIVE_SET_REUSE_S, live, cost)
    assert list(observe.live_indexes(rep)) == [2]


def test_a_costly_live_set_is_reused_for_longer() -> None:
    m = _Machine()
    rep = _replica(m, 5)
    observe.live_indexes(rep)
    rep.applied_index = 6
    cost = 1.0  # as a queue of tens of millions of messages takes
    age = observe.LIVE_SET_COST_FACTOR * cost / 2
    machine, applied, _, live, _ = rep.live_cache
    rep.live_cache = (machine, applied, time.monotonic() - age, live, cost)
    assert list(observe.live_indexes(rep)) == [1, 6]
    rep.live_cache = (machine, applied, time.monotonic() - 2 * age - 1, live, cost)
    assert list(observe.live_indexes(rep)) == [2]


def test_a_new_machine_is_never_answered_from_the_old_one() -> None:
    rep = _replica(_Machine(), 5)
    observe.live_indexes(rep)
    rep.machine = _Machine()  # a snapshot was installed
    assert list(observe.live_indexes(rep)) == [1] and rep.machine.builds == 1


def test_leased_messages_in_the_mem_table_count_as_live(tmp_path: Path) -> None:
    """Stats read while the queue was empty, then two messages published and leased: their
    entry (not yet in a segment) is live, not dead, in the very next stats."""

    async def body() -> None:
        node = await started(tmp_path)
        try:
            await node.create_queue("q", QueueArgs())
            assert node.stats("q")["log"]["live_entries"] == 0  # type: ignore[index]
            await node.publish("q", msgs("a", "b"))
            got = await node.receive("q", consumer="c", max_messages=10, wait_ms=0, lease_ms=None)
            assert len(got) == 2
            stats = node.stats("q")
            log = stats["log"]
            assert isinstance(log, dict)
            assert log["live_entries"] >= 1 and stats["messages_unacked"] == 2
            live = observe.live_indexes(node.context.replica("q"))
            assert got[0].id >> 10 in live
        finally:
            await node.stop()

    run(body())


def test_a_deep_queue_builds_its_live_set_on_a_worker_and_counts_every_entry_meanwhile() -> None:
    m = _Machine(held=observe.LIVE_SET_INLINE_MAX + 1)
    m.release.clear()
    rep = _replica(m, 5)
    live, at = observe.live_set(rep)
    assert list(live) == [1, 2, 3, 4, 5] and at == 0  # no set yet: every entry is live
    assert m.builds == 0 and m.frozen_builds == []  # nothing walked here
    rep.applied_index = 6
    assert list(observe.live_indexes(rep)) == [1, 2, 3, 4, 5, 6]
    m.release.set()
    _wait_for_build(rep)
    assert m.frozen_builds[0] is not threading.current_thread()
    rep.applied_index = 8
    live, at = observe.live_set(rep)
    assert set(live) == {101, 6, 7, 8} and at == 5  # the build froze the machine at 5
    assert len(m.frozen_builds) == 1 and m.builds == 0


def test_a_stale_set_of_a_deep_queue_is_used_while_one_build_runs() -> None:
    m = _Machine(held=observe.LIVE_SET_INLINE_MAX + 1)
    rep = _replica(m, 5)
    observe.seed_live_set(rep, 5, BitMap64([3]))  # a restored checkpoint's set
    rep.applied_index = 6
    assert list(observe.live_indexes(rep)) == [3, 6] and rep.live_build is None
    m.release.clear()
    machine, applied, _, live, cost = rep.live_cache
    rep.live_cache = (machine, applied, time.monotonic() - 2 * observe.LIVE_SET_REUSE_S, live, cost)
    assert list(observe.live_indexes(rep)) == [3, 6]
    build = rep.live_build
    rep.applied_index = 7
    assert list(observe.live_indexes(rep)) == [3, 6, 7] and rep.live_build is build  # one build
    m.release.set()
    _wait_for_build(rep)
    assert set(observe.live_indexes(rep)) == {101, 7} and m.builds == 0
